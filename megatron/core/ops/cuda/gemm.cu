// GEMM and linear layers on CUDA through cuBLASLt (ops.h contract).
//
// Row-major C[m,n] = op(A) op(B) is computed as the column-major product C^T = op(B)^T op(A)^T,
// so no data is transposed. bf16/fp16 inputs use fp32 accumulation (CUBLAS_COMPUTE_32F) with an
// fp32 or same-type output; fp32 inputs run in true fp32 (no TF32). One cuBLASLt handle and one
// 32 MiB workspace per device (and one per side stream given one, cublaslt_common.h); the descriptors and the heuristic's algorithm are cached per
// (shape, transposes, dtypes, alignment, epilogue), so a steady-state call does no allocation
// and no heuristic query. Everything runs on current_stream().
#include <cublasLt.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "megatron/core/ops/cuda/cublaslt_common.h"
#include "megatron/core/ops/cuda/cuda_common.cuh"
#include "megatron/core/ops/cuda/cuda_ops.h"
#include "megatron/core/ops/cuda/deterministic.h"
#include "megatron/core/ops/device.h"
#include "megatron/core/utils/env.h"

#define CUBLAS_CHECK MEGATRON_CUBLAS_CHECK

namespace megatron::ops {
namespace {
std::atomic<int> g_gemm_sm_margin{0};  // ops/device.h set_gemm_sm_margin
}  // namespace
void set_gemm_sm_margin(int sms) { g_gemm_sm_margin.store(sms, std::memory_order_relaxed); }
int gemm_sm_margin() { return g_gemm_sm_margin.load(std::memory_order_relaxed); }
}  // namespace megatron::ops

namespace megatron::ops::cuda {
using namespace detail;

lt::DeviceContext& lt::device_context(int dev) {
  static std::mutex mu;
  static std::map<int, DeviceContext*> contexts;
  std::lock_guard<std::mutex> g(mu);
  auto it = contexts.find(dev);
  if (it != contexts.end()) return *it->second;
  auto* c = new DeviceContext();  // lives for the process (handles are process-wide)
  CUBLAS_CHECK(cublasLtCreate(&c->handle));
  CUDA_CHECK(cudaMalloc(&c->workspace, kWorkspaceBytes));  // once per device, never per call
  contexts[dev] = c;
  return *c;
}

void* lt::workspace_for(DeviceContext& ctx, cudaStream_t st) {
  std::lock_guard<std::mutex> g(ctx.streams_mu);
  for (const auto& [s, ws] : ctx.stream_workspaces)
    if (s == st) return ws;
  return ctx.workspace;
}

void lt::add_stream_workspace(int dev, cudaStream_t st) {
  DeviceContext& ctx = device_context(dev);
  std::lock_guard<std::mutex> g(ctx.streams_mu);
  for (const auto& sw : ctx.stream_workspaces)
    if (sw.first == st) return;
  void* ws = nullptr;
  CUDA_CHECK(cudaMalloc(&ws, kWorkspaceBytes));  // once per stream, never per call
  ctx.stream_workspaces.emplace_back(st, ws);
}

cublasStatus_t lt::pick_algorithms(const DeviceContext& ctx, const Plan& p, int align_a, int align_b, int align_c,
                                   int max_algos, cublasLtMatmulHeuristicResult_t* out, int& found) {
  cublasLtMatmulPreference_t pref;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = kWorkspaceBytes;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const uint32_t al[3] = {(uint32_t)align_a, (uint32_t)align_b, (uint32_t)align_c};
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0], 4));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1], 4));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], 4));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[2], 4));
  found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(ctx.handle, p.op, p.a, p.b, p.c, p.c, pref, max_algos, out, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  return st;
}

cublasStatus_t lt::pick_algorithm(const DeviceContext& ctx, Plan& p, int align_a, int align_b, int align_c,
                                  int& found) {
  cublasLtMatmulHeuristicResult_t res{};
  const cublasStatus_t st = pick_algorithms(ctx, p, align_a, align_b, align_c, 1, &res, found);
  if (st == CUBLAS_STATUS_SUCCESS && found > 0) p.algo = res.algo;
  return st;
}

namespace {
using lt::cuda_type;

// Epilogue of one cuBLASLt call. kind: CUBLASLT_EPILOGUE_DEFAULT, _BIAS (bias read, length =
// rows of the column-major D), _GELU_AUX_BIAS (bias read, aux = GeLU input written, D = GeLU),
// _DGELU_BGRAD (aux = GeLU input read, D = GeLU'(aux) * product, bias = Σ over D's columns written,
// in D's type), _BGRADB (bias = Σ of B over k written, in D's type). aux is column-major with
// D's shape and leading dimension aux_ld (a multiple of 8).
struct Epilogue {
  cublasLtEpilogue_t kind = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  DType bias_type = DType::kFloat32;
  void* aux = nullptr;
  int64_t aux_ld = 0;
  const void* c_in = nullptr;  // if set: C (read with beta) is this matrix, D's layout; D is written
};

using Key = std::tuple<int, bool, bool, int64_t, int64_t, int64_t, int, int, int, int, int, int, int, int, int, int, int,
                       int64_t, int>;
using lt::Plan;
using lt::pointer_alignment;

struct CachedPlan {
  Plan plan;
  bool supported = false;  // false: the heuristic had no algorithm (callers fall back)
};
std::mutex g_plans_mu;
std::map<Key, CachedPlan> g_plans;  // the key holds the device too

// The autotuner (docs/performance.md "Session 13: GEMM autotuning at the power limit"): a
// training step runs at the H200's 700 W limit (SM clock ≈ 1500 of 1980 MHz), where cuBLASLt's
// heuristic pick, which is made for the boost clock, was measured up to 1.10x slower than another
// candidate held for seconds (gpu_bench gemm_algos). Timing a candidate alone for a few launches
// would measure it at the boost clock again, so the candidates are timed in rounds after a warm-up
// of ~150 ms of back-to-back launches: the chip is then at its limit, and every candidate is
// measured in each round under the same condition. The operands are the call's own (their values
// do not change a kernel's speed much); D is the call's when the real call overwrites it (beta 0,
// or C read from e.c_in), else a scratch buffer, so nothing the call reads is changed. Returns the
// index of the fastest of `n` candidates (0 when tuning is not possible); one line on stderr.
int tune_candidates(lt::DeviceContext& s, const lt::Plan& p, const cublasLtMatmulHeuristicResult_t* res, int n,
                    const void* A, const void* B, void* C, const void* c_read_real, bool d_is_overwritten,
                    size_t d_bytes, float alpha, float beta, int64_t M, int64_t N, int64_t K) {
  cudaStream_t st = megatron::cuda::current_stream();
  void* scratch = nullptr;
  void* D = C;
  const void* c_read = c_read_real;
  if (!d_is_overwritten) {
    if (cudaMallocAsync(&scratch, d_bytes, st) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    CUDA_CHECK(cudaMemsetAsync(scratch, 0, d_bytes, st));
    D = scratch;
    c_read = scratch;
  }
  void* ws = lt::workspace_for(s, st);
  auto launch = [&](int i) {
    return cublasLtMatmul(s.handle, p.op, &alpha, A, p.a, B, p.b, &beta, c_read, p.c, D, p.c, &res[i].algo, ws,
                          lt::kWorkspaceBytes, st) == CUBLAS_STATUS_SUCCESS;
  };
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  // ms of `reps` launches of candidate i (-1: the candidate failed to launch).
  auto timed = [&](int i, int reps) -> float {
    CUDA_CHECK(cudaEventRecord(e0, st));
    for (int r = 0; r < reps; ++r)
      if (!launch(i)) return -1.0f;
    CUDA_CHECK(cudaEventRecord(e1, st));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    return ms;
  };
  int best = 0;
  const float one = timed(0, 1);
  if (one > 0.0f) {
    const int warm = std::max(1, std::min(2000, (int)(150.0f / one)));
    const int reps = std::max(1, std::min(500, (int)(25.0f / one)));
    timed(0, warm);
    std::vector<double> total(n, 0.0);
    std::vector<bool> ok(n, true);
    for (int round = 0; round < 3; ++round)
      for (int i = 0; i < n; ++i) {
        if (!ok[i]) continue;
        const float ms = timed(i, reps);
        if (ms < 0.0f) ok[i] = false;
        else total[i] += ms;
      }
    for (int i = 1; i < n; ++i)
      if (ok[i] && total[i] < total[best]) best = i;
    std::fprintf(stderr, "cuBLASLt autotune M=%ld N=%ld K=%ld: candidate %d of %d, %.3fx the heuristic's time\n",
                 (long)M, (long)N, (long)K, best, n, total[best] / total[0]);
  }
  (void)cudaGetLastError();  // a failed candidate's launch error is not the caller's
  CUDA_CHECK(cudaEventDestroy(e0));
  CUDA_CHECK(cudaEventDestroy(e1));
  if (scratch) CUDA_CHECK(cudaFreeAsync(scratch, st));
  return best;
}

// Column-major D[M,N] = op(A) op(B) (+ beta C) with the epilogue `e`, D == C.
// A is stored [M,K] (ld lda) or, if ta, [K,M]; B is [K,N] or, if tb, [N,K].
// Returns false (nothing launched) when cuBLASLt has no algorithm for a non-default epilogue;
// throws (internal check) when a plain or bias GEMM has none.
bool lt_matmul(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda, DType at,
               const void* B, int64_t ldb, DType bt, void* C, int64_t ldc, DType ct, float alpha, float beta,
               const Epilogue& e) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  lt::DeviceContext& s = lt::device_context(dev);
  std::lock_guard<std::mutex> g(g_plans_mu);
  const int al_a = pointer_alignment(A), al_b = pointer_alignment(B),
            al_c = std::min(pointer_alignment(C), e.c_in ? pointer_alignment(e.c_in) : 256);
  const bool has_bias = e.bias != nullptr;
  const int al_bias = has_bias ? pointer_alignment(e.bias) : 0, al_aux = e.aux ? pointer_alignment(e.aux) : 0;
  const int sm_margin = ops::gemm_sm_margin();
  Key key{dev, ta, tb, M, N, K, (int)at, (int)bt, (int)ct, has_bias ? (int)e.bias_type : -1, al_a, al_b, al_c,
          beta != 0.0f, (int)e.kind, al_bias, al_aux, e.aux_ld, sm_margin};
  auto it = g_plans.find(key);
  if (it == g_plans.end()) {
    CachedPlan cp;
    Plan& p = cp.plan;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    if (sm_margin != 0) {
      // ops/device.h set_gemm_sm_margin: plan (and, for persistent kernels, launch) for fewer SMs.
      int sms = 0;
      CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
      MEGATRON_CHECK(sm_margin > 0 && sm_margin < sms)
          << "gemm: SM margin " << sm_margin << " outside 0.." << sms - 1 << " (this device has " << sms << " SMs)";
      const int32_t target = sms - sm_margin;
      CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &target, sizeof(target)));
    }
    if (e.kind != CUBLASLT_EPILOGUE_DEFAULT) {
      cublasLtEpilogue_t epi = e.kind;
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    }
    if (has_bias) {
      cudaDataType_t btype = cuda_type(e.bias_type);
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &btype, sizeof(btype)));
      // The heuristic reads the pointers' alignment.
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &e.bias, sizeof(e.bias)));
    }
    if (e.aux) {
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &e.aux, sizeof(e.aux)));
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &e.aux_ld,
                                                  sizeof(e.aux_ld)));
    }
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, cuda_type(at), ta ? K : M, ta ? M : K, lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, cuda_type(bt), tb ? N : K, tb ? K : N, ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, cuda_type(ct), M, N, ldc));
    int found = 0;
    const cublasStatus_t st = lt::pick_algorithm(s, p, al_a, al_b, al_c, found);
    cp.supported = st == CUBLAS_STATUS_SUCCESS && found > 0;
    // MEGATRON_GEMM_AUTOTUNE=1 (ops/device.h gemm_autotune_switch): tune the new plan, never in
    // --deterministic-mode (the pick would vary between runs) or while a CUDA graph is captured.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cp.supported && ops::gemm_autotune_switch() && !megatron::cuda::deterministic() &&
        cudaStreamIsCapturing(megatron::cuda::current_stream(), &capture) == cudaSuccess &&
        capture == cudaStreamCaptureStatusNone) {
      cublasLtMatmulHeuristicResult_t res[8];
      int n = 0;
      if (lt::pick_algorithms(s, p, al_a, al_b, al_c, 8, res, n) == CUBLAS_STATUS_SUCCESS && n > 1) {
        const size_t d_bytes = (size_t)ldc * (size_t)N * dtype_size(ct);
        const int best = tune_candidates(s, p, res, n, A, B, C, e.c_in ? e.c_in : C, beta == 0.0f || e.c_in != nullptr,
                                         d_bytes, alpha, beta, M, N, K);
        p.algo = res[best].algo;
      }
    }
    const bool must = e.kind == CUBLASLT_EPILOGUE_DEFAULT || e.kind == CUBLASLT_EPILOGUE_BIAS;
    MEGATRON_CHECK(cp.supported || !must)
        << "gemm: cuBLASLt has no algorithm for M=" << M << " N=" << N << " K=" << K << " types "
        << dtype_name(at) << "/" << dtype_name(bt) << "->" << dtype_name(ct) << (has_bias ? " with bias" : "")
        << " (status " << (int)st << ")";
    it = g_plans.emplace(key, cp).first;
  }
  if (!it->second.supported) return false;
  Plan& p = it->second.plan;
  if (has_bias)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &e.bias, sizeof(e.bias)));
  if (e.aux)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &e.aux, sizeof(e.aux)));
  const void* c_read = e.c_in ? e.c_in : C;
  cudaStream_t st = megatron::cuda::current_stream();
  CUBLAS_CHECK(cublasLtMatmul(s.handle, p.op, &alpha, A, p.a, B, p.b, &beta, c_read, p.c, C, p.c, &p.algo,
                              lt::workspace_for(s, st), lt::kWorkspaceBytes, st));
  return true;
}

// Row-major C[m,n] = alpha op(A) op(B) + beta C with the epilogue `e` (bias / bias gradient of
// length n: the column-major view's rows; aux row-major [m, n], i.e. column-major ld n).
// Returns lt_matmul's answer (false: unsupported epilogue, nothing done).
bool rm_gemm_ex(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha, float beta,
                const Epilogue& e) {
  MEGATRON_CHECK(a.is_cuda() && b.is_cuda() && c.is_cuda()) << "gemm: " << a.str() << " " << b.str() << " " << c.str();
  MEGATRON_CHECK(a.dim() >= 2 && b.dim() >= 2 && a.dtype() == b.dtype()) << "gemm: a " << a.str() << " b " << b.str();
  const int64_t a_cols = a.size(-1), a_rows = a.numel() / std::max<int64_t>(a_cols, 1);
  const int64_t b_cols = b.size(-1), b_rows = b.numel() / std::max<int64_t>(b_cols, 1);
  const int64_t m = trans_a ? a_cols : a_rows, k = trans_a ? a_rows : a_cols;
  const int64_t kb = trans_b ? b_cols : b_rows, n = trans_b ? b_rows : b_cols;
  MEGATRON_CHECK(k == kb && c.numel() == m * n && c.size(-1) == n &&
                 (c.dtype() == DType::kFloat32 || c.dtype() == a.dtype()))
      << "gemm: a " << a.str() << (trans_a ? "^T" : "") << " b " << b.str() << (trans_b ? "^T" : "") << " c "
      << c.str();
  if (e.kind != CUBLASLT_EPILOGUE_DEFAULT && e.kind != CUBLASLT_EPILOGUE_BIAS && (m == 0 || n == 0 || k == 0))
    return false;
  if (m == 0 || n == 0) return true;
  if (k == 0) {
    if (beta == 0.0f) ops::cuda::fill(c, 0.0f);
    else ops::cuda::scale_(c, beta);
    return true;
  }
  // Column-major view: C^T[n,m] = op(B)^T [n,k] * op(A)^T [k,m].
  return lt_matmul(trans_b, trans_a, n, m, k, b.data_ptr(), b_cols, b.dtype(), a.data_ptr(), a_cols, a.dtype(),
                   c.data_ptr(), n, c.dtype(), alpha, beta, e);
}

void rm_gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha, float beta,
             const Tensor* bias) {
  Epilogue e;
  if (bias) {
    e.kind = CUBLASLT_EPILOGUE_BIAS;
    e.bias = bias->data_ptr();
    e.bias_type = bias->dtype();
  }
  rm_gemm_ex(a, trans_a, b, trans_b, c, alpha, beta, e);
}


// MEGATRON_BGRADB=1: bias gradients from cuBLASLt's BGRADB epilogue (the default before Session
// 4); default: one 16-byte-load column-sum pass (bias_grad_colsum), 1.5x faster at GPT-2 shapes.
bool bgradb_epilogue_preferred() {
  static const bool on = env_switch("MEGATRON_BGRADB", false);
  return on;
}

// Column sums of dy [rows, n] into partial [G, n]; rows split into G chunks.
template <class T>
__global__ void colsum_partial_kernel(const T* __restrict__ dy, int64_t rows, int64_t n, int64_t chunk,
                                      float* __restrict__ part) {
  int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (c >= n) return;
  int64_t r0 = blockIdx.y * chunk, r1 = min(rows, r0 + chunk);
  float s = 0.0f;
  for (int64_t r = r0; r < r1; ++r) s += to_f(dy[r * n + c]);
  part[blockIdx.y * n + c] = s;
}

template <class T>
__global__ void colsum_final_kernel(const float* __restrict__ part, int g, int64_t n, T* __restrict__ out, bool acc) {
  int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (c >= n) return;
  float s = 0.0f;
  for (int i = 0; i < g; ++i) s += part[i * n + c];
  if (acc) s += to_f(out[c]);
  out[c] = from_f<T>(s);
}
}  // namespace

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha, float beta) {
  rm_gemm(a, trans_a, b, trans_b, c, alpha, beta, nullptr);
}

void linear_forward(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  MEGATRON_CHECK(w.dim() == 2 && x.size(-1) == w.size(1) && y.size(-1) == w.size(0) &&
                 y.numel() / std::max<int64_t>(w.size(0), 1) == x.numel() / std::max<int64_t>(w.size(1), 1) &&
                 (!bias || bias->numel() == w.size(0)))
      << "linear_forward: x " << x.str() << " w " << w.str() << " y " << y.str();
  const int64_t rows = x.numel() / std::max<int64_t>(x.size(-1), 1), n = w.size(0);
  const bool fused = bias && bias->dtype() == y.dtype() && y.dtype() != DType::kFloat32;
  rm_gemm(x, false, w, true, y, 1.0f, 0.0f, fused ? bias : nullptr);
  if (bias && !fused && rows * n > 0) ops::cuda::bias_add_(y, *bias);
}

void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx, Tensor* dw, Tensor* dbias,
                     bool accumulate) {
  MEGATRON_CHECK(w.dim() == 2 && dy.size(-1) == w.size(0) && x.size(-1) == w.size(1))
      << "linear_backward: dy " << dy.str() << " x " << x.str() << " w " << w.str();
  const int64_t rows = dy.numel() / std::max<int64_t>(dy.size(-1), 1), n = w.size(0);
  MEGATRON_CHECK(!dbias || dbias->numel() == n) << "linear_backward: dbias " << dbias->str();
  if (dx) rm_gemm(dy, false, w, false, *dx, 1.0f, 0.0f, nullptr);  // dx = dy @ w
  // dw (+)= dy^T @ x; with bf16/fp16 inputs the bias gradient Σ_rows dy comes out of the same
  // GEMM (cuBLASLt BGRADB: B = dy reduced over k = rows, written in dw's type) instead of a
  // separate column-sum pass over dy, when cuBLASLt has such a kernel.
  bool dbias_done = false;
  if (dbias && n > 0 && rows > 0 && dy.dtype() != DType::kFloat32 && gemm_epilogues_enabled() &&
      !bgradb_epilogue_preferred() && bias_grad_colsum(dy, *dbias, accumulate))
    dbias_done = true;
  if (!dbias_done && dw && dbias && n > 0 && rows > 0 && dy.dtype() != DType::kFloat32 && gemm_epilogues_enabled()) {
    Tensor tmp = Tensor::empty({n}, dw->dtype(), dy.device());
    Epilogue e;
    e.kind = CUBLASLT_EPILOGUE_BGRADB;
    e.bias = tmp.data_ptr();
    e.bias_type = dw->dtype();
    if (rm_gemm_ex(dy, true, x, false, *dw, 1.0f, accumulate ? 1.0f : 0.0f, e)) {
      if (accumulate) ops::cuda::add_(*dbias, tmp, 1.0f);
      else ops::cuda::cast(tmp, *dbias);
      dbias_done = true;
      dw = nullptr;
    }
  }
  if (dw) rm_gemm(dy, true, x, false, *dw, 1.0f, accumulate ? 1.0f : 0.0f, nullptr);
  if (dbias && !dbias_done) {
    if (n == 0) return;
    cudaStream_t st = megatron::cuda::current_stream();
    const int64_t g = std::max<int64_t>(1, std::min<int64_t>(64, (rows + 127) / 128));
    const int64_t chunk = (rows + g - 1) / g;
    float* part = nullptr;
    CUDA_CHECK(cudaMallocAsync(&part, sizeof(float) * g * n, st));
    dim3 grid((unsigned)((n + 255) / 256), (unsigned)g);
    MCU_FLOAT_SWITCH(dy.dtype(), T,
                     colsum_partial_kernel<T><<<grid, 256, 0, st>>>(static_cast<const T*>(dy.data_ptr()), rows, n,
                                                                    chunk, part));
    CUDA_CHECK_LAUNCH();
    MCU_FLOAT_SWITCH(dbias->dtype(), T,
                     colsum_final_kernel<T><<<(unsigned)((n + 255) / 256), 256, 0, st>>>(
                         part, (int)g, n, static_cast<T*>(dbias->data_ptr()), accumulate));
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cudaFreeAsync(part, st));
  }
}

// MEGATRON_GEMM_EPILOGUES=0 (A/B runs): no fused epilogue anywhere -- the GeLU/residual ops
// report "not fused", and the bias gradients stay out of the wgrad GEMM.
bool gemm_epilogues_enabled() {
  static const bool on = env_switch("MEGATRON_GEMM_EPILOGUES", true);
  return on;
}

bool linear_bias_gelu_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& pre, Tensor& act) {
  MEGATRON_CHECK(w.dim() == 2 && x.size(-1) == w.size(1) && bias.numel() == w.size(0) && pre.size(-1) == w.size(0) &&
                 act.numel() == pre.numel() && pre.numel() / std::max<int64_t>(w.size(0), 1) ==
                                                   x.numel() / std::max<int64_t>(w.size(1), 1))
      << "linear_bias_gelu_forward: x " << x.str() << " w " << w.str() << " pre " << pre.str() << " act " << act.str();
  const int64_t n = w.size(0);
  if (!gemm_epilogues_enabled() || x.dtype() == DType::kFloat32 || pre.dtype() != x.dtype() || act.dtype() != x.dtype() ||
      bias.dtype() != x.dtype() || n % 8 != 0)
    return false;
  Epilogue e;
  e.kind = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  e.bias = bias.data_ptr();
  e.bias_type = bias.dtype();
  e.aux = pre.data_ptr();
  e.aux_ld = n;
  return rm_gemm_ex(x, false, w, true, act, 1.0f, 0.0f, e);
}

bool linear_dgelu_bgrad_backward(const Tensor& dy, const Tensor& w, const Tensor& pre, Tensor& dpre, Tensor* dbias,
                                 bool accumulate) {
  MEGATRON_CHECK(w.dim() == 2 && dy.size(-1) == w.size(0) && pre.size(-1) == w.size(1) &&
                 dpre.numel() == pre.numel() && pre.numel() / std::max<int64_t>(w.size(1), 1) ==
                                                    dy.numel() / std::max<int64_t>(w.size(0), 1) &&
                 (!dbias || dbias->numel() == w.size(1)))
      << "linear_dgelu_bgrad_backward: dy " << dy.str() << " w " << w.str() << " pre " << pre.str();
  const int64_t n = w.size(1);
  if (dy.dtype() == DType::kFloat32 || pre.dtype() != dy.dtype() || dpre.dtype() != dy.dtype() || n % 8 != 0)
    return false;
  // The bias gradient comes out in dpre's type (cuBLASLt), rounded once like Megatron's bf16
  // bias .grad, then accumulated into the (fp32) main grad.
  Tensor tmp = Tensor::empty({n}, dpre.dtype(), dy.device());
  Epilogue e;
  e.kind = dbias ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
  if (dbias) {
    e.bias = tmp.data_ptr();
    e.bias_type = dpre.dtype();
  }
  e.aux = const_cast<void*>(pre.data_ptr());
  e.aux_ld = n;
  if (!rm_gemm_ex(dy, false, w, false, dpre, 1.0f, 0.0f, e)) return false;
  if (dbias) {
    if (accumulate) ops::cuda::add_(*dbias, tmp, 1.0f);
    else ops::cuda::cast(tmp, *dbias);
  }
  return true;
}

bool linear_forward_residual(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& residual, Tensor& y) {
  MEGATRON_CHECK(w.dim() == 2 && x.size(-1) == w.size(1) && y.size(-1) == w.size(0) &&
                 y.numel() / std::max<int64_t>(w.size(0), 1) == x.numel() / std::max<int64_t>(w.size(1), 1) &&
                 residual.numel() == y.numel() && (!bias || bias->numel() == w.size(0)))
      << "linear_forward_residual: x " << x.str() << " w " << w.str() << " y " << y.str() << " residual "
      << residual.str();
  if (!gemm_epilogues_enabled() || residual.dtype() != y.dtype() || (bias && bias->dtype() != y.dtype()) ||
      y.dtype() == DType::kFloat32 ||
      residual.data_ptr() == y.data_ptr() || x.numel() == 0 || y.numel() == 0)
    return false;
  Epilogue e;
  if (bias) {
    e.kind = CUBLASLT_EPILOGUE_BIAS;
    e.bias = bias->data_ptr();
    e.bias_type = bias->dtype();
  }
  e.c_in = residual.data_ptr();
  return rm_gemm_ex(x, false, w, true, y, 1.0f, 1.0f, e);
}

}  // namespace megatron::ops::cuda
