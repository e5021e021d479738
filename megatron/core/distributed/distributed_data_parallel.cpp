#include "megatron/core/distributed/distributed_data_parallel.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "megatron/core/ops/ops.h"

namespace megatron::distributed {

struct DistributedDataParallel::BucketState {
  size_t ready = 0;
  std::unique_ptr<Work> grad_work, param_work;
  Tensor staging;  // padded copy when the bucket does not split evenly
};

DistributedDataParallel::DistributedDataParallel(const DistributedDataParallelConfig& config, ParamAndGradBuffer& buffers,
                                                 std::vector<transformer::Parameter>& params,
                                                 std::shared_ptr<ProcessGroup> dp_group)
    : config_(config), buffers_(buffers), params_(params), dp_group_(std::move(dp_group)) {
  MEGATRON_CHECK(dp_group_) << "null data-parallel group";
  if (config_.overlap_param_gather && !config_.use_distributed_optimizer)
    user_error("--overlap-param-gather requires --use-distributed-optimizer");
  if (config_.bucket_size && *config_.bucket_size <= 0) user_error("--ddp-bucket-size must be positive");
  const int dp = dp_group_->size();
  std::optional<int64_t> bucket_size = config_.bucket_size;
  if (!bucket_size && config_.overlap_grad_reduce) bucket_size = std::max<int64_t>(40000000, 1000000LL * dp);

  std::vector<size_t> order(params_.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return buffers_.range(a).first < buffers_.range(b).first; });
  bucket_of_param_.assign(params_.size(), 0);
  Bucket cur;
  bool open = false;
  const bool own_bucket = config_.use_distributed_optimizer && config_.shared_embedding_own_bucket;
  for (size_t i : order) {
    auto [s, e] = buffers_.range(i);
    const bool alone = own_bucket && (params_[i].shared || params_[i].name == "embedding.word_embeddings.weight");
    if (alone && open) {
      buckets_.push_back(cur);
      open = false;
    }
    if (!open) {
      cur = Bucket{};
      cur.start = s;
      open = true;
    }
    MEGATRON_CHECK(s == (cur.params.empty() ? cur.start : cur.end)) << "grad buffer not contiguous at param " << i;
    cur.end = e;
    cur.params.push_back(i);
    bucket_of_param_[i] = buckets_.size();
    if (alone || (bucket_size && cur.end - cur.start >= *bucket_size)) {
      buckets_.push_back(cur);
      open = false;
    }
  }
  if (open) buckets_.push_back(cur);
  const int r = dp_group_->rank();
  for (auto& b : buckets_) {
    const int64_t n = b.end - b.start;
    b.slice = (n + dp - 1) / dp;
    b.shard_start = std::min(b.end, b.start + r * b.slice);
    b.shard_end = std::min(b.end, b.start + (r + 1) * b.slice);
  }
  for (size_t k = 0; k < buckets_.size(); ++k) state_.push_back(std::make_unique<BucketState>());
}

DistributedDataParallel::~DistributedDataParallel() {
  for (auto& s : state_) {
    try {
      if (s->grad_work) s->grad_work->wait();
      if (s->param_work) s->param_work->wait();
    } catch (...) {
    }
  }
}

void DistributedDataParallel::zero_grad_buffer() {
  for (size_t k = 0; k < buckets_.size(); ++k) {
    if (state_[k]->grad_work) state_[k]->grad_work->wait();
    state_[k]->grad_work.reset();
    state_[k]->ready = 0;
  }
  buffers_.grad_data().zero_();
}

void DistributedDataParallel::register_grad_ready(size_t i) {
  MEGATRON_CHECK(i < params_.size()) << "param index " << i;
  if (!config_.overlap_grad_reduce) return;
  const size_t k = bucket_of_param_[i];
  auto& st = *state_[k];
  MEGATRON_CHECK(!st.grad_work) << "parameter " << params_[i].name << " reported ready after its bucket was launched";
  if (++st.ready == buckets_[k].params.size()) launch(k);
}

void DistributedDataParallel::launch(size_t k) {
  auto& b = buckets_[k];
  auto& st = *state_[k];
  if (st.grad_work) return;
  const int dp = dp_group_->size();
  Tensor g = buffers_.grad_data().flat_slice(b.start, {b.end - b.start});
  ReduceOp op = ReduceOp::kSum;
  if (dp > 1 && !config_.calculate_per_token_loss) {
    if (config_.average_in_collective)
      op = ReduceOp::kAvg;
    else
      ops::scale_(g, 1.0f / static_cast<float>(dp));
  }
  if (!config_.use_distributed_optimizer) {
    st.grad_work = dp_group_->all_reduce(g, op, /*async=*/true);
    return;
  }
  const int64_t n = b.end - b.start;
  if (b.slice * dp == n) {
    Tensor out = g.flat_slice(b.shard_start - b.start, {b.slice});
    st.grad_work = dp_group_->reduce_scatter(g, out, op, /*async=*/true);
  } else {
    // Pad to slice*DP in a staging copy; finish_grad_sync copies this rank's slice back.
    st.staging = Tensor::zeros({b.slice * dp}, g.dtype(), g.device());
    st.staging.flat_slice(0, {n}).copy_(g);
    Tensor out = st.staging.flat_slice(dp_group_->rank() * b.slice, {b.slice});
    st.grad_work = dp_group_->reduce_scatter(st.staging, out, op, /*async=*/true);
  }
}

void DistributedDataParallel::start_grad_sync() {
  for (size_t k = 0; k < buckets_.size(); ++k) launch(k);
}

void DistributedDataParallel::finish_grad_sync() {
  for (size_t k = 0; k < buckets_.size(); ++k) {
    auto& st = *state_[k];
    if (!st.grad_work) {
      if (config_.overlap_grad_reduce && !warned_) {
        std::fprintf(stderr,
                     "warning: --overlap-grad-reduce: gradient bucket %zu was not reported complete during backward; "
                     "reducing it after backward (no overlap)\n",
                     k);
        warned_ = true;
      }
      launch(k);
    }
    st.grad_work->wait();
    if (st.staging.defined()) {
      auto& b = buckets_[k];
      const int64_t len = b.shard_end - b.shard_start;
      if (len > 0)
        buffers_.grad_data().flat_slice(b.shard_start, {len}).copy_(
            st.staging.flat_slice(dp_group_->rank() * b.slice, {len}));
      st.staging = Tensor();
    }
    st.grad_work.reset();
    st.ready = 0;
  }
}

void DistributedDataParallel::start_param_sync() {
  MEGATRON_CHECK(config_.use_distributed_optimizer) << "start_param_sync without the distributed optimizer";
  const int dp = dp_group_->size();
  for (size_t k = 0; k < buckets_.size(); ++k) {
    auto& b = buckets_[k];
    auto& st = *state_[k];
    if (st.param_work) st.param_work->wait();
    const int64_t n = b.end - b.start;
    Tensor p = buffers_.param_data().flat_slice(b.start, {n});
    if (b.slice * dp == n) {
      Tensor mine = p.flat_slice(b.shard_start - b.start, {b.slice});
      st.param_work = dp_group_->all_gather(mine, p, /*async=*/true);
    } else {
      Tensor staging = Tensor::zeros({b.slice * dp}, p.dtype(), p.device());
      const int64_t len = b.shard_end - b.shard_start;
      if (len > 0) staging.flat_slice(dp_group_->rank() * b.slice, {len}).copy_(p.flat_slice(b.shard_start - b.start, {len}));
      Tensor mine = staging.flat_slice(dp_group_->rank() * b.slice, {b.slice});
      st.param_work = dp_group_->all_gather(mine, staging, /*async=*/false);
      p.copy_(staging.flat_slice(0, {n}));
      st.param_work.reset();
    }
  }
  if (!config_.overlap_param_gather) finish_param_sync();
}

void DistributedDataParallel::finish_param_sync() {
  for (size_t k = 0; k < buckets_.size(); ++k) wait_param(k);
}

void DistributedDataParallel::wait_param(size_t k) {
  auto& st = *state_[k];
  if (st.param_work) st.param_work->wait();
  st.param_work.reset();
}

void finalize_model_grads(std::vector<DistributedDataParallel*> chunks, const FinalizeGroups& g, Tensor* num_tokens) {
  for (auto* c : chunks) c->finish_grad_sync();
  if (g.sequence_parallel && g.tp_group && g.tp_group->size() > 1) {
    // Norm weights saw only this rank's sequence shard: sum their grads over TP (one
    // coalesced all-reduce, as Megatron's _allreduce_non_tensor_model_parallel_grads).
    std::vector<Tensor> grads;
    int64_t n = 0;
    for (auto* c : chunks)
      for (auto& p : c->parameters())
        if (p.sequence_parallel) {
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
      for (auto& p : c->parameters())
        if (p.name == "embedding.word_embeddings.weight" || p.shared) g.embedding_group->all_reduce(p.main_grad);
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
