#include "megatron/core/distributed/finalize_model_grads.h"

#include "megatron/core/ops/ops.h"

namespace megatron::distributed {

void finalize_model_grads(std::vector<DistributedDataParallel*> chunks, const FinalizeGroups& g, Tensor* num_tokens) {
  for (auto* c : chunks) c->finish_grad_sync();
  if (g.tp_group && g.tp_group->size() > 1) {
    // Norm weights saw only this rank's sequence shard: sum their grads over TP (one
    // coalesced all-reduce, as Megatron's _allreduce_non_tensor_model_parallel_grads).
    std::vector<Tensor> grads;
    int64_t n = 0;
    for (auto* c : chunks)
      for (size_t i = 0; i < c->parameters().size(); ++i)
        if (auto& p = c->parameters()[i]; c->holds(i) && p.sequence_parallel) {
          grads.push_back(p.main_grad);
          n += p.main_grad.numel();
        }
    if (n > 0) {
      Tensor flat = Tensor::empty({n}, grads.front().dtype(), grads.front().device());
      int64_t off = 0;
      for (auto& t : grads) {
        flat.flat_slice(off, {t.numel()}).copy_(t.view({t.numel()}));
        off += t.numel();
      }
      g.tp_group->all_reduce(flat);
      off = 0;
      for (auto& t : grads) {
        t.view({t.numel()}).copy_(flat.flat_slice(off, {t.numel()}));
        off += t.numel();
      }
    }
  }
  if (g.embedding_group && g.embedding_group->size() > 1 && g.share_embeddings_and_output_weights) {
    // First stage holds the word embedding, the last stage its shared copy (output layer).
    for (auto* c : chunks)
      for (size_t i = 0; i < c->parameters().size(); ++i)
        if (auto& p = c->parameters()[i]; c->holds(i) && (p.name == "embedding.word_embeddings.weight" || p.shared))
          g.embedding_group->all_reduce(p.main_grad);
  }
  if (num_tokens) {
    MEGATRON_CHECK(num_tokens->numel() == 1) << "num_tokens must be a scalar";
    if (g.pp_group && g.pp_group->size() > 1) g.pp_group->broadcast(*num_tokens, g.pp_group->size() - 1);
    if (g.dp_group && g.dp_group->size() > 1) g.dp_group->all_reduce(*num_tokens);
    const double n = num_tokens->to(DType::kFloat64).item();
    if (n > 0)
      for (auto* c : chunks) ops::scale_(c->grad_buffer(), static_cast<float>(1.0 / n));
  }
}

}  // namespace megatron::distributed
