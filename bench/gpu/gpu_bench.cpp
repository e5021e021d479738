// Times the CUDA kernels of megatron/core/ops/cuda with CUDA events (warm-up, then the median
// of repeated runs) on random data at LLaMA-3-8B and GPT-2-124M shapes. Prints one line per
// case: name, median ms, TFLOP/s (matrix work) or GB/s (memory-bound kernels, bytes read +
// written once). The PyTorch peers on the same shapes: bench/gpu/torch_peers.py.
// Attention FLOPs: forward 4*s*sk*d*np*b (two matmuls), halved when causal; backward 2.5x the
// forward (five matmuls); same convention as FlashAttention's benchmarks.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "megatron/core/ops/cuda/cublaslt_common.h"
#include "megatron/core/ops/cuda/cuda_ops.h"
#include "megatron/core/ops/cuda/cuda_utils.h"
#include "megatron/core/ops/cuda/expert_lanes.h"
#include "megatron/core/ops/cuda/variants.h"
#include "megatron/core/tensor/tensor.h"
#include "megatron/core/comm/process_group.h"
#include "megatron/core/transformer/moe/experts.h"
#include "megatron/core/transformer/moe/moe_layer.h"
#include "megatron/core/transformer/moe/moe_utils.h"
#include "bench/gpu/moe_fp8_leg.h"
#include "bench/gpu/moe_layer_leg.h"

using namespace megatron;
namespace cu = megatron::ops::cuda;

namespace {
Tensor rnd(const Shape& s, DType dt, float scale = 1.0f) {
  // Random normal values generated on the host in chunks would be slow for GBs; fill a small
  // random block and tile it (data is still non-zero and non-repeating within each row block).
  const int64_t n = shape_numel(s);
  const int64_t blk = std::min<int64_t>(n, 1 << 22);
  std::mt19937 rng(1234);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> h(blk);
  for (auto& x : h) x = d(rng);
  Tensor small = Tensor::from_vector(h, {blk});
  if (dt != DType::kFloat32) small = small.to(dt);
  Tensor sd = small.to(Device::cuda());
  Tensor t = Tensor::empty(s, dt, Device::cuda());
  const size_t es = dtype_size(dt);
  for (int64_t off = 0; off < n; off += blk) {
    int64_t len = std::min(blk, n - off);
    CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(t.data_ptr()) + off * es, sd.data_ptr(), len * es,
                               cudaMemcpyDeviceToDevice, megatron::cuda::current_stream()));
  }
  return t;
}

float time_ms(const std::function<void()>& fn, int warm = 3, int reps = 10) {
  for (int i = 0; i < warm; ++i) fn();
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> ts;
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a, megatron::cuda::current_stream());
    fn();
    cudaEventRecord(b, megatron::cuda::current_stream());
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    ts.push_back(ms);
  }
  CUDA_CHECK(cudaGetLastError());
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

void report_flops(const std::string& name, float ms, double flops) {
  std::printf("%-62s %9.3f ms %8.1f TFLOP/s\n", name.c_str(), ms, flops / (ms * 1e-3) / 1e12);
  std::fflush(stdout);
}
void report_bw(const std::string& name, float ms, double bytes) {
  std::printf("%-62s %9.3f ms %8.1f GB/s\n", name.c_str(), ms, bytes / (ms * 1e-3) / 1e9);
  std::fflush(stdout);
}

void bench_attention(const char* tag, int S, int B, int NP, int NG, int D) {
  Tensor q = rnd({S, B, NP, D}, DType::kBFloat16), k = rnd({S, B, NG, D}, DType::kBFloat16),
         v = rnd({S, B, NG, D}, DType::kBFloat16), dout = rnd({S, B, NP, D}, DType::kBFloat16);
  Tensor o = Tensor::empty({S, B, NP, D}, DType::kBFloat16, Device::cuda());
  Tensor lse = Tensor::empty({B, NP, S}, DType::kFloat32, Device::cuda());
  Tensor dq = Tensor::empty(q.shape(), DType::kBFloat16, Device::cuda()), dk = Tensor::empty(k.shape(), DType::kBFloat16, Device::cuda()),
         dv = Tensor::empty(v.shape(), DType::kBFloat16, Device::cuda());
  ops::AttentionParams p;
  p.softmax_scale = 1.0f / std::sqrt((float)D);
  p.causal = true;
  const double fwd = 4.0 * S * (double)S * D * NP * B / 2.0;
  float tf = time_ms([&] { cu::attention_forward(q, k, v, p, o, lse); });
  float tb = time_ms([&] { cu::attention_backward(dout, q, k, v, o, lse, p, dq, dk, dv); });
  char nm[160];
  std::snprintf(nm, sizeof nm, "attention %s s=%d b=%d np=%d ng=%d d=%d causal fwd", tag, S, B, NP, NG, D);
  report_flops(nm, tf, fwd);
  std::snprintf(nm, sizeof nm, "attention %s s=%d b=%d np=%d ng=%d d=%d causal bwd", tag, S, B, NP, NG, D);
  report_flops(nm, tb, 2.5 * fwd);
  std::snprintf(nm, sizeof nm, "attention %s s=%d b=%d np=%d ng=%d d=%d causal fwd+bwd", tag, S, B, NP, NG, D);
  report_flops(nm, tf + tb, 3.5 * fwd);
}

void bench_gemm(const char* name, int64_t m, int64_t n, int64_t k, bool ta, bool tb, DType out, float beta = 0.0f) {
  Tensor a = rnd(ta ? Shape{k, m} : Shape{m, k}, DType::kBFloat16, 0.1f);
  Tensor b = rnd(tb ? Shape{n, k} : Shape{k, n}, DType::kBFloat16, 0.1f);
  Tensor c = rnd({m, n}, out, 0.1f);
  float t = time_ms([&] { cu::gemm(a, ta, b, tb, c, 1.0f, beta); });
  char nm[160];
  std::snprintf(nm, sizeof nm, "gemm %s %ldx%ldx%ld %s%s ->%s", name, (long)m, (long)n, (long)k, ta ? "T" : "N",
                tb ? "T" : "N", dtype_name(out));
  report_flops(nm, t, 2.0 * m * n * k);
}
// The bf16 GEMM ceiling two ways (docs/performance.md "Session 13"): "burst" = bench_gemm's
// median of 10 launches after 3 warm-ups (about 20 ms of work: the GPU still at its boost clock);
// "sustained" = the same 8192^3 GEMM back to back for `seconds`, one TFLOP/s figure per batch of
// 64 launches (about 0.1 s) from CUDA events, then the mean of the last half of the batches:
// what the chip holds at its power limit, as inside a training step. The last line prints both.
// `launch` run back to back for `seconds` (GPU time), in batches of `per_batch` launches timed
// with CUDA events: one TFLOP/s figure per batch (`flop` per launch) and the GPU time at its end
// (s). Used by the two held-GEMM modes below.
struct HeldBatches {
  std::vector<double> tflops, end_s;
  /// The mean of the second half of the batches (the part at the power limit).
  double last_half_mean() const {
    double sum = 0.0;
    const size_t from = tflops.size() / 2;
    for (size_t i = from; i < tflops.size(); ++i) sum += tflops[i];
    return sum / double(tflops.size() - from);
  }
};
HeldBatches hold_launches(const std::function<void()>& launch, double flop, int per_batch, double seconds) {
  cudaStream_t st = megatron::cuda::current_stream();
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  HeldBatches h;
  double elapsed = 0.0;
  while (elapsed < seconds * 1e3) {
    CUDA_CHECK(cudaEventRecord(e0, st));
    for (int i = 0; i < per_batch; ++i) launch();
    CUDA_CHECK(cudaEventRecord(e1, st));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    elapsed += ms;
    h.tflops.push_back(per_batch * flop / (ms * 1e-3) / 1e12);
    h.end_s.push_back(elapsed / 1e3);
  }
  CUDA_CHECK(cudaEventDestroy(e0));
  CUDA_CHECK(cudaEventDestroy(e1));
  return h;
}
void bench_gemm_sustained(double seconds) {
  const int64_t n = 8192;
  Tensor a = rnd({n, n}, DType::kBFloat16, 0.1f), b = rnd({n, n}, DType::kBFloat16, 0.1f);
  Tensor c = Tensor::empty({n, n}, DType::kBFloat16, Device::cuda());
  const double flop = 2.0 * n * n * n;
  const float burst = time_ms([&] { cu::gemm(a, false, b, true, c, 1.0f, 0.0f); });
  std::printf("gemm_sustained burst 8192^3 bf16: %.3f ms, %.1f TFLOP/s\n", burst, flop / (burst * 1e-3) / 1e12);
  const HeldBatches h = hold_launches([&] { cu::gemm(a, false, b, true, c, 1.0f, 0.0f); }, flop, 64, seconds);
  for (size_t i = 0; i < h.tflops.size(); ++i)
    std::printf("gemm_sustained batch %zu at %.2f s: %.1f TFLOP/s\n", i + 1, h.end_s[i], h.tflops[i]);
  std::printf("gemm_sustained 8192^3 bf16: burst %.1f TFLOP/s, sustained %.1f TFLOP/s (mean of batches %zu-%zu of %.1f s)\n",
              flop / (burst * 1e-3) / 1e12, h.last_half_mean(), h.tflops.size() / 2 + 1, h.tflops.size(),
              h.end_s.back());
  std::fflush(stdout);
}
// cuBLASLt's candidate algorithms of one row-major GEMM C[m,n] (+)= op(A) op(B) (the layout
// ops/cuda/gemm.cu plans: the column-major C^T = op(B)^T op(A)^T), each held for `hold_s` seconds
// back to back with the chip at its power limit (a `warm_s` warm-up on the heuristic's first
// choice before the first), TFLOP/s = the mean of the second half of 16-launch batches; the first
// choice is timed again last, so drift shows. Answers whether the heuristic's pick, made for the
// boost clock, is also the fastest at the sustained clock of a training step (Session 13).
void bench_gemm_algos_sustained(const char* name, int64_t m, int64_t n, int64_t k, bool ta, bool tb, DType out,
                                float beta, double warm_s, double hold_s) {
  namespace lt = megatron::ops::cuda::lt;
  Tensor a = rnd(ta ? Shape{k, m} : Shape{m, k}, DType::kBFloat16, 0.1f);
  Tensor b = rnd(tb ? Shape{n, k} : Shape{k, n}, DType::kBFloat16, 0.1f);
  Tensor c = rnd({m, n}, out, 0.1f);
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  lt::DeviceContext& ctx = lt::device_context(dev);
  // Column-major problem: M = n, N = m; first operand B (transposed iff tb), second A (iff ta).
  const int64_t M = n, N = m, K = k, lda = b.size(-1), ldb = a.size(-1), ldc = n;
  lt::Plan p;
  MEGATRON_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  MEGATRON_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  MEGATRON_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  MEGATRON_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, tb ? K : M, tb ? M : K, lda));
  MEGATRON_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, ta ? N : K, ta ? K : N, ldb));
  MEGATRON_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, lt::cuda_type(out), M, N, ldc));
  cublasLtMatmulHeuristicResult_t res[8];
  int found = 0;
  MEGATRON_CUBLAS_CHECK(lt::pick_algorithms(ctx, p, lt::pointer_alignment(b.data_ptr()),
                                            lt::pointer_alignment(a.data_ptr()), lt::pointer_alignment(c.data_ptr()),
                                            8, res, found));
  cudaStream_t st = megatron::cuda::current_stream();
  void* ws = lt::workspace_for(ctx, st);
  const float alpha = 1.0f;
  auto launch = [&](int i) {
    MEGATRON_CUBLAS_CHECK(cublasLtMatmul(ctx.handle, p.op, &alpha, b.data_ptr(), p.a, a.data_ptr(), p.b, &beta,
                                         c.data_ptr(), p.c, c.data_ptr(), p.c, &res[i].algo, ws, lt::kWorkspaceBytes,
                                         st));
  };
  const double flop = 2.0 * m * n * k;
  auto hold = [&](int i, double seconds) { return hold_launches([&] { launch(i); }, flop, 16, seconds).last_half_mean(); };
  hold(0, warm_s);
  std::vector<double> got(found);
  for (int i = 0; i < found; ++i) {
    got[i] = hold(i, hold_s);
    int tile = 0, stages = 0, splitk = 0;
    size_t w = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &w);
    cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages), &w);
    cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), &w);
    std::printf("gemm_algos %s %ldx%ldx%ld ->%s candidate %d (tile id %d, stages id %d, split-k %d, workspace %zu): "
                "sustained %.1f TFLOP/s (%.3fx candidate 0)\n",
                name, (long)m, (long)n, (long)k, dtype_name(out), i, tile, stages, splitk, res[i].workspaceSize, got[i],
                got[i] / got[0]);
    std::fflush(stdout);
  }
  const double again = hold(0, hold_s);
  std::printf("gemm_algos %s candidate 0 again: sustained %.1f TFLOP/s (drift %.3fx)\n", name, again, again / got[0]);
  std::fflush(stdout);
  cublasLtMatrixLayoutDestroy(p.a);
  cublasLtMatrixLayoutDestroy(p.b);
  cublasLtMatrixLayoutDestroy(p.c);
  cublasLtMatmulDescDestroy(p.op);
}
// Text generation's decode step (docs/inference.md#performance): the layer GEMMs at m = b rows
// (weight-bandwidth bound: GB/s of weight bytes read), the q_len = 1 attention against a KV cache of
// sk tokens (GB/s of K/V bytes) and the greedy argmax over the vocabulary.
void bench_decode() {
  const int64_t H = 4096, QKV = 6144, F = 14336, Vv = 128256;
  struct G {
    const char* name;
    int64_t n, k;
  };
  for (int64_t m : {(int64_t)1, (int64_t)32})
    for (const G& g : {G{"qkv", QKV, H}, G{"proj", H, H}, G{"fc1", 2 * F, H}, G{"fc2", H, F}, G{"lm-head", Vv, H}}) {
      Tensor x = rnd({m, g.k}, DType::kBFloat16, 0.1f), w = rnd({g.n, g.k}, DType::kBFloat16, 0.1f);
      Tensor y = Tensor::empty({m, g.n}, DType::kBFloat16, Device::cuda());
      float t = time_ms([&] { cu::linear_forward(x, w, nullptr, y); });
      char nm[160];
      std::snprintf(nm, sizeof nm, "decode gemm %s m=%ld n=%ld k=%ld (weight bytes)", g.name, (long)m, (long)g.n,
                    (long)g.k);
      report_bw(nm, t, 2.0 * g.n * g.k);
    }
  for (int B : {1, 32})
    for (int SK : {300, 2048}) {
      Tensor q = rnd({1, B, 32, 128}, DType::kBFloat16), k = rnd({SK, B, 8, 128}, DType::kBFloat16),
             v = rnd({SK, B, 8, 128}, DType::kBFloat16);
      Tensor o = Tensor::empty({1, B, 32, 128}, DType::kBFloat16, Device::cuda());
      Tensor lse = Tensor::empty({B, 32, 1}, DType::kFloat32, Device::cuda());
      ops::AttentionParams p;
      p.softmax_scale = 1.0f / std::sqrt(128.0f);
      p.causal = false;
      float t = time_ms([&] { cu::attention_forward(q, k, v, p, o, lse); });
      char nm[160];
      std::snprintf(nm, sizeof nm, "decode attention b=%d sk=%d np=32 ng=8 d=128 (K/V bytes)", B, SK);
      report_bw(nm, t, 2.0 * SK * B * 8 * 128 * 2);
    }
  for (int64_t B : {(int64_t)1, (int64_t)32}) {
    Tensor l = rnd({B, Vv}, DType::kBFloat16, 3.0f), idx = Tensor::empty({B}, DType::kInt64, Device::cuda());
    float t = time_ms([&] { cu::argmax_last_dim(l, idx); });
    char nm[160];
    std::snprintf(nm, sizeof nm, "decode argmax_last_dim %ldx%ld bf16", (long)B, (long)Vv);
    report_bw(nm, t, 2.0 * B * Vv);
  }
  // The step's small kernels at b rows: RMSNorm forward (the block-per-row kernel, then the
  // warp-per-row one forced for comparison, variants.h) and the QKV split + RoPE.
  for (int64_t B : {(int64_t)1, (int64_t)32}) {
    Tensor x = rnd({B, H}, DType::kBFloat16), g = rnd({H}, DType::kBFloat16);
    Tensor y = Tensor::empty({B, H}, DType::kBFloat16, Device::cuda()), r = Tensor::empty({B}, DType::kFloat32, Device::cuda());
    char nm[160];
    for (bool v1 : {false, true}) {
      cu::variants::forced().norm_fwd_v1 = v1;
      float t = time_ms([&] { cu::rmsnorm_forward(x, g, 1e-5f, false, y, r); });
      std::snprintf(nm, sizeof nm, "decode rmsnorm fwd %ldx%ld bf16%s", (long)B, (long)H, v1 ? " (warp per row, v1)" : "");
      report_bw(nm, t, 2.0 * B * H * 2);
    }
    cu::variants::forced().norm_fwd_v1 = false;
    Tensor qkv = rnd({1, B, QKV}, DType::kBFloat16), q = Tensor::empty({1, B, 32, 128}, DType::kBFloat16, Device::cuda());
    Tensor k = Tensor::empty({1, B, 8, 128}, DType::kBFloat16, Device::cuda()), v = Tensor::empty(k.shape(), DType::kBFloat16, Device::cuda());
    ops::RopeParams rp;
    rp.enabled = true;
    rp.base = 500000.0f;
    float t = time_ms([&] { cu::qkv_split_rope_forward(qkv, 32, 8, rp, nullptr, q, k, v); });
    std::snprintf(nm, sizeof nm, "decode qkv_split_rope fwd b=%ld np=32 ng=8 d=128 bf16", (long)B);
    report_bw(nm, t, 2.0 * B * QKV * 2);
  }
}
// Which path the grouped GEMM op took per GEMM kind since the last call (the counters reset):
// "fwd grouped, dgrad grouped, wgrad loop" ("grouped+loop" when the calls of a kind differed).
std::string grouped_paths() {
  const cu::GroupedGemmPathCounts c = cu::grouped_gemm_path_counts(true);
  std::string s;
  const char* kinds[3] = {"fwd", "dgrad", "wgrad"};
  for (int k = 0; k < 3; ++k) {
    if (c.grouped[k] + c.loop[k] == 0) continue;
    s += std::string(s.empty() ? "" : ", ") + kinds[k] + " " +
         (c.grouped[k] && c.loop[k] ? "grouped+loop" : c.grouped[k] ? "grouped" : "loop");
  }
  return s.empty() ? "none" : s;
}
void report_paths(const std::string& name) {
  const cu::ExpertLaneCounts l = cu::expert_lane_counts(true);
  std::printf("%s paths: %s; loop streams %d\n", name.c_str(), grouped_paths().c_str(), l.forked ? l.max_lanes : 1);
  std::fflush(stdout);
}

// MoE expert GEMMs (docs/moe.md "Performance"): E experts of ffn F (SwiGLU), top-k, T tokens,
// bf16, EP1: the routed experts' six GEMMs (fc1/fc2 forward, dgrad, wgrad into fp32 main grads)
// over a balanced split (T k / E rows each) through grouped_linear_* with
// MEGATRON_MOE_GROUPED_GEMM=1 (grouped cuBLAS where cuBLAS takes the types), =0 (per-expert loop)
// with MEGATRON_MOE_GEMM_STREAMS=1, 2 and 4 (the loop's GEMMs on that many streams) and =auto
// (the per-call rule of ops/grouped_gemm.h) with 1 stream and with the default stream count (what
// training runs); each figure is followed by a line naming the path each GEMM kind took and how
// many streams the loop used; beside the same six GEMMs as ONE dense GEMM of T k rows (same FLOPs).
void bench_moe_gemms(const char* tag, int64_t T, int64_t H, int64_t F, int64_t E, int64_t K) {
  const int64_t R = T * K, n = R / E;
  std::vector<int64_t> counts(E, n);
  counts[0] += R - n * E;
  const double flops = 2.0 * R * H * (2 * F) * 3 + 2.0 * R * F * H * 3;  // fc1 + fc2, fwd + dgrad + wgrad
  char nm[200];
  Tensor x = rnd({R, H}, DType::kBFloat16), f1 = rnd({R, 2 * F}, DType::kBFloat16, 0.1f),
         a = rnd({R, F}, DType::kBFloat16), y = rnd({R, H}, DType::kBFloat16, 0.1f);
  std::vector<Tensor> w1, w2, g1, g2;
  for (int64_t e = 0; e < E; ++e) {
    w1.push_back(rnd({2 * F, H}, DType::kBFloat16, 0.02f));
    w2.push_back(rnd({H, F}, DType::kBFloat16, 0.02f));
    g1.push_back(Tensor::zeros({2 * F, H}, DType::kFloat32, Device::cuda()));
    g2.push_back(Tensor::zeros({H, F}, DType::kFloat32, Device::cuda()));
  }
  Tensor dx = Tensor::empty({R, H}, DType::kBFloat16, Device::cuda()), da = Tensor::empty({R, F}, DType::kBFloat16, Device::cuda());
  auto experts_gemms = [&] {
    cu::grouped_linear_forward(x, w1, counts, f1);
    cu::grouped_linear_forward(a, w2, counts, y);
    cu::grouped_linear_backward(y, a, w2, counts, &da, &g2, true);
    cu::grouped_linear_backward(f1, x, w1, counts, &dx, &g1, true);
  };
  struct Run {
    const char* mode;     // MEGATRON_MOE_GROUPED_GEMM
    const char* streams;  // MEGATRON_MOE_GEMM_STREAMS (nullptr: unset, the default)
    const char* label;
  };
  for (const Run& r : {Run{"1", nullptr, "grouped"}, Run{"0", "1", "loop streams=1"}, Run{"0", "2", "loop streams=2"},
                       Run{"0", "4", "loop streams=4"}, Run{"auto", "1", "auto streams=1"}, Run{"auto", nullptr, "auto"}}) {
    setenv("MEGATRON_MOE_GROUPED_GEMM", r.mode, 1);
    if (r.streams) setenv("MEGATRON_MOE_GEMM_STREAMS", r.streams, 1);
    else unsetenv("MEGATRON_MOE_GEMM_STREAMS");
    grouped_paths();  // reset the counters
    float t = time_ms(experts_gemms);
    std::snprintf(nm, sizeof nm, "moe %s expert gemms %s E=%ld rows=%ld fwd+bwd", tag, r.label, (long)E, (long)n);
    report_flops(nm, t, flops);
    report_paths(nm);
  }
  unsetenv("MEGATRON_MOE_GEMM_STREAMS");
  unsetenv("MEGATRON_MOE_GROUPED_GEMM");
  // The same FLOPs as one expert of T k rows (dense rate at the expert's shapes).
  Tensor w1d = w1[0], w2d = w2[0];
  float t = time_ms([&] {
    cu::linear_forward(x, w1d, nullptr, f1);
    cu::linear_forward(a, w2d, nullptr, y);
    cu::linear_backward(y, a, w2d, &da, &g2[0], nullptr, true);
    cu::linear_backward(f1, x, w1d, &dx, &g1[0], nullptr, true);
  });
  std::snprintf(nm, sizeof nm, "moe %s dense gemms same flops rows=%ld fwd+bwd", tag, (long)R);
  report_flops(nm, t, flops);
}

// The MoE layer (bench/gpu/moe_layer_leg.h, bf16, the default grouped-GEMM rule): MoELayer
// forward + backward (router, permute, experts, unpermute, aux loss) and the Experts module alone
// on the counts the router produced; the difference is the router + permute + unpermute + aux
// share. Errors are reported, not fatal (the kernel figures stand on their own).
void bench_moe_layer(const char* tag, int64_t T, int64_t H, int64_t F, int64_t E, int64_t K,
                     const megatron::fp8::Fp8Config* fp8 = nullptr) {
  const double flops = 2.0 * T * K * H * (2 * F) * 3 + 2.0 * T * K * F * H * 3;
  char nm[200];
  try {
    grouped_paths();  // reset the counters
    megatron::bench::MoELayerLegResult r = megatron::bench::moe_layer_leg(
        T, H, F, E, K, DType::kBFloat16, Device::cuda(),
        [](const Shape& s, DType dt, float std) { return rnd(s, dt, std); },
        [](const std::function<void()>& fn) { return static_cast<double>(time_ms(fn, 2, 5)); }, fp8);
    int64_t lo = r.tokens_per_expert.front(), hi = lo;
    for (int64_t c : r.tokens_per_expert) lo = std::min(lo, c), hi = std::max(hi, c);
    std::snprintf(nm, sizeof nm, "moe %s layer fwd+bwd T=%ld", tag, (long)T);
    report_flops(nm, r.layer_ms, flops);
    std::snprintf(nm, sizeof nm, "moe %s experts module fwd+bwd T=%ld", tag, (long)T);
    report_flops(nm, r.experts_ms, flops);
    std::printf("moe %s layer + experts module paths: %s; routed rows per expert %ld..%ld\n", tag,
                grouped_paths().c_str(), (long)lo, (long)hi);
    std::printf("%-62s %9.1f %%\n", (std::string("moe ") + tag + " router+permute+unpermute+aux share").c_str(),
                100.0 * (r.layer_ms - r.experts_ms) / r.layer_ms);
  } catch (const std::exception& e) {
    std::printf("moe %s layer: FAILED: %s\n", tag, e.what());
  }
  std::fflush(stdout);
}
// The FP8 experts' A/B leg (bench/gpu/moe_fp8_leg.h): one line of times, one line of the bitwise check.
void bench_moe_fp8_ab(const char* tag, int64_t H, int64_t F, const std::vector<int64_t>& counts, int64_t K,
                      const megatron::fp8::Fp8Config& f8) {
  int64_t R = 0;
  for (int64_t n : counts) R += n;
  try {
    const megatron::bench::MoEFp8AbResult r = megatron::bench::moe_fp8_experts_ab(
        H, F, counts, K, DType::kBFloat16, Device::cuda(), f8,
        [](const Shape& s, DType dt, float std) { return rnd(s, dt, std); },
        [](const std::function<void()>& fn) { return static_cast<double>(time_ms(fn, 2, 5)); });
    std::printf("moe %s fp8 experts a/b rows=%ld: bf16 %.3f off %.3f on %.3f cache_first %.3f cache_later %.3f ms\n",
                tag, (long)R, r.bf16_ms, r.off_ms, r.on_ms, r.cache_first_ms, r.cache_later_ms);
    std::printf("moe %s fp8 experts bits on,cache_first vs off: %s (%s)\n", tag, r.same_bits ? "SAME" : "DIFFER",
                r.detail.c_str());
  } catch (const std::exception& e) {
    std::printf("moe %s fp8 experts a/b: FAILED: %s\n", tag, e.what());
  }
  std::fflush(stdout);
}
}  // namespace

int main(int argc, char** argv) {
  std::string only = argc > 1 ? argv[1] : "";
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  if (only.empty() || only == "attention") {
    // cuDNN SDPA (backend graph API, cudnn_attention.cpp) and our flash kernels, same inputs
    setenv("MEGATRON_ATTENTION_BACKEND", "cudnn", 1);
    bench_attention("cudnn llama3-8b", 8192, 1, 32, 8, 128);
    bench_attention("cudnn gpt2-124m", 1024, 64, 12, 12, 64);
    bench_attention("cudnn llama3-8b s=4096", 4096, 1, 32, 8, 128);
    bench_attention("cudnn gpt2-124m b=8", 1024, 8, 12, 12, 64);
    setenv("MEGATRON_ATTENTION_BACKEND", "flash", 1);
    bench_attention("flash llama3-8b", 8192, 1, 32, 8, 128);
    bench_attention("flash gpt2-124m", 1024, 64, 12, 12, 64);
    bench_attention("flash llama3-8b s=4096", 4096, 1, 32, 8, 128);
    bench_attention("flash gpt2-124m b=8", 1024, 8, 12, 12, 64);
    megatron::ops::cuda::variants::forced().flash_small = 1;  // pipelined kernels, 4 warps per block
    bench_attention("v2-4warps llama3-8b", 8192, 1, 32, 8, 128);
    megatron::ops::cuda::variants::forced().flash_small = 0;  // pipelined kernels, 8 warps per block
    bench_attention("v2-8warps gpt2-124m", 1024, 64, 12, 12, 64);
    megatron::ops::cuda::variants::forced().flash_small = -1;
    unsetenv("MEGATRON_ATTENTION_BACKEND");
  }
  if (only.empty() || only == "gemm") {
    // LLaMA-3-8B layer, 8192 tokens (seq 8192, micro-batch 1): forward y = x w^T, backward
    // dx = dy w, dw += dy^T x (fp32 main grad).
    const int64_t T = 8192, H = 4096, QKV = 6144, F = 14336;
    bench_gemm("qkv fwd", T, QKV, H, false, true, DType::kBFloat16);
    bench_gemm("proj fwd", T, H, H, false, true, DType::kBFloat16);
    bench_gemm("fc1 fwd", T, 2 * F, H, false, true, DType::kBFloat16);
    bench_gemm("fc2 fwd", T, H, F, false, true, DType::kBFloat16);
    bench_gemm("fc1 dgrad", T, H, 2 * F, false, false, DType::kBFloat16);
    bench_gemm("fc2 dgrad", T, F, H, false, false, DType::kBFloat16);
    bench_gemm("fc1 wgrad fp32+=", 2 * F, H, T, true, false, DType::kFloat32, 1.0f);
    bench_gemm("fc2 wgrad fp32+=", H, F, T, true, false, DType::kFloat32, 1.0f);
    bench_gemm("lm-head fwd", T, 128256, H, false, true, DType::kBFloat16);
    bench_gemm("square 8192", 8192, 8192, 8192, false, true, DType::kBFloat16);
  }
  if (only == "gemm_sustained") bench_gemm_sustained(argc > 2 ? std::atof(argv[2]) : 20.0);
  if (only == "gemm_algos") {
    // The LLaMA-3-8B layer's largest GEMMs and the output layer (shapes of "gemm" above).
    const double hold_s = argc > 2 ? std::atof(argv[2]) : 2.0;
    const int64_t T = 8192, H = 4096, F = 14336;
    bench_gemm_algos_sustained("fc1 fwd", T, 2 * F, H, false, true, DType::kBFloat16, 0.0f, 4.0, hold_s);
    bench_gemm_algos_sustained("fc1 dgrad", T, H, 2 * F, false, false, DType::kBFloat16, 0.0f, 1.0, hold_s);
    bench_gemm_algos_sustained("fc1 wgrad fp32+=", 2 * F, H, T, true, false, DType::kFloat32, 1.0f, 1.0, hold_s);
    bench_gemm_algos_sustained("lm-head fwd", T, 128256, H, false, true, DType::kBFloat16, 0.0f, 1.0, hold_s);
    // GPT-2 124M at micro-batch 64 (65536 tokens, h 768): the output layer and the fc1 wgrad.
    bench_gemm_algos_sustained("gpt2 lm-head fwd", 65536, 50304, 768, false, true, DType::kBFloat16, 0.0f, 1.0, hold_s);
    bench_gemm_algos_sustained("gpt2 fc1 wgrad fp32+=", 3072, 768, 65536, true, false, DType::kFloat32, 1.0f, 1.0,
                               hold_s);
  }
  if (only.empty() || only == "mem") {
    const int64_t T = 8192, H = 4096, Vv = 128256;
    {
      Tensor x = rnd({T, H}, DType::kBFloat16), g = rnd({H}, DType::kFloat32), y = rnd({T, H}, DType::kBFloat16);
      Tensor r = Tensor::empty({T}, DType::kFloat32, Device::cuda()), dx = rnd({T, H}, DType::kBFloat16),
             dg = rnd({H}, DType::kFloat32);
      float t = time_ms([&] { cu::rmsnorm_forward(x, g, 1e-5f, false, y, r); });
      report_bw("rmsnorm fwd 8192x4096 bf16", t, 2.0 * T * H * 2);
      t = time_ms([&] { cu::rmsnorm_backward(y, x, g, r, false, dx, dg, true); });
      report_bw("rmsnorm bwd 8192x4096 bf16", t, 3.0 * T * H * 2);
    }
    {
      Tensor l = rnd({T, Vv}, DType::kBFloat16, 3.0f);
      std::vector<int64_t> lab(T);
      for (int64_t i = 0; i < T; ++i) lab[i] = (i * 7919) % Vv;
      Tensor labels = Tensor::from_vector_i64(lab, {T}).to(Device::cuda());
      Tensor m = Tensor::empty({T}, DType::kFloat32, Device::cuda()), s = Tensor::empty({T}, DType::kFloat32, Device::cuda()),
             p = Tensor::empty({T}, DType::kFloat32, Device::cuda());
      float t = time_ms([&] { cu::cross_entropy_stats(l, labels, 0, m, s, p); });
      report_bw("cross_entropy_stats 8192x128256 bf16", t, 1.0 * T * Vv * 2);
      Tensor dl = rnd({T}, DType::kFloat32);
      t = time_ms([&] { cu::cross_entropy_backward(l, labels, 0, m, dl, l); });
      report_bw("cross_entropy_backward in-place 8192x128256 bf16", t, 2.0 * T * Vv * 2);
    }
    {
      const int64_t n = 1ll << 28;  // 268M params
      Tensor p = rnd({n}, DType::kFloat32, 0.1f), g = rnd({n}, DType::kFloat32, 0.01f), mm = rnd({n}, DType::kFloat32, 0.01f),
             vv = rnd({n}, DType::kFloat32, 0.0f), mp = Tensor::empty({n}, DType::kBFloat16, Device::cuda());
      cu::fill(vv, 1e-4f);
      ops::AdamParams ap;
      ap.lr = 1e-4f;
      float t = time_ms([&] { cu::adam_step(p, g, mm, vv, ap, &mp); });
      report_bw("adam_step 268M fp32 + bf16 param", t, n * (4.0 * 4 + 3 * 4 + 2));
      t = time_ms([&] { cu::sum_of_squares(g); });
      report_bw("sum_of_squares 268M fp32", t, n * 4.0);
    }
    {  // LLaMA-3-8B QKV split + RoPE (32 heads, 8 groups, d 128, base 500000) and GPT-2's LayerNorm bwd
      Tensor qkv = rnd({T, 1, 6144}, DType::kBFloat16), q = rnd({T, 1, 32, 128}, DType::kBFloat16),
             k = rnd({T, 1, 8, 128}, DType::kBFloat16), v = rnd({T, 1, 8, 128}, DType::kBFloat16);
      ops::RopeParams rp;
      rp.enabled = true;
      rp.base = 500000.0f;
      float t = time_ms([&] { cu::qkv_split_rope_forward(qkv, 32, 8, rp, nullptr, q, k, v); });
      report_bw("qkv_split_rope fwd 8192x6144 bf16", t, 2.0 * T * 6144 * 2);
      t = time_ms([&] { cu::qkv_split_rope_backward(q, k, v, 32, 8, rp, nullptr, qkv); });
      report_bw("qkv_split_rope bwd 8192x6144 bf16", t, 2.0 * T * 6144 * 2);
      // The same without the per-call (cos, sin) table (rope.cu, Session 12): every channel's angle.
      cu::variants::forced().rope_no_table = true;
      t = time_ms([&] { cu::qkv_split_rope_forward(qkv, 32, 8, rp, nullptr, q, k, v); });
      report_bw("qkv_split_rope fwd 8192x6144 bf16 (no angle table)", t, 2.0 * T * 6144 * 2);
      t = time_ms([&] { cu::qkv_split_rope_backward(q, k, v, 32, 8, rp, nullptr, qkv); });
      report_bw("qkv_split_rope bwd 8192x6144 bf16 (no angle table)", t, 2.0 * T * 6144 * 2);
      cu::variants::forced().rope_no_table = false;
      const int64_t R = 65536, C = 768;
      Tensor x = rnd({R, C}, DType::kBFloat16), y = rnd({R, C}, DType::kBFloat16), dx = rnd({R, C}, DType::kBFloat16);
      Tensor g = rnd({C}, DType::kFloat32), b = rnd({C}, DType::kFloat32), dg = rnd({C}, DType::kFloat32),
             db = rnd({C}, DType::kFloat32), mean = Tensor::empty({R}, DType::kFloat32, Device::cuda()),
             rs = Tensor::empty({R}, DType::kFloat32, Device::cuda());
      cu::layernorm_forward(x, g, b, 1e-5f, false, y, mean, rs);
      t = time_ms([&] { cu::layernorm_backward(y, x, g, mean, rs, false, dx, dg, db, true); });
      report_bw("layernorm bwd 65536x768 bf16", t, 3.0 * R * C * 2);
    }
    {
      Tensor x = rnd({T, 2 * 14336}, DType::kBFloat16), y = Tensor::empty({T, 14336}, DType::kBFloat16, Device::cuda());
      float t = time_ms([&] { cu::swiglu_forward(x, y); });
      report_bw("swiglu fwd 8192x2x14336 bf16", t, T * 14336 * 2.0 * 3);
    }
  }
  if (only.empty() || only == "decode") bench_decode();
  if (only == "moe_layer") {  // the two layer legs alone (tests/gpu/moerouter_check.sh)
    bench_moe_layer("mixtral-8x7b", 4096, 4096, 14336, 8, 2);
    bench_moe_layer("qwen3-30b-a3b", 4096, 2048, 768, 128, 8);
  }
  if (only == "moe_fp8") {  // tests/gpu/moefp8_check.sh: the Mixtral-shaped layer, bf16 and FP8 experts
    megatron::fp8::Fp8Config f8;  // hybrid, delayed (Megatron's defaults)
    bench_moe_layer("mixtral-8x7b", 4096, 4096, 14336, 8, 2);
    bench_moe_layer("mixtral-8x7b-fp8", 4096, 4096, 14336, 8, 2, &f8);
    // Session 11 (docs/moe.md "FP8 experts"): the layer with MEGATRON_MOE_FP8_FUSE=0, then the
    // Experts module's A/B leg (bench/gpu/moe_fp8_leg.h) on fixed uneven counts (8192 rows).
    setenv("MEGATRON_MOE_FP8_FUSE", "0", 1);
    bench_moe_layer("mixtral-8x7b-fp8-off", 4096, 4096, 14336, 8, 2, &f8);
    unsetenv("MEGATRON_MOE_FP8_FUSE");
    bench_moe_fp8_ab("mixtral-8x7b", 4096, 14336, {1000, 1100, 950, 1075, 1010, 990, 1040, 1027}, 2, f8);
  }
  if (only == "moe_gemms") {  // the expert GEMMs at the two main shapes alone (tests/gpu/moestreams_check.sh)
    bench_moe_gemms("mixtral-8x7b", 4096, 4096, 14336, 8, 2);
    bench_moe_gemms("qwen3-30b-a3b", 4096, 2048, 768, 128, 8);
  }
  if (only == "moe") {  // not in the default run: bench/gpu/moe_bench.sh
    bench_moe_gemms("mixtral-8x7b", 4096, 4096, 14336, 8, 2);
    bench_moe_gemms("qwen3-30b-a3b", 4096, 2048, 768, 128, 8);
    // Between the two shapes, for the grouped-vs-loop threshold (ops/grouped_gemm.h): Mixtral at
    // 256 rows per expert (30-60 GFLOP per expert GEMM), DeepSeek-V2-Lite-shaped (64 experts,
    // hidden 2048, ffn 1408, top-6: 384 rows, 2.2-4.4 GFLOP) and Qwen3 at 1024 rows (3.2-6.4 GFLOP).
    bench_moe_gemms("mixtral-8x7b", 1024, 4096, 14336, 8, 2);
    bench_moe_gemms("deepseek-v2-lite", 4096, 2048, 1408, 64, 6);
    bench_moe_gemms("qwen3-30b-a3b", 16384, 2048, 768, 128, 8);
    // The layer legs last: a failing one cannot hide kernel figures.
    bench_moe_layer("mixtral-8x7b", 4096, 4096, 14336, 8, 2);
    bench_moe_layer("qwen3-30b-a3b", 4096, 2048, 768, 128, 8);
  }
  return 0;
}
