// OptimizerConfig: Megatron's megatron/core/optimizer/optimizer_config.py fields used here.
#pragma once

#include <optional>
#include <string>

namespace megatron::optimizer {

/// Optimizer settings with Megatron's field names and defaults (docs/megatron-reference.md#optimizer-defaults).
struct OptimizerConfig {
  std::string optimizer = "adam";  // adam (decoupled weight decay by default) | sgd
  double lr = 0.0;                 // max lr (the scheduler overwrites the group lr every step)
  double min_lr = 0.0;
  std::optional<double> decoupled_lr;      // lr of embedding/output weights
  std::optional<double> decoupled_min_lr;
  double weight_decay = 0.01;
  bool decoupled_weight_decay = true;      // AdamW; false = L2 folded into the gradient
  bool fp16 = false;
  bool bf16 = false;
  std::optional<double> loss_scale;        // constant scaler when set (fp16)
  double initial_loss_scale = 4294967296.0;
  double min_loss_scale = 1.0;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  double sgd_momentum = 0.9;
  bool use_distributed_optimizer = false;
  double clip_grad = 1.0;                  // <= 0 disables clipping
  bool log_num_zeros_in_grad = false;
};

}  // namespace megatron::optimizer
