#include "megatron/training/training_log.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
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
    if (avg >= 0.0) s += " " + key + ": " + py_sci(avg, 6) + " |";  // Megatron: `if avg >= 0.0` (training.py)
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

std::vector<TimerMinMax> timers_min_max(const std::vector<std::string>& names, const std::vector<double>& times,
                                        int64_t world_size, double normalizer) {
  const size_t n = names.size();
  MEGATRON_CHECK(normalizer > 0.0 && world_size >= 1 && times.size() == n * static_cast<size_t>(world_size))
      << "timers: " << times.size() << " values for " << n << " names x " << world_size << " ranks";
  std::vector<TimerMinMax> out;
  for (size_t i = 0; i < n; ++i) {
    bool any = false;
    double lo = 0.0, hi = 0.0;
    for (int64_t r = 0; r < world_size; ++r) {
      const double t = times[static_cast<size_t>(r) * n + i];
      if (!(t > 0.0)) continue;
      lo = any ? std::min(lo, t) : t;
      hi = any ? std::max(hi, t) : t;
      any = true;
    }
    if (any) out.push_back({names[i], lo / normalizer, hi / normalizer});
  }
  return out;
}

std::string format_timers_string(const std::vector<std::string>& names, const std::vector<double>& times,
                                 int64_t world_size, double normalizer, const std::string& option) {
  char buf[256];
  auto label = [](const std::string& name) {
    std::string l = name + " ";
    if (l.size() < 48) l.resize(48, '.');
    return l;
  };
  if (option == "max" || option == "minmax") {
    const std::vector<TimerMinMax> mm = timers_min_max(names, times, world_size, normalizer / 1000.0);
    if (mm.empty()) return "";
    std::string out = option == "max" ? "max time across ranks (ms):" : "(min, max) time across ranks (ms):";
    for (const auto& t : mm) {
      if (option == "max")
        std::snprintf(buf, sizeof(buf), "\n    %s: %.2f", label(t.name).c_str(), t.max);
      else
        std::snprintf(buf, sizeof(buf), "\n    %s: (%.2f, %.2f)", label(t.name).c_str(), t.min, t.max);
      out += buf;
    }
    return out;
  }
  if (option != "all") user_error("--timing-log-option ", option, ": unknown timing log option (choose from max, minmax, all)");
  const size_t n = names.size();
  MEGATRON_CHECK(normalizer > 0.0 && times.size() == n * static_cast<size_t>(world_size)) << "timers: bad shape";
  std::string out = "times across ranks (ms):";
  bool any = false;
  for (size_t i = 0; i < n; ++i) {
    bool found = false;
    for (int64_t r = 0; r < world_size; ++r) {
      const double t = times[static_cast<size_t>(r) * n + i];
      if (!(t > 0.0)) continue;
      if (!found) out += "\n  " + names[i] + ":";
      found = any = true;
      std::snprintf(buf, sizeof(buf), "\n     rank %2lld: %.2f", static_cast<long long>(r), t * 1000.0 / normalizer);
      out += buf;
    }
  }
  return any ? out : std::string();
}

std::string format_progress_line(std::chrono::system_clock::time_point t, const std::string& job_id,
                                 int64_t world_size, const std::string& text) {
  const std::string ts = format_log_timestamp(t);
  return ts.substr(0, ts.find('.')) + "\tJob ID: " + job_id + "\t# GPUs: " + std::to_string(world_size) + "\t" + text;
}

std::string format_progress_checkpoint_text(bool async_save, int64_t iteration, double job_throughput,
                                            double cumulative_throughput, double flops_so_far,
                                            double tokens_so_far) {
  char flops[64];
  std::snprintf(flops, sizeof(flops), "%.2e", flops_so_far);
  return std::string(async_save ? "Saving async checkpoint" : "Saved checkpoint") + "\tIteration: " +
         std::to_string(iteration) + "\tJob throughput: " + py_fixed(job_throughput, 1) +
         " TFLOP/s/GPU\tCumulative throughput: " + py_fixed(cumulative_throughput, 1) +
         " TFLOP/s/GPU\tFloating-point operations: " + flops + "\tTokens (in billions): " +
         py_fixed(tokens_so_far / 1e9, 2);
}

std::optional<ProgressStart> progress_start(const std::vector<std::string>& lines, int64_t world_size) {
  auto split = [](const std::string& line) {
    std::vector<std::string> tok;
    size_t a = 0;
    while (true) {
      const size_t b = line.find('\t', a);
      tok.push_back(line.substr(a, b == std::string::npos ? std::string::npos : b - a));
      if (b == std::string::npos) break;
      a = b + 1;
    }
    return tok;
  };
  auto field = [](const std::string& t) -> std::optional<double> {  // "Name: value"
    const size_t c = t.find(": ");
    if (c == std::string::npos) return std::nullopt;
    char* end = nullptr;
    const std::string v = t.substr(c + 2);
    const double d = std::strtod(v.c_str(), &end);
    if (v.empty() || end != v.c_str() + v.size()) return std::nullopt;
    return d;
  };
  std::optional<ProgressStart> start;
  double latest = 0.0, uncommitted = 0.0;
  bool has_uncommitted = false;
  for (std::string line : lines) {
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
    if (line.empty()) continue;
    const std::vector<std::string> tok = split(line);
    if (tok.size() < 4) continue;  // not a progress line
    const std::optional<double> ws = field(tok[2]);
    if (tok[3] == "Saved checkpoint" && tok.size() > 7) {
      if (auto f = field(tok[7])) latest = *f;
    } else if (tok[3] == "Saving async checkpoint" && tok.size() > 7) {
      const std::optional<double> f = field(tok[7]);
      has_uncommitted = f.has_value();
      uncommitted = f.value_or(0.0);
    } else if (tok[3] == "Saved async checkpoint" && has_uncommitted) {
      latest = uncommitted;
      has_uncommitted = false;
    }
    if (!ws || static_cast<int64_t>(*ws) != world_size) {
      start.reset();
      continue;
    }
    if (tok[3] == "Starting job" && !start) {
      std::tm tm{};
      if (strptime(tok[0].c_str(), "%Y-%m-%d %H:%M:%S", &tm) == nullptr) continue;
      tm.tm_isdst = -1;
      start = ProgressStart{std::chrono::system_clock::from_time_t(std::mktime(&tm)), latest};
    }
  }
  return start;
}

int64_t num_moe_layers_with_mtp(const Arguments& a) {
  const int64_t D = a.mtp_num_layers.value_or(0);
  const auto& pat = a.moe_layer_pattern;
  if (pat.empty()) return *a.num_layers + D;
  return std::count(pat.begin(), pat.end(), 1) + (pat.back() ? D : 0);
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
  // MLP term: dense layers f * gate; MoE layers (Megatron's MoE branch) the top-k routed experts
  // (moe_ffn_hidden_size * topk * gate) plus the shared expert (its size * gate). The router GEMM
  // is not counted (as in Megatron).
  // --mtp-num-layers D: D more transformer layers (MoE layers when the last decoder layer is one,
  // Megatron's last_layer_is_moe), their eh norms + final norm (3h) and eh_proj (2h²), and D more
  // logits (Megatron's num_floating_point_operations).
  const double D = static_cast<double>(a.mtp_num_layers.value_or(0));
  const double Lt = L + D;
  double mlp = f * gate * Lt;
  if (a.num_experts) {
    const double n_moe = static_cast<double>(num_moe_layers_with_mtp(a));
    const double moe_f = static_cast<double>(a.moe_ffn_hidden_size.value_or(*a.ffn_hidden_size));
    const double shared = static_cast<double>(a.moe_shared_expert_intermediate_size.value_or(0));
    mlp = f * gate * (Lt - n_moe) + (moe_f * static_cast<double>(a.moe_router_topk) * gate + shared * gate) * n_moe;
  }
  return T * (6.0 * h * mlp + 6.0 * (h * (q + 2.0 * k) + q * h) * Lt + 6.0 * D * (3.0 * h + 2.0 * h * h) +
              6.0 * h * Vp * (D + 1.0)) +
         Q2 * 6.0 * q * Lt;
}

}  // namespace megatron::training
