// Megatron's pretraining loop (megatron/training/training.py: pretrain, train, train_step,
// training_log, evaluate_and_print_results, checkpoint_and_decide_exit) for a model that
// implements TrainableModel. No pipelining here: every micro-batch runs forward then backward
// (Megatron's forward_backward_no_pipelining).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "megatron/core/datasets/gpt_batch.h"
#include "megatron/core/optimizer/optimizer.h"
#include "megatron/core/optimizer_param_scheduler.h"
#include "megatron/core/tensor/memory_stats.h"
#include "megatron/core/timers.h"
#include "megatron/training/arguments.h"

namespace megatron::training {

/// One multi-token-prediction module's metrics of a train step (Megatron's MTPLossLoggingHelper
/// tracker after reduce_metrics_in_tracker): `loss` = Σ over the step's micro-batches of the
/// module's masked mean loss, averaged over the data-parallel (× context-parallel) ranks;
/// `correct` / `total` = positions whose label is the argmax of the module's logits / positions
/// with a nonzero rolled loss mask, summed over those ranks.
struct MtpStepMetrics {
  double loss = 0.0, correct = 0.0, total = 0.0;
};

/// What the loop needs from a model (GPTModel is adapted to this in pretrain_gpt.cpp).
class TrainableModel {
 public:
  virtual ~TrainableModel() = default;
  /// Per-token loss, float32 [b, s] (unmasked; the loop applies loss_mask).
  virtual Tensor forward(const datasets::GPTBatch& batch, bool training) = 0;
  /// Backward of the last training forward: dloss float32 [b, s]; accumulates into the params'
  /// main grads.
  virtual void backward(const Tensor& dloss) = 0;
  /// The parameters as the optimizer sees them (their main grads are what backward fills).
  virtual std::vector<optimizer::OptimizerParam> optimizer_params() = 0;
  /// Multi-token prediction: Megatron's MTPLossAutoScaler.set_loss_scale, called before each
  /// backward with the main loss's backward scale. No-op for models without MTP.
  virtual void set_mtp_loss_scale(double /*scale*/) {}
  /// Multi-token prediction: this step's metrics per module (collective over the data-parallel
  /// group on models with MTP), called once per train step after its last backward. Empty
  /// without MTP.
  virtual std::vector<MtpStepMetrics> take_mtp_metrics() { return {}; }
};

/// Yields the next micro-batch; std::nullopt when the data is exhausted.
using BatchIterator = std::function<std::optional<datasets::GPTBatch>()>;

/// Per-microbatch reduced loss: Σ(loss·mask) and Σ(mask) (docs/megatron-reference.md#loss-normalisation).
struct LossReport {
  double loss_sum = 0.0;
  double num_tokens = 0.0;
};

/// Σ(loss·mask) and Σ(mask) of one micro-batch (Megatron's pretrain_gpt.py loss_func), in fp64.
/// loss, mask: float32 of the same number of elements ([b, s]), on any device (copied to the host).
/// Throws (internal check) on a dtype or size mismatch.
LossReport masked_loss_report(const Tensor& loss, const Tensor& mask);
/// Σ(mask) of a float32 host mask in fp64 (the num_tokens of masked_loss_report without touching
/// the loss, so a device loss need not be copied before the backward is enqueued).
double mask_token_count(const Tensor& mask);

/// Optional integrations (TensorBoard writer, checkpoint save, data parallelism) called by the loop.
struct TrainingHooks {
  /// TensorBoard scalar: (tag, value, step). Called every --tensorboard-log-interval, except the
  /// MTP tags ("mtp_<k> loss", "mtp_<k>_acceptance_rate", "mtp_<k>_cumulative_acceptance_rate"),
  /// which Megatron's track_mtp_metrics writes every iteration.
  std::function<void(const std::string&, double, int64_t)> add_scalar;
  /// Flush pending TensorBoard events.
  std::function<void()> flush;
  /// Save a checkpoint at this iteration (--save / --save-interval / exit paths).
  std::function<void(int64_t iteration)> save_checkpoint;

  // Data parallelism (pretrain_gpt.cpp wires these to DistributedDataParallel; unset = one rank).
  /// Zeros the model's whole gradient buffer at the start of train_step (replaces
  /// optimizer.zero_grad(), which with the distributed optimizer only sees this rank's slices).
  std::function<void()> zero_grad;
  /// Megatron's finalize_model_grads after the last backward of train_step; `num_tokens` is this
  /// rank's Σ(loss_mask). With --calculate-per-token-loss the hook sums it over DP and scales the
  /// grads by 1/total (the loop then does not scale them itself).
  std::function<void(double num_tokens)> finalize_model_grads;
  /// Context parallelism: the token count a micro-batch's loss is normalised by, given this
  /// rank's Σ(loss_mask) (unset = max(that count, 1)). pretrain_gpt returns max(Σ(loss_mask) summed
  /// over the CP group, 1) / CP: the sequence's tokens are spread over the CP ranks and the DDP
  /// averages grads over DP×CP, so each CP rank's share carries a factor CP (docs/megatron-reference.md#loss-normalisation).
  std::function<double(double num_tokens)> microbatch_loss_tokens;
  /// After optimizer.step(): the distributed optimizer's parameter all-gather.
  std::function<void()> after_optimizer_step;
  /// Sums {loss_sum, num_tokens} over the data-parallel group, in place (Megatron's loss_func
  /// all-reduce of the reporting loss): training log and evaluation.
  std::function<void(LossReport&)> reduce_loss;
  /// True on every rank when `flag` is true on any rank (all-reduce MAX over all ranks): the
  /// SIGTERM and --exit-duration-in-mins exit decisions (Megatron's DistributedSignalHandler and
  /// its all-reduce of the time check), so all ranks save and stop at the same iteration.
  std::function<bool(bool flag)> any_rank;
  /// Pipeline parallelism (Megatron's forward_backward_func): runs one global batch's
  /// num_microbatches micro-batches read from `data` through the pipeline schedule, forward
  /// only when `forward_only` (evaluation), seeding backward with `loss_scale` and the docs/megatron-reference.md#loss-normalisation
  /// normalisation. Returns this rank's Σ(loss·mask), Σ(mask) (zero on ranks without the
  /// loss stage), or nullopt when `data` ran out. Unset = the loop runs the model itself.
  std::function<std::optional<LossReport>(BatchIterator& data, bool forward_only, double loss_scale)> forward_backward;
  /// Megatron's report_memory(name) after the first logged iterations: called on EVERY rank
  /// (Megatron prints on data-parallel rank 0 of each model-parallel rank, "[Rank r] ...").
  /// Unset = memory_report(name, rank) through the loop's printer (last rank).
  std::function<void(const std::string& name)> report_memory;
  /// --profile window on this rank (--profile-ranks): profile_start(first) runs before iteration
  /// `first` (= --profile-step-start + 1, 1-based) and profile_stop(last) after iteration `last`
  /// (= --profile-step-end) and its log line. pretrain_gpt drives the GPU kernel profiler with
  /// them (megatron/core/utils/kernel_profile.h). Unset = nothing.
  std::function<void(int64_t first_iteration)> profile_start;
  std::function<void(int64_t last_iteration)> profile_stop;
  /// A barrier over all ranks (Megatron's torch.distributed.barrier()): before the level-1
  /// timers with --barrier-with-level-1-timing (the default; --no-barrier-with-level-1-timing
  /// turns it off) and before a --log-progress line. Unset = one rank.
  std::function<void()> barrier;
  /// All-gather over all ranks of this rank's timer values (Megatron's Timers
  /// _get_elapsed_time_all_ranks): returns world_size x local.size() values, row-major (rank r's
  /// values at [r * n, (r + 1) * n)). Feeds the "(min, max) time across ranks" block and the
  /// --log-timers-to-tensorboard "<name>-time" scalars (max over ranks). Unset = one rank.
  std::function<std::vector<double>(const std::vector<double>& local)> all_gather_times;
  /// This rank's tensor memory statistics for --log-memory-to-tensorboard (the training device:
  /// memory_stats(kCUDA, index) on a GPU). Unset = memory_stats(kCPU).
  std::function<MemoryStats()> memory_stats;
};

/// Counters Megatron keeps in args (consumed_train_samples, ...) and the loop's position.
struct TrainCounters {
  int64_t iteration = 0;
  int64_t consumed_train_samples = 0;
  int64_t skipped_train_samples = 0;
  int64_t consumed_valid_samples = 0;
  double floating_point_operations_so_far = 0.0;
};

/// Result of one train_step.
struct TrainStepResult {
  LossReport lm_loss;  // summed over micro-batches (and DP×CP)
  bool skipped = false;
  std::optional<double> grad_norm;
  std::optional<int64_t> num_zeros_in_grad;
  /// --log-params-norm: the L2 norm of all parameters, computed on EVERY rank after the step
  /// (a collective over the model-parallel / data-parallel groups; Megatron's
  /// calc_params_l2_norm in train(), before training_log).
  std::optional<double> params_norm;
  std::vector<MtpStepMetrics> mtp;  // per MTP module (--mtp-num-layers)
};

/// The training run: owns timers and counters, prints Megatron's lines through `print`.
class Trainer {
 public:
  /// `args` must be validated and have padded_vocab_size. `print` receives whole lines (no
  /// newline); default prints to stdout and flushes.
  Trainer(const Arguments& args, TrainableModel& model, optimizer::MegatronOptimizer& optimizer,
          OptimizerParamScheduler& scheduler, TrainingHooks hooks = {},
          std::function<void(const std::string&)> print = nullptr);

  /// One iteration: zero grads; forward/backward of num_microbatches micro-batches with docs/megatron-reference.md#loss-normalisation
  /// loss normalisation; per-token grad scaling; optimizer step; scheduler step on success.
  /// Throws UserError when the data runs out, and (--check-for-nan-in-loss-and-grad) on a NaN or
  /// Inf local loss with Megatron's wording (rerun_state_machine.validate_result, reruns
  /// disabled): "Rank R, node N, device D, iteration I: Unexpected result nan (message='found
  /// NaN in local forward loss calculation')". A diverged run is the user's, not a bug: exit 1.
  TrainStepResult train_step(BatchIterator& train_data);

  /// Megatron's evaluate(): eval_iters global batches, token-weighted lm loss Σloss·mask / Σmask.
  /// Returns nullopt when the iterator ran out before any batch.
  std::optional<double> evaluate(BatchIterator& data);
  /// evaluate() + the validation block (prefix e.g. "iteration 100", "iteration 40 on test set")
  /// and, when `write_to_tensorboard`, the scalars "lm loss validation" and "lm loss validation vs
  /// samples" (+ " ppl" with --log-validation-ppl-to-tensorboard) at the current iteration: the
  /// test set writes the same tags as the validation set (Megatron's evaluate_and_print_results
  /// has one set of tags; pretrain() passes write_to_tensorboard = not --skip-train for the final
  /// validation and test evaluations). Collective (the loss all-reduce): call on every rank.
  void evaluate_and_print_results(const std::string& prefix, BatchIterator& data, bool is_test = false,
                                  bool write_to_tensorboard = true);

  /// Megatron's train(): runs until train_iters, an exit condition, or SIGTERM (with
  /// --exit-signal-handler); logs, evaluates every --eval-interval, saves every --save-interval,
  /// profiles --profile-step-start..end. Returns true when it stopped on an exit condition
  /// (--exit-interval/--exit-duration-in-mins/signal), in which case pretrain skips the final
  /// evaluation, as Megatron's sys.exit does.
  bool train(BatchIterator& train_data, BatchIterator* valid_data);

  /// Megatron's pretrain() after setup: train (unless --skip-train), then the final
  /// "on validation set" / "on test set" evaluations.
  void pretrain(BatchIterator& train_data, BatchIterator* valid_data, BatchIterator* test_data);

  TrainCounters& state() { return state_; }
  Timers& timers() { return timers_; }
  int64_t train_iters() const { return train_iters_; }
  /// Wall-clock start used by --exit-duration-in-mins (Megatron's _TRAIN_START_TIME); tests may
  /// move it back.
  void set_start_time(std::chrono::steady_clock::time_point t) { start_time_ = t; }

 private:
  /// Called on EVERY rank (it runs collectives: the timers' all-gather); only the writes
  /// (printer, TensorBoard hook) are rank-conditional. No collective may be reached from a
  /// rank-conditional branch (docs/training.md, "Collectives and rank-conditional code").
  /// first_iteration: the run's first iteration (the first after a --load too); it is printed
  /// whatever --log-interval says and, as Megatron's should_reset = not is_first_iteration, does
  /// not clear the interval's accumulators (the next line averages over both).
  void training_log(const TrainStepResult& r, bool first_iteration);
  /// MoE: Megatron's get_moe_metrics_tracker().report every iteration (all ranks: it all-reduces):
  /// TensorBoard scalars load_balancing_loss / seq_load_balancing_loss / global_load_balancing_loss /
  /// z_loss and their sums for the iteration line (moe_loss_sums_).
  void report_moe_metrics(int64_t iteration);
  bool checkpoint_and_decide_exit();
  /// save_checkpoint hook + Megatron's compute_throughputs_and_append_to_progress_log.
  void save_checkpoint_and_time(int64_t iteration);
  /// Megatron's append_to_progress_log: barrier, then rank 0 appends "<time>\tJob ID: <SLURM_JOB_ID>\t#
  /// GPUs: <world size>\t<text>" to <--save>/progress.txt. No-op without --save or --log-progress.
  void append_to_progress_log(const std::string& text);
  /// "(min, max) time across ranks (ms):" block (all ranks' values; every rank must call it) and,
  /// with --log-timers-to-tensorboard, the "<name>-time" scalars (max over ranks, seconds per
  /// iteration) through add_scalar. reset=false (the run's first log line, Megatron's
  /// should_reset) keeps the timers' accumulated times for the next line.
  std::string timers_log_and_write(const std::vector<std::string>& names, int64_t iteration, bool write, bool reset);
  void print(const std::string& s) { print_(s); }

  const Arguments& args_;
  TrainableModel& model_;
  optimizer::MegatronOptimizer& optimizer_;
  OptimizerParamScheduler& scheduler_;
  TrainingHooks hooks_;
  std::function<void(const std::string&)> print_;
  Timers timers_;
  TrainCounters state_;
  int64_t train_iters_ = 0;
  int64_t num_microbatches_ = 1;
  std::chrono::steady_clock::time_point start_time_;
  // Interval accumulators (Megatron's total_loss_dict).
  double interval_loss_sum_ = 0.0;
  /// MoE losses (Megatron's track_moe_metrics names) summed since the last log line, in the
  /// order they were first reported.
  std::vector<std::pair<std::string, double>> moe_loss_sums_;
  // Per MTP module: the interval's Σ of "mtp_<k> loss" values, and the run's cumulative
  // acceptance counts (Megatron keeps them per process; they restart with the process).
  std::vector<double> interval_mtp_loss_, mtp_cumulative_correct_, mtp_cumulative_total_;
  int64_t advanced_iters_ = 0, skipped_iters_ = 0, nan_iters_ = 0, interval_iters_ = 0;
  bool memory_reported_ = false;
  // --log-progress: the FLOPs count and wall-clock time at the start of this job (Megatron's
  // args.num_floating_point_operations_so_far at load time and _TRAIN_START_TIME).
  double job_start_flops_ = 0.0;
  std::chrono::system_clock::time_point job_start_wall_;
};

/// Installs a SIGTERM handler that only sets a flag (Megatron's --exit-signal-handler).
void install_exit_signal_handler();
/// True once SIGTERM was received after install_exit_signal_handler().
bool exit_signal_received();

/// Megatron's report_memory line "[Rank r] <name> memory (MB) | ...". On a GPU (`cuda_device`
/// >= 0) Megatron's fields from our tensor allocator and the device's stream-ordered pool
/// (megatron/core/tensor/memory_stats.h): "| allocated: A | max allocated: M | reserved: R |
/// max reserved: X" in MiB with 2 decimals (torch.cuda.memory_allocated & co.). On the CPU
/// (`cuda_device` < 0) the process's resident set size and its peak from /proc/self/status:
/// "| resident: A | max resident: M".
std::string memory_report(const std::string& name, int rank, int cuda_device = -1);

}  // namespace megatron::training
