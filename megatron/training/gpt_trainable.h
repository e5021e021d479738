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
  void backward(const Tensor& dloss) override { m_.backward(dloss); }
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
};

}  // namespace megatron::training
