// Cross-entropy statistics (row max, sum exp, label logit): the unrolled loop with 4 loads in
// flight per thread (automatic) against the one-load-per-iteration loop (ce_stats_v1), on
// GPT-2's logits (2048 rows of 50304 bf16), checked against the CPU reference
// (ops/cpu/cross_entropy.cpp). Tolerance 1e-5 of the max: fp32 sums in another order.
#include "dev/cuda/common.h"

using namespace megatron;
using namespace megatron::dev;

int main(int argc, char** argv) {
  Args args(argc, argv);
  const int64_t N = 2048, V = 50304;
  const DType dt = DType::kBFloat16, f32 = DType::kFloat32;
  const Device C = Device::cpu(), G = Device::cuda();
  std::vector<int64_t> labels(N);
  std::uniform_int_distribution<int64_t> dl(0, V - 1);
  for (auto& l : labels) l = dl(Args::rng());
  Tensor lc = make(randn(N * V, dt, 3.0f), {N, V}, dt, C), lab = Tensor::from_vector_i64(labels, {N});
  Tensor mr = Tensor::empty({N}, f32, C), sr = Tensor::empty({N}, f32, C), pr = Tensor::empty({N}, f32, C);
  cpu::cross_entropy_stats(lc, lab, 0, mr, sr, pr);
  Tensor lg = lc.to(G), labg = lab.to(G), m = Tensor::empty({N}, f32, G), s = Tensor::empty({N}, f32, G),
         p = Tensor::empty({N}, f32, G);
  auto run = [&] { cu::cross_entropy_stats(lg, labg, 0, m, s, p); };
  for (bool v1 : {false, true}) {
    forced().ce_stats_v1 = v1;
    const std::string nm = std::string("cross_entropy_stats ") + (v1 ? "v1 (forced)" : "shipped");
    run();
    check(nm + " max", m, mr, 1e-5);
    check(nm + " sumexp", s, sr, 1e-5);
    check(nm + " pred", p, pr, 1e-5);
    time_line(nm, median_ms(run, args.reps));
  }
  forced().ce_stats_v1 = false;
  return finish();
}
