// Pipeline schedules (Megatron's megatron/core/pipeline_parallel/schedules.py; docs/megatron-reference.md#pipeline-schedules).
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

namespace megatron::pipeline_parallel {

/// A rank's share of an interleaved pipeline: `vp` model chunks; chunk c on pipeline rank r is
/// model stage c*PP + r (Megatron's virtual pipeline layout).
class VirtualPipelineStage {
 public:
  virtual ~VirtualPipelineStage() = default;
  /// As PipelineStage::forward_step for chunk `chunk` (input undefined on rank 0 / chunk 0; the
  /// last rank's last chunk returns the loss).
  virtual Tensor forward_step(int chunk, int microbatch, const Tensor& input) = 0;
  /// As PipelineStage::backward_step (output_grad undefined on the last rank's last chunk;
  /// returns undefined on rank 0 / chunk 0).
  virtual Tensor backward_step(int chunk, int microbatch, const Tensor& output_grad) = 0;
};

/// Megatron's get_schedule_table: (microbatch, chunk) in forward order; micro-batches go in
/// groups of `group_size` (microbatch_group_size_per_vp_stage), each group through chunk 0, 1, ...
std::vector<std::pair<int, int>> get_schedule_table(int num_microbatches, int num_chunks, int group_size);

/// Megatron's checks of microbatch_group_size_per_vp_stage G for PP = pp_size and M micro-batches:
/// throws UserError unless PP <= G <= M and the last group (M mod G) is 0 or >= PP.
void check_microbatch_group_size(int pp_size, int num_microbatches, int group_size);

/// The interleaved (virtual pipeline) schedule, Megatron's forward_backward_pipelining_with_interleaving
/// with batched p2p (no --overlap-p2p-communication): the order of forward/backward steps
/// (schedule table; warm-up = (PP - rank - 1)*2 + (VP - 1)*G capped at M*VP; steady 1F1B;
/// cool-down) and the communication are Megatron's: after each step one exchange sends that
/// step's output / input gradient and receives the tensors the next steps need (the first input
/// before the warm-up; its recv_tensor_from_previous_stage decides whether and for which chunk).
/// All sends and receives of a step are posted together and waited for before the next step, so
/// the schedule is deadlock-free also on NCCL, whose sends wait for the matching receive.
/// Activations travel on one subgroup of the pipeline group and gradients on another, so messages
/// (which match in posting order between two ranks of a communicator) pair up per direction: with
/// PP = 2 both directions go to the same peer, and Megatron's single batch (send_prev, recv_prev,
/// send_next, recv_next) would pair a rank's gradient send with the peer's activation receive --
/// why Megatron refuses PP = 2 with the interleaved schedule unless p2p overlap is on.
class InterleavedPipeline {
 public:
  /// Collective over pp_group (creates the two traffic subgroups). `shape`/`dtype`/`device`:
  /// every tensor exchanged (CUDA tensors on the NCCL backend).
  InterleavedPipeline(std::shared_ptr<comm::ProcessGroup> pp_group, Shape shape, DType dtype,
                      Device device = Device::cpu());
  /// group_size 0 = PP (Megatron's default). Throws UserError (Megatron's checks) when
  /// group_size is outside [PP, M] or the last group has 0 < size < PP micro-batches.
  /// Returns the micro-batch losses on the last rank (empty elsewhere), in schedule order.
  std::vector<Tensor> run(VirtualPipelineStage& stage, int num_microbatches, int vp, int group_size = 0,
                          bool forward_only = false);

 private:
  std::shared_ptr<comm::ProcessGroup> pp_, fwd_, bwd_;
  Shape shape_;
  DType dtype_;
  Device device_;
};

}  // namespace megatron::pipeline_parallel
