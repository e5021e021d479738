#include "megatron/core/optimizer/optimizer.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "megatron/core/ops/ops.h"
#include "megatron/core/optimizer/clip_grads.h"
#include "megatron/core/utils/errors.h"
#include "megatron/core/utils/param_version.h"

namespace megatron::optimizer {

bool is_no_weight_decay(const std::string& name, const Tensor& param) {
  const std::string suffix = ".bias";
  const bool bias = name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  return param.dim() == 1 || bias;
}

MegatronOptimizer::MegatronOptimizer(const OptimizerConfig& config, std::vector<OptimizerParam> params,
                                     std::shared_ptr<comm::ProcessGroup> grad_stats_group, int tp_rank)
    : config_(config), params_(std::move(params)), group_(std::move(grad_stats_group)), tp_rank_(tp_rank) {
  if (config_.optimizer != "adam" && config_.optimizer != "sgd")
    user_error("--optimizer: unsupported '", config_.optimizer, "' (choose from adam, sgd)");
  if (config_.fp16 && config_.bf16) user_error("--fp16 and --bf16 cannot be used together");
  // Param groups, keyed like Megatron's _get_param_groups: (wd_mult, is_decoupled_lr), first-seen order.
  std::map<std::pair<double, bool>, size_t> key_to_group;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    MEGATRON_CHECK(p.param.defined() && p.main_grad.defined()) << p.name;
    MEGATRON_CHECK(p.main_grad.numel() == p.param.numel() &&
                   (p.main_grad.dtype() == DType::kFloat32 || p.main_grad.dtype() == DType::kBFloat16 ||
                    p.main_grad.dtype() == DType::kFloat16))
        << p.name << " grad " << p.main_grad.str() << " param " << p.param.str();
    // fp32 main grads: the model's grad itself, or an fp32 copy of a bf16/fp16 grad
    // (--bf16 --grad-reduce-in-bf16, or --fp16 without --accumulate-allreduce-grads-in-fp32;
    // Megatron's _copy_model_grads_to_main_grads), which exists only
    // during step() as in Megatron (main_param.grad = model_grad.float(), dropped by zero_grad):
    // 4 bytes per parameter (slice) that forward/backward do not have to share memory with.
    grads_.push_back(p.main_grad.dtype() == DType::kFloat32 ? p.main_grad : Tensor());
    const double wd_mult = (p.no_weight_decay || is_no_weight_decay(p.name, p.param)) ? 0.0 : 1.0;
    const bool decoupled = config_.decoupled_lr.has_value() && p.is_embedding_or_output;
    auto key = std::make_pair(wd_mult, decoupled);
    auto it = key_to_group.find(key);
    if (it == key_to_group.end()) {
      ParamGroup g;
      g.wd_mult = wd_mult;
      g.is_decoupled_lr = decoupled;
      g.max_lr = decoupled ? *config_.decoupled_lr : config_.lr;
      g.min_lr = (decoupled && config_.decoupled_min_lr) ? *config_.decoupled_min_lr : config_.min_lr;
      g.lr = g.max_lr;
      g.weight_decay = config_.weight_decay * wd_mult;
      it = key_to_group.emplace(key, groups_.size()).first;
      groups_.push_back(g);
    }
    groups_[it->second].params.push_back(i);

    // fp32 main params: a master copy for bf16/fp16 params, the param itself for fp32.
    const bool separate = p.param.dtype() != DType::kFloat32;
    separate_main_.push_back(separate && !p.main_param.defined());
    if (p.main_param.defined()) {
      MEGATRON_CHECK(p.main_param.dtype() == DType::kFloat32 && p.main_param.numel() == p.param.numel() &&
                     p.main_param.device() == p.param.device())
          << p.name << ": main param " << p.main_param.str() << " for " << p.param.str();
      main_params_.push_back(p.main_param);
    } else {
      main_params_.push_back(separate ? ops::cast_to(p.param, DType::kFloat32) : p.param);
    }
    if (config_.optimizer == "adam") {
      exp_avg_.push_back(Tensor::zeros({p.param.numel()}, DType::kFloat32, p.param.device()));
      exp_avg_sq_.push_back(Tensor::zeros({p.param.numel()}, DType::kFloat32, p.param.device()));
      momentum_.push_back(Tensor());
    } else {
      // SGD's momentum buffer, allocated up front as zeros (torch.optim.SGD creates it at the
      // first step as a copy of d; momentum * 0 + d == d exactly, so a zero buffer gives the same
      // bits and lets a checkpoint load fill it in place). No buffer with --sgd-momentum 0.
      exp_avg_.push_back(Tensor());
      exp_avg_sq_.push_back(Tensor());
      momentum_.push_back(config_.sgd_momentum != 0.0
                              ? Tensor::zeros({p.param.numel()}, DType::kFloat32, p.param.device())
                              : Tensor());
    }
  }
  if (config_.fp16) {
    if (config_.loss_scale) {
      scaler_ = std::make_unique<ConstantGradScaler>(*config_.loss_scale);
    } else {
      scaler_ = std::make_unique<DynamicGradScaler>(config_.initial_loss_scale, config_.min_loss_scale, 2.0, 0.5,
                                                    config_.loss_scale_window, config_.hysteresis);
    }
  }
}

std::vector<Tensor> MegatronOptimizer::grads_for_norm(NormPart part, bool main_params) const {
  std::vector<Tensor> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& p = params_[i];
    if (p.shared) continue;
    const bool ep = chained() && p.expert_parallel;
    if ((part == NormPart::kDense && ep) || (part == NormPart::kExpert && !ep)) continue;
    if (!p.tensor_parallel && (ep ? expert_tp_rank_ : tp_rank_) != 0) continue;
    out.push_back(main_params ? main_params_[i] : grads_[i]);
  }
  return out;
}

void MegatronOptimizer::set_expert_grad_stats(std::shared_ptr<comm::ProcessGroup> expert_group, int expert_tp_rank) {
  MEGATRON_CHECK(expert_group) << "set_expert_grad_stats: null expert group";
  expert_group_ = std::move(expert_group);
  expert_tp_rank_ = expert_tp_rank;
}

bool MegatronOptimizer::grad_stats_group_is_shared() const { return !chained() || expert_group_ == group_; }

double MegatronOptimizer::chained_norm(bool main_params) const {
  // One grad-stats group: one norm over every counted tensor.
  if (grad_stats_group_is_shared()) return get_grad_norm_fp32(grads_for_norm(NormPart::kAll, main_params), group_.get());
  const double a = get_grad_norm_fp32(grads_for_norm(NormPart::kDense, main_params), group_.get());
  const double b = get_grad_norm_fp32(grads_for_norm(NormPart::kExpert, main_params), expert_group_.get());
  return std::sqrt(a * a + b * b);  // ChainedOptimizer.get_grad_norm: sqrt of the sum of squares
}

std::vector<Tensor> MegatronOptimizer::all_main_grads() const { return grads_; }

void MegatronOptimizer::zero_grad() {
  finish_optimizer_step();
  grads_zeroed_ = false;
  for (auto& p : params_) p.main_grad.zero_();
}

void MegatronOptimizer::scale_gradients(double f) {
  finish_optimizer_step();
  const float c = static_cast<float>(f);
  for (auto& p : params_) ops::scale_(p.main_grad, c);
}

void MegatronOptimizer::copy_model_grads_to_main_grads() {
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& mg = params_[i].main_grad;
    if (mg.dtype() == DType::kFloat32) continue;
    grads_[i] = Tensor::empty(mg.shape(), DType::kFloat32, mg.device());
    ops::cast(mg, grads_[i]);
  }
}

void MegatronOptimizer::apply_schedule(const OptimizerParamScheduler& sched) {
  const double wd = sched.get_wd();
  for (auto& g : groups_) {
    g.lr = sched.get_lr(g.max_lr, g.min_lr) * g.lr_mult;
    g.weight_decay = wd * g.wd_mult;
  }
}

double MegatronOptimizer::logged_lr() const {
  for (const auto& g : groups_)
    if (!g.is_decoupled_lr) return g.lr;
  return groups_.empty() ? 0.0 : groups_.front().lr;
}

double MegatronOptimizer::params_norm() const {
  finish_optimizer_step();
  return chained_norm(/*main_params=*/true);
}

void MegatronOptimizer::enable_step_overlap(std::vector<size_t> chunk_of_param, size_t num_chunks,
                                            std::vector<Tensor> zero_after, std::unique_ptr<StepStreamBackend> backend) {
  MEGATRON_CHECK(!overlap_) << "enable_step_overlap called twice";
  MEGATRON_CHECK(config_.optimizer == "adam") << "the overlapped optimizer step is implemented for Adam only";
  MEGATRON_CHECK(chunk_of_param.size() == params_.size())
      << chunk_of_param.size() << " chunk indices for " << params_.size() << " params";
  for (size_t c : chunk_of_param) MEGATRON_CHECK(c < num_chunks) << "chunk " << c << " of " << num_chunks;
  const Device dev = main_params_.empty() ? Device::cpu() : main_params_.front().device();
  for (const Tensor& t : main_params_)
    MEGATRON_CHECK(t.device() == dev) << "the overlapped optimizer step needs every main param on one device";
  MEGATRON_CHECK(backend || dev.is_cuda()) << "the overlapped optimizer step needs the params on a CUDA device";
  for (const Tensor& z : zero_after) MEGATRON_CHECK(z.defined() && z.device() == dev) << "zero_after " << z.str();
  overlap_ = std::make_unique<OptimizerStepOverlap>(num_chunks, backend ? std::move(backend) : cuda_step_stream_backend());
  chunk_of_param_ = std::move(chunk_of_param);
  zero_after_ = std::move(zero_after);
  // Allocated here, on the compute stream, before any step: the side stream allocates nothing
  // (a stream-ordered block freed there could otherwise be handed to the compute stream with a
  // dependency on the side stream inserted by the pool).
  adam_table_ = Tensor::empty({std::max<int64_t>(1, static_cast<int64_t>(params_.size()) * ops::kAdamTableBytesPerTensor)},
                              DType::kUInt8, dev);
}

void MegatronOptimizer::sgd_update(size_t i, const ParamGroup& grp) {
  // torch.optim.SGD (dampening 0, no Nesterov), composed from ops that run on the CPU and on the
  // GPU alike: d = g + wd * p; buf = momentum * buf + d (buf starts at zero, see the
  // constructor); p -= lr * buf (p -= lr * d without momentum). fp32 throughout.
  Tensor& mp = main_params_[i];
  const Tensor& g = grads_[i];
  const float lr = static_cast<float>(grp.lr), wd = static_cast<float>(grp.weight_decay);
  Tensor d = g;
  if (wd != 0.0f) {
    d = g.clone();  // torch adds the decay out of place: the main grad itself stays as it is
    ops::add_(d, mp, wd);
  }
  if (momentum_[i].defined()) {
    ops::scale_(momentum_[i], static_cast<float>(config_.sgd_momentum));
    ops::add_(momentum_[i], d, 1.0f);
    ops::add_(mp, momentum_[i], -lr);
  } else {
    ops::add_(mp, d, -lr);
  }
  if (separate_main_[i]) ops::cast(mp, params_[i].param);  // main -> bf16/fp16 model param
}

namespace {
// One tensor of an overlapped chunk, held by value (handles that share the optimizer's storage),
// so a deferred run of the chunk's closure (StepStreamBackend::run_on_side) still finds it.
struct OwnedAdamTensor {
  Tensor param, grad, exp_avg, exp_avg_sq, model_param;
  float lr = 0.0f, weight_decay = 0.0f;
  static OwnedAdamTensor of(const ops::AdamTensor& t) {
    return {*t.param, *t.grad, *t.exp_avg, *t.exp_avg_sq, t.model_param ? *t.model_param : Tensor(), t.lr,
            t.weight_decay};
  }
  // ops::adam_step_multi over `ts` (in order).
  static void step(std::vector<OwnedAdamTensor>& ts, const ops::AdamParams& ap) {
    std::vector<ops::AdamTensor> v;
    for (auto& o : ts) {
      ops::AdamTensor t;
      t.param = &o.param;
      t.grad = &o.grad;
      t.exp_avg = &o.exp_avg;
      t.exp_avg_sq = &o.exp_avg_sq;
      t.model_param = o.model_param.defined() ? &o.model_param : nullptr;
      t.lr = o.lr;
      t.weight_decay = o.weight_decay;
      v.push_back(t);
    }
    ops::adam_step_multi(v, ap);
  }
};
}  // namespace

void MegatronOptimizer::release_main_grad_copies() {
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].main_grad.dtype() != DType::kFloat32) grads_[i] = Tensor();
}

StepResult MegatronOptimizer::step() {
  finish_optimizer_step();
  grads_zeroed_ = false;
  copy_model_grads_to_main_grads();
  StepResult r = step_on_main_grads();
  release_main_grad_copies();
  return r;
}

StepResult MegatronOptimizer::step_on_main_grads() {
  StepResult r;
  // 1. Unscale and check for inf/NaN (only with a loss scaler, i.e. fp16).
  if (scaler_) {
    const float inv = static_cast<float>(scaler_->inv_scale());
    for (auto& g : grads_) ops::scale_(g, inv);
    bool found_inf = found_inf_or_nan(all_main_grads(), group_.get());
    if (!grad_stats_group_is_shared()) found_inf = found_inf_or_nan(all_main_grads(), expert_group_.get()) || found_inf;
    scaler_->update(found_inf);
    if (found_inf) {
      r.update_successful = false;
      return r;
    }
  }
  // 2. Norm (always computed, as Megatron's ChainedOptimizer -- what get_megatron_optimizer
  //    returns -- does) and clipping when --clip-grad > 0.
  const double norm = chained_norm(/*main_params=*/false);
  r.grad_norm = norm;
  // With every main param on a device (so the step below is the device's multi-tensor Adam), the
  // clip coefficient is applied inside that step (AdamParams::grad_scale, the same fp32 product)
  // instead of a separate pass over all fp32 grads; measured 5 ms of a 151 ms LLaMA-3-8B-shaped
  // step on an H200. On the CPU the grads are scaled first (one cheap pass; the CPU numbers stay
  // those of Megatron's clip_grad_by_total_norm_fp32 followed by the step).
  float fused_clip = 1.0f;
  if (config_.clip_grad > 0.0) {
    const bool fuse = config_.optimizer == "adam" && !config_.log_num_zeros_in_grad && !main_params_.empty() &&
                      std::all_of(main_params_.begin(), main_params_.end(), [](const Tensor& t) { return !t.is_cpu(); });
    const double coeff = config_.clip_grad / (norm + 1e-6);
    if (!fuse) clip_grad_by_total_norm_fp32(all_main_grads(), config_.clip_grad, norm);
    else if (coeff < 1.0) fused_clip = static_cast<float>(coeff);
  }
  // 3. Zero count (--log-num-zeros-in-grad; None otherwise).
  if (config_.log_num_zeros_in_grad) {
    if (grad_stats_group_is_shared())
      r.num_zeros_in_grad = count_zeros_fp32(grads_for_norm(NormPart::kAll), group_.get());
    else  // ChainedOptimizer.count_zeros: the sum of each part's count over its group
      r.num_zeros_in_grad = count_zeros_fp32(grads_for_norm(NormPart::kDense), group_.get()) +
                            count_zeros_fp32(grads_for_norm(NormPart::kExpert), expert_group_.get());
  }
  // 4. Inner step on the fp32 main params, which also writes the model params from them (caches
  //    of weight-derived values, e.g. the FP8 weight casts, are rebuilt at the next forward).
  ++step_;
  bump_param_version();
  if (config_.optimizer == "sgd") {
    for (const auto& grp : groups_)
      for (size_t i : grp.params) sgd_update(i, grp);
    return r;
  }
  // Adam(W): one multi-tensor step per device over every param in group order (ops::adam_step_multi:
  // the CPU reference steps each tensor; CUDA launches once per model-param dtype).
  ops::AdamParams ap;
  ap.beta1 = static_cast<float>(config_.adam_beta1);
  ap.beta2 = static_cast<float>(config_.adam_beta2);
  ap.eps = static_cast<float>(config_.adam_eps);
  ap.step = step_;
  ap.decoupled = config_.decoupled_weight_decay;
  ap.grad_scale = fused_clip;
  std::vector<ops::AdamTensor> host, device;
  // Overlapped (enable_step_overlap): the same tensors, one list per chunk (group order within it).
  std::vector<std::vector<OwnedAdamTensor>> chunks(overlap_ ? overlap_->num_chunks() : 0);
  for (const auto& grp : groups_)
    for (size_t i : grp.params) {
      ops::AdamTensor t;
      t.param = &main_params_[i];
      t.grad = &grads_[i];
      t.exp_avg = &exp_avg_[i];
      t.exp_avg_sq = &exp_avg_sq_[i];
      t.model_param = separate_main_[i] ? &params_[i].param : nullptr;
      t.lr = static_cast<float>(grp.lr);
      t.weight_decay = static_cast<float>(grp.weight_decay);
      if (overlap_) chunks[chunk_of_param_[i]].push_back(OwnedAdamTensor::of(t));
      else (main_params_[i].is_cpu() ? host : device).push_back(t);
    }
  if (overlap_) {
    // Queued on the side stream, after everything the compute stream has queued (grads, norm).
    // The closures own their tensor lists and hyper-parameters (a backend may run them later);
    // the tensors they point at are this optimizer's members.
    ap.table_workspace = &adam_table_;
    overlap_->begin();
    for (size_t k = 0; k < chunks.size(); ++k)
      overlap_->run_chunk(k, [ts = std::move(chunks[k]), ap]() mutable {
        if (!ts.empty()) OwnedAdamTensor::step(ts, ap);
      });
    // Then the grad buffers' zeroing, and the fp32 copies of bf16/fp16 grads are freed on the
    // stream that read them (the copies are handed to the closure, so a deferred run still has them).
    std::vector<Tensor> copies;
    for (size_t i = 0; i < params_.size(); ++i)
      if (params_[i].main_grad.dtype() != DType::kFloat32) copies.push_back(std::move(grads_[i]));
    overlap_->end([zero = zero_after_, copies = std::move(copies)]() mutable {
      for (Tensor& z : zero) z.zero_();
      copies.clear();
    });
    grads_zeroed_ = !zero_after_.empty();
    return r;
  }
  ops::adam_step_multi(device, ap);
  ops::adam_step_multi(host, ap);
  return r;
}

}  // namespace megatron::optimizer
