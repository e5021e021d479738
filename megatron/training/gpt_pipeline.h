// Pipeline-parallel driver of pretrain_gpt: GPTModel chunks of this pipeline rank run by
// Megatron's schedules (megatron/core/pipeline_parallel/schedules.py: 1F1B
// forward_backward_pipelining_without_interleaving, and the interleaved schedule with
// virtual pipeline stages). Every stage reads the same micro-batches from its data iterator
// (the first stage uses the tokens, the last the labels and loss mask); activations
// [s/(TP if SP), mbs, h] travel between stages; the loss is computed on the last stage.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/training/training.h"

namespace megatron::training {

/// One model chunk of a pipeline rank: the decoder layers it holds and whether it is the
/// first (embedding) / last (final norm, output layer, loss) model stage.
struct PipelineChunk {
  int64_t layer_offset = 0;
  int64_t num_layers = 0;
  bool pre_process = true;
  bool post_process = true;
};

/// Megatron's layer split (get_num_layers_to_build / get_transformer_layer_offset in
/// megatron/core/transformer/transformer_{block,layer}.py). Even: the model has PP·VP stages of
/// num_layers/(PP·VP) layers; chunk c of pipeline rank r is model stage c·PP + r (VP = 1: rank r
/// holds layers [r·L/PP, (r+1)·L/PP)). Uneven (--decoder-first-pipeline-num-layers F,
/// --decoder-last-pipeline-num-layers La, either or both): the first / last pipeline rank holds F /
/// La layers, the other ranks split the rest evenly; with VP every rank's count is split evenly
/// over its chunks and chunk c starts at c·(F + M + La)/VP plus the earlier ranks' shares.
/// Throws UserError (naming the flags) when a count does not divide as required.
std::vector<PipelineChunk> pipeline_chunks(int64_t num_layers, int pp_size, int pp_rank, int vp_size,
                                           std::optional<int64_t> first_stage_layers = std::nullopt,
                                           std::optional<int64_t> last_stage_layers = std::nullopt);

/// Runs one global batch through the schedule on this rank's chunks.
class GPTPipeline {
 public:
  /// `chunks` (one per virtual stage, chunk order) stay owned by the caller. `p2p_shape` =
  /// [s/(TP if SP), mbs, h], `dtype` the model dtype. `vp_size` > 1 selects the interleaved
  /// schedule (needs num_microbatches >= PP; Megatron's checks raise UserError). Collective
  /// over pp_group (the interleaved schedule creates its traffic subgroups).
  /// `microbatch_group_size`: --microbatch-group-size-per-virtual-pipeline-stage (0 = PP; UserError
  /// unless Megatron's checks pass, see check_microbatch_group_size).
  GPTPipeline(std::vector<models::gpt::GPTModel*> chunks, std::shared_ptr<comm::ProcessGroup> pp_group,
              Shape p2p_shape, DType dtype, Device device, int64_t num_microbatches, bool calculate_per_token_loss,
              int64_t microbatch_group_size = 0);
  ~GPTPipeline();

  /// --overlap-grad-reduce: called (per chunk) during the LAST micro-batch's backward with the
  /// parameters whose gradients are complete (DistributedDataParallel::register_grad_ready).
  void set_grad_ready(size_t chunk, models::gpt::GPTModel::GradReadyHook hook);
  /// TrainingHooks::microbatch_loss_tokens (context parallelism): the token count that divides a
  /// micro-batch's loss in the backward seed, from this rank's Σ(loss_mask). Unset = max(Σ, 1).
  /// Called on the last stage, once per micro-batch, in micro-batch order.
  void set_microbatch_loss_tokens(std::function<double(double)> fn);

  /// TrainingHooks::forward_backward: reads num_microbatches batches from `data` (nullopt if it
  /// runs out), runs them forward (and backward unless forward_only; dL/dloss = loss_mask ·
  /// loss_scale / (Σmask · M), or loss_mask · loss_scale with --calculate-per-token-loss) and
  /// returns this rank's Σ(loss·mask), Σ(mask) -- zero on ranks without the last model stage.
  std::optional<LossReport> forward_backward(BatchIterator& data, bool forward_only, double loss_scale);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace megatron::training
