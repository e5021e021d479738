// CUDA kernels and cuBLASLt GEMMs of the FP8 linear layers (megatron/core/fp8/fp8_linear.h).
// Defined in ops/cuda/fp8_cast.cu and ops/cuda/fp8_gemm.cu; only built with the CUDA backend.
// All pointers to scales/amaxes are device pointers to one float (no host round trip).
#pragma once

#include "megatron/core/tensor/tensor.h"

namespace megatron::ops::cuda {

/// Fused quantize (+ transpose) + amax of x viewed as [rows, cols] = [numel / x.size(-1), x.size(-1)]
/// (float32/bfloat16/float16, CUDA):
///   q   [rows, cols] = sat_rne_cast(x * scale[0])   (if q != nullptr)
///   q_t [cols, rows] = the same values transposed     (if q_t != nullptr)
///   amax[0] = max(amax[0], max |x|)                  (if amax != nullptr; NaN propagates)
/// q/q_t dtype: float8_e4m3 or float8_e5m2 (both the same). The casts are CUDA's
/// __nv_cvt_float_to_fp8(v, __NV_SATFINITE, fmt).
void fp8_quantize(const Tensor& x, const float* scale, float* amax, Tensor* q, Tensor* q_t);

/// SwiGLU fused with the quantization of its output (the fc2 input): for x [..., 2f] = [gate | up]
/// (bfloat16/float32) the value v = act_dtype(silu(gate) * up) -- bit for bit what swiglu_forward
/// writes into an act_dtype tensor -- is quantized into q [rows, f] and q_t [f, rows]
/// (sat_rne_cast(v * scale[0]), E4M3/E5M2) and amax[0] = max(amax[0], max |v|) (if amax != nullptr),
/// without writing v. Returns false (nothing launched) when the shapes/alignment do not fit the
/// tiled kernel (rows % 16, f % 8, 16-byte aligned x and q_t, 8-byte aligned q; both q and q_t
/// given): the caller then runs swiglu_forward + fp8_quantize.
bool fp8_swiglu_quantize(const Tensor& x, DType act_dtype, const float* scale, float* amax, Tensor* q, Tensor* q_t);

/// SwiGLU's backward fused with the quantization of its result (fc1's output gradient): for
/// x [..., 2f] = [gate | up] and dy [..., f] (both bfloat16 or both float32) the gradient
/// v [rows, 2f] -- bit for bit what swiglu_backward writes into a dx of dy's dtype -- is quantized
/// into q [rows, 2f] and q_t [2f, rows] with amax as fp8_swiglu_quantize (E5M2 in hybrid). Returns
/// false (nothing launched) when the tiled kernel does not fit; the caller then runs
/// swiglu_backward + fp8_quantize.
bool fp8_swiglu_backward_quantize(const Tensor& dy, const Tensor& x, const float* scale, float* amax, Tensor* q,
                                  Tensor* q_t);

/// RMSNorm's output fused with its quantization: v = out_dtype(x * rstd[row] * (gamma + (zero_centered
/// ? 1 : 0))) -- bit for bit what rmsnorm_forward writes into an out_dtype tensor, given the rstd
/// that rmsnorm_forward computes (rmsnorm_rstd) -- quantized into q [rows, h] and q_t [h, rows] with
/// amax as fp8_swiglu_quantize. x [..., h], gamma [h] (bfloat16/float32), rstd float32 [rows].
/// Returns false (nothing launched) when the tiled kernel does not fit (as fp8_swiglu_quantize).
bool fp8_rmsnorm_quantize(const Tensor& x, const Tensor& gamma, const Tensor& rstd, bool zero_centered_gamma,
                          DType out_dtype, const float* scale, float* amax, Tensor* q, Tensor* q_t);

/// Only the statistics of rmsnorm_forward: rstd [rows] (float32), bit-identical to what
/// rmsnorm_forward writes; no output (the FP8 path normalizes and quantizes in
/// fp8_rmsnorm_quantize instead). gamma only selects the kernel instance.
void rmsnorm_rstd(const Tensor& x, const Tensor& gamma, float eps, Tensor& rstd);  // defined in norm.cu

/// q_t [cols, rows] = q [rows, cols] transposed, byte for byte (1-byte dtypes: the FP8 weight's
/// dgrad layout after --fp8-param-gather's all-gather; ops/cuda/fp8_param.cu).
void fp8_transpose(const Tensor& q, Tensor& q_t);
/// amax[0] = max(amax[0], max |x|) only.
void fp8_amax(const Tensor& x, float* amax);

/// Tensorwise (current) scaling on the device: if cur_amax[0] is finite and > 0,
/// scale[0] = fp8_max / cur_amax[0] / 2^margin (FLT_MAX if that overflows), scale_inv[0] = 1/scale;
/// else both unchanged. Also folds cur_amax into step_amax (max) when step_amax != nullptr.
/// Then sets cur_amax[0] = 0, so a persistent scratch needs no memset before the next fp8_amax.
void fp8_scale_from_amax(float* cur_amax, float fp8_max, int margin, float* scale, float* scale_inv,
                         float* step_amax);

/// The delayed-scaling step boundary for `roles` FP8 roles in one launch, no host round trip
/// (fp8_state.h; Fp8TensorMeta::record_amax + update of fp8_recipe.h, bit-identical): for role r,
/// with its amax at amax[r * slot], scale/scale_inv at scale[r * slot] / scale_inv[r * slot], and
/// its history a ring hist[r * history_len + (pos + i) % history_len] (logical entry i):
/// entry 0 = max(entry 0, amax) (NaN propagates); if update_scale, the amax used (fmaxf over the
/// window when max_algo, else entry 0) gives scale = fmax[r] / used / 2^margin when finite and
/// > 0 (FLT_MAX on overflow; else the old scale) and scale_inv = 1 / scale; then the window rolls
/// by one (the caller advances pos by 1; the new entry 0 is zeroed) and the amax is zeroed.
void fp8_update_scales(float* amax, int64_t slot, float* hist, int history_len, int64_t pos, int roles,
                       const float* fmax, int margin, bool max_algo, bool update_scale, float* scale,
                       float* scale_inv);

/// Free memory of the current device in bytes (cudaMemGetInfo): what new allocations can still
/// get beyond the memory pool's reservation (the FP8 weight cache's budget, fp8_state.h).
int64_t device_free_bytes();

/// FP8 GEMM on Hopper's "TN" layout (both operands K-major, i.e. row-major with K last):
///   C[m, n] = a_scale_inv[0] * b_scale_inv[0] * (A[m, k] @ B[n, k]^T) + beta * C
/// A, B: float8_e4m3/e5m2 (not both e5m2); C: bfloat16/float16/float32 (beta != 0 needs the same
/// C as D: accumulates in place, e.g. into fp32 main grads). FP32 accumulation; fast_accum selects
/// cuBLASLt's FAST_ACCUM (TE uses it for the forward GEMM only). Leading dims must be multiples
/// of 16 bytes (k % 16 == 0; cuBLASLt's FP8 requirement), else UserError naming the shape.
void fp8_gemm_tn(const Tensor& a, const float* a_scale_inv, const Tensor& b, const float* b_scale_inv, Tensor& c,
                 float beta, bool fast_accum);

/// fp8_gemm_tn with the residual added in the GEMM's epilogue: d[m, n] = a_scale_inv[0] *
/// b_scale_inv[0] * (A @ B^T) + residual (bfloat16/float16, d's dtype and shape; not modified), one
/// rounding to d's dtype (as the bf16 path's linear_forward_residual). Returns false (nothing
/// launched) when cuBLASLt has no algorithm for it; the caller then runs fp8_gemm_tn and an add.
bool fp8_gemm_tn_residual(const Tensor& a, const float* a_scale_inv, const Tensor& b, const float* b_scale_inv,
                          const Tensor& residual, Tensor& d, bool fast_accum);

}  // namespace megatron::ops::cuda
