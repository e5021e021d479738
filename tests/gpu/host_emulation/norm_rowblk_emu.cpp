// Host emulation of norm.cu's row-block norm backward (norm_bwd_rowblk_kernel, 1024 < h <= 8192,
// bfloat16 rows) next to the general kernel it replaces at those h (norm_bwd_kernel, shared-memory
// atomics and its deterministic per-warp form); see norm_rowblk_run.sh. Each block's threads run
// as std::threads: __syncthreads meets at the block's barrier, a shuffle at the warp's, the
// shared-memory float atomics are std::atomic_ref adds. Checked per case, against a float64 host
// reference from the same rounded inputs and float32 statistics:
//   * dx (bf16 output: relative norm error <= 1e-2), + dres when given;
//   * every block's partial dgamma/dbeta row against the float64 sum over exactly the rows that
//     block visits (r = b, b + grid, ...: a dropped, repeated or misassigned row fails; fp32 sums
//     of a few rows: 1e-5), and the partial rows summed (1e-5);
//   * the same dx and summed dgamma/dbeta from norm_bwd_kernel (atomics and deterministic form)
//     within the same tolerances of the new kernel's (not bitwise: the row and column sums are
//     added in another order);
//   * two runs of the new kernel bitwise equal.
// Shapes: h = 1032 (96 threads, most threads' second chunk empty), 2048, 4096, 5120 (320 threads),
// 8192 (512); LayerNorm and RMSNorm, bf16 and fp32 gamma, gofs 0 and 1, with and without dres;
// rows not a multiple of the grid, fewer rows than blocks (a block with no row writes zeros).
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda_host_shim.h"  // CUDA keywords, threadIdx / blockIdx, bf16_t, to_f / from_f, ld8
#include "emu_check.h"        // fails, report, same, near
#undef __launch_bounds__
#define __launch_bounds__(...)

Dim3 gridDim, blockDim;
thread_local float* g_smem_f;
struct WarpCtx {
  std::barrier<>* bar;
  float slots[32];
};
thread_local WarpCtx* g_w;
thread_local int g_lane;
inline float __shfl_xor_sync(unsigned, float v, int m) {
  g_w->slots[g_lane] = v;
  g_w->bar->arrive_and_wait();
  const float r = g_w->slots[g_lane ^ m];
  g_w->bar->arrive_and_wait();
  return r;
}
inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }

namespace megatron::ops::cuda::detail {
using ::bf16_t;
using ::from_f;
using ::ld8;
using ::to_f;
inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0, v, o);
  return v;
}
template <class T>
inline void st8(T* p, int64_t i, int64_t n, bool, const float (&f)[8]) {
  for (int j = 0; j < 8; ++j)
    if (i + j < n) p[i + j] = from_f<T>(f[j]);
}
}  // namespace megatron::ops::cuda::detail

namespace megatron::ops::cuda {
namespace {
using namespace detail;
constexpr int kWarps = 8;
#include "kernels.inc"
}  // namespace
}  // namespace megatron::ops::cuda
using namespace megatron::ops::cuda;

// Runs kern on `grid` blocks of `threads` threads, one block at a time, with `smem_floats` of
// NaN-poisoned dynamic shared memory.
void launch(unsigned grid, int threads, size_t smem_floats, const std::function<void()>& kern) {
  gridDim = {grid, 1, 1};
  blockDim = {(unsigned)threads, 1, 1};
  std::vector<float> sm(smem_floats + 1);
  for (unsigned b = 0; b < grid; ++b) {
    std::fill(sm.begin(), sm.end(), NAN);
    std::barrier<> bar(threads);
    std::vector<std::unique_ptr<std::barrier<>>> wb;
    std::vector<WarpCtx> ctx(threads / 32);
    for (int w = 0; w < threads / 32; ++w) {
      wb.emplace_back(new std::barrier<>(32));
      ctx[w].bar = wb.back().get();
    }
    std::vector<std::thread> th;
    for (int t = 0; t < threads; ++t)
      th.emplace_back([&, t] {
        threadIdx = {(unsigned)t, 0, 0};
        blockIdx = {b, 0, 0};
        g_bar = &bar;
        g_smem_f = sm.data();
        g_w = &ctx[t / 32];
        g_lane = t % 32;
        kern();
      });
    for (auto& t : th) t.join();
  }
}

template <class T>
std::vector<double> as_d(const std::vector<T>& v) {
  std::vector<double> d(v.size());
  for (size_t i = 0; i < v.size(); ++i) d[i] = to_f(v[i]);
  return d;
}
// Column sums of nb partial rows of h, in float64.
std::vector<double> colsum(const std::vector<float>& p, int nb, int h) {
  std::vector<double> s(h, 0.0);
  for (int b = 0; b < nb; ++b)
    for (int c = 0; c < h; ++c) s[c] += p[(size_t)b * h + c];
  return s;
}

template <bool kLN, class G>
void run(int64_t rows, int h, unsigned grid, bool with_res, bool zc, std::mt19937& rng) {
  using T = bf16_t;
  std::normal_distribution<float> nd;
  auto rnd = [&](size_t n, float sc) {
    std::vector<T> v(n);
    for (auto& x : v) x = from_f<T>(sc * nd(rng));
    return v;
  };
  const auto x = rnd(rows * h, 2.0f), dy = rnd(rows * h, 1.0f), dr = rnd(rows * h, 1.0f);
  std::vector<G> g(h);
  for (int c = 0; c < h; ++c) g[c] = from_f<G>(to_f(from_f<T>(0.5f + std::abs(nd(rng)) - (zc ? 1.0f : 0.0f))));
  const float eps = 1e-5f, gofs = zc ? 1.0f : 0.0f;
  char tag[128];
  std::snprintf(tag, sizeof tag, "%s h=%d rows=%ld grid=%u gamma %s%s%s", kLN ? "layernorm" : "rmsnorm", h,
                (long)rows, grid, sizeof(G) == 4 ? "fp32" : "bf16", zc ? " 1p" : "", with_res ? " +dres" : "");
  // Statistics as the forward stores them (float32), and the float64 reference from them.
  std::vector<float> mean(rows), rstd(rows);
  std::vector<double> rdx(rows * h), rpg((size_t)grid * h, 0.0), rpb((size_t)grid * h, 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    double m = 0, var = 0;
    if (kLN) {
      for (int c = 0; c < h; ++c) m += to_f(x[i * h + c]);
      m /= h;
    }
    for (int c = 0; c < h; ++c) var += (to_f(x[i * h + c]) - m) * (to_f(x[i * h + c]) - m);
    mean[i] = (float)m;
    rstd[i] = (float)(1.0 / std::sqrt(var / h + eps));
    const double mu = mean[i], rs = rstd[i];
    double a = 0, b = 0;
    const size_t pb = (size_t)(i % grid) * h;  // the block that visits row i
    for (int c = 0; c < h; ++c) {
      const double xh = (to_f(x[i * h + c]) - mu) * rs, d = to_f(dy[i * h + c]), gg = to_f(g[c]) + gofs;
      a += d * gg;
      b += d * gg * xh;
      rpg[pb + c] += d * xh;
      rpb[pb + c] += d;
    }
    a /= h;
    b /= h;
    for (int c = 0; c < h; ++c) {
      const double xh = (to_f(x[i * h + c]) - mu) * rs, dxh = to_f(dy[i * h + c]) * (to_f(g[c]) + gofs);
      rdx[i * h + c] = rs * (dxh - (kLN ? a : 0.0) - xh * b) + (with_res ? to_f(dr[i * h + c]) : 0.0);
    }
  }
  std::vector<double> rdg(h, 0.0), rdb(h, 0.0);
  for (unsigned b = 0; b < grid; ++b)
    for (int c = 0; c < h; ++c) rdg[c] += rpg[(size_t)b * h + c], rdb[c] += rpb[(size_t)b * h + c];
  const T* res = with_res ? dr.data() : nullptr;
  const int threads = rowblk_threads(h);
  // New kernel, twice.
  std::vector<T> dx[2];
  std::vector<float> pg[2], pb[2];
  for (int run = 0; run < 2; ++run) {
    dx[run].assign(rows * h, from_f<T>(NAN));
    pg[run].assign((size_t)grid * h, NAN);
    pb[run].assign((size_t)grid * h, NAN);
    T* DX = dx[run].data();
    float *PG = pg[run].data(), *PB = pb[run].data();
    launch(grid, threads, 0, [&] {
      if (with_res)
        norm_bwd_rowblk_kernel<kLN, true, T, G>(dy.data(), x.data(), g.data(), mean.data(), rstd.data(), DX, PG, PB,
                                                rows, h, gofs, res);
      else
        norm_bwd_rowblk_kernel<kLN, false, T, G>(dy.data(), x.data(), g.data(), mean.data(), rstd.data(), DX, PG, PB,
                                                 rows, h, gofs, nullptr);
    });
  }
  const std::string t(tag);
  near(t + " rowblk dx", dx[0], rdx, 1e-2);
  // Every block's partial row (a zero row for a block without rows: relative to 0 is exact 0).
  bool parts_ok = true;
  for (unsigned b = 0; b < grid; ++b) {
    double num = 0, den = 0, numb = 0, denb = 0;
    bool fin = true;
    for (int c = 0; c < h; ++c) {
      const size_t i = (size_t)b * h + c;
      fin = fin && std::isfinite(pg[0][i]) && (!kLN || std::isfinite(pb[0][i]));
      num += (pg[0][i] - rpg[i]) * (pg[0][i] - rpg[i]);
      den += rpg[i] * rpg[i];
      if (kLN) numb += (pb[0][i] - rpb[i]) * (pb[0][i] - rpb[i]), denb += rpb[i] * rpb[i];
    }
    const double e = den > 0 ? std::sqrt(num / den) : std::sqrt(num), eb = denb > 0 ? std::sqrt(numb / denb) : std::sqrt(numb);
    if (!fin || e > 1e-5 || eb > 1e-5) {
      parts_ok = false;
      std::printf("  block %u partial: dgamma rel err %.2e, dbeta %.2e%s\n", b, e, eb, fin ? "" : " (NaN: unwritten)");
    }
  }
  report(t + " rowblk per-block partial rows == float64 sums over the block's rows (1e-5)", parts_ok);
  {
    const auto s = colsum(pg[0], grid, h);
    near(t + " rowblk dgamma (partials summed)", std::vector<float>(s.begin(), s.end()), rdg, 1e-5);
  }
  if (kLN) {
    const auto s = colsum(pb[0], grid, h);
    near(t + " rowblk dbeta (partials summed)", std::vector<float>(s.begin(), s.end()), rdb, 1e-5);
  }
  report(t + " rowblk run twice bitwise (dx, partials)",
         std::memcmp(dx[0].data(), dx[1].data(), dx[0].size() * sizeof(T)) == 0 &&
             std::memcmp(pg[0].data(), pg[1].data(), pg[0].size() * sizeof(float)) == 0 &&
             (!kLN || std::memcmp(pb[0].data(), pb[1].data(), pb[0].size() * sizeof(float)) == 0));
  // The general kernel on 2 blocks of 8 warps: atomics (one partial row per block), deterministic
  // (one per warp, zeroed first).
  const auto ndx = as_d(dx[0]);
  const auto ndg = colsum(pg[0], grid, h), ndb = colsum(pb[0], grid, h);
  for (int det = 0; det < 2; ++det) {
    const unsigned og = 2;
    const int prow = det ? og * kWarps : og;
    std::vector<T> odx(rows * h, from_f<T>(NAN));
    std::vector<float> opg((size_t)prow * h, det ? 0.0f : NAN), opb((size_t)prow * h, det ? 0.0f : NAN);
    T* DX = odx.data();
    float *PG = opg.data(), *PB = opb.data();
    launch(og, kWarps * 32, det ? 0 : (kLN ? 2 : 1) * h, [&] {
      if (det)
        norm_bwd_kernel<kLN, true, T, G, T>(dy.data(), x.data(), g.data(), mean.data(), rstd.data(), DX, PG, PB, rows,
                                            h, gofs, true, true, res);
      else
        norm_bwd_kernel<kLN, false, T, G, T>(dy.data(), x.data(), g.data(), mean.data(), rstd.data(), DX, PG, PB,
                                             rows, h, gofs, true, true, res);
    });
    const std::string o = t + (det ? " old (deterministic)" : " old (atomics)");
    near(o + " dx vs float64", odx, rdx, 1e-2);
    near(o + " dx vs rowblk", odx, ndx, 1e-2);
    const auto s = colsum(opg, prow, h);
    near(o + " dgamma vs rowblk", std::vector<float>(s.begin(), s.end()), ndg, 1e-5);
    if (kLN) {
      const auto sb = colsum(opb, prow, h);
      near(o + " dbeta vs rowblk", std::vector<float>(sb.begin(), sb.end()), ndb, 1e-5);
    }
  }
}

int main() {
  std::mt19937 rng(12);
  run<false, bf16_t>(10, 4096, 3, true, false, rng);  // LLaMA's shape: 3-4 rows per block, + dres
  run<false, bf16_t>(10, 4096, 3, false, false, rng);
  run<true, float>(10, 4096, 3, true, true, rng);     // LayerNorm, fp32 gamma, gofs 1
  run<true, bf16_t>(11, 2048, 4, false, false, rng);  // 128 threads
  run<false, float>(9, 2048, 2, true, true, rng);
  run<true, bf16_t>(7, 1032, 3, true, false, rng);    // 96 threads, most second chunks empty
  run<false, bf16_t>(5, 5120, 2, true, false, rng);   // 320 threads
  run<true, float>(5, 8192, 2, false, false, rng);    // 512 threads, every chunk full
  run<false, bf16_t>(3, 8192, 2, true, true, rng);
  run<true, bf16_t>(3, 4096, 4, true, false, rng);    // fewer rows than blocks: block 3 writes zeros
  std::printf("%d failed\n", fails);
  return fails != 0;
}
