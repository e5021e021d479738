// Host emulation of the FP8 quantize kernels of megatron/core/ops/cuda/fp8_cast.cu (see
// fp8_cast_run.sh): the kernel source (pack8, quantize_rows_kernel, quantize_transpose_vec_kernel and
// the fused swiglu/rmsnorm/scale_rows quantize kernels on the same tile)
// compiled as C++ with host stand-ins for the CUDA intrinsics; each block's 256 threads run as
// std::threads meeting at a std::barrier at every __syncthreads. The FP8 conversions are the CPU
// emulation's float_to_e4m3_bits / float_to_e5m2_bits (proven bit-exact to CUDA's cvt on the H200
// by fp8_gpu_test), so this checks the kernels' indexing, tiling, shared-memory swizzle, byte
// transposes, bounds and amax against a plain loop: q[r][c] = cvt(x[r][c] * scale), q_t its
// transpose, amax = max |x|. The GPU itself is checked by fp8_gpu_test --groups quantize_fast.
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "megatron/core/tensor/dtype.h"

#include "cuda_host_shim.h"

Dim3 gridDim, blockDim;
struct float2 {
  float x, y;
};
inline float2 make_float2(float a, float b) { return {a, b}; }
inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
  uint8_t b[8];
  for (int i = 0; i < 4; ++i) b[i] = (x >> (8 * i)) & 0xff, b[4 + i] = (y >> (8 * i)) & 0xff;
  uint32_t r = 0;
  for (int n = 0; n < 4; ++n) r |= (uint32_t)b[(s >> (4 * n)) & 7] << (8 * n);
  return r;
}
inline uint8_t cvt(float v, int fmt) { return fmt == __NV_E4M3 ? megatron::float_to_e4m3_bits(v) : megatron::float_to_e5m2_bits(v); }
inline uint16_t __nv_cvt_float2_to_fp8x2(float2 v, int, int fmt) {
  return (uint16_t)(cvt(v.x, fmt) | (cvt(v.y, fmt) << 8));
}

namespace megatron::ops::cuda {
namespace {
constexpr int kThreads = 256;
constexpr int kTile = 64;
template <int kFmt>
inline uint8_t to_fp8(float v) { return cvt(v, kFmt == 0 ? __NV_E4M3 : __NV_E5M2); }
inline float abs_max(float a, float v) {
  const float f = std::fabs(v);
  return (f > a || std::isnan(f)) ? f : a;
}
std::mutex g_amax_mu;
inline void block_amax_to(float a, float* amax) {  // stand-in (the real one is GPU-tested)
  std::lock_guard<std::mutex> g(g_amax_mu);
  if (a > *amax || std::isnan(a)) *amax = a;
}
#include "kernels.inc"
}  // namespace
}  // namespace megatron::ops::cuda

using namespace megatron::ops::cuda;

template <class F>
void launch(unsigned gx, unsigned gy, F kern, bool barrier) {
  gridDim = {gx, gy, 1};
  blockDim = {kThreads, 1, 1};
  for (unsigned by = 0; by < gy; ++by)
    for (unsigned bx = 0; bx < gx; ++bx) {
      std::barrier<> bar(kThreads);
      std::vector<std::thread> th;
      for (int t = 0; t < kThreads; ++t)
        th.emplace_back([&, t] {
          threadIdx = {(unsigned)t, 0, 0};
          blockIdx = {bx, by, 0};
          g_bar = barrier ? &bar : nullptr;
          kern();
        });
      for (auto& t : th) t.join();
    }
}

int g_fail = 0;
void report(bool ok, const char* what, long long bad, float amax, float amax_ref) {
  std::printf("%s %-58s %lld mismatches, amax %.6g vs %.6g\n", ok ? "ok  " : "FAIL", what, bad, amax, amax_ref);
  if (!ok) ++g_fail;
}

int main() {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  const float scale = 21.25f;
  // Transpose kernel: shapes with rows % 16 == 0 and cols % 8 == 0, partial tiles both ways.
  const int64_t shapes[][2] = {{272, 264}, {16, 8}, {128, 128}, {144, 392}};
  for (auto& sh : shapes)
    for (int fmt = 0; fmt < 2; ++fmt)
      for (int mode = 0; mode < 2; ++mode) {  // 0: q + q_t, 1: q_t only
        const int64_t R = sh[0], C = sh[1];
        std::vector<bf16_t> x(R * C);
        float amax_ref = 0;
        for (auto& v : x) {
          float f = nd(rng);
          uint32_t u;
          std::memcpy(&u, &f, 4);
          v.b = (uint16_t)(u >> 16);
          amax_ref = std::max(amax_ref, std::fabs(to_f(v)));
        }
        std::vector<uint8_t> q(R * C, 0xEE), qt(R * C, 0xEE);
        float amax = 0;
        const unsigned gx = (unsigned)((C + 127) / 128), gy = (unsigned)((R + 127) / 128);
        launch(gx, gy, [&] {
          if (fmt == 0)
            quantize_transpose_vec_kernel<bf16_t, 0>(x.data(), R, C, &scale, &amax, mode == 0 ? q.data() : nullptr, qt.data());
          else
            quantize_transpose_vec_kernel<bf16_t, 1>(x.data(), R, C, &scale, &amax, mode == 0 ? q.data() : nullptr, qt.data());
        }, true);
        long long bad = 0;
        for (int64_t r = 0; r < R; ++r)
          for (int64_t c = 0; c < C; ++c) {
            const uint8_t ref = cvt(to_f(x[r * C + c]) * scale, fmt);
            if (mode == 0) bad += q[r * C + c] != ref;
            bad += qt[c * R + r] != ref;
          }
        char name[120];
        std::snprintf(name, sizeof name, "transpose_vec %lldx%lld %s %s", (long long)R, (long long)C,
                      fmt ? "e5m2" : "e4m3", mode ? "q_t only" : "q + q_t");
        report(bad == 0 && amax == amax_ref, name, bad, amax, amax_ref);
      }
  // Fused producers (SwiGLU, RMSNorm apply) through the same tile: the value is what the unfused
  // kernel writes in bf16 (computed here by the same formulas), then quantized; q + q_t, amax.
  auto bf = [](float f) { return from_f<bf16_t>(f); };
  for (auto sh : {std::pair<int64_t, int64_t>{272, 264}, {144, 392}, {16, 8}, {272, 272}, {144, 400}, {16, 16}})
    for (int which = 0; which < 4; ++which) {  // 0: SwiGLU, 1: RMSNorm, 2: SwiGLU backward (C = 2f), 3: scale_rows
      const int64_t R = sh.first, C = sh.second;
      if (which == 2 && C % 16 != 0) continue;
      const int64_t F = C / 2;
      std::vector<bf16_t> x(which == 0 ? R * 2 * C : R * C), gamma(C), dy(R * F);
      for (auto& v : dy) v = bf(nd(rng));
      std::vector<float> rstd(R);
      for (auto& v : x) v = bf(nd(rng));
      for (auto& v : gamma) v = bf(0.2f * nd(rng));
      for (auto& v : rstd) v = 0.5f + std::fabs(nd(rng));
      if (which == 3) rstd[R - 1] = 0.0f;  // scale_rows' factors (an MoE padding row: prob 0)
      std::vector<float> ref(R * C);
      float amax_ref = 0;
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) {
          float v;
          if (which == 0) {
            const float g = to_f(x[r * 2 * C + c]), u = to_f(x[r * 2 * C + C + c]);
            v = to_f(bf(g / (1.0f + expf(-g)) * u));
          } else if (which == 2) {  // x [R, C] = [gate | up], dy [R, F]
            const int64_t cc = c % F;
            const float g = to_f(x[r * C + cc]), u = to_f(x[r * C + F + cc]), d = to_f(dy[r * F + cc]);
            const float sg = 1.0f / (1.0f + expf(-g)), s = g * sg;
            v = to_f(bf(c >= F ? d * s : d * u * sg * (1.0f + g * (1.0f - sg))));
          } else if (which == 3) {  // x [R, C] * p[r], p = rstd here
            v = to_f(bf(to_f(x[r * C + c]) * rstd[r]));
          } else {
            v = to_f(bf((to_f(x[r * C + c]) - 0.0f) * rstd[r] * (to_f(gamma[c]) + 1.0f) + 0.0f));
          }
          ref[r * C + c] = v;
          amax_ref = std::max(amax_ref, std::fabs(v));
        }
      std::vector<uint8_t> q(R * C, 0xEE), qt(R * C, 0xEE);
      float amax = 0;
      launch((unsigned)((C + 127) / 128), (unsigned)((R + 127) / 128), [&] {
        if (which == 0)
          swiglu_quantize_kernel<bf16_t, bf16_t, 0>(x.data(), R, C, &scale, &amax, q.data(), qt.data());
        else if (which == 3)
          scale_rows_quantize_kernel<bf16_t, 0>(x.data(), rstd.data(), R, C, &scale, &amax, q.data(), qt.data());
        else if (which == 2)
          swiglu_bwd_quantize_kernel<bf16_t, bf16_t, 0>(x.data(), dy.data(), R, F, &scale, &amax, q.data(), qt.data());
        else
          rmsnorm_quantize_kernel<bf16_t, bf16_t, bf16_t, 0>(x.data(), gamma.data(), rstd.data(), R, C, 1.0f, &scale,
                                                            &amax, q.data(), qt.data());
      }, true);
      long long bad = 0;
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) {
          const uint8_t b = cvt(ref[r * C + c] * scale, 0);
          bad += (q[r * C + c] != b) + (qt[c * R + r] != b);
        }
      char name[120];
      std::snprintf(name, sizeof name, "%s+quantize+transpose %lldx%lld e4m3",
                    which == 3 ? "scale_rows" : which == 2 ? "swiglu_bwd" : which ? "rmsnorm" : "swiglu",
                    (long long)R, (long long)C);
      report(bad == 0 && amax == amax_ref, name, bad, amax, amax_ref);
    }
  // The general 64 x 64 byte-tile kernel (fallback for other shapes), q + q_t.
  for (auto sh : {std::pair<int64_t, int64_t>{99, 143}, {100, 72}})
    for (int fmt = 0; fmt < 2; ++fmt) {
      const int64_t R = sh.first, C = sh.second;
      std::vector<float> x(R * C);
      float amax_ref = 0;
      for (auto& v : x) amax_ref = std::max(amax_ref, std::fabs(v = nd(rng)));
      std::vector<uint8_t> q(R * C, 0xEE), qt(R * C, 0xEE);
      float amax = 0;
      launch((unsigned)((C + 63) / 64), (unsigned)((R + 63) / 64), [&] {
        if (fmt == 0) quantize_transpose_kernel<float, 0>(x.data(), R, C, &scale, &amax, q.data(), qt.data());
        else quantize_transpose_kernel<float, 1>(x.data(), R, C, &scale, &amax, q.data(), qt.data());
      }, true);
      long long bad = 0;
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) {
          const uint8_t ref = cvt(x[r * C + c] * scale, fmt);
          bad += (q[r * C + c] != ref) + (qt[c * R + r] != ref);
        }
      char name[120];
      std::snprintf(name, sizeof name, "transpose (64x64 fallback) %lldx%lld %s", (long long)R, (long long)C,
                    fmt ? "e5m2" : "e4m3");
      report(bad == 0 && amax == amax_ref, name, bad, amax, amax_ref);
    }
  // Rows kernel: grid-stride with 3 blocks, vectorized and not, n not a multiple of 16.
  for (int64_t n : {int64_t(1), int64_t(15), int64_t(16), int64_t(12345 * 3), int64_t(3 * 256 * 16 * 2 + 7)})
    for (int vec = 0; vec < 2; ++vec) {
      std::vector<float> x(n);
      float amax_ref = 0;
      for (auto& v : x) {
        v = nd(rng);
        amax_ref = std::max(amax_ref, std::fabs(v));
      }
      x[n / 2] = -1000.0f;  // saturates
      amax_ref = std::max(amax_ref, 1000.0f);
      std::vector<uint8_t> q(n + 16, 0xEE);
      float amax = 0;
      launch(3, 1, [&] { quantize_rows_kernel<float, 0>(x.data(), n, &scale, &amax, q.data(), vec != 0); }, false);
      long long bad = 0;
      for (int64_t i = 0; i < n; ++i) bad += q[i] != cvt(x[i] * scale, 0);
      for (int64_t i = n; i < n + 16; ++i) bad += q[i] != 0xEE;  // nothing written past the end
      char name[120];
      std::snprintf(name, sizeof name, "rows n=%lld %s", (long long)n, vec ? "vectorized" : "scalar");
      report(bad == 0 && amax == amax_ref, name, bad, amax, amax_ref);
    }
  std::printf("fp8_cast_emu: %s\n", g_fail ? "FAIL" : "all passed");
  return g_fail ? 1 : 0;
}
