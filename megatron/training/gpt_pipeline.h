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

#include "megatron/core/distributed/process_group.h"
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

/// Megatron's layer split (TransformerBlock's get_num_layers_to_build / layer offset): with
/// PP stages and VP virtual stages per rank, the model has PP·VP stages of
/// num_layers/(PP·VP) layers each; chunk c of pipeline rank r is model stage c·PP + r
/// (VP = 1: stage r holds layers [r·L/PP, (r+1)·L/PP)). Throws UserError when num_layers is
/// not divisible by PP·VP (naming --num-layers and the pipeline flags).
std::vector<PipelineChunk> pipeline_chunks(int64_t num_layers, int pp_size, int pp_rank, int vp_size);

/// Runs one global batch through the schedule on this rank's chunks.
class GPTPipeline {
 public:
  /// `chunks` (one per virtual stage, chunk order) stay owned by the caller. `p2p_shape` =
  /// [s/(TP if SP), mbs, h], `dtype` the model dtype. `vp_size` > 1 selects the interleaved
  /// schedule (needs num_microbatches >= PP; Megatron's checks raise UserError). Collective
  /// over pp_group (the interleaved schedule creates its traffic subgroups).
  GPTPipeline(std::vector<models::gpt::GPTModel*> chunks, std::shared_ptr<distributed::ProcessGroup> pp_group,
              Shape p2p_shape, DType dtype, Device device, int64_t num_microbatches, bool calculate_per_token_loss);
  ~GPTPipeline();

  /// --overlap-grad-reduce: called (per chunk) during the LAST micro-batch's backward with the
  /// parameters whose gradients are complete (DistributedDataParallel::register_grad_ready).
  void set_grad_ready(size_t chunk, models::gpt::GPTModel::GradReadyHook hook);
  /// Context parallelism: the token count a micro-batch's loss is normalised by, from this
  /// rank's Σ(loss_mask) (TrainingHooks::microbatch_loss_tokens; unset = max(Σmask, 1)).
  /// Called on the last stage during backward, in schedule order (collective over CP).
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
