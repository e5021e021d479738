// Host emulation of the kernels of megatron/core/ops/cuda/attention_generic.cu (see run.sh): each
// warp's 32 lanes run as 32 threads in lockstep at every shuffle / __syncwarp (std::barrier).
// Checked against a float64 reference written here from the attention formulas.
#include <thread>
#include <cmath>
#include <cstdio>
#include <vector>
#include <random>
#include <algorithm>
#include <functional>
#include "cuda_host_shim.h"  // CUDA keywords, threadIdx / blockIdx, bf16_t, to_f / from_f
thread_local float* g_smem;
struct WarpCtx { std::barrier<>* bar; float slots[32]; };
thread_local WarpCtx* g_w;
thread_local int g_lane;
inline float __shfl_sync(unsigned, float v, int src) {
  g_w->slots[g_lane] = v; g_w->bar->arrive_and_wait(); float r = g_w->slots[src]; g_w->bar->arrive_and_wait(); return r;
}
inline float __shfl_xor_sync(unsigned, float v, int m) { return __shfl_sync(0, v, g_lane ^ m); }
inline void __syncwarp() { g_w->bar->arrive_and_wait(); }
inline int min(int a, int b) { return a < b ? a : b; }
namespace megatron::ops::cuda::detail {
using ::bf16_t;
using ::to_f;
using ::from_f;
inline float warp_sum(float v) { for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0, v, o); return v; }
inline float warp_max(float v) { for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0, v, o)); return v; }
}
#include "dstream.inc"
namespace megatron::ops::cuda::generic_attention {
using namespace megatron::ops::cuda::detail;
#include "kernels.inc"
}  // anonymous
// launch: blocks x 4 warps, each warp 32 threads
template <class F>
void launch(int64_t rows, int smem_floats, F kern) {
  const int64_t blocks = (rows + kWarps - 1) / kWarps;
  std::vector<float> sm(smem_floats);
  for (int64_t b = 0; b < blocks; ++b)
    for (int w = 0; w < kWarps; ++w) {
      std::barrier<> bar(32);
      WarpCtx ctx{&bar, {}};
      std::vector<std::thread> th;
      for (int l = 0; l < 32; ++l)
        th.emplace_back([&, l] { threadIdx.x = w * 32 + l; blockIdx.x = (unsigned)b; g_smem = sm.data(); g_w = &ctx; g_lane = l; kern(); });
      for (auto& t : th) t.join();
    }
}
}  // namespace megatron::ops::cuda::generic_attention
using namespace megatron::ops::cuda::generic_attention;
using namespace megatron::ops::cuda::detail;

uint64_t rmix(uint64_t x) { x += 0x9e3779b97f4a7c15ull; x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull; x = (x ^ (x >> 27)) * 0x94d049bb133111ebull; return x ^ (x >> 31); }
double keep(uint64_t seed, uint64_t off, uint64_t idx, float p) {
  if (p <= 0) return 1.0; uint64_t st = rmix(seed ^ rmix(off)); float u = (float)(rmix(st + idx) >> 40) * (1.0f / 16777216.0f);
  return u >= p ? (double)(1.0f / (1.0f - p)) : 0.0;
}
int fails = 0;
void check(const char* nm, const std::vector<float>& got, const std::vector<double>& ref, double tol) {
  double num = 0, den = 0; bool nan = false;
  for (size_t i = 0; i < got.size(); ++i) { if (!std::isfinite(got[i])) nan = true; double d = got[i] - ref[i]; num += d * d; den += ref[i] * ref[i]; }
  double e = std::sqrt(num / std::max(den, 1e-300)); bool ok = !nan && e <= tol; fails += !ok;
  std::printf("%s %-50s %.3e\n", ok ? "PASS" : "FAIL", nm, e);
}
template <class T>
void run(int S, int SK, int B, int NP, int NG, int D, bool causal, bool usemask, float drop, const char* name) {
  std::mt19937 rng(7); std::normal_distribution<float> nd;
  auto rnd = [&](size_t n) { std::vector<float> v(n); for (auto& x : v) x = to_f(from_f<T>(nd(rng))); return v; };
  auto q = rnd((size_t)S * B * NP * D), k = rnd((size_t)SK * B * NG * D), v = rnd((size_t)SK * B * NG * D), dout = rnd((size_t)S * B * NP * D);
  std::vector<uint8_t> mask((size_t)B * S * SK, 0);
  std::bernoulli_distribution bm(0.3);
  if (usemask) for (int b = 0; b < B; ++b) for (int i = 0; i < S; ++i) for (int j = 0; j < SK; ++j) mask[((size_t)b * S + i) * SK + j] = (i != j) && bm(rng);
  auto tT = [](const std::vector<float>& x) { std::vector<T> r(x.size()); for (size_t i = 0; i < x.size(); ++i) r[i] = from_f<T>(x[i]); return r; };
  auto tF = [](const std::vector<T>& x) { std::vector<float> r(x.size()); for (size_t i = 0; i < x.size(); ++i) r[i] = to_f(x[i]); return r; };
  auto Q = tT(q), K = tT(k), V = tT(v), DO = tT(dout);
  std::vector<T> O(q.size()), DQ(q.size()), DK(k.size()), DV(k.size());
  std::vector<float> L((size_t)B * NP * S), Dv((size_t)B * NP * S);
  Args a{}; a.S = S; a.SK = SK; a.B = B; a.NP = NP; a.NG = NG; a.D = D; a.scale = 1.0f / std::sqrt((float)D); a.causal = causal;
  a.mask = usemask ? mask.data() : nullptr; a.drop_p = drop; a.drop_scale = drop > 0 ? 1.0f / (1.0f - drop) : 1.0f; a.stream = ddropout_stream(1234, 77);
  int npl = D <= 32 ? 1 : D <= 64 ? 2 : D <= 128 ? 4 : 8;
  auto go = [&](auto N) {
    constexpr int n = decltype(N)::value;
    launch((int64_t)B * NP * S, kWarps * D, [&] { fwd_kernel<T, n>(Q.data(), K.data(), V.data(), O.data(), L.data(), a); });
    launch((int64_t)B * NP * S, kWarps * 2 * D, [&] { bwd_dq_kernel<T, n>(DO.data(), Q.data(), K.data(), V.data(), O.data(), L.data(), Dv.data(), DQ.data(), a); });
    launch((int64_t)B * NG * SK, kWarps * 2 * D, [&] { bwd_dkdv_kernel<T, n>(DO.data(), Q.data(), K.data(), V.data(), L.data(), Dv.data(), DK.data(), DV.data(), a); });
  };
  if (npl == 1) go(std::integral_constant<int, 1>{}); else if (npl == 2) go(std::integral_constant<int, 2>{}); else if (npl == 4) go(std::integral_constant<int, 4>{}); else go(std::integral_constant<int, 8>{});
  // reference
  int npg = NP / NG;
  std::vector<double> ro(q.size()), rl(L.size()), rdq(q.size(), 0), rdk(k.size(), 0), rdv(k.size(), 0), P(SK), F(SK), dP(SK);
  auto qi = [&](int i, int b, int h, int c) { return (((size_t)i * B + b) * NP + h) * D + c; };
  auto ki = [&](int j, int b, int g, int c) { return (((size_t)j * B + b) * NG + g) * D + c; };
  for (int b = 0; b < B; ++b) for (int h = 0; h < NP; ++h) { int g = h / npg;
    for (int i = 0; i < S; ++i) { double m = -1e300;
      for (int j = 0; j < SK; ++j) { bool vis = usemask ? !mask[((size_t)b * S + i) * SK + j] : (!causal || j <= i); double sc = -INFINITY;
        if (vis) { sc = 0; for (int c = 0; c < D; ++c) sc += (double)q[qi(i, b, h, c)] * k[ki(j, b, g, c)]; sc *= a.scale; }
        P[j] = sc; m = std::max(m, sc); F[j] = keep(1234, 77, (((uint64_t)b * NP + h) * S + i) * SK + j, drop); }
      double sum = 0; for (int j = 0; j < SK; ++j) sum += (P[j] = std::exp(P[j] - m)); for (int j = 0; j < SK; ++j) P[j] /= sum;
      rl[((size_t)b * NP + h) * S + i] = m + std::log(sum);
      for (int c = 0; c < D; ++c) { double acc = 0; for (int j = 0; j < SK; ++j) acc += P[j] * F[j] * v[ki(j, b, g, c)]; ro[qi(i, b, h, c)] = acc; }
      double ds_ = 0; for (int j = 0; j < SK; ++j) { double acc = 0; for (int c = 0; c < D; ++c) acc += (double)dout[qi(i, b, h, c)] * v[ki(j, b, g, c)]; dP[j] = acc * F[j]; ds_ += dP[j] * P[j]; }
      for (int j = 0; j < SK; ++j) { double ds = P[j] * (dP[j] - ds_) * a.scale;
        for (int c = 0; c < D; ++c) { rdq[qi(i, b, h, c)] += ds * k[ki(j, b, g, c)]; rdk[ki(j, b, g, c)] += ds * q[qi(i, b, h, c)]; rdv[ki(j, b, g, c)] += P[j] * F[j] * dout[qi(i, b, h, c)]; } } } }
  double tol = sizeof(T) == 4 ? 1e-5 : 1e-2; char nm[200];
  std::snprintf(nm, sizeof nm, "%s %s out", name, sizeof(T) == 4 ? "fp32" : "bf16"); check(nm, tF(O), ro, tol);
  std::snprintf(nm, sizeof nm, "%s %s lse", name, sizeof(T) == 4 ? "fp32" : "bf16"); check(nm, L, rl, 1e-5);
  std::snprintf(nm, sizeof nm, "%s %s dq", name, sizeof(T) == 4 ? "fp32" : "bf16"); check(nm, tF(DQ), rdq, tol);
  std::snprintf(nm, sizeof nm, "%s %s dk", name, sizeof(T) == 4 ? "fp32" : "bf16"); check(nm, tF(DK), rdk, tol);
  std::snprintf(nm, sizeof nm, "%s %s dv", name, sizeof(T) == 4 ? "fp32" : "bf16"); check(nm, tF(DV), rdv, tol);
}
int main() {
  run<float>(37, 37, 2, 4, 2, 3, true, false, 0.0f, "d3 causal gqa");
  run<float>(20, 45, 1, 3, 3, 40, false, false, 0.0f, "d40 full s!=sk");
  run<float>(24, 24, 2, 6, 2, 12, false, true, 0.0f, "d12 mask gqa3");
  run<float>(33, 33, 1, 4, 1, 80, true, false, 0.2f, "d80 causal mqa drop");
  run<bf16_t>(21, 21, 1, 2, 1, 96, true, false, 0.1f, "d96 causal drop");
  run<float>(18, 40, 1, 2, 2, 256, true, false, 0.0f, "d256 causal sk>s");
  run<bf16_t>(16, 16, 2, 2, 2, 3, true, false, 0.1f, "d3 example-like drop");
  std::printf("%d failed\n", fails);
  return fails != 0;
}
