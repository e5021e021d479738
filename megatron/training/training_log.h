// Megatron's console lines: the training log line, the validation block, the timestamp, and the
// FLOPs formula behind "throughput per GPU" (megatron/training/training.py training_log,
// evaluate_and_print_results, num_floating_point_operations; reference/megatron.md §5).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "megatron/training/arguments.h"

namespace megatron::training {

/// "YYYY-MM-DD HH:MM:SS.ffffff" in local time (Python's datetime.now().strftime('%Y-%m-%d %H:%M:%S.%f')).
std::string format_log_timestamp(std::chrono::system_clock::time_point t);

/// The fields of one training log line, in print order. std::nullopt = field not printed.
struct TrainingLogFields {
  std::string timestamp;                      // format_log_timestamp(now)
  int64_t iteration = 0;
  int64_t train_iters = 0;
  int64_t consumed_samples = 0;
  int64_t skipped_samples = 0;                // printed only if > 0
  double elapsed_ms_per_iteration = 0.0;
  std::optional<double> throughput_tflops;    // --log-throughput
  std::optional<double> learning_rate;
  int64_t global_batch_size = 0;
  std::vector<std::pair<std::string, double>> losses;  // printed when >= 0 ("lm loss")
  double loss_scale = 1.0;
  std::optional<double> grad_norm;
  std::optional<int64_t> num_zeros;           // --log-num-zeros-in-grad
  std::optional<double> params_norm;          // --log-params-norm
  int64_t skipped_iterations = 0;
  int64_t nan_iterations = 0;
};

/// Megatron's training line (leading space, every field ending in " |"), e.g.
/// " [2026-08-22 10:00:00.123456] iteration      100/    1000 | consumed samples: ... |".
std::string format_training_log_line(const TrainingLogFields& f);

/// The three validation lines: a dash line of len(s)+1, s, the dash line again, where
/// s = " validation{suffix} loss at {prefix} | {key} value: {v:.6E} | {key} PPL: {exp(min(20,v)):.6E} | ".
std::vector<std::string> format_validation_lines(const std::string& prefix, const std::string& suffix,
                                                 const std::vector<std::pair<std::string, double>>& losses);

/// Model FLOPs of one global batch of `batch_size` sequences (§5.3, causal-halved attention):
/// T·[6·h·f·gate·L + 6·(h·(q+2k) + q·h)·L + 6·h·Vp] + B·s²·6·q·L; with --mtp-num-layers D,
/// L -> L + D, + T·6·D·(3h + 2h²) (MTP norms and eh_proj) and Vp counted D + 1 times. Needs validated args and
/// padded_vocab_size.
double num_floating_point_operations(const Arguments& args, int64_t batch_size);

/// Python's '{:.Nf}' / '{:.NE}' for a double (nan/inf spelled as Python does).
std::string py_fixed(double v, int decimals);
std::string py_sci(double v, int decimals);

}  // namespace megatron::training
