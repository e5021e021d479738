// Blockwise FP8 quantization (op fp8_block_quantize of op_table.h; --fp8-recipe blockwise,
// docs/fp8.md "Blockwise recipe"): Transformer Engine's Float8BlockScaling quantizers.
//
// One block of 256 threads per 128 x 128 tile of x: the tile is staged in shared memory as
// float32 ([128][129], padded against bank conflicts), then
//   * 1 x 128: each warp takes rows of the tile (q: amax over the row's 128 columns) and, for q_t,
//     columns of the tile (amax over the column's 128 rows: TE's columnwise quantization, written
//     transposed); lane l handles elements l, l + 32, l + 64, l + 96, so the shared-memory reads of
//     both passes are conflict-free and each warp store writes 32 contiguous bytes;
//   * 128 x 128: one amax for the whole tile (block reduction), q and q_t written from the tile.
// The scale math is TE's compute_scale_from_amax (epsilon 0; the power-of-2 rounding clears the
// mantissa bits), bit for bit the CPU reference's (ops/cpu/fp8.cpp): IEEE division and
// multiplication (__fdiv_rn / __fmul_rn) and the saturating RNE cast of fp8_cast.cu.
// Not tuned (scalar loads, byte stores): a first version, bandwidth is printed by fp8_gpu_test.
#include <cuda_fp8.h>

#include <cfloat>

#include "megatron/core/ops/cuda/cuda_common.cuh"
#include "megatron/core/ops/cuda/cuda_ops.h"

namespace megatron::ops::cuda {
using namespace detail;

namespace {
constexpr int kB = 128, kLd = 129, kThreads = 256;
constexpr size_t kSmem = sizeof(float) * kB * kLd;

template <int kFmt>
__device__ __forceinline__ uint8_t cvt(float v) {
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, kFmt == 0 ? __NV_E4M3 : __NV_E5M2);
}

__device__ __forceinline__ float block_scale(float amax, float fmax, bool pow2) {
  if (isinf(amax) || amax == 0.0f || isnan(amax)) return 1.0f;
  float s = __fdiv_rn(fmax, amax);
  if (isinf(s)) s = FLT_MAX;
  if (pow2) s = __uint_as_float(__float_as_uint(s) & 0xFF800000u);
  return s;
}

template <class T, int kFmt, bool k2D>
__global__ void __launch_bounds__(kThreads)
    block_quantize_kernel(const T* __restrict__ x, int64_t R, int64_t C, bool pow2, uint8_t* __restrict__ q,
                          float* __restrict__ s, int64_t s_ld, uint8_t* __restrict__ qt, float* __restrict__ st,
                          int64_t st_ld) {
  extern __shared__ float tile[];
  const int64_t r0 = (int64_t)blockIdx.y * kB, c0 = (int64_t)blockIdx.x * kB;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int nr = R - r0 < kB ? (int)(R - r0) : kB, nc = C - c0 < kB ? (int)(C - c0) : kB;
  for (int i = tid; i < kB * kB; i += kThreads) {
    const int rr = i >> 7, cc = i & 127;
    tile[rr * kLd + cc] = (rr < nr && cc < nc) ? to_f(x[(r0 + rr) * C + c0 + cc]) : 0.0f;
  }
  __syncthreads();
  const float fmax = kFmt == 0 ? 448.0f : 57344.0f;
  if (k2D) {
    __shared__ float red[kThreads / 32];
    float a = 0.0f;
    for (int i = tid; i < kB * kB; i += kThreads) a = fmaxf(a, fabsf(tile[(i >> 7) * kLd + (i & 127)]));
    a = warp_max(a);
    if (lane == 0) red[warp] = a;
    __syncthreads();
    a = 0.0f;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) a = fmaxf(a, red[w]);
    const float sc = block_scale(a, fmax, pow2);
    if (tid == 0) {
      if (q) s[(r0 / kB) * s_ld + c0 / kB] = 1.0f / sc;
      if (qt) st[(c0 / kB) * st_ld + r0 / kB] = 1.0f / sc;
    }
    if (q)
      for (int rr = warp; rr < nr; rr += kThreads / 32)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int cc = lane + 32 * j;
          if (cc < nc) q[(r0 + rr) * C + c0 + cc] = cvt<kFmt>(__fmul_rn(tile[rr * kLd + cc], sc));
        }
    if (qt)
      for (int cc = warp; cc < nc; cc += kThreads / 32)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int rr = lane + 32 * j;
          if (rr < nr) qt[(c0 + cc) * R + r0 + rr] = cvt<kFmt>(__fmul_rn(tile[rr * kLd + cc], sc));
        }
    return;
  }
  if (q)
    for (int rr = warp; rr < nr; rr += kThreads / 32) {
      float v[4], a = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[j] = tile[rr * kLd + lane + 32 * j];  // 0 beyond nc
        a = fmaxf(a, fabsf(v[j]));
      }
      const float sc = block_scale(warp_max(a), fmax, pow2);
      if (lane == 0) s[(c0 / kB) * s_ld + r0 + rr] = 1.0f / sc;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int cc = lane + 32 * j;
        if (cc < nc) q[(r0 + rr) * C + c0 + cc] = cvt<kFmt>(__fmul_rn(v[j], sc));
      }
    }
  if (qt)
    for (int cc = warp; cc < nc; cc += kThreads / 32) {
      float v[4], a = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[j] = tile[(lane + 32 * j) * kLd + cc];  // 0 beyond nr
        a = fmaxf(a, fabsf(v[j]));
      }
      const float sc = block_scale(warp_max(a), fmax, pow2);
      if (lane == 0) st[(r0 / kB) * st_ld + c0 + cc] = 1.0f / sc;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int rr = lane + 32 * j;
        if (rr < nr) qt[(c0 + cc) * R + r0 + rr] = cvt<kFmt>(__fmul_rn(v[j], sc));
      }
    }
}

template <class T, int kFmt, bool k2D>
void launch(dim3 grid, cudaStream_t stream, const T* x, int64_t R, int64_t C, bool pow2, uint8_t* q, float* s,
            int64_t s_ld, uint8_t* qt, float* st, int64_t st_ld) {
  static const bool attr = [] {
    CUDA_CHECK(cudaFuncSetAttribute(block_quantize_kernel<T, kFmt, k2D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)kSmem));
    return true;
  }();
  (void)attr;
  block_quantize_kernel<T, kFmt, k2D><<<grid, kThreads, kSmem, stream>>>(x, R, C, pow2, q, s, s_ld, qt, st, st_ld);
  CUDA_CHECK(cudaGetLastError());
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round4(int64_t a) { return (a + 3) / 4 * 4; }
}  // namespace

void fp8_block_quantize(const Tensor& x, bool block_2d, bool pow2_scales, Tensor* q, Tensor* s, Tensor* q_t,
                        Tensor* s_t) {
  check_cuda(x, "fp8_block_quantize");
  MEGATRON_CHECK(q || q_t) << "fp8_block_quantize: nothing to do";
  const int64_t C = x.dim() ? x.size(-1) : 1, R = C ? x.numel() / C : 0;
  if (R == 0 || C == 0) return;
  const int64_t cb = ceil_div(C, kB), rb = ceil_div(R, kB);
  const Shape s_shape = block_2d ? Shape{rb, round4(cb)} : Shape{cb, round4(R)};
  const Shape st_shape = block_2d ? Shape{cb, round4(rb)} : Shape{rb, round4(C)};
  const DType qd = q ? q->dtype() : q_t->dtype();
  MEGATRON_CHECK(qd == DType::kFloat8E4M3 || qd == DType::kFloat8E5M2) << "fp8_block_quantize: dtype " << dtype_name(qd);
  auto ok = [&](Tensor* t, Tensor* ts, const Shape& ss) {
    return !t || (t->is_cuda() && t->numel() == x.numel() && t->dtype() == qd && ts && ts->is_cuda() &&
                  ts->dtype() == DType::kFloat32 && ts->shape() == ss);
  };
  MEGATRON_CHECK(ok(q, s, s_shape) && ok(q_t, s_t, st_shape) && rb < 65536)
      << "fp8_block_quantize: x " << x.str() << (q ? " q " + q->str() + " s " + s->str() : "")
      << (q_t ? " q_t " + q_t->str() + " s_t " + s_t->str() : "");
  cudaStream_t stream = megatron::cuda::current_stream();
  // Padding entries of the scale tensors stay 0 (as the CPU reference writes them).
  if (q) CUDA_CHECK(cudaMemsetAsync(s->data_ptr(), 0, s->numel() * 4, stream));
  if (q_t) CUDA_CHECK(cudaMemsetAsync(s_t->data_ptr(), 0, s_t->numel() * 4, stream));
  uint8_t* qp = q ? static_cast<uint8_t*>(q->data_ptr()) : nullptr;
  uint8_t* qtp = q_t ? static_cast<uint8_t*>(q_t->data_ptr()) : nullptr;
  float* sp = q ? static_cast<float*>(s->data_ptr()) : nullptr;
  float* stp = q_t ? static_cast<float*>(s_t->data_ptr()) : nullptr;
  const int64_t s_ld = q ? s->size(1) : 0, st_ld = q_t ? s_t->size(1) : 0;
  const dim3 grid((unsigned)cb, (unsigned)rb);
  const bool e4 = qd == DType::kFloat8E4M3;
  MCU_F32_BF16_SWITCH(x.dtype(), T, {
    const T* xp = static_cast<const T*>(x.data_ptr());
    if (block_2d) {
      if (e4) launch<T, 0, true>(grid, stream, xp, R, C, pow2_scales, qp, sp, s_ld, qtp, stp, st_ld);
      else launch<T, 1, true>(grid, stream, xp, R, C, pow2_scales, qp, sp, s_ld, qtp, stp, st_ld);
    } else {
      if (e4) launch<T, 0, false>(grid, stream, xp, R, C, pow2_scales, qp, sp, s_ld, qtp, stp, st_ld);
      else launch<T, 1, false>(grid, stream, xp, R, C, pow2_scales, qp, sp, s_ld, qtp, stp, st_ld);
    }
  });
}

}  // namespace megatron::ops::cuda
