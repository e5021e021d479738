// CUDA implementations of every op in the op table (megatron/core/ops/op_table.h; same signatures
// without default arguments, generated from the table; the documentation is there), defined by the
// CUDA backend (megatron/core/ops/cuda/*.cu). megatron/core/ops/dispatch.cpp calls them for CUDA
// tensors when the build has MEGATRON_WITH_CUDA; every op of the table must therefore have a
// definition here. Host-returning ops (sum_of_squares, count_zeros, has_inf_or_nan and their
// _many forms) synchronize the current stream.
//
// Below the table: the few backend-internal entry points that are not ops (called by other CUDA
// code, the GPU tests and dev/cuda only).
#pragma once

#include <cstdint>
#include <vector>

#include "megatron/core/ops/ops.h"

namespace megatron::ops::cuda {

#define MEGATRON_OP_DEFAULT(v)
#define MEGATRON_OP(ret, name, params, args, dev) ret name params;
#include "megatron/core/ops/op_table.h"
#undef MEGATRON_OP
#undef MEGATRON_OP_DEFAULT

/// Calls of grouped_linear_forward / grouped_linear_backward per GEMM kind (index 0 forward, 1 dgrad,
/// 2 wgrad) by the path they took (ops/grouped_gemm.h choose_grouped_gemm_path: one grouped cuBLAS
/// call, or the per-expert cuBLASLt loop, which includes calls cuBLAS refused).
struct GroupedGemmPathCounts {
  int64_t grouped[3] = {0, 0, 0};
  int64_t loop[3] = {0, 0, 0};
};
/// The counts since the process started or the last reset (grouped_gemm.cu); reset: zero them
/// after reading. bench/gpu/gpu_bench prints which path each MoE figure used.
GroupedGemmPathCounts grouped_gemm_path_counts(bool reset);

/// Bias gradient of a linear layer: dbias[f] (+)= Σ_rows dy[rows, f], summed in fp32 in a fixed
/// order (not rounded; fp32 or dy-typed dbias), one 16-byte-load pass over dy (gelu_bgrad.cu).
/// bf16/fp16 dy, f % 8 == 0, 16-byte aligned; false (nothing written) otherwise. linear_backward
/// uses it instead of cuBLASLt's BGRADB epilogue, which runs as a separate 78 µs-per-call kernel
/// at GPT-2 shapes.
bool bias_grad_colsum(const Tensor& dy, Tensor& dbias, bool accumulate);

/// The superseded fc2 dgrad + GeLU backward (+ fc1 bias gradient) in one cuBLASLt GEMM
/// (DGELU_BGRAD epilogue): dpre[N,f] = gelu_tanh'(pre) * (dy[N,h] @ w[h,f]) and, if dbias,
/// dbias[f] (+)= Σ_rows dpre. bf16/fp16; f % 8 == 0. Returns false, writing nothing, when
/// unsupported. Not used by training (cuBLASLt runs the epilogue as a separate 1.2 ms kernel per
/// GPT-2 layer; gelu_backward_bgrad replaced it); kept for dev/cuda's comparison.
bool linear_dgelu_bgrad_backward(const Tensor& dy, const Tensor& w, const Tensor& pre, Tensor& dpre, Tensor* dbias,
                                 bool accumulate);

/// fp8_block_gemm_tn (op_table.h) with the `algo`-th (0 = best) of up to 16 algorithms cuBLASLt's
/// heuristic returns for the problem, for the timing sweep of fp8_gpu_test --groups blockwise
/// (fp8_gemm.cu; MEGATRON_FP8_BLOCK_WGRAD_ALGO picks one for training's 1 x 128 x 1 x 128 GEMMs).
/// Returns false, launching nothing, when the heuristic offers fewer algorithms (or cuBLAS < 12.9);
/// same arguments and errors as fp8_block_gemm_tn otherwise.
bool fp8_block_gemm_tn_algo(const Tensor& a, const Tensor& a_s, bool a_2d, const Tensor& b, const Tensor& b_s,
                            bool b_2d, Tensor& c, float beta, int algo);

/// Number of SMs of the current device (cached at the first call; fp8_block_gemm.cu).
int num_sms();

/// Whether our block-scaled FP8 GEMM kernel (fp8_block_gemm.cu) can run this problem: an sm_90
/// device, A 1 x 128 scaled (not a_2d), C bf16 or fp32, every buffer 16-byte aligned, sizes below
/// 2^31. The shape rules (m, n, k multiples of 128, types) are fp8_block_gemm_tn's, checked first.
bool block_gemm_wgmma_supported(const Tensor& a, const Tensor& a_s, bool a_2d, const Tensor& b, const Tensor& b_s,
                                const Tensor& c);

/// Our block-scaled FP8 GEMM (fp8_block_gemm.cu: TMA + WGMMA, fp32 promotion per 128 k): the
/// problem of fp8_block_gemm_tn (op_table.h) with A 1 x 128 scaled, B 1 x 128 or (b_2d) 128 x 128,
/// C bf16 / fp32 = sum + beta * C, on the current stream. Preconditions: check_block_args' shape
/// rules and block_gemm_wgmma_supported (not re-checked). Throws Error if a tensor map cannot be
/// encoded.
void block_gemm_wgmma(const Tensor& a, const Tensor& a_s, const Tensor& b, const Tensor& b_s, bool b_2d, Tensor& c,
                      float beta);

/// fp8_block_gemm_tn through our kernel when block_gemm_wgmma_supported, else false (nothing run);
/// the same argument checks and errors as fp8_block_gemm_tn (fp8_gemm.cu). For fp8_gpu_test's
/// comparison with cuBLASLt whatever MEGATRON_FP8_BLOCK_GEMM says.
bool fp8_block_gemm_tn_ours(const Tensor& a, const Tensor& a_s, bool a_2d, const Tensor& b, const Tensor& b_s,
                            bool b_2d, Tensor& c, float beta);

/// Free memory of the current device in bytes (cudaMemGetInfo); ops::device_free_bytes (device.h).
int64_t device_free_bytes();

/// MEGATRON_GEMM_EPILOGUES (default 1; 0 for A/B runs): whether the fused cuBLASLt epilogues
/// and the fused residual/GeLU ops are used (gemm.cu). Read once.
bool gemm_epilogues_enabled();

}  // namespace megatron::ops::cuda
