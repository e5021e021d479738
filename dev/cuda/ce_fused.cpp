// Fused cross entropy (loss, lse and softmax - onehot written over the logits in one kernel) on
// GPT-2's logits (rows of 50304 bf16), three variants: the shipped one (the whole row fetched into
// shared memory by bulk copies, automatic on sm_90 where two rows fit per SM), the row loaded by
// the threads and kept in shared memory for the second pass (ce_fused_no_bulk: the stash kernel,
// Session 9) and the second pass re-reading the row from global memory / L2
// (ce_fused_no_stash), each checked on 2048 rows against the CPU reference
// (ops/cpu/cross_entropy.cpp), and the bulk kernel's loss/lse/gradient bitwise against the stash
// kernel's (same chunks per thread, same combine order, same values read). Tolerances vs the
// CPU: loss/lse 1e-5 of the max (fp32 sums in another order); the gradient 1e-2 of its max (bf16
// output). Timing: those rows repeated to 16384 (62 waves of 2 blocks per SM, as GPT-2's 65536 rows have 248),
// each launch on the previous launch's output (softmax - onehot: the same bytes read and
// written, no copy inside the timing); GB/s of the logits read + written.
#include "dev/cuda/common.h"

using namespace megatron;
using namespace megatron::dev;

int main(int argc, char** argv) {
  Args args(argc, argv);
  const int64_t N = 2048, NT = 16384, V = 50304;
  const DType dt = DType::kBFloat16, f32 = DType::kFloat32;
  const Device C = Device::cpu(), G = Device::cuda();
  std::vector<int64_t> labels(NT);
  std::uniform_int_distribution<int64_t> dl(0, V - 1);
  for (auto& l : labels) l = dl(Args::rng());
  Tensor l0 = make(randn(N * V, dt, 3.0f), {N, V}, dt, C);
  Tensor lab = Tensor::from_vector_i64(std::vector<int64_t>(labels.begin(), labels.begin() + N), {N});
  Tensor gr = l0.clone(), lr = Tensor::empty({N}, f32, C), er = Tensor::empty({N}, f32, C);
  cpu::cross_entropy_fused_(gr, lab, 0, lr, er);
  Tensor lg0 = l0.to(G), labg = lab.to(G);
  // The timing rows: the 2048 checked rows repeated (with their own labels).
  Tensor big0 = Tensor::empty({NT, V}, dt, G), labt = Tensor::from_vector_i64(labels, {NT}).to(G);
  for (int64_t i = 0; i < NT / N; ++i) big0.flat_slice(i * N * V, {N, V}).copy_(lg0);
  const char* names[3] = {"shipped (bulk copy)", "no bulk: stash (forced)", "no stash (forced)"};
  std::vector<Tensor> o[3];
  for (int v = 0; v < 3; ++v) {
    forced().ce_fused_no_bulk = v == 1;
    forced().ce_fused_no_stash = v == 2;
    const std::string nm = std::string("cross_entropy_fused_ ") + names[v];
    Tensor lg = lg0.clone(), loss = Tensor::empty({N}, f32, G), lse = Tensor::empty({N}, f32, G);
    cu::cross_entropy_fused_(lg, labg, 0, loss, lse);
    check(nm + " loss", loss, lr, 1e-5);
    check(nm + " lse", lse, er, 1e-5);
    check(nm + " grad", lg, gr, 1e-2);
    Tensor big = big0.clone(), bl = Tensor::empty({NT}, f32, G), be = Tensor::empty({NT}, f32, G);
    cu::cross_entropy_fused_(big, labt, 0, bl, be);  // on fresh logits, for the bitwise comparison
    o[v] = {loss, lse, lg, bl, be, big};
    Tensor work = big.clone(), wl = Tensor::empty({NT}, f32, G), we = Tensor::empty({NT}, f32, G);
    const double ms = median_ms([&] { cu::cross_entropy_fused_(work, labt, 0, wl, we); }, args.reps);
    time_bw_line(nm + " 16384 rows", ms, 2.0 * NT * V * dtype_size(dt));
  }
  forced().ce_fused_no_bulk = forced().ce_fused_no_stash = false;
  const char* what[6] = {"loss", "lse", "grad", "loss 16384 rows", "lse 16384 rows", "grad 16384 rows"};
  for (int i = 0; i < 6; ++i) same_bits(std::string("cross_entropy_fused_ bulk vs stash ") + what[i], o[0][i], o[1][i]);
  return finish();
}
