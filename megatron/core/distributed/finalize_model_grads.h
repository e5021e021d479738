#pragma once
// finalize_model_grads: the gradient finalization after the last backward of a step (DP sync,
// sequence-parallel and tied-embedding all-reduces, per-token-loss scaling).

#include <memory>
#include <vector>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/distributed/distributed_data_parallel.h"

namespace megatron::distributed {

/// Megatron's finalize_model_grads (megatron/core/distributed/finalize_model_grads.py):
///  1. finish the DP gradient sync of every model chunk;
///  2. sequence parallelism (TP > 1): all-reduce over `tp_group` of the grads of every parameter
///     marked `sequence_parallel` (the norms mark theirs when their TransformerConfig has
///     sequence_parallel, transformer/norm.h; the parameter attribute is the config's carrier, as
///     Megatron's `sequence_parallel` attribute);
///  3. all-reduce the word-embedding grad ("embedding.word_embeddings.weight" on the first stage,
///     the `shared` output weight on the last) over `embedding_group` (tied embeddings, PP > 1:
///     `share_embeddings_and_output_weights` is the model config's, as Megatron reads it from the
///     model; skipped when the group is null or of size 1);
///  4. with num_tokens (--calculate-per-token-loss): num_tokens is broadcast from the last pipeline
///     stage over `pp_group`, summed over `dp_group`, and every grad is scaled by 1/num_tokens.
struct FinalizeGroups {
  std::shared_ptr<comm::ProcessGroup> tp_group, pp_group, dp_group, embedding_group;
  bool share_embeddings_and_output_weights = true;
};
void finalize_model_grads(std::vector<DistributedDataParallel*> chunks, const FinalizeGroups& groups,
                          Tensor* num_tokens = nullptr);

}  // namespace megatron::distributed
