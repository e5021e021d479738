// Shared helpers of the dev/cuda kernel-variant drivers (dev/cuda/README.md): random inputs,
// host/device copies, a max-relative-error check against the CPU reference, and CUDA-event
// timing (median of N launches). Not part of the library; included only by dev/cuda/*.cpp.
#pragma once

#include <cuda_runtime.h>

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
#include "megatron/core/ops/cuda/cuda_utils.h"
#include "megatron/core/ops/cuda/variants.h"
#include "megatron/core/tensor/tensor.h"

namespace megatron::dev {

namespace cu = megatron::ops::cuda;
namespace cpu = megatron::ops::cpu;
using ops::cuda::variants::forced;

/// Command line of every driver: --reps N (timed launches, default 50), --seed S (default 1).
struct Args {
  int reps = 50;
  uint64_t seed = 1;
  Args(int argc, char** argv) {
    for (int i = 1; i + 1 < argc; i += 2) {
      if (!std::strcmp(argv[i], "--reps")) reps = std::max(1, std::atoi(argv[i + 1]));
      else if (!std::strcmp(argv[i], "--seed")) seed = std::strtoull(argv[i + 1], nullptr, 10);
      else {
        std::fprintf(stderr, "%s: unknown argument %s (use --reps N --seed S)\n", argv[0], argv[i]);
        std::exit(2);
      }
    }
    rng().seed(seed);
  }
  static std::mt19937_64& rng() {
    static std::mt19937_64 r;
    return r;
  }
};

/// n normal(0, scale) floats, rounded to dt (so the CPU reference sees the device's values).
inline std::vector<float> randn(int64_t n, DType dt, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(Args::rng());
  return Tensor::from_vector(v, {n}).to(dt).to_float_vector();
}

/// A tensor of `shape` and dtype dt on `device` holding v (already representable in dt).
inline Tensor make(const std::vector<float>& v, const Shape& shape, DType dt, Device device) {
  Tensor t = Tensor::from_vector(v, shape);
  if (dt != DType::kFloat32) t = t.to(dt);
  return t.to(device);
}

inline int& failures() {
  static int f = 0;
  return f;
}

/// Max |got - ref| / max(|ref|_inf, 1e-30) over all elements: prints PASS/FAIL against tol.
inline void check(const std::string& name, const Tensor& got, const Tensor& ref, double tol) {
  const std::vector<float> g = got.to_float_vector(), r = ref.to_float_vector();
  double err = 0.0, scale = 1e-30;
  for (float x : r) scale = std::max(scale, (double)std::fabs(x));
  bool finite = g.size() == r.size();
  for (size_t i = 0; finite && i < g.size(); ++i) {
    if (!std::isfinite(g[i])) finite = false;
    err = std::max(err, std::fabs((double)g[i] - (double)r[i]));
  }
  const bool ok = finite && err / scale <= tol;
  if (!ok) ++failures();
  std::printf("%s %-44s max err / max |ref| %.3e (tol %.0e)\n", ok ? "PASS" : "FAIL", name.c_str(), err / scale, tol);
}

/// Whether a and b (same shape and dtype, any devices) hold the same bytes: prints PASS/FAIL.
/// The check for a variant that must reproduce another one's bits (same operations, same order).
inline void same_bits(const std::string& name, const Tensor& a, const Tensor& b) {
  const Tensor ha = a.to(Device::cpu()), hb = b.to(Device::cpu());
  const bool ok = ha.dtype() == hb.dtype() && ha.nbytes() == hb.nbytes() &&
                  std::memcmp(ha.data_ptr(), hb.data_ptr(), ha.nbytes()) == 0;
  if (!ok) ++failures();
  std::printf("%s %-44s bitwise equal\n", ok ? "PASS" : "FAIL", name.c_str());
}

/// Prints "TIME <label> <ms> ms  <GB/s> GB/s" for `bytes` moved (read + written) in `ms`.
inline void time_bw_line(const std::string& label, double ms, double bytes) {
  std::printf("TIME %-44s %9.4f ms %7.0f GB/s\n", label.c_str(), ms, bytes / (ms * 1e-3) / 1e9);
}

/// Median over `reps` launches of fn (after 3 warm-up launches), in milliseconds, from CUDA events.
inline double median_ms(const std::function<void()>& fn, int reps) {
  for (int i = 0; i < 3; ++i) fn();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> ms(reps);
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a, megatron::cuda::current_stream());
    fn();
    cudaEventRecord(b, megatron::cuda::current_stream());
    cudaEventSynchronize(b);
    cudaEventElapsedTime(&ms[i], a, b);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::nth_element(ms.begin(), ms.begin() + reps / 2, ms.end());
  return ms[reps / 2];
}

/// Prints one timing line: "TIME <label> <ms> ms".
inline void time_line(const std::string& label, double ms) { std::printf("TIME %-44s %9.4f ms\n", label.c_str(), ms); }

/// Exit status of a driver: 1 iff a check failed.
inline int finish() {
  std::printf("%s (%d failed checks)\n", failures() ? "FAIL" : "PASS", failures());
  return failures() ? 1 : 0;
}

}  // namespace megatron::dev
