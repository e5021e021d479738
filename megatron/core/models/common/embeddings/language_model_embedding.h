// LanguageModelEmbedding (Megatron's megatron/core/models/common/embeddings/
// language_model_embedding.py): word embedding (VocabParallelEmbedding) + learned absolute
// position embedding (when position_embedding_type == learned_absolute), then embedding
// dropout (hidden_dropout). Output sequence-first [s, b, h].
#pragma once

#include <memory>

#include "megatron/core/tensor_parallel/layers.h"
#include "megatron/core/transformer/forward_context.h"
#include "megatron/core/transformer/transformer_config.h"

namespace megatron::models::common {

struct EmbeddingCtx {
  Tensor ids, position_ids;  // [s, b] int64
  Tensor dropout_mask;
  float dropout_p = 0.0f;
};

class LanguageModelEmbedding {
 public:
  /// Registers embedding.word_embeddings.weight [V, h] (TP-sharded by rows) and
  /// embedding.position_embeddings.weight [max_sequence_length, h] (learned positions only).
  LanguageModelEmbedding(ParamRegistry& reg, const transformer::TransformerConfig& config,
                         int64_t vocab_size, int64_t max_sequence_length, const tensor_parallel::TPContext& tp);
  /// ids, position_ids int64 [s, b] -> [s, b, h].
  Tensor forward(const Tensor& ids, const Tensor& position_ids, transformer::ForwardContext& fc,
                 EmbeddingCtx& ctx) const;
  /// Accumulates the embedding gradients from dy [s, b, h] ([s/TP, b, h] with --sequence-parallel,
  /// as forward's output then).
  void backward(const Tensor& dy, const EmbeddingCtx& ctx) const;
  ParamRef word_embeddings_weight() const { return word_embeddings_->weight(); }
  int64_t vocab_start() const { return word_embeddings_->vocab_start(); }

 private:
  const transformer::TransformerConfig& config_;
  std::unique_ptr<tensor_parallel::VocabParallelEmbedding> word_embeddings_;
  ParamRef position_embeddings_;
  tensor_parallel::TPContext tp_;
};

}  // namespace megatron::models::common
