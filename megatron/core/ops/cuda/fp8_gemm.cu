// FP8 GEMMs through cuBLASLt (declared in fp8_cuda.h).
//
// Hopper's FP8 tensor-core GEMMs take only the "TN" form: both operands K-major. Row-major
// C[m,n] = A[m,k] B[n,k]^T is the column-major D[n,m] = op_T(B') op_N(A') with B' = B viewed
// column-major [k,n] and A' = A viewed [k,m] -- both already K-major, so nothing is copied.
// Per-tensor dequantization scales are passed as device pointers (A/B_SCALE_POINTER), so the
// delayed-scaling state never leaves the GPU. One handle and a 32 MiB workspace per device;
// descriptors and the heuristic's algorithm are cached per shape/type key.
#include <cublasLt.h>

#include <map>
#include <mutex>
#include <tuple>

#include "megatron/core/ops/cuda/cuda_common.cuh"
#include "megatron/core/ops/cuda/fp8_cuda.h"

#define FP8_CUBLAS_CHECK(expr)                                                               \
  do {                                                                                       \
    cublasStatus_t _s = (expr);                                                              \
    MEGATRON_CHECK(_s == CUBLAS_STATUS_SUCCESS) << #expr << ": cuBLAS status " << (int)_s;   \
  } while (0)

namespace megatron::ops::cuda {

namespace {
constexpr size_t kWorkspace = 32u << 20;

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

int align_of(const void* p) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int al = 256;
  while (al > 1 && (a % al)) al /= 2;
  return al;
}

using Key = std::tuple<int, int64_t, int64_t, int64_t, int, int, int, bool, bool, int, int, int>;

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

struct Fp8Lt {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::map<Key, Plan> plans;
  std::mutex mu;
};

Fp8Lt& lt_state(int dev) {
  static std::mutex mu;
  static std::map<int, Fp8Lt*> states;
  std::lock_guard<std::mutex> g(mu);
  auto it = states.find(dev);
  if (it != states.end()) return *it->second;
  auto* s = new Fp8Lt();  // process lifetime
  FP8_CUBLAS_CHECK(cublasLtCreate(&s->handle));
  CUDA_CHECK(cudaMalloc(&s->workspace, kWorkspace));
  states[dev] = s;
  return *s;
}
}  // namespace

void fp8_gemm_tn(const Tensor& a, const float* a_scale_inv, const Tensor& b, const float* b_scale_inv, Tensor& c,
                 float beta, bool fast_accum) {
  MEGATRON_CHECK(a.is_cuda() && b.is_cuda() && c.is_cuda() && a.dim() == 2 && b.dim() == 2 && c.dim() == 2)
      << "fp8_gemm_tn: a " << a.str() << " b " << b.str() << " c " << c.str();
  const int64_t m = a.size(0), k = a.size(1), n = b.size(0);
  MEGATRON_CHECK(b.size(1) == k && c.size(0) == m && c.size(1) == n)
      << "fp8_gemm_tn: a " << a.str() << " b " << b.str() << "^T c " << c.str();
  MEGATRON_CHECK(!(a.dtype() == DType::kFloat8E5M2 && b.dtype() == DType::kFloat8E5M2))
      << "fp8_gemm_tn: E5M2 x E5M2 is not supported by cuBLASLt";
  if (m == 0 || n == 0) return;
  if (k % 16 != 0 || n % 16 != 0 || m % 16 != 0)
    user_error("FP8 GEMM [", m, " x ", k, "] @ [", n, " x ", k, "]^T: cuBLASLt FP8 needs m, n and k divisible by 16");
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  Fp8Lt& s = lt_state(dev);
  std::lock_guard<std::mutex> g(s.mu);
  // Column-major problem: M = n, N = m; A' = b (transposed), B' = a.
  const int64_t M = n, N = m, K = k;
  Key key{dev, M, N, K, (int)b.dtype(), (int)a.dtype(), (int)c.dtype(), fast_accum, beta != 0.0f,
          align_of(b.data_ptr()), align_of(a.data_ptr()), align_of(c.data_ptr())};
  auto it = s.plans.find(key);
  if (it == s.plans.end()) {
    Plan p;
    FP8_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
    FP8_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    FP8_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    int8_t fa = fast_accum ? 1 : 0;
    FP8_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, sizeof(fa)));
    FP8_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, lt_type(b.dtype()), K, M, K));
    FP8_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, lt_type(a.dtype()), K, N, K));
    FP8_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, lt_type(c.dtype()), M, N, M));
    cublasLtMatmulPreference_t pref;
    FP8_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = kWorkspace;
    FP8_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    uint32_t al[3] = {(uint32_t)align_of(b.data_ptr()), (uint32_t)align_of(a.data_ptr()),
                      (uint32_t)align_of(c.data_ptr())};
    FP8_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0], 4));
    FP8_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1], 4));
    FP8_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], 4));
    FP8_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[2], 4));
    // The scale pointers must be set for the heuristic to pick an FP8 kernel that reads them.
    FP8_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale_inv, sizeof(void*)));
    FP8_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale_inv, sizeof(void*)));
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(s.handle, p.op, p.a, p.b, p.c, p.c, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    MEGATRON_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0)
        << "fp8_gemm: cuBLASLt has no algorithm for m=" << m << " n=" << n << " k=" << k << " types "
        << dtype_name(a.dtype()) << "/" << dtype_name(b.dtype()) << "->" << dtype_name(c.dtype()) << " (status "
        << (int)st << ")";
    p.algo = res.algo;
    it = s.plans.emplace(key, p).first;
  }
  Plan& p = it->second;
  FP8_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale_inv, sizeof(void*)));
  FP8_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale_inv, sizeof(void*)));
  const float alpha = 1.0f;
  FP8_CUBLAS_CHECK(cublasLtMatmul(s.handle, p.op, &alpha, b.data_ptr(), p.a, a.data_ptr(), p.b, &beta, c.data_ptr(),
                                  p.c, c.data_ptr(), p.c, &p.algo, s.workspace, kWorkspace,
                                  megatron::cuda::current_stream()));
}

}  // namespace megatron::ops::cuda
