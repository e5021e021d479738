// Fused FP8 quantize (+ transpose) + amax kernels (ops of op_table.h).
//
// Row layout only: a grid-stride loop, 16 elements per thread (two 16-byte loads for bf16 in
// flight, one 16-byte store), conversions two at a time (cvt.rn.satfinite.e4m3x2/e5m2x2, the
// instruction __nv_cvt_float_to_fp8 also uses: same bits).
// With a transposed output (the common case: every GEMM dimension is a multiple of 16): 128 x 128
// tiles, 256 threads. Each thread loads 8 rows x 8 columns as eight 16-byte vectors (all in
// flight at once), writes the row-layout bytes with 8-byte stores and stages them in a 16 KB
// shared tile whose 4-byte words are XOR-swizzled by row group (no bank conflicts either way);
// then each thread reads 16 rows x 4 columns of words, transposes the 4 x 4 byte blocks in
// registers (__byte_perm) and writes 4 x 16 contiguous bytes of q_t: each warp store covers
// four full 128-byte lines. x is read once for both outputs. Shapes that are not multiples of
// (16 rows, 8 columns) or unaligned pointers take the older 64 x 64 byte-tile kernel.
// The amax is a block max folded into the device scalar with one atomicMax per block on its bit
// pattern (non-negative floats order like their bits; NaN's bits order above +inf, so a NaN
// propagates as in TE).
#include <cuda_fp8.h>

#include <cfloat>

#include "megatron/core/ops/cuda/cuda_common.cuh"
#include "megatron/core/ops/cuda/cuda_ops.h"
#include "megatron/core/ops/cuda/fp8_sources.cuh"

namespace megatron::ops::cuda {
using namespace detail;

namespace {
constexpr int kThreads = 256;
constexpr int kTile = 64;

template <int kFmt>
__device__ __forceinline__ uint8_t to_fp8(float v) {
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, kFmt == 0 ? __NV_E4M3 : __NV_E5M2);
}

__device__ __forceinline__ float abs_max(float a, float v) {
  const float f = fabsf(v);
  return (f > a || isnan(f)) ? f : a;
}

// Max that lets a NaN win (fmaxf would drop it).
__device__ __forceinline__ float warp_max_nan(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = (w > v || isnan(w)) ? w : v;
  }
  return v;
}

__device__ __forceinline__ void block_amax_to(float a, float* amax) {
  __shared__ float red[32];
  a = warp_max_nan(a);
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  if (lane == 0) red[wid] = a;
  __syncthreads();
  if (wid == 0) {
    a = lane < (int)(blockDim.x >> 5) ? red[lane] : 0.0f;
    a = warp_max_nan(a);
    if (lane == 0 && a != 0.0f) atomicMax(reinterpret_cast<int*>(amax), __float_as_int(a));
  }
}

// Two floats to two FP8 bytes (a in the low byte), bit-identical to two to_fp8 calls.
template <int kFmt>
__device__ __forceinline__ uint32_t to_fp8x2(float a, float b) {
  return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, kFmt == 0 ? __NV_E4M3 : __NV_E5M2);
}

// 8 floats (already scaled) to 8 FP8 bytes packed in two words (element j in byte j % 4 of word j / 4).
template <int kFmt>
__device__ __forceinline__ uint2 pack8(const float (&f)[8], float s) {
  uint2 r;
  r.x = to_fp8x2<kFmt>(f[0] * s, f[1] * s) | (to_fp8x2<kFmt>(f[2] * s, f[3] * s) << 16);
  r.y = to_fp8x2<kFmt>(f[4] * s, f[5] * s) | (to_fp8x2<kFmt>(f[6] * s, f[7] * s) << 16);
  return r;
}

template <class T, int kFmt>
__global__ void quantize_rows_kernel(const T* __restrict__ x, int64_t n, const float* __restrict__ scale,
                                     float* __restrict__ amax, uint8_t* __restrict__ q, bool vec) {
  const float s = *scale;
  float a = 0.0f;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x * 16;
  int64_t i = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * 16;
  if (vec) {
    // Full 16-element groups: two loads in flight, one 16-byte store.
    for (; i + 16 <= n; i += stride) {
      float f0[8], f1[8];
      ld8(x, i, n, true, f0);
      ld8(x, i + 8, n, true, f1);
#pragma unroll
      for (int j = 0; j < 8; ++j) a = abs_max(abs_max(a, f0[j]), f1[j]);
      const uint2 b0 = pack8<kFmt>(f0, s), b1 = pack8<kFmt>(f1, s);
      if (q) *reinterpret_cast<uint4*>(q + i) = make_uint4(b0.x, b0.y, b1.x, b1.y);
    }
  }
  // The tail (or everything when unaligned): element by element.
  for (; i < n; i += stride) {
#pragma unroll 4
    for (int j = 0; j < 16; ++j) {
      if (i + j >= n) break;
      const float f = to_f(x[i + j]);
      a = abs_max(a, f);
      if (q) q[i + j] = to_fp8<kFmt>(f * s);
    }
  }
  if (amax) block_amax_to(a, amax);
}

// Fast quantize + transpose (see the file comment). Requires rows % 16 == 0, cols % 8 == 0,
// x 16-byte, q 8-byte and q_t 16-byte aligned. Tile (blockIdx.y, blockIdx.x) covers rows
// [128 by, +128) and cols [128 bx, +128). Shared word (r, w) holds columns 4w..4w+3 of row r at
// physical word w ^ (((r >> 4) & 7) << 2).
constexpr int kVTile = 128;

// Sources of the values a tile quantizes (load8(r, c, f): fp8_sources.cuh): PlainSrc reads x; the
// fused sources of fp8_sources.cuh compute the producer's output from its inputs.
template <class T>
struct PlainSrc {
  const T* x;
  int64_t cols;
  __device__ __forceinline__ void load8(int64_t r, int64_t c, float (&f)[8]) const {
    ld8(x, r * cols + c, r * cols + c + 8, true, f);
  }
};

template <class Src, int kFmt>
__device__ __forceinline__ void quantize_transpose_tile(const Src& src, int64_t rows, int64_t cols,
                                                        const float* __restrict__ scale, float* __restrict__ amax,
                                                        uint8_t* __restrict__ q, uint8_t* __restrict__ qt) {
  __shared__ __align__(16) uint32_t tile[kVTile][kVTile / 4];
  const float s = *scale;
  const int t = threadIdx.x;
  const int64_t r0 = (int64_t)blockIdx.y * kVTile, c0 = (int64_t)blockIdx.x * kVTile;
  // Load phase: vector column cv (8 columns), rows r0 + 16 i + rr for i = 0..7.
  const int cv = t & 15, rr = t >> 4;
  const int64_t c = c0 + 8 * cv;
  const bool col_in = c < cols;
  float f[8][8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int64_t r = r0 + 16 * i + rr;
    if (col_in && r < rows) {
      src.load8(r, c, f[i]);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) f[i][j] = 0.0f;
    }
  }
  float a = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
#pragma unroll
    for (int j = 0; j < 8; ++j) a = abs_max(a, f[i][j]);
    const uint2 b = pack8<kFmt>(f[i], s);
    const int lr = 16 * i + rr;
    const int64_t r = r0 + lr;
    if (q && col_in && r < rows) *reinterpret_cast<uint2*>(q + r * cols + c) = b;
    *reinterpret_cast<uint2*>(&tile[lr][(2 * cv) ^ (i << 2)]) = b;  // (lr >> 4) & 7 == i
  }
  __syncthreads();
  // Write phase: row group rg (16 rows), word column w (4 columns).
  const int rg = t & 7, w = t >> 3;
  const int64_t rbase = r0 + 16 * rg, cbase = c0 + 4 * w;
  if (rbase < rows && cbase < cols) {
    uint32_t o[4][4];  // o[k][m]: column cbase + k, rows rbase + 4m .. + 3
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int pw = w ^ (rg << 2);
      const uint32_t a0 = tile[16 * rg + 4 * m][pw], a1 = tile[16 * rg + 4 * m + 1][pw],
                     a2 = tile[16 * rg + 4 * m + 2][pw], a3 = tile[16 * rg + 4 * m + 3][pw];
      const uint32_t t0 = __byte_perm(a0, a1, 0x5140), t1 = __byte_perm(a0, a1, 0x7362);
      const uint32_t t2 = __byte_perm(a2, a3, 0x5140), t3 = __byte_perm(a2, a3, 0x7362);
      o[0][m] = __byte_perm(t0, t2, 0x5410);
      o[1][m] = __byte_perm(t0, t2, 0x7632);
      o[2][m] = __byte_perm(t1, t3, 0x5410);
      o[3][m] = __byte_perm(t1, t3, 0x7632);
    }
#pragma unroll
    for (int k = 0; k < 4; ++k)
      *reinterpret_cast<uint4*>(qt + (cbase + k) * rows + rbase) = make_uint4(o[k][0], o[k][1], o[k][2], o[k][3]);
  }
  if (amax) block_amax_to(a, amax);
}

template <class T, int kFmt>
__global__ void __launch_bounds__(256) quantize_transpose_vec_kernel(const T* __restrict__ x, int64_t rows,
                                                                     int64_t cols, const float* __restrict__ scale,
                                                                     float* __restrict__ amax, uint8_t* __restrict__ q,
                                                                     uint8_t* __restrict__ qt) {
  quantize_transpose_tile<PlainSrc<T>, kFmt>(PlainSrc<T>{x, cols}, rows, cols, scale, amax, q, qt);
}

// SwiGLU + quantize (+ transpose): q/q_t [rows, f] of swiglu(x) for x [rows, 2f].
template <class X, class Y, int kFmt>
__global__ void __launch_bounds__(256) swiglu_quantize_kernel(const X* __restrict__ x, int64_t rows, int64_t f,
                                                              const float* __restrict__ scale, float* __restrict__ amax,
                                                              uint8_t* __restrict__ q, uint8_t* __restrict__ qt) {
  quantize_transpose_tile<SwigluSrc<X, Y>, kFmt>(SwigluSrc<X, Y>{x, f}, rows, f, scale, amax, q, qt);
}

// SwiGLU backward + quantize (+ transpose): q/q_t [rows, 2f] of d(x) for x [rows, 2f], dy [rows, f].
template <class X, class D, int kFmt>
__global__ void __launch_bounds__(256) swiglu_bwd_quantize_kernel(const X* __restrict__ x, const D* __restrict__ dy,
                                                                  int64_t rows, int64_t f,
                                                                  const float* __restrict__ scale,
                                                                  float* __restrict__ amax, uint8_t* __restrict__ q,
                                                                  uint8_t* __restrict__ qt) {
  quantize_transpose_tile<SwigluBwdSrc<X, D>, kFmt>(SwigluBwdSrc<X, D>{x, dy, f}, rows, 2 * f, scale, amax, q, qt);
}

// RMSNorm apply + quantize (+ transpose) for x [rows, h] with the rows' rstd already computed.
template <class X, class G, class Y, int kFmt>
__global__ void __launch_bounds__(256) rmsnorm_quantize_kernel(const X* __restrict__ x, const G* __restrict__ gamma,
                                                               const float* __restrict__ rstd, int64_t rows, int64_t h,
                                                               float gofs, const float* __restrict__ scale,
                                                               float* __restrict__ amax, uint8_t* __restrict__ q,
                                                               uint8_t* __restrict__ qt) {
  quantize_transpose_tile<RmsnormSrc<X, G, Y>, kFmt>(RmsnormSrc<X, G, Y>{x, gamma, rstd, h, gofs}, rows, h, scale,
                                                       amax, q, qt);
}

// Row scaling + quantize (+ transpose): q/q_t [rows, cols] of x[r, :] * p[r] (the FP8 MoE experts'
// fc2 input, ops/fp8_moe.h).
template <class X, int kFmt>
__global__ void __launch_bounds__(256) scale_rows_quantize_kernel(const X* __restrict__ x, const float* __restrict__ p,
                                                                  int64_t rows, int64_t cols,
                                                                  const float* __restrict__ scale,
                                                                  float* __restrict__ amax, uint8_t* __restrict__ q,
                                                                  uint8_t* __restrict__ qt) {
  quantize_transpose_tile<ScaleRowsSrc<X>, kFmt>(ScaleRowsSrc<X>{x, p, cols}, rows, cols, scale, amax, q, qt);
}

// Tile (by, bx) covers rows [by*64, +64) and cols [bx*64, +64) of x [rows, cols].
template <class T, int kFmt>
__global__ void quantize_transpose_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                          const float* __restrict__ scale, float* __restrict__ amax,
                                          uint8_t* __restrict__ q, uint8_t* __restrict__ qt) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  const float s = *scale;
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;  // 64 x 4
  const int64_t r0 = (int64_t)blockIdx.y * kTile, c0 = (int64_t)blockIdx.x * kTile;
  float a = 0.0f;
  const int64_t c = c0 + tx;
#pragma unroll 4
  for (int i = ty; i < kTile; i += kThreads / kTile) {
    const int64_t r = r0 + i;
    uint8_t b = 0;
    if (r < rows && c < cols) {
      const float v = to_f(x[r * cols + c]);
      a = abs_max(a, v);
      b = to_fp8<kFmt>(v * s);
      if (q) q[r * cols + c] = b;
    }
    tile[i][tx] = b;
  }
  __syncthreads();
  // qt [cols, rows]: row (c0 + i) gets columns [r0, r0 + 64). Full tiles with rows % 4 == 0:
  // 16 threads per row, 4 bytes each (one 32-bit store); otherwise one byte per thread.
  if ((rows & 3) == 0 && r0 + kTile <= rows) {
    const int w = threadIdx.x % 16, i0 = threadIdx.x / 16;  // 16 rows per pass
#pragma unroll
    for (int i = i0; i < kTile; i += kThreads / 16) {
      const int64_t cc = c0 + i;
      if (cc < cols) {
        const uint32_t v = (uint32_t)tile[4 * w][i] | ((uint32_t)tile[4 * w + 1][i] << 8) |
                           ((uint32_t)tile[4 * w + 2][i] << 16) | ((uint32_t)tile[4 * w + 3][i] << 24);
        *reinterpret_cast<uint32_t*>(qt + cc * rows + r0 + 4 * w) = v;
      }
    }
  } else {
    const int64_t r = r0 + tx;
#pragma unroll 4
    for (int i = ty; i < kTile; i += kThreads / kTile) {
      const int64_t cc = c0 + i;
      if (cc < cols && r < rows) qt[cc * rows + r] = tile[tx][i];
    }
  }
  if (amax) block_amax_to(a, amax);
}

template <class T>
__global__ void amax_kernel(const T* __restrict__ x, int64_t n, float* __restrict__ amax, bool vec) {
  float a = 0.0f;
  for (int64_t i = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * 8; i < n;
       i += (int64_t)gridDim.x * blockDim.x * 8) {
    float f[8];
    ld8(x, i, n, vec, f);
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (i + j < n) a = abs_max(a, f[j]);
  }
  block_amax_to(a, amax);
}

__global__ void scale_from_amax_kernel(float* cur, float fmax, int margin, float* scale, float* scale_inv,
                                       float* step_amax) {
  const float a = *cur;
  *cur = 0.0f;  // ready for the next fp8_amax into the same scratch
  if (isfinite(a) && a > 0.0f) {
    float s = (fmax / a) / ldexpf(1.0f, margin);
    if (isinf(s)) s = FLT_MAX;
    *scale = s;
    *scale_inv = 1.0f / s;
  }
  if (step_amax && (a > *step_amax || isnan(a))) *step_amax = a;
}

// Step-boundary update of every FP8 role (one block per role; Fp8TensorMeta::record_amax + update
// on the device). hist [R, H] is a ring: logical entry i of role r lives at hist[r H + (pos + i) % H].
__global__ void update_scales_kernel(float* __restrict__ amax, int64_t slot, float* __restrict__ hist, int H,
                                     int64_t pos, const float* __restrict__ fmax, int margin, bool max_algo,
                                     bool update_scale, float* __restrict__ scale, float* __restrict__ scale_inv) {
  const int r = blockIdx.x;
  float* h = hist + (int64_t)r * H;
  const int i0 = (int)(pos % H), i1 = (int)((pos + 1) % H);
  const float a = amax[r * slot];
  float h0 = h[i0];
  if (isnan(a) || a > h0) h0 = a;  // record_amax: NaN propagates
  if (update_scale) {
    __shared__ float red[32];
    float m = 0.0f;  // "max": fmaxf over the window (a NaN entry is ignored), from 0
    if (max_algo)
      for (int i = threadIdx.x; i < H; i += blockDim.x) m = fmaxf(m, i == i0 ? h0 : h[i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < (int)(blockDim.x >> 5); ++w) m = fmaxf(m, red[w]);
      m = fmaxf(m, red[0]);
      if (!max_algo) m = h0;  // "most_recent": entry 0 as is (a NaN keeps the old scale below)
      // compute_scale of fp8_recipe.cpp: keep the old scale unless the amax is finite and > 0.
      if (isfinite(m) && m > 0.0f) {
        float s = (fmax[r] / m) / ldexpf(1.0f, margin);
        if (isinf(s)) s = FLT_MAX;
        scale[r * slot] = s;
      }
      scale_inv[r * slot] = 1.0f / scale[r * slot];
    }
  }
  __syncthreads();  // every read of the window is done before the roll writes into it
  if (threadIdx.x == 0) {
    h[i0] = h0;    // becomes logical entry H - 1 (std::rotate by one)
    h[i1] = 0.0f;  // the new logical entry 0 (with H == 1 the same slot: zeroed, as on the host)
    amax[r * slot] = 0.0f;
  }
}

int fmt_of(DType t) {
  MEGATRON_CHECK(t == DType::kFloat8E4M3 || t == DType::kFloat8E5M2) << "fp8_quantize: output " << dtype_name(t);
  return t == DType::kFloat8E4M3 ? 0 : 1;
}
}  // namespace

void fp8_quantize(const Tensor& x, const float* scale, float* amax, Tensor* q, Tensor* q_t) {
  check_cuda(x, "fp8_quantize");
  MEGATRON_CHECK(q || q_t || amax) << "fp8_quantize: nothing to do";
  const int64_t n = x.numel();
  if (n == 0) return;
  const int64_t cols = x.size(-1), rows = n / cols;
  const DType qd = q ? q->dtype() : q_t->dtype();
  const int fmt = fmt_of(qd);
  if (q) MEGATRON_CHECK(q->numel() == n && q->is_cuda()) << "fp8_quantize: q " << q->str() << " for " << x.str();
  if (q_t)
    MEGATRON_CHECK(q_t->numel() == n && q_t->is_cuda() && q_t->dtype() == qd && q_t->size(0) == cols)
        << "fp8_quantize: q_t " << q_t->str() << " for " << x.str();
  uint8_t* qp = q ? static_cast<uint8_t*>(q->data_ptr()) : nullptr;
  cudaStream_t st = megatron::cuda::current_stream();
  if (!q_t) {
    const bool vec = aligned16(x.data_ptr()) && (!qp || aligned16(qp));
    const unsigned grid = grid_for((n + 15) / 16, kThreads);
    MCU_FLOAT_SWITCH(x.dtype(), T, {
      const T* xp = static_cast<const T*>(x.data_ptr());
      if (fmt == 0) quantize_rows_kernel<T, 0><<<grid, kThreads, 0, st>>>(xp, n, scale, amax, qp, vec);
      else quantize_rows_kernel<T, 1><<<grid, kThreads, 0, st>>>(xp, n, scale, amax, qp, vec);
    });
  } else if ((rows % 16) == 0 && (cols % 8) == 0 && aligned16(x.data_ptr()) && aligned16(q_t->data_ptr()) &&
             (!qp || (reinterpret_cast<uintptr_t>(qp) & 7u) == 0)) {
    uint8_t* qtp = static_cast<uint8_t*>(q_t->data_ptr());
    dim3 grid((unsigned)((cols + kVTile - 1) / kVTile), (unsigned)((rows + kVTile - 1) / kVTile));
    MEGATRON_CHECK(grid.y < 65536u) << "fp8_quantize: too many rows " << rows;
    MCU_FLOAT_SWITCH(x.dtype(), T, {
      const T* xp = static_cast<const T*>(x.data_ptr());
      if (fmt == 0)
        quantize_transpose_vec_kernel<T, 0><<<grid, kThreads, 0, st>>>(xp, rows, cols, scale, amax, qp, qtp);
      else
        quantize_transpose_vec_kernel<T, 1><<<grid, kThreads, 0, st>>>(xp, rows, cols, scale, amax, qp, qtp);
    });
  } else {
    uint8_t* qtp = static_cast<uint8_t*>(q_t->data_ptr());
    dim3 grid((unsigned)((cols + kTile - 1) / kTile), (unsigned)((rows + kTile - 1) / kTile));
    MEGATRON_CHECK(grid.y < 65536u) << "fp8_quantize: too many rows " << rows;
    MCU_FLOAT_SWITCH(x.dtype(), T, {
      const T* xp = static_cast<const T*>(x.data_ptr());
      if (fmt == 0) quantize_transpose_kernel<T, 0><<<grid, kThreads, 0, st>>>(xp, rows, cols, scale, amax, qp, qtp);
      else quantize_transpose_kernel<T, 1><<<grid, kThreads, 0, st>>>(xp, rows, cols, scale, amax, qp, qtp);
    });
  }
  CUDA_CHECK_LAUNCH();
}

namespace {
// The tiled kernels' requirements (see quantize_transpose_tile): rows % 16 == 0, cols % 8 == 0,
// 16-byte aligned inputs and q_t, 8-byte aligned q, both outputs of one FP8 type.
bool fused_tile_ok(int64_t rows, int64_t cols, const Tensor* q, const Tensor* q_t) {
  if (!q || !q_t || rows % 16 != 0 || cols % 8 != 0 || rows / kVTile >= 65535) return false;
  if (q->dtype() != q_t->dtype() || (q->dtype() != DType::kFloat8E4M3 && q->dtype() != DType::kFloat8E5M2)) return false;
  if (q->numel() != rows * cols || q_t->numel() != rows * cols || q_t->size(0) != cols) return false;
  return aligned16(q_t->data_ptr()) && (reinterpret_cast<uintptr_t>(q->data_ptr()) & 7u) == 0;
}
}  // namespace

bool fp8_swiglu_quantize(const Tensor& x, DType act_dtype, const float* scale, float* amax, Tensor* q, Tensor* q_t) {
  check_cuda(x, "fp8_swiglu_quantize");
  const int64_t two_f = x.size(-1), f = two_f / 2;
  if (two_f % 2 != 0 || f == 0) return false;
  const int64_t rows = x.numel() / two_f;
  if (rows == 0 || !fused_tile_ok(rows, f, q, q_t) || !aligned16(x.data_ptr())) return false;
  if (act_dtype != DType::kBFloat16 && act_dtype != DType::kFloat32) return false;
  if (x.dtype() != DType::kBFloat16 && x.dtype() != DType::kFloat32) return false;
  const int fmt = fmt_of(q->dtype());
  uint8_t* qp = static_cast<uint8_t*>(q->data_ptr());
  uint8_t* qtp = static_cast<uint8_t*>(q_t->data_ptr());
  dim3 grid((unsigned)((f + kVTile - 1) / kVTile), (unsigned)((rows + kVTile - 1) / kVTile));
  cudaStream_t st = megatron::cuda::current_stream();
  MCU_F32_BF16_SWITCH(x.dtype(), X, MCU_F32_BF16_SWITCH(act_dtype, Y, {
    const X* xp = static_cast<const X*>(x.data_ptr());
    if (fmt == 0) swiglu_quantize_kernel<X, Y, 0><<<grid, kThreads, 0, st>>>(xp, rows, f, scale, amax, qp, qtp);
    else swiglu_quantize_kernel<X, Y, 1><<<grid, kThreads, 0, st>>>(xp, rows, f, scale, amax, qp, qtp);
  }));
  CUDA_CHECK_LAUNCH();
  return true;
}

bool fp8_swiglu_backward_quantize(const Tensor& dy, const Tensor& x, const float* scale, float* amax, Tensor* q,
                                  Tensor* q_t) {
  check_cuda(x, "fp8_swiglu_backward_quantize");
  const int64_t two_f = x.size(-1), f = two_f / 2;
  if (two_f % 2 != 0 || f == 0 || dy.size(-1) != f || dy.numel() * 2 != x.numel() || !dy.is_cuda()) return false;
  const int64_t rows = x.numel() / two_f;
  if (rows == 0 || !fused_tile_ok(rows, two_f, q, q_t) || !aligned16(x.data_ptr()) || !aligned16(dy.data_ptr()))
    return false;
  if (f % 8 != 0 || dy.dtype() != x.dtype() || (x.dtype() != DType::kBFloat16 && x.dtype() != DType::kFloat32))
    return false;
  const int fmt = fmt_of(q->dtype());
  uint8_t* qp = static_cast<uint8_t*>(q->data_ptr());
  uint8_t* qtp = static_cast<uint8_t*>(q_t->data_ptr());
  dim3 grid((unsigned)((two_f + kVTile - 1) / kVTile), (unsigned)((rows + kVTile - 1) / kVTile));
  cudaStream_t st = megatron::cuda::current_stream();
  MCU_F32_BF16_SWITCH(x.dtype(), X, {
    const X* xp = static_cast<const X*>(x.data_ptr());
    const X* dp = static_cast<const X*>(dy.data_ptr());
    if (fmt == 0) swiglu_bwd_quantize_kernel<X, X, 0><<<grid, kThreads, 0, st>>>(xp, dp, rows, f, scale, amax, qp, qtp);
    else swiglu_bwd_quantize_kernel<X, X, 1><<<grid, kThreads, 0, st>>>(xp, dp, rows, f, scale, amax, qp, qtp);
  });
  CUDA_CHECK_LAUNCH();
  return true;
}

bool fp8_rmsnorm_quantize(const Tensor& x, const Tensor& gamma, const Tensor& rstd, bool zero_centered_gamma,
                          DType out_dtype, const float* scale, float* amax, Tensor* q, Tensor* q_t) {
  check_cuda(x, "fp8_rmsnorm_quantize");
  const int64_t h = x.size(-1), rows = h ? x.numel() / h : 0;
  if (rows == 0 || gamma.numel() != h || rstd.numel() != rows || rstd.dtype() != DType::kFloat32) return false;
  if (!fused_tile_ok(rows, h, q, q_t) || !aligned16(x.data_ptr()) || !aligned16(gamma.data_ptr())) return false;
  if (out_dtype != DType::kBFloat16 && out_dtype != DType::kFloat32) return false;
  if (x.dtype() != DType::kBFloat16 && x.dtype() != DType::kFloat32) return false;
  if (gamma.dtype() != DType::kBFloat16 && gamma.dtype() != DType::kFloat32) return false;
  const int fmt = fmt_of(q->dtype());
  uint8_t* qp = static_cast<uint8_t*>(q->data_ptr());
  uint8_t* qtp = static_cast<uint8_t*>(q_t->data_ptr());
  const float* rp = static_cast<const float*>(rstd.data_ptr());
  const float gofs = zero_centered_gamma ? 1.0f : 0.0f;
  dim3 grid((unsigned)((h + kVTile - 1) / kVTile), (unsigned)((rows + kVTile - 1) / kVTile));
  cudaStream_t st = megatron::cuda::current_stream();
  MCU_F32_BF16_SWITCH(x.dtype(), X, MCU_F32_BF16_SWITCH(gamma.dtype(), G, MCU_F32_BF16_SWITCH(out_dtype, Y, {
    const X* xp = static_cast<const X*>(x.data_ptr());
    const G* gp = static_cast<const G*>(gamma.data_ptr());
    if (fmt == 0)
      rmsnorm_quantize_kernel<X, G, Y, 0><<<grid, kThreads, 0, st>>>(xp, gp, rp, rows, h, gofs, scale, amax, qp, qtp);
    else
      rmsnorm_quantize_kernel<X, G, Y, 1><<<grid, kThreads, 0, st>>>(xp, gp, rp, rows, h, gofs, scale, amax, qp, qtp);
  })));
  CUDA_CHECK_LAUNCH();
  return true;
}

// ops/fp8_moe.h's fused row scaling + quantize (declared here and in ops/fp8_moe.cpp, the dispatch,
// so that cuda_ops.h -- included by every CUDA object -- stays unchanged).
bool fp8_scale_rows_quantize(const Tensor& x, const Tensor& row_scale, const float* scale, float* amax, Tensor* q,
                             Tensor* q_t);
bool fp8_scale_rows_quantize(const Tensor& x, const Tensor& row_scale, const float* scale, float* amax, Tensor* q,
                             Tensor* q_t) {
  check_cuda(x, "fp8_scale_rows_quantize");
  const int64_t cols = x.dim() ? x.size(-1) : 0, rows = cols ? x.numel() / cols : 0;
  if (rows == 0 || !row_scale.is_cuda() || row_scale.dtype() != DType::kFloat32 || row_scale.numel() != rows)
    return false;
  if (!fused_tile_ok(rows, cols, q, q_t) || !aligned16(x.data_ptr())) return false;
  if (x.dtype() != DType::kBFloat16 && x.dtype() != DType::kFloat32) return false;
  const int fmt = fmt_of(q->dtype());
  uint8_t* qp = static_cast<uint8_t*>(q->data_ptr());
  uint8_t* qtp = static_cast<uint8_t*>(q_t->data_ptr());
  const float* pp = static_cast<const float*>(row_scale.data_ptr());
  dim3 grid((unsigned)((cols + kVTile - 1) / kVTile), (unsigned)((rows + kVTile - 1) / kVTile));
  cudaStream_t st = megatron::cuda::current_stream();
  MCU_F32_BF16_SWITCH(x.dtype(), X, {
    const X* xp = static_cast<const X*>(x.data_ptr());
    if (fmt == 0) scale_rows_quantize_kernel<X, 0><<<grid, kThreads, 0, st>>>(xp, pp, rows, cols, scale, amax, qp, qtp);
    else scale_rows_quantize_kernel<X, 1><<<grid, kThreads, 0, st>>>(xp, pp, rows, cols, scale, amax, qp, qtp);
  });
  CUDA_CHECK_LAUNCH();
  return true;
}

void fp8_amax(const Tensor& x, float* amax) {
  check_cuda(x, "fp8_amax");
  const int64_t n = x.numel();
  if (n == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  const bool vec = aligned16(x.data_ptr());
  MCU_FLOAT_SWITCH(x.dtype(), T,
                   amax_kernel<T><<<grid_for((n + 7) / 8, kThreads), kThreads, 0, st>>>(
                       static_cast<const T*>(x.data_ptr()), n, amax, vec));
  CUDA_CHECK_LAUNCH();
}

void fp8_update_scales(Tensor& amax_t, int64_t slot, float* hist, int history_len, int64_t pos, int roles,
                       const float* fmax, int margin, bool max_algo, bool update_scale, float* scale,
                       float* scale_inv) {
  if (roles == 0) return;
  MEGATRON_CHECK(amax_t.is_cuda() && amax_t.dtype() == DType::kFloat32 && amax_t.numel() >= (roles - 1) * slot + 1)
      << "fp8_update_scales: amax " << amax_t.str();
  float* amax = static_cast<float*>(amax_t.data_ptr());
  update_scales_kernel<<<roles, 256, 0, megatron::cuda::current_stream()>>>(
      amax, slot, hist, history_len, pos, fmax, margin, max_algo, update_scale, scale, scale_inv);
  CUDA_CHECK_LAUNCH();
}

int64_t device_free_bytes() {
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return static_cast<int64_t>(free_b);
}

void fp8_scale_from_amax(Tensor& cur, float fp8_max, int margin, float* scale, float* scale_inv, float* step_amax) {
  MEGATRON_CHECK(cur.is_cuda() && cur.dtype() == DType::kFloat32 && cur.numel() >= 1)
      << "fp8_scale_from_amax: cur_amax " << cur.str();
  float* cur_amax = static_cast<float*>(cur.data_ptr());
  scale_from_amax_kernel<<<1, 1, 0, megatron::cuda::current_stream()>>>(cur_amax, fp8_max, margin, scale, scale_inv,
                                                                        step_amax);
  CUDA_CHECK_LAUNCH();
}

}  // namespace megatron::ops::cuda
