// Host emulation of the blockwise FP8 quantize kernel of megatron/core/ops/cuda/fp8_block.cu (see
// fp8_block_run.sh): the kernel source (cvt, block_scale, block_quantize_tile_kernel) compiled as
// C++ with host stand-ins for the CUDA intrinsics; each block's 256 threads run as std::threads
// meeting at a std::barrier at every __syncthreads, and each warp's 32 threads exchange values
// through a per-warp buffer and barrier for warp_max and __shfl_xor_sync (the kernel calls them
// warp-uniformly). The kernel runs both its paths: whole 128 x 128 tiles (16-byte loads, 8- /
// 16-byte stores) and partial tiles (scalar). The FP8 conversions are the CPU emulation's
// float_to_e4m3_bits / float_to_e5m2_bits (bit-exact to CUDA's cvt, fp8_gpu_test --groups casts).
// Checked against a plain loop of TE's blockwise recipe
// (docs/fp8.md "Blockwise recipe"): bytes and scale_inv of q (1 x 128 or 128 x 128) and q_t
// (128 x 1 column tiles written transposed, or the 128 x 128 blocks transposed), on shapes with
// partial tiles, E4M3/E5M2, power-of-2 and fp32 scales. The GPU is checked by
// fp8_gpu_test --groups blockwise.
#include <algorithm>
#include <barrier>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "megatron/core/tensor/dtype.h"
#include "megatron/core/utils/errors.h"

#include "cuda_host_shim.h"
inline uint8_t __nv_cvt_float_to_fp8(float v, int, int fmt) {
  return fmt == __NV_E4M3 ? megatron::float_to_e4m3_bits(v) : megatron::float_to_e5m2_bits(v);
}
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmul_rn(float a, float b) { return a * b; }
using std::isinf;
using std::isnan;

// One exchange buffer and barrier per warp of the running block.
struct Warp {
  std::barrier<>* bar;
  float v[32];
};
Warp g_warps[8];
unsigned char* g_smem = nullptr;  // the kernel's dynamic shared memory
inline float __shfl_xor_sync(unsigned, float v, int o) {
  Warp& w = g_warps[threadIdx.x >> 5];
  w.v[threadIdx.x & 31] = v;
  w.bar->arrive_and_wait();
  const float r = w.v[(threadIdx.x & 31) ^ o];
  w.bar->arrive_and_wait();
  return r;
}

namespace megatron::ops::cuda {
namespace {
constexpr int kB = 128, kThreads = 256;
inline float warp_max(float v) {
  Warp& w = g_warps[threadIdx.x >> 5];
  w.v[threadIdx.x & 31] = v;
  w.bar->arrive_and_wait();
  float m = w.v[0];
  for (int i = 1; i < 32; ++i) m = std::fmax(m, w.v[i]);
  w.bar->arrive_and_wait();
  return m;
}
#include "kernels.inc"  // fp8_block_run.sh turned the `extern __shared__` array into g_smem
}  // namespace
}  // namespace megatron::ops::cuda

using namespace megatron::ops::cuda;

// Runs kern() as every thread of every block of the grid over x [R, C], with the kernel's shared
// memory (T: its tile type).
template <class T, class F>
void run_blocks(int64_t R, int64_t C, F kern) {
  std::vector<uint4> smem_t(tile_smem<T>() / sizeof(uint4) + 1);
  const unsigned gx = (unsigned)((C + kB - 1) / kB), gy = (unsigned)((R + kB - 1) / kB);
  for (unsigned by = 0; by < gy; ++by)
    for (unsigned bx = 0; bx < gx; ++bx) {
      std::barrier<> bar(kThreads);
      std::vector<std::unique_ptr<std::barrier<>>> wb;
      for (int w = 0; w < 8; ++w) wb.push_back(std::make_unique<std::barrier<>>(32));
      for (int w = 0; w < 8; ++w) g_warps[w].bar = wb[w].get();
      g_smem = reinterpret_cast<unsigned char*>(smem_t.data());
      std::vector<std::thread> th;
      for (int t = 0; t < kThreads; ++t)
        th.emplace_back([&, t] {
          threadIdx = {(unsigned)t, 0, 0};
          blockIdx = {bx, by, 0};
          g_bar = &bar;
          kern();
        });
      for (auto& t : th) t.join();
    }
}

// Runs block_quantize_tile_kernel on x itself (RawTile) over the grid, with the host's `vec` rule
// (whole tiles: the 16-byte paths).
template <class T, int kFmt, bool k2D>
void run_kernel(const std::vector<T>& x, int64_t R, int64_t C, bool pow2, uint8_t* q, float* s, int64_t s_ld,
                uint8_t* qt, float* st, int64_t st_ld) {
  const bool vec = R % kB == 0 && C % kB == 0;
  run_blocks<T>(R, C, [&] {
    block_quantize_tile_kernel<RawTile<T>, T, kFmt, k2D>(RawTile<T>{x.data()}, R, C, pow2, vec, q, s, s_ld, qt, st,
                                                         st_ld);
  });
}

// The plain loop: TE's compute_scale_from_amax (epsilon 0) per block, sat-RNE casts.
float ref_scale(float amax, float fmax, bool pow2) {
  if (std::isinf(amax) || amax == 0.0f || std::isnan(amax)) return 1.0f;
  float s = fmax / amax;
  if (std::isinf(s)) s = FLT_MAX;
  if (pow2) s = __uint_as_float(__float_as_uint(s) & 0xFF800000u);
  return s;
}
void ref_blocks(const std::vector<float>& v, int64_t R, int64_t C, int64_t br, int64_t bc, bool e4, bool pow2,
                std::vector<uint8_t>& q, std::vector<float>& si, int64_t ld_i, int64_t ld_j, bool transpose) {
  for (int64_t i0 = 0; i0 < R; i0 += br)
    for (int64_t j0 = 0; j0 < C; j0 += bc) {
      float a = 0;
      for (int64_t i = i0; i < std::min(R, i0 + br); ++i)
        for (int64_t j = j0; j < std::min(C, j0 + bc); ++j) a = std::fmax(a, std::fabs(v[i * C + j]));
      const float s = ref_scale(a, e4 ? 448.0f : 57344.0f, pow2);
      si[(i0 / br) * ld_i + (j0 / bc) * ld_j] = 1.0f / s;
      for (int64_t i = i0; i < std::min(R, i0 + br); ++i)
        for (int64_t j = j0; j < std::min(C, j0 + bc); ++j)
          q[transpose ? j * R + i : i * C + j] = __nv_cvt_float_to_fp8(v[i * C + j] * s, 0, e4 ? 0 : 1);
    }
}

int g_fail = 0;
template <class T, int kFmt, bool k2D>
void check(int64_t R, int64_t C, bool pow2, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(R * C);
  for (int64_t i = 0; i < R * C; ++i) v[i] = nd(rng) * std::ldexp(1.0f, (int)((i / 53) % 30) - 15);
  for (int64_t c = 0; c < std::min<int64_t>(C, 3); ++c) v[c] = 0.0f;  // a partly zero row
  std::vector<T> x(R * C);
  for (int64_t i = 0; i < R * C; ++i) {
    if constexpr (sizeof(T) == 2) {
      const uint32_t u = __float_as_uint(v[i]);
      x[i].b = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
      v[i] = to_f(x[i]);
    } else {
      x[i] = v[i];
    }
  }
  const int64_t cb = (C + 127) / 128, rb = (R + 127) / 128;
  auto rnd4 = [](int64_t a) { return (a + 3) / 4 * 4; };
  const int64_t s_rows = k2D ? rb : cb, s_ld = k2D ? rnd4(cb) : rnd4(R);
  const int64_t st_rows = k2D ? cb : rb, st_ld = k2D ? rnd4(rb) : rnd4(C);
  std::vector<uint8_t> q(R * C, 0xAA), qt(R * C, 0xAA), rq(R * C), rqt(R * C);
  std::vector<float> s(s_rows * s_ld, 0.0f), st(st_rows * st_ld, 0.0f), rs(s.size(), 0.0f), rst(st.size(), 0.0f);
  run_kernel<T, kFmt, k2D>(x, R, C, pow2, q.data(), s.data(), s_ld, qt.data(), st.data(), st_ld);
  const bool e4 = kFmt == 0;
  if (k2D) {
    ref_blocks(v, R, C, 128, 128, e4, pow2, rq, rs, s_ld, 1, false);
    ref_blocks(v, R, C, 128, 128, e4, pow2, rqt, rst, 1, st_ld, true);
  } else {
    ref_blocks(v, R, C, 1, 128, e4, pow2, rq, rs, 1, s_ld, false);
    ref_blocks(v, R, C, 128, 1, e4, pow2, rqt, rst, st_ld, 1, true);
  }
  long long bad = 0, bad_s = 0;
  for (int64_t i = 0; i < R * C; ++i) bad += (q[i] != rq[i]) + (qt[i] != rqt[i]);
  for (size_t i = 0; i < s.size(); ++i) bad_s += s[i] != rs[i];
  for (size_t i = 0; i < st.size(); ++i) bad_s += st[i] != rst[i];
  const bool ok = bad == 0 && bad_s == 0;
  std::printf("%s block_quantize_tile_kernel %s %s %s %lldx%lld%s: %lld byte / %lld scale_inv mismatches\n",
              ok ? "ok  " : "FAIL", k2D ? "128x128" : "1x128", sizeof(T) == 2 ? "bf16" : "fp32", e4 ? "e4m3" : "e5m2",
              (long long)R, (long long)C, pow2 ? "" : " fp32-scales", bad, bad_s);
  if (!ok) ++g_fail;
}

// The fused sources (the blockwise fused producers): the tiled kernel filling its tile from
// RmsnormSrc (zero-centred gamma; which 0) or SwigluSrc (which 1) of fp8_sources.cuh, bf16 in and
// out, against the plain loop on the producer's bf16 output computed here from its formula
// (y = bf16(x * rstd * (gamma + 1)), y = bf16(silu(g) * u)): q + scale_inv and q_t + scale_inv.
template <int kFmt>
void check_fused(int which, int64_t R, int64_t C, bool pow2, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 2.0f);
  const int64_t in_cols = which ? 2 * C : C;
  std::vector<bf16_t> x(R * in_cols), gamma(C);
  std::vector<float> rstd(R), y(R * C);
  for (int64_t i = 0; i < R * in_cols; ++i) x[i] = from_f<bf16_t>(nd(rng) * std::ldexp(1.0f, (int)((i / 41) % 12) - 6));
  for (auto& g : gamma) g = from_f<bf16_t>(0.1f * nd(rng));
  for (int64_t r = 0; r < R; ++r) rstd[r] = 0.5f + 0.01f * (float)(r % 17);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      float v;
      if (which == 0) {
        v = to_f(x[r * C + c]) * rstd[r] * (to_f(gamma[c]) + 1.0f);
      } else {
        const float g = to_f(x[r * 2 * C + c]), u = to_f(x[r * 2 * C + C + c]);
        v = g / (1.0f + expf(-g)) * u;
      }
      y[r * C + c] = to_f(from_f<bf16_t>(v));
    }
  const int64_t cb = (C + 127) / 128, rb = (R + 127) / 128;
  auto rnd4 = [](int64_t a) { return (a + 3) / 4 * 4; };
  const int64_t s_ld = rnd4(R), st_ld = rnd4(C);
  std::vector<uint8_t> q(R * C, 0xAA), qt(R * C, 0xAA), rq(R * C), rqt(R * C);
  std::vector<float> s(cb * s_ld, 0.0f), st(rb * st_ld, 0.0f), rs(s.size(), 0.0f), rst(st.size(), 0.0f);
  const bool vec = R % kB == 0 && C % kB == 0;
  run_blocks<bf16_t>(R, C, [&] {
    if (which == 0)
      block_quantize_tile_kernel<RmsnormSrc<bf16_t, bf16_t, bf16_t>, bf16_t, kFmt, false>(
          RmsnormSrc<bf16_t, bf16_t, bf16_t>{x.data(), gamma.data(), rstd.data(), C, 1.0f}, R, C, pow2, vec, q.data(),
          s.data(), s_ld, qt.data(), st.data(), st_ld);
    else
      block_quantize_tile_kernel<SwigluSrc<bf16_t, bf16_t>, bf16_t, kFmt, false>(
          SwigluSrc<bf16_t, bf16_t>{x.data(), C}, R, C, pow2, vec, q.data(), s.data(), s_ld, qt.data(), st.data(),
          st_ld);
  });
  ref_blocks(y, R, C, 1, 128, kFmt == 0, pow2, rq, rs, 1, s_ld, false);
  ref_blocks(y, R, C, 128, 1, kFmt == 0, pow2, rqt, rst, st_ld, 1, true);
  long long bad = 0, bad_s = 0;
  for (int64_t i = 0; i < R * C; ++i) bad += (q[i] != rq[i]) + (qt[i] != rqt[i]);
  for (size_t i = 0; i < s.size(); ++i) bad_s += s[i] != rs[i];
  for (size_t i = 0; i < st.size(); ++i) bad_s += st[i] != rst[i];
  const bool ok = bad == 0 && bad_s == 0;
  std::printf("%s block_quantize_tile_kernel fused %s %s %lldx%lld%s: %lld byte / %lld scale_inv mismatches\n",
              ok ? "ok  " : "FAIL", which ? "swiglu" : "rmsnorm", kFmt == 0 ? "e4m3" : "e5m2", (long long)R,
              (long long)C, pow2 ? "" : " fp32-scales", bad, bad_s);
  if (!ok) ++g_fail;
}

int main() {
  std::mt19937 rng(11);
  check_fused<0>(0, 130, 200, true, rng);  // partial tiles
  check_fused<0>(1, 130, 200, false, rng);
  check_fused<1>(0, 256, 384, false, rng);  // whole tiles
  check_fused<0>(1, 256, 384, true, rng);
  check<bf16_t, 0, false>(130, 200, true, rng);  // partial tiles
  check<bf16_t, 1, false>(257, 131, true, rng);
  check<float, 0, false>(128, 256, false, rng);  // whole tiles
  check<bf16_t, 0, false>(256, 384, true, rng);
  check<bf16_t, 1, false>(384, 128, false, rng);
  check<bf16_t, 0, true>(130, 200, true, rng);
  check<float, 1, true>(257, 131, false, rng);
  check<bf16_t, 0, true>(256, 384, true, rng);
  check<float, 0, true>(128, 256, false, rng);
  std::printf("fp8_block_emu: %s\n", g_fail ? "FAILED" : "all ok");
  return g_fail ? 1 : 0;
}
