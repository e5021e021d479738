#include "megatron/core/inference/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "megatron/core/utils/errors.h"

namespace megatron::inference {

int64_t clamp_sample(int64_t token, int64_t vocab, int64_t vocab_size) {
  const int64_t clamp_hi = std::max<int64_t>(0, (vocab_size > 0 ? std::min(vocab_size, vocab) : vocab) - 1);
  return std::clamp<int64_t>(token, 0, clamp_hi);
}

int64_t sample_row(const float* logits, int64_t vocab, int64_t top_k, double top_p, double temperature,
                   int64_t vocab_size, double u) {
  const int64_t clamp_hi = clamp_sample(vocab, vocab, vocab_size);
  if (top_k == 1) {
    if (top_p != 0.0) user_error("sample: cannot set both greedy and top-p samplings.");
    const int64_t best = std::max_element(logits, logits + vocab) - logits;  // first maximum, as torch.argmax
    return std::min(best, clamp_hi);
  }
  if (!(temperature > 0.0)) user_error("sample: temperature must be positive, got ", temperature);
  if (top_k > 1 && top_p > 0.0) user_error("sample: cannot set both top-k and top-p samplings.");
  if (top_k > vocab || (vocab_size > 0 && top_k > 1 && top_k >= vocab_size))
    user_error("sample: top-k ", top_k, " is larger than the vocabulary");
  if (top_p > 1.0) user_error("sample: top-p should be in (0, 1], got ", top_p);
  const double ninf = -std::numeric_limits<double>::infinity();
  // (logit - max) / T: the softmax is the same as of logit / T, but a tiny T (1e-320) gives 0 for
  // the maximum and -inf for the rest (greedy) instead of inf - inf = NaN.
  const double lmax = *std::max_element(logits, logits + vocab);
  std::vector<double> x(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) x[i] = (static_cast<double>(logits[i]) - lmax) / temperature;
  if (top_k > 1) {
    std::vector<double> sorted(x);
    std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<double>());
    const double kth = sorted[top_k - 1];
    for (double& v : x)
      if (v < kth) v = ninf;
  } else if (top_p > 0.0) {
    std::vector<int64_t> order(static_cast<size_t>(vocab));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return x[a] > x[b]; });
    const double m = x[order[0]];
    double z = 0.0;
    for (double v : x) z += std::exp(v - m);
    // filter_[i] = cumsum[i - 1] > top_p (shifted by one), filter_[0] = 0.
    double cum = 0.0;
    bool drop = false;
    for (int64_t i = 0; i < vocab; ++i) {
      const int64_t t = order[i];
      const double p = std::exp(x[t] - m) / z;
      if (drop) x[t] = ninf;
      cum += p;
      if (cum > top_p) drop = true;
    }
  }
  const double m = *std::max_element(x.begin(), x.end());
  double z = 0.0;
  for (double& v : x) {
    v = v == ninf ? 0.0 : std::exp(v - m);
    z += v;
  }
  const double target = u * z;
  double cum = 0.0;
  int64_t pick = -1, last_nonzero = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (x[i] > 0.0) last_nonzero = i;
    cum += x[i];
    if (cum > target && x[i] > 0.0) {
      pick = i;
      break;
    }
  }
  if (pick < 0) pick = last_nonzero;  // u * z rounded up to the total
  return std::min(pick, clamp_hi);
}

double log_prob_of(const float* logits, int64_t vocab, int64_t index) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < vocab; ++i) m = std::max(m, static_cast<double>(logits[i]));
  double z = 0.0;
  for (int64_t i = 0; i < vocab; ++i) z += std::exp(static_cast<double>(logits[i]) - m);
  return static_cast<double>(logits[index]) - m - std::log(z);
}

}  // namespace megatron::inference
