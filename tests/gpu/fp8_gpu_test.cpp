// FP8 checks on the GPU (docs/fp8.md; run by tests/gpu/run_gpu_tests.sh or directly):
//  1. casts: CUDA's __nv_cvt_float_to_fp8(v, __NV_SATFINITE, E4M3/E5M2) (ops::cuda::cast and our
//     fused fp8_quantize kernel) against the CPU conversions float_to_e4m3_bits /
//     float_to_e5m2_bits that the CPU emulation uses -- bit-exact over EVERY float32 of both signs
//     with magnitude in [2^-27, 2^19) (all rounding, subnormal and saturation cases of both
//     formats), 0, +-inf, NaN, and every bfloat16 bit pattern;
//  2. fp8_quantize (+ transpose + amax) with a scale on random bf16 data vs the CPU quantize_cpu
//     (bit-exact bytes, exact amax);
//  3. fp8_gemm_tn vs a float64 host GEMM of the dequantized operands (tolerances below);
//  4. fp8::linear_forward/backward on CUDA vs the CPU emulation on the same data and scales;
//  5. the 128 x 128 vectorized quantize+transpose kernel (shapes with rows % 16 == 0 and
//     cols % 8 == 0, partial tiles, bf16 and fp32 inputs, q and/or q_t) and the 16-per-thread
//     rows kernel vs quantize_cpu (bit-exact bytes, exact amax), including the LLaMA-3-8B
//     shapes 8192 x 4096 and 4096 x 14336, with their bandwidth (GB/s, bytes read + written);
//  6. the FP8 weight cache on CUDA: cached and uncached linears give bit-identical outputs,
//     gradients and scales over steps of several micro-batches (docs/fp8.md "Weight cache");
//  7. --fp8-param-gather (group param_gather): the CUDA shard cast (fp8::quantize_param_shard) of an
//     unaligned bf16 shard bit-exact vs the CPU emulation (bytes and amax); the byte transpose of a
//     gathered FP8 weight vs the CPU transpose (odd shapes and 4096 x 14336, GB/s); a CUDA linear whose
//     weight is the FP8 primary weight (post_all_gather_processing) bit-identical to the cached
//     linear that quantizes the bf16 weight, over 3 steps (outputs, gradients, scales), with no
//     weight cast;
//  8. timing: FP8 GEMM TFLOP/s on LLaMA-3-8B shapes at 8192 tokens vs bf16 cuBLASLt;
//  9. fused_quantize: RMSNorm / SwiGLU with their output's quantization fused vs the unfused
//     kernels (bit-exact bytes and amax); scale_update: the device-side step boundary vs the
//     host recipe (bit-exact histories and scales); residual_gemm: the FP8 GEMM with the residual in
//     its epilogue vs GEMM + add (within one bf16 rounding);
// 10. blockwise (--fp8-recipe blockwise): the block quantize kernels bit-exact vs the CPU reference,
//     the cuBLASLt block-scaled GEMMs vs float64, the blockwise linear vs the CPU emulation, timings;
// 11. moe_experts: the FP8 Experts module with MEGATRON_MOE_FP8_FUSE on and the weight cache
//     bit-identical to the switch off (test_moe_experts); fused_scale_rows: the experts' fused fc2
//     input quantize (ops/fp8_moe.h) vs scale_rows + fp8_quantize (bit-exact bytes and amax);
// Exit status 0 iff every check passed.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench/gpu/moe_fp8_leg.h"
#include "megatron/core/fp8/fp8_linear.h"
#include "megatron/core/fp8/fp8_param.h"
#include "megatron/core/fp8/fp8_recipe.h"
#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/ops/cuda/cuda_ops.h"
#include "megatron/core/ops/fp8_moe.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/tensor/tensor.h"
#include "megatron/core/utils/param_version.h"

using namespace megatron;
namespace cu = megatron::ops::cuda;

namespace {
int g_fail = 0, g_total = 0;
std::mt19937_64 g_rng(1234);

void report(const std::string& name, bool ok, const std::string& detail) {
  ++g_total;
  if (!ok) ++g_fail;
  std::printf("%s %-60s %s\n", ok ? "ok  " : "FAIL", name.c_str(), detail.c_str());
  std::fflush(stdout);
}

float* fp(const Tensor& t) { return static_cast<float*>(t.data_ptr()); }

std::vector<uint8_t> bytes(const Tensor& t) {
  Tensor h = t.to(Device::cpu());
  const auto* p = static_cast<const uint8_t*>(h.data_ptr());
  return std::vector<uint8_t>(p, p + h.numel());
}

std::vector<float> host(const Tensor& t) { return t.to(Device::cpu()).to_float_vector(); }

// A float32 scalar tensor [1] on the device holding v (scales, amaxes).
Tensor dev_scalar(float v) { return Tensor::from_vector({v}, {1}).to(Device::cuda()); }
// A zeroed float32 amax [1] on the device.
Tensor dev_amax() { return Tensor::zeros({1}, DType::kFloat32, Device::cuda()); }

// Bytes of the device FP8 tensor q [R, C] that differ from the row-major reference bytes ref.
int64_t row_mismatches(const Tensor& q, const std::vector<uint8_t>& ref) {
  const std::vector<uint8_t> a = bytes(q);
  int64_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) bad += a[i] != ref[i];
  return bad;
}
// Bytes of the device FP8 tensor qt [C, R] that differ from the transpose of the row-major
// reference bytes ref [R, C].
int64_t transposed_mismatches(const Tensor& qt, const std::vector<uint8_t>& ref, int64_t R, int64_t C) {
  const std::vector<uint8_t> t = bytes(qt);
  int64_t bad = 0;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) bad += t[c * R + r] != ref[r * C + c];
  return bad;
}

// An FP8 output on the device in both layouts (q [R, C], q_t [C, R]) with its amax (zeroed), as
// the quantize kernels write it.
struct Fp8Out {
  Tensor q, qt, amax;
  Fp8Out(int64_t R, int64_t C, DType dt)
      : q(Tensor::empty({R, C}, dt, Device::cuda())), qt(Tensor::empty({C, R}, dt, Device::cuda())), amax(dev_amax()) {}
};
// Bytes (both layouts) in which two FP8 outputs differ.
int64_t byte_mismatches(const Fp8Out& a, const Fp8Out& b) {
  const std::vector<uint8_t> qa = bytes(a.q), qb = bytes(b.q), ta = bytes(a.qt), tb = bytes(b.qt);
  int64_t bad = 0;
  for (size_t i = 0; i < qa.size(); ++i) bad += (qa[i] != qb[i]) + (ta[i] != tb[i]);
  return bad;
}

// Timing helper: average ms of `reps` calls of f after `warmup` untimed calls.
template <class F>
double time_ms(F f, int reps, int warmup = 2) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int i = 0; i < warmup; ++i) f();
  cudaEventRecord(e0);
  for (int i = 0; i < reps; ++i) f();
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return ms / reps;
}

// Host conversions of n floats, split over threads.
std::vector<uint8_t> host_cast(const std::vector<float>& v, bool e4m3) {
  std::vector<uint8_t> out(v.size());
  const unsigned nt = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> th;
  for (unsigned t = 0; t < nt; ++t)
    th.emplace_back([&, t] {
      for (size_t i = t; i < v.size(); i += nt) out[i] = e4m3 ? float_to_e4m3_bits(v[i]) : float_to_e5m2_bits(v[i]);
    });
  for (auto& x : th) x.join();
  return out;
}

void cast_chunk(const std::vector<float>& v, int64_t& mism_cast, int64_t& mism_q, uint32_t& first_bad) {
  Tensor x = Tensor::from_vector(v, {(int64_t)v.size()}).to(Device::cuda());
  Tensor one = dev_scalar(1.0f);
  for (int e = 0; e < 2; ++e) {
    const DType dt = e == 0 ? DType::kFloat8E4M3 : DType::kFloat8E5M2;
    std::vector<uint8_t> ref = host_cast(v, e == 0);
    Tensor c = Tensor::empty({(int64_t)v.size()}, dt, Device::cuda());
    cu::cast(x, c);
    Tensor q = Tensor::empty({(int64_t)v.size()}, dt, Device::cuda());
    cu::fp8_quantize(x, fp(one), nullptr, &q, nullptr);
    std::vector<uint8_t> a = bytes(c), b = bytes(q);
    for (size_t i = 0; i < v.size(); ++i) {
      if (a[i] != ref[i]) {
        if (!mism_cast && !mism_q) std::memcpy(&first_bad, &v[i], 4);
        ++mism_cast;
      }
      if (b[i] != ref[i]) {
        if (!mism_cast && !mism_q) std::memcpy(&first_bad, &v[i], 4);
        ++mism_q;
      }
    }
  }
}

void test_casts() {
  int64_t mc = 0, mq = 0, n = 0;
  uint32_t bad = 0;
  // Every float32 with biased exponent in [100, 146) (|x| in [2^-27, 2^19)), both signs: one
  // exponent (2^23 mantissas) per chunk.
  for (uint32_t sign = 0; sign < 2; ++sign)
    for (uint32_t ex = 100; ex < 146; ++ex) {
      std::vector<float> v(1u << 23);
      for (uint32_t m = 0; m < (1u << 23); ++m) {
        uint32_t bits = (sign << 31) | (ex << 23) | m;
        std::memcpy(&v[m], &bits, 4);
      }
      cast_chunk(v, mc, mq, bad);
      n += (int64_t)v.size();
    }
  std::vector<float> sp = {0.0f, -0.0f, INFINITY, -INFINITY, 1e30f, -1e30f, 1e-30f, -1e-30f};
  for (uint32_t b = 0; b < 65536; ++b) {
    uint32_t bits = b << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    if (!std::isnan(f)) sp.push_back(f);
  }
  cast_chunk(sp, mc, mq, bad);
  n += (int64_t)sp.size();
  char d[200];
  std::snprintf(d, sizeof d, "%lld inputs x {E4M3, E5M2}: %lld cast / %lld quantize mismatches (first 0x%08x)",
                (long long)n, (long long)mc, (long long)mq, bad);
  report("fp8 casts bit-exact: CPU float_to_e*_bits vs CUDA __nv_cvt", mc == 0 && mq == 0, d);
  // NaN inputs (information only: both sides map NaN to a NaN code, the sign may differ).
  std::vector<float> nans = {NAN, -NAN};
  Tensor xn = Tensor::from_vector(nans, {2}).to(Device::cuda());
  for (DType dt : {DType::kFloat8E4M3, DType::kFloat8E5M2}) {
    Tensor c = Tensor::empty({2}, dt, Device::cuda());
    cu::cast(xn, c);
    std::vector<uint8_t> b = bytes(c), h = host_cast(nans, dt == DType::kFloat8E4M3);
    std::printf("info %s NaN/-NaN: CUDA 0x%02x 0x%02x, CPU 0x%02x 0x%02x\n", dtype_name(dt), b[0], b[1], h[0], h[1]);
  }
}

void test_quantize() {
  for (int e = 0; e < 4; ++e) {
    const DType dt = e % 2 == 0 ? DType::kFloat8E4M3 : DType::kFloat8E5M2;
    // Not multiples of the 64 x 64 tile; rows % 4 == 0 (32-bit transposed stores) and odd rows.
    const int64_t R = e < 2 ? 1000 : 999, C = e < 2 ? 1544 : 1543;
    std::normal_distribution<float> nd(0.0f, 3.0f);
    std::vector<float> v(R * C);
    for (auto& x : v) x = nd(g_rng);
    Tensor xh = Tensor::from_vector(v, {R, C}).to(DType::kBFloat16);
    fp8::Fp8TensorMeta meta(1, dt);
    meta.scale = 37.5f;
    Tensor qh = Tensor::empty({R, C}, dt);
    const float amax_ref = fp8::quantize_cpu(xh, meta, qh);
    Tensor x = xh.to(Device::cuda());
    Tensor scale = dev_scalar(37.5f);
    Tensor amax = dev_scalar(0.5f);
    Tensor q = Tensor::empty({R, C}, dt, Device::cuda()), qt = Tensor::empty({C, R}, dt, Device::cuda());
    cu::fp8_quantize(x, fp(scale), fp(amax), &q, &qt);
    const std::vector<uint8_t> ref = bytes(qh);
    int64_t bad = row_mismatches(q, ref) + transposed_mismatches(qt, ref, R, C);
    const float got_amax = host(amax)[0];
    // Rows only, amax only.
    Tensor q2 = Tensor::empty({R, C}, dt, Device::cuda());
    Tensor amax2 = dev_amax();
    cu::fp8_quantize(x, fp(scale), fp(amax2), &q2, nullptr);
    bad += row_mismatches(q2, ref);
    const float got2 = host(amax2)[0];
    char d[160];
    std::snprintf(d, sizeof d, "%lld byte mismatches; amax %.6g / %.6g vs %.6g", (long long)bad, got_amax, got2,
                  amax_ref);
    report(std::string("fp8_quantize(+transpose, amax) vs quantize_cpu ") + dtype_name(dt) + " " +
               std::to_string(R) + "x" + std::to_string(C),
           bad == 0 && got_amax == amax_ref && got2 == amax_ref, d);
  }
}

// Random finite FP8 bytes (no NaN), magnitudes spread over the format.
Tensor random_fp8(int64_t r, int64_t c, DType dt, std::vector<float>& deq) {
  std::uniform_int_distribution<int> u(0, 255);
  Tensor h = Tensor::empty({r, c}, dt);
  auto* p = static_cast<uint8_t*>(h.data_ptr());
  deq.resize(r * c);
  for (int64_t i = 0; i < r * c; ++i) {
    uint8_t b;
    float f;
    do {
      b = (uint8_t)u(g_rng);
      f = dt == DType::kFloat8E4M3 ? e4m3_bits_to_float(b) : e5m2_bits_to_float(b);
    } while (!std::isfinite(f) || std::fabs(f) > (dt == DType::kFloat8E4M3 ? 64.0f : 1024.0f));
    p[i] = b;
    deq[i] = f;
  }
  return h.to(Device::cuda());
}

void test_gemm() {
  struct Case { int64_t m, n, k; DType a, b, c; bool fast; float beta; };
  const Case cases[] = {{256, 512, 1024, DType::kFloat8E4M3, DType::kFloat8E4M3, DType::kBFloat16, true, 0.0f},
                        {128, 384, 512, DType::kFloat8E5M2, DType::kFloat8E4M3, DType::kBFloat16, false, 0.0f},
                        {192, 256, 768, DType::kFloat8E5M2, DType::kFloat8E4M3, DType::kFloat32, false, 1.0f}};
  for (const Case& cs : cases) {
    std::vector<float> da, db;
    Tensor a = random_fp8(cs.m, cs.k, cs.a, da), b = random_fp8(cs.n, cs.k, cs.b, db);
    const float sa = 0.5f, sb = 0.125f;
    Tensor psa = dev_scalar(sa), psb = dev_scalar(sb);
    std::vector<float> c0(cs.m * cs.n);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (auto& x : c0) x = u(g_rng);
    Tensor c = Tensor::from_vector(c0, {cs.m, cs.n}).to(cs.c).to(Device::cuda());
    std::vector<float> c0r = Tensor::from_vector(c0, {cs.m, cs.n}).to(cs.c).to_float_vector();
    cu::fp8_gemm_tn(a, fp(psa), b, fp(psb), c, cs.beta, cs.fast);
    std::vector<float> got = c.to(Device::cpu()).to_float_vector();
    double worst = 0;
    for (int64_t i = 0; i < cs.m; ++i)
      for (int64_t j = 0; j < cs.n; ++j) {
        double s = 0, sabs = 0;
        for (int64_t k = 0; k < cs.k; ++k) {
          const double t = (double)da[i * cs.k + k] * db[j * cs.k + k];
          s += t;
          sabs += std::fabs(t);
        }
        const double ref = s * sa * sb + cs.beta * c0r[i * cs.n + j];
        const double scale_abs = sabs * sa * sb + std::fabs(cs.beta * c0r[i * cs.n + j]) + 1e-30;
        worst = std::max(worst, std::fabs(got[i * cs.n + j] - ref) / scale_abs);
      }
    // Tolerance, relative to sum_k |a_ik b_jk| (the scale of the accumulation): bf16 output
    // rounding is <= 2^-9 of |c| <= that sum. Hopper's FP8 tensor-core MMA accumulates with
    // fewer mantissa bits than fp32 (about 14, DeepSeek-V3 report §3.3.2) between cuBLASLt's
    // promotions to fp32: measured 2.4e-4 with an fp32 output on the H200 (2026-11-29), so 1e-3.
    const double tol = cs.c == DType::kFloat32 ? 1e-3 : 4e-3;
    char d[200];
    std::snprintf(d, sizeof d, "max |err| / sum|ab| = %.3g (tol %.0e)", worst, tol);
    char name[160];
    std::snprintf(name, sizeof name, "fp8_gemm_tn %s x %s -> %s m%lld n%lld k%lld%s%s", dtype_name(cs.a),
                  dtype_name(cs.b), dtype_name(cs.c), (long long)cs.m, (long long)cs.n, (long long)cs.k,
                  cs.fast ? " fast" : "", cs.beta != 0 ? " beta=1" : "");
    report(name, worst <= tol, d);
  }
}

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    den += (double)b[i] * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// fp8::linear forward/dgrad/wgrad on CUDA vs the CPU emulation with the recipe of `cfg`, two steps
// (delayed: step 0 at scale 1, step 1 with the updated scales, whose CUDA and CPU values must match).
void linear_vs_cpu(const fp8::Fp8Config& cfg, int64_t N, int64_t in, int64_t out, const std::string& label) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto rnd = [&](int64_t n, float s) {
    std::vector<float> v(n);
    for (auto& x : v) x = nd(g_rng) * s;
    return v;
  };
  Tensor xh = Tensor::from_vector(rnd(N * in, 2.0f), {N, in}).to(DType::kBFloat16);
  Tensor wh = Tensor::from_vector(rnd(out * in, 0.02f), {out, in}).to(DType::kBFloat16);
  Tensor dyh = Tensor::from_vector(rnd(N * out, 1e-4f), {N, out}).to(DType::kBFloat16);
  fp8::Fp8State cpu(cfg, Device::cpu()), gpu(cfg, Device::cuda());
  const int bc = cpu.register_linear("l"), bg = gpu.register_linear("l");
  Tensor xd = xh.to(Device::cuda()), wd = wh.to(Device::cuda()), dyd = dyh.to(Device::cuda());
  std::vector<float> y[2], dx[2], dw[2];
  for (int step = 0; step < 2; ++step) {
    Tensor yc = Tensor::empty({N, out}, DType::kBFloat16), yg = Tensor::empty({N, out}, DType::kBFloat16, Device::cuda());
    fp8::linear_forward(cpu, bc, xh, wh, nullptr, yc);
    fp8::linear_forward(gpu, bg, xd, wd, nullptr, yg);
    Tensor dxc = Tensor::empty({N, in}, DType::kBFloat16), dxg = Tensor::empty({N, in}, DType::kBFloat16, Device::cuda());
    Tensor dwc = Tensor::zeros({out, in}, DType::kFloat32), dwg = Tensor::zeros({out, in}, DType::kFloat32, Device::cuda());
    fp8::linear_backward(cpu, bc, dyh, xh, wh, &dxc, &dwc, nullptr, true);
    fp8::linear_backward(gpu, bg, dyd, xd, wd, &dxg, &dwg, nullptr, true);
    y[0] = yc.to_float_vector(); y[1] = yg.to(Device::cpu()).to_float_vector();
    dx[0] = dxc.to_float_vector(); dx[1] = dxg.to(Device::cpu()).to_float_vector();
    dw[0] = dwc.to_float_vector(); dw[1] = dwg.to(Device::cpu()).to_float_vector();
    // Same quantized operands on both sides; differences come from summation order and the bf16
    // rounding of y/dx (2^-9 relative): relative norm error <= 1e-2.
    char d[200];
    std::snprintf(d, sizeof d, "rel err y %.2g dx %.2g dw %.2g; scales x %.4g/%.4g g %.4g/%.4g", rel_err(y[1], y[0]),
                  rel_err(dx[1], dx[0]), rel_err(dw[1], dw[0]), cpu.host_scale(bc), gpu.host_scale(bg),
                  cpu.host_scale(bc + 2), gpu.host_scale(bg + 2));
    const bool ok = rel_err(y[1], y[0]) < 1e-2 && rel_err(dx[1], dx[0]) < 1e-2 && rel_err(dw[1], dw[0]) < 1e-2;
    report(label + " fwd/dgrad/wgrad CUDA vs CPU emulation, step " + std::to_string(step), ok, d);
    cpu.reduce_and_update(nullptr);
    gpu.reduce_and_update(nullptr);
    if (cfg.recipe != fp8::Fp8Recipe::kDelayed) continue;
    const bool same = cpu.host_scale(bc) == gpu.host_scale(bg) && cpu.host_scale(bc + 1) == gpu.host_scale(bg + 1) &&
                      cpu.host_scale(bc + 2) == gpu.host_scale(bg + 2);
    report("delayed-scaling update: CUDA amaxes == CPU amaxes, step " + std::to_string(step), same, "");
  }
}

void test_linear() { linear_vs_cpu(fp8::Fp8Config{}, 256, 128, 192, "fp8::linear"); }  // hybrid, delayed, history 1

// Fast-path shapes (rows % 16 == 0, cols % 8 == 0): bit-exact vs quantize_cpu for q only, q_t
// only, both; then bandwidth on the large ones. Data: N(0, 3) floats rounded to the input dtype.
void test_quantize_fast() {
  struct Case { int64_t r, c; DType in, q; bool timed; };
  const Case cases[] = {{1008, 1544, DType::kBFloat16, DType::kFloat8E4M3, false},  // partial tiles both ways
                        {208, 264, DType::kFloat32, DType::kFloat8E5M2, false},
                        {16, 8, DType::kBFloat16, DType::kFloat8E5M2, false},
                        {8192, 4096, DType::kBFloat16, DType::kFloat8E4M3, true},
                        {4096, 14336, DType::kBFloat16, DType::kFloat8E4M3, true},
                        {4096, 14336, DType::kBFloat16, DType::kFloat8E5M2, false}};
  for (const Case& cs : cases) {
    const int64_t R = cs.r, C = cs.c, n = R * C;
    std::normal_distribution<float> nd(0.0f, 3.0f);
    std::vector<float> v(n);
    for (auto& x : v) x = nd(g_rng);
    Tensor xh = Tensor::from_vector(v, {R, C}).to(cs.in);
    fp8::Fp8TensorMeta meta(1, cs.q);
    meta.scale = 21.25f;
    Tensor qh = Tensor::empty({R, C}, cs.q);
    const float amax_ref = fp8::quantize_cpu(xh, meta, qh);
    const std::vector<uint8_t> ref = bytes(qh);
    Tensor x = xh.to(Device::cuda());
    Tensor scale = dev_scalar(21.25f);
    int64_t bad = 0;
    float amaxes[3];
    for (int mode = 0; mode < 3; ++mode) {  // 0: q + q_t, 1: q_t only, 2: rows only
      Tensor amax = dev_amax();
      Tensor q = Tensor::empty({R, C}, cs.q, Device::cuda()), qt = Tensor::empty({C, R}, cs.q, Device::cuda());
      cu::fp8_quantize(x, fp(scale), fp(amax), mode == 1 ? nullptr : &q, mode == 2 ? nullptr : &qt);
      amaxes[mode] = host(amax)[0];
      if (mode != 1) bad += row_mismatches(q, ref);
      if (mode != 2) bad += transposed_mismatches(qt, ref, R, C);
    }
    char d[200];
    std::snprintf(d, sizeof d, "%lld byte mismatches; amax %.6g %.6g %.6g vs %.6g", (long long)bad, amaxes[0],
                  amaxes[1], amaxes[2], amax_ref);
    report(std::string("fp8_quantize fast path vs quantize_cpu ") + dtype_name(cs.in) + "->" + dtype_name(cs.q) + " " +
               std::to_string(R) + "x" + std::to_string(C),
           bad == 0 && amaxes[0] == amax_ref && amaxes[1] == amax_ref && amaxes[2] == amax_ref, d);
    if (!cs.timed) continue;
    Tensor amax = dev_amax();
    Tensor q = Tensor::empty({R, C}, cs.q, Device::cuda()), qt = Tensor::empty({C, R}, cs.q, Device::cuda());
    const double in_b = (double)n * dtype_size(cs.in);
    const double t_rows = time_ms([&] { cu::fp8_quantize(x, fp(scale), fp(amax), &q, nullptr); }, 20);
    const double t_t = time_ms([&] { cu::fp8_quantize(x, fp(scale), fp(amax), nullptr, &qt); }, 20);
    const double t_both = time_ms([&] { cu::fp8_quantize(x, fp(scale), fp(amax), &q, &qt); }, 20);
    std::printf("bandwidth fp8_quantize %lldx%lld bf16->fp8 (+amax): rows %.3f ms %.0f GB/s | transpose %.3f ms %.0f GB/s"
                " | rows+transpose %.3f ms %.0f GB/s  (goal >= 3000 GB/s; H200 HBM3e ~4800)\n",
                (long long)R, (long long)C, t_rows, (in_b + n) / t_rows / 1e6, t_t, (in_b + n) / t_t / 1e6, t_both,
                (in_b + 2.0 * n) / t_both / 1e6);
  }
}

// The weight cache on CUDA: one Fp8State with the cache, one without; 3 steps x 3 micro-batches
// (forward + dgrad + wgrad), scale updates in between and a weight change + bump_param_version
// after each step; everything must be bit-identical (same casts, same scales, same GEMMs).
void test_weight_cache_cuda() {
  const int64_t N = 256, in = 128, out = 192;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto rnd = [&](int64_t n, float s) {
    std::vector<float> v(n);
    for (auto& x : v) x = nd(g_rng) * s;
    return Tensor::from_vector(v, {n}).to(DType::kBFloat16).to(Device::cuda());
  };
  for (fp8::Fp8Recipe recipe : {fp8::Fp8Recipe::kDelayed, fp8::Fp8Recipe::kTensorwise}) {
    fp8::Fp8Config cfg;
    cfg.recipe = recipe;
    cfg.amax_history_len = 4;
    cfg.amax_compute_algo = fp8::AmaxComputeAlgo::kMax;
    // on: forced on; off: off; au: the default (kAuto: uncached in step 0, then admitted
    // against the free device memory -- plenty here).
    fp8::Fp8State on(cfg, Device::cuda()), off(cfg, Device::cuda()), au(cfg, Device::cuda());
    on.set_weight_cache_enabled(true);
    off.set_weight_cache_enabled(false);
    au.set_weight_cache_mode(fp8::Fp8State::WeightCacheMode::kAuto);
    const int bo = on.register_linear("l"), bf = off.register_linear("l"), ba = au.register_linear("l");
    Tensor w = rnd(out * in, 0.02f).view({out, in});
    Tensor w2 = Tensor::empty({out, in}, DType::kBFloat16, Device::cuda()), w3 = w2.clone();
    w2.copy_(w);
    w3.copy_(w);
    int64_t bad = 0;
    Tensor last_x;
    for (int step = 0; step < 3; ++step) {
      Tensor dwo = Tensor::zeros({out, in}, DType::kFloat32, Device::cuda());
      Tensor dwf = Tensor::zeros({out, in}, DType::kFloat32, Device::cuda());
      Tensor dwa = Tensor::zeros({out, in}, DType::kFloat32, Device::cuda());
      for (int mb = 0; mb < 3; ++mb) {
        Tensor x = rnd(N * in, 2.0f).view({N, in}), dy = rnd(N * out, 1e-4f).view({N, out});
        last_x = x;
        Tensor yo = Tensor::empty({N, out}, DType::kBFloat16, Device::cuda()), yf = yo.clone();
        fp8::linear_forward(on, bo, x, w, nullptr, yo);
        fp8::linear_forward(off, bf, x, w2, nullptr, yf);
        Tensor dxo = Tensor::empty({N, in}, DType::kBFloat16, Device::cuda()), dxf = dxo.clone();
        fp8::linear_backward(on, bo, dy, x, w, &dxo, &dwo, nullptr, true);
        fp8::linear_backward(off, bf, dy, x, w2, &dxf, &dwf, nullptr, true);
        Tensor ya = yo.clone(), dxa = dxo.clone();
        fp8::linear_forward(au, ba, x, w3, nullptr, ya);
        fp8::linear_backward(au, ba, dy, x, w3, &dxa, &dwa, nullptr, true);
        bad += host(yo) != host(yf);
        bad += host(dxo) != host(dxf);
        bad += host(ya) != host(yf);
        bad += host(dxa) != host(dxf);
      }
      bad += host(dwo) != host(dwf);
      bad += host(dwa) != host(dwf);
      on.reduce_and_update(nullptr);
      off.reduce_and_update(nullptr);
      au.reduce_and_update(nullptr);
      for (int r = 0; r < fp8::kNumRoles; ++r) bad += on.host_scale(r) != off.host_scale(r);
      // "Optimizer step": w += 0.01 * random, announced with bump_param_version.
      Tensor upd = rnd(out * in, 0.01f).view({out, in});
      cu::add_(w, upd, 1.0f);
      w2.copy_(w);
      w3.copy_(w);
      bump_param_version();
    }
    // Tensorwise: the input scale on the device is 448 / amax of the LAST input only (the
    // per-role current-amax scratch is zeroed after each use; a stale one would keep the max).
    float want = 0, got = 0;
    if (recipe == fp8::Fp8Recipe::kTensorwise) {
      float a = 0;
      for (float v : host(last_x)) a = std::max(a, std::fabs(v));
      want = 448.0f / a;
      got = host(on.scale(bo + fp8::kInput))[0];
      bad += got != want;
    }
    char d[200];
    std::snprintf(d, sizeof d, "%lld mismatching tensors/scales; weight casts cached %lld, uncached %lld, auto %lld%s",
                  (long long)bad, (long long)on.weight_casts(), (long long)off.weight_casts(), (long long)au.weight_casts(),
                  recipe == fp8::Fp8Recipe::kTensorwise
                      ? (std::string("; input scale ") + std::to_string(got) + " vs 448/amax " + std::to_string(want)).c_str()
                      : "");
    report(std::string("fp8 weight cache on CUDA: bit-identical to uncached, ") +
               (recipe == fp8::Fp8Recipe::kDelayed ? "delayed" : "tensorwise"),
           bad == 0 && on.weight_casts() == 3 && off.weight_casts() == 3 * 3 * 2 && au.weight_casts() == 3 * 2 + 2 &&
               au.weight_cache_admitted_bytes() == 2 * out * in,
           d);
  }
}

// Fast pseudo-random fill for the large bit-exactness inputs (hundreds of millions of values;
// std::normal_distribution would take tens of seconds): a sum of two uniforms in [-a, a]
// (xorshift64*), so values cluster near 0 with tails, enough to exercise rounding and saturation.
void fast_fill(std::vector<float>& v, float a) {
  uint64_t x = g_rng() | 1u;
  for (auto& f : v) {
    x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
    const uint64_t r = x * 0x2545F4914F6CDD1DULL;
    const float u0 = (float)(r >> 40) * (1.0f / 16777216.0f), u1 = (float)((r >> 16) & 0xFFFFFF) * (1.0f / 16777216.0f);
    f = a * (u0 + u1 - 1.0f);
  }
}

// Fused producers (fp8fuse): fp8_rmsnorm_quantize (after rmsnorm_rstd) and fp8_swiglu_quantize
// against the unfused path -- rmsnorm_forward / swiglu_forward writing bf16, then fp8_quantize
// (q + q_t) -- bit-exact FP8 bytes of both layouts, the same amax bits, the same rstd bits; on
// partial tiles and the LLaMA-3-8B shapes (8192 x 4096 norm, 8192 x 14336 SwiGLU output), with the
// fused and unfused times (ms, GB/s of the fused kernel: bytes read + written).
void test_fused_quantize() {
  struct S { int64_t rows, cols; bool big; };
  const S shapes[] = {{272, 264, false}, {16, 8, false}, {1024, 4096, false}, {8192, 4096, true}, {8192, 14336, true}};
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (const S& sh : shapes)
    for (int which = 0; which < 2; ++which) {  // 0: RMSNorm (zero-centred gamma), 1: SwiGLU
      const int64_t R = sh.rows, C = sh.cols;
      if (which == 0 && C > 8192) continue;  // the norm shape is the hidden size
      const int64_t in_cols = which == 1 ? 2 * C : C;
      std::vector<float> xv(R * in_cols), gv(C);
      fast_fill(xv, 4.0f);
      for (auto& v : gv) v = 0.1f * nd(g_rng);
      xv[(R / 2) * in_cols + 3] = 1e4f;  // saturates at the scale below
      Tensor x = Tensor::from_vector(xv, {R, in_cols}).to(DType::kBFloat16).to(Device::cuda());
      Tensor gamma = Tensor::from_vector(gv, {C}).to(DType::kBFloat16).to(Device::cuda());
      Tensor sc = dev_scalar(37.5f);
      Fp8Out u(R, C, DType::kFloat8E4M3), f(R, C, DType::kFloat8E4M3);  // unfused, fused
      Tensor y = Tensor::empty({R, C}, DType::kBFloat16, Device::cuda());
      Tensor rstd_u = Tensor::empty({R}, DType::kFloat32, Device::cuda()), rstd_f = Tensor::empty({R}, DType::kFloat32, Device::cuda());
      auto unfused = [&] {
        if (which == 0) cu::rmsnorm_forward(x, gamma, 1e-5f, true, y, rstd_u);
        else cu::swiglu_forward(x, y);
        cu::fp8_quantize(y, fp(sc), fp(u.amax), &u.q, &u.qt);
      };
      bool launched = true;
      auto fused = [&] {
        if (which == 0) {
          cu::rmsnorm_rstd(x, gamma, 1e-5f, rstd_f);
          launched = cu::fp8_rmsnorm_quantize(x, gamma, rstd_f, true, DType::kBFloat16, fp(sc), fp(f.amax), &f.q, &f.qt);
        } else {
          launched = cu::fp8_swiglu_quantize(x, DType::kBFloat16, fp(sc), fp(f.amax), &f.q, &f.qt);
        }
      };
      unfused();
      fused();
      const int64_t bad = byte_mismatches(u, f);
      const float au = host(u.amax)[0], af = host(f.amax)[0];
      int64_t bad_rstd = 0;
      if (which == 0) {
        const std::vector<float> ru = host(rstd_u), rf = host(rstd_f);
        for (size_t i = 0; i < ru.size(); ++i) bad_rstd += std::memcmp(&ru[i], &rf[i], 4) != 0;
      }
      std::string t;
      if (sh.big) {
        const double tu = time_ms(unfused, 5, 1), tf = time_ms(fused, 5, 1);
        const double by = which == 0 ? R * C * (2.0 * 2 + 2) : R * C * (4.0 + 2);  // fused: read x (twice for the norm), write q + q_t
        char b[160];
        std::snprintf(b, sizeof b, "; unfused %.3f ms, fused %.3f ms (%.0f GB/s)", tu, tf, by / tf / 1e6);
        t = b;
      }
      char d[300];
      std::snprintf(d, sizeof d, "%lld byte mismatches, %lld rstd mismatches, amax %.9g vs %.9g%s", (long long)bad,
                    (long long)bad_rstd, af, au, t.c_str());
      report(std::string(which ? "swiglu" : "rmsnorm") + "+quantize+transpose fused vs unfused " + std::to_string(R) +
                 "x" + std::to_string(C),
             launched && bad == 0 && bad_rstd == 0 && std::memcmp(&au, &af, 4) == 0, d);
    }
}

// Runs unfused() then fused() (which sets `launched`: false if the fused kernel declined), reports
// `name` as passed when their FP8 outputs u / f agree in every byte of both layouts and in the amax
// bits; at 8192 rows also times both.
void report_fused_vs_unfused(const std::string& name, int64_t R, const Fp8Out& u, const Fp8Out& f,
                             const std::function<void()>& unfused, const std::function<void()>& fused,
                             const bool& launched) {
  unfused();
  fused();
  const int64_t bad = byte_mismatches(u, f);
  const float au = host(u.amax)[0], af = host(f.amax)[0];
  std::string t;
  if (R == 8192) {
    const double tu = time_ms(unfused, 5, 1), tf = time_ms(fused, 5, 1);
    char b[160];
    std::snprintf(b, sizeof b, "; unfused %.3f ms, fused %.3f ms", tu, tf);
    t = b;
  }
  char d[300];
  std::snprintf(d, sizeof d, "%lld byte mismatches, amax %.9g vs %.9g%s", (long long)bad, af, au, t.c_str());
  report(name, launched && bad == 0 && std::memcmp(&au, &af, 4) == 0, d);
}

// fp8_swiglu_backward_quantize (fc1's output gradient, E5M2) vs swiglu_backward + fp8_quantize
// (q + q_t): bit-exact bytes of both layouts and the same amax bits; partial tiles and the
// LLaMA-3-8B shape (8192 x 28672), with the fused and unfused times.
void test_fused_swiglu_backward() {
  for (auto sh : {std::pair<int64_t, int64_t>{272, 272}, {16, 16}, {1024, 3584}, {8192, 28672}}) {
    const int64_t R = sh.first, C = sh.second, F = C / 2;
    std::vector<float> xv(R * C), dv(R * F);
    fast_fill(xv, 4.0f);
    fast_fill(dv, 4e-3f);
    Tensor x = Tensor::from_vector(xv, {R, C}).to(DType::kBFloat16).to(Device::cuda());
    Tensor dy = Tensor::from_vector(dv, {R, F}).to(DType::kBFloat16).to(Device::cuda());
    Tensor sc = dev_scalar(2048.0f);
    Fp8Out u(R, C, DType::kFloat8E5M2), f(R, C, DType::kFloat8E5M2);  // unfused, fused
    Tensor dx = Tensor::empty({R, C}, DType::kBFloat16, Device::cuda());
    bool launched = true;
    auto unfused = [&] {
      cu::swiglu_backward(dy, x, dx);
      cu::fp8_quantize(dx, fp(sc), fp(u.amax), &u.q, &u.qt);
    };
    auto fused = [&] { launched = cu::fp8_swiglu_backward_quantize(dy, x, fp(sc), fp(f.amax), &f.q, &f.qt); };
    report_fused_vs_unfused(
        "swiglu_bwd+quantize+transpose (E5M2) fused vs unfused " + std::to_string(R) + "x" + std::to_string(C), R, u, f,
        unfused, fused, launched);
  }
}

// ops::fp8_scale_rows_quantize (the FP8 MoE experts' fc2 input act * prob, E4M3; ops/fp8_moe.h) vs
// scale_rows + fp8_quantize (q + q_t): bit-exact bytes of both layouts and the same amax bits, with
// a zero factor (a padding row) among the rows; partial tiles and the Mixtral expert shapes
// (1024 x 14336 per expert, 8192 x 14336 all experts), with the fused and unfused times.
void test_fused_scale_rows() {
  for (auto sh : {std::pair<int64_t, int64_t>{272, 272}, {16, 16}, {144, 400}, {1024, 14336}, {8192, 14336}}) {
    const int64_t R = sh.first, C = sh.second;
    std::vector<float> xv(R * C), pv(R);
    fast_fill(xv, 4.0f);
    fast_fill(pv, 1.0f);
    pv[R / 2] = 0.0f;
    Tensor x = Tensor::from_vector(xv, {R, C}).to(DType::kBFloat16).to(Device::cuda());
    Tensor p = Tensor::from_vector(pv, {R}).to(Device::cuda());
    Tensor sc = dev_scalar(24.0f);
    Fp8Out u(R, C, DType::kFloat8E4M3), f(R, C, DType::kFloat8E4M3);  // unfused, fused
    Tensor y = Tensor::empty({R, C}, DType::kBFloat16, Device::cuda());
    bool launched = true;
    auto unfused = [&] {
      cu::scale_rows(x, p, y);
      cu::fp8_quantize(y, fp(sc), fp(u.amax), &u.q, &u.qt);
    };
    auto fused = [&] { launched = ops::fp8_scale_rows_quantize(x, p, fp(sc), fp(f.amax), &f.q, &f.qt); };
    report_fused_vs_unfused(
        "scale_rows+quantize+transpose (E4M3) fused vs unfused " + std::to_string(R) + "x" + std::to_string(C), R, u, f,
        unfused, fused, launched);
  }
}

// The GPU step-boundary update (one fp8_update_scales launch, histories on the device) against the
// CPU Fp8State (the host recipe, fp8_recipe.cpp) fed the same amaxes: every history entry and
// scale bit-equal over 7 steps, for history lengths 1/4/5, max and most_recent, delayed and
// tensorwise (history only), margin 0/1, with 0, NaN, +inf and huge amaxes among them.
void test_scale_update() {
  std::uniform_real_distribution<float> ud(0.0f, 8.0f);
  for (int H : {1, 4, 5})
    for (int algo = 0; algo < 2; ++algo)
      for (int recipe = 0; recipe < 2; ++recipe) {
        fp8::Fp8Config cfg;
        cfg.amax_history_len = H;
        cfg.amax_compute_algo = algo ? fp8::AmaxComputeAlgo::kMostRecent : fp8::AmaxComputeAlgo::kMax;
        cfg.recipe = recipe ? fp8::Fp8Recipe::kTensorwise : fp8::Fp8Recipe::kDelayed;
        cfg.margin = H == 5 ? 1 : 0;
        fp8::Fp8State cpu(cfg, Device::cpu()), gpu(cfg, Device::cuda());
        for (int l = 0; l < 3; ++l) {
          cpu.register_linear("l" + std::to_string(l));
          gpu.register_linear("l" + std::to_string(l));
        }
        int64_t bad = 0;
        for (int step = 0; step < 7; ++step) {
          for (int r = 0; r < cpu.num_roles(); ++r) {
            float a = ud(g_rng) * std::ldexp(1.0f, (int)(g_rng() % 20) - 10);
            const int k = (step * 7 + r) % 13;
            if (k == 3) a = 0.0f;
            if (k == 5) a = std::nanf("");
            if (k == 8) a = INFINITY;
            if (k == 11) a = 3e38f;
            if (step == 2 && r == 1) continue;  // a role not used this step
            cpu.record_host_amax(r, a);
            gpu.amax(r).copy_(Tensor::from_vector({a}, {1}));
          }
          cpu.reduce_and_update(nullptr);
          gpu.reduce_and_update(nullptr);
          for (int r = 0; r < cpu.num_roles(); ++r) {
            const fp8::Fp8TensorMeta &mc = cpu.host_meta(r), &mg = gpu.host_meta(r);
            for (int i = 0; i < H; ++i) bad += std::memcmp(&mc.amax_history[i], &mg.amax_history[i], 4) != 0;
            if (recipe == 0)
              bad += std::memcmp(&mc.scale, &mg.scale, 4) != 0 || std::memcmp(&mc.scale_inv, &mg.scale_inv, 4) != 0;
            // The device scale the kernels read is the one reported.
            if (recipe == 0) bad += host(gpu.scale(r))[0] != mg.scale;
          }
        }
        char name[160];
        std::snprintf(name, sizeof name, "scale update on the device == host recipe: H %d %s %s margin %d", H,
                      algo ? "most_recent" : "max", recipe ? "tensorwise" : "delayed", cfg.margin);
        report(name, bad == 0, std::to_string(bad) + " mismatching history entries/scales over 7 steps");
      }
}

// The FP8 GEMM with the residual in its epilogue (fp8_gemm_tn_residual, linear_proj / fc2 forward)
// against a float64 host reference D* = A B^T + R of the same E4M3 operands and bf16 residual. The
// fused result rounds once to bf16: |got - D*| <= 2^-8 |D*| (one bf16 rounding, 2 ulp margin) +
// 2^-10 sum_k |a_k b_k| (fp32 accumulation with FP8 fast accumulation, generous), per element.
// The unfused GEMM + add (bf16(bf16(AB) + R)) rounds twice, so it may miss that bound where R
// cancels most of AB (its first rounding, 2^-9 |AB|, is then large against |D*|); its count is
// reported for comparison, not checked. (The first version of this check compared the two with a
// 2 ulp bound on the difference and failed on exactly those cancellations.)
void test_residual_gemm() {
  const int64_t m = 512, n = 256, k = 384;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> av(m * k), bv(n * k), rv(m * n);
  for (auto& v : av) v = nd(g_rng);
  for (auto& v : bv) v = nd(g_rng);
  for (auto& v : rv) v = 4.0f * nd(g_rng);
  Tensor one = dev_scalar(1.0f), am = dev_amax();
  Tensor a = Tensor::empty({m, k}, DType::kFloat8E4M3, Device::cuda()), b = Tensor::empty({n, k}, DType::kFloat8E4M3, Device::cuda());
  cu::fp8_quantize(Tensor::from_vector(av, {m, k}).to(DType::kBFloat16).to(Device::cuda()), fp(one), fp(am), &a, nullptr);
  cu::fp8_quantize(Tensor::from_vector(bv, {n, k}).to(DType::kBFloat16).to(Device::cuda()), fp(one), fp(am), &b, nullptr);
  Tensor r = Tensor::from_vector(rv, {m, n}).to(DType::kBFloat16).to(Device::cuda());
  Tensor ref = Tensor::empty({m, n}, DType::kBFloat16, Device::cuda()), got = Tensor::empty({m, n}, DType::kBFloat16, Device::cuda());
  cu::fp8_gemm_tn(a, fp(one), b, fp(one), ref, 0.0f, true);
  ops::add_(ref, r);
  const bool ran = cu::fp8_gemm_tn_residual(a, fp(one), b, fp(one), r, got, true);
  const std::vector<float> hr = host(ref), hg = host(got), hres = host(r), ha = host(a), hb = host(b);
  int64_t bad = 0, bad_unfused = 0;
  double worst = 0;  // |got - D*| / bound, largest
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double dot = 0, abs_sum = 0;
      for (int64_t q = 0; q < k; ++q) {
        const double p = (double)ha[i * k + q] * hb[j * k + q];
        dot += p;
        abs_sum += std::fabs(p);
      }
      const double exact = dot + hres[i * n + j];
      const double bound = std::ldexp(std::fabs(exact), -8) + std::ldexp(abs_sum, -10);
      const double e = std::fabs((double)hg[i * n + j] - exact);
      worst = std::max(worst, e / bound);
      bad += e > bound;
      bad_unfused += std::fabs((double)hr[i * n + j] - exact) > bound;
    }
  const bool res_kept = hres == host(Tensor::from_vector(rv, {m, n}).to(DType::kBFloat16));
  char d[240];
  std::snprintf(d, sizeof d,
                "%s; %lld of %lld elements beyond the bound (worst err/bound %.3g; unfused GEMM + add: %lld); "
                "residual unmodified %s",
                ran ? "cuBLASLt has the C != D variant" : "NO algorithm (the layer falls back to GEMM + add)",
                (long long)bad, (long long)(m * n), worst, (long long)bad_unfused, res_kept ? "yes" : "NO");
  report("fp8 GEMM + residual epilogue vs GEMM then add", ran && bad == 0 && res_kept, d);
}

// Sets the weight role's scale of linear `base` (host and device) through the checkpoint path.
void set_weight_scale(fp8::Fp8State& st, int base, float scale) {
  auto ts = st.checkpoint_tensors();
  std::vector<std::string> keys;
  for (auto& t : ts) {
    keys.push_back(t.key);
    if (t.key.ends_with(".scale") || t.key.ends_with(".scale_inv")) {
      std::vector<float> v = t.data.to_float_vector();
      v[base % fp8::kNumRoles + fp8::kWeight] = t.key.ends_with(".scale") ? scale : 1.0f / scale;
      t.data.copy_(Tensor::from_vector(v, t.data.shape()));
    }
  }
  st.restore_checkpoint_tensors(ts, keys);
}

void test_param_gather() {
  // (a) The shard cast: an unaligned, odd-length bf16 shard of a parameter buffer.
  {
    fp8::Fp8Config cfg;
    fp8::Fp8State hs(cfg, Device::cpu()), ds(cfg, Device::cuda());
    const int hb = hs.register_linear("l"), db = ds.register_linear("l");
    set_weight_scale(hs, hb, 173.25f);
    set_weight_scale(ds, db, 173.25f);
    const int64_t total = 300007, off = 13, n = 250001;
    std::normal_distribution<float> nd(0.0f, 0.5f);
    std::vector<float> v(total);
    for (auto& x : v) x = nd(g_rng);
    v[off + 777] = -3.75f;  // the shard's amax, away from its ends
    Tensor buf_h = Tensor::from_vector(v, {total}).to(DType::kBFloat16);
    Tensor buf_d = buf_h.to(Device::cuda());
    Tensor sh_h = buf_h.flat_slice(off, {n}), sh_d = buf_d.flat_slice(off, {n});
    Tensor out_h = Tensor::empty({n}, DType::kFloat8E4M3), fbuf = Tensor::zeros({total}, DType::kFloat8E4M3, Device::cuda());
    Tensor out_d = fbuf.flat_slice(off, {n});
    fp8::quantize_param_shard(hs, hb, sh_h, out_h);
    fp8::quantize_param_shard(ds, db, sh_d, out_d);
    std::vector<uint8_t> a = bytes(out_h), b = bytes(out_d);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += a[i] != b[i];
    const float ah = host(hs.amax(hb + fp8::kWeight))[0], ad = host(ds.amax(db + fp8::kWeight))[0];
    char d[160];
    std::snprintf(d, sizeof d, "%lld byte mismatches of %lld; amax CUDA %.6g CPU %.6g (expected 3.75)", (long long)bad,
                  (long long)n, ad, ah);
    report("quantize_param_shard CUDA vs CPU emulation (unaligned bf16 shard)", bad == 0 && ad == ah && ad == 3.75f, d);
  }
  // (b) The dgrad layout of a gathered FP8 weight.
  for (auto [R, C] : {std::pair<int64_t, int64_t>{999, 1543}, {1000, 1544}, {4096, 14336}}) {
    std::vector<float> deq;
    Tensor q = random_fp8(R, C, DType::kFloat8E4M3, deq);
    Tensor qt = Tensor::empty({C, R}, DType::kFloat8E4M3, Device::cuda());
    cu::fp8_transpose(q, qt);
    cudaDeviceSynchronize();
    const double ms = time_ms([&] { cu::fp8_transpose(q, qt); }, 10, 0);  // the call above warmed up
    Tensor ref = fp8::fp8_transpose_cpu(q.to(Device::cpu()));
    const bool ok = bytes(ref) == bytes(qt);
    char d[160];
    std::snprintf(d, sizeof d, "%s; %.3f ms, %.0f GB/s", ok ? "bit-exact" : "MISMATCH", ms, 2.0 * R * C / (ms * 1e-3) / 1e9);
    report("fp8_transpose " + std::to_string(R) + "x" + std::to_string(C) + " vs CPU", ok, d);
  }
  // (c) A linear on its FP8 primary weight == the cached linear quantizing the bf16 weight.
  {
    const int64_t N = 256, in = 128, out = 192;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    auto rnd = [&](int64_t n, float s) {
      std::vector<float> v(n);
      for (auto& x : v) x = nd(g_rng) * s;
      return Tensor::from_vector(v, {n}).to(DType::kBFloat16).to(Device::cuda());
    };
    fp8::Fp8Config cfg;
    cfg.amax_history_len = 4;
    cfg.amax_compute_algo = fp8::AmaxComputeAlgo::kMax;
    cfg.param_gather = true;
    fp8::Fp8State ref(cfg, Device::cuda()), pg(cfg, Device::cuda());
    ref.set_weight_cache_enabled(true);
    const int br = ref.register_linear("l"), bp = pg.register_linear("l");
    Tensor w = rnd(out * in, 0.02f).view({out, in});
    Tensor wq = Tensor::zeros({out, in}, DType::kFloat8E4M3, Device::cuda());
    int64_t bad = 0;
    for (int step = 0; step < 3; ++step) {
      // The distributed optimizer's part: cast (here one shard = the whole weight), gather, process.
      Tensor flat = wq.view({out * in});
      fp8::quantize_param_shard(pg, bp, w.view({out * in}), flat);
      fp8::post_all_gather_processing(pg, bp, wq);
      Tensor dwr = Tensor::zeros({out, in}, DType::kFloat32, Device::cuda()), dwp = dwr.clone();
      for (int mb = 0; mb < 2; ++mb) {
        Tensor x = rnd(N * in, 2.0f).view({N, in}), dy = rnd(N * out, 1e-4f).view({N, out});
        Tensor yr = Tensor::empty({N, out}, DType::kBFloat16, Device::cuda()), yp = yr.clone();
        fp8::linear_forward(ref, br, x, w, nullptr, yr);
        fp8::linear_forward(pg, bp, x, w, nullptr, yp);
        Tensor dxr = Tensor::empty({N, in}, DType::kBFloat16, Device::cuda()), dxp = dxr.clone();
        fp8::linear_backward(ref, br, dy, x, w, &dxr, &dwr, nullptr, true);
        fp8::linear_backward(pg, bp, dy, x, w, &dxp, &dwp, nullptr, true);
        bad += host(yr) != host(yp);
        bad += host(dxr) != host(dxp);
      }
      bad += host(dwr) != host(dwp);
      ref.reduce_and_update(nullptr);
      pg.reduce_and_update(nullptr);
      for (int r = 0; r < fp8::kNumRoles; ++r) bad += ref.host_scale(r) != pg.host_scale(r);
      cu::add_(w, rnd(out * in, 0.01f).view({out, in}), 1.0f);
      bump_param_version();
    }
    char d[160];
    std::snprintf(d, sizeof d, "%lld mismatching tensors/scales; weight casts: bf16 path %lld, FP8 parameter %lld",
                  (long long)bad, (long long)ref.weight_casts(), (long long)pg.weight_casts());
    report("FP8 primary weight linear on CUDA == cached bf16-weight linear (3 steps)",
           bad == 0 && pg.weight_casts() == 0 && ref.weight_casts() == 3 && host(ref.scale(br + fp8::kWeight))[0] != 1.0f,
           d);
  }
}

void time_gemms() {
  // LLaMA-3-8B layer GEMMs at 8192 tokens: qkv (6144 x 4096), proj, fc1 (28672 x 4096), fc2.
  struct S { const char* name; int64_t m, n, k; };
  const S shapes[] = {{"qkv fwd", 8192, 6144, 4096}, {"proj fwd", 8192, 4096, 4096},
                      {"fc1 fwd", 8192, 28672, 4096}, {"fc2 fwd", 8192, 4096, 14336},
                      {"fc1 wgrad", 28672, 4096, 8192}};
  for (const S& s : shapes) {
    Tensor a8 = Tensor::zeros({s.m, s.k}, DType::kFloat8E4M3, Device::cuda());
    Tensor b8 = Tensor::zeros({s.n, s.k}, DType::kFloat8E4M3, Device::cuda());
    Tensor c = Tensor::empty({s.m, s.n}, DType::kBFloat16, Device::cuda());
    Tensor one = dev_scalar(1.0f);
    Tensor ab = Tensor::zeros({s.m, s.k}, DType::kBFloat16, Device::cuda());
    Tensor bb = Tensor::zeros({s.n, s.k}, DType::kBFloat16, Device::cuda());
    double t8 = 0, t16 = 0;
    for (int pass = 0; pass < 2; ++pass) {
      t8 = time_ms([&] { cu::fp8_gemm_tn(a8, fp(one), b8, fp(one), c, 0.0f, true); }, 20, 3);
      t16 = time_ms([&] { cu::gemm(ab, false, bb, true, c, 1.0f, 0.0f); }, 20, 3);
    }
    const double fl = 2.0 * s.m * s.n * s.k;
    std::printf("time %-10s m%-6lld n%-6lld k%-6lld fp8 %7.3f ms %6.0f TFLOP/s (%.0f%% of 1487) | bf16 %7.3f ms %6.0f TFLOP/s | %.2fx\n",
                s.name, (long long)s.m, (long long)s.n, (long long)s.k, t8, fl / t8 / 1e9, 100 * fl / t8 / 1e9 / 1487,
                t16, fl / t16 / 1e9, t16 / t8);
  }
  // Quantize(+transpose) bandwidth on an fc2-input-sized tensor.
  Tensor x = Tensor::zeros({8192, 14336}, DType::kBFloat16, Device::cuda());
  Tensor q = Tensor::empty({8192, 14336}, DType::kFloat8E4M3, Device::cuda());
  Tensor qt = Tensor::empty({14336, 8192}, DType::kFloat8E4M3, Device::cuda());
  Tensor sc = dev_scalar(1.0f), am = dev_amax();
  for (int t = 0; t < 2; ++t) {
    const double ms = time_ms([&] { cu::fp8_quantize(x, fp(sc), fp(am), &q, t ? &qt : nullptr); }, 10, 0);
    const double by = 8192.0 * 14336 * (2 + 1 + t);
    std::printf("time fp8_quantize%s 8192x14336 bf16: %.3f ms, %.0f GB/s\n", t ? "+transpose" : "", ms, by / ms / 1e6);
  }
}

// ------------------------------------------------------------------ blockwise recipe (group blockwise)
// --fp8-recipe blockwise (docs/fp8.md "Blockwise recipe"): ops::fp8_block_quantize on CUDA
// bit-exact vs the CPU reference (bytes and every scale_inv, padding included) on partial tiles
// and the LLaMA-3-8B shapes (with GB/s); fp8_block_gemm_tn (cuBLASLt block-scaled) vs a float64
// GEMM of the host-dequantized operands; fp8::linear with the blockwise recipe on CUDA vs the CPU
// emulation; block-scaled GEMM TFLOP/s next to the per-tensor FP8 GEMM.
struct BlockOut {
  Tensor q, s, qt, st;
};
int64_t c128(int64_t v) { return (v + 127) / 128; }
int64_t r4(int64_t v) { return (v + 3) / 4 * 4; }
BlockOut block_out(int64_t R, int64_t C, bool two_d, DType dt, Device d) {
  BlockOut o;
  o.q = Tensor::empty({R, C}, dt, d);
  o.qt = Tensor::empty({C, R}, dt, d);
  o.s = two_d ? Tensor::empty({c128(R), r4(c128(C))}, DType::kFloat32, d) : Tensor::empty({c128(C), r4(R)}, DType::kFloat32, d);
  o.st = two_d ? Tensor::empty({c128(C), r4(c128(R))}, DType::kFloat32, d) : Tensor::empty({c128(R), r4(C)}, DType::kFloat32, d);
  return o;
}
// Host-dequantized [R, K] operand of the block GEMM (1 x 128 along K or 128 x 128 blocks).
// `bug` reads the scales the way a broken kernel would (the negative controls of the GEMM check):
// 0 correct; 1 every element takes the scale of the next K block (a wrong scale stride / layout);
// 2 a transposed block (128 x 128: block (k/128, r/128) instead of (r/128, k/128); 1 x 128: the
// scale of the neighbouring row), indices wrapped into range.
std::vector<double> block_dequant(const Tensor& q, const Tensor& s, bool two_d, int bug = 0) {
  const std::vector<uint8_t> b = bytes(q);
  const std::vector<float> sc = host(s);
  const int64_t R = q.size(0), K = q.size(1), ld = s.size(1), kb = c128(K), rb = c128(R);
  const bool e4 = q.dtype() == DType::kFloat8E4M3;
  std::vector<double> out(R * K);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < K; ++k) {
      int64_t bk = k / 128, br = two_d ? r / 128 : r;
      if (bug == 1) bk = (bk + 1) % kb;
      if (bug == 2 && two_d) std::swap(bk, br), bk %= kb, br %= rb;
      if (bug == 2 && !two_d) br = r ^ 1;
      out[r * K + k] = (double)(e4 ? e4m3_bits_to_float(b[r * K + k]) : e5m2_bits_to_float(b[r * K + k])) *
                       (two_d ? sc[br * ld + bk] : sc[bk * ld + br]);
    }
  return out;
}

// Blockwise fused producers (fp8_block_rmsnorm_quantize after rmsnorm_rstd, fp8_block_swiglu_quantize,
// fp8_block_swiglu_backward_quantize) against the unfused path -- rmsnorm_forward / swiglu_forward /
// swiglu_backward writing the model dtype, then fp8_block_quantize (1 x 128 q + s, 128 x 1 q_t + s_t)
// -- bit-exact bytes of both copies and every scale_inv bit (padding included); partial tiles,
// fp32 and power-of-2 scales, fp32 activations, and the LLaMA-3-8B shapes with both paths' times.
// What MEGATRON_FP8_BLOCK_FUSED=0 vs 1 must leave unchanged (identical losses).
void test_blockwise_fused() {
  struct S { int which; int64_t rows, cols; bool pow2; DType dt; bool big; };  // which: 0 norm, 1 swiglu, 2 swiglu bwd
  const S shapes[] = {{0, 272, 264, true, DType::kBFloat16, false},  {0, 384, 256, false, DType::kFloat32, false},
                      {1, 272, 264, false, DType::kBFloat16, false}, {1, 256, 384, true, DType::kFloat32, false},
                      {2, 272, 272, true, DType::kBFloat16, false},  {2, 256, 512, false, DType::kBFloat16, false},
                      {0, 8192, 4096, true, DType::kBFloat16, true}, {1, 8192, 14336, true, DType::kBFloat16, true},
                      {2, 8192, 28672, true, DType::kBFloat16, true}};
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (const S& sh : shapes) {
    const int64_t R = sh.rows, C = sh.cols;  // C: the quantized tensor's columns
    const int64_t in_cols = sh.which == 1 ? 2 * C : C;
    const DType qd = sh.which == 2 ? DType::kFloat8E5M2 : DType::kFloat8E4M3;
    std::vector<float> xv(R * in_cols), gv(C), dv(R * (C / 2));
    fast_fill(xv, 4.0f);
    fast_fill(dv, 4e-3f);
    for (auto& v : gv) v = 0.1f * nd(g_rng);
    // One tiny row tile and one huge element: scales differ by tile, one saturates nothing.
    for (int64_t c = 0; c < std::min<int64_t>(in_cols, 128); ++c) xv[5 * in_cols + c] *= 1e-6f;
    xv[(R / 2) * in_cols + 3] = 1e4f;
    Tensor x = Tensor::from_vector(xv, {R, in_cols}).to(sh.dt).to(Device::cuda());
    Tensor gamma = Tensor::from_vector(gv, {C}).to(sh.dt).to(Device::cuda());
    Tensor dy = Tensor::from_vector(dv, {R, C / 2}).to(sh.dt).to(Device::cuda());
    BlockOut u = block_out(R, C, false, qd, Device::cuda()), f = block_out(R, C, false, qd, Device::cuda());
    Tensor y = Tensor::empty({R, C}, sh.dt, Device::cuda());
    Tensor rstd_u = Tensor::empty({R}, DType::kFloat32, Device::cuda()), rstd_f = Tensor::empty({R}, DType::kFloat32, Device::cuda());
    auto unfused = [&] {
      if (sh.which == 0) cu::rmsnorm_forward(x, gamma, 1e-5f, true, y, rstd_u);
      else if (sh.which == 1) cu::swiglu_forward(x, y);
      else cu::swiglu_backward(dy, x, y);
      cu::fp8_block_quantize(y, false, sh.pow2, &u.q, &u.s, &u.qt, &u.st);
    };
    bool launched = true;
    auto fused = [&] {
      if (sh.which == 0) {
        cu::rmsnorm_rstd(x, gamma, 1e-5f, rstd_f);
        launched = cu::fp8_block_rmsnorm_quantize(x, gamma, rstd_f, true, sh.dt, sh.pow2, &f.q, &f.s, &f.qt, &f.st);
      } else if (sh.which == 1) {
        launched = cu::fp8_block_swiglu_quantize(x, sh.dt, sh.pow2, &f.q, &f.s, &f.qt, &f.st);
      } else {
        launched = cu::fp8_block_swiglu_backward_quantize(dy, x, sh.pow2, &f.q, &f.s, &f.qt, &f.st);
      }
    };
    unfused();
    fused();
    const int64_t bad = row_mismatches(f.q, bytes(u.q)) + row_mismatches(f.qt, bytes(u.qt));
    int64_t bad_s = 0;
    for (auto [a, b] : {std::pair<const Tensor*, const Tensor*>{&u.s, &f.s}, {&u.st, &f.st}}) {
      const std::vector<float> ha = host(*a), hb = host(*b);
      for (size_t i = 0; i < ha.size(); ++i) bad_s += std::memcmp(&ha[i], &hb[i], 4) != 0;
    }
    std::string t;
    if (sh.big) {
      const double tu = time_ms(unfused, 5, 1), tf = time_ms(fused, 5, 1);
      char b[160];
      std::snprintf(b, sizeof b, "; unfused %.3f ms, fused %.3f ms", tu, tf);
      t = b;
    }
    char d[300];
    std::snprintf(d, sizeof d, "%lld byte / %lld scale_inv mismatches%s", (long long)bad, (long long)bad_s, t.c_str());
    static const char* names[] = {"rmsnorm", "swiglu", "swiglu_bwd"};
    char name[160];
    std::snprintf(name, sizeof name, "fp8_block %s+quantize fused vs unfused %s %lldx%lld%s", names[sh.which],
                  dtype_name(sh.dt), (long long)R, (long long)C, sh.pow2 ? "" : " fp32-scales");
    report(name, launched && bad == 0 && bad_s == 0, d);
  }
}

// The blockwise transport through fp8::linear: the fused producers' Fp8Input (q + s for the
// forward / dgrad, q_t + s_t for the wgrad), the SwiGLU backward's dyq and linear_proj's kept
// columnwise copy (keep_x_t + keep_x_st) give bit-identical y, dx and dw to the unfused calls (the
// producer's bf16 output, quantized inside fp8::linear): same FP8 operands, same GEMMs.
// Needs MEGATRON_FP8_BLOCK_FUSED unset or 1 (the default; with 0 the producers return nothing: FAIL).
void test_blockwise_fused_linear() {
  fp8::Fp8Config cfg;
  cfg.recipe = fp8::Fp8Recipe::kBlockwise;
  fp8::Fp8State st(cfg, Device::cuda());
  const int bq = st.register_linear("qkv"), b1 = st.register_linear("fc1"), b2 = st.register_linear("fc2");
  const int64_t N = 256, h = 256, f = 384, out = 512;
  std::vector<float> xv(N * h), gv(h), wv(out * h), w1v(2 * f * h), w2v(h * f), dyv(N * out), fv(N * 2 * f), dav(N * f);
  fast_fill(xv, 4.0f);
  fast_fill(fv, 4.0f);
  fast_fill(gv, 0.2f);
  fast_fill(wv, 0.05f);
  fast_fill(w1v, 0.05f);
  fast_fill(w2v, 0.05f);
  fast_fill(dyv, 1e-3f);
  fast_fill(dav, 1e-3f);
  auto dev = [](const std::vector<float>& v, Shape s) { return Tensor::from_vector(v, s).to(DType::kBFloat16).to(Device::cuda()); };
  Tensor x = dev(xv, {N, h}), gamma = dev(gv, {h}), w = dev(wv, {out, h}), w1 = dev(w1v, {2 * f, h}), w2 = dev(w2v, {h, f});
  const std::vector<float> dy2v(dyv.begin(), dyv.begin() + N * h);  // fc2's output gradient [N, h]
  Tensor dy = dev(dyv, {N, out}), fc1o = dev(fv, {N, 2 * f}), dact = dev(dav, {N, f}), dy2 = dev(dy2v, {N, h});
  auto bf = [](Shape s) { return Tensor::empty(s, DType::kBFloat16, Device::cuda()); };
  auto f32 = [](Shape s) { return Tensor::zeros(s, DType::kFloat32, Device::cuda()); };
  auto same = [](const Tensor& a, const Tensor& b) {
    const std::vector<float> ha = host(a), hb = host(b);
    int64_t bad = 0;
    for (size_t i = 0; i < ha.size(); ++i) bad += std::memcmp(&ha[i], &hb[i], 4) != 0;
    return bad;
  };
  char d[200];
  // RMSNorm -> linear (forward, dgrad, wgrad from q_t + s_t).
  Tensor rstd = Tensor::empty({N}, DType::kFloat32, Device::cuda()), rstd_u = Tensor::empty({N}, DType::kFloat32, Device::cuda());
  const fp8::Fp8Input xq = fp8::rmsnorm_fp8(st, bq, x, gamma, 1e-5f, true, rstd);
  Tensor xn = bf({N, h});
  ops::rmsnorm_forward(x, gamma, 1e-5f, true, xn, rstd_u);
  Tensor yf = bf({N, out}), yu = bf({N, out}), dxf = bf({N, h}), dxu = bf({N, h}), dwf = f32({out, h}), dwu = f32({out, h});
  if (xq.defined()) {
    fp8::linear_forward(st, bq, Tensor(), w, nullptr, yf, &xq);
    fp8::linear_backward(st, bq, dy, Tensor(), w, &dxf, &dwf, nullptr, true, &xq.q_t, nullptr, &xq.s_t);
  }
  fp8::linear_forward(st, bq, xn, w, nullptr, yu);
  fp8::linear_backward(st, bq, dy, xn, w, &dxu, &dwu, nullptr, true);
  int64_t by = same(yf, yu), bx = same(dxf, dxu), bw = same(dwf, dwu);
  std::snprintf(d, sizeof d, "%lld y / %lld dx / %lld dw mismatches", (long long)by, (long long)bx, (long long)bw);
  report("fp8::linear blockwise rmsnorm_fp8 input == unfused", xq.defined() && by + bx + bw == 0, d);
  // SwiGLU -> fc2 (forward; wgrad from q_t + s_t) and linear_proj-style keep_x_t + keep_x_st.
  const fp8::Fp8Input aq = fp8::swiglu_fp8(st, b2, fc1o);
  Tensor act = bf({N, f});
  ops::swiglu_forward(fc1o, act);
  Tensor y2f = bf({N, h}), y2u = bf({N, h}), y2k = bf({N, h}), dw2f = f32({h, f}), dw2u = f32({h, f}), dw2k = f32({h, f});
  Tensor kt, kst;
  if (aq.defined()) {
    fp8::linear_forward(st, b2, Tensor(), w2, nullptr, y2f, &aq);
    fp8::linear_backward(st, b2, dy2, Tensor(), w2, nullptr, &dw2f, nullptr, true, &aq.q_t, nullptr, &aq.s_t);
  }
  fp8::linear_forward(st, b2, act, w2, nullptr, y2u);
  fp8::linear_backward(st, b2, dy2, act, w2, nullptr, &dw2u, nullptr, true);
  fp8::linear_forward(st, b2, act, w2, nullptr, y2k, nullptr, &kt, nullptr, &kst);
  fp8::linear_backward(st, b2, dy2, Tensor(), w2, nullptr, &dw2k, nullptr, true, &kt, nullptr, &kst);
  by = same(y2f, y2u) + same(y2k, y2u);
  bw = same(dw2f, dw2u) + same(dw2k, dw2u);
  std::snprintf(d, sizeof d, "%lld y / %lld dw mismatches; kept columnwise copy %s", (long long)by, (long long)bw,
                kt.defined() && kst.defined() ? "made" : "MISSING");
  report("fp8::linear blockwise swiglu_fp8 input and keep_x_t == unfused", aq.defined() && kt.defined() && by + bw == 0, d);
  // SwiGLU backward -> fc1's dgrad and wgrad from the fused dyq.
  const fp8::Fp8Input gq = fp8::swiglu_backward_fp8(st, b1, dact, fc1o);
  Tensor dfc1 = bf({N, 2 * f});
  ops::swiglu_backward(dact, fc1o, dfc1);
  Tensor dx1f = bf({N, h}), dx1u = bf({N, h}), dw1f = f32({2 * f, h}), dw1u = f32({2 * f, h});
  if (gq.defined()) fp8::linear_backward(st, b1, Tensor(), x, w1, &dx1f, &dw1f, nullptr, true, nullptr, &gq);
  fp8::linear_backward(st, b1, dfc1, x, w1, &dx1u, &dw1u, nullptr, true);
  bx = same(dx1f, dx1u);
  bw = same(dw1f, dw1u);
  std::snprintf(d, sizeof d, "%lld dx / %lld dw mismatches", (long long)bx, (long long)bw);
  report("fp8::linear blockwise swiglu_backward_fp8 dyq == unfused", gq.defined() && bx + bw == 0, d);
}

void test_blockwise() {
  // 0. The fused producers (MEGATRON_FP8_BLOCK_FUSED) against producer + quantize.
  try {
    test_blockwise_fused();
    test_blockwise_fused_linear();
  } catch (const std::exception& e) {
    report("fp8_block fused producers", false, std::string("exception: ") + e.what());
  }
  // 1. Quantize: CUDA vs CPU reference, bit-exact.
  struct Q { int64_t r, c; bool two_d, pow2; DType in, q; bool timed; };
  const Q qs[] = {{130, 200, false, true, DType::kBFloat16, DType::kFloat8E4M3, false},
                  {130, 200, true, true, DType::kBFloat16, DType::kFloat8E4M3, false},
                  {257, 131, false, false, DType::kFloat32, DType::kFloat8E5M2, false},
                  {257, 131, true, false, DType::kFloat32, DType::kFloat8E4M3, false},
                  {256, 512, false, false, DType::kFloat32, DType::kFloat8E4M3, false},  // whole tiles, fp32 in
                  {256, 512, true, true, DType::kFloat32, DType::kFloat8E5M2, false},
                  {8192, 4096, false, true, DType::kBFloat16, DType::kFloat8E5M2, true},
                  {8192, 6144, false, true, DType::kBFloat16, DType::kFloat8E4M3, true},
                  {4096, 14336, true, true, DType::kBFloat16, DType::kFloat8E4M3, true}};
  for (const Q& c : qs) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> v(c.r * c.c);
    // Spread magnitudes over tiles (some tiny, one zero tile) so the per-tile scales differ.
    for (int64_t i = 0; i < c.r * c.c; ++i) {
      const int64_t row = i / c.c, col = i % c.c;
      const float mag = std::ldexp(1.0f, (int)((row / 7 + col / 37) % 24) - 12);
      v[i] = (row < 128 && col < 128 && c.r > 200 && c.c < 200) ? 0.0f : nd(g_rng) * mag;
    }
    Tensor xh = Tensor::from_vector(v, {c.r, c.c}).to(c.in);
    BlockOut h = block_out(c.r, c.c, c.two_d, c.q, Device::cpu()), g = block_out(c.r, c.c, c.two_d, c.q, Device::cuda());
    ops::fp8_block_quantize(xh, c.two_d, c.pow2, &h.q, &h.s, &h.qt, &h.st);
    Tensor x = xh.to(Device::cuda());
    cu::fp8_block_quantize(x, c.two_d, c.pow2, &g.q, &g.s, &g.qt, &g.st);
    int64_t bad = row_mismatches(g.q, bytes(h.q)) + row_mismatches(g.qt, bytes(h.qt));
    const std::vector<float> hs = host(h.s), gs = host(g.s), hst = host(h.st), gst = host(g.st);
    int64_t bad_s = 0;
    for (size_t i = 0; i < hs.size(); ++i) bad_s += hs[i] != gs[i];
    for (size_t i = 0; i < hst.size(); ++i) bad_s += hst[i] != gst[i];
    // Row layout only.
    BlockOut g2 = block_out(c.r, c.c, c.two_d, c.q, Device::cuda());
    cu::fp8_block_quantize(x, c.two_d, c.pow2, &g2.q, &g2.s, nullptr, nullptr);
    bad += row_mismatches(g2.q, bytes(h.q));
    char d[200];
    std::snprintf(d, sizeof d, "%lld byte / %lld scale_inv mismatches", (long long)bad, (long long)bad_s);
    // Columnwise only (the backward's copy of x).
    BlockOut g3 = block_out(c.r, c.c, c.two_d, c.q, Device::cuda());
    cu::fp8_block_quantize(x, c.two_d, c.pow2, nullptr, nullptr, &g3.qt, &g3.st);
    bad += row_mismatches(g3.qt, bytes(h.qt));
    const std::vector<float> g3st = host(g3.st);
    for (size_t i = 0; i < hst.size(); ++i) bad_s += hst[i] != g3st[i];
    if (c.timed) {
      const double ms = time_ms([&] { cu::fp8_block_quantize(x, c.two_d, c.pow2, &g.q, &g.s, &g.qt, &g.st); }, 10, 2);
      const double by = (double)c.r * c.c * (dtype_size(c.in) + 2);
      std::snprintf(d + std::strlen(d), sizeof d - std::strlen(d), "; q+q_t %.3f ms %.0f GB/s", ms, by / ms / 1e6);
    }
    char name[160];
    std::snprintf(name, sizeof name, "fp8_block_quantize %s %s->%s %lldx%lld%s vs CPU", c.two_d ? "128x128" : "1x128",
                  dtype_name(c.in), dtype_name(c.q), (long long)c.r, (long long)c.c, c.pow2 ? "" : " fp32-scales");
    report(name, bad == 0 && bad_s == 0, d);
  }

  // 2. Block-scaled GEMM vs float64 of the dequantized operands: forward (x 1x128, W 128x128),
  // dgrad (dy 1x128 E5M2, W^T 128x128), wgrad (dy^T, x^T: 1x128 both, fp32 accumulate).
  // sweep: also each of cuBLASLt's other algorithms. The last three exercise our kernel's
  // (fp8_block_gemm.cu) 6-stage ring wrapping within a tile (k 1024 = 8 blocks), the persistent
  // loop (144 tiles > 132 SMs) with tiles walking along n, and E5M2 as the B operand.
  struct G { int64_t m, n, k; bool a2, b2; DType a, b, c; float beta; const char* what; bool sweep; };
  const G gs[] = {{256, 384, 512, false, true, DType::kFloat8E4M3, DType::kFloat8E4M3, DType::kBFloat16, 0.0f, "fwd", true},
                  {256, 512, 384, false, true, DType::kFloat8E5M2, DType::kFloat8E4M3, DType::kBFloat16, 0.0f, "dgrad", true},
                  {384, 512, 256, false, false, DType::kFloat8E5M2, DType::kFloat8E4M3, DType::kFloat32, 1.0f, "wgrad", true},
                  {256, 384, 512, false, false, DType::kFloat8E4M3, DType::kFloat8E4M3, DType::kBFloat16, 0.0f, "1dx1d", true},
                  {384, 640, 1024, false, true, DType::kFloat8E4M3, DType::kFloat8E4M3, DType::kBFloat16, 0.0f, "fwd k-ring", false},
                  {2048, 1152, 256, false, false, DType::kFloat8E5M2, DType::kFloat8E4M3, DType::kFloat32, 1.0f, "wgrad persistent", false},
                  {256, 384, 256, false, false, DType::kFloat8E4M3, DType::kFloat8E5M2, DType::kFloat32, 0.5f, "B e5m2 beta 0.5", false}};
  for (const G& c : gs) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    auto make = [&](int64_t r, int64_t k, bool two_d, DType dt, BlockOut& o) {
      std::vector<float> v(r * k);
      // Magnitudes over 9 binades along K; 128 x 128 operands also get a per-tile factor (2^-2..2^2)
      // so that their tiles' scales differ and the transposed-block control can see a wrong tile.
      for (int64_t i = 0; i < r * k; ++i)
        v[i] = nd(g_rng) * std::ldexp(1.0f, (int)((i / 97) % 9) - 4 +
                                                (two_d ? (int)(((i / k) / 128 * 3 + (i % k) / 128) % 5) - 2 : 0));
      Tensor xd = Tensor::from_vector(v, {r, k}).to(DType::kBFloat16).to(Device::cuda());
      o = block_out(r, k, two_d, dt, Device::cuda());
      cu::fp8_block_quantize(xd, two_d, true, &o.q, &o.s, nullptr, nullptr);
    };
    BlockOut A, B;
    make(c.m, c.k, c.a2, c.a, A);
    make(c.n, c.k, c.b2, c.b, B);
    std::vector<float> c0(c.m * c.n);
    for (auto& x : c0) x = nd(g_rng);
    Tensor cd = Tensor::from_vector(c0, {c.m, c.n}).to(c.c).to(Device::cuda());
    const std::vector<float> c0r = host(cd);
    cu::fp8_block_gemm_tn(A.q, A.s, c.a2, B.q, B.s, c.b2, cd, c.beta);
    const std::vector<float> got = host(cd);
    // max over the outputs of |got - ref| / (sum_k |a b| + |beta c0|), ref in float64 from the
    // dequantized operands (da, db); the negative controls use operands dequantized as a broken
    // kernel would (block_dequant's `bug`), compared with the correct reference.
    auto max_err = [&](const std::vector<double>& da, const std::vector<double>& db, const std::vector<double>* vs) {
      double worst = 0;
      for (int64_t i = 0; i < c.m; ++i)
        for (int64_t j = 0; j < c.n; ++j) {
          double sum = 0, sabs = 0;
          for (int64_t k = 0; k < c.k; ++k) {
            const double t = da[i * c.k + k] * db[j * c.k + k];
            sum += t;
            sabs += std::fabs(t);
          }
          const double ref = sum + c.beta * c0r[i * c.n + j];
          const double cmp = vs ? (*vs)[i * c.n + j] : (double)got[i * c.n + j];
          worst = std::max(worst, std::fabs(cmp - ref) / (sabs + std::fabs(c.beta * c0r[i * c.n + j]) + 1e-30));
        }
      return worst;
    };
    auto gemm = [&](const std::vector<double>& da, const std::vector<double>& db) {
      std::vector<double> o(c.m * c.n);
      for (int64_t i = 0; i < c.m; ++i)
        for (int64_t j = 0; j < c.n; ++j) {
          double sum = c.beta * c0r[i * c.n + j];
          for (int64_t k = 0; k < c.k; ++k) sum += da[i * c.k + k] * db[j * c.k + k];
          o[i * c.n + j] = sum;
        }
      return o;
    };
    const std::vector<double> da = block_dequant(A.q, A.s, c.a2), db = block_dequant(B.q, B.s, c.b2);
    const double worst = max_err(da, db, nullptr);
    // Negative controls: the float64 result of a wrong scale layout (next K block's scale for A)
    // and of a transposed block for B, measured with the same metric.
    const std::vector<double> bug1 = gemm(block_dequant(A.q, A.s, c.a2, 1), db);
    const std::vector<double> bug2 = gemm(da, block_dequant(B.q, B.s, c.b2, 2));
    const double worst_bug = std::min(max_err(da, db, &bug1), max_err(da, db, &bug2));
    // Bound (relative to sum |a b|), from the arithmetic of the GEMM itself:
    //  - Hopper's FP8 tensor-core MMA keeps about 14 bits of its running sum (DeepSeek-V3 paper,
    //    Sec. 3.3.2); cuBLASLt's block-scaled kernels apply the per-block scales in fp32 and so
    //    promote the partial sum to fp32 once per 128-element K block. Within a block, each of
    //    the <= 128 additions truncates at most 2^-14 of the aligned magnitude, which is at most
    //    the block's sum |a b|: worst case 128 * 2^-14 = 2^-7 = 7.8e-3 of the block's sum |a b|,
    //    hence of the total (the fp32 sums across blocks add ~2^-24 per block: negligible).
    //    Typically far less (the aligned magnitude is |partial sum| ~ sqrt(j) * |term|, not the
    //    block's sum |a b|), but the truncation is one-signed, so errors do not cancel, and these
    //    inputs (magnitudes over 9 binades along K) let one large term dominate a block: the first
    //    H200 run measured 1.0e-3 (fp32 out) and 3.4e-3 (bf16 out), 0.13x and 0.35x of the bound
    //    (before the 128 x 128 operands got their per-tile factor).
    //  - bf16 output: one rounding, 2^-9 relative of |c| <= sum |a b| (fp32 output: 2^-24, nil).
    // A wrong scale layout or block (the negative controls) misreads scales by factors of >= 2
    // (power-of-2 scales over 9 binades), so an error of order 1 (0.9-24 for these inputs in a
    // float64 CPU estimate): the controls must exceed 10x the bound, so the bound still separates
    // a correct GEMM from a broken one.
    const double tol = std::ldexp(128.0, -14) + (c.c == DType::kFloat32 ? 0.0 : std::ldexp(1.0, -9));
    char d[240], name[160];
    std::snprintf(d, sizeof d, "max |err| / sum|ab| = %.3g (tol %.3g = 128*2^-14%s); wrong-layout controls %.3g (need > %.3g)",
                  worst, tol, c.c == DType::kFloat32 ? "" : " + 2^-9", worst_bug, 10 * tol);
    std::snprintf(name, sizeof name, "fp8_block_gemm_tn %s %s%s x %s%s -> %s m%lld n%lld k%lld", c.what,
                  dtype_name(c.a), c.a2 ? "(2d)" : "", dtype_name(c.b), c.b2 ? "(2d)" : "", dtype_name(c.c),
                  (long long)c.m, (long long)c.n, (long long)c.k);
    report(name, worst <= tol && worst_bug > 10 * tol, d);
    // The heuristic's other algorithms (MEGATRON_FP8_BLOCK_WGRAD_ALGO, the timing sweep below):
    // same operands and bound.
    // Our kernel (MEGATRON_FP8_BLOCK_GEMM=ours): same operands, same bound; on an sm_90 device it
    // must take every case here.
    {
      Tensor co = Tensor::from_vector(c0, {c.m, c.n}).to(c.c).to(Device::cuda());
      const bool ran = cu::fp8_block_gemm_tn_ours(A.q, A.s, c.a2, B.q, B.s, c.b2, co, c.beta);
      double w = -1;
      if (ran) {
        const std::vector<float> go = host(co);
        const std::vector<double> god(go.begin(), go.end());
        w = max_err(da, db, &god);
      }
      std::snprintf(d, sizeof d, "%s max |err| / sum|ab| = %.3g (tol %.3g)", ran ? "ran:" : "NOT RUN (unsupported):", w, tol);
      report(std::string(name) + " ours", ran && w <= tol, d);
    }
    for (int algo = 1; c.sweep && algo < 16; ++algo) {
      Tensor ca = Tensor::from_vector(c0, {c.m, c.n}).to(c.c).to(Device::cuda());
      if (!cu::fp8_block_gemm_tn_algo(A.q, A.s, c.a2, B.q, B.s, c.b2, ca, c.beta, algo)) break;
      const std::vector<float> ga = host(ca);
      const std::vector<double> gad(ga.begin(), ga.end());
      const double w = max_err(da, db, &gad);
      std::snprintf(d, sizeof d, "max |err| / sum|ab| = %.3g (tol %.3g)", w, tol);
      report(std::string(name) + " algo " + std::to_string(algo), w <= tol, d);
    }
  }

  // 3. fp8::linear, blockwise recipe: CUDA vs the CPU emulation (same quantized operands; the
  // GEMMs' summation order and the bf16 rounding of y / dx differ: relative norm error <= 1e-2).
  for (fp8::Fp8Format fmt : {fp8::Fp8Format::kHybrid, fp8::Fp8Format::kE4M3}) {
    fp8::Fp8Config cfg;
    cfg.recipe = fp8::Fp8Recipe::kBlockwise;
    cfg.format = fmt;
    linear_vs_cpu(cfg, 256, 256, 384, std::string("fp8::linear blockwise ") + (fmt == fp8::Fp8Format::kHybrid ? "hybrid" : "e4m3"));
  }

  // 4. Timing on LLaMA-3-8B shapes (8192 tokens). Quantize kernels (GB/s = bytes read + written):
  // rows only (forward x), columns only (backward x), both (dy), 128 x 128 with transpose (W).
  {
    struct T { const char* what; int64_t r, c; bool two_d, row, col; };
    const T ts[] = {{"x rows", 8192, 4096, false, true, false},     {"x cols", 8192, 4096, false, false, true},
                    {"dy rows+cols", 8192, 4096, false, true, true}, {"x rows", 8192, 14336, false, true, false},
                    {"x cols", 8192, 14336, false, false, true},    {"dy rows+cols", 8192, 28672, false, true, true},
                    {"W 128x128+T", 4096, 14336, true, true, true},  {"W 128x128+T", 28672, 4096, true, true, true}};
    for (const T& c : ts) {
      Tensor x = Tensor::empty({c.r, c.c}, DType::kBFloat16, Device::cuda());
      ops::fill(x, 0.37f);
      BlockOut g = block_out(c.r, c.c, c.two_d, DType::kFloat8E4M3, Device::cuda());
      const double ms = time_ms([&] {
        cu::fp8_block_quantize(x, c.two_d, true, c.row ? &g.q : nullptr, c.row ? &g.s : nullptr, c.col ? &g.qt : nullptr,
                               c.col ? &g.st : nullptr);
      }, 20, 3);
      const double by = (double)c.r * c.c * (2 + (c.row ? 1 : 0) + (c.col ? 1 : 0));
      std::printf("time fp8_block_quantize %-13s %6lldx%-6lld %7.3f ms %6.0f GB/s\n", c.what, (long long)c.r,
                  (long long)c.c, ms, by / ms / 1e6);
    }
  }
  // Block-scaled GEMMs, each of the heuristic's algorithms (algo 0 = what training runs, except
  // MEGATRON_FP8_BLOCK_WGRAD_ALGO for the wgrad), next to the per-tensor FP8 GEMM with and without
  // fast accumulation (block-scaled GEMMs never use it). The wgrad as training runs it: fp32 out,
  // beta 1 (accumulating into the fp32 gradient).
  struct S { const char* name; int64_t m, n, k; bool b2; bool wgrad; };
  const S ss[] = {{"qkv fwd", 8192, 6144, 4096, true, false},     {"fc1 fwd", 8192, 28672, 4096, true, false},
                  {"fc2 fwd", 8192, 4096, 14336, true, false},    {"fc1 dgrad", 8192, 4096, 28672, true, false},
                  {"qkv wgrad", 6144, 4096, 8192, false, true},   {"proj wgrad", 4096, 4096, 8192, false, true},
                  {"fc1 wgrad", 28672, 4096, 8192, false, true},  {"fc2 wgrad", 4096, 14336, 8192, false, true},
                  // The operands in the other order (dW^T = x^T dy): FP8 GEMMs on Hopper take only the
                  // TN form into a column-major D, so this order would need a transpose of the fp32
                  // dW (~0.25 ms at fc1's shape); timed to see whether cuBLASLt is faster this way.
                  {"fc1 wgradT", 4096, 28672, 8192, false, true},
                  // The output layer with --fp8-output-proj (vocab 128256).
                  {"head fwd", 8192, 128256, 4096, true, false},  {"head dgrad", 8192, 4096, 128256, true, false},
                  {"head wgrad", 128256, 4096, 8192, false, true}};
  // Operands: N(0, 1) bf16 quantized by the block kernels (zero operands draw less power than
  // real ones, and every step runs at the power limit: docs/performance.md, session 13).
  auto random_block = [](int64_t r, int64_t k, bool two_d, uint64_t key) {
    Tensor x = Tensor::empty({r, k}, DType::kBFloat16, Device::cuda());
    ops::NormalInitSpec spec;
    spec.key = key;
    spec.std = 1.0f;
    spec.nd = 2;
    spec.local[0] = spec.global[0] = r;
    spec.local[1] = spec.global[1] = k;
    if (!ops::normal_init(x, spec)) throw std::runtime_error("normal_init: not fused on CUDA for bf16");
    BlockOut o = block_out(r, k, two_d, DType::kFloat8E4M3, Device::cuda());
    cu::fp8_block_quantize(x, two_d, true, &o.q, &o.s, nullptr, nullptr);
    return o;
  };
  for (const S& c : ss) {
    BlockOut A = random_block(c.m, c.k, false, 11);
    BlockOut B = random_block(c.n, c.k, c.b2, 12);
    const DType ct = c.wgrad ? DType::kFloat32 : DType::kBFloat16;
    const float beta = c.wgrad ? 1.0f : 0.0f;
    Tensor cd = Tensor::zeros({c.m, c.n}, ct, Device::cuda());
    Tensor one = dev_scalar(1.0f);
    const double fl = 2.0 * c.m * c.n * c.k;
    const double tt = time_ms([&] { cu::fp8_gemm_tn(A.q, fp(one), B.q, fp(one), cd, beta, true); }, 20, 3);
    const double ts = time_ms([&] { cu::fp8_gemm_tn(A.q, fp(one), B.q, fp(one), cd, beta, false); }, 20, 3);
    double best = 1e30;
    int best_i = -1;
    for (int algo = 0; algo < 16; ++algo) {
      if (!cu::fp8_block_gemm_tn_algo(A.q, A.s, false, B.q, B.s, c.b2, cd, beta, algo)) break;
      const double tb = time_ms([&] { cu::fp8_block_gemm_tn_algo(A.q, A.s, false, B.q, B.s, c.b2, cd, beta, algo); }, 10, 2);
      if (tb < best) best = tb, best_i = algo;
      std::printf("time block-scaled %-10s m%-6lld n%-6lld k%-6lld %s algo %d %7.3f ms %6.0f TFLOP/s | per-tensor fp8 "
                  "fast-accum %6.0f, split-accum %6.0f TFLOP/s\n",
                  c.name, (long long)c.m, (long long)c.n, (long long)c.k, dtype_name(ct), algo, tb, fl / tb / 1e9,
                  fl / tt / 1e9, fl / ts / 1e9);
    }
    std::printf("best block-scaled %-10s algo %d %6.0f TFLOP/s\n", c.name, best_i, fl / best / 1e9);
    if (cu::fp8_block_gemm_tn_ours(A.q, A.s, false, B.q, B.s, c.b2, cd, beta)) {
      const double to = time_ms([&] { cu::fp8_block_gemm_tn_ours(A.q, A.s, false, B.q, B.s, c.b2, cd, beta); }, 10, 2);
      std::printf("time ours block-scaled %-10s m%-6lld n%-6lld k%-6lld %7.3f ms %6.0f TFLOP/s (cuBLASLt best %6.0f, "
                  "algo 0 %s)\n",
                  c.name, (long long)c.m, (long long)c.n, (long long)c.k, to, fl / to / 1e9, fl / best / 1e9,
                  best_i == 0 ? "is best" : "slower");
    }
  }
}
}  // namespace

// Usage: fp8_gpu_test [--no-timing] [--groups a,b,...] (groups: casts quantize quantize_fast gemm
// linear weight_cache fused_quantize fused_swiglu_backward scale_update residual_gemm param_gather
// blockwise timing; default all, timing off with --no-timing).
// FP8 routed experts (docs/moe.md "FP8 experts", Session 11): the Experts module's forward +
// backward on CUDA with MEGATRON_MOE_FP8_FUSE=1 (no recompute of fc2's bf16 input, SwiGLU backward
// fused into fc1's grad-output quantization per expert, unpadding without zero fill), and with the
// weight cache's one-pass cast, bit-identical to MEGATRON_MOE_FP8_FUSE=0 without the cache: y, dx,
// the probability gradients and every main grad (bench/gpu/moe_fp8_leg.h, the check gpu_bench runs
// at the Mixtral shape), on uneven counts with an empty expert and counts that are not multiples
// of 16 (row padding).
void test_moe_experts() {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto rnd = [&](const Shape& s, DType dt, float sd) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = nd(g_rng) * sd;
    return Tensor::from_vector(v, s).to(dt).to(Device::cuda());
  };
  struct Case {
    int64_t H, F;
    std::vector<int64_t> counts;
  };
  for (const Case& c : {Case{256, 128, {37, 0, 50, 21, 16}}, Case{512, 384, {130, 3, 0, 255}}}) {
    fp8::Fp8Config f8;  // hybrid, delayed
    const bench::MoEFp8AbResult r = bench::moe_fp8_experts_ab(
        c.H, c.F, c.counts, 2, DType::kBFloat16, Device::cuda(), f8, rnd, [](const std::function<void()>& fn) {
          fn();
          return 0.0;
        });
    report("moe experts fp8 fuse on / weight cache == off, h " + std::to_string(c.H) + " ffn " + std::to_string(c.F),
           r.same_bits, r.detail);
  }
}

int main(int argc, char** argv) {
  // The fused blockwise producers are on by default (docs/environment.md);
  // MEGATRON_FP8_BLOCK_FUSED=0 makes test_blockwise_fused_linear FAIL by design.
  bool quick = false;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--no-timing")) quick = true;
    else if (!std::strcmp(argv[i], "--groups") && i + 1 < argc) only = std::string(",") + argv[++i] + ",";
  }
  std::printf("fp8_gpu_test\n");
  std::vector<std::pair<const char*, void (*)()>> groups = {
      {"casts", test_casts},   {"quantize", test_quantize},         {"quantize_fast", test_quantize_fast},
      {"gemm", test_gemm},     {"linear", test_linear},             {"weight_cache", test_weight_cache_cuda},
      {"fused_quantize", test_fused_quantize}, {"fused_swiglu_backward", test_fused_swiglu_backward},
      {"fused_scale_rows", test_fused_scale_rows},
      {"scale_update", test_scale_update},     {"moe_experts", test_moe_experts},
      {"residual_gemm", test_residual_gemm},   {"param_gather", test_param_gather},
      {"blockwise", test_blockwise}};
  if (!quick) groups.push_back({"timing", time_gemms});
  for (auto& [name, fn] : groups) {
    if (!only.empty() && only.find(std::string(",") + name + ",") == std::string::npos) continue;
    try {
      fn();
    } catch (const std::exception& e) {
      report(name, false, std::string("exception: ") + e.what());
    }
  }
  std::printf("fp8_gpu_test: %d of %d checks passed\n", g_total - g_fail, g_total);
  return g_fail ? 1 : 0;
}
