// FP8 GEMMs through cuBLASLt (ops of op_table.h).
//
// Hopper's FP8 tensor-core GEMMs take only the "TN" form: both operands K-major. Row-major
// C[m,n] = A[m,k] B[n,k]^T is the column-major D[n,m] = op_T(B') op_N(A') with B' = B viewed
// column-major [k,n] and A' = A viewed [k,m] -- both already K-major, so nothing is copied.
// Per-tensor dequantization scales are passed as device pointers (A/B_SCALE_POINTER), so the
// delayed-scaling state never leaves the GPU. The cuBLASLt handle and 32 MiB workspace of the
// device are gemm.cu's (cublaslt_common.h); descriptors and the heuristic's algorithm are cached per shape/type key.
#include <cublasLt.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "megatron/core/ops/cuda/cublaslt_common.h"
#include "megatron/core/ops/cuda/cuda_common.cuh"
#include "megatron/core/ops/cuda/cuda_ops.h"

#define FP8_CUBLAS_CHECK MEGATRON_CUBLAS_CHECK

namespace megatron::ops::cuda {

namespace {
cudaDataType_t lt_type(DType t) {
  switch (t) {
    case DType::kFloat8E4M3: return CUDA_R_8F_E4M3;
    case DType::kFloat8E5M2: return CUDA_R_8F_E5M2;
    case DType::kBFloat16: return CUDA_R_16BF;
    case DType::kFloat16: return CUDA_R_16F;
    case DType::kFloat32: return CUDA_R_32F;
    default: MEGATRON_CHECK(false) << "fp8_gemm: unsupported dtype " << dtype_name(t);
  }
  return CUDA_R_32F;
}

using Key = std::tuple<int, int64_t, int64_t, int64_t, int, int, int, bool, bool, int, int, int>;
using lt::Plan;
using lt::pointer_alignment;

struct CachedPlan {
  Plan plan;
  bool supported = false;
};
std::mutex g_plans_mu;
std::map<Key, CachedPlan> g_plans;  // the key holds the device too

// The GEMM with C read from c_in (nullptr: C = D = c). `must`: no algorithm is an error; else
// returns false (nothing launched).
bool run_fp8_gemm(const Tensor& a, const float* a_scale_inv, const Tensor& b, const float* b_scale_inv, Tensor& c,
                  const Tensor* c_in, float beta, bool fast_accum, bool must) {
  MEGATRON_CHECK(a.is_cuda() && b.is_cuda() && c.is_cuda() && a.dim() == 2 && b.dim() == 2 && c.dim() == 2)
      << "fp8_gemm_tn: a " << a.str() << " b " << b.str() << " c " << c.str();
  const int64_t m = a.size(0), k = a.size(1), n = b.size(0);
  MEGATRON_CHECK(b.size(1) == k && c.size(0) == m && c.size(1) == n)
      << "fp8_gemm_tn: a " << a.str() << " b " << b.str() << "^T c " << c.str();
  MEGATRON_CHECK(!(a.dtype() == DType::kFloat8E5M2 && b.dtype() == DType::kFloat8E5M2))
      << "fp8_gemm_tn: E5M2 x E5M2 is not supported by cuBLASLt";
  if (m == 0 || n == 0) return true;
  if (k % 16 != 0 || n % 16 != 0 || m % 16 != 0)
    user_error("FP8 GEMM [", m, " x ", k, "] @ [", n, " x ", k, "]^T: cuBLASLt FP8 needs m, n and k divisible by 16");
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  lt::DeviceContext& s = lt::device_context(dev);  // shared with gemm.cu's GEMMs
  std::lock_guard<std::mutex> g(g_plans_mu);
  // Column-major problem: M = n, N = m; A' = b (transposed), B' = a.
  const int64_t M = n, N = m, K = k;
  const int al_a = pointer_alignment(b.data_ptr()), al_b = pointer_alignment(a.data_ptr()),
            al_c = std::min(pointer_alignment(c.data_ptr()), c_in ? pointer_alignment(c_in->data_ptr()) : 256);
  Key key{dev, M, N, K, (int)b.dtype(), (int)a.dtype(), (int)c.dtype(), fast_accum, beta != 0.0f, al_a, al_b, al_c};
  auto it = g_plans.find(key);
  if (it == g_plans.end()) {
    CachedPlan cp;
    Plan& p = cp.plan;
    FP8_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
    FP8_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    FP8_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    int8_t fa = fast_accum ? 1 : 0;
    FP8_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, sizeof(fa)));
    FP8_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, lt_type(b.dtype()), K, M, K));
    FP8_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, lt_type(a.dtype()), K, N, K));
    FP8_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, lt_type(c.dtype()), M, N, M));
    // The scale pointers must be set for the heuristic to pick an FP8 kernel that reads them.
    FP8_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale_inv, sizeof(void*)));
    FP8_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale_inv, sizeof(void*)));
    int found = 0;
    const cublasStatus_t st = lt::pick_algorithm(s, p, al_a, al_b, al_c, found);
    cp.supported = st == CUBLAS_STATUS_SUCCESS && found > 0;
    MEGATRON_CHECK(cp.supported || !must)
        << "fp8_gemm: cuBLASLt has no algorithm for m=" << m << " n=" << n << " k=" << k << " types "
        << dtype_name(a.dtype()) << "/" << dtype_name(b.dtype()) << "->" << dtype_name(c.dtype()) << " (status "
        << (int)st << ")";
    it = g_plans.emplace(key, cp).first;
  }
  if (!it->second.supported) {
    MEGATRON_CHECK(!must) << "fp8_gemm: no algorithm (cached) for m=" << m << " n=" << n << " k=" << k;
    return false;
  }
  Plan& p = it->second.plan;
  FP8_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale_inv, sizeof(void*)));
  FP8_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale_inv, sizeof(void*)));
  const float alpha = 1.0f;
  const void* c_read = c_in ? c_in->data_ptr() : c.data_ptr();
  FP8_CUBLAS_CHECK(cublasLtMatmul(s.handle, p.op, &alpha, b.data_ptr(), p.a, a.data_ptr(), p.b, &beta, c_read, p.c,
                                  c.data_ptr(), p.c, &p.algo, s.workspace, lt::kWorkspaceBytes,
                                  megatron::cuda::current_stream()));
  return true;
}
}  // namespace

void fp8_gemm_tn(const Tensor& a, const float* a_scale_inv, const Tensor& b, const float* b_scale_inv, Tensor& c,
                 float beta, bool fast_accum) {
  run_fp8_gemm(a, a_scale_inv, b, b_scale_inv, c, nullptr, beta, fast_accum, /*must=*/true);
}

bool fp8_gemm_tn_residual(const Tensor& a, const float* a_scale_inv, const Tensor& b, const float* b_scale_inv,
                          const Tensor& residual, Tensor& d, bool fast_accum) {
  MEGATRON_CHECK(residual.is_cuda() && residual.dtype() == d.dtype() && residual.numel() == d.numel() &&
                 d.dtype() != DType::kFloat32)
      << "fp8_gemm_tn_residual: residual " << residual.str() << " d " << d.str();
  if (!gemm_epilogues_enabled()) return false;
  return run_fp8_gemm(a, a_scale_inv, b, b_scale_inv, d, &residual, 1.0f, fast_accum, /*must=*/false);
}

}  // namespace megatron::ops::cuda
