// Megatron's console lines: the training log line, the validation block, the timestamp, and the
// FLOPs formula behind "throughput per GPU" (megatron/training/training.py training_log,
// evaluate_and_print_results, num_floating_point_operations; docs/megatron-reference.md#training-log-line).
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

/// The number of MoE layers Megatron's training_log (the MoE metrics' average) and its FLOPs
/// formula count: the decoder layers --moe-layer-freq makes MoE (all of them when it gives no
/// pattern) plus the --mtp-num-layers D MTP layers when the last decoder layer is MoE (Megatron's
/// mtp_moe_layers / last_layer_is_moe). Needs validated args with --num-experts.
int64_t num_moe_layers_with_mtp(const Arguments& args);

/// Model FLOPs of one global batch of `batch_size` sequences (docs/megatron-reference.md#flops, causal-halved attention):
/// T·[6·h·f·gate·L + 6·(h·(q+2k) + q·h)·L + 6·h·Vp] + B·s²·6·q·L; with --mtp-num-layers D,
/// L -> L + D, + T·6·D·(3h + 2h²) (MTP norms and eh_proj) and Vp counted D + 1 times. Needs validated args and
/// padded_vocab_size.
double num_floating_point_operations(const Arguments& args, int64_t batch_size);

/// One timer's (min, max) over the ranks that measured it (Megatron's Timers
/// _get_global_min_max_time): name, min, max in the unit of `times` divided by `normalizer`.
struct TimerMinMax {
  std::string name;
  double min = 0.0, max = 0.0;
};
/// `times`: world_size x names.size() values, row-major (rank r's at [r * n, (r + 1) * n)), as
/// Timers::elapsed_seconds gathered over all ranks. Per name the min and max of the values > 0,
/// divided by `normalizer` (> 0); names with no value > 0 on any rank are left out.
std::vector<TimerMinMax> timers_min_max(const std::vector<std::string>& names, const std::vector<double>& times,
                                        int64_t world_size, double normalizer);
/// Megatron's Timers.get_all_timers_string for `option` (--timing-log-option): "minmax"
/// "(min, max) time across ranks (ms):" then "\n    <name + ' ' padded with '.' to 48>: (min, max)";
/// "max" "max time across ranks (ms):" then "\n    <name ...>: max"; "all" "times across ranks
/// (ms):" then per timer "\n  <name>:" and "\n     rank <r:2d>: <t>" for each rank with t > 0.
/// Values '{:.2f}' of times (seconds) * 1000 / normalizer. "" when no timer has a value > 0.
/// Throws UserError for another option.
std::string format_timers_string(const std::vector<std::string>& names, const std::vector<double>& times,
                                 int64_t world_size, double normalizer, const std::string& option);

/// One line of Megatron's progress.txt (megatron/training/utils append_to_progress_log):
/// "<YYYY-MM-DD HH:MM:SS>\tJob ID: <job_id>\t# GPUs: <world_size>\t<text>" (no newline).
std::string format_progress_line(std::chrono::system_clock::time_point t, const std::string& job_id,
                                 int64_t world_size, const std::string& text);
/// The text of the progress line after a checkpoint save (Megatron's
/// compute_throughputs_and_append_to_progress_log): "Saved checkpoint" (or "Saving async
/// checkpoint")"\tIteration: N\tJob throughput: X TFLOP/s/GPU\tCumulative throughput: Y
/// TFLOP/s/GPU\tFloating-point operations: F (%.2e)\tTokens (in billions): T (%.2f)".
std::string format_progress_checkpoint_text(bool async_save, int64_t iteration, double job_throughput,
                                            double cumulative_throughput, double flops_so_far,
                                            double tokens_so_far);
/// Megatron's get_start_time_from_progress_log over the lines of progress.txt: the time of the
/// first "Starting job" line after the last change of "# GPUs" to `world_size`, and the FLOPs of
/// the latest "Saved checkpoint" (or committed "Saving async checkpoint") before it. nullopt
/// when there is no such "Starting job" line (Megatron asserts).
struct ProgressStart {
  std::chrono::system_clock::time_point time;
  double flops = 0.0;
};
std::optional<ProgressStart> progress_start(const std::vector<std::string>& lines, int64_t world_size);

/// Python's '{:.Nf}' / '{:.NE}' for a double (nan/inf spelled as Python does).
std::string py_fixed(double v, int decimals);
std::string py_sci(double v, int decimals);

}  // namespace megatron::training
