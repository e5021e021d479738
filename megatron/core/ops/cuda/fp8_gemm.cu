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
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "megatron/core/ops/fp8_env.h"
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
// The descriptors of the column-major TN problem D[M, N] = op_T(A)[M, K] op_N(B)[K, N] (A [K, M],
// B [K, N], C = D [M, N], all with their leading dimension the first), fp32 compute.
void make_tn_plan(Plan& p, DType ta, DType tb, DType tc, int64_t M, int64_t N, int64_t K, bool fast_accum) {
  FP8_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
  FP8_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  FP8_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  int8_t fa = fast_accum ? 1 : 0;
  FP8_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, sizeof(fa)));
  FP8_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, lt_type(ta), K, M, K));
  FP8_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, lt_type(tb), K, N, K));
  FP8_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, lt_type(tc), M, N, M));
}

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
    make_tn_plan(p, b.dtype(), a.dtype(), c.dtype(), M, N, K, fast_accum);
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
                                  c.data_ptr(), p.c, &p.algo,
                                  lt::workspace_for(s, megatron::cuda::current_stream()), lt::kWorkspaceBytes,
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


// ---------------------------------------------------------------- block-scaled (blockwise recipe)
// cuBLASLt's block-scaled FP8 GEMM (Hopper, cuBLAS >= 12.9): A/B_SCALE_MODE VEC128_32F (one fp32
// dequantization factor per 128 consecutive k of a row) or BLK128x128_32F, the scale pointers being
// the scale_inv tensors of fp8_block_quantize (TE's GEMM_READY layouts, which TE hands to cuBLASLt
// as they are). Same column-major mapping as above: cuBLASLt's A is our b, its B our a. No fast
// accumulation (TE's Float8BlockScaling requires split accumulation for all three GEMMs). Up to 16
// of the heuristic's algorithms are kept per problem: the first runs, except for the
// 1 x 128 x 1 x 128 wgrad where MEGATRON_FP8_BLOCK_WGRAD_ALGO may pick another
// (fp8_gpu_test --groups blockwise times each; docs/performance.md "Session 9: blockwise").
namespace {
using BlockKey = std::tuple<int, int64_t, int64_t, int64_t, int, int, int, bool, bool, bool, int, int, int>;
constexpr int kMaxBlockAlgos = megatron::ops::kMaxBlockAlgos;
struct BlockPlan {
  Plan plan;
  std::vector<cublasLtMatmulAlgo_t> algos;  // the heuristic's, best first; empty: unsupported
};
std::map<BlockKey, BlockPlan> g_block_plans;  // under g_plans_mu

// MEGATRON_FP8_BLOCK_WGRAD_ALGO=i (default 0): the i-th of the heuristic's algorithms for the
// 1 x 128 x 1 x 128 GEMMs (the wgrad), the first where it offers fewer. Read once per process: a
// fixed choice, so a run is reproducible; another algorithm changes the summation order (the
// per-128-k fp32 promotion keeps the difference within the bound of fp8_gpu_test's GEMM check).
int wgrad_algo_index() {
  static const int v = megatron::ops::block_wgrad_algo_from_env();
  return v;
}

void check_block_args(const Tensor& a, const Tensor& a_s, bool a_2d, const Tensor& b, const Tensor& b_s, bool b_2d,
                      const Tensor& c) {
  MEGATRON_CHECK(a.is_cuda() && b.is_cuda() && c.is_cuda() && a_s.is_cuda() && b_s.is_cuda() && a.dim() == 2 &&
                 b.dim() == 2 && c.dim() == 2 && a_s.dtype() == DType::kFloat32 && b_s.dtype() == DType::kFloat32)
      << "fp8_block_gemm_tn: a " << a.str() << " b " << b.str() << " c " << c.str();
  const int64_t m = a.size(0), k = a.size(1), n = b.size(0);
  MEGATRON_CHECK(b.size(1) == k && c.size(0) == m && c.size(1) == n && !(a_2d && b_2d) &&
                 !(a.dtype() == DType::kFloat8E5M2 && b.dtype() == DType::kFloat8E5M2))
      << "fp8_block_gemm_tn: a " << a.str() << (a_2d ? " (2d)" : "") << " b " << b.str() << (b_2d ? " (2d)" : "")
      << "^T c " << c.str();
  if (m != 0 && n != 0 && (m % 128 != 0 || n % 128 != 0 || k % 128 != 0))
    user_error("FP8 blockwise GEMM [", m, " x ", k, "] @ [", n, " x ", k, "]^T: --fp8-recipe blockwise on the GPU needs "
               "every GEMM dimension (tokens per micro-batch, hidden, FFN and QKV widths) divisible by 128");
}

#if CUBLAS_VERSION >= 120900
// The cached plan of the problem (descriptors, scale modes, the heuristic's algorithms); caller
// holds g_plans_mu. Same column-major mapping as above: cuBLASLt's A is our b, its B our a.
BlockPlan& block_plan(lt::DeviceContext& s, int dev, const Tensor& a, const Tensor& a_s, bool a_2d, const Tensor& b,
                      const Tensor& b_s, bool b_2d, const Tensor& c, float beta) {
  const int64_t M = b.size(0), N = a.size(0), K = a.size(1);
  const int al_a = pointer_alignment(b.data_ptr()), al_b = pointer_alignment(a.data_ptr()),
            al_c = pointer_alignment(c.data_ptr());
  BlockKey key{dev, M, N, K, (int)b.dtype(), (int)a.dtype(), (int)c.dtype(), b_2d, a_2d, beta != 0.0f, al_a, al_b, al_c};
  auto it = g_block_plans.find(key);
  if (it != g_block_plans.end()) return it->second;
  BlockPlan bp;
  Plan& p = bp.plan;
  make_tn_plan(p, b.dtype(), a.dtype(), c.dtype(), M, N, K, /*fast_accum=*/false);
  const int32_t mode_a = b_2d ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  const int32_t mode_b = a_2d ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  const void* sa = b_s.data_ptr();
  const void* sb = a_s.data_ptr();
  FP8_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof(mode_a)));
  FP8_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof(mode_b)));
  FP8_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(void*)));
  FP8_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(void*)));
  cublasLtMatmulHeuristicResult_t res[kMaxBlockAlgos] = {};
  int found = 0;
  const cublasStatus_t st = lt::pick_algorithms(s, p, al_a, al_b, al_c, kMaxBlockAlgos, res, found);
  if (st == CUBLAS_STATUS_SUCCESS)
    for (int i = 0; i < found; ++i)
      if (res[i].state == CUBLAS_STATUS_SUCCESS) bp.algos.push_back(res[i].algo);
  return g_block_plans.emplace(key, std::move(bp)).first->second;
}

// Runs the GEMM with algorithm `algo` of the plan, or the heuristic's first for -1 (the default:
// wgrad_algo_index() for 1 x 128 x 1 x 128); false when the plan has no algorithm `algo`.
bool run_block_gemm(const Tensor& a, const Tensor& a_s, bool a_2d, const Tensor& b, const Tensor& b_s, bool b_2d,
                    Tensor& c, float beta, int algo) {
  check_block_args(a, a_s, a_2d, b, b_s, b_2d, c);
  if (a.size(0) == 0 || b.size(0) == 0) return true;
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  lt::DeviceContext& s = lt::device_context(dev);
  std::lock_guard<std::mutex> g(g_plans_mu);
  BlockPlan& bp = block_plan(s, dev, a, a_s, a_2d, b, b_s, b_2d, c, beta);
  if (bp.algos.empty())
    user_error("FP8 blockwise GEMM: cuBLASLt has no block-scaled algorithm for m=", a.size(0), " n=", b.size(0),
               " k=", a.size(1), " types ", dtype_name(a.dtype()), (a_2d ? "(128x128)" : "(1x128)"), " x ",
               dtype_name(b.dtype()), (b_2d ? "(128x128)" : "(1x128)"), " -> ", dtype_name(c.dtype()),
               " (needs a Hopper GPU and cuBLAS >= 12.9); use --fp8-recipe delayed or tensorwise");
  if (algo < 0) {
    algo = (!a_2d && !b_2d) ? wgrad_algo_index() : 0;
    if (algo >= (int)bp.algos.size()) algo = 0;
  }
  if (algo >= (int)bp.algos.size()) return false;
  Plan& p = bp.plan;
  const void* sa = b_s.data_ptr();
  const void* sb = a_s.data_ptr();
  FP8_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(void*)));
  FP8_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(void*)));
  const float alpha = 1.0f;
  FP8_CUBLAS_CHECK(cublasLtMatmul(s.handle, p.op, &alpha, b.data_ptr(), p.a, a.data_ptr(), p.b, &beta, c.data_ptr(),
                                  p.c, c.data_ptr(), p.c, &bp.algos[algo],
                                  lt::workspace_for(s, megatron::cuda::current_stream()), lt::kWorkspaceBytes,
                                  megatron::cuda::current_stream()));
  return true;
}
#endif
}  // namespace

bool fp8_block_gemm_tn_ours(const Tensor& a, const Tensor& a_s, bool a_2d, const Tensor& b, const Tensor& b_s,
                            bool b_2d, Tensor& c, float beta) {
  check_block_args(a, a_s, a_2d, b, b_s, b_2d, c);
  if (!block_gemm_wgmma_supported(a, a_s, a_2d, b, b_s, c)) return false;
  if (a.size(0) != 0 && b.size(0) != 0) block_gemm_wgmma(a, a_s, b, b_s, b_2d, c, beta);
  return true;
}

void fp8_block_gemm_tn(const Tensor& a, const Tensor& a_s, bool a_2d, const Tensor& b, const Tensor& b_s, bool b_2d,
                       Tensor& c, float beta) {
  static const bool ours = megatron::ops::block_gemm_ours_from_env();
  if (ours && fp8_block_gemm_tn_ours(a, a_s, a_2d, b, b_s, b_2d, c, beta)) return;
#if CUBLAS_VERSION >= 120900
  run_block_gemm(a, a_s, a_2d, b, b_s, b_2d, c, beta, -1);
#else
  check_block_args(a, a_s, a_2d, b, b_s, b_2d, c);
  (void)beta;
  user_error("--fp8-recipe blockwise needs cuBLAS >= 12.9 (block-scaled FP8 GEMMs); this build has an older one");
#endif
}

bool fp8_block_gemm_tn_algo(const Tensor& a, const Tensor& a_s, bool a_2d, const Tensor& b, const Tensor& b_s,
                            bool b_2d, Tensor& c, float beta, int algo) {
  MEGATRON_CHECK(algo >= 0) << "fp8_block_gemm_tn_algo: algo " << algo;
#if CUBLAS_VERSION >= 120900
  return run_block_gemm(a, a_s, a_2d, b, b_s, b_2d, c, beta, algo);
#else
  check_block_args(a, a_s, a_2d, b, b_s, b_2d, c);
  (void)beta;
  return false;
#endif
}

}  // namespace megatron::ops::cuda
