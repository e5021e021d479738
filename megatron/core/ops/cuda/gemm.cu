// GEMM and linear layers on CUDA through cuBLASLt (ops.h contract).
//
// Row-major C[m,n] = op(A) op(B) is computed as the column-major product C^T = op(B)^T op(A)^T,
// so no data is transposed. bf16/fp16 inputs use fp32 accumulation (CUBLAS_COMPUTE_32F) with an
// fp32 or same-type output; fp32 inputs run in true fp32 (no TF32). One cuBLASLt handle and one
// 32 MiB workspace per device; the descriptors and the heuristic's algorithm are cached per
// (shape, transposes, dtypes, alignment, epilogue), so a steady-state call does no allocation
// and no heuristic query. Everything runs on current_stream().
#include <cublasLt.h>

#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "megatron/core/ops/cuda/cublaslt_common.h"
#include "megatron/core/ops/cuda/cuda_common.cuh"
#include "megatron/core/ops/cuda/cuda_ops.h"

#define CUBLAS_CHECK MEGATRON_CUBLAS_CHECK

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

cublasStatus_t lt::pick_algorithm(const DeviceContext& ctx, Plan& p, int align_a, int align_b, int align_c,
                                  int& found) {
  cublasLtMatmulPreference_t pref;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = kWorkspaceBytes;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const uint32_t al[3] = {(uint32_t)align_a, (uint32_t)align_b, (uint32_t)align_c};
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0], 4));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1], 4));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], 4));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[2], 4));
  cublasLtMatmulHeuristicResult_t res{};
  found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(ctx.handle, p.op, p.a, p.b, p.c, p.c, pref, 1, &res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_SUCCESS && found > 0) p.algo = res.algo;
  return st;
}

namespace {
cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kFloat32: return CUDA_R_32F;
    case DType::kBFloat16: return CUDA_R_16BF;
    case DType::kFloat16: return CUDA_R_16F;
    default: MEGATRON_CHECK(false) << "gemm: unsupported dtype " << dtype_name(t);
  }
  return CUDA_R_32F;
}

using Key = std::tuple<int, bool, bool, int64_t, int64_t, int64_t, int, int, int, int, int, int, int, int>;
using lt::Plan;
using lt::pointer_alignment;

std::mutex g_plans_mu;
std::map<Key, Plan> g_plans;  // the key holds the device too

// Column-major D[M,N] = op(A) op(B) (+ beta C) (+ bias[M] per row) with D == C.
// A is stored [M,K] (ld lda) or, if ta, [K,M]; B is [K,N] or, if tb, [N,K].
void lt_matmul(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda, DType at,
               const void* B, int64_t ldb, DType bt, void* C, int64_t ldc, DType ct, float alpha, float beta,
               const void* bias, DType biast) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  lt::DeviceContext& s = lt::device_context(dev);
  std::lock_guard<std::mutex> g(g_plans_mu);
  const int al_a = pointer_alignment(A), al_b = pointer_alignment(B), al_c = pointer_alignment(C);
  Key key{dev, ta, tb, M, N, K, (int)at, (int)bt, (int)ct, bias ? (int)biast : -1, al_a, al_b, al_c, beta != 0.0f};
  auto it = g_plans.find(key);
  if (it == g_plans.end()) {
    Plan p;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    if (bias) {
      cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
      cudaDataType_t btype = cuda_type(biast);
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &btype, sizeof(btype)));
    }
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, cuda_type(at), ta ? K : M, ta ? M : K, lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, cuda_type(bt), tb ? N : K, tb ? K : N, ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, cuda_type(ct), M, N, ldc));
    int found = 0;
    const cublasStatus_t st = lt::pick_algorithm(s, p, al_a, al_b, al_c, found);
    MEGATRON_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0)
        << "gemm: cuBLASLt has no algorithm for M=" << M << " N=" << N << " K=" << K << " types "
        << dtype_name(at) << "/" << dtype_name(bt) << "->" << dtype_name(ct) << (bias ? " with bias" : "")
        << " (status " << (int)st << ")";
    it = g_plans.emplace(key, p).first;
  }
  Plan& p = it->second;
  if (bias)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  CUBLAS_CHECK(cublasLtMatmul(s.handle, p.op, &alpha, A, p.a, B, p.b, &beta, C, p.c, C, p.c, &p.algo, s.workspace,
                              lt::kWorkspaceBytes, megatron::cuda::current_stream()));
}

// Row-major C[m,n] = alpha op(A) op(B) + beta C (+ bias[n] broadcast over rows).
void rm_gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha, float beta,
             const Tensor* bias) {
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
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == 0.0f) ops::cuda::fill(c, 0.0f);
    else ops::cuda::scale_(c, beta);
    return;
  }
  // Column-major view: C^T[n,m] = op(B)^T [n,k] * op(A)^T [k,m].
  lt_matmul(trans_b, trans_a, n, m, k, b.data_ptr(), b_cols, b.dtype(), a.data_ptr(), a_cols, a.dtype(), c.data_ptr(),
            n, c.dtype(), alpha, beta, bias ? bias->data_ptr() : nullptr, bias ? bias->dtype() : DType::kFloat32);
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
  if (dx) rm_gemm(dy, false, w, false, *dx, 1.0f, 0.0f, nullptr);                       // dx = dy @ w
  if (dw) rm_gemm(dy, true, x, false, *dw, 1.0f, accumulate ? 1.0f : 0.0f, nullptr);    // dw (+)= dy^T @ x
  if (dbias) {
    MEGATRON_CHECK(dbias->numel() == n) << "linear_backward: dbias " << dbias->str();
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

}  // namespace megatron::ops::cuda
