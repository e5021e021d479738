#include "megatron/training/training_log.h"

#include <cmath>
#include <cstdio>
#include <ctime>

#include "megatron/core/utils/errors.h"

namespace megatron::training {

namespace {
std::string nonfinite(double v, bool upper) {
  if (std::isnan(v)) return upper ? "NAN" : "nan";
  if (v > 0) return upper ? "INF" : "inf";
  return upper ? "-INF" : "-inf";
}
}  // namespace

std::string py_fixed(double v, int decimals) {
  if (!std::isfinite(v)) return nonfinite(v, false);
  char buf[512];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

std::string py_sci(double v, int decimals) {
  if (!std::isfinite(v)) return nonfinite(v, true);
  char buf[128];
  std::snprintf(buf, sizeof(buf), "%.*E", decimals, v);
  return buf;
}

std::string format_log_timestamp(std::chrono::system_clock::time_point t) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  std::time_t secs = static_cast<std::time_t>(us / 1000000);
  long frac = static_cast<long>(us % 1000000);
  if (frac < 0) {
    frac += 1000000;
    secs -= 1;
  }
  std::tm tm{};
  localtime_r(&secs, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  char out[80];
  std::snprintf(out, sizeof(out), "%s.%06ld", buf, frac);
  return out;
}

std::string format_training_log_line(const TrainingLogFields& f) {
  std::string s = " [" + f.timestamp + "]";
  char buf[256];
  std::snprintf(buf, sizeof(buf), " iteration %8lld/%8lld |", static_cast<long long>(f.iteration),
                static_cast<long long>(f.train_iters));
  s += buf;
  std::snprintf(buf, sizeof(buf), " consumed samples: %12lld |", static_cast<long long>(f.consumed_samples));
  s += buf;
  if (f.skipped_samples > 0) {
    std::snprintf(buf, sizeof(buf), " skipped samples: %12lld |", static_cast<long long>(f.skipped_samples));
    s += buf;
  }
  s += " elapsed time per iteration (ms): " + py_fixed(f.elapsed_ms_per_iteration, 1) + " |";
  if (f.throughput_tflops) s += " throughput per GPU (TFLOP/s/GPU): " + py_fixed(*f.throughput_tflops, 1) + " |";
  if (f.learning_rate) s += " learning rate: " + py_sci(*f.learning_rate, 6) + " |";
  std::snprintf(buf, sizeof(buf), " global batch size: %5lld |", static_cast<long long>(f.global_batch_size));
  s += buf;
  for (const auto& [key, avg] : f.losses) {
    if (avg > 0.0) s += " " + key + ": " + py_sci(avg, 6) + " |";  // Megatron: `if avg > 0.0`
  }
  s += " loss scale: " + py_fixed(f.loss_scale, 1) + " |";
  if (f.grad_norm) s += " grad norm: " + py_fixed(*f.grad_norm, 3) + " |";
  if (f.num_zeros) s += " num zeros: " + std::to_string(*f.num_zeros) + " |";
  if (f.params_norm) s += " params norm: " + py_fixed(*f.params_norm, 3) + " |";
  std::snprintf(buf, sizeof(buf), " number of skipped iterations: %3lld |", static_cast<long long>(f.skipped_iterations));
  s += buf;
  std::snprintf(buf, sizeof(buf), " number of nan iterations: %3lld |", static_cast<long long>(f.nan_iterations));
  s += buf;
  return s;
}

std::vector<std::string> format_validation_lines(const std::string& prefix, const std::string& suffix,
                                                 const std::vector<std::pair<std::string, double>>& losses) {
  std::string s = " validation" + suffix + " loss at " + prefix + " | ";
  for (const auto& [key, v] : losses) {
    s += key + " value: " + py_sci(v, 6) + " | ";
    s += key + " PPL: " + py_sci(std::exp(std::min(20.0, v)), 6) + " | ";
  }
  std::string dash(s.size() + 1, '-');
  return {dash, s, dash};
}

double num_floating_point_operations(const Arguments& a, int64_t batch_size) {
  MEGATRON_CHECK(a.num_layers && a.hidden_size && a.ffn_hidden_size && a.kv_channels && a.num_attention_heads &&
                 a.seq_length && a.padded_vocab_size > 0)
      << "validate_args and set_padded_vocab_size must run first";
  const double B = static_cast<double>(batch_size);
  const double s = static_cast<double>(*a.seq_length);
  const double h = static_cast<double>(*a.hidden_size);
  const double L = static_cast<double>(*a.num_layers);
  const double f = static_cast<double>(*a.ffn_hidden_size);
  const double q = static_cast<double>(*a.kv_channels) * static_cast<double>(*a.num_attention_heads);
  const double groups = a.group_query_attention ? static_cast<double>(a.num_query_groups)
                                                : static_cast<double>(*a.num_attention_heads);
  const double k = static_cast<double>(*a.kv_channels) * groups;
  const double Vp = static_cast<double>(a.padded_vocab_size);
  const double gate = a.swiglu ? 3.0 : 2.0;
  const double T = B * s;
  const double Q2 = B * s * s;
  // --mtp-num-layers D: D more transformer layers, their eh norms + final norm (3h) and eh_proj
  // (2h²), and D more logits (Megatron's num_floating_point_operations).
  const double D = static_cast<double>(a.mtp_num_layers.value_or(0));
  const double Lt = L + D;
  return T * (6.0 * h * f * gate * Lt + 6.0 * (h * (q + 2.0 * k) + q * h) * Lt + 6.0 * D * (3.0 * h + 2.0 * h * h) +
              6.0 * h * Vp * (D + 1.0)) +
         Q2 * 6.0 * q * Lt;
}

}  // namespace megatron::training
