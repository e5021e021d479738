// Host emulation of norm.cu's register norm kernels and their pipelined versions (see
// norm_pipe_run.sh). Each block's threads run as std::threads: __syncthreads meets at the block's
// barrier, a shuffle at the warp's. cp.async is modelled as late as the PTX rules allow: a copy
// is queued in its thread's current group and performed (source read, shared memory written)
// only when cp.async.wait_group<N> needs that group complete, so a kernel that read a stage
// before waiting for it, or waited for the wrong group, reads the NaN poison. Checked: the
// pipelined kernels' y/mean/rstd and dx and dgamma/dbeta block partials bitwise equal to the
// unpipelined kernels' on the same grid, and all of them against float64 (fp32 1e-5, bf16 1e-2
// relative norm error).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "cuda_host_shim.h"  // CUDA keywords, threadIdx / blockIdx, bf16_t, to_f / from_f, ld8
#include "emu_check.h"        // fails, report, same, near
#undef __launch_bounds__
#define __launch_bounds__(...)

Dim3 gridDim, blockDim;
thread_local uint4* g_smem;
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
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }

// cp.async: per-thread groups of pending copies.
struct Copy {
  void* dst;
  const void* src;
  int bytes;
};
thread_local std::vector<Copy> g_open;
thread_local std::deque<std::vector<Copy>> g_groups;

namespace megatron::ops::cuda::detail {
using ::bf16_t;
using ::from_f;
using ::ld8;
using ::to_f;
inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0, v, o);
  return v;
}
inline void cp_async_16(void* s, const void* g) { g_open.push_back({s, g, 16}); }
inline void cp_async_4(void* s, const void* g) { g_open.push_back({s, g, 4}); }
inline void cp_async_commit_group() {
  g_groups.push_back(std::move(g_open));
  g_open.clear();
}
template <int N>
inline void cp_async_wait_group() {
  while ((int)g_groups.size() > N) {
    for (const Copy& c : g_groups.front()) std::memcpy(c.dst, c.src, c.bytes);
    g_groups.pop_front();
  }
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

// Runs kern on `grid` blocks of `threads` threads, one block at a time, with `smem` bytes of
// NaN-poisoned dynamic shared memory.
void launch(unsigned grid, int threads, size_t smem, const std::function<void()>& kern) {
  gridDim = {grid, 1, 1};
  blockDim = {(unsigned)threads, 1, 1};
  std::vector<uint4> sm(smem / 16 + 1);
  for (unsigned b = 0; b < grid; ++b) {
    std::memset(sm.data(), 0xff, sm.size() * 16);
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
        g_smem = sm.data();
        g_w = &ctx[t / 32];
        g_lane = t % 32;
        g_open.clear();
        g_groups.clear();
        kern();
        if (!g_open.empty() || !g_groups.empty()) std::printf("FAIL a thread exited with cp.async copies pending\n");
      });
    for (auto& t : th) t.join();
  }
}

template <bool kLN, int NC, class G>
void run(int64_t rows, int h, bool with_res, std::mt19937& rng) {
  using T = bf16_t;  // the pipelined kernels take bfloat16 rows
  std::normal_distribution<float> nd;
  auto rnd = [&](size_t n, float sc) {
    std::vector<T> v(n);
    for (auto& x : v) x = from_f<T>(sc * nd(rng));
    return v;
  };
  const auto x = rnd(rows * h, 2.0f), dy = rnd(rows * h, 1.0f), dr = rnd(rows * h, 1.0f);
  std::vector<G> g(h), be(h);
  for (int c = 0; c < h; ++c) g[c] = from_f<G>(to_f(from_f<T>(nd(rng)))), be[c] = from_f<G>(to_f(from_f<T>(nd(rng))));
  const float eps = 1e-5f, gofs = 0.0f;
  const double tol = 1e-2;  // bf16 outputs
  char tag[96];
  std::snprintf(tag, sizeof tag, "%s h=%d bf16 gamma %s%s", kLN ? "layernorm" : "rmsnorm", h,
                sizeof(G) == 4 ? "fp32" : "bf16", with_res ? " +dres" : "");
  // Forward: unpipelined and pipelined, both on 2 blocks of 8 warps.
  std::vector<T> y[2];
  std::vector<float> m[2], r[2];
  for (int p = 0; p < 2; ++p) {
    y[p].assign(rows * h, T{});
    m[p].assign(rows, NAN);
    r[p].assign(rows, NAN);
    auto* Y = y[p].data();
    auto* M = m[p].data();
    auto* R = r[p].data();
    if (p == 0)
      launch(2, kWarps * 32, 0, [&] {
        norm_fwd_reg_kernel<kLN, T, G>(x.data(), g.data(), be.data(), Y, M, R, rows, h, eps, gofs);
      });
    else
      launch(2, kFwdPipeWarps * 32, 16 * kFwdPipeWarps * kPipeStages * NC * 32, [&] {
        norm_fwd_pipe_kernel<kLN, NC, T, G>(x.data(), g.data(), be.data(), Y, M, R, rows, h, eps, gofs);
      });
  }
  report(std::string(tag) + " fwd pipelined == unpipelined bitwise (y, mean, rstd)",
         same(y[0], y[1]) && same(r[0], r[1]) && (!kLN || same(m[0], m[1])));
  // float64 reference
  std::vector<double> ry(rows * h), rdx(rows * h), rdg(h, 0.0), rdb(h, 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    double mean = 0, var = 0;
    if (kLN) {
      for (int c = 0; c < h; ++c) mean += to_f(x[i * h + c]);
      mean /= h;
    }
    for (int c = 0; c < h; ++c) var += (to_f(x[i * h + c]) - mean) * (to_f(x[i * h + c]) - mean);
    const double rstd = 1.0 / std::sqrt(var / h + eps);
    double a = 0, b = 0;
    for (int c = 0; c < h; ++c) {
      const double xh = (to_f(x[i * h + c]) - mean) * rstd, d = to_f(dy[i * h + c]);
      ry[i * h + c] = xh * to_f(g[c]) + (kLN ? to_f(be[c]) : 0.0);
      a += d * to_f(g[c]);
      b += d * to_f(g[c]) * xh;
      rdg[c] += d * xh;
      rdb[c] += d;
    }
    a /= h;
    b /= h;
    for (int c = 0; c < h; ++c) {
      const double xh = (to_f(x[i * h + c]) - mean) * rstd, dxh = to_f(dy[i * h + c]) * to_f(g[c]);
      rdx[i * h + c] = rstd * (dxh - (kLN ? a : 0.0) - xh * b) + (with_res ? to_f(dr[i * h + c]) : 0.0);
    }
  }
  near(std::string(tag) + " fwd y (pipelined)", y[1], ry, tol);
  // Backward on the forward's statistics: the same grid for both (3 blocks of 4 warps).
  const unsigned grid = 3;
  std::vector<T> dx[2];
  std::vector<float> pg[2], pb[2];
  for (int p = 0; p < 2; ++p) {
    dx[p].assign(rows * h, T{});
    pg[p].assign(grid * h, NAN);
    pb[p].assign(grid * h, NAN);
    auto* DX = dx[p].data();
    auto* PG = pg[p].data();
    auto* PB = pb[p].data();
    const T* res = with_res ? dr.data() : nullptr;
    if (p == 0)
      launch(grid, kRegWarps * 32, 0, [&] {
        norm_bwd_reg_kernel<kLN, T, G>(dy.data(), x.data(), g.data(), m[0].data(), r[0].data(), DX, PG, PB, rows, h,
                                       gofs, res);
      });
    else
      launch(grid, kRegWarps * 32, bwd_pipe_smem(NC, with_res), [&] {
        norm_bwd_pipe_kernel<kLN, NC, T, G>(dy.data(), x.data(), g.data(), m[0].data(), r[0].data(), DX, PG, PB, rows,
                                            h, gofs, res);
      });
  }
  report(std::string(tag) + " bwd pipelined == unpipelined bitwise (dx, dgamma/dbeta partials)",
         same(dx[0], dx[1]) && same(pg[0], pg[1]) && (!kLN || same(pb[0], pb[1])));
  near(std::string(tag) + " bwd dx (pipelined)", dx[1], rdx, tol);
  std::vector<double> sg(h, 0.0), sb(h, 0.0);
  for (unsigned b = 0; b < grid; ++b)
    for (int c = 0; c < h; ++c) sg[c] += pg[1][b * h + c], sb[c] += pb[1][b * h + c];
  std::vector<float> sgf(sg.begin(), sg.end()), sbf(sb.begin(), sb.end());
  near(std::string(tag) + " bwd dgamma (pipelined partials summed)", sgf, rdg, 1e-5);
  if (kLN) near(std::string(tag) + " bwd dbeta (pipelined partials summed)", sbf, rdb, 1e-5);
}

int main() {
  std::mt19937 rng(11);
  // 96 rows: 6 per forward warp (2 blocks of 8 warps), 8 per backward warp (3 blocks of 4), so
  // every stage ring wraps at least twice; fewer rows than warps at the end.
  const int64_t rows = 96;
  run<true, 3, bf16_t>(rows, 768, true, rng);  // GPT-2 (+ the residual gradient)
  run<true, 3, bf16_t>(rows, 768, false, rng);
  run<false, 3, float>(rows, 768, true, rng);  // fp32 gamma
  run<true, 4, float>(rows, 1000, true, rng);  // 4 chunks, the last partial; 2 backward stages
  run<false, 4, bf16_t>(rows, 1024, false, rng);
  run<true, 1, bf16_t>(rows, 256, true, rng);  // 1 chunk (+ dres: the NC = 1 fma case of norm_bwd_row)
  run<false, 1, float>(rows, 256, true, rng);
  run<true, 3, float>(rows, 520, false, rng);  // 3 chunks, the last partial
  run<true, 2, bf16_t>(7, 512, true, rng);     // fewer rows than warps
  std::printf("%d failed\n", fails);
  return fails != 0;
}
