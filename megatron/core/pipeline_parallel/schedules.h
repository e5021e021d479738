// Pipeline schedules (Megatron's megatron/core/pipeline_parallel/schedules.py; megatron.md §9.4).
//
// The model side is a PipelineStage: it runs one micro-batch forward or backward on this rank's
// stage and keeps the activations of every in-flight micro-batch itself. The schedule decides the
// order and moves activations/gradients between stages (P2PCommunicator).
#pragma once

#include <vector>

#include "megatron/core/pipeline_parallel/p2p_communication.h"

namespace megatron::pipeline_parallel {

class PipelineStage {
 public:
  virtual ~PipelineStage() = default;
  /// Forward of micro-batch `microbatch`. `input` is the previous stage's output (undefined on
  /// the first stage, which reads its own data). Returns the activation to send on, or on the
  /// last stage the micro-batch loss (a 1-element float32 tensor, already divided by the number
  /// of micro-batches as Megatron's loss_func does).
  virtual Tensor forward_step(int microbatch, const Tensor& input) = 0;
  /// Backward of micro-batch `microbatch` (called in the same micro-batch order as forward).
  /// `output_grad` is the gradient of the forward output (undefined on the last stage, which
  /// starts from its loss). Accumulates parameter grads; returns the gradient of `input`
  /// (undefined on the first stage).
  virtual Tensor backward_step(int microbatch, const Tensor& output_grad) = 0;
};

/// No pipelining (PP = 1): forward then backward of each micro-batch. Returns the losses.
std::vector<Tensor> forward_backward_no_pipelining(PipelineStage& stage, int num_microbatches, bool forward_only = false);

/// 1F1B: warm-up forwards min(PP - rank - 1, M), steady one-forward-one-backward, cool-down
/// backwards. Returns the micro-batch losses on the last stage (empty elsewhere).
std::vector<Tensor> forward_backward_pipelining_without_interleaving(PipelineStage& stage, int num_microbatches,
                                                                     P2PCommunicator& p2p, bool forward_only = false);

}  // namespace megatron::pipeline_parallel
