// Embedding backward (dtable[ids] += dout rows): 16-byte vector atomics (automatic for fp32
// tables with h % 8 == 0) against scalar atomics only (embed_bwd_v1), on GPT-2's shape (65536
// bf16 rows of 768 into a 50304 x 768 fp32 table), checked against the CPU reference
// (ops/cpu/embedding.cpp). Tolerance 1e-5 of the max: fp32 atomic sums in another order. The
// timed launches accumulate into the same table; only the first launch is checked.
#include "dev/cuda/common.h"

using namespace megatron;
using namespace megatron::dev;

int main(int argc, char** argv) {
  Args args(argc, argv);
  const int64_t N = 65536, h = 768, V = 50304;
  const DType dt = DType::kBFloat16, f32 = DType::kFloat32;
  const Device C = Device::cpu(), G = Device::cuda();
  std::vector<int64_t> ids(N);
  std::uniform_int_distribution<int64_t> di(0, V - 1);
  for (auto& i : ids) i = di(Args::rng());
  Tensor dout = make(randn(N * h, dt), {N, h}, dt, C), idc = Tensor::from_vector_i64(ids, {N});
  const auto t0 = randn(V * h, f32);
  Tensor ref = make(t0, {V, h}, f32, C);
  cpu::embedding_backward(dout, idc, ref, 0);
  Tensor dg = dout.to(G), ig = idc.to(G), table;
  auto run = [&] { cu::embedding_backward(dg, ig, table, 0); };
  for (bool v1 : {false, true}) {
    forced().embed_bwd_v1 = v1;
    const std::string nm = std::string("embedding_backward ") + (v1 ? "v1 (forced)" : "shipped");
    table = make(t0, {V, h}, f32, G);
    run();
    check(nm + " dtable", table, ref, 1e-5);
    time_line(nm, median_ms(run, args.reps));
  }
  forced().embed_bwd_v1 = false;
  return finish();
}
