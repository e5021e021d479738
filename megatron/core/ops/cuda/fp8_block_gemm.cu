// Block-scaled FP8 GEMM of the blockwise recipe on Hopper, our own kernel (TMA + WGMMA), beside
// cuBLASLt's (fp8_gemm.cu); MEGATRON_FP8_BLOCK_GEMM picks one (docs/fp8.md "Blockwise recipe",
// docs/performance.md "Session 14: our block-scaled GEMM").
//
// Problem (row-major, "TN", both operands K-major as fp8_block_quantize writes them):
//   C[m, n] = sum_kb  sa(m, kb) * sb(n or n/128, kb) * sum_{k in block kb} A[m, k] B[n, k]  + beta * C
// with A 1 x 128 scaled (s = [K/128, M] fp32, TE's GEMM_READY layout) and B either 1 x 128 scaled
// (the wgrad) or 128 x 128 scaled (s = [N/128, K/128 rounded up to 4]: forward and dgrad). The
// per-block dequantization factors are applied in fp32 once per 128 k ("promotion"), as cuBLASLt's
// block-scaled kernels and DeepSeek-V3 (arXiv:2412.19437, Sec. 3.3.2) do: the tensor core's FP8
// accumulator keeps only ~14 bits, so each 128-k partial sum leaves it for an fp32 register.
//
// Kernel shape: one CTA per SM (persistent over 128 x 128 output tiles), 3 warpgroups: warpgroup 0
// (one thread) issues the TMA loads of A / B tiles (128 x 128 bytes, 128-byte swizzle) and their
// scales into a 6-stage ring guarded by mbarriers; warpgroups 1 and 2 each own 64 rows of the tile,
// run 4 WGMMA m64n128k32 per k block into a scratch accumulator, wait, then add it scaled into the
// fp32 tile accumulator. While one warpgroup promotes, the other's WGMMAs run.
//
// Requires sm_90a (compiled for it; the compute_90 PTX body traps and the host side never launches
// it elsewhere), m, n, k multiples of 128 (checked by the caller, fp8_gemm.cu), 16-byte aligned
// operands. The PTX instructions used are those of the PTX ISA 8.x "wgmma", "cp.async.bulk.tensor"
// and "mbarrier" sections.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

#include "megatron/core/ops/cuda/cuda_common.cuh"
#include "megatron/core/ops/cuda/cuda_ops.h"
#include "megatron/core/ops/cuda/cuda_utils.h"

namespace megatron::ops::cuda {
namespace {

enum class Fp8Kind { kE4M3, kE5M2 };

constexpr int kBM = 128, kBN = 128, kBK = 128;  // tile; kBK = the scale block along k
constexpr int kStages = 6;
constexpr int kThreads = 384;                   // producer warpgroup + 2 consumer warpgroups
constexpr int kTileBytes = kBM * kBK;           // one fp8 operand tile, 16 KiB
constexpr int kScaleBytes = kBM * 4;            // one stage's 128 fp32 scales of an operand
constexpr size_t kSmemBytes = 2 * kStages * kTileBytes + 2 * kStages * kScaleBytes + 2 * kStages * 8 + 1024;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MEGATRON_BLOCK_GEMM_SM90A 1
#endif

#if MEGATRON_BLOCK_GEMM_SM90A
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
// Spins until the phase of parity `parity` of the barrier has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  }
}
// 2-D TMA load of the box at (c0 innermost, c1) of `map` into shared `dst`, completing on `bar`.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar))
      : "memory");
}
// WGMMA shared-memory matrix descriptor of a K-major tile with 128-byte swizzle: start address,
// leading-byte offset (unused for this layout; 16), stride-byte offset 1024 (8 rows x 128 bytes
// between core-matrix groups), swizzle mode 1 (128 B) in bits 62-63. Tiles are 1024-byte aligned.
__device__ __forceinline__ uint64_t sw128_desc(const void* p) {
  const uint64_t addr = smem_u32(p);
  return ((addr & 0x3FFFF) >> 4) | ((uint64_t)(16 >> 4) << 16) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// Waits until at most N of this warpgroup's WGMMA commit groups are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads / writes of an accumulator register across the
// asynchronous WGMMA (the register is "used and redefined" here).
__device__ __forceinline__ void reg_fence(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// D[64 x 128] (+)= A[64 x 32] B[128 x 32]^T: fp8 operands from shared memory, fp32 accumulator in
// 64 registers per thread (row = 16 * warp + lane / 4 + 8 * ((i / 2) % 2), column = 8 * (i / 4) +
// 2 * (lane % 4) + i % 2 for register i). accumulate = 0 overwrites D.
template <Fp8Kind TA, Fp8Kind TB>
__device__ __forceinline__ void wgmma_m64n128k32(float* d, uint64_t da, uint64_t db, int accumulate);
// One specialization per operand-type pair (E5M2 x E5M2 does not exist): PTX type names AT, BT.
#define MEGATRON_WGMMA_M64N128K32(KA, KB, AT, BT)                                                              \
  template <>                                                                                               \
  __device__ __forceinline__ void wgmma_m64n128k32<KA, KB>(float* d, uint64_t da, uint64_t db, int accumulate) { \
    asm volatile(                                                                                           \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                        \
        "wgmma.mma_async.sync.aligned.m64n128k32.f32." AT "." BT " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
        : "l"(da), "l"(db), "r"(accumulate));                                                             \
  }
MEGATRON_WGMMA_M64N128K32(Fp8Kind::kE4M3, Fp8Kind::kE4M3, "e4m3", "e4m3")
MEGATRON_WGMMA_M64N128K32(Fp8Kind::kE5M2, Fp8Kind::kE4M3, "e5m2", "e4m3")
MEGATRON_WGMMA_M64N128K32(Fp8Kind::kE4M3, Fp8Kind::kE5M2, "e4m3", "e5m2")
#undef MEGATRON_WGMMA_M64N128K32

template <typename OutT>
__device__ __forceinline__ void store_pair(OutT* p, float v0, float v1, float beta);
template <>
__device__ __forceinline__ void store_pair<float>(float* p, float v0, float v1, float beta) {
  if (beta != 0.0f) {
    const float2 o = *reinterpret_cast<const float2*>(p);
    v0 = fmaf(beta, o.x, v0);
    v1 = fmaf(beta, o.y, v1);
  }
  *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
}
template <>
__device__ __forceinline__ void store_pair<__nv_bfloat16>(__nv_bfloat16* p, float v0, float v1, float beta) {
  if (beta != 0.0f) {
    const float2 o = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
    v0 = fmaf(beta, o.x, v0);
    v1 = fmaf(beta, o.y, v1);
  }
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(v0, v1);
}

// Tile t of the persistent loop -> (tile row, tile column). n_fast: consecutive tiles share their A
// rows and walk along n (B, the smaller operand, stays in L2); else along m.
__device__ __forceinline__ void tile_coords(int t, int tiles_m, int tiles_n, bool n_fast, int& tm, int& tn) {
  if (n_fast) {
    tm = t / tiles_n;
    tn = t % tiles_n;
  } else {
    tn = t / tiles_m;
    tm = t % tiles_m;
  }
}

#endif  // MEGATRON_BLOCK_GEMM_SM90A


// The kernel (see the file comment). sb2d: B's 128 x 128 scales ([N/128, sb2d_ld]) when kB2d, read
// straight from global memory (one value per tile and k block); else B's 1 x 128 scales come by TMA.
template <Fp8Kind TA, Fp8Kind TB, bool kB2d, typename OutT>
__global__ void __launch_bounds__(kThreads, 1)
    block_gemm_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
                      const __grid_constant__ CUtensorMap tm_sa, const __grid_constant__ CUtensorMap tm_sb,
                      const float* __restrict__ sb2d, int sb2d_ld, OutT* __restrict__ c, int n_cols, int k,
                      float beta, int tiles_m, int tiles_n, bool n_fast) {
#if MEGATRON_BLOCK_GEMM_SM90A
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* s_a = smem;
  uint8_t* s_b = smem + kStages * kTileBytes;
  float* s_sa = reinterpret_cast<float*>(smem + 2 * kStages * kTileBytes);
  float* s_sb = s_sa + kStages * kBM;
  uint64_t* full = reinterpret_cast<uint64_t*>(s_sb + kStages * kBN);
  uint64_t* empty = full + kStages;
  const int wg = threadIdx.x / 128;
  const int nk = k / kBK;
  const int tiles = tiles_m * tiles_n;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 8);  // lane 0 of each consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {  // producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (threadIdx.x == 0) {
      const uint32_t bytes = 2 * kTileBytes + kScaleBytes + (kB2d ? 0 : kScaleBytes);
      int stage = 0;
      uint32_t phase = 0;
      for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        int tm, tn;
        tile_coords(t, tiles_m, tiles_n, n_fast, tm, tn);
        for (int kb = 0; kb < nk; ++kb) {
          mbar_wait(&empty[stage], phase ^ 1);
          mbar_expect_tx(&full[stage], bytes);
          tma_load_2d(s_a + stage * kTileBytes, &tm_a, kb * kBK, tm * kBM, &full[stage]);
          tma_load_2d(s_b + stage * kTileBytes, &tm_b, kb * kBK, tn * kBN, &full[stage]);
          tma_load_2d(s_sa + stage * kBM, &tm_sa, tm * kBM, kb, &full[stage]);
          if (!kB2d) tma_load_2d(s_sb + stage * kBN, &tm_sb, tn * kBN, kb, &full[stage]);
          if (++stage == kStages) stage = 0, phase ^= 1;
        }
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
  const int cw = wg - 1;  // this warpgroup's 64 rows of the tile
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int r0 = cw * 64 + warp * 16 + lane / 4;  // rows r0 and r0 + 8 of the tile
  const int c0 = (lane % 4) * 2;                  // columns 8 j + c0, + 1
  float acc[64], part[64];
  int stage = 0;
  uint32_t phase = 0;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    int tm, tn;
    tile_coords(t, tiles_m, tiles_n, n_fast, tm, tn);
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    for (int kb = 0; kb < nk; ++kb) {
      const float sbv = kB2d ? __ldg(&sb2d[(int64_t)tn * sb2d_ld + kb]) : 0.0f;
      mbar_wait(&full[stage], phase);
      const float sa0 = s_sa[stage * kBM + r0], sa1 = s_sa[stage * kBM + r0 + 8];
      const uint64_t da = sw128_desc(s_a + stage * kTileBytes + cw * 64 * kBK);
      const uint64_t db = sw128_desc(s_b + stage * kTileBytes);
#pragma unroll
      for (int i = 0; i < 64; ++i) reg_fence(part[i]);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 32; ++kk) wgmma_m64n128k32<TA, TB>(part, da + 2 * kk, db + 2 * kk, kk > 0);
      wgmma_commit();
      // A second scratch accumulator (k block kb + 1's WGMMAs in flight while kb is promoted, with
      // wait_group 1) was tried in session 14: ptxas then serializes every WGMMA (C7514, "non wgmma
      // instructions reading accumulator registers ... between start and end of the pipeline
      // stage"), so the wait stays here.
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 64; ++i) reg_fence(part[i]);
      if (kB2d) {
        const float f0 = sa0 * sbv, f1 = sa1 * sbv;
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[i] = fmaf(part[i], (i & 2) ? f1 : f0, acc[i]);
      } else {
        const float* sb = s_sb + stage * kBN + c0;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const float2 b = *reinterpret_cast<const float2*>(sb + 8 * j);
          acc[4 * j + 0] = fmaf(part[4 * j + 0], sa0 * b.x, acc[4 * j + 0]);
          acc[4 * j + 1] = fmaf(part[4 * j + 1], sa0 * b.y, acc[4 * j + 1]);
          acc[4 * j + 2] = fmaf(part[4 * j + 2], sa1 * b.x, acc[4 * j + 2]);
          acc[4 * j + 3] = fmaf(part[4 * j + 3], sa1 * b.y, acc[4 * j + 3]);
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[stage]);
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
    const int64_t row = (int64_t)tm * kBM + r0;
    OutT* out = c + row * n_cols + (int64_t)tn * kBN + c0;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      store_pair<OutT>(out + 8 * j, acc[4 * j + 0], acc[4 * j + 1], beta);
      store_pair<OutT>(out + 8 * n_cols + 8 * j, acc[4 * j + 2], acc[4 * j + 3], beta);
    }
  }
#else
  __trap();
#endif
}

// ------------------------------------------------------------------------------------------ host
PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q));
    MEGATRON_CHECK(q == cudaDriverEntryPointSuccess && p) << "fp8 block GEMM: cuTensorMapEncodeTiled not found";
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A 2-D tensor map of a row-major [rows, cols] buffer (row stride row_bytes), box [box_rows, box_cols].
CUtensorMap tensor_map(const void* base, CUtensorMapDataType t, uint64_t cols, uint64_t rows, uint64_t row_bytes,
                       uint32_t box_cols, uint32_t box_rows, CUtensorMapSwizzle swizzle) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {row_bytes};
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult r = encode_tiled()(&m, t, 2, const_cast<void*>(base), dims, strides, box, elem,
                                    CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MEGATRON_CHECK(r == CUDA_SUCCESS) << "fp8 block GEMM: cuTensorMapEncodeTiled failed (" << (int)r << ") for a ["
                                    << rows << " x " << cols << "] operand";
  return m;
}

template <Fp8Kind TA, Fp8Kind TB, bool kB2d, typename OutT>
void launch(const Tensor& a, const Tensor& a_s, const Tensor& b, const Tensor& b_s, Tensor& c, float beta) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(0);
  auto kernel = block_gemm_kernel<TA, TB, kB2d, OutT>;
  static std::once_flag once;
  std::call_once(once, [&] {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmemBytes));
  });
  const CUtensorMap ma = tensor_map(a.data_ptr(), CU_TENSOR_MAP_DATA_TYPE_UINT8, k, m, k, kBK, kBM,
                                    CU_TENSOR_MAP_SWIZZLE_128B);
  const CUtensorMap mb = tensor_map(b.data_ptr(), CU_TENSOR_MAP_DATA_TYPE_UINT8, k, n, k, kBK, kBN,
                                    CU_TENSOR_MAP_SWIZZLE_128B);
  const int64_t lda_s = a_s.size(1), ldb_s = b_s.size(1);
  const CUtensorMap msa = tensor_map(a_s.data_ptr(), CU_TENSOR_MAP_DATA_TYPE_FLOAT32, lda_s, a_s.size(0), lda_s * 4,
                                     kBM, 1, CU_TENSOR_MAP_SWIZZLE_NONE);
  const CUtensorMap msb = kB2d ? msa
                               : tensor_map(b_s.data_ptr(), CU_TENSOR_MAP_DATA_TYPE_FLOAT32, ldb_s, b_s.size(0),
                                            ldb_s * 4, kBN, 1, CU_TENSOR_MAP_SWIZZLE_NONE);
  const int tiles_m = (int)(m / kBM), tiles_n = (int)(n / kBN);
  const int grid = std::min(tiles_m * tiles_n, num_sms());
  block_gemm_kernel<TA, TB, kB2d, OutT><<<grid, kThreads, kSmemBytes, megatron::cuda::current_stream()>>>(
      ma, mb, msa, msb, kB2d ? b_s.data<float>() : nullptr, (int)ldb_s, static_cast<OutT*>(c.data_ptr()), (int)n,
      (int)k, beta, tiles_m, tiles_n, /*n_fast=*/n <= m);
  CUDA_CHECK_LAUNCH();
}

template <Fp8Kind TA, Fp8Kind TB>
void launch_types(const Tensor& a, const Tensor& a_s, const Tensor& b, const Tensor& b_s, bool b_2d, Tensor& c,
                  float beta) {
  const bool f32 = c.dtype() == DType::kFloat32;
  if (b_2d) {
    if (f32) launch<TA, TB, true, float>(a, a_s, b, b_s, c, beta);
    else launch<TA, TB, true, __nv_bfloat16>(a, a_s, b, b_s, c, beta);
  } else {
    if (f32) launch<TA, TB, false, float>(a, a_s, b, b_s, c, beta);
    else launch<TA, TB, false, __nv_bfloat16>(a, a_s, b, b_s, c, beta);
  }
}
}  // namespace

int num_sms() {
  static const int v = [] {
    int dev = 0, n = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
  }();
  return v;
}

bool block_gemm_wgmma_supported(const Tensor& a, const Tensor& a_s, bool a_2d, const Tensor& b, const Tensor& b_s,
                                const Tensor& c) {
  static const bool sm90 = [] {
    int dev = 0, major = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    return major == 9;
  }();
  auto aligned = [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; };
  return sm90 && !a_2d && (c.dtype() == DType::kFloat32 || c.dtype() == DType::kBFloat16) && aligned(a) &&
         aligned(b) && aligned(a_s) && aligned(b_s) && aligned(c) && a.size(1) <= INT32_MAX && b.size(0) <= INT32_MAX &&
         a.size(0) <= INT32_MAX;
}

void block_gemm_wgmma(const Tensor& a, const Tensor& a_s, const Tensor& b, const Tensor& b_s, bool b_2d, Tensor& c,
                      float beta) {
  const bool a5 = a.dtype() == DType::kFloat8E5M2, b5 = b.dtype() == DType::kFloat8E5M2;
  if (!a5 && !b5) launch_types<Fp8Kind::kE4M3, Fp8Kind::kE4M3>(a, a_s, b, b_s, b_2d, c, beta);
  else if (a5) launch_types<Fp8Kind::kE5M2, Fp8Kind::kE4M3>(a, a_s, b, b_s, b_2d, c, beta);
  else launch_types<Fp8Kind::kE4M3, Fp8Kind::kE5M2>(a, a_s, b, b_s, b_2d, c, beta);
}

}  // namespace megatron::ops::cuda
