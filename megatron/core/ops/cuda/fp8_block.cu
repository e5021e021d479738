// Blockwise FP8 quantization (op fp8_block_quantize of op_table.h; --fp8-recipe blockwise,
// docs/fp8.md "Blockwise recipe"): Transformer Engine's Float8BlockScaling quantizers.
//
// block_quantize_tile_kernel: one block of 256 threads per 128 x 128 tile of x, read
// once from global memory with 16-byte loads (whole tiles, 16-byte aligned: every tile when R and C
// are multiples of 128) into shared memory in x's own type ([128][128 + 16 B pad]); from that one
// copy
//   * q, 1 x 128 (or the 128 x 128 block's one scale): 16 threads per row, 8 elements each (one
//     16-byte shared load for bf16), the row amax by a 16-lane shuffle, 8 FP8 bytes stored per
//     thread (a row = 128 contiguous bytes);
//   * q_t, 128 x 1 column tiles written transposed (TE's columnwise quantization): a thread per
//     column and half tile (64 rows, conflict-free shared reads), the two halves' amaxes combined
//     through shared memory, 4 x 16 FP8 bytes stored per thread;
//   * 128 x 128: one block amax, then the same two stores.
// Partial tiles (R or C not a multiple of 128) take scalar loads / byte stores in the same kernel.
// The fused producers (fp8_block_rmsnorm_quantize, fp8_block_swiglu_quantize,
// fp8_block_swiglu_backward_quantize) run the same kernel with a source functor of fp8_sources.cuh
// in place of x: the tile is filled with the producer's output computed from its inputs and rounded
// to the producer's output type (as delayed scaling's fused kernels of fp8_cast.cu do), so the bytes
// and scales equal the producer + fp8_block_quantize's, and the bf16 output is never written.
// It is the only blockwise quantize kernel: session 9's first, untuned one (a float tile, scalar
// loads, byte stores) wrote the same bits at 0.36-0.58x its bandwidth on the H200 and was removed
// in session 10 with its switch MEGATRON_FP8_BLOCK_QUANT (docs/performance.md "Session 9: blockwise").
// The scale math is TE's compute_scale_from_amax (epsilon 0; the power-of-2 rounding clears the
// mantissa bits), bit for bit the CPU reference's (ops/cpu/fp8.cpp): IEEE division and
// multiplication (__fdiv_rn / __fmul_rn) and the saturating RNE cast of fp8_cast.cu; the amaxes are
// exact in any order, so the bits do not depend on the kernel's reduction order.
#include <cuda_fp8.h>

#include <cfloat>

#include "megatron/core/ops/cuda/cuda_common.cuh"
#include "megatron/core/ops/cuda/cuda_ops.h"
#include "megatron/core/ops/cuda/fp8_sources.cuh"
#include "megatron/core/utils/errors.h"

namespace megatron::ops::cuda {
using namespace detail;

namespace {
constexpr int kB = 128, kThreads = 256;
// ---- kernels (tests/gpu/host_emulation/fp8_block_run.sh compiles from here to "The outputs of one quantize call")

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

// Max of `a` over the block's kThreads threads (called by all of them; one barrier).
__device__ __forceinline__ float block_max(float a) {
  __shared__ float red[kThreads / 32];
  a = warp_max(a);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = a;
  __syncthreads();
  a = 0.0f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) a = fmaxf(a, red[w]);
  return a;
}

template <class T>
__host__ __device__ constexpr int tile_ld() {
  return kB + 16 / (int)sizeof(T);  // row pitch in elements: 16 bytes of padding, rows stay 16-byte aligned
}
template <class T>
constexpr size_t tile_smem() {
  return sizeof(T) * kB * tile_ld<T>();
}

// Max over the 16 lanes of a half warp (lanes l and l ^ 1, 2, 4, 8); called by all 32 lanes.
__device__ __forceinline__ float group16_max(float v) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// p[0..8) of the shared tile as float; bf16 (the only 2-byte T of the dispatch) as one 16-byte load.
template <class T>
__device__ __forceinline__ void tile_load8(const T* p, float* v) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "bf16 or fp32 input");
  if constexpr (sizeof(T) == 2) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      v[2 * j] = __uint_as_float(w[j] << 16);  // bf16 -> fp32 is exact: the bits shifted up
      v[2 * j + 1] = __uint_as_float(w[j] & 0xFFFF0000u);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = to_f(p[j]);
  }
}

// The tile's source: RawTile copies x [R, C] as it is; the fused sources of fp8_sources.cuh
// (RmsnormSrc, SwigluSrc, SwigluBwdSrc) compute the producer's output, already rounded to the
// tile's type T, 8 values at a time (C % 8 == 0).
template <class T>
struct RawTile {
  const T* x;
};
template <class S>
constexpr bool kRawTile = false;
template <class T>
constexpr bool kRawTile<RawTile<T>> = true;

// 8 values (exactly representable in T: bf16-rounded for bf16) into the shared tile row p.
template <class T>
__device__ __forceinline__ void tile_store8(T* p, const float (&f)[8]) {
  if constexpr (sizeof(T) == 2) {  // bf16: the float's upper half is the bf16 (exact for these values)
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) w[j] = (__float_as_uint(f[2 * j]) >> 16) | (__float_as_uint(f[2 * j + 1]) & 0xFFFF0000u);
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) p[j] = f[j];
  }
}

// `vec`: every tile full and x, q, q_t 16-byte aligned (R, C multiples of 128): 16-byte loads,
// 8- / 16-byte stores. Otherwise scalar loads (zeros beyond the edge) and byte stores. A fused
// source loads 8 values per call (zeros beyond the edge) whatever `vec` says.
// The stores of one tile already in shared memory (`tile`, [128][tile_ld<T>()], zeros beyond the
// tensor's edge; the block synchronized after filling it): q + s (1 x 128, or the 128 x 128 block's
// one scale) and / or q_t + s_t (128 x 1, transposed) of the tile at (r0, c0) of x [R, C]. Called
// by all kThreads threads of the block; a second call on the same block needs a __syncthreads()
// between (colred is reused).
template <class T, int kFmt, bool k2D>
__device__ __forceinline__ void quantize_tile(const T* tile, int64_t R, int64_t C, int64_t r0, int64_t c0, bool pow2,
                                              bool vec, uint8_t* __restrict__ q, float* __restrict__ s, int64_t s_ld,
                                              uint8_t* __restrict__ qt, float* __restrict__ st, int64_t st_ld) {
  constexpr int kLdT = tile_ld<T>();
  __shared__ float colred[2][kB];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int nr = R - r0 < kB ? (int)(R - r0) : kB, nc = C - c0 < kB ? (int)(C - c0) : kB;
  const float fmax = kFmt == 0 ? 448.0f : 57344.0f;
  float sc_blk = 1.0f;  // 128 x 128: the tile's scale
  if (k2D) {
    float a = 0.0f;
    for (int i = tid; i < kB * kB; i += kThreads) a = fmaxf(a, fabsf(to_f(tile[(i >> 7) * kLdT + (i & 127)])));
    sc_blk = block_scale(block_max(a), fmax, pow2);
    if (tid == 0) {
      if (q) s[(r0 / kB) * s_ld + c0 / kB] = 1.0f / sc_blk;
      if (qt) st[(c0 / kB) * st_ld + r0 / kB] = 1.0f / sc_blk;
    }
  }
  if (q) {
    const int g = tid & 15;  // 16 threads per row, elements 8g .. 8g + 7
    for (int rr = tid >> 4; rr < kB; rr += kThreads / 16) {
      float v[8];
      tile_load8(tile + rr * kLdT + 8 * g, v);
      float sc = sc_blk;
      if (!k2D) {
        float a = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) a = fmaxf(a, fabsf(v[j]));  // 0 beyond nc
        sc = block_scale(group16_max(a), fmax, pow2);
        if (g == 0 && rr < nr) s[(c0 / kB) * s_ld + r0 + rr] = 1.0f / sc;
      }
      if (rr < nr) {
        uint32_t w[2] = {0u, 0u};
#pragma unroll
        for (int j = 0; j < 8; ++j) w[j >> 2] |= (uint32_t)cvt<kFmt>(__fmul_rn(v[j], sc)) << (8 * (j & 3));
        uint8_t* dst = q + (r0 + rr) * C + c0 + 8 * g;
        if (vec) {
          *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
        } else {
          for (int j = 0; j < 8; ++j)
            if (8 * g + j < nc) dst[j] = (uint8_t)(w[j >> 2] >> (8 * (j & 3)));
        }
      }
    }
  }
  if (qt) {
    const int cc = (warp & 3) * 32 + lane, h = warp >> 2;  // column cc, rows 64h .. 64h + 63
    const T* col = tile + h * 64 * kLdT + cc;
    float sc = sc_blk;
    if (!k2D) {
      float a = 0.0f;
#pragma unroll 16
      for (int i = 0; i < 64; ++i) a = fmaxf(a, fabsf(to_f(col[i * kLdT])));  // 0 beyond nr
      colred[h][cc] = a;
      __syncthreads();
      sc = block_scale(fmaxf(colred[0][cc], colred[1][cc]), fmax, pow2);
      if (h == 0 && cc < nc) st[(r0 / kB) * st_ld + c0 + cc] = 1.0f / sc;
    }
    if (cc < nc) {
      uint8_t* dst = qt + (c0 + cc) * R + r0 + 64 * h;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
        for (int j = 0; j < 16; ++j)
          w[j >> 2] |= (uint32_t)cvt<kFmt>(__fmul_rn(to_f(col[(16 * b + j) * kLdT]), sc)) << (8 * (j & 3));
        if (vec) {
          *reinterpret_cast<uint4*>(dst + 16 * b) = make_uint4(w[0], w[1], w[2], w[3]);
        } else {
          for (int j = 0; j < 16; ++j)
            if (64 * h + 16 * b + j < nr) dst[16 * b + j] = (uint8_t)(w[j >> 2] >> (8 * (j & 3)));
        }
      }
    }
  }
}

template <class Src, class T, int kFmt, bool k2D>
__global__ void __launch_bounds__(kThreads)
    block_quantize_tile_kernel(const Src src, int64_t R, int64_t C, bool pow2, bool vec, uint8_t* __restrict__ q,
                               float* __restrict__ s, int64_t s_ld, uint8_t* __restrict__ qt, float* __restrict__ st,
                               int64_t st_ld) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int kLdT = tile_ld<T>(), kV = 16 / (int)sizeof(T), kPerRow = kB / kV;
  T* tile = reinterpret_cast<T*>(smem_raw);
  const int64_t r0 = (int64_t)blockIdx.y * kB, c0 = (int64_t)blockIdx.x * kB;
  const int tid = threadIdx.x;
  const int nr = R - r0 < kB ? (int)(R - r0) : kB, nc = C - c0 < kB ? (int)(C - c0) : kB;
  if constexpr (!kRawTile<Src>) {
    // 16 chunks of 8 per row; all of a chunk is inside or outside the tensor (C % 8 == 0). Every
    // load of the thread's 8 chunks is issued before the first shared store.
    constexpr int kCh = kB * kB / 8 / kThreads;
    float f[kCh][8];
#pragma unroll
    for (int i = 0; i < kCh; ++i) {
      const int e = tid + i * kThreads, rr = e >> 4, cc = (e & 15) * 8;
      if (rr < nr && cc < nc) {
        src.load8(r0 + rr, c0 + cc, f[i]);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) f[i][j] = 0.0f;
      }
    }
#pragma unroll
    for (int i = 0; i < kCh; ++i) {
      const int e = tid + i * kThreads;
      tile_store8(tile + (e >> 4) * kLdT + (e & 15) * 8, f[i]);
    }
  } else if (vec) {
    const T* x = src.x;
    constexpr int kIt = kB * kPerRow / kThreads;
    uint4 buf[kIt];
#pragma unroll
    for (int i = 0; i < kIt; ++i) {
      const int e = tid + i * kThreads, rr = e / kPerRow, cc = (e % kPerRow) * kV;
      buf[i] = *reinterpret_cast<const uint4*>(x + (r0 + rr) * C + c0 + cc);
    }
#pragma unroll
    for (int i = 0; i < kIt; ++i) {
      const int e = tid + i * kThreads, rr = e / kPerRow, cc = (e % kPerRow) * kV;
      *reinterpret_cast<uint4*>(tile + rr * kLdT + cc) = buf[i];
    }
  } else {
    for (int i = tid; i < kB * kB; i += kThreads) {
      const int rr = i >> 7, cc = i & 127;
      tile[rr * kLdT + cc] = (rr < nr && cc < nc) ? src.x[(r0 + rr) * C + c0 + cc] : T{};
    }
  }
  __syncthreads();
  quantize_tile<T, kFmt, k2D>(tile, R, C, r0, c0, pow2, vec, q, s, s_ld, qt, st, st_ld);
}

// The outputs of one quantize call, checked against x [R, C] (shapes of op_table.h's
// fp8_block_quantize), with the padding entries of the scale tensors zeroed.
struct BlockOut {
  uint8_t *q = nullptr, *qt = nullptr;
  float *s = nullptr, *st = nullptr;
  int64_t s_ld = 0, st_ld = 0;
  bool e4 = true, vec = false;
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round4(int64_t a) { return (a + 3) / 4 * 4; }

BlockOut block_outputs(const char* what, const Tensor& x, int64_t R, int64_t C, bool block_2d, Tensor* q, Tensor* s,
                       Tensor* q_t, Tensor* s_t, cudaStream_t stream) {
  const int64_t cb = ceil_div(C, kB), rb = ceil_div(R, kB);
  const Shape s_shape = block_2d ? Shape{rb, round4(cb)} : Shape{cb, round4(R)};
  const Shape st_shape = block_2d ? Shape{cb, round4(rb)} : Shape{rb, round4(C)};
  const DType qd = q ? q->dtype() : q_t->dtype();
  MEGATRON_CHECK(qd == DType::kFloat8E4M3 || qd == DType::kFloat8E5M2) << what << ": dtype " << dtype_name(qd);
  auto ok = [&](Tensor* t, Tensor* ts, const Shape& ss) {
    return !t || (t->is_cuda() && t->numel() == R * C && t->dtype() == qd && ts && ts->is_cuda() &&
                  ts->dtype() == DType::kFloat32 && ts->shape() == ss);
  };
  MEGATRON_CHECK(ok(q, s, s_shape) && ok(q_t, s_t, st_shape) && rb < 65536)
      << what << ": x " << x.str() << (q ? " q " + q->str() + " s " + s->str() : "")
      << (q_t ? " q_t " + q_t->str() + " s_t " + s_t->str() : "");
  // Padding entries of the scale tensors are 0 (as the CPU reference writes them); without padding
  // (the row count of s / s_t a multiple of 4) the kernel writes every entry.
  if (q && (block_2d ? cb : R) % 4 != 0) CUDA_CHECK(cudaMemsetAsync(s->data_ptr(), 0, s->numel() * 4, stream));
  if (q_t && (block_2d ? rb : C) % 4 != 0) CUDA_CHECK(cudaMemsetAsync(s_t->data_ptr(), 0, s_t->numel() * 4, stream));
  BlockOut o;
  o.q = q ? static_cast<uint8_t*>(q->data_ptr()) : nullptr;
  o.qt = q_t ? static_cast<uint8_t*>(q_t->data_ptr()) : nullptr;
  o.s = q ? static_cast<float*>(s->data_ptr()) : nullptr;
  o.st = q_t ? static_cast<float*>(s_t->data_ptr()) : nullptr;
  o.s_ld = q ? s->size(1) : 0;
  o.st_ld = q_t ? s_t->size(1) : 0;
  o.e4 = qd == DType::kFloat8E4M3;
  o.vec = R % kB == 0 && C % kB == 0 && (!o.q || aligned16(o.q)) && (!o.qt || aligned16(o.qt));
  return o;
}

// SwiGLU's backward + blockwise quantize with two output tiles per block (bf16, whole tiles): the
// gate-half tile (r0, c0) and the up-half tile (r0, c0 + f) of dx [R, 2f] need the same gate and dy
// values and the same sigmoid. The one-tile kernel with SwigluBwdSrc loads both and computes the
// sigmoid once per tile, i.e. twice per pair. It ran at 0.90 ms for LLaMA-3-8B's 8192 x 28672
// against 0.71 ms for the unfused swiglu_backward + fp8_block_quantize (docs/performance.md
// "Session 14: paired SwiGLU-backward tiles"). The values are SwigluBwdSrc's (the same
// expressions on the same floats, rounded to bf16), so the bytes and scales are the same; every
// load is issued before the first compute, as in the one-tile kernel.
template <int kFmt>
__global__ void __launch_bounds__(kThreads)
    block_swiglu_bwd_pair_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ dy,
                                 int64_t R, int64_t f, bool pow2, uint8_t* __restrict__ q, float* __restrict__ s,
                                 int64_t s_ld, uint8_t* __restrict__ qt, float* __restrict__ st, int64_t st_ld) {
  using T = __nv_bfloat16;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int kLdT = tile_ld<T>(), kCh = kB * kB / 8 / kThreads;  // 8 chunks of 8 values per thread
  T* tile_gate = reinterpret_cast<T*>(smem_raw);
  T* tile_up = tile_gate + kB * kLdT;
  const int64_t r0 = (int64_t)blockIdx.y * kB, c0 = (int64_t)blockIdx.x * kB;
  const int tid = threadIdx.x;
  uint4 rg[kCh], ru[kCh], rd[kCh];
#pragma unroll
  for (int i = 0; i < kCh; ++i) {
    const int e = tid + i * kThreads, rr = e >> 4, cc = (e & 15) * 8;
    const T* xr = x + (r0 + rr) * 2 * f + c0 + cc;
    rg[i] = *reinterpret_cast<const uint4*>(xr);
    ru[i] = *reinterpret_cast<const uint4*>(xr + f);
    rd[i] = *reinterpret_cast<const uint4*>(dy + (r0 + rr) * f + c0 + cc);
  }
  auto unpack = [](const uint4& v, float (&o)[8]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      o[2 * j] = __uint_as_float(w[j] << 16);  // bf16 -> fp32 is exact: the bits shifted up
      o[2 * j + 1] = __uint_as_float(w[j] & 0xFFFF0000u);
    }
  };
#pragma unroll
  for (int i = 0; i < kCh; ++i) {
    const int e = tid + i * kThreads, rr = e >> 4, cc = (e & 15) * 8;
    float g[8], u[8], d[8], og[8], ou[8];
    unpack(rg[i], g);
    unpack(ru[i], u);
    unpack(rd[i], d);
#pragma unroll
    for (int j = 0; j < 8; ++j) {  // SwigluBwdSrc::load8's expressions
      float sg = 1.0f / (1.0f + expf(-g[j]));
      float sw = g[j] * sg;
      ou[j] = to_f(from_f<T>(d[j] * sw));
      og[j] = to_f(from_f<T>(d[j] * u[j] * sg * (1.0f + g[j] * (1.0f - sg))));
    }
    tile_store8(tile_gate + rr * kLdT + cc, og);
    tile_store8(tile_up + rr * kLdT + cc, ou);
  }
  __syncthreads();
  quantize_tile<T, kFmt, false>(tile_gate, R, 2 * f, r0, c0, pow2, true, q, s, s_ld, qt, st, st_ld);
  __syncthreads();
  quantize_tile<T, kFmt, false>(tile_up, R, 2 * f, r0, c0 + f, pow2, true, q, s, s_ld, qt, st, st_ld);
}

template <int kFmt>
void launch_swiglu_bwd_pair(const __nv_bfloat16* x, const __nv_bfloat16* dy, int64_t R, int64_t f, bool pow2,
                            const BlockOut& o, cudaStream_t stream) {
  constexpr size_t smem = 2 * tile_smem<__nv_bfloat16>();
  static const bool attr = [] {
    CUDA_CHECK(cudaFuncSetAttribute(block_swiglu_bwd_pair_kernel<kFmt>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)smem));
    return true;
  }();
  (void)attr;
  const dim3 grid((unsigned)(f / kB), (unsigned)(R / kB));
  block_swiglu_bwd_pair_kernel<kFmt>
      <<<grid, kThreads, smem, stream>>>(x, dy, R, f, pow2, o.q, o.s, o.s_ld, o.qt, o.st, o.st_ld);
  CUDA_CHECK(cudaGetLastError());
}

// The tiled kernel for source `src` (tile type T) over x [R, C].
template <class Src, class T, int kFmt, bool k2D>
void launch_one(const Src& src, int64_t R, int64_t C, bool pow2, const BlockOut& o, cudaStream_t stream) {
  const dim3 grid((unsigned)ceil_div(C, kB), (unsigned)ceil_div(R, kB));
  constexpr size_t smem = tile_smem<T>();
  static const bool attr = [] {
    CUDA_CHECK(cudaFuncSetAttribute(block_quantize_tile_kernel<Src, T, kFmt, k2D>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    return true;
  }();
  (void)attr;
  block_quantize_tile_kernel<Src, T, kFmt, k2D>
      <<<grid, kThreads, smem, stream>>>(src, R, C, pow2, o.vec, o.q, o.s, o.s_ld, o.qt, o.st, o.st_ld);
  CUDA_CHECK(cudaGetLastError());
}

template <class Src, class T, bool k2D>
void launch(const Src& src, int64_t R, int64_t C, bool pow2, const BlockOut& o, cudaStream_t stream) {
  if (o.e4) launch_one<Src, T, 0, k2D>(src, R, C, pow2, o, stream);
  else launch_one<Src, T, 1, k2D>(src, R, C, pow2, o, stream);
}

bool f32_bf16(DType t) { return t == DType::kBFloat16 || t == DType::kFloat32; }

// The fused ops' common conditions: both copies, 1 x 128, C % 8 == 0 (a source's 8-value loads),
// FP8 outputs of one dtype.
bool fused_ok(int64_t R, int64_t C, const Tensor* q, const Tensor* s, const Tensor* q_t, const Tensor* s_t) {
  return R > 0 && C > 0 && C % 8 == 0 && q && s && q_t && s_t && q->dtype() == q_t->dtype() &&
         (q->dtype() == DType::kFloat8E4M3 || q->dtype() == DType::kFloat8E5M2);
}
}  // namespace

void fp8_block_quantize(const Tensor& x, bool block_2d, bool pow2_scales, Tensor* q, Tensor* s, Tensor* q_t,
                        Tensor* s_t) {
  check_cuda(x, "fp8_block_quantize");
  MEGATRON_CHECK(q || q_t) << "fp8_block_quantize: nothing to do";
  const int64_t C = x.dim() ? x.size(-1) : 1, R = C ? x.numel() / C : 0;
  if (R == 0 || C == 0) return;
  cudaStream_t stream = megatron::cuda::current_stream();
  BlockOut o = block_outputs("fp8_block_quantize", x, R, C, block_2d, q, s, q_t, s_t, stream);
  o.vec = o.vec && aligned16(x.data_ptr());
  MCU_F32_BF16_SWITCH(x.dtype(), T, {
    const RawTile<T> src{static_cast<const T*>(x.data_ptr())};
    if (block_2d) launch<RawTile<T>, T, true>(src, R, C, pow2_scales, o, stream);
    else launch<RawTile<T>, T, false>(src, R, C, pow2_scales, o, stream);
  });
}

bool fp8_block_swiglu_quantize(const Tensor& x, DType act_dtype, bool pow2_scales, Tensor* q, Tensor* s, Tensor* q_t,
                               Tensor* s_t) {
  check_cuda(x, "fp8_block_swiglu_quantize");
  const int64_t two_f = x.dim() ? x.size(-1) : 0, f = two_f / 2, R = f ? x.numel() / two_f : 0;
  if (two_f % 2 != 0 || !fused_ok(R, f, q, s, q_t, s_t) || !aligned16(x.data_ptr())) return false;
  if (!f32_bf16(act_dtype) || !f32_bf16(x.dtype())) return false;
  cudaStream_t stream = megatron::cuda::current_stream();
  const BlockOut o = block_outputs("fp8_block_swiglu_quantize", x, R, f, false, q, s, q_t, s_t, stream);
  MCU_F32_BF16_SWITCH(x.dtype(), X, MCU_F32_BF16_SWITCH(act_dtype, Y, {
    const SwigluSrc<X, Y> src{static_cast<const X*>(x.data_ptr()), f};
    launch<SwigluSrc<X, Y>, Y, false>(src, R, f, pow2_scales, o, stream);
  }));
  return true;
}

bool fp8_block_swiglu_backward_quantize(const Tensor& dy, const Tensor& x, bool pow2_scales, Tensor* q, Tensor* s,
                                        Tensor* q_t, Tensor* s_t) {
  check_cuda(x, "fp8_block_swiglu_backward_quantize");
  const int64_t two_f = x.dim() ? x.size(-1) : 0, f = two_f / 2, R = f ? x.numel() / two_f : 0;
  if (two_f % 2 != 0 || f % 8 != 0 || !dy.is_cuda() || dy.size(-1) != f || dy.numel() * 2 != x.numel()) return false;
  if (!fused_ok(R, two_f, q, s, q_t, s_t) || !aligned16(x.data_ptr()) || !aligned16(dy.data_ptr())) return false;
  if (dy.dtype() != x.dtype() || !f32_bf16(x.dtype())) return false;
  cudaStream_t stream = megatron::cuda::current_stream();
  const BlockOut o = block_outputs("fp8_block_swiglu_backward_quantize", x, R, two_f, false, q, s, q_t, s_t, stream);
  if (x.dtype() == DType::kBFloat16 && f % kB == 0 && R % kB == 0 && o.vec) {  // whole tile pairs
    const auto* xp = static_cast<const __nv_bfloat16*>(x.data_ptr());
    const auto* dp = static_cast<const __nv_bfloat16*>(dy.data_ptr());
    if (o.e4) launch_swiglu_bwd_pair<0>(xp, dp, R, f, pow2_scales, o, stream);
    else launch_swiglu_bwd_pair<1>(xp, dp, R, f, pow2_scales, o, stream);
    return true;
  }
  MCU_F32_BF16_SWITCH(x.dtype(), X, {
    const SwigluBwdSrc<X, X> src{static_cast<const X*>(x.data_ptr()), static_cast<const X*>(dy.data_ptr()), f};
    launch<SwigluBwdSrc<X, X>, X, false>(src, R, two_f, pow2_scales, o, stream);
  });
  return true;
}

bool fp8_block_rmsnorm_quantize(const Tensor& x, const Tensor& gamma, const Tensor& rstd, bool zero_centered_gamma,
                                DType out_dtype, bool pow2_scales, Tensor* q, Tensor* s, Tensor* q_t, Tensor* s_t) {
  check_cuda(x, "fp8_block_rmsnorm_quantize");
  const int64_t h = x.dim() ? x.size(-1) : 0, R = h ? x.numel() / h : 0;
  if (!fused_ok(R, h, q, s, q_t, s_t) || gamma.numel() != h || rstd.numel() != R || rstd.dtype() != DType::kFloat32)
    return false;
  if (!aligned16(x.data_ptr()) || !aligned16(gamma.data_ptr()) || !gamma.is_cuda() || !rstd.is_cuda()) return false;
  if (!f32_bf16(out_dtype) || !f32_bf16(x.dtype()) || !f32_bf16(gamma.dtype())) return false;
  cudaStream_t stream = megatron::cuda::current_stream();
  const BlockOut o = block_outputs("fp8_block_rmsnorm_quantize", x, R, h, false, q, s, q_t, s_t, stream);
  const float* rp = static_cast<const float*>(rstd.data_ptr());
  const float gofs = zero_centered_gamma ? 1.0f : 0.0f;
  MCU_F32_BF16_SWITCH(x.dtype(), X, MCU_F32_BF16_SWITCH(gamma.dtype(), G, MCU_F32_BF16_SWITCH(out_dtype, Y, {
    const RmsnormSrc<X, G, Y> src{static_cast<const X*>(x.data_ptr()), static_cast<const G*>(gamma.data_ptr()), rp, h,
                                  gofs};
    launch<RmsnormSrc<X, G, Y>, Y, false>(src, R, h, pow2_scales, o, stream);
  })));
  return true;
}

}  // namespace megatron::ops::cuda
