// Host emulation of the multi-tensor Adam kernels of megatron/core/ops/cuda/adam_multi.cu (see
// adam_multi_run.sh): the kernel source (Desc, the v1 kernel, adam_tile and the u2/u4 kernel), the
// element update of adam_update.cuh and the accesses of streaming.cuh, compiled as C++ with host
// stand-ins for the CUDA intrinsics; every block's threads run one after the other (thread 0
// first: v1's table search before its barrier). Checks the kernels' indexing where no GPU is
// available: tensors of 1 .. 100003 elements (tails of every kind, a tensor of exactly one tile,
// one not 16-byte aligned so the element path runs), every tensor covered once, with
//  1. v1 against a float64 evaluation of the same formula: params, exp_avg, exp_avg_sq within
//     1e-6 relative norm error (a few fp32 roundings of values of order 1), the bf16 model param
//     within 4e-3 (bf16 keeps 8 significant bits: rounding <= 2^-8 = 3.9e-3 relative), and the elements
//     around every tensor untouched;
//  2. u2 and u4, with and without the evict-first hints, on persistent grids of 1, 3, 7 and 528
//     blocks and on one block per tile, bit-identical to v1 in every array (the same element
//     update compiled once here; on the GPU dev/cuda/adam_multi and gpu_ops_test check the bits).
// The GPU itself is checked by gpu_ops_test --only adam and tests/gpu/adamperf_check.sh.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "megatron/core/tensor/dtype.h"

#include "cuda_host_shim.h"

#undef __launch_bounds__
#define __launch_bounds__(...)

Dim3 gridDim, blockDim;
struct alignas(16) float4 {
  float x, y, z, w;
};
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
template <class T>
inline T __ldcs(const T* p) { return *p; }
template <class T>
inline void __stcs(T* p, T v) { *p = v; }
using std::min;

namespace megatron::ops {
constexpr int64_t kAdamTableBytesPerTensor = 128;  // stand-in for ops.h's sizing constant
}

namespace megatron::ops::cuda {
namespace {
// cuda_common.cuh's st8, element stores (the vector branch is the GPU's).
template <class T>
inline void st8(T* p, int64_t i, int64_t n, bool, const float (&f)[8]) {
  for (int j = 0; j < 8; ++j)
    if (i + j < n) p[i + j] = from_f<T>(f[j]);
}
#include "streaming.inc"
#include "update.inc"
#include "kernels.inc"
}  // namespace
}  // namespace megatron::ops::cuda

using namespace megatron::ops::cuda;

namespace {

int g_fail = 0, g_total = 0;

void expect(bool ok, const std::string& what) {
  ++g_total;
  if (!ok) ++g_fail;
  std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
}

/// Host arrays of one tensor: p, g, m, v (fp32) and the bf16 model param, one element of slack in
/// front so the tensor can start 4 bytes past a 16-byte boundary.
struct Arrays {
  std::vector<float> p, g, m, v;
  std::vector<bf16_t> mp;
  int off = 0;
  float* P() { return p.data() + off; }
  float* G() { return g.data() + off; }
  float* M() { return m.data() + off; }
  float* V() { return v.data() + off; }
  bf16_t* MP() { return mp.data() + off; }
};

struct Case {
  std::vector<int64_t> sizes;
  size_t misaligned;  // index of the tensor at a 4-byte offset
};

std::vector<Arrays> init(const Case& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<Arrays> a(c.sizes.size());
  for (size_t k = 0; k < c.sizes.size(); ++k) {
    const int64_t n = c.sizes[k] + 4;
    a[k].off = k == c.misaligned ? 1 : 0;
    a[k].p.resize(n), a[k].g.resize(n), a[k].m.resize(n), a[k].v.resize(n), a[k].mp.assign(n, bf16_t{0x7fc0});
    for (int64_t i = 0; i < n; ++i) {
      a[k].p[i] = nd(rng);
      a[k].g[i] = 0.1f * nd(rng);
      a[k].m[i] = 0.01f * nd(rng);
      a[k].v[i] = 0.01f * std::fabs(nd(rng));
    }
  }
  return a;
}

constexpr float kB1 = 0.9f, kB2 = 0.95f, kEps = 1e-8f, kGscale = 0.61f;
constexpr int kStep = 7;
float lr_of(size_t k) { return 1e-3f * (1 + k % 3); }
float wd_of(size_t k) { return k % 4 == 1 ? 0.0f : 0.1f; }

/// The table of `a` for a launch whose blocks (v1) or tiles (u2/u4) hold `chunk` elements; `blocks`
/// gets their count. vec as adam_step_multi sets it (every pointer 16-byte aligned).
std::vector<Desc> table(std::vector<Arrays>& a, const Case& c, int64_t chunk, int64_t& blocks) {
  std::vector<Desc> ds;
  blocks = 0;
  for (size_t k = 0; k < a.size(); ++k) {
    Desc d{};
    d.p = a[k].P(), d.g = a[k].G(), d.m = a[k].M(), d.v = a[k].V(), d.mp = a[k].MP();
    d.n = c.sizes[k];
    d.first_block = blocks;
    d.lr = lr_of(k), d.wd = wd_of(k);
    auto al = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15u) == 0; };
    d.vec = al(d.p) && al(d.g) && al(d.m) && al(d.v) && al(d.mp);
    ds.push_back(d);
    blocks += (d.n + chunk - 1) / chunk;
  }
  return ds;
}

float bc(float b) { return static_cast<float>(1.0 - std::pow((double)b, (double)kStep)); }

void run_v1(std::vector<Arrays>& a, const Case& c, bool decoupled) {
  int64_t blocks = 0;
  std::vector<Desc> ds = table(a, c, kChunk, blocks);
  gridDim.x = (unsigned)blocks;
  for (int64_t b = 0; b < blocks; ++b) {
    blockIdx.x = (unsigned)b;
    for (unsigned t = 0; t < (unsigned)kThreads; ++t) {  // thread 0 first: it sets s_t
      threadIdx.x = t;
      adam_multi_kernel<bf16_t>(ds.data(), (int)ds.size(), kB1, kB2, kEps, bc(kB1), bc(kB2), decoupled, kGscale);
    }
  }
}

template <int U, bool kCs>
void run_v2(std::vector<Arrays>& a, const Case& c, bool decoupled, int64_t grid_cap) {
  int64_t tiles = 0;
  std::vector<Desc> ds = table(a, c, int64_t{kT2} * 4 * U, tiles);
  const int64_t grid = grid_cap > 0 ? std::min(tiles, grid_cap) : tiles;
  gridDim.x = (unsigned)grid;
  for (int64_t b = 0; b < grid; ++b) {
    blockIdx.x = (unsigned)b;
    for (unsigned t = 0; t < (unsigned)kT2; ++t) {
      threadIdx.x = t;
      adam_multi_v2_kernel<bf16_t, U, kCs>(ds.data(), (int)ds.size(), tiles, kB1, kB2, kEps, bc(kB1), bc(kB2),
                                           decoupled, kGscale);
    }
  }
}

bool same(const std::vector<Arrays>& x, const std::vector<Arrays>& y) {
  for (size_t k = 0; k < x.size(); ++k) {
    if (std::memcmp(x[k].p.data(), y[k].p.data(), x[k].p.size() * 4) || std::memcmp(x[k].m.data(), y[k].m.data(), x[k].m.size() * 4) ||
        std::memcmp(x[k].v.data(), y[k].v.data(), x[k].v.size() * 4) || std::memcmp(x[k].mp.data(), y[k].mp.data(), x[k].mp.size() * 2))
      return false;
  }
  return true;
}

/// Relative norm errors of got against the float64 formula over all tensors: err32 of the fp32
/// arrays (params, exp_avg, exp_avg_sq), err16 of the bf16 model param; slack_ok: the elements
/// around each tensor untouched.
void v1_error(const std::vector<Arrays>& got, const std::vector<Arrays>& in, const Case& c, bool decoupled,
              double& err32, double& err16, bool& slack_ok) {
  double num[2] = {0, 0}, den[2] = {0, 0};
  const double b1c = 1 - std::pow((double)kB1, kStep), b2c = 1 - std::pow((double)kB2, kStep);
  slack_ok = true;
  for (size_t k = 0; k < got.size(); ++k) {
    const int o = got[k].off;
    const int64_t n = c.sizes[k], len = (int64_t)got[k].p.size();
    for (int64_t i = 0; i < len; ++i) {
      if (i < o || i >= o + n) {
        slack_ok = slack_ok && got[k].p[i] == in[k].p[i] && got[k].m[i] == in[k].m[i] && got[k].v[i] == in[k].v[i] &&
                   got[k].mp[i].b == 0x7fc0;
        continue;
      }
      const double p = in[k].p[i], g = (double)(in[k].g[i] * kGscale), wd = wd_of(k), lr = lr_of(k);
      const double gi = decoupled ? g : g + wd * p;
      const double m = kB1 * (double)in[k].m[i] + (1 - (double)kB1) * gi;
      const double v = kB2 * (double)in[k].v[i] + (1 - (double)kB2) * gi * gi;
      const double upd = (m / b1c) / (std::sqrt(v / b2c) + kEps) + (decoupled ? wd * p : 0.0);
      const double pn = p - lr * upd;
      const double d[4] = {got[k].p[i] - pn, got[k].m[i] - m, got[k].v[i] - v, to_f(got[k].mp[i]) - pn};
      const double r[4] = {pn, m, v, pn};
      for (int j = 0; j < 4; ++j) {
        num[j == 3] += d[j] * d[j];
        den[j == 3] += r[j] * r[j];
      }
    }
  }
  err32 = std::sqrt(num[0] / den[0]);
  err16 = std::sqrt(num[1] / den[1]);
}

}  // namespace

int main() {
  const std::vector<Case> cases = {
      {{1, 3, 5, 768, 2048, 4096, 4099, 8192, 8193, 100003, 70001, 2047, 2049, 12288}, 10},
      {{5}, 99},
      {{100001, 768, 5, 8192 * 3 + 17, 8192}, 3},
  };
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& c = cases[ci];
    for (bool dec : {true, false}) {
      const std::string tag = "case " + std::to_string(ci) + " (" + std::to_string(c.sizes.size()) + " tensors) " +
                              (dec ? "adamw" : "L2");
      const std::vector<Arrays> in = init(c, 17 + ci);
      std::vector<Arrays> ref = in;
      run_v1(ref, c, dec);
      bool slack_ok = false;
      double e32 = 1, e16 = 1;
      v1_error(ref, in, c, dec, e32, e16, slack_ok);
      char line[200];
      std::snprintf(line, sizeof line,
                    "%s v1 vs float64 formula: fp32 arrays rel err %.2e (tol 1e-6), bf16 param %.2e (tol 4e-3), "
                    "outside the tensors untouched: %s",
                    tag.c_str(), e32, e16, slack_ok ? "yes" : "NO");
      expect(e32 <= 1e-6 && e16 <= 4e-3 && slack_ok, line);
      for (int64_t cap : {int64_t{1}, int64_t{3}, int64_t{7}, int64_t{528}, int64_t{0}}) {
        const std::string grid = cap ? "grid " + std::to_string(cap) : std::string("one block per tile");
        std::vector<Arrays> x = in;
        run_v2<2, true>(x, c, dec, cap);
        expect(same(x, ref), tag + " u2 " + grid + " bit-identical to v1");
        x = in;
        run_v2<2, false>(x, c, dec, cap);
        expect(same(x, ref), tag + " u2plain " + grid + " bit-identical to v1");
        x = in;
        run_v2<4, true>(x, c, dec, cap);
        expect(same(x, ref), tag + " u4 " + grid + " bit-identical to v1");
      }
    }
  }
  std::printf("%s: %d of %d checks passed\n", g_fail ? "FAIL" : "PASS", g_total - g_fail, g_total);
  return g_fail ? 1 : 0;
}
