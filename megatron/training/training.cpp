#include "megatron/core/transformer/moe/moe_utils.h"
#include "megatron/training/training.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <utility>
#include <vector>

#include <unistd.h>

#include "megatron/core/ops/device.h"
#include "megatron/core/parallel_state.h"
#include "megatron/core/tensor/memory_stats.h"
#include "megatron/core/utils/errors.h"
#include "megatron/training/training_log.h"
#include "megatron/core/utils/env.h"

namespace megatron::training {

namespace {
std::atomic<bool> g_sigterm{false};
extern "C" void on_sigterm(int) { g_sigterm.store(true); }

// Megatron's check_for_nan_in_loss_and_grad in loss_func: rerun_state_machine.validate_result
// with reruns disabled raises "Rank R, node N, device D, iteration I: Unexpected result <loss>
// (message='found NaN in local forward loss calculation')" (Inf: 'found Inf ...'). A NaN/Inf loss
// is the user's run diverging (learning rate, data, precision), not a bug here: a UserError.
void check_local_loss(double loss_sum, int64_t iteration, int64_t rank, const Device& device) {
  if (std::isfinite(loss_sum)) return;
  char host[256] = "unknown";
  if (gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "unknown");
  host[sizeof(host) - 1] = '\0';
  const std::string dev = device.is_cuda() ? std::to_string(device.index) : "cpu";
  const std::string value = std::isnan(loss_sum) ? "nan" : (loss_sum > 0 ? "inf" : "-inf");
  user_error("Rank ", rank, ", node ", host, ", device ", dev, ", iteration ", iteration, ": Unexpected result ", value,
             " (message='found ", std::isnan(loss_sum) ? "NaN" : "Inf",
             " in local forward loss calculation'): the training diverged (check --lr, the data and the precision "
             "flags), or pass --no-check-for-nan-in-loss-and-grad to train on");
}

}  // namespace

// Σ(loss·mask) and Σ(mask) of one micro-batch (pretrain_gpt.py loss_func), fp64 accumulation.
LossReport masked_loss_report(const Tensor& loss, const Tensor& mask) {
  MEGATRON_CHECK(loss.dtype() == DType::kFloat32 && mask.dtype() == DType::kFloat32 && loss.numel() == mask.numel())
      << "loss " << loss.str() << " mask " << mask.str();
  const Tensor l = loss.is_cpu() ? loss : loss.to(Device::cpu());
  const Tensor m = mask.is_cpu() ? mask : mask.to(Device::cpu());
  const float* lp = l.data<float>();
  const float* mp = m.data<float>();
  LossReport r;
  for (int64_t i = 0; i < l.numel(); ++i) {
    r.loss_sum += static_cast<double>(lp[i]) * static_cast<double>(mp[i]);
    r.num_tokens += static_cast<double>(mp[i]);
  }
  return r;
}

double mask_token_count(const Tensor& mask) {
  MEGATRON_CHECK(mask.dtype() == DType::kFloat32 && mask.is_cpu()) << "mask " << mask.str();
  const float* mp = mask.data<float>();
  double n = 0.0;
  for (int64_t i = 0; i < mask.numel(); ++i) n += static_cast<double>(mp[i]);
  return n;
}

void install_exit_signal_handler() { std::signal(SIGTERM, on_sigterm); }
bool exit_signal_received() { return g_sigterm.load(); }

std::string memory_report(const std::string& name, int rank, int cuda_device) {
  char buf[320];
  if (cuda_device >= 0) {
    const MemoryStats m = memory_stats(DeviceType::kCUDA, cuda_device);
    const double mb = 1024.0 * 1024.0;
    std::snprintf(buf, sizeof(buf),
                  "[Rank %d] %s memory (MB) | allocated: %.2f | max allocated: %.2f | reserved: %.2f | max reserved: "
                  "%.2f",
                  rank, name.c_str(), m.allocated / mb, m.max_allocated / mb, std::max<int64_t>(m.reserved, 0) / mb,
                  std::max<int64_t>(m.max_reserved, 0) / mb);
    return buf;
  }
  double rss_mb = 0.0, hwm_mb = 0.0;
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    long kb = 0;
    if (std::sscanf(line.c_str(), "VmRSS: %ld kB", &kb) == 1) rss_mb = kb / 1024.0;
    if (std::sscanf(line.c_str(), "VmHWM: %ld kB", &kb) == 1) hwm_mb = kb / 1024.0;
  }
  std::snprintf(buf, sizeof(buf), "[Rank %d] %s memory (MB) | resident: %.2f | max resident: %.2f", rank, name.c_str(),
                rss_mb, hwm_mb);
  return buf;
}

Trainer::Trainer(const Arguments& args, TrainableModel& model, optimizer::MegatronOptimizer& optimizer,
                 OptimizerParamScheduler& scheduler, TrainingHooks hooks,
                 std::function<void(const std::string&)> print)
    : args_(args),
      model_(model),
      optimizer_(optimizer),
      scheduler_(scheduler),
      hooks_(std::move(hooks)),
      print_(print ? std::move(print)
                   : std::function<void(const std::string&)>([](const std::string& s) {
                       std::fputs(s.c_str(), stdout);
                       std::fputc('\n', stdout);
                       std::fflush(stdout);
                     })),
      timers_(static_cast<int>(args.timing_log_level), args.timing_log_option),
      start_time_(std::chrono::steady_clock::now()) {
  MEGATRON_CHECK(args.global_batch_size && args.micro_batch_size) << "validate_args must run first";
  train_iters_ = args.train_iters ? *args.train_iters
                                  : (args.train_samples ? *args.train_samples / *args.global_batch_size : 0);
  num_microbatches_ = num_microbatches(args);
  optimizer_.apply_schedule(scheduler_);
}

TrainStepResult Trainer::train_step(BatchIterator& train_data) {
  TrainStepResult r;
  if (hooks_.zero_grad) {
    hooks_.zero_grad();
  } else {
    optimizer_.zero_grad();
  }
  const double loss_scale = optimizer_.get_loss_scale();
  // MoE: Megatron's MoEAuxLossAutoScaler.set_loss_scale (the aux losses' backward scale, as the
  // main loss's: loss_scale x CP / num_microbatches, or loss_scale with --calculate-per-token-loss).
  transformer::moe::MoEAuxLossAutoScaler::set_step_loss_scale(loss_scale, num_microbatches_,
                                                              args_.calculate_per_token_loss,
                                                              args_.context_parallel_size);
  std::vector<std::pair<Tensor, Tensor>> deferred;  // (device loss, host mask) per micro-batch
  // Where the parameters live (the NaN message names the device, as Megatron's).
  const Device device = optimizer_.params().empty() ? Device::cpu() : optimizer_.params().front().param.device();
  // Megatron starts the level-1 timers with barrier=args.barrier_with_L1_time: every rank runs
  // this (the condition is the same on all ranks).
  const bool l1_barrier = args_.timing_log_level >= 1 && args_.barrier_with_L1_time && hooks_.barrier;
  if (l1_barrier) hooks_.barrier();
  timers_("forward-backward", 1).start();
  if (hooks_.forward_backward) {
    std::optional<LossReport> rep = hooks_.forward_backward(train_data, /*forward_only=*/false, loss_scale);
    if (!rep) user_error("the training data ran out at iteration ", state_.iteration + 1,
                         "; use more data or fewer --train-iters/--train-samples");
    if (args_.check_for_nan_in_loss_and_grad) check_local_loss(rep->loss_sum, state_.iteration + 1, args_.rank, device);
    r.lm_loss = *rep;
  }
  for (int64_t mb = 0; mb < (hooks_.forward_backward ? 0 : num_microbatches_); ++mb) {
    timers_("batch-generator", 2).start();
    std::optional<datasets::GPTBatch> batch = train_data();
    timers_("batch-generator", 2).stop();
    if (!batch) user_error("the training data ran out at iteration ", state_.iteration + 1, " (micro-batch ", mb,
                           "); use more data or fewer --train-iters/--train-samples");
    timers_("forward-compute", 2).start();
    Tensor loss = model_.forward(*batch, /*training=*/true);
    timers_("forward-compute", 2).stop();
    // A device loss with a host mask: Σ(mask) now from the host mask (the backward seed needs
    // it), Σ(loss·mask) after the whole step's backward has been enqueued (one device-to-host
    // copy per micro-batch then, instead of a copy that drains the GPU between every forward
    // and backward). Same fp64 sums; the NaN check below runs once per step on the sums.
    const bool defer = !loss.is_cpu() && batch->loss_mask.is_cpu();
    LossReport rep;
    if (defer) {
      rep.num_tokens = mask_token_count(batch->loss_mask);
      deferred.push_back({loss, batch->loss_mask});
    } else {
      rep = masked_loss_report(loss, batch->loss_mask);
      if (args_.check_for_nan_in_loss_and_grad) check_local_loss(rep.loss_sum, state_.iteration + 1, args_.rank, loss.device());
    }
    // docs/megatron-reference.md#loss-normalisation: the backward seed of Σ(loss·mask)·c is mask·c.
    double c = loss_scale;
    if (!args_.calculate_per_token_loss) {
      const double n = hooks_.microbatch_loss_tokens ? hooks_.microbatch_loss_tokens(rep.num_tokens)
                                                     : std::max(rep.num_tokens, 1.0);
      c /= n * static_cast<double>(num_microbatches_);
    }
    Tensor dloss = batch->loss_mask.is_cpu() ? batch->loss_mask.clone() : batch->loss_mask.to(Device::cpu());
    {
      float* d = dloss.data<float>();
      const float cf = static_cast<float>(c);
      for (int64_t i = 0; i < dloss.numel(); ++i) d[i] *= cf;
    }
    timers_("backward-compute", 2).start();
    // schedules.py forward_step_calc_loss: the MTP loss scale follows the main loss's.
    model_.set_mtp_loss_scale(args_.calculate_per_token_loss ? loss_scale
                                                              : loss_scale / static_cast<double>(num_microbatches_));
    model_.backward(dloss);
    timers_("backward-compute", 2).stop();
    r.lm_loss.loss_sum += rep.loss_sum;
    r.lm_loss.num_tokens += rep.num_tokens;
  }
  for (const auto& [loss, mask] : deferred) {
    const double sum = masked_loss_report(loss, mask).loss_sum;
    if (args_.check_for_nan_in_loss_and_grad) check_local_loss(sum, state_.iteration + 1, args_.rank, loss.device());
    r.lm_loss.loss_sum += sum;
  }
  timers_("forward-backward", 1).stop();
  // The overlapped optimizer step of the previous iteration: every forward stage and the
  // backward waited for their part already (GPTModel's param-wait hook), so this queues nothing
  // on the hot path; it covers models whose forward has no such hook.
  optimizer_.finish_optimizer_step();
  r.mtp = model_.take_mtp_metrics();
  // finalize_model_grads: with --calculate-per-token-loss every grad is divided by the global
  // number of tokens (all-reduced over DP×CP; single rank here).
  if (hooks_.finalize_model_grads) {
    hooks_.finalize_model_grads(r.lm_loss.num_tokens);
  } else if (args_.calculate_per_token_loss) {
    optimizer_.scale_gradients(1.0 / std::max(r.lm_loss.num_tokens, 1.0));
  }
  if (hooks_.reduce_loss) hooks_.reduce_loss(r.lm_loss);

  if (l1_barrier) hooks_.barrier();
  timers_("optimizer", 1).start();
  const optimizer::StepResult s = optimizer_.step();
  if (hooks_.after_optimizer_step) {
    optimizer_.finish_optimizer_step();  // e.g. the distributed optimizer's param all-gather reads the params
    hooks_.after_optimizer_step();
  }
  timers_("optimizer", 1).stop();
  r.skipped = !s.update_successful;
  r.grad_norm = s.grad_norm;
  r.num_zeros_in_grad = s.num_zeros_in_grad;
  if (s.update_successful) {
    scheduler_.step(*args_.global_batch_size);
    optimizer_.apply_schedule(scheduler_);
  }
  return r;
}

std::optional<double> Trainer::evaluate(BatchIterator& data) {
  optimizer_.finish_optimizer_step();  // an overlapped step in flight: evaluation reads every param
  LossReport total;
  bool any = false;
  for (int64_t it = 0; it < args_.eval_iters; ++it) {
    if (hooks_.forward_backward) {
      std::optional<LossReport> rep = hooks_.forward_backward(data, /*forward_only=*/true, 1.0);
      if (!rep) {
        if (hooks_.reduce_loss) hooks_.reduce_loss(total);
        return any ? std::optional<double>(total.loss_sum / total.num_tokens) : std::nullopt;
      }
      total.loss_sum += rep->loss_sum;
      total.num_tokens += rep->num_tokens;
      any = true;
    }
    for (int64_t mb = 0; mb < (hooks_.forward_backward ? 0 : num_microbatches_); ++mb) {
      std::optional<datasets::GPTBatch> batch = data();
      if (!batch) {
        if (hooks_.reduce_loss) hooks_.reduce_loss(total);
        return any ? std::optional<double>(total.loss_sum / total.num_tokens) : std::nullopt;
      }
      Tensor loss = model_.forward(*batch, /*training=*/false);
      const LossReport rep = masked_loss_report(loss, batch->loss_mask);
      total.loss_sum += rep.loss_sum;
      total.num_tokens += rep.num_tokens;
      any = true;
    }
    state_.consumed_valid_samples += *args_.global_batch_size;
  }
  if (hooks_.reduce_loss) hooks_.reduce_loss(total);
  if (!any) return std::nullopt;
  return total.loss_sum / total.num_tokens;
}

void Trainer::evaluate_and_print_results(const std::string& prefix, BatchIterator& data, bool is_test,
                                         bool write_to_tensorboard) {
  timers_("eval-time", 0).start();
  std::optional<double> v = evaluate(data);
  timers_("eval-time", 0).stop();
  if (!v) {
    print(std::string(" > no ") + (is_test ? "test" : "validation") + " data left for the evaluation at " + prefix);
    return;
  }
  for (const auto& line : format_validation_lines(prefix, "", {{"lm loss", *v}})) print(line);
  // Megatron writes the same tags for the test set ("... on test set"): one more point at the
  // current iteration.
  if (hooks_.add_scalar && write_to_tensorboard) {
    hooks_.add_scalar("lm loss validation", *v, state_.iteration);
    hooks_.add_scalar("lm loss validation vs samples", *v, state_.consumed_train_samples);
    if (args_.log_validation_ppl_to_tensorboard) {
      const double ppl = std::exp(std::min(20.0, *v));
      hooks_.add_scalar("lm loss validation ppl", ppl, state_.iteration);
      hooks_.add_scalar("lm loss validation ppl vs samples", ppl, state_.consumed_train_samples);
    }
  }
}

std::string Trainer::timers_log_and_write(const std::vector<std::string>& names, int64_t iteration, bool write,
                                          bool reset) {
  // Every rank: its own times, then the all-gather (a collective, reached unconditionally).
  const std::vector<double> local = timers_.elapsed_seconds(names, reset);
  const std::vector<double> all = hooks_.all_gather_times ? hooks_.all_gather_times(local) : local;
  const int64_t world = static_cast<int64_t>(all.size() / std::max<size_t>(names.size(), 1));
  // Megatron's timers.write(names, writer, iteration, normalizer=log_interval): the max over
  // ranks, in seconds per iteration, as "<name>-time".
  if (write && hooks_.add_scalar) {
    for (const auto& t : timers_min_max(names, all, world, static_cast<double>(args_.log_interval)))
      hooks_.add_scalar(t.name + "-time", t.max, iteration);
  }
  return format_timers_string(names, all, world, static_cast<double>(args_.log_interval), timers_.log_option());
}

void Trainer::report_moe_metrics(int64_t iteration) {
  // Megatron's training_log "Log MoE metrics": the tracked names follow
  // --moe-router-load-balancing-type and --moe-z-loss-coeff; loss scale 1 / num_microbatches.
  std::vector<std::string> names;
  const auto& types = args_.moe_router_load_balancing_type;
  auto has = [&types](const char* t) { return std::find(types.begin(), types.end(), t) != types.end(); };
  if (has("aux_loss")) names.emplace_back("load_balancing_loss");
  if (has("seq_aux_loss")) names.emplace_back("seq_load_balancing_loss");
  if (has("global_aux_loss")) names.emplace_back("global_load_balancing_loss");
  if (args_.moe_z_loss_coeff) names.emplace_back("z_loss");
  if (names.empty()) return;
  // The tracker spans decoder and MTP layers; the MTP layers are MoE layers when the last decoder
  // layer is one (Megatron's training_log: mtp_moe_layers).
  const int64_t num_layers = *args_.num_layers + args_.mtp_num_layers.value_or(0);
  const int64_t num_moe_layers = num_moe_layers_with_mtp(args_);
  namespace ps = megatron::parallel_state;
  const bool groups = ps::model_parallel_is_initialized();
  const Device device = optimizer_.params().empty() ? Device::cpu() : optimizer_.params().front().param.device();
  std::vector<std::pair<std::string, double>> per_layer;  // --moe-per-layer-logging
  const auto values = transformer::moe::MoEMetricsTracker::get().report(
      1.0 / static_cast<double>(num_microbatches_), names, num_layers, num_moe_layers,
      groups ? ps::get_pipeline_model_parallel_group().get() : nullptr,
      groups ? ps::get_data_parallel_group(false).get() : nullptr, device,
      args_.moe_per_layer_logging ? &per_layer : nullptr);
  // Every iteration: TensorBoard under the metric's own name (the last rank's writer), and the
  // names ending in "loss" into total_loss_dict (averaged over the advanced iterations in the
  // iteration line, after "lm loss").
  for (const auto& [name, v] : values) {
    if (hooks_.add_scalar) hooks_.add_scalar(name, v, iteration);
    auto it = std::find_if(moe_loss_sums_.begin(), moe_loss_sums_.end(), [&](const auto& p) { return p.first == name; });
    if (it == moe_loss_sums_.end()) moe_loss_sums_.emplace_back(name, v);
    else it->second += v;
  }
  // Megatron writes the per-layer scalars after the aggregated ones (_log_per_layer).
  if (hooks_.add_scalar)
    for (const auto& [tag, v] : per_layer) hooks_.add_scalar(tag, v, iteration);
}

void Trainer::training_log(const TrainStepResult& r, bool first_iteration) {
  const int64_t it = state_.iteration;
  const double iter_loss = r.lm_loss.loss_sum / std::max(r.lm_loss.num_tokens, 1.0);
  // Megatron's total_loss_dict bookkeeping.
  if (!r.skipped) {
    interval_loss_sum_ += iter_loss;
    advanced_iters_ += 1;
  } else {
    skipped_iters_ += 1;
    if (!std::isfinite(iter_loss)) nan_iters_ += 1;
  }
  interval_iters_ += 1;
  const int64_t batch_size = *args_.global_batch_size;
  const double lr = optimizer_.logged_lr();
  const int64_t samples = state_.consumed_train_samples;

  // TensorBoard (every --tensorboard-log-interval; Megatron's training_log, in its order). Only
  // the last rank has a writer: nothing in this block may communicate (values that need a
  // collective, e.g. the params norm, were computed on every rank before).
  if (hooks_.add_scalar && it % args_.tensorboard_log_interval == 0) {
    auto add = [this, it, samples](const std::string& tag, double v, bool vs_samples = true) {
      hooks_.add_scalar(tag, v, it);
      if (vs_samples) hooks_.add_scalar(tag + " vs samples", v, samples);
    };
    if (args_.log_learning_rate_to_tensorboard) add("learning-rate", lr);
    if (state_.skipped_train_samples > 0)
      add("skipped-train-samples", static_cast<double>(state_.skipped_train_samples), /*vs_samples=*/false);
    if (args_.log_batch_size_to_tensorboard) add("batch-size", static_cast<double>(batch_size));
    add("lm loss", iter_loss);  // Megatron writes the iteration's loss dict, skipped or not
    if (args_.log_loss_scale_to_tensorboard) add("loss-scale", optimizer_.get_loss_scale());
    if (args_.log_world_size_to_tensorboard) add("world-size", static_cast<double>(args_.world_size));
    if (r.grad_norm) add("grad-norm", *r.grad_norm);
    if (r.num_zeros_in_grad) add("num-zeros", static_cast<double>(*r.num_zeros_in_grad));
    if (r.params_norm) add("params-norm", *r.params_norm);
    if (args_.log_memory_to_tensorboard) {
      // torch.cuda.memory_stats(): reserved/allocated/peak bytes and the live allocation count.
      // On the CPU there is no caching pool: reserved = allocated.
      const MemoryStats m = hooks_.memory_stats ? hooks_.memory_stats() : megatron::memory_stats(DeviceType::kCPU);
      add("mem-reserved-bytes", static_cast<double>(m.reserved >= 0 ? m.reserved : m.allocated), false);
      add("mem-allocated-bytes", static_cast<double>(m.allocated), false);
      add("mem-max-allocated-bytes", static_cast<double>(m.max_allocated), false);
      add("mem-allocated-count", static_cast<double>(m.allocation_count), false);
    }
  }

  if (args_.num_experts) report_moe_metrics(it);  // every rank, after the TensorBoard block (Megatron's order)
  // Megatron's MTPLossLoggingHelper.track_mtp_metrics: every iteration (skipped ones too), the
  // loss scaled by 1/num_microbatches into total_loss_dict and TensorBoard.
  const size_t D = r.mtp.size();
  interval_mtp_loss_.resize(D, 0.0);
  mtp_cumulative_correct_.resize(D, 0.0);
  mtp_cumulative_total_.resize(D, 0.0);
  for (size_t i = 0; i < D; ++i) {
    const double loss = r.mtp[i].loss / static_cast<double>(num_microbatches_);
    interval_mtp_loss_[i] += loss;
    mtp_cumulative_correct_[i] += r.mtp[i].correct;
    mtp_cumulative_total_[i] += r.mtp[i].total;
    if (!hooks_.add_scalar) continue;
    const std::string k = std::to_string(i + 1);
    hooks_.add_scalar("mtp_" + k + " loss", loss, it);
    hooks_.add_scalar("mtp_" + k + "_acceptance_rate", r.mtp[i].correct / std::max(r.mtp[i].total, 1.0) * 100.0, it);
    hooks_.add_scalar("mtp_" + k + "_cumulative_acceptance_rate",
                      mtp_cumulative_correct_[i] / std::max(mtp_cumulative_total_[i], 1.0) * 100.0, it);
  }

  if (it % args_.log_interval == 0 || first_iteration) {
    // Megatron's training_log: should_reset = not is_first_iteration. The run's first iteration
    // (the first after a --load too) is printed without clearing the interval's accumulators
    // (losses, iteration counts, interval time, timers), so the next line averages over both:
    // with --log-interval 1 the run's second line prints the mean of its first two iterations.
    const bool should_reset = !first_iteration;
    const double elapsed = timers_("interval-time", 0).elapsed(should_reset);
    const double per_iter = elapsed / static_cast<double>(std::max<int64_t>(interval_iters_, 1));
    TrainingLogFields f;
    f.timestamp = format_log_timestamp(std::chrono::system_clock::now());
    f.iteration = it;
    f.train_iters = train_iters_;
    f.consumed_samples = state_.consumed_train_samples;
    f.skipped_samples = state_.skipped_train_samples;
    f.elapsed_ms_per_iteration = per_iter * 1000.0;
    const double throughput = num_floating_point_operations(args_, batch_size) /
                              (per_iter * 1e12 * static_cast<double>(args_.world_size));
    if (hooks_.add_scalar && args_.log_timers_to_tensorboard && !first_iteration)
      hooks_.add_scalar("iteration-time", per_iter, it);
    if (args_.log_throughput) {
      f.throughput_tflops = throughput;
      if (hooks_.add_scalar && args_.log_timers_to_tensorboard) hooks_.add_scalar("throughput", throughput, it);
    }
    f.learning_rate = lr;
    f.global_batch_size = batch_size;
    f.losses = {{"lm loss", interval_loss_sum_ / static_cast<double>(std::max<int64_t>(advanced_iters_, 1))}};
    for (auto& [name, sum] : moe_loss_sums_) {
      f.losses.emplace_back(name, sum / static_cast<double>(std::max<int64_t>(advanced_iters_, 1)));
      if (should_reset) sum = 0.0;
    }
    for (size_t i = 0; i < interval_mtp_loss_.size(); ++i) {
      f.losses.push_back({"mtp_" + std::to_string(i + 1) + " loss",
                          interval_mtp_loss_[i] / static_cast<double>(std::max<int64_t>(advanced_iters_, 1))});
      if (should_reset) interval_mtp_loss_[i] = 0.0;
    }
    f.loss_scale = optimizer_.get_loss_scale();
    f.grad_norm = r.grad_norm;
    f.num_zeros = r.num_zeros_in_grad;
    f.params_norm = r.params_norm;
    f.skipped_iterations = skipped_iters_;
    f.nan_iterations = nan_iters_;
    print(format_training_log_line(f));
    if (ops::cuda_available() && env_switch("MEGATRON_LOG_HOST_SYNCS", false)) {
      // Diagnostics (not a Megatron log line): host waits for the GPU since the last log line.
      static unsigned long long last = 0;
      const unsigned long long now = ops::host_sync_count();
      const int64_t n = std::max<int64_t>(interval_iters_, 1);
      char buf[160];
      std::snprintf(buf, sizeof(buf), " host synchronizations: %llu in %lld iterations (%.1f per iteration)",
                    now - last, static_cast<long long>(n), static_cast<double>(now - last) / static_cast<double>(n));
      print(buf);
      last = now;
    }
    if (should_reset) {
      interval_loss_sum_ = 0.0;
      advanced_iters_ = skipped_iters_ = nan_iters_ = interval_iters_ = 0;
    }
    if (!memory_reported_) {
      const std::string name = "(after " + std::to_string(it) + " iterations)";
      if (hooks_.report_memory) hooks_.report_memory(name);
      else print(memory_report(name, static_cast<int>(args_.rank)));
      memory_reported_ = it > 1;  // report again after the second logged iteration (optimizer state allocated)
    }
    // Megatron's timers_to_log (the ones this loop measures); written to TensorBoard with
    // --log-timers-to-tensorboard, then printed. Every rank takes part in the all-gather.
    std::vector<std::string> names;
    if (args_.timing_log_level >= 1) names = {"forward-backward", "optimizer"};
    if (args_.timing_log_level >= 2) names.insert(names.end(), {"batch-generator", "forward-compute", "backward-compute"});
    if (!names.empty()) {
      const std::string t = timers_log_and_write(names, it, args_.log_timers_to_tensorboard, should_reset);
      if (!t.empty()) print(t);
    }
  }
}

void Trainer::append_to_progress_log(const std::string& text) {
  if (!args_.log_progress || !args_.save) return;
  if (hooks_.barrier) hooks_.barrier();  // Megatron: barrier, then rank 0 writes
  if (args_.rank != 0) return;
  namespace fs = std::filesystem;
  const fs::path path = fs::path(*args_.save) / "progress.txt";
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec) user_error("--log-progress: cannot create directory ", path.parent_path().string(), ": ", ec.message());
  const char* job = std::getenv("SLURM_JOB_ID");
  std::ofstream f(path, std::ios::app);
  f << format_progress_line(std::chrono::system_clock::now(), job ? job : "", args_.world_size, text) << "\n";
  f.flush();
  if (!f) user_error("--log-progress: cannot append to ", path.string(), " (disk full or read-only?)");
}

void Trainer::save_checkpoint_and_time(int64_t iteration) {
  optimizer_.finish_optimizer_step();  // the checkpoint reads params and optimizer state
  hooks_.save_checkpoint(iteration);
  if (!args_.log_progress || !args_.save) return;
  // Megatron's compute_throughputs_and_append_to_progress_log: this job's throughput since it
  // started, and the cumulative one since the first job of this world size (from progress.txt).
  const double flops = state_.floating_point_operations_so_far;
  const double world = static_cast<double>(args_.world_size);
  const auto now = std::chrono::system_clock::now();
  const double job_s = std::chrono::duration<double>(now - job_start_wall_).count();
  const double job_tp = (flops - job_start_flops_) / (std::max(job_s, 1e-9) * 1e12 * world);
  double cum_tp = job_tp;
  if (args_.rank == 0) {
    std::ifstream in(std::filesystem::path(*args_.save) / "progress.txt");
    std::vector<std::string> lines;
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    if (const std::optional<ProgressStart> st = progress_start(lines, args_.world_size)) {
      const double el = std::chrono::duration<double>(now - st->time).count();
      cum_tp = (flops - st->flops) / (std::max(el, 1e-9) * 1e12 * world);
    }
  }
  const double tokens = static_cast<double>(state_.consumed_train_samples) * static_cast<double>(*args_.seq_length);
  append_to_progress_log(format_progress_checkpoint_text(args_.async_save, iteration, job_tp, cum_tp, flops, tokens));
}

bool Trainer::checkpoint_and_decide_exit() {
  const int64_t it = state_.iteration;
  bool saved = false;
  auto save = [&] {
    if (args_.save && hooks_.save_checkpoint && !saved) {
      save_checkpoint_and_time(it);
      saved = true;
    }
  };
  auto datetime_line = [&](const std::string& what) {
    print("[" + what + "] datetime: " + format_log_timestamp(std::chrono::system_clock::now()) + " ");
  };
  // A collective: only called under conditions that are the same on every rank.
  auto any_rank = [&](bool flag) { return hooks_.any_rank ? hooks_.any_rank(flag) : flag; };
  if (args_.exit_signal_handler && any_rank(exit_signal_received())) {
    save();
    datetime_line("exiting program after receiving SIGTERM.");
    return true;
  }
  if (args_.save && args_.save_interval && it % *args_.save_interval == 0) save();
  // Megatron tests `if args.exit_duration_in_mins:`: None and 0 are off. Every rank takes part
  // in the all-reduce of the decision (the condition is the same on all ranks).
  if (args_.exit_duration_in_mins.value_or(0) > 0) {
    const double train_time =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time_).count() / 60.0;
    if (any_rank(train_time > static_cast<double>(*args_.exit_duration_in_mins))) {
      save();
      std::ostringstream os;
      os.precision(17);
      os << "exiting program after " << train_time << " minutes";
      datetime_line(os.str());
      return true;
    }
  }
  if (args_.exit_interval && it % *args_.exit_interval == 0) {
    save();
    datetime_line("exiting program at iteration " + std::to_string(it));
    return true;
  }
  return false;
}

bool Trainer::train(BatchIterator& train_data, BatchIterator* valid_data) {
  if (args_.exit_signal_handler) install_exit_signal_handler();
  const int64_t start_iteration = state_.iteration;
  bool profiling = false;
  timers_("interval-time", 0).start();
  bool exited = false;
  while (state_.iteration < train_iters_) {
    if (args_.profile && state_.iteration == args_.profile_step_start &&
        std::find(args_.profile_ranks.begin(), args_.profile_ranks.end(), args_.rank) != args_.profile_ranks.end()) {
      timers_.clear_events();
      timers_.set_recording(true);
      profiling = true;
      if (hooks_.profile_start) hooks_.profile_start(state_.iteration + 1);
    }
    timers_("iteration", 0).start();
    TrainStepResult r = train_step(train_data);
    timers_("iteration", 0).stop();
    // Megatron's calc_params_l2_norm in train(), on every rank before training_log (a
    // collective: never inside the last rank's TensorBoard block).
    if (args_.log_params_norm) r.params_norm = optimizer_.params_norm();
    state_.iteration += 1;
    const int64_t batch_size = *args_.global_batch_size;
    state_.consumed_train_samples += batch_size;
    state_.floating_point_operations_so_far += num_floating_point_operations(args_, batch_size);
    training_log(r, state_.iteration == start_iteration + 1);
    if (profiling && state_.iteration == args_.profile_step_end) {
      if (hooks_.profile_stop) hooks_.profile_stop(state_.iteration);
      timers_.set_recording(false);
      profiling = false;
      const std::string dir = args_.tensorboard_dir.value_or(".");
      const std::string path = dir + "/trace_rank" + std::to_string(args_.rank) + ".json";
      timers_.write_chrome_trace(path, static_cast<int>(args_.rank));
      print(" > profile: wrote a Chrome/Perfetto trace of iterations " + std::to_string(args_.profile_step_start + 1) +
            "-" + std::to_string(args_.profile_step_end) + " to " + path);
    }
    if (args_.eval_interval && state_.iteration % *args_.eval_interval == 0 && valid_data && args_.eval_iters > 0) {
      timers_("interval-time", 0).stop();
      evaluate_and_print_results("iteration " + std::to_string(state_.iteration), *valid_data);
      timers_("interval-time", 0).start();
    }
    if (checkpoint_and_decide_exit()) {
      exited = true;
      break;
    }
  }
  timers_("interval-time", 0).stop();
  // The last overlapped optimizer step: done before anything after training reads the params
  // (final evaluation, parameter dumps) or frees them.
  optimizer_.finish_optimizer_step();
  // The run ended inside the --profile window: the kernel profile covers what ran.
  if (profiling && hooks_.profile_stop && state_.iteration > start_iteration) hooks_.profile_stop(state_.iteration);
  if (hooks_.flush) hooks_.flush();
  return exited;
}

void Trainer::pretrain(BatchIterator& train_data, BatchIterator* valid_data, BatchIterator* test_data) {
  // --log-progress: Megatron appends "Starting job" at start-up and measures this job's
  // throughput from here (_TRAIN_START_TIME, the loaded FLOPs count).
  job_start_wall_ = std::chrono::system_clock::now();
  job_start_flops_ = state_.floating_point_operations_so_far;
  append_to_progress_log("Starting job");
  if (!args_.skip_train) {
    print("[before the start of training step] datetime: " + format_log_timestamp(std::chrono::system_clock::now()) +
          " ");
    const bool exited = train(train_data, valid_data);
    if (exited) return;  // Megatron sys.exit()s on exit conditions: no final evaluation
    print("[after training is done] datetime: " + format_log_timestamp(std::chrono::system_clock::now()) + " ");
    if (args_.save && hooks_.save_checkpoint && state_.iteration != 0 && args_.save_interval &&
        state_.iteration % *args_.save_interval != 0) {
      save_checkpoint_and_time(state_.iteration);
    }
  } else {
    print("skipping training (--skip-train is on) ...");
  }
  const std::string it = std::to_string(state_.iteration);
  // Megatron: write_to_tensorboard = not --skip-train for the final evaluations.
  if (valid_data && args_.eval_iters > 0)
    evaluate_and_print_results("iteration " + it + " on validation set", *valid_data, /*is_test=*/false,
                               /*write_to_tensorboard=*/!args_.skip_train);
  if (test_data && args_.eval_iters > 0)
    evaluate_and_print_results("iteration " + it + " on test set", *test_data, /*is_test=*/true,
                               /*write_to_tensorboard=*/!args_.skip_train);
  if (hooks_.flush) hooks_.flush();
}

}  // namespace megatron::training
