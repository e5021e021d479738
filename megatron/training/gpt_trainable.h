// GPTModel seen through the training loop's TrainableModel interface.
#pragma once

#include <memory>
#include <vector>

#include "megatron/core/comm/process_group.h"

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
  void set_mtp_loss_scale(double scale) override { m_.set_mtp_loss_scale(scale); }
  /// Multi-token prediction: `loss_chunk` = the model chunk that holds the MTP modules (the last
  /// one of this pipeline rank; default the wrapped model), `avg_group` = the data-parallel group
  /// with context parallelism, over which take_mtp_metrics averages the losses and sums the
  /// counts (Megatron's avg_group; nullptr or size 1 = none).
  void set_mtp(megatron::models::gpt::GPTModel* loss_chunk, std::shared_ptr<comm::ProcessGroup> avg_group) {
    mtp_model_ = loss_chunk;
    mtp_group_ = std::move(avg_group);
  }
  std::vector<MtpStepMetrics> take_mtp_metrics() override {
    auto m = (mtp_model_ ? *mtp_model_ : m_).take_mtp_metrics();
    std::vector<MtpStepMetrics> out(m.size());
    if (m.empty()) return out;
    Tensor t = Tensor::empty({static_cast<int64_t>(3 * m.size())}, DType::kFloat64);
    double* p = t.data<double>();
    for (size_t i = 0; i < m.size(); ++i) {
      p[3 * i] = m[i].loss;
      p[3 * i + 1] = m[i].correct;
      p[3 * i + 2] = m[i].total;
    }
    const int n = mtp_group_ ? mtp_group_->size() : 1;
    if (n > 1) mtp_group_->all_reduce(t, comm::ReduceOp::kSum);
    for (size_t i = 0; i < m.size(); ++i) out[i] = {p[3 * i] / n, p[3 * i + 1], p[3 * i + 2]};
    return out;
  }
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
  megatron::models::gpt::GPTModel* mtp_model_ = nullptr;
  std::shared_ptr<comm::ProcessGroup> mtp_group_;
  megatron::models::gpt::GPTModel::GradReadyHook hook_;
  int64_t num_microbatches_ = 0, backwards_ = 0;
};

}  // namespace megatron::training
