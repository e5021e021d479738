// Check helpers shared by the host emulations of the norm kernels (norm_pipe_emu.cpp,
// norm_rowblk_emu.cpp): a failure counter, PASS/FAIL lines, bitwise and relative-norm-error
// comparisons. Include after cuda_host_shim.h (to_f).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

/// Number of failed checks so far; main() returns fails != 0.
inline int fails = 0;

/// Prints "PASS nm" or "FAIL nm" and counts a failure.
inline void report(const std::string& nm, bool ok) {
  fails += !ok;
  std::printf("%s %s\n", ok ? "PASS" : "FAIL", nm.c_str());
}

/// True iff a and b have the same size and bytes.
template <class T>
bool same(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

/// Relative norm error ||got - ref|| / ||ref|| within tol (a NaN, infinity or a size mismatch
/// fails); prints the error and counts a failure.
template <class T>
void near(const std::string& nm, const std::vector<T>& got, const std::vector<double>& ref, double tol) {
  double num = 0, den = 0;
  bool fin = got.size() == ref.size();
  for (size_t i = 0; fin && i < got.size(); ++i) {
    const double g = to_f(got[i]);
    if (!std::isfinite(g)) fin = false;
    num += (g - ref[i]) * (g - ref[i]);
    den += ref[i] * ref[i];
  }
  const double e = std::sqrt(num / std::max(den, 1e-300));
  const bool ok = fin && e <= tol;
  fails += !ok;
  std::printf("%s %-78s rel err %.2e (tol %.0e)\n", ok ? "PASS" : "FAIL", nm.c_str(), e, tol);
}
