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
// written, no copy inside the timing); GB/s of the logits read + written. Then the same at
// LLaMA-3's rows (128256 wide: the stash holds ~90 % of a row; 256 checked rows, 8192 timed).
#include "dev/cuda/common.h"

using namespace megatron;
using namespace megatron::dev;

namespace {
// One row width V: N checked rows (CPU reference) repeated to NT timing rows; see the header.
void run_shape(const Args& args, int64_t V, int64_t N, int64_t NT, const std::string& tag) {
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
  // The timing rows: the N checked rows repeated (with their own labels).
  Tensor big0 = Tensor::empty({NT, V}, dt, G), labt = Tensor::from_vector_i64(labels, {NT}).to(G);
  for (int64_t i = 0; i < NT / N; ++i) big0.flat_slice(i * N * V, {N, V}).copy_(lg0);
  const char* names[3] = {"shipped (bulk copy)", "no bulk: stash (forced)", "no stash (forced)"};
  std::vector<Tensor> o[3];
  for (int v = 0; v < 3; ++v) {
    forced().ce_fused_no_bulk = v == 1;
    forced().ce_fused_no_stash = v == 2;
    const std::string nm = "cross_entropy_fused_ " + tag + " " + names[v];
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
    time_bw_line(nm + " " + std::to_string(NT) + " rows", ms, 2.0 * NT * V * dtype_size(dt));
  }
  forced().ce_fused_no_bulk = forced().ce_fused_no_stash = false;
  const std::string nt = std::to_string(NT);
  const std::string what[6] = {"loss", "lse", "grad", "loss " + nt + " rows", "lse " + nt + " rows", "grad " + nt + " rows"};
  for (int i = 0; i < 6; ++i)
    same_bits("cross_entropy_fused_ " + tag + " bulk vs stash " + what[i], o[0][i], o[1][i]);
}
}  // namespace

int main(int argc, char** argv) {
  Args args(argc, argv);
  run_shape(args, 50304, 2048, 16384, "gpt2");
  // LLaMA-3's 128256-wide rows (Session 12): ~90 % of a row fits in shared memory (one block per
  // SM); one micro-batch of the 8B shape is 8192 rows. The kernel inside the training step took
  // 1.93 ms per call (docs/performance.md "Session 12: fused cross entropy ..."): this times it alone.
  run_shape(args, 128256, 256, 8192, "llama3");
  return finish();
}
