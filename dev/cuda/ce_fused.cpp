// Fused cross entropy (loss, lse and softmax - onehot written over the logits in one kernel):
// the row kept in shared memory for the second pass (automatic where it fits) against the
// second pass re-reading the row from global memory / L2 (ce_fused_no_stash), on GPT-2's logits
// (2048 rows of 50304 bf16), checked against the CPU reference (ops/cpu/cross_entropy.cpp).
// Tolerances: loss/lse 1e-5 of the max (fp32 sums in another order); the gradient 1e-2 of its
// max (bf16 output). Each timed launch overwrites its logits, so every launch starts from a
// fresh copy (the copy is inside the timing, the same for both variants).
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
  Tensor l0 = make(randn(N * V, dt, 3.0f), {N, V}, dt, C), lab = Tensor::from_vector_i64(labels, {N});
  Tensor gr = l0.clone(), lr = Tensor::empty({N}, f32, C), er = Tensor::empty({N}, f32, C);
  cpu::cross_entropy_fused_(gr, lab, 0, lr, er);
  Tensor lg0 = l0.to(G), lg = lg0.clone(), labg = lab.to(G), loss = Tensor::empty({N}, f32, G),
         lse = Tensor::empty({N}, f32, G);
  auto run = [&] {
    lg.copy_(lg0);
    cu::cross_entropy_fused_(lg, labg, 0, loss, lse);
  };
  for (bool l2 : {false, true}) {
    forced().ce_fused_no_stash = l2;
    const std::string nm = std::string("cross_entropy_fused_ ") + (l2 ? "no stash (forced)" : "shipped");
    run();
    check(nm + " loss", loss, lr, 1e-5);
    check(nm + " lse", lse, er, 1e-5);
    check(nm + " grad", lg, gr, 1e-2);
    time_line(nm + " (with the logits copy)", median_ms(run, args.reps));
  }
  forced().ce_fused_no_stash = false;
  return finish();
}
