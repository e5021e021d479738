// What the cuBLASLt GEMMs share (gemm.cu: bf16/fp16/fp32; fp8_gemm.cu: FP8): one handle and one
// 32 MiB workspace per device, the cached descriptor set of a problem shape, the operand-alignment
// rule and the heuristic query. Included by .cu files of the CUDA backend only.
#pragma once

#include <cublasLt.h>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "megatron/core/tensor/dtype.h"
#include "megatron/core/utils/errors.h"

#define MEGATRON_CUBLAS_CHECK(expr)                                                          \
  do {                                                                                       \
    cublasStatus_t _s = (expr);                                                              \
    MEGATRON_CHECK(_s == CUBLAS_STATUS_SUCCESS) << #expr << ": cuBLAS status " << (int)_s;   \
  } while (0)

namespace megatron::ops::cuda::lt {

/// Workspace per device, in bytes (allocated once, never per call).
constexpr size_t kWorkspaceBytes = 32u << 20;

/// Descriptors and the heuristic's algorithm for one problem (cached per shape/type key).
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

/// The process-lifetime cuBLASLt handle and workspace of CUDA device `dev` (created on first use;
/// thread-safe). Throws (internal check) if cuBLASLt or the allocation fails. `workspace` serves
/// every stream without its own; a stream given one by add_stream_workspace gets that one from
/// workspace_for (two GEMMs running at once on different streams must not share a workspace;
/// GEMMs on one stream run one after the other, so one per stream is enough).
struct DeviceContext {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::mutex streams_mu;
  std::vector<std::pair<cudaStream_t, void*>> stream_workspaces;  // kWorkspaceBytes each
};
DeviceContext& device_context(int dev);

/// The workspace (kWorkspaceBytes) for a cuBLASLt call of `ctx`'s device on stream `st`.
void* workspace_for(DeviceContext& ctx, cudaStream_t st);
/// Gives stream `st` of device `dev` its own workspace for the process's lifetime (no-op if it
/// has one). Throws (internal check) if the allocation fails.
void add_stream_workspace(int dev, cudaStream_t st);

/// Largest power of two <= 256 that divides the address (the alignment cuBLASLt may assume).
/// cuBLAS / cuBLASLt data type of a float dtype (float32, bfloat16, float16); internal check otherwise.
inline cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kFloat32: return CUDA_R_32F;
    case DType::kBFloat16: return CUDA_R_16BF;
    case DType::kFloat16: return CUDA_R_16F;
    default: MEGATRON_CHECK(false) << "gemm: unsupported dtype " << dtype_name(t);
  }
  return CUDA_R_32F;
}

inline int pointer_alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int al = 256;
  while (al > 1 && (a % al)) al /= 2;
  return al;
}

/// Asks the heuristic for the best algorithm of `p` (descriptors already set; D has C's layout)
/// within the workspace and the given A/B/C(=D) alignments in bytes, and stores it in p.algo.
/// Returns the heuristic's status; `found` is the number of algorithms returned (0 or 1).
cublasStatus_t pick_algorithm(const DeviceContext& ctx, Plan& p, int align_a, int align_b, int align_c, int& found);
/// As pick_algorithm, but up to `max_algos` of the heuristic's algorithms, best first, into `out`
/// (p.algo is left alone). Returns the heuristic's status.
cublasStatus_t pick_algorithms(const DeviceContext& ctx, const Plan& p, int align_a, int align_b, int align_c,
                               int max_algos, cublasLtMatmulHeuristicResult_t* out, int& found);

}  // namespace megatron::ops::cuda::lt
