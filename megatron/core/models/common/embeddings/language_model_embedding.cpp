#include "megatron/core/models/common/embeddings/language_model_embedding.h"

#include "megatron/core/ops/ops.h"
#include "megatron/core/tensor_parallel/mappings.h"
#include "megatron/core/transformer/transformer_layer.h"

namespace megatron::models::common {

using transformer::PositionEmbeddingType;

LanguageModelEmbedding::LanguageModelEmbedding(ParamRegistry& reg,
                                               const transformer::TransformerConfig& config, int64_t vocab_size,
                                               int64_t max_sequence_length, const tensor_parallel::TPContext& tp)
    : config_(config), tp_(tp) {
  word_embeddings_ = std::make_unique<tensor_parallel::VocabParallelEmbedding>(
      reg, "embedding.word_embeddings.weight", vocab_size, config.hidden_size, config.init_method_std, tp);
  if (config.position_embedding_type == PositionEmbeddingType::kLearnedAbsolute) {
    Parameter p;
    p.name = "embedding.position_embeddings.weight";
    p.global_shape = {max_sequence_length, config.hidden_size};
    p.init = InitKind::kNormal;
    p.init_std = config.init_method_std;
    position_embeddings_ = ParamRef(&reg, reg.add(std::move(p), {max_sequence_length, config.hidden_size}));
  }
}

Tensor LanguageModelEmbedding::forward(const Tensor& ids, const Tensor& position_ids, transformer::ForwardContext& fc,
                                       EmbeddingCtx& ctx) const {
  ctx.ids = ids;
  ctx.position_ids = position_ids;
  Tensor emb = word_embeddings_->forward(ids);
  if (position_embeddings_.defined()) {
    Tensor pos = Tensor::empty(emb.shape(), emb.dtype(), emb.device());
    ops::embedding_forward(position_ids, position_embeddings_.data(), pos, 0);
    ops::add_(emb, pos);
  }
  // --sequence-parallel: this rank keeps its 1/TP of the sequence (Megatron's
  // scatter_to_sequence_parallel_region), and the dropout runs in the TP-RNG fork.
  const bool sp = tp_.sequence_parallel && tp_.size() > 1;
  if (sp) emb = tensor_parallel::split_along_first_dim(emb, *tp_.group);
  ctx.dropout_p = config_.hidden_dropout;
  if (fc.training && ctx.dropout_p > 0.0f) {
    Tensor out = Tensor::empty(emb.shape(), emb.dtype(), emb.device());
    ctx.dropout_mask = Tensor::empty(emb.shape(), DType::kUInt8, emb.device());
    ops::dropout_forward(emb, out, ctx.dropout_mask, ctx.dropout_p, sp ? fc.tp_seed : fc.seed, fc.next_offset());
    return out;
  }
  ctx.dropout_mask = Tensor();
  return emb;
}

void LanguageModelEmbedding::backward(const Tensor& dy, const EmbeddingCtx& ctx) const {
  Tensor d = transformer::dropout_add_backward(dy, ctx.dropout_mask, ctx.dropout_p);
  if (tp_.sequence_parallel && tp_.size() > 1) d = tensor_parallel::gather_along_first_dim(d, *tp_.group);
  word_embeddings_->backward(d, ctx.ids);
  if (position_embeddings_.defined()) ops::embedding_backward(d, ctx.position_ids, position_embeddings_.grad(), 0);
}

}  // namespace megatron::models::common
