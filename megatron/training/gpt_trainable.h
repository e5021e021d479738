// GPTModel seen through the training loop's TrainableModel interface.
#pragma once

#include <vector>

#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/training/training.h"

namespace megatron::training {

/// GPTModel seen through the loop's TrainableModel interface.
class GPTTrainable final : public TrainableModel {
 public:
  explicit GPTTrainable(megatron::models::gpt::GPTModel& m) : m_(m) {}
  Tensor forward(const datasets::GPTBatch& b, bool training) override { return m_.forward(b, training); }
  void backward(const Tensor& dloss) override {
    // --overlap-grad-reduce: gradients are final in the last micro-batch's backward.
    ++backwards_;
    m_.set_grad_ready_hook(hook_ && backwards_ == num_microbatches_ ? hook_ : nullptr);
    m_.backward(dloss);
    m_.set_grad_ready_hook(nullptr);
  }
  /// --overlap-grad-reduce: `hook` gets the parameters whose gradients are complete during the
  /// backward of the num_microbatches-th micro-batch after begin_step().
  void set_grad_ready(megatron::models::gpt::GPTModel::GradReadyHook hook, int64_t num_microbatches) {
    hook_ = std::move(hook);
    num_microbatches_ = num_microbatches;
  }
  /// Start of a train step (the micro-batch count restarts).
  void begin_step() { backwards_ = 0; }
  std::vector<optimizer::OptimizerParam> optimizer_params() override {
    std::vector<optimizer::OptimizerParam> out;
    for (auto& p : m_.parameters()) {
      optimizer::OptimizerParam o;
      o.name = p.name;
      o.param = p.data;
      o.main_grad = p.main_grad;
      o.no_weight_decay = p.no_weight_decay;
      o.is_embedding_or_output = p.is_embedding_or_output;
      o.tensor_parallel = p.tensor_parallel;
      o.shared = p.shared;
      out.push_back(std::move(o));
    }
    return out;
  }

 private:
  megatron::models::gpt::GPTModel& m_;
  megatron::models::gpt::GPTModel::GradReadyHook hook_;
  int64_t num_microbatches_ = 0, backwards_ = 0;
};

}  // namespace megatron::training
