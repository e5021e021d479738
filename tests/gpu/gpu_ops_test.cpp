// GPU kernel checks: every op of megatron/core/ops/cuda against an independent float64 host
// reference written here from the formulas in ops.h (fresh random inputs each run; the seed is
// printed and can be fixed with --seed N). Outputs are poisoned with NaN before each call, so an
// unwritten element fails. Tolerances (docs/architecture.md#testing): relative norm error
// ||got - ref|| / ||ref|| <= 1e-5 for float32 outputs computed from float32 inputs, <= 1e-2 for
// bfloat16 outputs (bf16 has an 8-bit mantissa: rounding alone gives ~2e-3) and for results of
// bf16 tensor-core arithmetic (attention rounds P and dS to bf16 like FlashAttention does).
// Usage: gpu_ops_test [--seed N] [--small] [--only GROUP,...]   (--small: tiny shapes, for
// compute-sanitizer; --only: run the named groups, e.g. attention,elementwise; attn_generic = the
// generic attention kernels and the CPU-equal dropout stream; attn_dropout = attention dropout in the
// flash kernels against the stream, the float64 reference and the generic kernels; attn_det = the
// deterministic flash backward: two calls bitwise equal, against the float64 reference)
// Exit status 0 iff every check passed.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "megatron/core/ops/cpu/cpu_ops.h"
#include "megatron/core/ops/cuda/cuda_ops.h"
#include "megatron/core/ops/cuda/attention_decode.h"
#include "megatron/core/ops/cuda/expert_lanes.h"
#include "megatron/core/ops/cuda/moe_capacity.h"
#include "megatron/core/ops/cuda/moe_gating_f64.h"
#include "megatron/core/ops/cuda/cudnn_attention.h"
#include "megatron/core/ops/cuda/variants.h"
#include "megatron/core/ops/deterministic.h"
#include "megatron/core/tensor/tensor.h"
#include "megatron/core/inference/text_generation.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/ops/device.h"
#include "bench/gpu/moe_layer_leg.h"
#include "megatron/core/transformer/moe/moe_layer.h"
#include "megatron/core/transformer/moe/moe_utils.h"

using namespace megatron;
namespace cu = megatron::ops::cuda;
using V = std::vector<float>;
using VD = std::vector<double>;

namespace {
std::mt19937_64 g_rng;
bool g_small = false;
std::string g_only;  // --only a,b: run only these groups
int g_fail = 0, g_total = 0;

V randn(int64_t n, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  V v(n);
  for (auto& x : v) x = d(g_rng);
  return v;
}
V uniform(int64_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  V v(n);
  for (auto& x : v) x = d(g_rng);
  return v;
}
float round_to(float x, DType dt) {
  if (dt == DType::kBFloat16) return round_bf16(x);
  if (dt == DType::kFloat16) return round_fp16(x);
  return x;
}
V rounded(V v, DType dt) {
  for (auto& x : v) x = round_to(x, dt);
  return v;
}
Tensor dev(const V& v, const Shape& s, DType dt) {
  Tensor t = Tensor::from_vector(v, s);
  if (dt != DType::kFloat32) t = t.to(dt);
  return t.to(Device::cuda());
}
Tensor dev_i64(const std::vector<int64_t>& v, const Shape& s) { return Tensor::from_vector_i64(v, s).to(Device::cuda()); }
Tensor poisoned(const Shape& s, DType dt) {
  Tensor t = Tensor::empty(s, dt, Device::cuda());
  cu::fill(t, NAN);
  return t;
}
V host(const Tensor& t) { return t.to_float_vector(); }
Tensor dev_f64(const VD& v, const Shape& s) {
  Tensor t = Tensor::empty(s, DType::kFloat64, Device::cpu());
  std::copy(v.begin(), v.end(), t.data<double>());
  return t.to(Device::cuda());
}

const char* dn(DType d) { return dtype_name(d); }

void check(const std::string& name, const V& got, const VD& ref, double tol) {
  ++g_total;
  double num = 0, den = 0;
  bool nan = got.size() != ref.size();
  for (size_t i = 0; i < got.size() && i < ref.size(); ++i) {
    if (!std::isfinite(got[i]) && std::isfinite(ref[i])) nan = true;
    double d = (double)got[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  double err = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  bool ok = !nan && err <= tol;
  if (!ok) ++g_fail;
  std::printf("%-4s %-58s rel_err %.3e (tol %.0e)%s\n", ok ? "PASS" : "FAIL", name.c_str(), err, tol,
              nan ? " NaN/size mismatch" : "");
}
void check_true(const std::string& name, bool ok, const std::string& detail = "") {
  ++g_total;
  if (!ok) ++g_fail;
  std::printf("%-4s %-58s %s\n", ok ? "PASS" : "FAIL", name.c_str(), detail.c_str());
}
// Whether two tensors hold the same bytes (any devices).
bool same_bytes(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.to(Device::cpu()), hb = b.to(Device::cpu());
  return ha.dtype() == hb.dtype() && ha.nbytes() == hb.nbytes() &&
         std::memcmp(ha.data_ptr(), hb.data_ptr(), ha.nbytes()) == 0;
}

double tol_for(DType out) { return out == DType::kFloat32 ? 1e-5 : 1e-2; }
VD to_d(const V& v) { return VD(v.begin(), v.end()); }

// ------------------------------------------------------------------------------------------
void test_elementwise() {
  const int64_t n = g_small ? 1001 : 100003;
  for (DType src : {DType::kFloat32, DType::kBFloat16}) {
    for (DType dst : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      V x = rounded(randn(n), src);
      Tensor t = dev(x, {n}, src), o = poisoned({n}, dst);
      cu::cast(t, o);
      VD ref(n);
      for (int64_t i = 0; i < n; ++i) ref[i] = round_to(x[i], dst);
      check(std::string("cast ") + dn(src) + "->" + dn(dst), host(o), ref, 0.0);
    }
  }
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    Tensor o = poisoned({n}, dt);
    cu::fill(o, 0.375f);
    check(std::string("fill ") + dn(dt), host(o), VD(n, 0.375), 0.0);
    Tensor z = poisoned({n}, dt);
    cu::fill(z, 0.0f);
    check(std::string("fill zero ") + dn(dt), host(z), VD(n, 0.0), 0.0);
  }
  for (auto [yd, xd] : {std::pair{DType::kFloat32, DType::kBFloat16}, std::pair{DType::kFloat32, DType::kFloat32},
                        std::pair{DType::kBFloat16, DType::kBFloat16}}) {
    V y = rounded(randn(n), yd), x = rounded(randn(n), xd);
    Tensor ty = dev(y, {n}, yd), tx = dev(x, {n}, xd);
    cu::add_(ty, tx, -0.7f);
    VD ref(n);
    for (int64_t i = 0; i < n; ++i) ref[i] = y[i] + (double)-0.7f * x[i];
    check(std::string("add_ y ") + dn(yd) + " += a*x " + dn(xd), host(ty), ref, tol_for(yd));
    cu::scale_(ty, 3.0f);
    V got = host(ty);
    VD r2(n);
    for (int64_t i = 0; i < n; ++i) r2[i] = 3.0 * ref[i];
    check(std::string("scale_ ") + dn(yd), got, r2, tol_for(yd));
  }
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    V x = rounded(randn(n), dt);
    int64_t zeros = 0;
    for (int64_t i = 0; i < n; i += 7) x[i] = 0.0f;
    double ss = 0;
    for (float v : x) {
      ss += (double)v * v;
      zeros += v == 0.0f;
    }
    Tensor t = dev(x, {n}, dt);
    double got = cu::sum_of_squares(t);
    check(std::string("sum_of_squares ") + dn(dt), {(float)got}, {ss}, 1e-6);
    {  // several tensors (odd sizes, an empty one, unaligned views), one synchronization
      V y = rounded(randn(n / 3 + 5), dt);
      double ssy = 0;
      for (float v : y) ssy += (double)v * v;
      Tensor ty = dev(y, {(int64_t)y.size()}, dt), te = Tensor::empty({0}, dt, Device::cuda());
      double many = cu::sum_of_squares_many({t, te, ty});
      check(std::string("sum_of_squares_many ") + dn(dt), {(float)many}, {ss + ssy}, 1e-6);
    }
    check_true(std::string("count_zeros ") + dn(dt), cu::count_zeros(t) == zeros,
               std::to_string(cu::count_zeros(t)) + " vs " + std::to_string(zeros));
    check_true(std::string("has_inf_or_nan clean ") + dn(dt), !cu::has_inf_or_nan(t));
    x[n / 2] = INFINITY;
    Tensor ti = dev(x, {n}, dt);
    check_true(std::string("has_inf_or_nan inf ") + dn(dt), cu::has_inf_or_nan(ti));
    x[n / 2] = NAN;
    Tensor tn = dev(x, {n}, dt);
    check_true(std::string("has_inf_or_nan nan ") + dn(dt), cu::has_inf_or_nan(tn));
  }
}

void test_activations() {
  const int64_t rows = g_small ? 7 : 257, f = g_small ? 40 : 1000;
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    for (bool th : {false, true}) {
      const int64_t n = rows * f;
      V x = rounded(randn(n, 2.0f), dt), dy = rounded(randn(n), dt);
      Tensor tx = dev(x, {rows, f}, dt), tdy = dev(dy, {rows, f}, dt), y = poisoned({rows, f}, dt),
             dx = poisoned({rows, f}, dt);
      cu::gelu_forward(tx, y, th);
      cu::gelu_backward(tdy, tx, dx, th);
      VD ry(n), rdx(n);
      for (int64_t i = 0; i < n; ++i) {
        double v = x[i];
        if (th) {
          double k0 = std::sqrt(2.0 / M_PI), u = k0 * (v + 0.044715 * v * v * v), t = std::tanh(u);
          ry[i] = 0.5 * v * (1 + t);
          rdx[i] = dy[i] * (0.5 * (1 + t) + 0.5 * v * (1 - t * t) * k0 * (1 + 3 * 0.044715 * v * v));
        } else {
          double cdf = 0.5 * (1 + std::erf(v / std::sqrt(2.0)));
          ry[i] = v * cdf;
          rdx[i] = dy[i] * (cdf + v * std::exp(-0.5 * v * v) / std::sqrt(2 * M_PI));
        }
      }
      std::string nm = std::string(th ? "gelu_tanh " : "gelu_erf ") + dn(dt);
      check(nm + " fwd", host(y), ry, tol_for(dt));
      check(nm + " bwd", host(dx), rdx, tol_for(dt));
    }
    // SwiGLU
    V x = rounded(randn(rows * 2 * f, 2.0f), dt), dy = rounded(randn(rows * f), dt);
    Tensor tx = dev(x, {rows, 2 * f}, dt), tdy = dev(dy, {rows, f}, dt), y = poisoned({rows, f}, dt),
           dx = poisoned({rows, 2 * f}, dt);
    cu::swiglu_forward(tx, y);
    cu::swiglu_backward(tdy, tx, dx);
    VD ry(rows * f), rdx(rows * 2 * f);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < f; ++c) {
        double gt = x[r * 2 * f + c], u = x[r * 2 * f + f + c], s = 1 / (1 + std::exp(-gt)), d = dy[r * f + c];
        ry[r * f + c] = gt * s * u;
        rdx[r * 2 * f + c] = d * u * (s + gt * s * (1 - s));
        rdx[r * 2 * f + f + c] = d * gt * s;
      }
    check(std::string("swiglu fwd ") + dn(dt), host(y), ry, tol_for(dt));
    check(std::string("swiglu bwd ") + dn(dt), host(dx), rdx, tol_for(dt));
    // Squared ReLU (--squared-relu): y = relu(x)^2, dx = dy * 2 relu(x); odd length (tail path).
    {
      const int64_t n = rows * f + 3;
      V x = rounded(randn(n, 2.0f), dt), dy = rounded(randn(n), dt);
      Tensor tx = dev(x, {n}, dt), tdy = dev(dy, {n}, dt), y = poisoned({n}, dt), dx = poisoned({n}, dt);
      cu::squared_relu_forward(tx, y);
      cu::squared_relu_backward(tdy, tx, dx);
      VD ry(n), rdx(n);
      for (int64_t i = 0; i < n; ++i) {
        const double r = x[i] > 0 ? double(x[i]) : 0.0;
        ry[i] = r * r;
        rdx[i] = dy[i] * 2.0 * r;
      }
      check(std::string("squared_relu fwd ") + dn(dt), host(y), ry, tol_for(dt));
      check(std::string("squared_relu bwd ") + dn(dt), host(dx), rdx, tol_for(dt));
    }
  }
  // dropout: mask statistics and y = x * mask / (1 - p)
  {
    const int64_t n = g_small ? 4096 : 1 << 20;
    const float p = 0.3f;
    V x = randn(n);
    Tensor tx = dev(x, {n}, DType::kFloat32), y = poisoned({n}, DType::kFloat32);
    Tensor mask = Tensor::empty({n}, DType::kUInt8, Device::cuda());
    cu::dropout_forward(tx, y, mask, p, 1234, 5);
    Tensor mh = mask.to(Device::cpu());
    const uint8_t* m = mh.data<uint8_t>();
    int64_t kept = 0;
    VD ry(n);
    for (int64_t i = 0; i < n; ++i) {
      kept += m[i];
      ry[i] = m[i] ? x[i] / (1.0 - p) : 0.0;
    }
    double frac = (double)kept / n, sd = std::sqrt(p * (1 - p) / n);
    check_true("dropout keep fraction within 5 sigma of 1-p", std::fabs(frac - (1 - p)) < 5 * sd,
               std::to_string(frac));
    check("dropout fwd float32", host(y), ry, 1e-6);
    Tensor y2 = poisoned({n}, DType::kFloat32), mask2 = Tensor::empty({n}, DType::kUInt8, Device::cuda());
    cu::dropout_forward(tx, y2, mask2, p, 1234, 5);
    check("dropout same (seed, offset) same mask", host(y2), to_d(host(y)), 0.0);
    Tensor dx = poisoned({n}, DType::kFloat32);
    cu::dropout_backward(tx, mask, p, dx);
    check("dropout bwd float32", host(dx), ry, 1e-6);
  }
}

// Row-major reference gemm in double.
VD ref_gemm(const V& a, bool ta, const V& b, bool tb, int64_t m, int64_t n, int64_t k) {
  VD c(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p) {
      double av = ta ? a[p * m + i] : a[i * k + p];
      for (int64_t j = 0; j < n; ++j) c[i * n + j] += av * (tb ? b[j * k + p] : b[p * n + j]);
    }
  return c;
}

void test_gemm() {
  struct Sh {
    int64_t m, n, k;
  };
  std::vector<Sh> shapes = g_small ? std::vector<Sh>{{32, 24, 40}} : std::vector<Sh>{{192, 320, 256}, {100, 72, 56}};
  for (auto sh : shapes)
    for (DType in : {DType::kFloat32, DType::kBFloat16})
      for (DType out : {DType::kFloat32, DType::kBFloat16}) {
        if (in == DType::kFloat32 && out == DType::kBFloat16) continue;
        for (int tr = 0; tr < 4; ++tr) {
          bool ta = tr & 1, tb = tr & 2;
          V a = rounded(randn(sh.m * sh.k), in), b = rounded(randn(sh.k * sh.n), in);
          V c0 = rounded(randn(sh.m * sh.n), out);
          Tensor A = dev(a, ta ? Shape{sh.k, sh.m} : Shape{sh.m, sh.k}, in);
          Tensor B = dev(b, tb ? Shape{sh.n, sh.k} : Shape{sh.k, sh.n}, in);
          Tensor C = dev(c0, {sh.m, sh.n}, out);
          const float alpha = 0.5f, beta = tr == 3 ? 1.0f : 0.0f;
          if (beta == 0.0f) cu::fill(C, NAN), C = poisoned({sh.m, sh.n}, out);
          cu::gemm(A, ta, B, tb, C, alpha, beta);
          VD r = ref_gemm(a, ta, b, tb, sh.m, sh.n, sh.k);
          for (int64_t i = 0; i < sh.m * sh.n; ++i) r[i] = alpha * r[i] + beta * c0[i];
          char nm[128];
          std::snprintf(nm, sizeof nm, "gemm %ldx%ldx%ld %s%s %s->%s beta=%g", (long)sh.m, (long)sh.n, (long)sh.k,
                        ta ? "T" : "N", tb ? "T" : "N", dn(in), dn(out), beta);
          check(nm, host(C), r, tol_for(out));
        }
      }
  // linear forward/backward: bf16 activations, bf16 weight, fp32 main grad accumulated.
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    const int64_t s = g_small ? 4 : 33, b = 2, in = g_small ? 24 : 160, out = g_small ? 16 : 96;
    const int64_t N = s * b;
    V x = rounded(randn(N * in), dt), w = rounded(randn(out * in, 0.1f), dt), bias = rounded(randn(out), dt);
    V dy = rounded(randn(N * out), dt), dw0 = randn(out * in), db0 = randn(out);
    Tensor X = dev(x, {s, b, in}, dt), W = dev(w, {out, in}, dt), Bi = dev(bias, {out}, dt);
    Tensor Y = poisoned({s, b, out}, dt);
    cu::linear_forward(X, W, &Bi, Y);
    VD ry = ref_gemm(x, false, w, true, N, out, in);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < out; ++j) ry[i * out + j] += bias[j];
    check(std::string("linear_forward +bias ") + dn(dt), host(Y), ry, tol_for(dt));
    Tensor DY = dev(dy, {s, b, out}, dt), DX = poisoned({s, b, in}, dt);
    Tensor DW = dev(dw0, {out, in}, DType::kFloat32), DB = dev(db0, {out}, DType::kFloat32);
    cu::linear_backward(DY, X, W, &DX, &DW, &DB, true);
    VD rdx = ref_gemm(dy, false, w, false, N, in, out), rdw = ref_gemm(dy, true, x, false, out, in, N);
    VD rdb(out);
    for (int64_t j = 0; j < out; ++j) {
      double sacc = db0[j];
      for (int64_t i = 0; i < N; ++i) sacc += dy[i * out + j];
      rdb[j] = sacc;
    }
    for (int64_t i = 0; i < out * in; ++i) rdw[i] += dw0[i];
    check(std::string("linear_backward dx ") + dn(dt), host(DX), rdx, tol_for(dt));
    check(std::string("linear_backward dw fp32 main grad += ") + dn(dt), host(DW), rdw, 1e-5);
    check(std::string("linear_backward dbias fp32 += ") + dn(dt), host(DB), rdb, 1e-5);
    Tensor DW2 = poisoned({out, in}, DType::kFloat32);
    cu::linear_backward(DY, X, W, nullptr, &DW2, nullptr, false);
    check(std::string("linear_backward dw overwrite ") + dn(dt), host(DW2),
          ref_gemm(dy, true, x, false, out, in, N), 1e-5);
  }
}

// Fused GEMM epilogues (helper hostgap): fc1 + bias + tanh GeLU (GELU_AUX_BIAS) and fc2 dgrad +
// GeLU backward + fc1 bias gradient (DGELU_BGRAD), against float64 host references from the
// formulas (GEMM, then GeLU-tanh as in test_activations). Inputs are bf16-rounded; outputs bf16,
// so the tolerance is 1e-2 (bf16 rounding gives ~2e-3; cuBLASLt applies GeLU to the unrounded
// fp32 sum while the reference uses the exact one). fc1's bias gradient comes out of cuBLASLt in
// bf16 (Megatron's bf16 bias .grad is rounded too) and is added to an fp32 main grad: 1e-2.
// The functions may decline (return false) only for shapes cuBLASLt has no kernel for; these
// shapes (multiples of 8) must be fused on an H200, which is checked too.
double gelu_tanh_ref(double v) {
  const double k0 = std::sqrt(2.0 / M_PI), t = std::tanh(k0 * (v + 0.044715 * v * v * v));
  return 0.5 * v * (1 + t);
}
double dgelu_tanh_ref(double v) {
  const double k0 = std::sqrt(2.0 / M_PI), t = std::tanh(k0 * (v + 0.044715 * v * v * v));
  return 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * k0 * (1 + 3 * 0.044715 * v * v);
}

void test_gemm_epilogues() {
  struct Sh { int64_t rows, h, f; };
  std::vector<Sh> shapes = g_small ? std::vector<Sh>{{24, 32, 64}} : std::vector<Sh>{{66, 160, 96}, {256, 768, 3072}};
  const DType dt = DType::kBFloat16;
  for (const auto& sh : shapes) {
    const int64_t N = sh.rows, h = sh.h, f = sh.f;
    char tag[64];
    std::snprintf(tag, sizeof tag, " %ldx%ldx%ld bf16", (long)N, (long)h, (long)f);
    // Forward: pre = x w1^T + b1, act = gelu(pre); x [N,h], w1 [f,h].
    V x = rounded(randn(N * h), dt), w1 = rounded(randn(f * h, 0.1f), dt), b1 = rounded(randn(f, 0.5f), dt);
    Tensor X = dev(x, {N, h}, dt), W1 = dev(w1, {f, h}, dt), B1 = dev(b1, {f}, dt);
    Tensor PRE = poisoned({N, f}, dt), ACT = poisoned({N, f}, dt);
    const bool fused = cu::linear_bias_gelu_forward(X, W1, B1, PRE, ACT);
    check_true(std::string("linear_bias_gelu_forward fused (GELU_AUX_BIAS)") + tag, fused);
    if (fused) {
      VD rpre = ref_gemm(x, false, w1, true, N, f, h), ract(N * f);
      for (int64_t i = 0; i < N; ++i)
        for (int64_t j = 0; j < f; ++j) rpre[i * f + j] += b1[j];
      for (int64_t i = 0; i < N * f; ++i) ract[i] = gelu_tanh_ref(rpre[i]);
      check(std::string("linear_bias_gelu_forward pre") + tag, host(PRE), rpre, 1e-2);
      check(std::string("linear_bias_gelu_forward act = gelu_tanh(pre)") + tag, host(ACT), ract, 1e-2);
    }
    // Backward: dpre = gelu'(pre) * (dy @ w2), w2 [h,f]; db1 += Σ_rows dpre.
    V pre = rounded(randn(N * f, 2.0f), dt), dy = rounded(randn(N * h), dt), w2 = rounded(randn(h * f, 0.1f), dt);
    V db0 = randn(f);
    Tensor PREd = dev(pre, {N, f}, dt), DY = dev(dy, {N, h}, dt), W2 = dev(w2, {h, f}, dt);
    Tensor DPRE = poisoned({N, f}, dt), DB = dev(db0, {f}, DType::kFloat32);
    const bool fused_b = cu::linear_dgelu_bgrad_backward(DY, W2, PREd, DPRE, &DB, true);
    check_true(std::string("linear_dgelu_bgrad_backward fused (DGELU_BGRAD)") + tag, fused_b);
    if (fused_b) {
      VD rd = ref_gemm(dy, false, w2, false, N, f, h), rdb(f);
      for (int64_t i = 0; i < N * f; ++i) rd[i] *= dgelu_tanh_ref(pre[i]);
      for (int64_t j = 0; j < f; ++j) {
        double acc = 0;
        for (int64_t i = 0; i < N; ++i) acc += rd[i * f + j];
        rdb[j] = db0[j] + acc;
      }
      check(std::string("linear_dgelu_bgrad_backward dpre") + tag, host(DPRE), rd, 1e-2);
      check(std::string("linear_dgelu_bgrad_backward dbias fp32 +=") + tag, host(DB), rdb, 1e-2);
      // Without a bias gradient (DGELU only).
      Tensor DPRE2 = poisoned({N, f}, dt);
      const bool ok2 = cu::linear_dgelu_bgrad_backward(DY, W2, PREd, DPRE2, nullptr, true);
      check_true(std::string("linear_dgelu_bgrad_backward fused (DGELU)") + tag, ok2);
      if (ok2) check(std::string("linear_dgelu_bgrad_backward dpre, no dbias") + tag, host(DPRE2), rd, 1e-2);
    }
    // fc2 + bias + residual in one GEMM: y = act @ w2^T + b2 + r (act [N,f], w2 [h,f]).
    {
      V a = rounded(randn(N * f), dt), b2 = rounded(randn(h, 0.5f), dt), r = rounded(randn(N * h), dt);
      Tensor A = dev(a, {N, f}, dt), B2 = dev(b2, {h}, dt), R = dev(r, {N, h}, dt), Y = poisoned({N, h}, dt);
      const bool ok = cu::linear_forward_residual(A, W2, &B2, R, Y);
      check_true(std::string("linear_forward_residual fused (BIAS, C = residual)") + tag, ok);
      if (ok) {
        VD ry = ref_gemm(a, false, w2, true, N, h, f);
        for (int64_t i = 0; i < N; ++i)
          for (int64_t j = 0; j < h; ++j) ry[i * h + j] += b2[j] + r[i * h + j];
        check(std::string("linear_forward_residual y = x w^T + b + r") + tag, host(Y), ry, 1e-2);
        check(std::string("linear_forward_residual leaves the residual") + tag, host(R), to_d(r), 0.0);
        Tensor Y2 = poisoned({N, h}, dt);
        const bool ok2 = cu::linear_forward_residual(A, W2, nullptr, R, Y2);
        for (int64_t i = 0; i < N; ++i)
          for (int64_t j = 0; j < h; ++j) ry[i * h + j] -= b2[j];
        if (ok2) check(std::string("linear_forward_residual, no bias") + tag, host(Y2), ry, 1e-2);
        else check_true(std::string("linear_forward_residual fused, no bias") + tag, false);
      }
    }
    // linear_backward with dw and dbias (the BGRADB epilogue path): dw, dbias fp32 accumulate and
    // overwrite, against the float64 reference (fp32 outputs of bf16 inputs: 1e-5).
    V dy1 = rounded(randn(N * f), dt), dw0 = randn(f * h), dbb0 = randn(f);
    Tensor DY1 = dev(dy1, {N, f}, dt), DW = dev(dw0, {f, h}, DType::kFloat32), DBB = dev(dbb0, {f}, DType::kFloat32);
    cu::linear_backward(DY1, X, W1, nullptr, &DW, &DBB, true);
    VD rdw = ref_gemm(dy1, true, x, false, f, h, N), rdbb(f);
    for (int64_t i = 0; i < f * h; ++i) rdw[i] += dw0[i];
    for (int64_t j = 0; j < f; ++j) {
      double acc = dbb0[j];
      for (int64_t i = 0; i < N; ++i) acc += dy1[i * f + j];
      rdbb[j] = acc;
    }
    check(std::string("linear_backward dw += (BGRADB path)") + tag, host(DW), rdw, 1e-5);
    check(std::string("linear_backward dbias += (BGRADB path)") + tag, host(DBB), rdbb, 1e-5);
    Tensor DW3 = poisoned({f, h}, DType::kFloat32), DB3 = poisoned({f}, DType::kFloat32);
    cu::linear_backward(DY1, X, W1, nullptr, &DW3, &DB3, false);
    VD rdb3(f);
    for (int64_t j = 0; j < f; ++j) rdb3[j] = rdbb[j] - dbb0[j];
    check(std::string("linear_backward dw overwrite (BGRADB path)") + tag, host(DW3),
          ref_gemm(dy1, true, x, false, f, h, N), 1e-5);
    check(std::string("linear_backward dbias overwrite (BGRADB path)") + tag, host(DB3), rdb3, 1e-5);
  }
}

// gelu_backward_bgrad (gpt2perf): dpre = dy * gelu_tanh'(pre) and dbias (+)= Σ_rows dpre in one
// pass, against float64 references of the formulas. Tolerance 1e-2 (bf16/fp16 results; the bias
// gradient is rounded once to the 16-bit type, ~4e-3). 3000 x 3072 covers GPT-2's fc1 width with
// several row chunks; 130 x 200 a partial 256-column tile; f = 12 must be declined.
void test_gelu_bgrad() {
  struct Sh { int64_t rows, f; };
  std::vector<Sh> shapes = g_small ? std::vector<Sh>{{24, 64}} : std::vector<Sh>{{130, 200}, {3000, 3072}};
  for (const auto& sh : shapes)
    for (DType dt : {DType::kBFloat16, DType::kFloat16})
      for (bool acc : {true, false}) {
        const int64_t N = sh.rows, f = sh.f;
        char tag[96];
        std::snprintf(tag, sizeof tag, " %ldx%ld %s%s", (long)N, (long)f, dn(dt), acc ? " +=" : " =");
        V pre = rounded(randn(N * f, 2.0f), dt), dy = rounded(randn(N * f), dt), db0 = randn(f);
        Tensor PRE = dev(pre, {N, f}, dt), DY = dev(dy, {N, f}, dt), DPRE = poisoned({N, f}, dt);
        Tensor DB = acc ? dev(db0, {f}, DType::kFloat32) : poisoned({f}, DType::kFloat32);
        const bool ok = cu::gelu_backward_bgrad(DY, PRE, DPRE, &DB, acc);
        check_true(std::string("gelu_backward_bgrad runs") + tag, ok);
        if (!ok) continue;
        VD rd(N * f), rdb(f);
        for (int64_t i = 0; i < N * f; ++i) rd[i] = dy[i] * dgelu_tanh_ref(pre[i]);
        for (int64_t j = 0; j < f; ++j) {
          double a = acc ? db0[j] : 0.0;
          for (int64_t i = 0; i < N; ++i) a += rd[i * f + j];
          rdb[j] = a;
        }
        check(std::string("gelu_backward_bgrad dpre") + tag, host(DPRE), rd, 1e-2);
        check(std::string("gelu_backward_bgrad dbias fp32") + tag, host(DB), rdb, 1e-2);
        if (acc) {  // without a bias gradient, and a bias gradient in the 16-bit type
          Tensor DPRE2 = poisoned({N, f}, dt);
          const bool ok2 = cu::gelu_backward_bgrad(DY, PRE, DPRE2, nullptr, true);
          check_true(std::string("gelu_backward_bgrad runs, no dbias") + tag, ok2);
          if (ok2) check(std::string("gelu_backward_bgrad dpre, no dbias") + tag, host(DPRE2), rd, 1e-2);
          V db16 = rounded(db0, dt);
          Tensor DB16 = dev(db16, {f}, dt);
          if (cu::gelu_backward_bgrad(DY, PRE, DPRE2, &DB16, true)) {
            VD r16(f);
            for (int64_t j = 0; j < f; ++j) r16[j] = rdb[j] - db0[j] + db16[j];
            check(std::string("gelu_backward_bgrad dbias 16-bit +=") + tag, host(DB16), r16, 1e-2);
          } else {
            check_true(std::string("gelu_backward_bgrad runs, 16-bit dbias") + tag, false);
          }
        }
      }
  // bias_grad_colsum (linear layers' bias gradient, fp32 sum not rounded): 1e-5 for the fp32 result
  // of bf16 inputs summed in fp32 over <= 3000 rows.
  for (const auto& sh : std::vector<Sh>{{g_small ? 24 : 3000, g_small ? 64 : 2304}, {g_small ? 9 : 130, g_small ? 16 : 768}})
    for (bool acc : {true, false}) {
      const int64_t N = sh.rows, f = sh.f;
      V dy = rounded(randn(N * f), DType::kBFloat16), db0 = randn(f);
      Tensor DY = dev(dy, {N, f}, DType::kBFloat16);
      Tensor DB = acc ? dev(db0, {f}, DType::kFloat32) : poisoned({f}, DType::kFloat32);
      const bool ok = cu::bias_grad_colsum(DY, DB, acc);
      char nm[96];
      std::snprintf(nm, sizeof nm, "bias_grad_colsum %ldx%ld bf16 -> fp32%s", (long)N, (long)f, acc ? " +=" : " =");
      check_true(std::string(nm) + " runs", ok);
      if (!ok) continue;
      VD r(f);
      for (int64_t j = 0; j < f; ++j) {
        double a = acc ? db0[j] : 0.0;
        for (int64_t i = 0; i < N; ++i) a += dy[i * f + j];
        r[j] = a;
      }
      check(nm, host(DB), r, 1e-5);
    }
  Tensor P12 = dev(V(24, 0.5f), {2, 12}, DType::kBFloat16), D12 = poisoned({2, 12}, DType::kBFloat16);
  check_true("gelu_backward_bgrad declines f % 8 != 0", !cu::gelu_backward_bgrad(P12, P12, D12, nullptr, true));
  Tensor P32 = dev(V(32, 0.5f), {2, 16}, DType::kFloat32), D32 = poisoned({2, 16}, DType::kFloat32);
  check_true("gelu_backward_bgrad declines float32", !cu::gelu_backward_bgrad(P32, P32, D32, nullptr, true));
}

// Host-to-device copies go through pinned staging without a stream synchronization
// (cuda_allocator.cu): many back-to-back copies from one reused host buffer must each land
// intact (the staging block is copied before the call returns), and a copy larger than the
// staging limit still works.
void test_h2d_staging() {
  const int64_t n = g_small ? 1000 : 300000;
  std::vector<Tensor> outs;
  V src(n);
  for (int k = 0; k < 80; ++k) {  // more copies than staging blocks: exercises reuse and waits
    for (int64_t i = 0; i < n; ++i) src[i] = static_cast<float>(k * 7 + i % 13);
    outs.push_back(Tensor::from_vector(src, {n}).to(Device::cuda()));
  }
  bool ok = true;
  for (int k = 0; k < 80 && ok; ++k) {
    V got = host(outs[k]);
    for (int64_t i = 0; i < n; ++i)
      if (got[i] != static_cast<float>(k * 7 + i % 13)) {
        ok = false;
        break;
      }
  }
  check_true("h2d staging: 80 async copies from one reused host buffer", ok);
  const int64_t big = (int64_t{80} << 20) / 4;  // 80 MiB > the 64 MiB staging limit
  V b(big);
  for (int64_t i = 0; i < big; ++i) b[i] = static_cast<float>(i % 1021);
  V gb = host(Tensor::from_vector(b, {big}).to(Device::cuda()));
  check(std::string("h2d 80 MiB (synchronous path)"), gb, to_d(b), 0.0);
}

// count_zeros_many / has_inf_or_nan_many (one host sync for a list; clip_grads.cpp): counts
// against a host count of the same data (exact), and the inf flag with and without a NaN.
void test_reduce_many() {
  std::vector<Tensor> ts;
  int64_t zeros = 0;
  for (int k = 0; k < 5; ++k) {
    const int64_t n = g_small ? 100 + k : 10000 + 977 * k;
    V v = randn(n);
    for (int64_t i = 0; i < n; i += 3 + k) v[i] = 0.0f;
    for (float x : v) zeros += x == 0.0f;
    ts.push_back(dev(v, {n}, k % 2 ? DType::kBFloat16 : DType::kFloat32));
  }
  const int64_t got = cu::count_zeros_many(ts);
  check_true("count_zeros_many (5 tensors, fp32+bf16)", got == zeros,
             std::to_string(got) + " vs " + std::to_string(zeros));
  check_true("has_inf_or_nan_many finite", !cu::has_inf_or_nan_many(ts));
  ts.push_back(dev(V{1.0f, NAN, 2.0f}, {3}, DType::kFloat32));
  check_true("has_inf_or_nan_many with a NaN", cu::has_inf_or_nan_many(ts));
}

// sum_of_squares_many (the global gradient norm, clip_grads.cpp): 150 tensors (more than one
// multi-tensor launch holds), fp32 with a bf16 run in the middle, an empty one and sizes that are
// not multiples of 8, against a float64 host sum (tol 1e-12: double accumulation of exact
// squares, only the summation order differs), and bit-identical to one stage-1 launch per tensor
// (variants.h reduce_per_tensor: the same partials summed in the same order).
void test_grad_norm() {
  std::vector<Tensor> ts;
  double ref = 0.0;
  const int count = g_small ? 70 : 150;
  for (int k = 0; k < count; ++k) {
    const int64_t n = k == 7 ? 0 : (g_small ? 5 + k : (k % 3 ? 768 : 768 * 3 * 768 / 64) + k);
    const DType dt = (k >= 40 && k < 45) ? DType::kBFloat16 : DType::kFloat32;
    V v = rounded(randn(n, 0.01f), dt);
    for (float x : v) ref += (double)x * (double)x;
    ts.push_back(n ? dev(v, {n}, dt) : Tensor::empty({0}, dt, Device::cuda()));
  }
  const double got = cu::sum_of_squares_many(ts);
  const double err = std::abs(got - ref) / ref;
  check_true("sum_of_squares_many (" + std::to_string(count) + " tensors, fp32+bf16, one empty)", err <= 1e-12,
             "rel_err " + std::to_string(err));
  double per = 0.0;  // the single-tensor reduction, one launch and sync each
  for (const Tensor& t : ts) per += t.numel() ? cu::sum_of_squares(t) : 0.0;
  check_true("sum_of_squares_many vs per-tensor sum_of_squares", std::abs(got - per) <= 1e-12 * ref);
  cu::variants::forced().reduce_per_tensor = true;
  const double per_launch = cu::sum_of_squares_many(ts);
  cu::variants::forced().reduce_per_tensor = false;
  check_true("sum_of_squares_many multi-tensor vs per-tensor launches bit-identical",
             std::memcmp(&got, &per_launch, sizeof got) == 0);
  uint64_t bits;
  std::memcpy(&bits, &got, sizeof bits);
  std::printf("INFO sum_of_squares_many bits %016llx (%.17g)\n", (unsigned long long)bits, got);
  // Stage 1 with two loads in flight per thread (the default) vs one (variants.h
  // reduce_stage1_v1, the loop before Session 11): the same additions in the same order, so
  // bit-identical. Tensors longer than one grid stride (at most 16 x SMs blocks of 2048 elements:
  // 4.3M on 132 SMs), so the paired loop runs: 1, 2 and 3 strides and a tail, fp32 and bf16.
  std::vector<Tensor> big;
  for (int64_t n : {int64_t{9000001}, int64_t{4325377}, int64_t{17300000}})
    big.push_back(dev(randn(n, 0.01f), {n}, DType::kFloat32));
  big.push_back(dev(rounded(randn(5000003, 0.01f), DType::kBFloat16), {5000003}, DType::kBFloat16));
  const double two = cu::sum_of_squares_many(big);
  cu::variants::forced().reduce_stage1_v1 = true;
  const double one = cu::sum_of_squares_many(big);
  cu::variants::forced().reduce_stage1_v1 = false;
  check_true("sum_of_squares_many stage 1 two loads in flight vs v1 bit-identical", std::memcmp(&two, &one, sizeof two) == 0,
             std::to_string(two) + " vs " + std::to_string(one));
}

// cross_entropy_fused_ (training cross entropy without TP) and scale_rows against float64 host
// references: lse = log sum exp, loss = lse - logit[label] (0 term for labels outside the
// shard), g = softmax - onehot written over the logits. Row widths: GPT-2's 50304 (whole row in
// shared memory, vector loads), 50257 (odd: element loads), 128256 (LLaMA-3: bf16/fp16 ~90% of the
// row in shared memory and the rest re-read; fp32 under half fits -> all re-read), 152064 (Qwen2:
// ~75% stashed), 1000.
void test_ce_fused() {
  std::vector<int64_t> widths = g_small ? std::vector<int64_t>{300, 8200, 8201} : std::vector<int64_t>{1000, 50304, 50257, 128256, 152064};
  for (int64_t Vl : widths)
    for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      const int64_t N = g_small ? 4 : (Vl > 10000 ? 19 : 70), vs = Vl / 3;
      V logits = rounded(randn(N * Vl, 3.0f), dt);
      std::vector<int64_t> labels(N);
      std::uniform_int_distribution<int64_t> dl(0, Vl + Vl / 2);  // ~1/3 outside [vs, vs + Vl)
      for (auto& l : labels) l = dl(g_rng);
      labels[0] = vs;            // first and last column of the shard
      labels[N - 1] = vs + Vl - 1;
      Tensor L = dev(logits, {N, Vl}, dt), LB = dev_i64(labels, {N});
      Tensor loss = poisoned({N}, DType::kFloat32), lse = poisoned({N}, DType::kFloat32);
      Tensor L2 = L.clone(), loss2 = poisoned({N}, DType::kFloat32), lse2 = poisoned({N}, DType::kFloat32);
      cu::cross_entropy_fused_(L, LB, vs, loss, lse);
      // The bulk-copy kernel (V = 50304 bf16/fp16 on sm_90) against the stash kernel, bitwise
      // (same chunks per thread, same combine order); elsewhere both runs take the same kernel.
      cu::variants::forced().ce_fused_no_bulk = true;
      cu::cross_entropy_fused_(L2, LB, vs, loss2, lse2);
      cu::variants::forced().ce_fused_no_bulk = false;
      check_true("cross_entropy_fused_ V=" + std::to_string(Vl) + " " + dn(dt) + " bulk copy == stash bitwise",
                 same_bytes(L, L2) && same_bytes(loss, loss2) && same_bytes(lse, lse2));
      VD rl(N), rlse(N), rg(N * Vl);
      for (int64_t i = 0; i < N; ++i) {
        double m = -1e300, s = 0;
        for (int64_t c = 0; c < Vl; ++c) m = std::max(m, (double)logits[i * Vl + c]);
        for (int64_t c = 0; c < Vl; ++c) s += std::exp(logits[i * Vl + c] - m);
        rlse[i] = m + std::log(s);
        const int64_t t = labels[i] - vs;
        rl[i] = rlse[i] - ((t >= 0 && t < Vl) ? logits[i * Vl + t] : 0.0);
        for (int64_t c = 0; c < Vl; ++c) rg[i * Vl + c] = std::exp(logits[i * Vl + c] - rlse[i]) - (c == t ? 1.0 : 0.0);
      }
      const std::string vt = " V=" + std::to_string(Vl) + " ";
      check("cross_entropy_fused_ loss" + vt + dn(dt), host(loss), rl, 1e-5);
      check("cross_entropy_fused_ lse" + vt + dn(dt), host(lse), rlse, 1e-5);
      check("cross_entropy_fused_ softmax-onehot in place" + vt + dn(dt), host(L), rg, tol_for(dt));
    }
  for (int64_t h : {768, 13})
    for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
      const int64_t n = g_small ? 6 : 515;
      V x = rounded(randn(n * h), dt), sc = randn(n);
      sc[1] = 0.0f;  // a masked token
      VD r(n * h);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t c = 0; c < h; ++c) r[i * h + c] = (double)x[i * h + c] * sc[i];
      Tensor X = dev(x, {n, h}, dt), S = dev(sc, {n}, DType::kFloat32), O = poisoned({n, h}, dt);
      cu::scale_rows(X, S, O);
      const std::string ht = " h=" + std::to_string(h) + " ";
      check("scale_rows" + ht + dn(dt), host(O), r, dt == DType::kFloat32 ? 1e-6 : 1e-2);
      cu::scale_rows(X, S, X);
      check("scale_rows in place" + ht + dn(dt), host(X), r, dt == DType::kFloat32 ? 1e-6 : 1e-2);
    }
}

void test_embedding_ce() {
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    const int64_t V_ = 50, h = g_small ? 16 : 72, rows = g_small ? 12 : 300, vs = 20;
    V table = rounded(randn(V_ * h), dt);
    std::vector<int64_t> ids(rows);
    std::uniform_int_distribution<int64_t> di(0, 89);
    for (auto& i : ids) i = di(g_rng);
    Tensor T = dev(table, {V_, h}, dt), I = dev_i64(ids, {rows}), O = poisoned({rows, h}, dt);
    cu::embedding_forward(I, T, O, vs);
    VD r(rows * h, 0.0);
    for (int64_t i = 0; i < rows; ++i)
      if (ids[i] >= vs && ids[i] < vs + V_)
        for (int64_t c = 0; c < h; ++c) r[i * h + c] = table[(ids[i] - vs) * h + c];
    check(std::string("embedding_forward shard ") + dn(dt), host(O), r, 0.0);
    V dout = rounded(randn(rows * h), dt), dt0 = randn(V_ * h);
    Tensor DO = dev(dout, {rows, h}, dt), DT = dev(dt0, {V_, h}, DType::kFloat32);
    cu::embedding_backward(DO, I, DT, vs);
    VD rd = to_d(dt0);
    for (int64_t i = 0; i < rows; ++i)
      if (ids[i] >= vs && ids[i] < vs + V_)
        for (int64_t c = 0; c < h; ++c) rd[(ids[i] - vs) * h + c] += dout[i * h + c];
    check(std::string("embedding_backward fp32 grad ") + dn(dt), host(DT), rd, 1e-5);
    // A table view at a 4-float (16-byte) offset and one at a 1-float offset: the
    // vector-atomic path (aligned) and the scalar fallback (misaligned) both accumulate correctly.
    for (int64_t off : {4, 1}) {
      V big = randn(V_ * h + off);
      Tensor BIG = dev(big, {V_ * h + off}, DType::kFloat32);
      Tensor DTv = BIG.flat_slice(off, {V_, h});
      cu::embedding_backward(DO, I, DTv, vs);
      VD rv(V_ * h);
      for (int64_t i = 0; i < V_ * h; ++i) rv[i] = big[off + i];
      for (int64_t i = 0; i < rows; ++i)
        if (ids[i] >= vs && ids[i] < vs + V_)
          for (int64_t c = 0; c < h; ++c) rv[(ids[i] - vs) * h + c] += dout[i * h + c];
      check(std::string("embedding_backward fp32 grad, table at float offset ") + std::to_string(off) + " " + dn(dt),
            host(DTv), rv, 1e-5);
    }
  }
  // Vl 50304 (GPT-2's padded vocab) runs cross_entropy_stats' unrolled loop (4 x 2048 logits per
  // step, gpt2perf) and its tail; 5000 only the one-chunk loop.
  for (int64_t vl : {g_small ? (int64_t)300 : (int64_t)5000, g_small ? (int64_t)8200 : (int64_t)50304})
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    const int64_t N = g_small ? 5 : (vl > 10000 ? 24 : 67), Vl = vl, vs = Vl / 2;
    V logits = rounded(randn(N * Vl, 3.0f), dt);
    std::vector<int64_t> labels(N);
    std::uniform_int_distribution<int64_t> dl(0, 2 * Vl - 1);
    for (auto& l : labels) l = dl(g_rng);
    Tensor L = dev(logits, {N, Vl}, dt), LB = dev_i64(labels, {N});
    Tensor mx = poisoned({N}, DType::kFloat32), se = poisoned({N}, DType::kFloat32), pr = poisoned({N}, DType::kFloat32);
    cu::cross_entropy_stats(L, LB, vs, mx, se, pr);
    VD rm(N), rs(N), rp(N), lse(N);
    for (int64_t i = 0; i < N; ++i) {
      double m = -1e300;
      for (int64_t c = 0; c < Vl; ++c) m = std::max(m, (double)logits[i * Vl + c]);
      double s = 0;
      for (int64_t c = 0; c < Vl; ++c) s += std::exp(logits[i * Vl + c] - m);
      rm[i] = m;
      rs[i] = s;
      int64_t t = labels[i] - vs;
      rp[i] = (t >= 0 && t < Vl) ? logits[i * Vl + t] : 0.0;
      lse[i] = m + std::log(s) + 0.25;  // pretend another shard contributed
    }
    const std::string vt = " V=" + std::to_string(Vl) + " ";
    check(std::string("cross_entropy_stats max") + vt + dn(dt), host(mx), rm, 1e-6);
    check(std::string("cross_entropy_stats sumexp") + vt + dn(dt), host(se), rs, 1e-5);
    check(std::string("cross_entropy_stats pred") + vt + dn(dt), host(pr), rp, 0.0);
    V lsef(lse.begin(), lse.end()), dloss = randn(N);
    VD rdl(N * Vl);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t c = 0; c < Vl; ++c)
        rdl[i * Vl + c] = (std::exp(logits[i * Vl + c] - (double)lsef[i]) - (c == labels[i] - vs ? 1.0 : 0.0)) * dloss[i];
    Tensor LS = dev(lsef, {N}, DType::kFloat32), DL = dev(dloss, {N}, DType::kFloat32);
    cu::cross_entropy_backward(L, LB, vs, LS, DL, L);  // in place
    check(std::string("cross_entropy_backward in-place") + vt + dn(dt), host(L), rdl, dt == DType::kFloat32 ? 1e-5 : 1e-2);
  }
}

void test_norms_once(bool v1);

// h <= 1024 with h % 8 == 0 runs the register-accumulating kernels (gpt2perf; 768 = GPT-2, 1000 =
// a partial last 256-column chunk), 4096 the general ones (backward: float32/float16 rows; bf16 rows
// take the row-block backward, test_norm_rowblk; the forward's 130 rows take
// the block-per-row kernel of test_norms_few where the GPU has >= 130 SMs, float16 the general one); 768 with 3000 rows makes every warp of
// the one-wave grid loop over several rows. Run twice: the automatic choice, then the general
// (v1) forward and backward forced on the same shapes (variants.h; they are the fallbacks).
// Also a third pass with the register kernels' cp.async row pipeline off (variants.h
// norm_*_no_pipe, the Session 4 kernels), test_norm_pipe_bits and test_norm_rowblk (the
// row-block backward for 1024 < h <= 8192, which the 4096 shapes here take for bf16 rows).
void test_norm_pipe_bits();
void test_norm_rowblk();
void test_norms() {
  test_norms_once(false);
  cu::variants::forced().norm_fwd_v1 = cu::variants::forced().norm_bwd_v1 = true;
  test_norms_once(true);
  cu::variants::forced().norm_fwd_v1 = cu::variants::forced().norm_bwd_v1 = false;
  cu::variants::forced().norm_fwd_no_pipe = cu::variants::forced().norm_bwd_no_pipe = true;
  test_norms_once(false);
  cu::variants::forced().norm_fwd_no_pipe = cu::variants::forced().norm_bwd_no_pipe = false;
  test_norm_pipe_bits();
  test_norm_rowblk();
}

// The row-block norm backward (norm.cu norm_bwd_rowblk_kernel, Session 12; the default for
// 1024 < h <= 8192 with h % 8 == 0, 16-byte rows, bf16 x/dy/dx/dres, bf16 or fp32 gamma): one
// block per row, persistent blocks over the rows, dgamma/dbeta in per-thread registers, no
// atomics. h = 2048 (128 threads), 4096 (LLaMA-3-8B), 5120 (320 threads), 8192 (512), 1032 (most
// threads' second chunk empty); rows not a multiple of the one-wave grid (1000, 777, 600, 301)
// and 3 rows (fewer than blocks per wave: the grid is cut to the rows); LayerNorm and RMSNorm,
// with and without the residual gradient, gofs 0 and 1 (by gamma dtype). Checks: float64
// reference from the same rounded inputs and the rounded reference statistics (dx: one bf16
// rounding, 1e-2; dgamma/dbeta: fp32 sums of <= 1000 rows into an fp32 +=, 1e-5, as test_norms);
// the old kernel (variants.h norm_bwd_no_row: norm_bwd_kernel) within the same tolerances of the
// new one (not bitwise: the row and column sums run in another order); two calls of the new
// kernel bitwise equal (no atomics: deterministic by construction).
void ref_norm_stats(const V& x, int64_t i, int64_t h, bool ln, float eps, double& mean, double& rstd);
void ref_norm_bwd_row(const V& x, const V& dy, const V& g, double gofs, int64_t i, int64_t h, bool ln, double mean,
                      double rstd, VD& rdx, VD& rdg, VD& rdb);
void test_norm_rowblk() {
  auto& f = cu::variants::forced();
  const DType dt = DType::kBFloat16, f32 = DType::kFloat32;
  struct Case {
    int64_t h, N;
  };
  const std::vector<Case> cases = g_small ? std::vector<Case>{{2048, 5}, {4096, 3}}
                                          : std::vector<Case>{{2048, 1000}, {4096, 1000}, {4096, 3}, {5120, 301},
                                                              {8192, 600}, {1032, 777}};
  for (const Case& cs : cases)
    for (DType gt : {DType::kBFloat16, DType::kFloat32}) {
      const int64_t h = cs.h, N = cs.N;
      const bool zc = gt == DType::kFloat32;
      const double gofs = zc ? 1.0 : 0.0;
      V x = rounded(randn(N * h, 2.0f), dt), g = rounded(uniform(h, 0.5f, 1.5f), dt), be = rounded(randn(h), dt);
      if (zc)
        for (auto& v : g) v = round_to(v - 1.0f, dt);
      V dy = rounded(randn(N * h), dt), dr = rounded(randn(N * h), dt), dg0 = randn(h), db0 = randn(h);
      Tensor X = dev(x, {N, h}, dt), G = dev(g, {h}, gt), DY = dev(dy, {N, h}, dt), DR = dev(dr, {N, h}, dt);
      for (bool ln : {true, false}) {
        VD rm(N), rr(N), rdx(N * h), rdg = to_d(dg0), rdb = to_d(db0);
        for (int64_t i = 0; i < N; ++i) {
          double mean, rstd;
          ref_norm_stats(x, i, h, ln, 1e-5f, mean, rstd);
          rm[i] = (float)mean;  // the kernel consumes float32 statistics: the reference uses the same
          rr[i] = (float)rstd;
          ref_norm_bwd_row(x, dy, g, gofs, i, h, ln, rm[i], rr[i], rdx, rdg, rdb);
        }
        V rmf(rm.begin(), rm.end()), rrf(rr.begin(), rr.end());
        Tensor M = dev(rmf, {N}, f32), R = dev(rrf, {N}, f32);
        for (bool res : {false, true}) {
          // out[v] = {dx, dgamma, dbeta}: v 0, 1 the new kernel twice, 2 the old one.
          Tensor out[3][3];
          for (int v = 0; v < 3; ++v) {
            f.norm_bwd_no_row = v == 2;
            Tensor* o = out[v];
            o[0] = poisoned({N, h}, dt);
            o[1] = dev(dg0, {h}, f32);
            o[2] = dev(db0, {h}, f32);
            if (res && ln) cu::layernorm_backward_residual(DY, X, G, M, R, zc, DR, o[0], o[1], o[2], true);
            else if (res) cu::rmsnorm_backward_residual(DY, X, G, R, zc, DR, o[0], o[1], true);
            else if (ln) cu::layernorm_backward(DY, X, G, M, R, zc, o[0], o[1], o[2], true);
            else cu::rmsnorm_backward(DY, X, G, R, zc, o[0], o[1], true);
          }
          f.norm_bwd_no_row = false;
          char nm[128];
          std::snprintf(nm, sizeof nm, "rowblk %s h=%ld rows=%ld gamma %s%s%s", ln ? "layernorm" : "rmsnorm", (long)h,
                        (long)N, dn(gt), zc ? " 1p" : "", res ? " +dres" : "");
          const std::string t(nm);
          VD rdxr = rdx;
          if (res)
            for (int64_t i = 0; i < N * h; ++i) rdxr[i] += dr[i];
          check(t + " dx", host(out[0][0]), rdxr, tol_for(dt));
          check(t + " dgamma fp32 +=", host(out[0][1]), rdg, 1e-5);
          if (ln) check(t + " dbeta fp32 +=", host(out[0][2]), rdb, 1e-5);
          check(t + " old dx vs float64", host(out[2][0]), rdxr, tol_for(dt));
          check(t + " dx new vs old", host(out[0][0]), to_d(host(out[2][0])), tol_for(dt));
          check(t + " dgamma new vs old", host(out[0][1]), to_d(host(out[2][1])), 1e-5);
          if (ln) check(t + " dbeta new vs old", host(out[0][2]), to_d(host(out[2][2])), 1e-5);
          check_true(t + " twice bitwise (dx, dgamma" + (ln ? ", dbeta)" : ")"),
                     same_bytes(out[0][0], out[1][0]) && same_bytes(out[0][1], out[1][1]) &&
                         (!ln || same_bytes(out[0][2], out[1][2])));
        }
      }
    }
}

// The pipelined register norm kernels (norm.cu, Session 11) reproduce the unpipelined ones bit
// for bit: forward y/mean/rstd, backward dx (plain and + dres) and the accumulated dgamma/dbeta,
// at h = 768 (GPT-2, 3 chunks per lane, 3 stages), 1024 and 1000 (4 chunks, 2 stages; 1000: a
// partial last chunk), 256 (1 chunk) and 520 (3 chunks, the last one partial), bf16 rows with
// bf16 and fp32 gamma (fp32 rows take the unpipelined kernel both times). The invariant is exact:
// same rows per warp, same fp32 operations in the same order.
void test_norm_pipe_bits() {
  auto& f = cu::variants::forced();
  const DType dt = DType::kBFloat16;
  for (int64_t h : {768, 1024, 1000, 256, 520})
    for (DType gt : {DType::kBFloat16, DType::kFloat32}) {
      const int64_t N = g_small ? 40 : (h == 768 ? 5000 : 777);
      V x = rounded(randn(N * h, 2.0f), dt), g = rounded(uniform(h, 0.5f, 1.5f), dt), be = rounded(randn(h), dt);
      V dy = rounded(randn(N * h), dt), dr = rounded(randn(N * h), dt), dg0 = randn(h), db0 = randn(h);
      Tensor X = dev(x, {N, h}, dt), G = dev(g, {h}, gt), B = dev(be, {h}, gt), DY = dev(dy, {N, h}, dt),
             DR = dev(dr, {N, h}, dt);
      for (bool ln : {true, false})
        for (bool res : {false, true}) {
          Tensor out[2][6];  // [no pipe, pipe] x {y, mean, rstd, dx, dgamma, dbeta}
          for (int pipe = 0; pipe < 2; ++pipe) {
            f.norm_fwd_no_pipe = f.norm_bwd_no_pipe = pipe == 0;
            Tensor* o = out[pipe];
            o[0] = poisoned({N, h}, dt);
            o[1] = poisoned({N}, DType::kFloat32);
            o[2] = poisoned({N}, DType::kFloat32);
            if (ln) cu::layernorm_forward(X, G, B, 1e-5f, false, o[0], o[1], o[2]);
            else cu::rmsnorm_forward(X, G, 1e-5f, false, o[0], o[2]);
            o[3] = poisoned({N, h}, dt);
            o[4] = dev(dg0, {h}, DType::kFloat32);
            o[5] = dev(db0, {h}, DType::kFloat32);
            if (res && ln) cu::layernorm_backward_residual(DY, X, G, o[1], o[2], false, DR, o[3], o[4], o[5], true);
            else if (res) cu::rmsnorm_backward_residual(DY, X, G, o[2], false, DR, o[3], o[4], true);
            else if (ln) cu::layernorm_backward(DY, X, G, o[1], o[2], false, o[3], o[4], o[5], true);
            else cu::rmsnorm_backward(DY, X, G, o[2], false, o[3], o[4], true);
          }
          f.norm_fwd_no_pipe = f.norm_bwd_no_pipe = false;
          char nm[128];
          std::snprintf(nm, sizeof nm, "%s h=%ld bf16 gamma %s%s pipelined == unpipelined bitwise:",
                        ln ? "layernorm" : "rmsnorm", (long)h, dn(gt), res ? " residual" : "");
          const char* what[6] = {"y", "mean", "rstd", "dx", "dgamma", "dbeta"};
          for (int i = 0; i < 6; ++i)
            if (ln || (i != 1 && i != 5)) check_true(std::string(nm) + " " + what[i], same_bytes(out[0][i], out[1][i]));
        }
    }
}

// Float64 statistics of row i of x [N, h]: LayerNorm's mean (0 for RMSNorm) and
// rstd = 1 / sqrt(mean((x - mean)^2) + eps).
void ref_norm_stats(const V& x, int64_t i, int64_t h, bool ln, float eps, double& mean, double& rstd) {
  mean = 0;
  double var = 0;
  if (ln) {
    for (int64_t c = 0; c < h; ++c) mean += x[i * h + c];
    mean /= h;
  }
  for (int64_t c = 0; c < h; ++c) var += (x[i * h + c] - mean) * (x[i * h + c] - mean);
  rstd = 1.0 / std::sqrt(var / h + eps);
}

// Float64 LayerNorm (ln) / RMSNorm backward of row i of x, dy [N, h] with gamma g (+ gofs, the
// zero-centred offset) at the statistics (mean, rstd): writes dx's row into rdx and adds the row's
// dgamma (dy * xhat) and dbeta (dy) terms to rdg / rdb. Megatron's formulas: dx = rstd (dxhat -
// mean(dxhat) [LayerNorm only] - xhat mean(dxhat xhat)), dxhat = dy (g + gofs).
void ref_norm_bwd_row(const V& x, const V& dy, const V& g, double gofs, int64_t i, int64_t h, bool ln, double mean,
                      double rstd, VD& rdx, VD& rdg, VD& rdb) {
  double a = 0, b2 = 0;
  for (int64_t c = 0; c < h; ++c) {
    const double xh = (x[i * h + c] - mean) * rstd, dxh = dy[i * h + c] * (g[c] + gofs);
    a += dxh;
    b2 += dxh * xh;
    rdg[c] += dy[i * h + c] * xh;
    rdb[c] += dy[i * h + c];
  }
  a /= h;
  b2 /= h;
  for (int64_t c = 0; c < h; ++c) {
    const double xh = (x[i * h + c] - mean) * rstd, dxh = dy[i * h + c] * (g[c] + gofs);
    rdx[i * h + c] = rstd * (dxh - (ln ? a : 0.0) - xh * b2);
  }
}

// Few wide rows (decode: rows <= the SM count, 1024 < h <= 8192) run the block-per-row forward
// (norm.cu's norm_fwd_row_kernel): rows 1..8; h = 2056 leaves most threads' second 2048-column
// chunk empty, 8192 fills all four; x/gamma dtype mixes of float32/bfloat16 (float16 takes the
// warp kernel; run for coverage of the dispatch). Reference: float64 on the host from the same
// rounded inputs; tolerances as test_norms (tol_for(dtype) on y: one rounding of the output;
// 1e-5 on the fp32 statistics: fp32 sums of <= 8192 terms). Also rmsnorm_rstd (statistics only,
// y undefined) on the same path.
void test_norms_few() {
  struct Dt {
    DType x, g;
  };
  for (int64_t h : g_small ? std::vector<int64_t>{2056} : std::vector<int64_t>{2056, 4096, 8192})
    for (Dt d : {Dt{DType::kBFloat16, DType::kBFloat16}, Dt{DType::kFloat32, DType::kFloat32},
                 Dt{DType::kBFloat16, DType::kFloat32}, Dt{DType::kFloat16, DType::kFloat16}})
      for (int64_t N = 1; N <= 8; N += g_small ? 7 : 1)
        for (bool ln : {true, false}) {
          const bool zc = N % 2 == 0;
          const float eps = 1e-5f;
          V x = rounded(randn(N * h, 2.0f), d.x), g = rounded(uniform(h, 0.5f, 1.5f), d.g), be = rounded(randn(h), d.g);
          if (zc)
            for (auto& v : g) v = round_to(v - 1.0f, d.g);
          Tensor X = dev(x, {N, h}, d.x), G = dev(g, {h}, d.g), B = dev(be, {h}, d.g);
          Tensor Y = poisoned({N, h}, d.x), M = poisoned({N}, DType::kFloat32), R = poisoned({N}, DType::kFloat32);
          if (ln) cu::layernorm_forward(X, G, B, eps, zc, Y, M, R);
          else cu::rmsnorm_forward(X, G, eps, zc, Y, R);
          VD ry(N * h), rm(N), rr(N);
          for (int64_t i = 0; i < N; ++i) {
            double mean, rstd;
            ref_norm_stats(x, i, h, ln, eps, mean, rstd);
            rm[i] = mean;
            rr[i] = rstd;
            for (int64_t c = 0; c < h; ++c)
              ry[i * h + c] = (x[i * h + c] - mean) * rstd * (g[c] + (zc ? 1.0 : 0.0)) + (ln ? be[c] : 0.0);
          }
          char nm[128];
          std::snprintf(nm, sizeof nm, "%s few rows=%ld h=%ld x %s gamma %s%s", ln ? "layernorm" : "rmsnorm", (long)N,
                        (long)h, dn(d.x), dn(d.g), zc ? " 1p" : "");
          check(std::string(nm) + " fwd y", host(Y), ry, tol_for(d.x));
          if (ln) check(std::string(nm) + " fwd mean", host(M), rm, 1e-5);
          check(std::string(nm) + " fwd rstd", host(R), rr, 1e-5);
          if (!ln && d.x != DType::kFloat16) {
            Tensor R2 = poisoned({N}, DType::kFloat32);
            cu::rmsnorm_rstd(X, G, eps, R2);
            check(std::string(nm) + " rmsnorm_rstd", host(R2), rr, 1e-5);
          }
        }
}

void test_norms_once(bool v1) {
  for (int64_t h : {g_small ? 40 : 1000, g_small ? 64 : 4096, g_small ? 256 : 768})
    for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16})
      for (bool zc : {false, true}) {
        const int64_t N = g_small ? 9 : (h == 768 ? 3000 : 130);
        const float eps = 1e-5f;
        V x = rounded(randn(N * h, 2.0f), dt), g = rounded(uniform(h, 0.5f, 1.5f), dt), be = rounded(randn(h), dt);
        if (zc)
          for (auto& v : g) v = round_to(v - 1.0f, dt);
        V dy = rounded(randn(N * h), dt), dg0 = randn(h), db0 = randn(h);
        Tensor X = dev(x, {N, h}, dt), G = dev(g, {h}, dt), B = dev(be, {h}, dt), DY = dev(dy, {N, h}, dt);
        const double gofs = zc ? 1.0 : 0.0;
        for (bool ln : {true, false}) {
          Tensor Y = poisoned({N, h}, dt), M = poisoned({N}, DType::kFloat32), R = poisoned({N}, DType::kFloat32);
          if (ln) cu::layernorm_forward(X, G, B, eps, zc, Y, M, R);
          else cu::rmsnorm_forward(X, G, eps, zc, Y, R);
          VD ry(N * h), rm(N), rr(N), rdx(N * h), rdg = to_d(dg0), rdb = to_d(db0);
          for (int64_t i = 0; i < N; ++i) {
            double mean, rstd;
            ref_norm_stats(x, i, h, ln, eps, mean, rstd);
            rm[i] = mean;
            rr[i] = rstd;
            for (int64_t c = 0; c < h; ++c) ry[i * h + c] = (x[i * h + c] - mean) * rstd * (g[c] + gofs) + (ln ? be[c] : 0.0);
            ref_norm_bwd_row(x, dy, g, gofs, i, h, ln, mean, rstd, rdx, rdg, rdb);
          }
          char nm[128];
          std::snprintf(nm, sizeof nm, "%s h=%ld %s%s%s", ln ? "layernorm" : "rmsnorm", (long)h, dn(dt),
                        zc ? " 1p" : "", v1 ? " v1" : "");
          check(std::string(nm) + " fwd y", host(Y), ry, tol_for(dt));
          if (ln) check(std::string(nm) + " fwd mean", host(M), rm, 1e-5);
          check(std::string(nm) + " fwd rstd", host(R), rr, 1e-5);
          // backward consumes the reference statistics (so it is checked on its own)
          V rmf(rm.begin(), rm.end()), rrf(rr.begin(), rr.end());
          Tensor Mr = dev(rmf, {N}, DType::kFloat32), Rr = dev(rrf, {N}, DType::kFloat32);
          Tensor DX = poisoned({N, h}, dt), DG = dev(dg0, {h}, DType::kFloat32), DB = dev(db0, {h}, DType::kFloat32);
          if (ln) cu::layernorm_backward(DY, X, G, Mr, Rr, zc, DX, DG, DB, true);
          else cu::rmsnorm_backward(DY, X, G, Rr, zc, DX, DG, true);
          check(std::string(nm) + " bwd dx", host(DX), rdx, tol_for(dt));
          check(std::string(nm) + " bwd dgamma fp32 +=", host(DG), rdg, 1e-5);
          if (ln) check(std::string(nm) + " bwd dbeta fp32 +=", host(DB), rdb, 1e-5);
          // *_backward_residual (hostgap): dx + the residual gradient in the same pass; the weight
          // gradients accumulate a second time (reference: twice the dy terms).
          V dr = rounded(randn(N * h), dt);
          Tensor DR = dev(dr, {N, h}, dt), DX2 = poisoned({N, h}, dt);
          if (ln) cu::layernorm_backward_residual(DY, X, G, Mr, Rr, zc, DR, DX2, DG, DB, true);
          else cu::rmsnorm_backward_residual(DY, X, G, Rr, zc, DR, DX2, DG, true);
          VD rdx2(N * h), rdg2(h), rdb2(h);
          for (int64_t i = 0; i < N * h; ++i) rdx2[i] = rdx[i] + dr[i];
          for (int64_t c = 0; c < h; ++c) {
            rdg2[c] = 2 * rdg[c] - dg0[c];
            rdb2[c] = 2 * rdb[c] - db0[c];
          }
          check(std::string(nm) + " bwd_residual dx + dres", host(DX2), rdx2, tol_for(dt));
          check(std::string(nm) + " bwd_residual dgamma fp32 +=", host(DG), rdg2, 1e-5);
          if (ln) check(std::string(nm) + " bwd_residual dbeta fp32 +=", host(DB), rdb2, 1e-5);
        }
      }
}

// The forward takes the vector kernel from one GPU wave of 8-channel threads up (rope.cu): the
// bfloat16 shapes (s = 600: 38,400 threads, more than 132 SMs x 256) run it, the float32 ones
// (s = 37) the element kernel a decode step runs.
void test_rope() {
  for (DType dt : {DType::kFloat32, DType::kBFloat16})
    for (int variant = 0; variant < 4; ++variant) {
      const int64_t s = g_small ? 6 : (dt == DType::kBFloat16 ? 600 : 37), b = 2, np = 4, ng = 2, d = 32, npg = np / ng;
      ops::RopeParams rp;
      rp.enabled = variant != 2 || true;
      rp.interleaved = variant == 1;
      rp.percent = variant == 2 ? 0.5f : 1.0f;
      rp.base = variant == 3 ? 500000.0f : 10000.0f;
      if (variant == 3) {  // --use-rope-scaling (factor 8) --rotary-seq-len-interpolation-factor 4
        rp.scaling.enabled = true;
        rp.scaling.factor = 8.0f;
        rp.position_scale = ops::rope_position_scale(4.0);
      }
      const int64_t W = ng * (npg + 2) * d;
      V qkv = rounded(randn(s * b * W), dt);
      std::vector<int64_t> pos(s * b);
      std::uniform_int_distribution<int64_t> dp(0, 63);
      for (auto& p : pos) p = dp(g_rng);
      const bool use_pos = variant != 0;
      Tensor QKV = dev(qkv, {s, b, W}, dt), P = dev_i64(pos, {s, b});
      Tensor Q = poisoned({s, b, np, d}, dt), K = poisoned({s, b, ng, d}, dt), Vt = poisoned({s, b, ng, d}, dt);
      cu::qkv_split_rope_forward(QKV, np, ng, rp, use_pos ? &P : nullptr, Q, K, Vt);
      const int rot = (int)(d * rp.percent);
      auto rotate = [&](const float* x, double* y, int64_t posv, bool inverse) {
        for (int c = 0; c < d; ++c) y[c] = x[c];
        for (int c = 0; c < rot; ++c) {
          int partner, fi;
          double sign;
          if (rp.interleaved) {
            partner = c ^ 1;
            sign = (c & 1) ? 1 : -1;
            fi = c / 2;
          } else if (c < rot / 2) {
            partner = c + rot / 2, sign = -1, fi = c;
          } else {
            partner = c - rot / 2, sign = 1, fi = c - rot / 2;
          }
          // variant 3: the Llama-3.1 frequencies (rope_freq.h, checked against a float64
          // reference by tests/unit_tests/ops/rope_scaling_test.cpp) and scaled positions.
          float inv = variant == 3 ? ops::rope_inv_freq(rp.base, fi, rot, rp.scaling)
                                   : (float)(1.0 / std::pow(10000.0, 2.0 * fi / rot));
          double ang = (double)(((float)posv * rp.position_scale) * inv);  // fp32 angle, as Megatron
          y[c] = x[c] * std::cos(ang) + (inverse ? -sign : sign) * x[partner] * std::sin(ang);
        }
      };
      VD rq(s * b * np * d), rk(s * b * ng * d), rv(s * b * ng * d);
      for (int64_t si = 0; si < s; ++si)
        for (int64_t bi = 0; bi < b; ++bi) {
          int64_t tok = si * b + bi, pv = use_pos ? pos[tok] : si;
          for (int64_t gi = 0; gi < ng; ++gi)
            for (int64_t w = 0; w < npg + 2; ++w) {
              const float* src = &qkv[(tok * ng * (npg + 2) + gi * (npg + 2) + w) * d];
              if (w < npg) rotate(src, &rq[(tok * np + gi * npg + w) * d], pv, false);
              else if (w == npg) rotate(src, &rk[(tok * ng + gi) * d], pv, false);
              else
                for (int c = 0; c < d; ++c) rv[(tok * ng + gi) * d + c] = src[c];
            }
        }
      std::string nm = std::string("qkv_split_rope ") +
                       (variant == 0 ? "half" : variant == 1 ? "interleaved+pos" : variant == 2 ? "half 50%+pos" : "half+pos llama3-scaled interp4") +
                       " " + dn(dt);
      check(nm + " fwd q", host(Q), rq, tol_for(dt));
      check(nm + " fwd k", host(K), rk, tol_for(dt));
      check(nm + " fwd v", host(Vt), rv, dt == DType::kFloat32 ? 0.0 : 1e-2);
      // backward: dqkv from random dq, dk, dv (transpose of the rotation)
      V dq = rounded(randn(s * b * np * d), dt), dk = rounded(randn(s * b * ng * d), dt), dv = rounded(randn(s * b * ng * d), dt);
      Tensor DQ = dev(dq, {s, b, np, d}, dt), DK = dev(dk, {s, b, ng, d}, dt), DV = dev(dv, {s, b, ng, d}, dt);
      Tensor DQKV = poisoned({s, b, W}, dt);
      cu::qkv_split_rope_backward(DQ, DK, DV, np, ng, rp, use_pos ? &P : nullptr, DQKV);
      VD rd(s * b * W);
      for (int64_t si = 0; si < s; ++si)
        for (int64_t bi = 0; bi < b; ++bi) {
          int64_t tok = si * b + bi, pv = use_pos ? pos[tok] : si;
          for (int64_t gi = 0; gi < ng; ++gi)
            for (int64_t w = 0; w < npg + 2; ++w) {
              double* dst = &rd[(tok * ng * (npg + 2) + gi * (npg + 2) + w) * d];
              if (w < npg) rotate(&dq[(tok * np + gi * npg + w) * d], dst, pv, true);
              else if (w == npg) rotate(&dk[(tok * ng + gi) * d], dst, pv, true);
              else
                for (int c = 0; c < d; ++c) dst[c] = dv[(tok * ng + gi) * d + c];
            }
        }
      check(nm + " bwd dqkv", host(DQKV), rd, tol_for(dt));
    }
}

// The vector RoPE kernel's per-call (cos, sin) table (rope.cu, Session 12) reproduces the
// per-channel angles bit for bit: forward q/k/v and backward dqkv with the table and without it
// (variants::forced().rope_no_table), rotate-half and interleaved, with and without position ids,
// 50 % partial rotary, Llama-3.1 scaling with interpolated positions, at a LLaMA-3-8B-like head
// layout (GQA 8 query heads per group, d 128, base 500000) and a small MHA one (d 32), b = 2 and
// positions up to 8191. The invariant is exact: the table holds the values of the same
// rope_inv_freq / rope_angle / sincosf calls, and both paths round the rotation the same way.
void test_rope_table_bits() {
  auto& f = cu::variants::forced();
  struct Case { int64_t s, np, ng, d; int variant; };
  const int64_t S = g_small ? 16 : 520;
  const Case cases[] = {{S, 16, 2, 128, 0}, {S, 16, 2, 128, 1}, {S, 16, 2, 128, 2}, {S, 16, 2, 128, 3},
                        {S, 4, 4, 32, 0}, {S, 4, 4, 32, 1}};
  for (DType dt : {DType::kBFloat16, DType::kFloat32})
    for (const Case& c : cases) {
      const int64_t b = 2, npg = c.np / c.ng, W = c.ng * (npg + 2) * c.d;
      ops::RopeParams rp;
      rp.enabled = true;
      rp.interleaved = c.variant == 1;
      rp.percent = c.variant == 2 ? 0.5f : 1.0f;
      rp.base = 500000.0f;
      if (c.variant == 3) {
        rp.scaling.enabled = true;
        rp.scaling.factor = 8.0f;
        rp.position_scale = ops::rope_position_scale(4.0);
      }
      V qkv = rounded(randn(c.s * b * W), dt);
      std::vector<int64_t> pos(c.s * b);
      std::uniform_int_distribution<int64_t> dp(0, 8191);
      for (auto& p : pos) p = dp(g_rng);
      const bool use_pos = c.variant != 0;
      Tensor QKV = dev(qkv, {c.s, b, W}, dt), P = dev_i64(pos, {c.s, b});
      V dq = rounded(randn(c.s * b * c.np * c.d), dt), dk = rounded(randn(c.s * b * c.ng * c.d), dt),
        dv = rounded(randn(c.s * b * c.ng * c.d), dt);
      Tensor DQ = dev(dq, {c.s, b, c.np, c.d}, dt), DK = dev(dk, {c.s, b, c.ng, c.d}, dt),
             DV = dev(dv, {c.s, b, c.ng, c.d}, dt);
      Tensor out[2][4];  // [no table, table] x {q, k, v, dqkv}
      for (int t = 0; t < 2; ++t) {
        f.rope_no_table = t == 0;
        Tensor* o = out[t];
        o[0] = poisoned({c.s, b, c.np, c.d}, dt);
        o[1] = poisoned({c.s, b, c.ng, c.d}, dt);
        o[2] = poisoned({c.s, b, c.ng, c.d}, dt);
        o[3] = poisoned({c.s, b, W}, dt);
        cu::qkv_split_rope_forward(QKV, c.np, c.ng, rp, use_pos ? &P : nullptr, o[0], o[1], o[2]);
        cu::qkv_split_rope_backward(DQ, DK, DV, c.np, c.ng, rp, use_pos ? &P : nullptr, o[3]);
      }
      f.rope_no_table = false;
      char nm[160];
      std::snprintf(nm, sizeof nm, "qkv_split_rope table == per-channel angles bitwise: %s np=%ld ng=%ld d=%ld %s:",
                    c.variant == 0 ? "half" : c.variant == 1 ? "interleaved+pos" : c.variant == 2 ? "half 50%+pos"
                                                                                     : "half+pos llama3-scaled interp4",
                    (long)c.np, (long)c.ng, (long)c.d, dn(dt));
      const char* what[4] = {"q", "k", "v", "dqkv"};
      for (int i = 0; i < 4; ++i) check_true(std::string(nm) + " " + what[i], same_bytes(out[0][i], out[1][i]));
    }
}

// Random attention inputs rounded to dt: q, dout [s, b, np, d], k, v [sk, b, ng, d] (standard
// normal), and the explicit mask [b, s, sk] (30% masked, never the diagonal) when `with_mask`, else
// all visible; drawn in that order from g_rng.
struct AttnInputs {
  V q, k, v, dout;
  std::vector<uint8_t> mask;
};
AttnInputs attn_inputs(int S, int SK, int B, int NP, int NG, int D, DType dt, bool with_mask) {
  AttnInputs in;
  in.q = rounded(randn((int64_t)S * B * NP * D), dt);
  in.k = rounded(randn((int64_t)SK * B * NG * D), dt);
  in.v = rounded(randn((int64_t)SK * B * NG * D), dt);
  in.dout = rounded(randn((int64_t)S * B * NP * D), dt);
  in.mask.assign((size_t)B * S * SK, 0);
  if (with_mask) {
    std::bernoulli_distribution bm(0.3);
    for (int bi = 0; bi < B; ++bi)
      for (int i = 0; i < S; ++i)
        for (int j = 0; j < SK; ++j) in.mask[((size_t)bi * S + i) * SK + j] = (i != j) && bm(g_rng);
  }
  return in;
}
// The mask [b, s, sk] (true = masked) as the bool CUDA tensor [b, 1, s, sk] of AttentionParams.
Tensor attn_mask_tensor(const std::vector<uint8_t>& mask, int B, int S, int SK) {
  Tensor mh = Tensor::empty({B, 1, S, SK}, DType::kBool);
  std::memcpy(mh.data_ptr(), mask.data(), mask.size());
  return mh.to(Device::cuda());
}

// The dropout keep-scale F of element idx of the SplitMix64 stream (Steele, Lea & Flood 2014)
// re-derived from its definition (ops.h: keep iff uniform >= p, uniform = top 24 bits / 2^24, kept
// elements scaled by 1 / (1 - p)), for the attention references.
uint64_t ref_mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
double ref_keep_scale(uint64_t seed, uint64_t offset, uint64_t idx, float p) {
  if (p <= 0.0f) return 1.0;
  const uint64_t stream = ref_mix64(seed ^ ref_mix64(offset));
  const float u = static_cast<float>(ref_mix64(stream + idx) >> 40) * (1.0f / 16777216.0f);
  return u >= p ? (double)(1.0f / (1.0f - p)) : 0.0;
}

// float64 softmax attention forward and backward written from the formulas (FlashAttention-2's
// equations with dropout, Dao 2023): q, dout [s, b, np, d]; k, v [sk, b, ng, d]; mask [b, s, sk]
// (true = masked) or null for p.causal / full; dropout keep-scales from ref_keep_scale. Returns
// out, lse [b, np, s] (natural log), dq, dk, dv in the tensors' layouts.
struct AttnRef {
  VD o, lse, dq, dk, dv;
};
AttnRef attention_reference(const V& q, const V& k, const V& v, const V& dout, const std::vector<uint8_t>* mask, int S,
                            int SK, int B, int NP, int NG, int D, const ops::AttentionParams& p) {
  const int npg = NP / NG;
  AttnRef r;
  VD &ro = r.o, &rl = r.lse, &rdq = r.dq, &rdk = r.dk, &rdv = r.dv;
  ro.assign((size_t)S * B * NP * D, 0.0);
  rl.assign((size_t)B * NP * S, 0.0);
  rdq.assign(ro.size(), 0.0);
  rdk.assign((size_t)SK * B * NG * D, 0.0);
  rdv.assign(rdk.size(), 0.0);
  auto qi_ = [&](int i, int bi, int h, int c) { return (((size_t)i * B + bi) * NP + h) * D + c; };
  auto ki_ = [&](int j, int bi, int g, int c) { return (((size_t)j * B + bi) * NG + g) * D + c; };
  std::vector<double> P(SK), F(SK), dP(SK);
  for (int bi = 0; bi < B; ++bi)
    for (int h = 0; h < NP; ++h) {
      const int g = h / npg;
      for (int i = 0; i < S; ++i) {
        double m = -1e300;
        for (int j = 0; j < SK; ++j) {
          const bool vis = mask ? !(*mask)[((size_t)bi * S + i) * SK + j] : (!p.causal || j <= i);
          double sc = -INFINITY;
          if (vis) {
            sc = 0;
            for (int c = 0; c < D; ++c) sc += (double)q[qi_(i, bi, h, c)] * k[ki_(j, bi, g, c)];
            sc *= p.softmax_scale;
          }
          P[j] = sc;
          m = std::max(m, sc);
          F[j] = ref_keep_scale(p.seed, p.offset, (((uint64_t)bi * NP + h) * S + i) * SK + j, p.dropout_p);
        }
        double sum = 0;
        for (int j = 0; j < SK; ++j) sum += (P[j] = std::exp(P[j] - m));
        for (int j = 0; j < SK; ++j) P[j] /= sum;
        rl[((size_t)bi * NP + h) * S + i] = m + std::log(sum);
        for (int c = 0; c < D; ++c) {
          double acc = 0;
          for (int j = 0; j < SK; ++j) acc += P[j] * F[j] * v[ki_(j, bi, g, c)];
          ro[qi_(i, bi, h, c)] = acc;
        }
        double dsum = 0;  // D_i = dO_i . O_i = sum_j P_ij dP_ij
        for (int j = 0; j < SK; ++j) {
          double acc = 0;
          for (int c = 0; c < D; ++c) acc += (double)dout[qi_(i, bi, h, c)] * v[ki_(j, bi, g, c)];
          dP[j] = acc * F[j];
          dsum += dP[j] * P[j];
        }
        for (int j = 0; j < SK; ++j) {
          const double ds = P[j] * (dP[j] - dsum) * p.softmax_scale;
          for (int c = 0; c < D; ++c) {
            rdq[qi_(i, bi, h, c)] += ds * k[ki_(j, bi, g, c)];
            rdk[ki_(j, bi, g, c)] += ds * q[qi_(i, bi, h, c)];
            rdv[ki_(j, bi, g, c)] += P[j] * F[j] * dout[qi_(i, bi, h, c)];
          }
        }
      }
    }
  return r;
}

// The flash kernels' attention shapes (head dims 64/128; causal, full with s != sk, explicit mask with
// s % 4 != 0 (the simple kernels), GQA and MHA), shared by test_attention and test_attention_dropout.
struct FlashCase {
  int S, SK, B, NP, NG, D;
  bool causal, mask;
};
std::vector<FlashCase> flash_cases() {
  if (g_small) return {{70, 70, 1, 2, 1, 64, true, false}};
  return {{200, 200, 2, 4, 2, 64, true, false},
          {128, 128, 1, 8, 2, 128, true, false},
          {96, 160, 2, 2, 2, 128, false, false},
          {130, 130, 1, 4, 1, 64, false, true},
          {256, 256, 1, 4, 4, 128, true, false}};
}

// The AttentionParams of a flash case: softmax scale 1/sqrt(d), the case's causal flag, dropout p
// with stream (seed, offset), and the explicit mask tensor `mt` (attn_mask_tensor) if the case has one.
ops::AttentionParams flash_case_params(const FlashCase& cs, float pdrop, uint64_t seed, uint64_t offset, const Tensor& mt) {
  ops::AttentionParams p;
  p.softmax_scale = 1.0f / std::sqrt((float)cs.D);
  p.causal = cs.causal;
  p.dropout_p = pdrop;
  p.seed = seed;
  p.offset = offset;
  if (cs.mask) p.attention_mask = &mt;
  return p;
}

void test_attention() {
  const std::vector<FlashCase> cases = flash_cases();
  // impl 2: pipelined kernels, 8 warps (used when s % 4 == 0); 3: pipelined, 4 warps; 1: simple;
  // 0: cuDNN SDPA (MEGATRON_ATTENTION_BACKEND=cudnn; not for explicit masks); 4: cuDNN forward,
  // our backward from cuDNN's out and lse (the lse contract that ring attention relies on).
  const bool have_cudnn = cu::cudnn_sdpa::available();
  check_true("cuDNN SDPA available", have_cudnn, cu::cudnn_sdpa::last_error());
  for (int impl : {0, 5, 4, 2, 3, 1})
  for (const FlashCase& cs : cases) {
    if ((impl == 0 || impl == 4 || impl == 5) && (cs.mask || !have_cudnn)) continue;
    cu::variants::forced().flash_v1 = impl == 1;
    cu::variants::forced().flash_small = impl == 3 ? 1 : 0;
    setenv("MEGATRON_ATTENTION_BACKEND", impl == 0 || impl == 4 || impl == 5 ? "cudnn" : "flash", 1);
    const DType dt = impl == 5 ? DType::kFloat16 : DType::kBFloat16;  // 5: cuDNN SDPA in fp16 (--fp16)
    const int S = cs.S, SK = cs.SK, B = cs.B, NP = cs.NP, NG = cs.NG, D = cs.D;
    const AttnInputs in = attn_inputs(S, SK, B, NP, NG, D, dt, cs.mask);
    const V &q = in.q, &k = in.k, &v = in.v, &dout = in.dout;
    const std::vector<uint8_t>& mask = in.mask;
    ops::AttentionParams p;
    p.softmax_scale = 1.0f / std::sqrt((float)D);
    p.causal = cs.causal;
    Tensor Mt = cs.mask ? attn_mask_tensor(mask, B, S, SK) : Tensor();
    if (cs.mask) p.attention_mask = &Mt;
    Tensor Q = dev(q, {S, B, NP, D}, dt), K = dev(k, {SK, B, NG, D}, dt), Vv = dev(v, {SK, B, NG, D}, dt);
    Tensor O = poisoned({S, B, NP, D}, dt), L = poisoned({B, NP, S}, DType::kFloat32);
    cu::attention_forward(Q, K, Vv, p, O, L);
    V oh = host(O);
    Tensor DO = dev(dout, {S, B, NP, D}, dt);
    Tensor DQ = poisoned({S, B, NP, D}, dt), DK = poisoned({SK, B, NG, D}, dt), DV = poisoned({SK, B, NG, D}, dt);
    if (impl == 4) setenv("MEGATRON_ATTENTION_BACKEND", "flash", 1);
    cu::attention_backward(DO, Q, K, Vv, O, L, p, DQ, DK, DV);
    // reference (p.dropout_p = 0: every keep-scale 1)
    const AttnRef r = attention_reference(q, k, v, dout, cs.mask ? &mask : nullptr, S, SK, B, NP, NG, D, p);
    const VD &ro = r.o, &rl = r.lse, &rdq = r.dq, &rdk = r.dk, &rdv = r.dv;
    char nm[128];
    std::snprintf(nm, sizeof nm, "attention%s s=%d sk=%d b=%d np=%d ng=%d d=%d %s",
                  impl == 0 ? " cudnn" : impl == 5 ? " cudnn fp16" : impl == 4 ? " cudnn-fwd+flash-bwd" : impl == 1 || S % 4 ? " v1" : impl == 3 ? " v2s" : " v2", S, SK, B, NP, NG, D, cs.mask ? "mask" : cs.causal ? "causal" : "full");
    check(std::string(nm) + " out", oh, ro, 1e-2);
    check(std::string(nm) + " lse", host(L), rl, 1e-3);
    check(std::string(nm) + " dq", host(DQ), rdq, 1e-2);
    check(std::string(nm) + " dk", host(DK), rdk, 1e-2);
    check(std::string(nm) + " dv", host(DV), rdv, 1e-2);
  }
  cu::variants::forced().flash_v1 = false;
  cu::variants::forced().flash_small = -1;
  unsetenv("MEGATRON_ATTENTION_BACKEND");
}

// Attention on the fused QKV tensor (gpt2perf; cuDNN reads strided Q/K/V views and writes dQ/dK/dV
// strided into dqkv): qkv [s, b, h, (q, k, v), d] bf16, causal, against a float64 reference of
// softmax attention written here from the formulas (as in test_attention). Tolerances as there:
// 1e-2 for bf16 out/dq/dk/dv, 1e-3 for the fp32 lse of bf16 inputs.
void test_attention_packed() {
  struct Case { int S, B, H, D; };
  std::vector<Case> cases = g_small ? std::vector<Case>{{64, 1, 2, 64}}
                                    : std::vector<Case>{{200, 2, 3, 64}, {128, 1, 2, 128}, {256, 2, 12, 64}};
  if (!cu::cudnn_sdpa::available()) {
    check_true("attention_packed: cuDNN SDPA available", false, cu::cudnn_sdpa::last_error());
    return;
  }
  for (auto cs : cases) {
    const DType dt = DType::kBFloat16;
    const int S = cs.S, B = cs.B, H = cs.H, D = cs.D;
    V qkv = rounded(randn((int64_t)S * B * H * 3 * D), dt), dout = rounded(randn((int64_t)S * B * H * D), dt);
    auto at = [&](int i, int bi, int h, int w, int c) { return ((((size_t)i * B + bi) * H + h) * 3 + w) * D + c; };
    auto oi = [&](int i, int bi, int h, int c) { return (((size_t)i * B + bi) * H + h) * D + c; };
    ops::AttentionParams p;
    p.softmax_scale = 1.0f / std::sqrt((float)D);
    p.causal = true;
    Tensor QKV = dev(qkv, {S, B, 3 * H * D}, dt), O = poisoned({S, B, H, D}, dt), L = poisoned({B, H, S}, DType::kFloat32);
    char nm[96];
    std::snprintf(nm, sizeof nm, "attention_packed cudnn s=%d b=%d h=%d d=%d causal", S, B, H, D);
    const bool okf = cu::attention_forward_packed_qkv(QKV, H, p, O, L);
    check_true(std::string(nm) + " forward runs", okf, okf ? "" : cu::cudnn_sdpa::last_error());
    if (!okf) continue;
    Tensor DO = dev(dout, {S, B, H, D}, dt), DQKV = poisoned({S, B, 3 * H * D}, dt);
    const bool okb = cu::attention_backward_packed_qkv(DO, QKV, H, O, L, p, DQKV);
    check_true(std::string(nm) + " backward runs", okb, okb ? "" : cu::cudnn_sdpa::last_error());
    VD ro((size_t)S * B * H * D), rl((size_t)B * H * S), rd(qkv.size(), 0.0);
    std::vector<double> P(S), dP(S);
    for (int bi = 0; bi < B; ++bi)
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < S; ++i) {
          double m = -1e300;
          for (int j = 0; j <= i; ++j) {
            double sc = 0;
            for (int c = 0; c < D; ++c) sc += (double)qkv[at(i, bi, h, 0, c)] * qkv[at(j, bi, h, 1, c)];
            P[j] = sc * p.softmax_scale;
            m = std::max(m, P[j]);
          }
          double sum = 0;
          for (int j = 0; j <= i; ++j) sum += (P[j] = std::exp(P[j] - m));
          for (int j = 0; j <= i; ++j) P[j] /= sum;
          rl[((size_t)bi * H + h) * S + i] = m + std::log(sum);
          for (int c = 0; c < D; ++c) {
            double a = 0;
            for (int j = 0; j <= i; ++j) a += P[j] * qkv[at(j, bi, h, 2, c)];
            ro[oi(i, bi, h, c)] = a;
          }
          double dsum = 0;
          for (int j = 0; j <= i; ++j) {
            double a = 0;
            for (int c = 0; c < D; ++c) a += (double)dout[oi(i, bi, h, c)] * qkv[at(j, bi, h, 2, c)];
            dP[j] = a;
            dsum += a * P[j];
          }
          for (int j = 0; j <= i; ++j) {
            const double ds = P[j] * (dP[j] - dsum) * p.softmax_scale;
            for (int c = 0; c < D; ++c) {
              rd[at(i, bi, h, 0, c)] += ds * qkv[at(j, bi, h, 1, c)];
              rd[at(j, bi, h, 1, c)] += ds * qkv[at(i, bi, h, 0, c)];
              rd[at(j, bi, h, 2, c)] += P[j] * dout[oi(i, bi, h, c)];
            }
          }
        }
    check(std::string(nm) + " out", host(O), ro, 1e-2);
    check(std::string(nm) + " lse", host(L), rl, 1e-3);
    if (okb) check(std::string(nm) + " dqkv", host(DQKV), rd, 1e-2);
  }
  // Declined: grouped layouts are the caller's business (heads must match qkv), float32, dropout.
  ops::AttentionParams p;
  p.causal = true;
  p.softmax_scale = 0.125f;
  Tensor Q32 = poisoned({8, 1, 3 * 64}, DType::kFloat32), O32 = poisoned({8, 1, 1, 64}, DType::kFloat32),
         L32 = poisoned({1, 1, 8}, DType::kFloat32);
  check_true("attention_packed declines float32", !cu::attention_forward_packed_qkv(Q32, 1, p, O32, L32));
  Tensor Qb = poisoned({8, 1, 3 * 64}, DType::kBFloat16), Ob = poisoned({8, 1, 1, 64}, DType::kBFloat16);
  p.dropout_p = 0.1f;
  check_true("attention_packed declines dropout", !cu::attention_forward_packed_qkv(Qb, 1, p, Ob, L32));
  p.dropout_p = 0.0f;
  check_true("attention_packed declines heads != qkv width / 3d", !cu::attention_forward_packed_qkv(Qb, 2, p, Ob, L32));
}

// Generic attention kernels (attention_generic.cu): odd head dims, float32 and bfloat16, GQA,
// causal / full / explicit mask, attention dropout. Reference: float64 softmax attention written
// here from the formulas (attention_reference), with the dropout keep-scale F_ij of element
// ((b*np + h)*s + i)*sk + j of the SplitMix64 stream (ref_keep_scale).
// Tolerances: float32 in/out 1e-5 (fp32 accumulation over <= 160 keys: ~1e-7 per op);
// bfloat16 outputs 1e-2 (bf16 rounding of the outputs alone is ~2e-3); lse 1e-5 (fp32) / 1e-3
// (bf16, as test_attention: the "auto" bf16 case may run cuDNN's tensor-core scores).
void test_attention_generic() {
  struct Case {
    int S, SK, B, NP, NG, D;
    bool causal, mask;
    float drop;
    const char* backend;  // MEGATRON_ATTENTION_BACKEND
  };
  std::vector<Case> cases;
  if (g_small) {
    cases = {{37, 37, 1, 4, 2, 3, true, false, 0.0f, "generic"}, {20, 33, 2, 2, 1, 40, false, true, 0.1f, "generic"}};
  } else {
    for (int d : {3, 12, 40, 80, 96, 256}) {
      cases.push_back({70, 70, 2, 4, 2, d, true, false, 0.0f, "generic"});   // GQA 2 heads per group, causal
      cases.push_back({45, 77, 1, 3, 3, d, false, false, 0.0f, "generic"});  // s != sk, full
    }
    cases.push_back({64, 64, 8, 2, 2, 3, true, false, 0.1f, "generic"});   // the simple example's attention (TP2)
    cases.push_back({50, 50, 2, 6, 2, 12, false, true, 0.0f, "generic"});  // explicit mask, GQA 3 per group
    cases.push_back({50, 50, 2, 4, 1, 80, true, false, 0.2f, "generic"});  // dropout, MQA
    cases.push_back({33, 70, 1, 2, 1, 12, true, false, 0.0f, "generic"});  // causal top-left with sk > s
    cases.push_back({64, 64, 2, 4, 2, 64, true, false, 0.0f, "generic"});  // a flash head dim on the generic path
    cases.push_back({70, 70, 2, 4, 2, 3, true, false, 0.0f, "auto"});      // dispatch: odd dim -> generic
    cases.push_back({64, 64, 2, 4, 2, 64, true, false, 0.1f, "auto"});     // dispatch: dropout -> flash (bf16), generic
    cases.push_back({64, 64, 2, 4, 2, 96, true, false, 0.0f, "auto"});     // dispatch: bf16 d=96 -> cuDNN if present
  }
  for (const Case& cs : cases)
    for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      setenv("MEGATRON_ATTENTION_BACKEND", cs.backend, 1);
      const int S = cs.S, SK = cs.SK, B = cs.B, NP = cs.NP, NG = cs.NG, D = cs.D;
      const AttnInputs in = attn_inputs(S, SK, B, NP, NG, D, dt, cs.mask);
      const V &q = in.q, &k = in.k, &v = in.v, &dout = in.dout;
      const std::vector<uint8_t>& mask = in.mask;
      ops::AttentionParams p;
      p.softmax_scale = 1.0f / std::sqrt((float)D);
      p.causal = cs.causal;
      p.dropout_p = cs.drop;
      p.seed = 1234;
      p.offset = 77;
      Tensor Mt = cs.mask ? attn_mask_tensor(mask, B, S, SK) : Tensor();
      if (cs.mask) p.attention_mask = &Mt;
      Tensor Q = dev(q, {S, B, NP, D}, dt), K = dev(k, {SK, B, NG, D}, dt), Vv = dev(v, {SK, B, NG, D}, dt);
      Tensor O = poisoned({S, B, NP, D}, dt), L = poisoned({B, NP, S}, DType::kFloat32);
      cu::attention_forward(Q, K, Vv, p, O, L);
      Tensor DO = dev(dout, {S, B, NP, D}, dt);
      Tensor DQ = poisoned({S, B, NP, D}, dt), DK = poisoned({SK, B, NG, D}, dt), DV = poisoned({SK, B, NG, D}, dt);
      cu::attention_backward(DO, Q, K, Vv, O, L, p, DQ, DK, DV);
      const AttnRef r = attention_reference(q, k, v, dout, cs.mask ? &mask : nullptr, S, SK, B, NP, NG, D, p);
      const VD &ro = r.o, &rl = r.lse, &rdq = r.dq, &rdk = r.dk, &rdv = r.dv;
      char nm[160];
      std::snprintf(nm, sizeof nm, "attn %s s=%d sk=%d b=%d np=%d ng=%d d=%d %s%s %s", cs.backend, S, SK, B, NP, NG,
                    D, cs.mask ? "mask" : cs.causal ? "causal" : "full", cs.drop > 0 ? " drop" : "", dn(dt));
      const double tol = tol_for(dt);
      check(std::string(nm) + " out", host(O), ro, tol);
      check(std::string(nm) + " lse", host(L), rl, dt == DType::kFloat32 ? 1e-5 : 1e-3);
      check(std::string(nm) + " dq", host(DQ), rdq, tol);
      check(std::string(nm) + " dk", host(DK), rdk, tol);
      check(std::string(nm) + " dv", host(DV), rdv, tol);
    }
  unsetenv("MEGATRON_ATTENTION_BACKEND");
  // CUDA dropout op: the same mask as the CPU reference op for the same (seed, offset).
  {
    const int64_t n = g_small ? 4099 : 1000003;
    V x = randn(n);
    Tensor tx = dev(x, {n}, DType::kFloat32), y = poisoned({n}, DType::kFloat32);
    Tensor mask = Tensor::empty({n}, DType::kUInt8, Device::cuda());
    cu::dropout_forward(tx, y, mask, 0.1f, 4321, 9);
    Tensor cx = Tensor::from_vector(x, {n}), cy = Tensor::empty({n}, DType::kFloat32),
           cm = Tensor::empty({n}, DType::kUInt8);
    ops::cpu::dropout_forward(cx, cy, cm, 0.1f, 4321, 9);
    Tensor gm = mask.to(Device::cpu());
    const bool same = std::memcmp(gm.data_ptr(), cm.data_ptr(), (size_t)n) == 0;
    check_true("dropout mask == cpu::dropout_forward mask (p=0.1)", same);
    check("dropout fwd == cpu::dropout_forward", host(y), to_d(cy.to_float_vector()), 0.0);
  }
}

// out, lse, dq, dk, dv of a flash call against attention_reference's, tolerances as test_attention
// (1e-2 for the bf16 outputs of bf16 tensor-core arithmetic, 1e-3 for the fp32 lse).
void check_attn_vs_ref(const std::string& nm, const V& o, const V& l, const V& dq, const V& dk, const V& dv,
                       const AttnRef& r) {
  check(nm + " out", o, r.o, 1e-2);
  check(nm + " lse", l, r.lse, 1e-3);
  check(nm + " dq", dq, r.dq, 1e-2);
  check(nm + " dk", dk, r.dk, 1e-2);
  check(nm + " dv", dv, r.dv, 1e-2);
}

// Attention dropout in the flash kernels (attention.cu kDrop kernels; docs/cuda.md "Attention").
// 1. Mask probe, exact: Q = 0 makes every visible probability 1/n_i; V = the identity per K/V group
//    (sk = d) makes out[i, h, c] = F_ic / n_i and dO = the identity per head (s = d) makes
//    dv[j, g, c] = sum_h (P∘F)_cj: an element is zero iff it was dropped, so the forward's and the
//    backward's masks are read out exactly and compared element for element with ref_keep_scale
//    (the SplitMix64 stream re-derived here), for flash (v2 8 warps, v2 4 warps, v1) and generic.
//    The dropped fraction of those draws is within 5 binomial sigma of p (with the mask equality
//    this is the kernels' dropped fraction).
// 2. Random inputs (flash_cases() and s = 100 at d 128): flash with dropout vs the float64 reference (attention_reference, the same
//    F), tolerances as test_attention (out/dq/dk/dv 1e-2: P and dS rounded to bf16 for the tensor
//    cores, bf16 outputs; lse 1e-3, fp32 of bf16 scores), and flash vs generic on the same inputs and
//    stream key, 1e-2 (both are within 1e-2 of the reference; they differ by bf16 rounding of P, dS
//    and summation order only, as the masks are equal by 1.).
// 3. Negative control: a different stream key (offset + 1) must change the output (rel diff > 0.1:
//    an independent mask moves O = (P∘F)V/l by ~sqrt(2p) of its norm, 0.45 at p = 0.1).
void test_attention_dropout() {
  const int impls[] = {2, 3, 1};  // flash v2 8 warps, v2 4 warps, v1 (as test_attention)
  auto set_impl = [](int impl) {
    cu::variants::forced().flash_v1 = impl == 1;
    cu::variants::forced().flash_small = impl == 3 ? 1 : 0;
  };
  auto impl_name = [](int impl) { return impl == 1 ? "v1" : impl == 3 ? "v2s" : "v2"; };
  // 1. mask probe
  for (int D : {64, 128})
    for (bool causal : {false, true})
      for (float pdrop : {0.1f, 0.5f}) {
        const int S = D, SK = D, B = 2, NP = 4, NG = 2, npg = NP / NG;
        ops::AttentionParams p;
        p.softmax_scale = 1.0f / std::sqrt((float)D);
        p.causal = causal;
        p.dropout_p = pdrop;
        p.seed = 20260;
        p.offset = 11;
        V q((size_t)S * B * NP * D, 0.0f), k = rounded(randn((int64_t)SK * B * NG * D), DType::kBFloat16),
            v((size_t)SK * B * NG * D, 0.0f), dout((size_t)S * B * NP * D, 0.0f);
        for (int j = 0; j < SK; ++j)
          for (int bi = 0; bi < B; ++bi)
            for (int g = 0; g < NG; ++g) v[(((size_t)j * B + bi) * NG + g) * D + j] = 1.0f;
        for (int i = 0; i < S; ++i)
          for (int bi = 0; bi < B; ++bi)
            for (int h = 0; h < NP; ++h) dout[(((size_t)i * B + bi) * NP + h) * D + i] = 1.0f;
        Tensor Q = dev(q, {S, B, NP, D}, DType::kBFloat16), K = dev(k, {SK, B, NG, D}, DType::kBFloat16),
               Vv = dev(v, {SK, B, NG, D}, DType::kBFloat16), DO = dev(dout, {S, B, NP, D}, DType::kBFloat16);
        for (int impl : {2, 3, 1, -1}) {  // -1: generic
          set_impl(impl);
          setenv("MEGATRON_ATTENTION_BACKEND", impl < 0 ? "generic" : "flash", 1);
          Tensor O = poisoned({S, B, NP, D}, DType::kBFloat16), L = poisoned({B, NP, S}, DType::kFloat32);
          cu::attention_forward(Q, K, Vv, p, O, L);
          Tensor DQ = poisoned({S, B, NP, D}, DType::kBFloat16), DK = poisoned({SK, B, NG, D}, DType::kBFloat16),
                 DV = poisoned({SK, B, NG, D}, DType::kBFloat16);
          cu::attention_backward(DO, Q, K, Vv, O, L, p, DQ, DK, DV);
          const V o = host(O), dv = host(DV);
          int64_t fwd_bad = 0, bwd_bad = 0, drawn = 0, dropped = 0;
          for (int bi = 0; bi < B; ++bi)
            for (int h = 0; h < NP; ++h)
              for (int i = 0; i < S; ++i)
                for (int j = 0; j < (causal ? i + 1 : SK); ++j) {
                  const uint64_t idx = (((uint64_t)bi * NP + h) * S + i) * SK + j;
                  const bool keep = ref_keep_scale(p.seed, p.offset, idx, pdrop) != 0.0;
                  ++drawn;
                  dropped += !keep;
                  const float got = o[(((size_t)i * B + bi) * NP + h) * D + j];
                  if ((got != 0.0f) != keep || !std::isfinite(got)) ++fwd_bad;
                }
          // dv[j, g, c=i] = sum over the group's heads h of (P∘F)[h, i, j]: zero iff dropped in every head
          for (int bi = 0; bi < B; ++bi)
            for (int g = 0; g < NG; ++g)
              for (int j = 0; j < SK; ++j)
                for (int i = causal ? j : 0; i < S; ++i) {
                  bool any = false;
                  for (int hh = 0; hh < npg; ++hh)
                    any |= ref_keep_scale(p.seed, p.offset, (((uint64_t)bi * NP + g * npg + hh) * S + i) * SK + j,
                                          pdrop) != 0.0;
                  const float got = dv[(((size_t)j * B + bi) * NG + g) * D + i];
                  if ((got != 0.0f) != any || !std::isfinite(got)) ++bwd_bad;
                }
          char nm[160];
          std::snprintf(nm, sizeof nm, "attn dropout %s mask probe d=%d %s p=%.1f", impl < 0 ? "generic" : impl_name(impl),
                        D, causal ? "causal" : "full", pdrop);
          check_true(std::string(nm) + " fwd mask == stream", fwd_bad == 0, std::to_string(fwd_bad) + " differ");
          check_true(std::string(nm) + " bwd mask == stream", bwd_bad == 0, std::to_string(bwd_bad) + " differ");
          const double frac = (double)dropped / (double)drawn;
          const double sigma = std::sqrt(pdrop * (1.0 - pdrop) / (double)drawn);
          check_true(std::string(nm) + " dropped fraction ~ p", std::fabs(frac - pdrop) < 5.0 * sigma,
                     "dropped " + std::to_string(frac) + " of " + std::to_string(drawn));
        }
      }
  // 2./3. random inputs
  std::vector<FlashCase> cases = flash_cases();
  if (!g_small) cases.push_back({100, 100, 1, 4, 2, 128, false, false});  // s % 64 != 0 at d 128, full
  for (const FlashCase& cs : cases)
    for (float pdrop : {0.1f, 0.5f}) {
      const int S = cs.S, SK = cs.SK, B = cs.B, NP = cs.NP, NG = cs.NG, D = cs.D;
      const DType dt = DType::kBFloat16;
      const AttnInputs in = attn_inputs(S, SK, B, NP, NG, D, dt, cs.mask);
      const V &q = in.q, &k = in.k, &v = in.v, &dout = in.dout;
      const std::vector<uint8_t>& mask = in.mask;
      const Tensor Mt = cs.mask ? attn_mask_tensor(mask, B, S, SK) : Tensor();
      const ops::AttentionParams p = flash_case_params(cs, pdrop, 987, 5, Mt);
      const AttnRef r = attention_reference(q, k, v, dout, cs.mask ? &mask : nullptr, S, SK, B, NP, NG, D, p);
      Tensor Q = dev(q, {S, B, NP, D}, dt), K = dev(k, {SK, B, NG, D}, dt), Vv = dev(v, {SK, B, NG, D}, dt),
             DO = dev(dout, {S, B, NP, D}, dt);
      struct Res {
        V o, l, dq, dk, dv;
      };
      auto run = [&](const char* backend, int impl, uint64_t offset) {
        set_impl(impl);
        setenv("MEGATRON_ATTENTION_BACKEND", backend, 1);
        ops::AttentionParams pp = p;
        pp.offset = offset;
        Tensor O = poisoned({S, B, NP, D}, dt), L = poisoned({B, NP, S}, DType::kFloat32);
        cu::attention_forward(Q, K, Vv, pp, O, L);
        Tensor DQ = poisoned({S, B, NP, D}, dt), DK = poisoned({SK, B, NG, D}, dt), DV = poisoned({SK, B, NG, D}, dt);
        cu::attention_backward(DO, Q, K, Vv, O, L, pp, DQ, DK, DV);
        return Res{host(O), host(L), host(DQ), host(DK), host(DV)};
      };
      const Res gen = run("generic", 2, p.offset);
      char base[128];
      std::snprintf(base, sizeof base, "s=%d sk=%d b=%d np=%d ng=%d d=%d %s p=%.1f", S, SK, B, NP, NG, D,
                    cs.mask ? "mask" : cs.causal ? "causal" : "full", pdrop);
      for (int impl : impls) {
        const Res fl = run("flash", impl, p.offset);
        const std::string nm = std::string("attn dropout flash ") + (impl == 1 || S % 4 ? "v1" : impl_name(impl)) + " " + base;
        check_attn_vs_ref(nm, fl.o, fl.l, fl.dq, fl.dk, fl.dv, r);
        check(nm + " out == generic", fl.o, to_d(gen.o), 1e-2);
        check(nm + " lse == generic", fl.l, to_d(gen.l), 1e-3);
        check(nm + " dq == generic", fl.dq, to_d(gen.dq), 1e-2);
        check(nm + " dk == generic", fl.dk, to_d(gen.dk), 1e-2);
        check(nm + " dv == generic", fl.dv, to_d(gen.dv), 1e-2);
      }
      // auto sends bf16 dropout to the flash kernels (not cuDNN): same result as forced flash v2.
      {
        cu::variants::forced().flash_v1 = false;
        cu::variants::forced().flash_small = -1;
        setenv("MEGATRON_ATTENTION_BACKEND", "auto", 1);
        Tensor O = poisoned({S, B, NP, D}, dt), L = poisoned({B, NP, S}, DType::kFloat32);
        cu::attention_forward(Q, K, Vv, p, O, L);
        check(std::string("attn dropout auto ") + base + " out == generic", host(O), to_d(gen.o), 1e-2);
      }
      // negative control: another stream key gives another mask
      const Res other = run("flash", 2, p.offset + 1);
      double num = 0, den = 0;
      for (size_t i = 0; i < other.o.size(); ++i) {
        num += ((double)other.o[i] - gen.o[i]) * ((double)other.o[i] - gen.o[i]);
        den += (double)gen.o[i] * gen.o[i];
      }
      const double rel = std::sqrt(num / std::max(den, 1e-300));
      check_true(std::string("attn dropout flash ") + base + " other stream key differs", rel > 0.1,
                 "rel diff " + std::to_string(rel));
    }
  cu::variants::forced().flash_v1 = false;
  cu::variants::forced().flash_small = -1;
  unsetenv("MEGATRON_ATTENTION_BACKEND");
}

// The deterministic flash backward (--deterministic-mode; attention.cu fa_bwd_dq_kernel after the
// dK/dV kernels without their dQ atomics; docs/cuda.md "Deterministic mode"). For flash_cases()
// (causal, full with s != sk, explicit mask with s % 4 != 0, GQA, head dims 64/128), attention
// dropout 0 and 0.1, each flash variant (v2 8 warps, v2 4 warps, v1) and auto:
// 1. two forward+backward calls in deterministic mode give bitwise-equal out, lse, dq, dk, dv
//    (fresh NaN-poisoned outputs each call; the atomics backward's dq, called twice the same way, is
//    printed as INFO: it may or may not differ at these sizes, so it is no check);
// 2. out, lse, dq, dk, dv against the float64 reference (attention_reference, the same dropout
//    keep-scales), tolerances as test_attention (1e-2: P and dS rounded to bf16 for the tensor
//    cores, bf16 outputs; lse 1e-3);
// 3. dk and dv equal the atomics backward's bit for bit (the same dK/dV code with its dQ part
//    skipped), dq within 1e-2 of it (both within 1e-2 of float64);
// 4. the forced variant flash_dq_two_pass outside deterministic mode equals deterministic mode bit
//    for bit (the same kernels: what dev/cuda/flash times).
void test_attention_deterministic() {
  auto set_impl = [](int impl) {
    cu::variants::forced().flash_v1 = impl == 1;
    cu::variants::forced().flash_small = impl == 3 ? 1 : impl == 2 ? 0 : -1;
  };
  auto impl_name = [](int impl) { return impl == 1 ? "v1" : impl == 3 ? "v2s" : impl == 2 ? "v2" : "auto"; };
  auto bits_differ = [](const V& x, const V& y) {
    int64_t n = x.size() != y.size() ? 1 : 0;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) n += std::memcmp(&x[i], &y[i], sizeof(float)) != 0;
    return n;
  };
  for (const FlashCase& cs : flash_cases())
    for (float pdrop : {0.0f, 0.1f}) {
      const int S = cs.S, SK = cs.SK, B = cs.B, NP = cs.NP, NG = cs.NG, D = cs.D;
      const DType dt = DType::kBFloat16;
      const AttnInputs in = attn_inputs(S, SK, B, NP, NG, D, dt, cs.mask);
      const Tensor Mt = cs.mask ? attn_mask_tensor(in.mask, B, S, SK) : Tensor();
      const ops::AttentionParams p = flash_case_params(cs, pdrop, 4242, 3, Mt);
      const AttnRef r = attention_reference(in.q, in.k, in.v, in.dout, cs.mask ? &in.mask : nullptr, S, SK, B, NP, NG, D, p);
      Tensor Q = dev(in.q, {S, B, NP, D}, dt), K = dev(in.k, {SK, B, NG, D}, dt), Vv = dev(in.v, {SK, B, NG, D}, dt),
             DO = dev(in.dout, {S, B, NP, D}, dt);
      struct Res {
        V o, l, dq, dk, dv;
      };
      // det: deterministic mode; two_pass: the forced variant (outside deterministic mode)
      auto run = [&](const char* backend, int impl, bool det, bool two_pass) {
        set_impl(impl);
        setenv("MEGATRON_ATTENTION_BACKEND", backend, 1);
        ops::set_deterministic_mode(det);
        cu::variants::forced().flash_dq_two_pass = two_pass;
        Tensor O = poisoned({S, B, NP, D}, dt), L = poisoned({B, NP, S}, DType::kFloat32);
        cu::attention_forward(Q, K, Vv, p, O, L);
        Tensor DQ = poisoned({S, B, NP, D}, dt), DK = poisoned({SK, B, NG, D}, dt), DV = poisoned({SK, B, NG, D}, dt);
        cu::attention_backward(DO, Q, K, Vv, O, L, p, DQ, DK, DV);
        Res res{host(O), host(L), host(DQ), host(DK), host(DV)};
        ops::set_deterministic_mode(false);
        cu::variants::forced().flash_dq_two_pass = false;
        return res;
      };
      char base[128];
      std::snprintf(base, sizeof base, "s=%d sk=%d b=%d np=%d ng=%d d=%d %s p=%.1f", S, SK, B, NP, NG, D,
                    cs.mask ? "mask" : cs.causal ? "causal" : "full", pdrop);
      for (int impl : {2, 3, 1, 0}) {  // 0: auto (deterministic mode's own choice of backend and variant)
        const char* backend = impl == 0 ? "auto" : "flash";
        const Res a = run(backend, impl, true, false), b = run(backend, impl, true, false);
        const Res at = run("flash", impl, false, false), at2 = run("flash", impl, false, false);
        const std::string nm = std::string("attn det ") + (impl == 1 || (impl != 0 && S % 4) ? "v1" : impl_name(impl)) + " " + base;
        const int64_t nd = bits_differ(a.o, b.o) + bits_differ(a.l, b.l) + bits_differ(a.dq, b.dq) +
                           bits_differ(a.dk, b.dk) + bits_differ(a.dv, b.dv);
        check_true(nm + " two calls bitwise equal", nd == 0, std::to_string(nd) + " elements differ");
        std::printf("INFO %-58s atomics dq: %lld of %zu elements differ between two calls\n", nm.c_str(),
                    (long long)bits_differ(at.dq, at2.dq), at.dq.size());
        check_attn_vs_ref(nm, a.o, a.l, a.dq, a.dk, a.dv, r);
        check(nm + " dq == atomics dq", a.dq, to_d(at.dq), 1e-2);
        if (impl != 0) {  // auto outside deterministic mode may run cuDNN: compare the forced flash variants only
          const int64_t kv = bits_differ(a.dk, at.dk) + bits_differ(a.dv, at.dv);
          check_true(nm + " dk, dv == atomics backward's bitwise", kv == 0, std::to_string(kv) + " elements differ");
          const Res f = run("flash", impl, false, true);
          const int64_t fd = bits_differ(a.dq, f.dq) + bits_differ(a.dk, f.dk) + bits_differ(a.dv, f.dv);
          check_true(nm + " forced two-pass variant == deterministic mode", fd == 0, std::to_string(fd) + " elements differ");
        }
      }
    }
  cu::variants::forced().flash_v1 = false;
  cu::variants::forced().flash_small = -1;
  unsetenv("MEGATRON_ATTENTION_BACKEND");
}

void test_adam() {
  const int64_t n = g_small ? 1000 : 100001;
  // gscale != 1: AdamParams::grad_scale, the clip coefficient applied as the gradient is read
  for (float gscale : {1.0f, 0.37f})
  for (bool dec : {true, false}) {
    V p = randn(n), g = randn(n, 0.1f), m = randn(n, 0.01f), v = uniform(n, 0.0f, 0.01f);
    ops::AdamParams ap;
    ap.lr = 1e-3f;
    ap.weight_decay = 0.1f;
    ap.step = 7;
    ap.decoupled = dec;
    Tensor P = dev(p, {n}, DType::kFloat32), G = dev(g, {n}, DType::kFloat32), M = dev(m, {n}, DType::kFloat32),
           Vt = dev(v, {n}, DType::kFloat32), MP = poisoned({n}, DType::kBFloat16);
    ap.grad_scale = gscale;
    cu::adam_step(P, G, M, Vt, ap, &MP);
    for (auto& x : g) x *= gscale;  // the reference clips first (fp32 product, like scale_)
    VD rp(n), rm(n), rv(n), rmp(n);
    const double bc1 = 1 - std::pow((double)ap.beta1, 7.0), bc2 = 1 - std::pow((double)ap.beta2, 7.0);
    for (int64_t i = 0; i < n; ++i) {
      double gi = dec ? g[i] : g[i] + (double)ap.weight_decay * p[i];
      double mi = ap.beta1 * (double)m[i] + (1 - (double)ap.beta1) * gi;
      double vi = ap.beta2 * (double)v[i] + (1 - (double)ap.beta2) * gi * gi;
      double upd = (mi / bc1) / (std::sqrt(vi / bc2) + ap.eps) + (dec ? ap.weight_decay * (double)p[i] : 0.0);
      rp[i] = p[i] - ap.lr * upd;
      rm[i] = mi;
      rv[i] = vi;
      rmp[i] = round_bf16((float)rp[i]);
    }
    std::string nm = std::string(dec ? "adam_step adamw" : "adam_step L2") + (gscale != 1.0f ? " clip-scaled" : "");
    check(nm + " param", host(P), rp, 1e-5);
    check(nm + " exp_avg", host(M), rm, 1e-5);
    check(nm + " exp_avg_sq", host(Vt), rv, 1e-5);
    check(nm + " bf16 model param", host(MP), rmp, 1e-2);
  }
  // adam_step_multi (gpt2perf): several tensors (sizes around the 8192-element block chunk, a
  // misaligned view, model params bf16 / none / fp16, per-tensor lr and weight decay) in one call,
  // against the float64 formula (1e-5) and against adam_step per tensor (1e-6).
  for (bool dec : {true, false}) {
    struct Tc { int64_t n, off; int kind; float lr, wd; };  // kind: 0 none, 1 bf16, 2 fp16 model param
    const std::vector<Tc> tcs = g_small ? std::vector<Tc>{{1000, 0, 1, 1e-3f, 0.1f}, {37, 1, 0, 2e-3f, 0.0f}}
                                        : std::vector<Tc>{{100001, 0, 1, 1e-3f, 0.1f}, {768, 0, 1, 2e-3f, 0.0f},
                                                          {5, 0, 0, 1e-3f, 0.1f},      {8192 * 3 + 17, 1, 2, 5e-4f, 0.05f},
                                                          {8192, 0, 1, 1e-3f, 0.1f}};
    const float gscale = 0.61f;
    ops::AdamParams ap;
    ap.step = 11;
    ap.decoupled = dec;
    std::vector<Tensor> P, G, M, Vt, MP, P2, M2, V2, MP2, P3, M3, V3, MP3;
    std::vector<V> hp, hg, hm, hv;
    std::vector<ops::AdamTensor> ts;
    auto view_at = [&](const V& x, const Tc& tc) {  // a view at element offset tc.off (off 1: not 16-byte aligned)
      V big(tc.n + tc.off, 0.0f);
      std::copy(x.begin(), x.end(), big.begin() + tc.off);
      return dev(big, {tc.n + tc.off}, DType::kFloat32).flat_slice(tc.off, {tc.n});
    };
    for (const auto& tc : tcs) {
      hp.push_back(randn(tc.n));
      hg.push_back(randn(tc.n, 0.1f));
      hm.push_back(randn(tc.n, 0.01f));
      hv.push_back(uniform(tc.n, 0.0f, 0.01f));
      auto view = [&](const V& x) { return view_at(x, tc); };
      P.push_back(view(hp.back()));
      G.push_back(view(hg.back()));
      M.push_back(view(hm.back()));
      Vt.push_back(view(hv.back()));
      P2.push_back(view(hp.back()));
      M2.push_back(view(hm.back()));
      V2.push_back(view(hv.back()));
      P3.push_back(view(hp.back()));
      M3.push_back(view(hm.back()));
      V3.push_back(view(hv.back()));
      const DType md = tc.kind == 1 ? DType::kBFloat16 : DType::kFloat16;
      MP.push_back(tc.kind ? poisoned({tc.n}, md) : Tensor());
      MP2.push_back(tc.kind ? poisoned({tc.n}, md) : Tensor());
      MP3.push_back(tc.kind ? poisoned({tc.n}, md) : Tensor());
    }
    for (size_t k = 0; k < tcs.size(); ++k) {
      ops::AdamTensor t;
      t.param = &P[k];
      t.grad = &G[k];
      t.exp_avg = &M[k];
      t.exp_avg_sq = &Vt[k];
      t.model_param = tcs[k].kind ? &MP[k] : nullptr;
      t.lr = tcs[k].lr;
      t.weight_decay = tcs[k].wd;
      ts.push_back(t);
    }
    ap.grad_scale = gscale;
    cu::adam_step_multi(ts, ap);
    for (size_t k = 0; k < tcs.size(); ++k) {
      ops::AdamParams a1 = ap;
      a1.lr = tcs[k].lr;
      a1.weight_decay = tcs[k].wd;
      cu::adam_step(P2[k], G[k], M2[k], V2[k], a1, tcs[k].kind ? &MP2[k] : nullptr);
      const int64_t n = tcs[k].n;
      VD rp(n), rm(n), rv(n);
      const double bc1 = 1 - std::pow((double)ap.beta1, 11.0), bc2 = 1 - std::pow((double)ap.beta2, 11.0);
      for (int64_t i = 0; i < n; ++i) {
        const double gs = (double)(hg[k][i] * gscale);  // the fp32 product, like the kernel
        const double gi = dec ? gs : gs + (double)a1.weight_decay * hp[k][i];
        const double mi = ap.beta1 * (double)hm[k][i] + (1 - (double)ap.beta1) * gi;
        const double vi = ap.beta2 * (double)hv[k][i] + (1 - (double)ap.beta2) * gi * gi;
        const double upd = (mi / bc1) / (std::sqrt(vi / bc2) + ap.eps) + (dec ? a1.weight_decay * (double)hp[k][i] : 0.0);
        rp[i] = hp[k][i] - a1.lr * upd;
        rm[i] = mi;
        rv[i] = vi;
      }
      char nm[96];
      std::snprintf(nm, sizeof nm, "adam_step_multi %s n=%ld off=%ld mp=%d", dec ? "adamw" : "L2", (long)n,
                    (long)tcs[k].off, tcs[k].kind);
      check(std::string(nm) + " param", host(P[k]), rp, 1e-5);
      check(std::string(nm) + " exp_avg", host(M[k]), rm, 1e-5);
      check(std::string(nm) + " exp_avg_sq", host(Vt[k]), rv, 1e-5);
      // Same code per element: expected bit-identical; 1e-6 allows a different FMA contraction.
      const V b = host(P2[k]);
      check(std::string(nm) + " vs adam_step per tensor param", host(P[k]), VD(b.begin(), b.end()), 1e-6);
      if (tcs[k].kind) {
        const V bm = host(MP2[k]);
        check(std::string(nm) + " vs adam_step per tensor model param", host(MP[k]), VD(bm.begin(), bm.end()), 1e-6);
      }
    }
    // The tensor table in a caller's workspace (AdamParams::table_workspace, the overlapped
    // optimizer step's launches): the same launches, so the same bits (tolerance 0).
    std::vector<ops::AdamTensor> ts3 = ts;
    for (size_t k = 0; k < tcs.size(); ++k) {
      ts3[k].param = &P3[k];
      ts3[k].exp_avg = &M3[k];
      ts3[k].exp_avg_sq = &V3[k];
      ts3[k].model_param = tcs[k].kind ? &MP3[k] : nullptr;
    }
    Tensor ws = Tensor::empty({static_cast<int64_t>(tcs.size()) * ops::kAdamTableBytesPerTensor}, DType::kUInt8,
                              P3[0].device());
    ops::AdamParams a3 = ap;
    a3.table_workspace = &ws;
    cu::adam_step_multi(ts3, a3);
    for (size_t k = 0; k < tcs.size(); ++k) {
      const std::string nm = std::string("adam_step_multi table workspace ") + (dec ? "adamw" : "L2") + " n=" +
                             std::to_string(tcs[k].n);
      const V a = host(P[k]), am = host(M[k]), av = host(Vt[k]);
      check(nm + " param", host(P3[k]), VD(a.begin(), a.end()), 0.0);
      check(nm + " exp_avg", host(M3[k]), VD(am.begin(), am.end()), 0.0);
      check(nm + " exp_avg_sq", host(V3[k]), VD(av.begin(), av.end()), 0.0);
      if (tcs[k].kind) {
        const V bm = host(MP[k]);
        check(nm + " model param", host(MP3[k]), VD(bm.begin(), bm.end()), 0.0);
      }
    }
    // Every multi-tensor kernel (variants.h adam_kernel: v1 = the kernel before Session 11, u2,
    // u4, ...; docs/cuda.md "Kernel variants") on fresh copies of the same inputs: bit-identical
    // to the automatic choice's step above (the same per-element arithmetic, adam_update.cuh; only
    // the element-to-thread mapping and the access hints differ), tolerance 0.
    for (int kv = 0; cu::variants::adam_kernel_name(kv); ++kv) {
      std::vector<Tensor> P4, M4, V4, MP4;
      for (size_t k = 0; k < tcs.size(); ++k) {
        P4.push_back(view_at(hp[k], tcs[k]));
        M4.push_back(view_at(hm[k], tcs[k]));
        V4.push_back(view_at(hv[k], tcs[k]));
        MP4.push_back(tcs[k].kind ? poisoned({tcs[k].n}, tcs[k].kind == 1 ? DType::kBFloat16 : DType::kFloat16)
                                  : Tensor());
      }
      std::vector<ops::AdamTensor> ts4 = ts;
      for (size_t k = 0; k < tcs.size(); ++k) {
        ts4[k].param = &P4[k];
        ts4[k].exp_avg = &M4[k];
        ts4[k].exp_avg_sq = &V4[k];
        ts4[k].model_param = tcs[k].kind ? &MP4[k] : nullptr;
      }
      cu::variants::forced().adam_kernel = kv;
      cu::adam_step_multi(ts4, ap);
      cu::variants::forced().adam_kernel = -1;
      for (size_t k = 0; k < tcs.size(); ++k) {
        const std::string nm = std::string("adam_step_multi kernel ") + cu::variants::adam_kernel_name(kv) + " " +
                               (dec ? "adamw" : "L2") + " n=" + std::to_string(tcs[k].n) +
                               " off=" + std::to_string(tcs[k].off);
        const V a = host(P[k]), am = host(M[k]), av = host(Vt[k]);
        check(nm + " param", host(P4[k]), VD(a.begin(), a.end()), 0.0);
        check(nm + " exp_avg", host(M4[k]), VD(am.begin(), am.end()), 0.0);
        check(nm + " exp_avg_sq", host(V4[k]), VD(av.begin(), av.end()), 0.0);
        if (tcs[k].kind) {
          const V bm = host(MP[k]);
          check(nm + " model param", host(MP4[k]), VD(bm.begin(), bm.end()), 0.0);
        }
      }
    }
  }
}
// Ops added with the model (transpose01, bias_add_, rope_forward/backward, CE combine steps):
// checked against float64 host formulas, and RoPE also against the CPU reference op.
void test_model_ops() {
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    for (int64_t row : {int64_t(7), int64_t(64)}) {
      const int64_t d0 = g_small ? 3 : 33, d1 = 4;
      V x = rounded(randn(d0 * d1 * row), dt);
      Tensor X = dev(x, {d0, d1, row}, dt), Y = poisoned({d1, d0, row}, dt);
      cu::transpose01(X, Y);
      VD r(x.size());
      for (int64_t a = 0; a < d1; ++a)
        for (int64_t b = 0; b < d0; ++b)
          for (int64_t c = 0; c < row; ++c) r[(a * d0 + b) * row + c] = x[(b * d1 + a) * row + c];
      check(std::string("transpose01 row=") + std::to_string(row) + " " + dn(dt), host(Y), r, 0.0);
    }
    for (DType bd : {DType::kFloat32, DType::kBFloat16}) {
      const int64_t rows = 19, n = 40;
      V y = rounded(randn(rows * n), dt), b = rounded(randn(n), bd);
      Tensor Y = dev(y, {rows, n}, dt), B = dev(b, {n}, bd);
      cu::bias_add_(Y, B);
      VD r(rows * n);
      for (int64_t i = 0; i < rows * n; ++i) r[i] = (double)y[i] + b[i % n];
      check(std::string("bias_add_ y ") + dn(dt) + " bias " + dn(bd), host(Y), r, tol_for(dt));
    }
    for (int rv = 0; rv < 3; ++rv) {
      const bool inter = rv == 1, scaled = rv == 2;
      const int64_t s = g_small ? 5 : 29, b = 2, n = 3, d = 64;
      ops::RopeParams rp;
      rp.enabled = true;
      rp.interleaved = inter;
      rp.percent = inter || scaled ? 1.0f : 0.5f;
      if (scaled) {  // --rotary-base 500000 --use-rope-scaling --rope-scaling-factor 32 --rotary-seq-len-interpolation-factor 3
        rp.base = 500000.0f;
        rp.scaling.enabled = true;
        rp.scaling.factor = 32.0f;
        rp.position_scale = ops::rope_position_scale(3.0);
      }
      V x = rounded(randn(s * b * n * d), dt);
      std::vector<int64_t> pos(s * b);
      std::uniform_int_distribution<int64_t> dp(0, 63);
      for (auto& p : pos) p = dp(g_rng);
      Tensor Pc = Tensor::from_vector_i64(pos, {s, b}), P = Pc.to(Device::cuda());
      Tensor Xc = Tensor::from_vector(x, {s, b, n, d});
      if (dt != DType::kFloat32) Xc = Xc.to(dt);
      Tensor Yc = Tensor::empty({s, b, n, d}, dt), DXc = Tensor::empty({s, b, n, d}, dt);
      ops::cpu::rope_forward(Xc, rp, &Pc, Yc);
      ops::cpu::rope_backward(Xc, rp, &Pc, DXc);
      Tensor X = dev(x, {s, b, n, d}, dt), Y = poisoned({s, b, n, d}, dt);
      cu::rope_forward(X, rp, &P, Y);
      std::string nm = std::string("rope ") + (inter ? "interleaved" : scaled ? "half llama3-scaled f32 interp3" : "half 50%") + " " + dn(dt);
      check(nm + " fwd vs cpu::rope_forward", host(Y), to_d(Yc.to_float_vector()), tol_for(dt));
      cu::rope_backward(X, rp, &P, X);  // in place
      check(nm + " bwd in-place vs cpu::rope_backward", host(X), to_d(DXc.to_float_vector()), tol_for(dt));
    }
  }
  {
    const int64_t n = 1000;
    V s = uniform(n, 1.0f, 100.0f), m = randn(n), M(n), P = randn(n);
    for (int64_t i = 0; i < n; ++i) M[i] = m[i] + std::fabs(randn(1)[0]);
    Tensor S = dev(s, {n}, DType::kFloat32), Mm = dev(m, {n}, DType::kFloat32), MM = dev(M, {n}, DType::kFloat32);
    cu::cross_entropy_rescale_(S, Mm, MM);
    VD r(n);
    for (int64_t i = 0; i < n; ++i) r[i] = s[i] * std::exp((double)m[i] - M[i]);
    V sg = host(S);
    check("cross_entropy_rescale_", sg, r, 1e-5);
    Tensor PP = dev(P, {n}, DType::kFloat32), L = poisoned({n}, DType::kFloat32), LSE = poisoned({n}, DType::kFloat32);
    cu::cross_entropy_loss(MM, S, PP, L, LSE);
    VD rl(n), rlse(n);
    for (int64_t i = 0; i < n; ++i) {
      rlse[i] = std::log((double)sg[i]) + M[i];
      rl[i] = rlse[i] - P[i];
    }
    check("cross_entropy_loss loss", host(L), rl, 1e-5);
    check("cross_entropy_loss lse", host(LSE), rlse, 1e-5);
  }
}
// The decode step's device-position ops inside a CUDA graph (docs/inference.md "CUDA graph of
// the decode step"): kv_cache_write against a host copy (exact: bytes are moved), and one
// captured (cache write + decode attention) replayed at several cache lengths against the
// host-count kernel call on the same rows, bit for bit (same chunking by construction), which
// test_decode checks against float64.
void test_decode_graph_kernels() {
  const DType dt = DType::kBFloat16;
  const int B = 2, NP = 32, NG = 8, D = 128, cap = 700;
  const int64_t row = (int64_t)B * NG * D;
  V kc0 = rounded(randn(cap * row), dt), vc0 = rounded(randn(cap * row), dt);
  V kn = rounded(randn(row), dt), vn = rounded(randn(row), dt);
  Tensor Kc = dev(kc0, {cap, B, NG, D}, dt), Vc = dev(vc0, {cap, B, NG, D}, dt);
  Tensor Kn = dev(kn, {1, B, NG, D}, dt), Vn = dev(vn, {1, B, NG, D}, dt);
  for (int64_t pos : {(int64_t)0, (int64_t)313, (int64_t)cap - 1, (int64_t)cap, (int64_t)-1}) {
    Tensor off = dev_i64({pos}, {1});
    cu::kv_cache_write(Kn, Vn, off, Kc, Vc);
    V rk = kc0, rv = vc0;
    if (pos >= 0 && pos < cap) {
      std::copy(kn.begin(), kn.end(), rk.begin() + pos * row);
      std::copy(vn.begin(), vn.end(), rv.begin() + pos * row);
    }
    check_true("kv_cache_write pos=" + std::to_string(pos) + " (exact, other rows untouched)",
               host(Kc) == rk && host(Vc) == rv);
    kc0 = rk, vc0 = rv;
  }
  // Graph: positions {offset, offset + 1} in device memory, as InferenceContext's.
  void* stream = ops::compute_stream_create();
  void* prev = ops::compute_stream_exchange(stream);
  Tensor positions = dev_i64({0, 1}, {2});
  Tensor off = positions.flat_slice(0, {1}), cnt = positions.flat_slice(1, {1});
  V q = rounded(randn((int64_t)B * NP * D), dt);
  Tensor Q = dev(q, {1, B, NP, D}, dt);
  Tensor O = poisoned({1, B, NP, D}, dt), L = poisoned({B, NP, 1}, DType::kFloat32);
  ops::AttentionParams p;
  p.softmax_scale = 1.0f / std::sqrt((float)D);
  p.causal = false;
  p.kv_len = &cnt;
  auto body = [&] {
    cu::kv_cache_write(Kn, Vn, off, Kc, Vc);
    cu::attention_forward(Q, Kc, Vc, p, O, L);
  };
  std::string err;
  void* graph = ops::graph_capture(body, &err);
  check_true("decode step kernels captured in a CUDA graph", graph != nullptr, err);
  if (graph) {
    for (int64_t offset : {(int64_t)0, (int64_t)30, (int64_t)31, (int64_t)64, (int64_t)299, (int64_t)cap - 1}) {
      Tensor h = Tensor::from_vector_i64({offset, offset + 1}, {2});
      positions.copy_(h);
      V kn2 = rounded(randn(row), dt), vn2 = rounded(randn(row), dt);
      Tensor a = dev(kn2, {1, B, NG, D}, dt), b2 = dev(vn2, {1, B, NG, D}, dt);
      Kn.copy_(a);
      Vn.copy_(b2);
      ops::graph_launch(graph);
      ops::AttentionParams ph = p;
      ph.kv_len = nullptr;
      Tensor O2 = poisoned({1, B, NP, D}, dt), L2 = poisoned({B, NP, 1}, DType::kFloat32);
      check_true("decode graph offset " + std::to_string(offset) + " host call taken",
                 cu::decode_attention::forward(Q, Kc.narrow0(0, offset + 1), Vc.narrow0(0, offset + 1), ph, O2, L2));
      V kr = host(Kc.narrow0(offset, 1));
      check_true("decode graph offset " + std::to_string(offset) + ": cache row written, out/lse == host call (bits)",
                 kr == kn2 && host(O) == host(O2) && host(L) == host(L2));
    }
    ops::graph_destroy(graph);
  }
  ops::compute_stream_exchange(prev);
  ops::compute_stream_destroy(stream);
}

// A small random bf16 model on the GPU: LLaMA-like (RoPE, RMSNorm, SwiGLU, GQA 8:2, untied) or
// GPT-2-like (learned positions, LayerNorm, GeLU, biases, MHA, tied), head dim 64.
std::unique_ptr<models::gpt::GPTModel> decode_model(bool llama, uint64_t seed) {
  transformer::TransformerConfig c;
  c.num_layers = 3;
  c.hidden_size = llama ? 512 : 256;
  c.num_attention_heads = llama ? 8 : 4;
  c.kv_channels = 64;
  c.num_query_groups = llama ? 2 : 4;
  c.ffn_hidden_size = 1024;
  c.params_dtype = DType::kBFloat16;
  c.hidden_dropout = c.attention_dropout = 0.0f;
  c.init_method_std = 0.05f;
  if (llama) {
    c.normalization = transformer::Normalization::kRMSNorm;
    c.gated_linear_unit = true;  // SwiGLU
    c.add_bias_linear = false;
    c.position_embedding_type = transformer::PositionEmbeddingType::kRope;
    c.rotary_base = 500000.0f;
    c.share_embeddings_and_output_weights = false;
  } else {
    c.position_embedding_type = transformer::PositionEmbeddingType::kLearnedAbsolute;
  }
  c.validate();
  return std::make_unique<models::gpt::GPTModel>(c, 512, 256, seed, Device::cuda());
}

// Generation with the CUDA graph of the decode step against the per-op path on the same model:
// tokens, lengths and the log-probs of the generated tokens (from the float32 host logits) must be
// equal BIT FOR BIT: the graph replays the same kernels with the same arguments (the attention's
// chunking is derived from the device count exactly as from the host one, test_decode checks
// that kernel for equality), and cuBLASLt's plans are those of the eager warm-up step. Batch 1 and
// batch 4 with prompt lengths 5, 17, 9, 30; greedy with the device argmax and greedy with
// log-probs (the logits path); a second call reuses the captured graph. The device-argmax cases
// run the pipelined loop (the default: the self-fed kFed graph, step t + 1 launched before step
// t's ids are read, docs/inference.md "Pipelined decode") and the per-step graph
// (set_decode_pipeline(false), MEGATRON_DECODE_CUDA_GRAPH=1); vocab_size 500 of 512 rows, so the
// device clamp of the fed ids is exercised where an argmax lands in the padding. Batch 1 also
// stops early on a termination id taken from the per-op tokens (the step launched ahead is
// discarded; the next request on the same generators must be unaffected).
void test_decode_generate() {
  for (bool llama : {true, false}) {
    auto model = decode_model(llama, 5);
    inference::TextGenerator eager(*model, nullptr, 3), graph(*model, nullptr, 3), stepwise(*model, nullptr, 3);
    eager.set_decode_graph_mode(inference::DecodeGraphMode::kEager);
    graph.set_decode_graph_mode(inference::DecodeGraphMode::kGraph);
    stepwise.set_decode_graph_mode(inference::DecodeGraphMode::kGraph);
    stepwise.set_decode_pipeline(false);
    const char* name = llama ? "llama" : "gpt2";
    std::mt19937 g(11);
    for (int round = 0; round < 2; ++round)
      for (const std::vector<int>& lens : {std::vector<int>{12}, std::vector<int>{5, 17, 9, 30}})
        for (bool logprobs : {false, true}) {
          std::vector<std::vector<int64_t>> prompts;
          for (int n : lens) {
            prompts.emplace_back();
            for (int i = 0; i < n; ++i) prompts.back().push_back(static_cast<int64_t>(g() % 500));
          }
          inference::GenerationParams gp;
          gp.tokens_to_generate = 40;
          gp.top_k = 1;
          gp.return_output_log_probs = logprobs;
          gp.use_eod_token_for_early_termination = false;
          gp.vocab_size = 500;
          std::vector<int64_t> lengths;
          auto rows = inference::pad_prompts(prompts, gp.tokens_to_generate, 0, &lengths);
          auto a = eager.generate(rows, lengths, gp);
          if (round == 0 && logprobs && lens.size() > 1) {  // the baseline: the per-op path is deterministic
            auto a2 = eager.generate(rows, lengths, gp);
            check_true(std::string("decode graph generate ") + name + ": per-op path twice, same log-probs (bits)",
                       a2.log_probs == a.log_probs && a2.tokens == a.tokens);
          }
          const int64_t before = graph.graph_replays(), ahead_before = graph.pipelined_steps();
          auto f = graph.generate(rows, lengths, gp);
          const int64_t L = static_cast<int64_t>(rows[0].size());
          const int64_t min_len = *std::min_element(lengths.begin(), lengths.end());
          const int64_t max_len = *std::max_element(lengths.begin(), lengths.end());
          // Decode steps min_len+1 .. L-1; the first one of a new (batch, output) is the eager warm-up.
          const int64_t steps = L - 1 - min_len;
          std::string what = std::string(name) + " batch " + std::to_string(lens.size()) +
                             (logprobs ? " logits path" : " device argmax") + (round ? " (graph reused)" : "");
          check_true("decode graph generate " + what + ": tokens == eager", a.tokens == f.tokens && a.lengths == f.lengths);
          check_true("decode graph generate " + what + ": log-probs == eager (bits)", a.log_probs == f.log_probs);
          const int64_t replays = graph.graph_replays() - before;
          check_true("decode graph generate " + what + ": replayed",
                     round == 0 ? replays == steps - 1 : replays == steps,
                     std::to_string(replays) + " replays of " + std::to_string(steps) + " decode steps");
          if (logprobs) continue;
          // Pipelined: one step launched ahead in every iteration from the first decode step at
          // or past the longest prompt to position L - 2.
          const int64_t ahead = graph.pipelined_steps() - ahead_before;
          const int64_t want = std::max<int64_t>(0, L - 2 - std::max(max_len, min_len + 1) + 1);
          check_true("decode graph generate " + what + ": pipelined steps", ahead == want,
                     std::to_string(ahead) + " launched ahead, expected " + std::to_string(want));
          const int64_t sb = stepwise.graph_replays();
          auto w = stepwise.generate(rows, lengths, gp);
          check_true("decode graph generate " + what + ": per-step graph tokens == eager",
                     a.tokens == w.tokens && a.lengths == w.lengths && w.log_probs.empty());
          check_true("decode graph generate " + what + ": per-step graph replayed, none ahead",
                     stepwise.graph_replays() - sb == (round == 0 ? steps - 1 : steps) && stepwise.pipelined_steps() == 0);
          if (lens.size() != 1) continue;
          // Early stop: the termination id generated 6 tokens after the prompt (or earlier).
          inference::GenerationParams gs = gp;
          gs.use_eod_token_for_early_termination = true;
          gs.termination_id = a.tokens[0][lengths[0] + 5];
          auto as = eager.generate(rows, lengths, gs);
          const int64_t ahead_stop = graph.pipelined_steps();
          auto fs = graph.generate(rows, lengths, gs);
          check_true("decode graph generate " + what + ": early stop, pipelined tokens == eager",
                     as.tokens == fs.tokens && as.lengths == fs.lengths && fs.log_probs.empty() &&
                         static_cast<int64_t>(as.tokens[0].size()) <= lengths[0] + 6,
                     std::to_string(as.tokens[0].size()) + " tokens");
          const int64_t last = static_cast<int64_t>(as.tokens[0].size()) - 1;  // the step that stopped
          const int64_t want_stop = std::max<int64_t>(0, std::min(last, L - 2) - (min_len + 1) + 1);
          check_true("decode graph generate " + what + ": early stop, steps launched ahead (the last discarded)",
                     graph.pipelined_steps() - ahead_stop == want_stop,
                     std::to_string(graph.pipelined_steps() - ahead_stop) + ", expected " + std::to_string(want_stop));
        }
  }
}

// Text generation's decode ops (docs/inference.md): argmax_last_dim against a host scan in double
// (first maximum, NaN above every number: torch.argmax), exact; the q_len = 1 decode attention
// (attention_decode.cu) against the float64 softmax attention of test_attention, tolerances as
// there (out: bf16 output rounding, 2^-9 relative per element; lse: fp32 sums and exp2).
void test_decode() {
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16})
    for (int64_t Vn : {(int64_t)1, (int64_t)7, (int64_t)5001, g_small ? (int64_t)8200 : (int64_t)128256}) {
      const int64_t N = 6;
      V x = rounded(randn(N * Vn, 3.0f), dt);
      if (Vn > 1) {
        x[1 * Vn + Vn - 1] = 100.0f;                      // row 1: maximum at the end
        x[2 * Vn + Vn / 2] = x[2 * Vn + Vn - 1] = 50.0f;  // row 2: tie, the first one wins
        x[3 * Vn + Vn / 3 + 1] = x[3 * Vn + Vn - 1] = NAN;  // row 3: the first NaN wins
        for (int64_t c = 0; c < Vn; ++c) x[4 * Vn + c] = -INFINITY;  // row 4: all -inf: index 0
        x[5 * Vn] = 1e30f;  // row 5: maximum first (fp16: inf)
      }
      std::vector<int64_t> ref(N);
      for (int64_t r = 0; r < N; ++r) {
        int64_t best = 0;
        for (int64_t c = 1; c < Vn; ++c) {
          const double a = round_to(x[r * Vn + c], dt), b = round_to(x[r * Vn + best], dt);
          if (std::isnan(b)) break;
          if (std::isnan(a) || a > b) best = c;
        }
        ref[r] = best;
      }
      Tensor X = dev(x, {N, Vn}, dt), I = dev_i64(std::vector<int64_t>(N, -7), {N});
      cu::argmax_last_dim(X, I);
      std::vector<int64_t> got(N);
      Tensor ih = I.to(Device::cpu());
      std::memcpy(got.data(), ih.data_ptr(), N * sizeof(int64_t));
      std::string detail;
      for (int64_t r = 0; r < N; ++r) detail += std::to_string(got[r]) + "/" + std::to_string(ref[r]) + " ";
      check_true(std::string("argmax_last_dim V=") + std::to_string(Vn) + " " + dn(dt), got == ref, detail);
    }
  struct Case {
    int SK, B, NP, NG, D;
    bool causal;
  };
  std::vector<Case> cases = g_small ? std::vector<Case>{{37, 2, 4, 2, 64, false}}
                                    : std::vector<Case>{{1, 1, 32, 8, 128, true},   {37, 1, 32, 8, 128, false},
                                                        {300, 1, 32, 8, 128, false}, {2049, 3, 32, 8, 128, false},
                                                        {129, 32, 32, 8, 128, false}, {64, 2, 4, 4, 64, false},
                                                        {500, 2, 16, 2, 64, false},  {77, 5, 8, 1, 128, false}};
  for (const Case& cs : cases) {
    const DType dt = DType::kBFloat16;
    const int SK = cs.SK, B = cs.B, NP = cs.NP, NG = cs.NG, D = cs.D, npg = NP / NG;
    V q = rounded(randn((int64_t)B * NP * D), dt), k = rounded(randn((int64_t)SK * B * NG * D), dt),
      v = rounded(randn((int64_t)SK * B * NG * D), dt);
    ops::AttentionParams p;
    p.softmax_scale = 1.0f / std::sqrt((float)D);
    p.causal = cs.causal;
    Tensor Q = dev(q, {1, B, NP, D}, dt), K = dev(k, {SK, B, NG, D}, dt), Vv = dev(v, {SK, B, NG, D}, dt);
    VD ro((size_t)B * NP * D), rl((size_t)B * NP);
    std::vector<double> P(SK);
    for (int bi = 0; bi < B; ++bi)
      for (int h = 0; h < NP; ++h) {
        const int g = h / npg;
        double m = -1e300;
        for (int j = 0; j < SK; ++j) {
          double sc = 0;
          for (int c = 0; c < D; ++c) sc += (double)q[((size_t)bi * NP + h) * D + c] * k[(((size_t)j * B + bi) * NG + g) * D + c];
          P[j] = sc * p.softmax_scale;
          m = std::max(m, P[j]);
        }
        double sum = 0;
        for (int j = 0; j < SK; ++j) sum += (P[j] = std::exp(P[j] - m));
        rl[(size_t)bi * NP + h] = m + std::log(sum);
        for (int c = 0; c < D; ++c) {
          double acc = 0;
          for (int j = 0; j < SK; ++j) acc += P[j] / sum * v[(((size_t)j * B + bi) * NG + g) * D + c];
          ro[((size_t)bi * NP + h) * D + c] = acc;
        }
      }
    char nm[128];
    std::snprintf(nm, sizeof nm, "attention decode sk=%d b=%d np=%d ng=%d d=%d%s", SK, B, NP, NG, D,
                  cs.causal ? " causal" : "");
    Tensor O = poisoned({1, B, NP, D}, dt), L = poisoned({B, NP, 1}, DType::kFloat32);
    check_true(std::string(nm) + " taken", cu::decode_attention::forward(Q, K, Vv, p, O, L));
    check(std::string(nm) + " out", host(O), ro, 1e-2);
    check(std::string(nm) + " lse", host(L), rl, 1e-3);
    // Through the op (dispatch picks the decode kernel for s == 1).
    Tensor O2 = poisoned({1, B, NP, D}, dt), L2 = poisoned({B, NP, 1}, DType::kFloat32);
    cu::attention_forward(Q, K, Vv, p, O2, L2);
    check(std::string(nm) + " attention_forward out", host(O2), ro, 1e-2);
    if (cs.causal) continue;
    // The key count in device memory (AttentionParams::kv_len, the decode step as a CUDA graph):
    // caches of a larger capacity whose rows past SK hold NaN must give the float64 reference
    // and, since the kernels re-derive the host call's chunking from the count, the host-count
    // call's bits exactly.
    const int cap = SK + 1 + SK / 2 + 97;
    Tensor Kc = poisoned({cap, B, NG, D}, dt), Vc = poisoned({cap, B, NG, D}, dt);
    {
      Tensor kr = Kc.narrow0(0, SK), vr = Vc.narrow0(0, SK);
      kr.copy_(K);
      vr.copy_(Vv);
    }
    Tensor n_keys = dev_i64({SK}, {1});
    ops::AttentionParams pd = p;
    pd.kv_len = &n_keys;
    Tensor O3 = poisoned({1, B, NP, D}, dt), L3 = poisoned({B, NP, 1}, DType::kFloat32);
    check_true(std::string(nm) + " device count taken", cu::decode_attention::forward(Q, Kc, Vc, pd, O3, L3));
    check(std::string(nm) + " device count out", host(O3), ro, 1e-2);
    check(std::string(nm) + " device count lse", host(L3), rl, 1e-3);
    check_true(std::string(nm) + " device count == host count (bits)", host(O3) == host(O) && host(L3) == host(L));
  }
  // Declined: two query rows; causal with more than one key (top-left causal: key 0 only); float32.
  ops::AttentionParams p;
  p.softmax_scale = 0.125f;
  p.causal = false;
  Tensor Q2 = poisoned({2, 1, 4, 64}, DType::kBFloat16), K2 = poisoned({8, 1, 4, 64}, DType::kBFloat16);
  Tensor O2 = poisoned({2, 1, 4, 64}, DType::kBFloat16), L2 = poisoned({1, 4, 2}, DType::kFloat32);
  check_true("attention decode declines s=2", !cu::decode_attention::forward(Q2, K2, K2, p, O2, L2));
  Tensor Q1 = poisoned({1, 1, 4, 64}, DType::kBFloat16), O1 = poisoned({1, 1, 4, 64}, DType::kBFloat16);
  Tensor L1 = poisoned({1, 4, 1}, DType::kFloat32);
  p.causal = true;
  check_true("attention decode declines causal sk=8", !cu::decode_attention::forward(Q1, K2, K2, p, O1, L1));
  p.causal = false;
  Tensor Qf = poisoned({1, 1, 4, 64}, DType::kFloat32), Kf = poisoned({8, 1, 4, 64}, DType::kFloat32);
  Tensor Of = poisoned({1, 1, 4, 64}, DType::kFloat32);
  check_true("attention decode declines float32", !cu::decode_attention::forward(Qf, Kf, Kf, p, Of, L1));
  test_decode_graph_kernels();
  test_decode_generate();
}

// ------------------------------------------------------------------------------------------
// One grouped GEMM case of the moe group: x [Σ counts, in], one [out, in] weight per count.
struct MoeGemmCase {
  const char* name;
  int64_t in, out;
  std::vector<int64_t> counts;
};

// The per-expert loop on several streams (MEGATRON_MOE_GEMM_STREAMS=2, 3, 4; docs/moe.md
// "Kernels") against the serial loop (=1): forward, dgrad, wgrad accumulated into fp32 main grads
// and wgrad overwritten, bf16 and fp32, with both MEGATRON_MOE_GROUPED_GEMM paths (the grouped
// one still loops the bf16 -> fp32 wgrad). The experts write disjoint outputs with the same
// cuBLASLt plans on every stream, so the bytes must be equal (memcmp, no tolerance). The inputs
// are written on the compute stream just before each call and the outputs read on it just after
// (poisoned with NaN before), so a missing fork or join shows as a NaN or a stale value; the
// largest case has GEMMs of ~0.1 ms so that such a race would be wide. The lane counters must show
// that the calls did fork into min(S, experts with rows) lanes, so the comparison cannot pass on a
// path that never left the compute stream.
void test_moe_streams() {
  using Case = MoeGemmCase;
  std::vector<Case> cases = {{"6 experts 192->320", 192, 320, {0, 170, 1, 0, 333, 96}},
                             {"one expert with rows", 128, 64, {0, 0, 77, 0}}};
  if (!g_small) cases.push_back({"8 experts 1024->2048", 1024, 2048, {900, 1100, 1024, 0, 700, 1300, 1, 1024}});
  for (const char* mode : {"1", "0"}) {
    setenv("MEGATRON_MOE_GROUPED_GEMM", mode, 1);
    for (DType dt : {DType::kBFloat16, DType::kFloat32}) {
      for (const Case& c : cases) {
        const int64_t E = static_cast<int64_t>(c.counts.size()), in = c.in, out = c.out;
        int64_t N = 0, busy = 0;
        for (int64_t n : c.counts) N += n, busy += n > 0;
        const V x = rounded(randn(N * in), dt), dyv = rounded(randn(N * out), dt);
        std::vector<V> w(E), g0(E);
        for (int64_t e = 0; e < E; ++e) w[e] = rounded(randn(out * in, 0.05f), dt), g0[e] = randn(out * in, 0.1f);
        // All outputs of one forward + backward (accumulate) + backward (overwrite, no dgrad), as bytes.
        auto run = [&](const char* streams) {
          setenv("MEGATRON_MOE_GEMM_STREAMS", streams, 1);
          std::vector<Tensor> W, G, G2;
          for (int64_t e = 0; e < E; ++e) {
            W.push_back(dev(w[e], {out, in}, dt));
            G.push_back(dev(g0[e], {out, in}, DType::kFloat32));
            G2.push_back(poisoned({out, in}, DType::kFloat32));
          }
          Tensor X = dev(x, {N, in}, dt), DY = dev(dyv, {N, out}, dt), Y = poisoned({N, out}, dt),
                 DX = poisoned({N, in}, dt);
          cu::grouped_linear_forward(X, W, c.counts, Y);
          cu::grouped_linear_backward(DY, X, W, c.counts, &DX, &G, true);
          cu::grouped_linear_backward(DY, X, W, c.counts, nullptr, &G2, false);
          std::vector<char> bytes;
          auto put = [&](const Tensor& t) {
            Tensor h = t.to(Device::cpu());
            const char* p = static_cast<const char*>(h.data_ptr());
            bytes.insert(bytes.end(), p, p + h.numel() * dtype_size(h.dtype()));
          };
          put(Y);
          put(DX);
          for (const Tensor& t : G) put(t);
          for (const Tensor& t : G2) put(t);
          return bytes;
        };
        const std::string tag = std::string("moe streams ") + (mode[0] == '1' ? "grouped " : "loop ") + dn(dt) +
                                " " + c.name;
        cu::expert_lane_counts(true);
        const std::vector<char> serial = run("1");
        const cu::ExpertLaneCounts sc = cu::expert_lane_counts(true);
        check_true(tag + " streams=1 stays serial", sc.forked == 0 && sc.serial > 0,
                   "forked " + std::to_string(sc.forked));
        for (const char* streams : {"2", "3", "4"}) {
          const std::vector<char> got = run(streams);
          const cu::ExpertLaneCounts lc = cu::expert_lane_counts(true);
          const int want = static_cast<int>(std::min<int64_t>(std::atoi(streams), busy));
          const bool forked_ok = want > 1 ? lc.forked > 0 && lc.max_lanes == want : lc.forked == 0;
          check_true(tag + " streams=" + streams + " bitwise = serial",
                     forked_ok && got.size() == serial.size() &&
                         std::memcmp(got.data(), serial.data(), got.size()) == 0,
                     "forked " + std::to_string(lc.forked) + " calls, lanes " + std::to_string(lc.max_lanes) +
                         " (want " + std::to_string(want) + ")");
        }
      }
    }
  }
  unsetenv("MEGATRON_MOE_GEMM_STREAMS");
  unsetenv("MEGATRON_MOE_GROUPED_GEMM");
}

// ------------------------------------------------------------------------------------------
// MoE grouped GEMM (grouped_linear_forward / _backward; docs/moe.md "Kernels"): forward y_e =
// x_e w_e^T, dgrad dx_e = dy_e w_e, wgrad dw_e (+)= dy_e^T x_e over experts with uneven counts
// (zeros included), against float64 products of the same (rounded) inputs, for the grouped cuBLAS
// path and the per-expert loop (MEGATRON_MOE_GROUPED_GEMM=0). Bounds: the products of bf16 inputs
// are exact in fp32 and accumulated in fp32 (error <= k 2^-24 relative to Σ|terms|, k <= 768
// here: <= 4.6e-5); a bf16 output is then rounded once (relative error <= 2^-8 per element, so the
// relative Frobenius error is <= 2^-8 = 3.9e-3: tol 4e-3); a float32 output keeps only the
// accumulation error (tol 1e-4 >= 768 * 2^-24 = 4.6e-5; float32 inputs: the loop in true fp32).
void test_moe() {
  using Case = MoeGemmCase;
  std::vector<Case> cases = {{"6 experts 192->320", 192, 320, {0, 170, 1, 0, 333, 96}},
                             {"odd 72->40", 72, 40, {17, 0, 5, 33}},
                             {"16 experts 256->96", 256, 96, {}},
                             {"one expert with rows", 128, 64, {0, 0, 77, 0}}};
  {
    std::uniform_int_distribution<int> d(0, 140);
    for (int e = 0; e < 16; ++e) cases[2].counts.push_back(e % 5 == 3 ? 0 : d(g_rng));
  }
  if (!g_small) cases.push_back({"8 experts 512->768", 512, 768, {600, 400, 512, 0, 300, 500, 1, 520}});
  for (const char* mode : {"grouped", "loop"}) {
    setenv("MEGATRON_MOE_GROUPED_GEMM", std::strcmp(mode, "loop") ? "1" : "0", 1);
    for (DType dt : {DType::kBFloat16, DType::kFloat32}) {
      for (const Case& c : cases) {
        const int64_t E = static_cast<int64_t>(c.counts.size()), in = c.in, out = c.out;
        int64_t N = 0;
        for (int64_t n : c.counts) N += n;
        const V x = rounded(randn(N * in), dt), dyv = rounded(randn(N * out), dt);
        std::vector<V> w(E), g0(E);
        std::vector<Tensor> W, G, G2;
        for (int64_t e = 0; e < E; ++e) {
          w[e] = rounded(randn(out * in, 0.05f), dt);
          g0[e] = randn(out * in, 0.1f);
          W.push_back(dev(w[e], {out, in}, dt));
          G.push_back(dev(g0[e], {out, in}, DType::kFloat32));  // fp32 main grads, accumulated
          G2.push_back(poisoned({out, in}, DType::kFloat32));  // overwritten (accumulate = false)
        }
        VD ry(N * out, 0.0), rdx(N * in, 0.0);
        std::vector<VD> rdw(E, VD(out * in, 0.0));
        int64_t off = 0;
        for (int64_t e = 0; e < E; ++e) {
          for (int64_t r = off; r < off + c.counts[e]; ++r) {
            for (int64_t j = 0; j < out; ++j) {
              double s = 0;
              for (int64_t i = 0; i < in; ++i) s += (double)x[r * in + i] * w[e][j * in + i];
              ry[r * out + j] = s;
            }
            for (int64_t i = 0; i < in; ++i) {
              double s = 0;
              for (int64_t j = 0; j < out; ++j) s += (double)dyv[r * out + j] * w[e][j * in + i];
              rdx[r * in + i] = s;
            }
            for (int64_t j = 0; j < out; ++j)
              for (int64_t i = 0; i < in; ++i) rdw[e][j * in + i] += (double)dyv[r * out + j] * x[r * in + i];
          }
          off += c.counts[e];
        }
        const std::string tag = std::string("moe ") + mode + " " + dn(dt) + " " + c.name;
        const double tol = dt == DType::kFloat32 ? 1e-4 : 4e-3;
        Tensor X = dev(x, {N, in}, dt), DY = dev(dyv, {N, out}, dt), Y = poisoned({N, out}, dt),
               DX = poisoned({N, in}, dt);
        cu::grouped_linear_forward(X, W, c.counts, Y);
        check(tag + " fwd", host(Y), ry, tol);
        cu::grouped_linear_backward(DY, X, W, c.counts, &DX, &G, true);
        check(tag + " dgrad", host(DX), rdx, tol);
        bool untouched = true;
        for (int64_t e = 0; e < E; ++e) {
          if (c.counts[e] == 0) {
            untouched = untouched && host(G[e]) == g0[e];
            continue;
          }
          VD ref = rdw[e];
          for (size_t i = 0; i < ref.size(); ++i) ref[i] += g0[e][i];
          check(tag + " wgrad+= e" + std::to_string(e), host(G[e]), ref, 1e-4);
        }
        check_true(tag + " wgrad+= leaves experts without tokens", untouched);
        cu::grouped_linear_backward(DY, X, W, c.counts, nullptr, &G2, false);
        V all;
        VD all_ref;
        for (int64_t e = 0; e < E; ++e) {
          V h = host(G2[e]);
          all.insert(all.end(), h.begin(), h.end());
          all_ref.insert(all_ref.end(), rdw[e].begin(), rdw[e].end());  // zero for experts without tokens
        }
        check(tag + " wgrad= (no dgrad)", all, all_ref, 1e-4);
      }
    }
  }
  unsetenv("MEGATRON_MOE_GROUPED_GEMM");
  test_moe_streams();
  // row_dot_f64 (the experts' d probs): the products of float-widened inputs are exact in float64,
  // only the summation order differs from the host loop: relative error <= h 2^-53 Σ|t| / |Σ t|
  // (h <= 3000, Σ|t| / |Σ t| ~ sqrt(h) for random signs: <= 2e-11); tol 1e-9.
  for (DType dt : {DType::kBFloat16, DType::kFloat32}) {
    for (int64_t h : {(int64_t)1, (int64_t)37, (int64_t)3000}) {
      const int64_t n = g_small ? 5 : 700;
      const V a = rounded(randn(n * h), dt), b = rounded(randn(n * h), dt);
      Tensor out = Tensor::empty({n}, DType::kFloat64, Device::cuda());
      cu::row_dot_f64(dev(a, {n, h}, dt), dev(b, {n, h}, dt), out);
      Tensor oh = out.to(Device::cpu());
      VD ref(n, 0.0);
      for (int64_t r = 0; r < n; ++r)
        for (int64_t j = 0; j < h; ++j) ref[r] += (double)a[r * h + j] * b[r * h + j];
      // check() compares floats; the float64 values are compared here directly.
      double num = 0, den = 0;
      for (int64_t r = 0; r < n; ++r) {
        const double d = oh.data<double>()[r] - ref[r];
        num += d * d;
        den += ref[r] * ref[r];
      }
      const double err = std::sqrt(num / std::max(den, 1e-300));
      char detail[64];
      std::snprintf(detail, sizeof detail, "rel_err %.3e (tol 1e-9)", err);
      check_true(std::string("moe row_dot_f64 ") + dn(dt) + " h=" + std::to_string(h), err <= 1e-9, detail);
    }
  }
}


// Capacity dropping on the device (ops::cuda::moe_permute_capacity; docs/moe.md "Kernels")
// against the host's apply_router_token_dropping (moe_utils.cpp, Megatron's
// apply_router_token_dropping with the tie rule: equal keys go to the lower token index). Shapes:
// E 8 / 64 / 128 x top-k 1 / 2 / 8, capacity factors 0.5 / 1.0 / 1.5, drop policies probs /
// position, with and without padding; uneven loads (a quarter of the experts get +1.5 on their
// logits) and ties in the probs (every fifth token repeats the previous token's logits, every
// seventh has all logits equal, bf16 rounding; top-1 without pre-softmax gives every token prob 1).
// Rules (all exact, no tolerance):
//  * on the device's own choice and probs (moe_router_forward), the kept / padded rows, their
//    order (expert-major, tokens ascending), probs, the counts and the row of every choice (-1:
//    dropped) equal the host function's routing map / probs and permute_indices;
//  * against the whole host float64 router (probs rounded as probs.type_as(logits)): every expert
//    whose pre-drop column (routed tokens and their float probs) is bitwise the same on both sides
//    has the same final column (dropping is per expert given the capacity, so a column that agrees
//    before agrees after); at least half the columns must be comparable for bf16 logits and for
//    top-1 without pre-softmax (float32 probs often differ from float64's in the last bit);
//  * moe_unpermute skips dropped choices (float32 sums of the kept rows, tol 1e-5) and
//    moe_router_backward gives them no gradient (vs topk_routing_backward with their d prob 0,
//    float32 vs float64 tol 2e-5 as test_router).
void test_router_capacity() {
  using namespace megatron::transformer::moe;
  const int64_t T = g_small ? 200 : 1024;
  int cfg = 0;
  for (int64_t E : {8, 64, 128})
    for (int64_t k : {1, 2, 8})
      for (double cf : {0.5, 1.0, 1.5})
        for (const char* policy : {"probs", "position"})
          for (bool pad : {false, true}) {
            if (k > E) continue;
            const DType dt = cfg % 2 ? DType::kBFloat16 : DType::kFloat32;
            const bool pre = k == 1 && cfg % 4 < 2;  // top-1 without pre-softmax: every prob is 1
            ++cfg;
            V lg = randn(T * E, 1.0f);
            for (int64_t t = 0; t < T; ++t)
              for (int64_t e = 0; e < E; ++e) {
                if (e < E / 4) lg[t * E + e] += 1.5f;  // uneven load
                if (t % 7 == 3) lg[t * E + e] = 0.5f;  // all experts tied
                if (t % 5 == 1) lg[t * E + e] = lg[(t - 1) * E + e];  // the previous token's probs
              }
            lg = rounded(lg, dt);
            char nm[160];
            std::snprintf(nm, sizeof nm, "router capacity E=%ld k=%ld cf=%.1f %s%s%s %s", (long)E, (long)k, cf, policy,
                          pad ? " pad" : "", pre ? " pre-softmax" : "", dn(dt));
            const std::string tag = nm;
            Tensor L = dev(lg, {T, E}, dt);
            Tensor idx = Tensor::empty({T, k}, DType::kInt64, Device::cuda()), tp = poisoned({T, k}, DType::kFloat32);
            if (!cu::moe_router_forward(L, nullptr, k, 0, pre, 1.0f, 0, 0, 1, idx, tp, nullptr)) {
              check_true(tag + " forward", false, "declined");
              continue;
            }
            Tensor idx_h = idx.to(Device::cpu());
            const int64_t* di = idx_h.data<int64_t>();
            const V dp = host(tp);
            // The host function on the device's choice.
            VD probs(T * E, 0.0);
            std::vector<uint8_t> map(T * E, 0);
            for (int64_t i = 0; i < T * k; ++i) probs[(i / k) * E + di[i]] = dp[i], map[(i / k) * E + di[i]] = 1;
            VD rprobs = probs;
            std::vector<uint8_t> rmap = map;
            apply_router_token_dropping(rprobs, rmap, T, E, k, cf, policy, pad);
            std::vector<int64_t> rtpe;
            const std::vector<int64_t> ridx = permute_indices(rmap, T, E, 0, E, &rtpe);
            const int64_t cap = get_capacity(T * k, E, cf), R = cu::moe_capacity_max_rows(T, k, E, cap, pad);
            Tensor row_token = Tensor::empty({R}, DType::kInt64, Device::cuda()),
                   row_of = Tensor::empty({T, k}, DType::kInt64, Device::cuda()), pp = poisoned({R}, DType::kFloat32),
                   counts = Tensor::empty({E}, DType::kInt64, Device::cuda());
            if (!cu::moe_permute_capacity(idx, tp, E, cap, std::string(policy) == "position", pad, row_token, row_of, pp,
                                          counts)) {
              check_true(tag + " permute", false, "declined");
              continue;
            }
            Tensor rt_h = row_token.to(Device::cpu()), ro_h = row_of.to(Device::cpu()), c_h = counts.to(Device::cpu());
            const V ppv = host(pp);
            const int64_t *rt = rt_h.data<int64_t>(), *ro = ro_h.data<int64_t>(), *ct = c_h.data<int64_t>();
            const int64_t N = static_cast<int64_t>(ridx.size());
            bool ok = std::equal(rtpe.begin(), rtpe.end(), ct) && std::equal(ridx.begin(), ridx.end(), rt);
            std::vector<int64_t> row_expert;
            for (int64_t e = 0; e < E; ++e) row_expert.insert(row_expert.end(), rtpe[e], e);
            for (int64_t r = 0; r < N && ok; ++r) ok = ppv[r] == static_cast<float>(rprobs[ridx[r] * E + row_expert[r]]);
            for (int64_t i = 0; i < T * k && ok; ++i) {
              const int64_t t = i / k, e = di[i];
              ok = rmap[t * E + e] ? ro[i] >= 0 && ro[i] < N && rt[ro[i]] == t && row_expert[ro[i]] == e : ro[i] == -1;
            }
            int64_t dropped = 0;
            for (int64_t i = 0; i < T * k; ++i) dropped += ro[i] < 0 ? 1 : 0;
            check_true(tag + " rows, order, probs, counts, row of every choice", ok,
                       "capacity " + std::to_string(cap) + ", " + std::to_string(N) + " rows, " + std::to_string(dropped) +
                           " choices dropped");
            // The whole host float64 router, column by column where the pre-drop columns agree.
            TopKOptions o;
            o.topk = k;
            o.use_pre_softmax = pre;
            VD hp;
            std::vector<uint8_t> hmap;
            TopKState hs;
            const VD lgd(lg.begin(), lg.end());
            topk_routing_with_score_function(lgd, T, E, o, hp, hmap, hs);
            for (double& p : hp) p = dt == DType::kFloat32 ? static_cast<float>(p) : round_to(static_cast<float>(p), dt);
            VD hprobs = hp;
            std::vector<uint8_t> hfinal = hmap;
            apply_router_token_dropping(hprobs, hfinal, T, E, k, cf, policy, pad);
            int64_t comparable = 0, bad = 0;
            for (int64_t e = 0; e < E; ++e) {
              bool same = true;
              for (int64_t t = 0; t < T && same; ++t)
                same = hmap[t * E + e] == map[t * E + e] &&
                       static_cast<float>(hp[t * E + e]) == static_cast<float>(probs[t * E + e]);
              if (!same) continue;
              ++comparable;
              for (int64_t t = 0; t < T; ++t) bad += hfinal[t * E + e] != rmap[t * E + e] ? 1 : 0;
            }
            // float32 probs of distinct float64 values differ in the last bit often: only bf16
            // (rounded) and top-1 without pre-softmax (prob 1) must leave most columns comparable.
            const bool most = dt != DType::kFloat32 || (k == 1 && !pre);
            check_true(tag + " vs the host float64 router", bad == 0 && (!most || comparable * 2 >= E),
                       std::to_string(comparable) + " of " + std::to_string(E) + " columns comparable, " +
                           std::to_string(bad) + " entries differ");
            // unpermute and backward with dropped choices
            const int64_t h = 40;
            const V rows = randn(std::max<int64_t>(N, 1) * h);
            Tensor Rw = dev(rows, {std::max<int64_t>(N, 1), h}, DType::kFloat32), out = poisoned({T, h}, DType::kFloat32);
            cu::moe_unpermute(Rw, row_of, out);
            VD uref(T * h, 0.0);
            for (int64_t i = 0; i < T * k; ++i)
              if (ro[i] >= 0)
                for (int64_t q = 0; q < h; ++q) uref[(i / k) * h + q] += rows[ro[i] * h + q];
            check(tag + " unpermute", host(out), uref, 1e-5);
            const V dperm = randn(std::max<int64_t>(N, 1), 0.3f);
            Tensor Dp = dev(dperm, {std::max<int64_t>(N, 1)}, DType::kFloat32), dl = poisoned({T, E}, DType::kFloat32);
            cu::moe_router_backward(L, idx, Dp, row_of, 0, pre, 1.0f, 1, nullptr, 0.0f, dl);
            VD dprobs(T * E, 0.0);
            for (int64_t i = 0; i < T * k; ++i)
              if (ro[i] >= 0) dprobs[(i / k) * E + di[i]] = dperm[ro[i]];
            const VD bref = topk_routing_backward(dprobs, o, hs);
            const V dlv = host(dl);
            V g;
            VD r;
            for (int64_t t = 0; t < T; ++t) {
              bool same = true;  // tokens whose host selection is the device's (near ties aside)
              for (int64_t j = 0; j < k; ++j) same = same && di[t * k + j] == hs.top_indices[t * k + j];
              if (same)
                for (int64_t e = 0; e < E; ++e) g.push_back(dlv[t * E + e]), r.push_back(bref[t * E + e]);
            }
            check(tag + " backward dlogits", g, r, 2e-5);
          }
}

// MoELayer forward + backward with the device router (MEGATRON_MOE_DEVICE_ROUTER=1) against the
// host router (=0) on the same parameters and input (bounds in the header of test_router).
void test_router_layer() {
  using namespace megatron::transformer;
  using namespace megatron::transformer::moe;
  struct Case {
    const char* name;
    int64_t E, k;
    std::string sf;
    std::vector<std::string> lb;
    std::vector<double> coeff;
    bool bias;
    double capacity = 0;  // --moe-expert-capacity-factor (0: dropless)
    std::string policy = "probs";
    bool pad = false;
    std::string router_dtype = "";  // --moe-router-dtype ("" = the model's dtype)
  };
  const std::vector<Case> cases = {
      {"softmax E=8 k=2 aux+seq_aux+z", 8, 2, "softmax", {"aux_loss", "seq_aux_loss"}, {1e-2, 1e-3}, false},
      {"sigmoid+bias E=32 k=4 global_aux+z", 32, 4, "sigmoid", {"global_aux_loss"}, {1e-2}, true},
      {"softmax E=8 k=2 capacity 1.0 probs", 8, 2, "softmax", {"aux_loss"}, {1e-2}, false, 1.0, "probs", false},
      {"softmax E=8 k=2 capacity 0.5 position pad", 8, 2, "softmax", {"aux_loss"}, {1e-2}, false, 0.5, "position",
       true},
      {"sigmoid+bias E=32 k=4 capacity 1.5 probs pad", 32, 4, "sigmoid", {"global_aux_loss"}, {1e-2}, true, 1.5,
       "probs", true},
      {"sigmoid+bias E=32 k=4 capacity 0.5 position", 32, 4, "sigmoid", {"aux_loss"}, {1e-2}, true, 0.5, "position",
       false},
      {"router fp64 softmax E=8 k=2 aux+seq_aux+z", 8, 2, "softmax", {"aux_loss", "seq_aux_loss"}, {1e-2, 1e-3}, false,
       0, "probs", false, "fp64"},
      {"router fp64 sigmoid+bias E=32 k=4 capacity 1.5 probs pad", 32, 4, "sigmoid", {"global_aux_loss"}, {1e-2}, true,
       1.5, "probs", true, "fp64"}};
  for (const Case& cs : cases) {
    const int64_t s = 128, b = 2, H = 64, F = 48;
    TransformerConfig c = megatron::bench::moe_leg_config(H, F, cs.E, cs.k, DType::kFloat32);
    c.moe_router_score_function = cs.sf;
    c.moe_router_load_balancing_type = cs.lb;
    c.moe_aux_loss_coeff = cs.coeff;
    c.moe_z_loss_coeff = 1e-3;
    c.moe_router_enable_expert_bias = cs.bias;
    if (cs.capacity > 0) c.moe_expert_capacity_factor = cs.capacity;
    c.moe_token_drop_policy = cs.policy;
    c.moe_pad_expert_input_to_capacity = cs.pad;
    if (!cs.router_dtype.empty()) c.moe_router_dtype = cs.router_dtype;
    c.validate();
    tensor_parallel::TPContext tp{comm::make_single_rank_group()};
    ParamRegistry reg;
    MoELayer layer(reg, "decoder.layers.0.mlp", c, 1, tp, MoEGroups::single());
    for (size_t i = 0; i < reg.params().size(); ++i) {
      Parameter& p = reg.params()[i];
      const Shape sh = reg.local_shape(i);
      int64_t n = 1;
      for (int64_t d : sh) n *= d;
      p.data = dev(randn(n, p.name.find("router") != std::string::npos ? 0.3f : 0.05f), sh, DType::kFloat32);
      p.main_grad = Tensor::zeros(sh, DType::kFloat32, Device::cuda());
    }
    if (cs.bias) {
      const V bv = randn(cs.E, 0.02f);
      std::copy(bv.begin(), bv.end(), layer.router().expert_bias().data<float>());
    }
    MoEAuxLossAutoScaler::set_loss_scale(1.0);
    const Tensor x = dev(randn(s * b * H), {s, b, H}, DType::kFloat32), dy = dev(randn(s * b * H, 0.1f), {s, b, H}, DType::kFloat32);
    std::vector<V> res[2];
    std::vector<double> metrics[2], bias_counts[2];
    for (int dv = 0; dv < 2; ++dv) {
      setenv("MEGATRON_MOE_DEVICE_ROUTER", dv ? "1" : "0", 1);
      MoEMetricsTracker::get().clear();
      ForwardContext fc;
      MoELayerCtx ctx;
      Tensor out = layer.forward(x, fc, ctx);
      const bool device_ran = ctx.router.device;
      Tensor dx = layer.backward(dy, ctx);
      if (dv) check_true(std::string("router layer ") + cs.name + " took the device path", device_ran);
      res[dv].push_back(host(out));
      res[dv].push_back(host(dx));
      for (Parameter& p : reg.params()) {
        res[dv].push_back(host(p.main_grad));
        cu::fill(p.main_grad, 0.0f);
      }
      for (auto& [name, e] : MoEMetricsTracker::get().entries())
        for (double v : e.values) metrics[dv].push_back(v);
      bias_counts[dv] = layer.router().local_tokens_per_expert();
      if (cs.bias) std::fill(layer.router().local_tokens_per_expert().begin(), layer.router().local_tokens_per_expert().end(), 0.0);
      layer.router().reset_global_aux_loss_tracker();
    }
    unsetenv("MEGATRON_MOE_DEVICE_ROUTER");
    const char* what[] = {"output", "d input"};
    for (size_t i = 0; i < res[0].size(); ++i)
      check(std::string("router layer ") + cs.name + " " + (i < 2 ? what[i] : reg.params()[i - 2].name.c_str()),
            res[1][i], to_d(res[0][i]), 1e-4);
    double merr = metrics[0].size() == metrics[1].size() && !metrics[0].empty() ? 0 : 1;
    for (size_t i = 0; i < metrics[0].size() && i < metrics[1].size(); ++i)
      merr = std::max(merr, std::fabs(metrics[1][i] - metrics[0][i]) / std::max(std::fabs(metrics[0][i]), 1e-30));
    check_true(std::string("router layer ") + cs.name + " tracked aux / z losses", merr <= 1e-5,
               "max rel diff " + std::to_string(merr) + " over " + std::to_string(metrics[0].size()) + " values");
    check_true(std::string("router layer ") + cs.name + " expert-bias token counts", bias_counts[0] == bias_counts[1]);
  }
}

// ------------------------------------------------------------------------------------------
// MoE device router and permutation (moe_router_forward / moe_permute_map / moe_unpermute /
// moe_router_backward; docs/moe.md "Kernels") against the host float64 router of
// megatron/core/transformer/moe/moe_utils.h on the same logits (float32 values, or bf16 ones).
// Rules and bounds:
//  * Selected experts and their order: identical, with ties (duplicated logits, forced in the
//    "ties" cases) toward the lower expert index on both sides. The only allowed difference is a
//    NEAR tie: two float64 keys (logits, pre-softmax / sigmoid scores + bias) within 1e-5
//    relative but not equal, which float32 may order either way; such tokens are counted, must
//    be <= 1% of the tokens, and are left out of the value comparisons below. Group-limited
//    routing ranks groups by float32 sums of their top keys in the host's order (key descending,
//    index ascending), so equal-valued groups tie exactly on both sides too.
//  * probs: float32 math on the same inputs; a softmax / normalization of E terms is within
//    ~(E + 8) u relative (u = 2^-24; E <= 256: 1.6e-5 worst case; rel-norm tol 2e-5); bf16 logits
//    round the probs to bf16 on both sides (one rounding may differ near a boundary: tol 1e-2).
//  * stats: column sums of float32 aux scores in float64 (tol 2e-5 as the probs), the counts of
//    the aux top-k map and of the routing map exactly (up to the near-tie tokens), Σ lse² tol 1e-5.
//  * permutation: row map, counts and permuted probs exactly (Megatron's order, from the
//    device's own choice); unpermute float32 sums of k rows vs float64 (tol 1e-5; bf16 out 1e-2),
//    and bitwise equal over two runs (no atomics).
//  * backward: float32 recomputation, E-term sums: rel-norm tol 2e-5 vs float64.
// Then a whole MoELayer (router + dispatch + experts + combine, aux + seq aux + z loss) forward
// and backward with MEGATRON_MOE_DEVICE_ROUTER=1 against =0 (the host path): same routing, output /
// input gradient / router and expert gradients within 1e-4 rel-norm (float32 model: the only
// difference is float32 vs float64 routing math, ~1e-6, amplified by the GEMMs' float32 sums),
// the tracked load_balancing / seq / z losses within 1e-5 relative.
// The float64 gating GEMM of --moe-router-dtype fp64 on the device (ops/cuda/moe_gating_f64.h)
// against the host fp64 router's loops (transformer/moe/router.cpp TopKRouter::forward /
// backward) written out here: the same float64 products and sums in the same order, each
// rounded once (the device uses __dmul_rn / __dadd_rn, this build's host code has no FMA), so
// logits, dx and the accumulated dw must be bitwise equal; float32 and bf16 inputs, float32 and
// bf16 grads, an expert count over a warp and a hidden size that is not a multiple of 32.
void test_gating_f64() {
  struct Case {
    int64_t T, E, h;
  };
  for (const Case& c : {Case{1000, 16, 200}, Case{64, 256, 48}, Case{33, 3, 7}}) {
    for (DType xd : {DType::kFloat32, DType::kBFloat16}) {
      for (DType gd : {DType::kFloat32, DType::kBFloat16}) {
        const int64_t T = c.T, E = c.E, h = c.h;
        const V x = rounded(randn(T * h), xd), w = rounded(randn(E * h, 0.3f), xd), dl = randn(T * E, 0.1f),
                g0 = rounded(randn(E * h, 0.05f), gd);
        Tensor X = dev(x, {T, h}, xd), W = dev(w, {E, h}, xd), L = Tensor::empty({T, E}, DType::kFloat64, Device::cuda());
        cu::moe_gating_f64_forward(X, W, L);
        Tensor DX = poisoned({T, h}, xd), DW = dev(g0, {E, h}, gd);
        cu::moe_gating_f64_backward(dev(dl, {T, E}, DType::kFloat32), X, W, DX, DW);
        Tensor lh = L.to(Device::cpu());
        const double* lv = lh.data<double>();
        bool fwd = true;
        for (int64_t t = 0; t < T; ++t)
          for (int64_t e = 0; e < E; ++e) {
            double acc = 0;
            for (int64_t j = 0; j < h; ++j) acc += (double)x[t * h + j] * (double)w[e * h + j];
            fwd = fwd && lv[t * E + e] == acc;
          }
        const V dxv = host(DX), dwv = host(DW);
        bool bdx = true, bdw = true;
        for (int64_t t = 0; t < T; ++t)
          for (int64_t j = 0; j < h; ++j) {
            double acc = 0;
            for (int64_t e = 0; e < E; ++e) acc += (double)dl[t * E + e] * (double)w[e * h + j];
            bdx = bdx && dxv[t * h + j] == round_to((float)acc, xd);
          }
        for (int64_t e = 0; e < E; ++e)
          for (int64_t j = 0; j < h; ++j) {
            double acc = 0;
            for (int64_t t = 0; t < T; ++t) acc += (double)dl[t * E + e] * (double)x[t * h + j];
            bdw = bdw && dwv[e * h + j] == round_to(g0[e * h + j] + round_to((float)acc, gd), gd);
          }
        const std::string tag = "router gating fp64 T=" + std::to_string(T) + " E=" + std::to_string(E) + " h=" +
                                std::to_string(h) + " " + dn(xd) + " grad " + dn(gd);
        check_true(tag + " logits bitwise = host", fwd);
        check_true(tag + " dx bitwise = host", bdx);
        check_true(tag + " dw += bitwise = host", bdw);
      }
    }
  }
}

bool near_tie_row(const double* key, int64_t E, int64_t k, double rel = 1e-5) {
  std::vector<double> v(key, key + E);
  std::sort(v.begin(), v.end(), std::greater<double>());
  for (int64_t j = 0; j + 1 < E && j <= k; ++j) {
    const double a = v[j], b = v[j + 1], m = std::max(std::fabs(a), std::fabs(b));
    if (a != b && a - b <= rel * m) return true;
  }
  return false;
}

void test_router() {
  using namespace megatron::transformer::moe;
  struct Case {
    const char* name;
    int64_t T, E, k;
    std::string sf;
    bool pre, bias, ties;
    double scaling;
    int64_t B;
    DType dt;
    int64_t groups = 0, group_topk = 0;  // group-limited routing when group_topk > 0
  };
  const int64_t big = g_small ? 256 : 4096;
  std::vector<Case> cases = {
      {"mixtral T=4096 E=8 k=2 bf16", big, 8, 2, "softmax", false, false, false, 0, 1, DType::kBFloat16},
      {"mixtral T=4096 E=8 k=2 fp32", big, 8, 2, "softmax", false, false, false, 0, 1, DType::kFloat32},
      {"qwen3 T=4096 E=128 k=8 fp32", big, 128, 8, "softmax", false, false, false, 0, 1, DType::kFloat32},
      {"qwen3 pre-softmax bsz=2 fp32", big, 128, 8, "softmax", true, false, false, 0, 2, DType::kFloat32},
      {"E=3 k=1 pre-softmax ties", 301, 3, 1, "softmax", true, false, true, 0, 1, DType::kFloat32},
      {"E=3 k=2 ties", 301, 3, 2, "softmax", false, false, true, 0, 1, DType::kFloat32},
      {"E=3 k=3 ties bsz=7", 301, 3, 3, "softmax", false, false, true, 0, 7, DType::kFloat32},
      {"E=3 k=2 sigmoid+bias ties", 301, 3, 2, "sigmoid", false, true, true, 0, 1, DType::kFloat32},
      {"E=16 k=4 sigmoid+bias scale 2.5 bsz=2", 998, 16, 4, "sigmoid", false, true, false, 2.5, 2, DType::kFloat32},
      {"E=64 k=6 sqrtsoftplus bsz=4 bf16", 1000, 64, 6, "sqrtsoftplus", false, true, false, 0, 4, DType::kBFloat16},
      {"E=256 k=8 sigmoid+bias (DeepSeek-V3)", big, 256, 8, "sigmoid", false, true, false, 2.5, 1, DType::kFloat32},
      {"E=40 k=1 sigmoid", 333, 40, 1, "sigmoid", false, false, false, 0, 1, DType::kFloat32},
      {"E=256 k=8 groups 8 top 4 sigmoid+bias (DeepSeek-V3)", big, 256, 8, "sigmoid", false, true, false, 2.5, 1,
       DType::kFloat32, 8, 4},
      {"E=12 k=4 groups 4 top 2 ties", 301, 12, 4, "softmax", false, false, true, 0, 1, DType::kFloat32, 4, 2},
      {"E=16 k=3 groups 4 top 3 pre-softmax bf16", 500, 16, 3, "softmax", true, false, false, 0, 2, DType::kBFloat16, 4, 3},
      // --moe-router-dtype fp64: float64 logits with sub-float32 differences (below)
      {"mixtral T=4096 E=8 k=2 fp64", big, 8, 2, "softmax", false, false, false, 0, 1, DType::kFloat64},
      {"qwen3 pre-softmax bsz=2 fp64", big, 128, 8, "softmax", true, false, false, 0, 2, DType::kFloat64},
      {"E=3 k=2 ties below float32 fp64", 301, 3, 2, "softmax", false, false, true, 0, 1, DType::kFloat64},
      {"E=16 k=4 sigmoid+bias scale 2.5 bsz=2 fp64", 998, 16, 4, "sigmoid", false, true, false, 2.5, 2, DType::kFloat64},
      {"E=64 k=6 sqrtsoftplus bsz=4 fp64", 1000, 64, 6, "sqrtsoftplus", false, true, false, 0, 4, DType::kFloat64},
      {"E=256 k=8 groups 8 top 4 sigmoid+bias fp64", big, 256, 8, "sigmoid", false, true, false, 2.5, 1,
       DType::kFloat64, 8, 4},
  };
  for (const Case& c : cases) {
    const int64_t T = c.T, E = c.E, k = c.k, B = c.B, N = T * k;
    V lg = rounded(randn(T * E, 2.0f), c.dt);
    if (c.ties) {
      std::uniform_int_distribution<int64_t> pick(0, E - 1);
      for (int64_t t = 0; t < T; ++t) {  // duplicate one logit onto another (often the top)
        const int64_t a = pick(g_rng), b = pick(g_rng);
        if (t % 3 == 0) {
          float mx = lg[t * E];
          for (int64_t e = 1; e < E; ++e) mx = std::max(mx, lg[t * E + e]);
          lg[t * E + a] = lg[t * E + b] = mx;
        } else {
          lg[t * E + a] = lg[t * E + b];
        }
      }
      for (int64_t e = 0; e < E; ++e) lg[5 * E + e] = 0.25f;  // a token with all experts tied
    }
    // A constant bias keeps the forced ties tied (the bias still enters the selection keys).
    V bias_v = !c.bias ? V() : c.ties ? V(E, 0.01f) : randn(E, 0.05f);
    TopKOptions o;
    o.topk = k;
    o.use_pre_softmax = c.pre;
    o.score_function = c.sf;
    o.num_groups = c.groups;
    o.group_topk = c.group_topk;
    if (c.scaling) o.scaling_factor = c.scaling;
    VD bias_d(bias_v.begin(), bias_v.end());
    if (c.bias) o.expert_bias = &bias_d;
    VD lgd(lg.begin(), lg.end());
    const bool f64 = c.dt == DType::kFloat64;
    if (f64) {
      // Float64 logits: each float32 value moved by ~1e-9 relative, below float32's resolution
      // (2^-24 = 6e-8), so the forced ties of the "ties" case are ties in float32 only: float32
      // routing math would pick the lower index where the host's float64 picks the larger logit.
      std::normal_distribution<double> nd(0.0, 1e-9);
      for (double& v : lgd) v *= 1.0 + nd(g_rng);
    }
    VD hp;
    std::vector<uint8_t> hmap;
    TopKState hs;
    topk_routing_with_score_function(lgd, T, E, o, hp, hmap, hs);
    if (c.dt != DType::kFloat32)
      for (double& p : hp) p = round_to(static_cast<float>(p), c.dt);
    else
      for (double& p : hp) p = static_cast<float>(p);
    const int64_t sf = c.sf == "softmax" ? 0 : c.sf == "sigmoid" ? 1 : 2;
    Tensor L = f64 ? dev_f64(lgd, {T, E}) : dev(lg, {T, E}, c.dt), bias = c.bias ? dev(bias_v, {E}, DType::kFloat32) : Tensor();
    Tensor idx = Tensor::empty({T, k}, DType::kInt64, Device::cuda()), tp = poisoned({T, k}, DType::kFloat32);
    Tensor stats = Tensor::empty({2 * B * E + E + 1}, DType::kFloat64, Device::cuda());
    const std::string tag = std::string("router ") + c.name;
    if (!cu::moe_router_forward(L, c.bias ? &bias : nullptr, k, sf, c.pre, c.scaling ? (float)c.scaling : 1.0f, c.groups,
                                c.group_topk, B, idx, tp, &stats)) {
      check_true(tag + " forward", false, "declined");
      continue;
    }
    Tensor idx_h = idx.to(Device::cpu()), st_h = stats.to(Device::cpu());
    const int64_t* di = idx_h.data<int64_t>();
    const V dp = host(tp);
    // Selection keys of the host (float64) for the near-tie rule.
    VD key(T * E);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < E; ++e) {
        const double s = hs.scores[t * E + e];
        key[t * E + e] = sf == 0 ? (c.pre ? s : lgd[t * E + e]) : s + (c.bias ? bias_d[e] : 0.0);
      }
    std::vector<char> skip(T, 0);
    // Near ties: float32 math may order keys within 1e-5 either way; float64 math (both sides)
    // only within a few ulps of the scores (exp / log1p / sqrt of one argument: 1e-12).
    const double near_rel = f64 ? 1e-12 : 1e-5;
    int64_t exact_bad = 0, near = 0;
    for (int64_t t = 0; t < T; ++t) {
      bool same = true;
      for (int64_t j = 0; j < k; ++j) same = same && di[t * k + j] == hs.top_indices[t * k + j];
      if (same) continue;
      if (near_tie_row(&key[t * E], E, k, near_rel)) {
        skip[t] = 1;
        ++near;
      } else {
        ++exact_bad;
      }
    }
    check_true(tag + " selection", exact_bad == 0 && near * 100 <= T,
               std::to_string(exact_bad) + " tokens differ, " + std::to_string(near) + " near-tie tokens");
    // probs, by expert, on the tokens that agree.
    V gp;
    VD rp;
    for (int64_t t = 0; t < T; ++t)
      if (!skip[t])
        for (int64_t j = 0; j < k; ++j) gp.push_back(dp[t * k + j]), rp.push_back(hp[t * E + di[t * k + j]]);
    check(tag + " probs", gp, rp, f64 ? 1e-7 : c.dt == DType::kFloat32 ? 2e-5 : 1e-2);
    // statistics
    VD ascores;
    std::vector<uint8_t> amap;
    compute_routing_scores_for_aux_loss(lgd, T, E, k, c.sf, ascores, amap);
    int64_t aux_near = 0;
    for (int64_t t = 0; t < T; ++t) aux_near += near_tie_row(&ascores[t * E], E, k, near_rel) ? 1 : 0;
    VD rsum(B * E, 0.0);
    std::vector<double> rcnt(B * E, 0.0), route(E, 0.0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < E; ++e) {
        rsum[(t % B) * E + e] += ascores[t * E + e];
        rcnt[(t % B) * E + e] += amap[t * E + e];
      }
    for (int64_t i = 0; i < N; ++i) route[di[i]] += 1;  // the device's own choice (near ties)
    const double* sv = st_h.data<double>();
    check(tag + " aux score column sums", V(sv, sv + B * E), rsum, f64 ? 1e-7 : 2e-5);
    double cnt_diff = 0, route_diff = 0;
    for (int64_t i = 0; i < B * E; ++i) cnt_diff += std::fabs(sv[B * E + i] - rcnt[i]);
    for (int64_t e = 0; e < E; ++e) route_diff += std::fabs(sv[2 * B * E + e] - route[e]);
    check_true(tag + " aux map / routing counts", cnt_diff <= 2.0 * aux_near && route_diff == 0,
               "aux count |diff| " + std::to_string(cnt_diff) + " (near-tie tokens " + std::to_string(aux_near) +
                   "), routing |diff| " + std::to_string(route_diff));
    VD dz;
    const double zsum = z_loss(lgd, T, E, 1.0, nullptr) * (double)T;
    check(tag + " sum lse^2", V{(float)sv[2 * B * E + E]}, VD{zsum}, f64 ? 1e-7 : 1e-5);
    // permutation (from the device's choice)
    Tensor row_token = Tensor::empty({N}, DType::kInt64, Device::cuda()),
           row_of = Tensor::empty({T, k}, DType::kInt64, Device::cuda()), pp = poisoned({N}, DType::kFloat32),
           counts = Tensor::empty({E}, DType::kInt64, Device::cuda());
    check_true(tag + " permute_map ran", cu::moe_permute_map(idx, tp, E, row_token, row_of, pp, counts));
    std::vector<uint8_t> dmap(T * E, 0);
    for (int64_t i = 0; i < N; ++i) dmap[(i / k) * E + di[i]] = 1;
    std::vector<int64_t> rtpe;
    const std::vector<int64_t> ridx = permute_indices(dmap, T, E, 0, E, &rtpe);
    Tensor rt_h = row_token.to(Device::cpu()), ro_h = row_of.to(Device::cpu()), c_h = counts.to(Device::cpu());
    const V ppv = host(pp);
    bool perm_ok = std::equal(ridx.begin(), ridx.end(), rt_h.data<int64_t>()) &&
                   std::equal(rtpe.begin(), rtpe.end(), c_h.data<int64_t>());
    const int64_t* ro = ro_h.data<int64_t>();
    for (int64_t i = 0; i < N && perm_ok; ++i)
      perm_ok = rt_h.data<int64_t>()[ro[i]] == i / k && ppv[ro[i]] == dp[i];
    check_true(tag + " permuted order, counts, row map, permuted probs", perm_ok);
    // unpermute
    for (DType rd : {DType::kFloat32, DType::kBFloat16}) {
      const int64_t h = 72;
      const V rows = rounded(randn(N * h), rd);
      Tensor R = dev(rows, {N, h}, rd), out = poisoned({T, h}, rd), out2 = poisoned({T, h}, rd);
      cu::moe_unpermute(R, row_of, out);
      cu::moe_unpermute(R, row_of, out2);
      VD ref(T * h, 0.0);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < k; ++j)
          for (int64_t q = 0; q < h; ++q) ref[t * h + q] += rows[ro[t * k + j] * h + q];
      const V o1 = host(out), o2 = host(out2);
      check(tag + " unpermute " + dn(rd), o1, ref, rd == DType::kFloat32 ? 1e-5 : 1e-2);
      check_true(tag + " unpermute " + dn(rd) + " bitwise reproducible", o1 == o2);
    }
    // backward: routing + aux-score gradient + z-loss
    const V dperm = randn(N, 0.3f), coef = randn(B * E, 0.01f);
    const float zc = 0.003f;
    Tensor Dp = dev(dperm, {N}, DType::kFloat32), C = dev(coef, {B * E}, DType::kFloat32),
           dl = poisoned({T, E}, DType::kFloat32);
    cu::moe_router_backward(L, idx, Dp, row_of, sf, c.pre, c.scaling ? (float)c.scaling : 1.0f, B, &C, zc, dl);
    VD dprobs(T * E, 0.0), dscores(T * E);
    for (int64_t i = 0; i < N; ++i) dprobs[(i / k) * E + di[i]] = dperm[ro[i]];
    VD ref = topk_routing_backward(dprobs, o, hs);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < E; ++e) dscores[t * E + e] = coef[(t % B) * E + e];
    const VD da = aux_scores_backward(lgd, ascores, dscores, T, E, c.sf);
    z_loss(lgd, T, E, zc * (double)T / 2.0, &dz);
    for (size_t i = 0; i < ref.size(); ++i) ref[i] += da[i] + dz[i];
    const V dlv = host(dl);
    V g;
    VD r;
    for (int64_t t = 0; t < T; ++t)
      if (!skip[t])
        for (int64_t e = 0; e < E; ++e) g.push_back(dlv[t * E + e]), r.push_back(ref[t * E + e]);
    check(tag + " backward dlogits", g, r, f64 ? 1e-7 : 2e-5);
  }
  test_gating_f64();
  test_router_capacity();
  test_router_layer();
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed = std::random_device{}();
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--seed") && i + 1 < argc) seed = std::strtoull(argv[++i], nullptr, 10);
    else if (!std::strcmp(argv[i], "--small")) g_small = true;
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) g_only = argv[++i];
  }
  g_rng.seed(seed);
  std::printf("gpu_ops_test seed %llu%s\n", (unsigned long long)seed, g_small ? " (small)" : "");
  std::vector<std::pair<const char*, std::function<void()>>> groups = {
      {"elementwise", test_elementwise}, {"activations", test_activations}, {"gemm", test_gemm},
      {"embedding_ce", test_embedding_ce}, {"norms", test_norms}, {"norms_few", test_norms_few}, {"rope", test_rope}, {"rope_table", test_rope_table_bits},
      {"attention", test_attention}, {"attn_generic", test_attention_generic},
      {"attn_dropout", test_attention_dropout}, {"attn_det", test_attention_deterministic}, {"adam", test_adam},
      {"model_ops", test_model_ops}, {"epilogues", test_gemm_epilogues}, {"h2d_staging", test_h2d_staging},
      {"reduce_many", test_reduce_many}, {"gelu_bgrad", test_gelu_bgrad}, {"qkvpacked", test_attention_packed},
      {"ce_fused", test_ce_fused}, {"grad_norm", test_grad_norm}, {"decode", test_decode}, {"moe", test_moe}, {"router", test_router}};
  for (auto& [name, fn] : groups) {
    if (!g_only.empty() && g_only.find(name) == std::string::npos) continue;
    try {
      fn();
    } catch (const std::exception& e) {
      ++g_fail;
      ++g_total;
      std::printf("FAIL %-58s exception: %s\n", name, e.what());
    }
  }
  std::printf("gpu_ops_test: %d of %d checks passed\n", g_total - g_fail, g_total);
  return g_fail ? 1 : 0;
}
