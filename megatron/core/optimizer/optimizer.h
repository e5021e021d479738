// Megatron's mixed-precision optimizer (megatron/core/optimizer/optimizer.py:
// MixedPrecisionOptimizer / Float16OptimizerWithFloat16Params / FP32Optimizer) with Adam(W) or SGD.
//
// Flow of step() (docs/megatron-reference.md#grad-norm-and-clipping; Megatron's ChainedOptimizer.step, which is what
// get_megatron_optimizer returns): copy bf16 model grads to fp32 main grads (--grad-reduce-in-bf16);
// (fp16) unscale by 1/loss_scale and check for inf/NaN -> skip the step if found
// (update_successful = false, grad norm None); global grad norm over the grads that count
// (always computed) and clipping (--clip-grad > 0); zero count
// (--log-num-zeros-in-grad); Adam(W) on fp32 main params; copy main params -> bf16/fp16 model
// params (SGD: torch.optim.SGD's update composed from ops::add_/scale_/cast, so the same code
// runs on CPU and GPU tensors). Param groups (docs/megatron-reference.md#param-groups): no weight decay for 1-D params and biases; --decoupled-lr for
// embedding/output weights.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/optimizer/grad_scaler.h"
#include "megatron/core/optimizer/optimizer_config.h"
#include "megatron/core/optimizer/step_overlap.h"
#include "megatron/core/optimizer_param_scheduler.h"
#include "megatron/core/tensor/tensor.h"

namespace megatron::optimizer {

/// One model parameter as the optimizer sees it.
struct OptimizerParam {
  std::string name;            // Megatron's parameter name, e.g. "decoder.layers.0.mlp.linear_fc1.bias"
  Tensor param;                // the model's parameter (float32, bfloat16 or float16), updated in place
  Tensor main_grad;            // float32 (or bfloat16 / float16: the DDP buffer in the param dtype) gradient, same numel
  bool no_weight_decay = false;         // forced no-decay (1-D params and *.bias never decay anyway)
  bool is_embedding_or_output = false;  // word embedding / untied output weight (--decoupled-lr)
  bool tensor_parallel = false;         // partitioned over TP (else duplicated: counted on TP rank 0)
  bool shared = false;                  // duplicate of a tied weight owned elsewhere (not counted)
  /// Megatron's is_expert_parallel (Parameter::allreduce false): a routed expert's weight on the
  /// expert process groups; its grad statistics use the expert group (set_expert_grad_stats) and
  /// `tensor_parallel` means partitioned over expert-TP (else counted on expert-TP rank 0).
  bool expert_parallel = false;
  /// Optional fp32 main param supplied by the caller (same numel as `param`, shares storage with
  /// it): used instead of a copy the optimizer would make from `param`, and `param` is then not
  /// written by step() (--fp8-param-gather: the FP8 weight's model-dtype copy is released; the
  /// DDP casts this main param to FP8 itself, DistributedDataParallel::fp8_main_param).
  Tensor main_param;
};

/// A parameter group (Megatron's param_groups entry).
struct ParamGroup {
  std::vector<size_t> params;  // indices into the optimizer's parameter list
  double wd_mult = 1.0;
  double lr_mult = 1.0;
  bool is_decoupled_lr = false;
  double max_lr = 0.0;
  double min_lr = 0.0;
  double lr = 0.0;            // current lr (set by apply_schedule)
  double weight_decay = 0.0;  // current wd (set by apply_schedule)
};

/// What optimizer.step() returns: (update_successful, grad_norm, num_zeros_in_grad).
struct StepResult {
  bool update_successful = true;
  std::optional<double> grad_norm;
  std::optional<int64_t> num_zeros_in_grad;
};

class MegatronOptimizer {
 public:
  /// `params` in model order. `grad_stats_group`: the group over which grad norms / zero counts /
  /// inf checks are all-reduced (model-parallel group; nullptr = single rank). `tp_rank` decides
  /// whether TP-duplicated params count in norms. Throws UserError for an unknown optimizer.
  MegatronOptimizer(const OptimizerConfig& config, std::vector<OptimizerParam> params,
                    std::shared_ptr<comm::ProcessGroup> grad_stats_group = nullptr, int tp_rank = 0);

  /// Megatron's ChainedOptimizer of a dense and an expert-parallel optimizer, for the params with
  /// `expert_parallel`: `expert_group` is the expert optimizer's grad-stats group (the expert
  /// tensor-model-pipeline group tp-ep-pp, or the same group as the dense part with the
  /// distributed optimizer) and `expert_tp_rank` decides whether expert-TP-duplicated params
  /// count. When the two groups are the same object the grad norm is one norm over all grads
  /// (ChainedOptimizer's shared grad-stats group case); otherwise each part's norm is all-reduced
  /// over its own group and the norm is sqrt(dense² + expert²), the zero count the sum of both
  /// parts' counts, and an inf/NaN in either part (each checked over its group) skips the step.
  /// Without this call every param is dense.
  void set_expert_grad_stats(std::shared_ptr<comm::ProcessGroup> expert_group, int expert_tp_rank);

  /// One optimizer step as described above. With the step overlap enabled (below) the Adam
  /// update is only queued on the side stream when step() returns; a step still in flight is
  /// finished first.
  StepResult step();

  // ---- The step overlapped with the next forward (optimizer/step_overlap.h, docs/architecture.md
  // "Optimizer step overlap"; MEGATRON_OPTIM_OVERLAP in pretrain_gpt).

  /// Enables it: the Adam update of param i (this optimizer's order) runs in chunk
  /// chunk_of_param[i] (< num_chunks: the forward stage that first reads it,
  /// GPTModel::forward_stage_of_params), chunks in increasing order, on the backend's side stream
  /// (nullptr: cuda_step_stream_backend()); then every tensor of `zero_after` is zeroed on that
  /// stream (the DDP gradient buffers: take_zeroed_grads() tells the next zero_grad that its
  /// memset is done). The kernels and their per-element arithmetic are those of the serial step,
  /// so every result is bit-identical. Only for Adam with every main param on one device (CUDA
  /// unless a backend is given); InternalError otherwise or when called twice.
  void enable_step_overlap(std::vector<size_t> chunk_of_param, size_t num_chunks, std::vector<Tensor> zero_after,
                           std::unique_ptr<StepStreamBackend> backend = nullptr);
  bool step_overlap_enabled() const { return overlap_ != nullptr; }
  /// An overlapped step has been queued and the compute stream has not yet waited for all of it
  /// (OptimizerStepOverlap::in_flight; false without the overlap).
  bool step_in_flight() const { return overlap_ && overlap_->in_flight(); }
  /// The compute stream waits for the update of the params of chunk `chunk` (and of every chunk
  /// before it); chunk >= the number of chunks: finish_optimizer_step(). No-op without a step in
  /// flight. The hot path: one call per forward stage (GPTModel::set_param_wait_hook).
  void wait_for_params(size_t chunk) const {
    if (overlap_) overlap_->wait(chunk);
  }
  /// The compute stream waits for the whole step in flight (no-op if none): the safe default
  /// before anything else reads or writes parameters, optimizer state or gradients (zero_grad,
  /// params_norm, the state accessors below call it themselves; checkpoint saves, evaluation
  /// and the end of training call it in the training loop).
  void finish_optimizer_step() const {
    if (overlap_) overlap_->finish();
  }
  /// True once after a step whose side stream zeroed the `zero_after` tensors (then false until
  /// the next such step): the caller's grad zeroing may skip its memset.
  bool take_zeroed_grads() {
    const bool z = grads_zeroed_;
    grads_zeroed_ = false;
    return z;
  }
  /// Sets every group's lr and weight decay from the scheduler's current step (Megatron's
  /// OptimizerParamScheduler.step body): lr = get_lr(max_lr, min_lr) * lr_mult, wd = get_wd() * wd_mult.
  void apply_schedule(const OptimizerParamScheduler& sched);
  /// Current loss scale (1.0 without a scaler, i.e. bf16/fp32).
  double get_loss_scale() const { return scaler_ ? scaler_->scale() : 1.0; }
  MegatronGradScaler* grad_scaler() { return scaler_.get(); }
  /// Zeroes every main grad.
  void zero_grad();
  /// Multiplies every model main grad by `f` (used by --calculate-per-token-loss, docs/megatron-reference.md#loss-normalisation).
  void scale_gradients(double f);
  /// L2 norm of the fp32 main params that count (not shared; TP-duplicates on TP rank 0 only),
  /// all-reduced over the grad-stats group (--log-params-norm).
  double params_norm() const;
  /// LR to log: the first group whose schedule is not overridden (docs/megatron-reference.md#param-groups).
  double logged_lr() const;

  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  /// Mutable groups (e.g. to take a checkpoint's max_lr/min_lr with
  /// --use-checkpoint-opt_param-scheduler); apply_schedule() then uses them.
  std::vector<ParamGroup>& mutable_param_groups() { return groups_; }
  const std::vector<OptimizerParam>& params() const { return params_; }
  /// fp32 master copy of param i (the param itself when it is float32). The state accessors
  /// finish a step in flight first (finish_optimizer_step).
  const Tensor& main_param(size_t i) const {
    finish_optimizer_step();
    return main_params_[i];
  }
  const Tensor& exp_avg(size_t i) const {
    finish_optimizer_step();
    return exp_avg_[i];
  }
  const Tensor& exp_avg_sq(size_t i) const {
    finish_optimizer_step();
    return exp_avg_sq_[i];
  }
  /// SGD's momentum buffer of param i (torch.optim.SGD state "momentum_buffer"): fp32, numel of
  /// the param, on its device; undefined for Adam and with --sgd-momentum 0. Allocated (zeros) at
  /// construction so a checkpoint load can fill it; it holds state once step_count() > 0.
  const Tensor& momentum_buffer(size_t i) const {
    finish_optimizer_step();
    return momentum_[i];
  }
  int64_t step_count() const { return step_; }
  /// Restores the step counter (Adam bias correction) from a checkpoint.
  void set_step_count(int64_t step) { step_ = step; }
  const OptimizerConfig& config() const { return config_; }

 private:
  /// The grads (or, for params_norm, the fp32 main params) that count in the norm: of the dense
  /// params, of the expert-parallel params (both only with an expert group), or of all.
  enum class NormPart { kDense, kExpert, kAll };
  std::vector<Tensor> grads_for_norm(NormPart part, bool main_params = false) const;
  bool chained() const { return expert_group_ != nullptr; }
  bool grad_stats_group_is_shared() const;
  /// The chained norm of the counted grads / main params (see set_expert_grad_stats).
  double chained_norm(bool main_params) const;
  std::vector<Tensor> all_main_grads() const;
  void copy_model_grads_to_main_grads();
  void release_main_grad_copies();
  void sgd_update(size_t i, const ParamGroup& grp);
  StepResult step_on_main_grads();

  OptimizerConfig config_;
  std::vector<OptimizerParam> params_;
  std::vector<Tensor> main_params_, grads_, exp_avg_, exp_avg_sq_, momentum_;
  std::vector<bool> separate_main_;
  std::vector<ParamGroup> groups_;
  std::unique_ptr<MegatronGradScaler> scaler_;
  std::shared_ptr<comm::ProcessGroup> group_;
  int tp_rank_;
  std::shared_ptr<comm::ProcessGroup> expert_group_;  // null: no expert-parallel params
  int expert_tp_rank_ = 0;
  int64_t step_ = 0;
  // The overlapped step (enable_step_overlap).
  std::unique_ptr<OptimizerStepOverlap> overlap_;
  std::vector<size_t> chunk_of_param_;
  std::vector<Tensor> zero_after_;
  Tensor adam_table_;  // ops::AdamParams::table_workspace of the side stream's launches
  bool grads_zeroed_ = false;
};

/// Megatron's no-weight-decay rule: 1-D params and names ending in ".bias".
bool is_no_weight_decay(const std::string& name, const Tensor& param);

}  // namespace megatron::optimizer
