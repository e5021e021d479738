#include "megatron/core/distributed/distributed_data_parallel.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "megatron/core/fp8/fp8_param.h"
#include "megatron/core/ops/ops.h"

namespace megatron::distributed {

struct DistributedDataParallel::BucketState {
  size_t ready = 0;
  std::unique_ptr<comm::Work> grad_work, param_work;
  Tensor staging;  // padded copy when the bucket does not split evenly
  bool fp8_pending = false;  // FP8 bytes gathered (or in flight), post-processing not done yet
};

DistributedDataParallel::DistributedDataParallel(const DistributedDataParallelConfig& config, ParamAndGradBuffer& buffers,
                                                 std::vector<Parameter>& params,
                                                 std::shared_ptr<comm::ProcessGroup> dp_group,
                                                 std::optional<int> expert_dp_cp_size)
    : config_(config), buffers_(buffers), params_(params), dp_group_(std::move(dp_group)),
      expert_dp_cp_size_(expert_dp_cp_size) {
  MEGATRON_CHECK(dp_group_) << "null data-parallel group";
  MEGATRON_CHECK(!expert_dp_cp_size_ || *expert_dp_cp_size_ >= 1) << "expert buffer: dp-cp size " << *expert_dp_cp_size_;
  if (config_.overlap_param_gather && !config_.use_distributed_optimizer)
    user_error("--overlap-param-gather requires --use-distributed-optimizer");
  if (config_.bucket_size && *config_.bucket_size <= 0) user_error("--ddp-bucket-size must be positive");
  const int dp = dp_group_->size();
  std::optional<int64_t> bucket_size = config_.bucket_size;
  if (!bucket_size && config_.overlap_grad_reduce) bucket_size = std::max<int64_t>(40000000, 1000000LL * dp);

  std::vector<size_t> order;
  for (size_t i = 0; i < params_.size(); ++i)
    if (buffers_.has(i)) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return buffers_.range(a).first < buffers_.range(b).first; });
  bucket_of_param_.assign(params_.size(), 0);
  Bucket cur;
  bool open = false;
  const bool own_bucket = config_.use_distributed_optimizer && config_.shared_embedding_own_bucket;
  for (size_t i : order) {
    auto [s, e] = buffers_.range(i);
    const bool alone = own_bucket && (params_[i].shared || params_[i].name == "embedding.word_embeddings.weight");
    const bool fp8 = config_.use_distributed_optimizer && params_[i].fp8_data.defined();
    if ((alone || fp8 != cur.fp8) && open) {  // FP8 weights never share a bucket with other params
      buckets_.push_back(cur);
      open = false;
    }
    if (!open) {
      cur = Bucket{};
      cur.start = s;
      cur.fp8 = fp8;
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

void DistributedDataParallel::zero_grad_buffer(bool zero_data) {
  for (size_t k = 0; k < buckets_.size(); ++k) {
    if (state_[k]->grad_work) state_[k]->grad_work->wait();
    state_[k]->grad_work.reset();
    state_[k]->ready = 0;
  }
  if (zero_data) buffers_.grad_data().zero_();
}

void DistributedDataParallel::register_grad_ready(size_t i) {
  MEGATRON_CHECK(i < params_.size()) << "param index " << i;
  if (!config_.overlap_grad_reduce || !buffers_.has(i)) return;
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
  comm::ReduceOp op = comm::ReduceOp::kSum;
  if (expert_dp_cp_size_) {
    // Megatron's expert_gradient_scaling_factor (see the constructor).
    if (!config_.calculate_per_token_loss) {
      const int dp_cp = *expert_dp_cp_size_;
      const float f = config_.average_in_collective ? static_cast<float>(dp) / static_cast<float>(dp_cp)
                                                    : 1.0f / static_cast<float>(dp_cp);
      if (f != 1.0f) ops::scale_(g, f);
      if (config_.average_in_collective && dp > 1) op = comm::ReduceOp::kAvg;
    }
  } else if (dp > 1 && !config_.calculate_per_token_loss) {
    if (config_.average_in_collective)
      op = comm::ReduceOp::kAvg;
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

void DistributedDataParallel::gather_bucket(size_t k, bool fp8_bytes) {
  auto& b = buckets_[k];
  auto& st = *state_[k];
  if (st.param_work) st.param_work->wait();
  st.param_work.reset();
  const int dp = dp_group_->size();
  const int64_t n = b.end - b.start;
  Tensor p;
  if (fp8_bytes) {
    // The FP8 bytes travel as uint8 (every backend moves bytes; NCCL has no FP8 type to name).
    Tensor f = buffers_.fp8_data();
    p = Tensor::from_blob(static_cast<uint8_t*>(f.data_ptr()) + (b.start - buffers_.fp8_start()), {n}, DType::kUInt8,
                          f.device());
  } else {
    p = buffers_.model_data(b.start, n);
  }
  const int64_t bytes = b.slice * dp * static_cast<int64_t>(dtype_size(p.dtype()));
  param_gather_bytes_ += bytes;
  if (fp8_bytes) param_gather_bytes_fp8_ += bytes;
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

void DistributedDataParallel::start_param_sync() {
  MEGATRON_CHECK(config_.use_distributed_optimizer) << "start_param_sync without the distributed optimizer";
  for (size_t k = 0; k < buckets_.size(); ++k) {
    auto& b = buckets_[k];
    if (b.fp8) {
      // quantize_param_shard: this rank's elements of every FP8 weight in the bucket, from the
      // model-dtype values the optimizer wrote, into the FP8 buffer.
      for (size_t i : b.params) {
        auto& prm = params_[i];
        const auto [ps, pe] = buffers_.range(i);
        const int64_t lo = std::max(ps, b.shard_start), hi = std::min(pe, b.shard_end);
        if (lo >= hi) continue;
        // The fp32 main shard rounded to the model dtype (a temporary of the shard's size), or,
        // without a main shard held here, the model-dtype shard itself.
        Tensor src = fp8_model_dtype_shard(lo, hi);
        if (!src.defined()) src = buffers_.model_data(lo, hi - lo);
        Tensor dst = buffers_.fp8_data().flat_slice(lo - buffers_.fp8_start(), {hi - lo});
        fp8::quantize_param_shard(*prm.fp8_state, prm.fp8_base, src, dst);
      }
    }
    gather_bucket(k, b.fp8);
    state_[k]->fp8_pending = b.fp8;
  }
  if (!config_.overlap_param_gather) finish_param_sync();
}

Tensor DistributedDataParallel::fp8_main_param(int64_t start, int64_t n) {
  MEGATRON_CHECK(start >= buffers_.fp8_start() && n > 0 && !fp8_main_.count(start))
      << "fp8_main_param [" << start << ", " << start + n << ") (FP8 weights from " << buffers_.fp8_start() << ")";
  Tensor model = buffers_.model_data(start, n);
  Tensor mp = Tensor::empty({n}, DType::kFloat32, model.device());
  ops::cast(model, mp);
  fp8_main_.emplace(start, mp);
  return mp;
}

Tensor DistributedDataParallel::fp8_model_dtype_shard(int64_t lo, int64_t hi) {
  auto it = fp8_main_.find(lo);
  if (it == fp8_main_.end()) return Tensor();
  MEGATRON_CHECK(it->second.numel() == hi - lo) << "FP8 main shard at " << lo << ": " << it->second.str() << " for "
                                                << hi - lo << " elements";
  Tensor r = Tensor::empty({hi - lo}, buffers_.fp8_model_data().dtype(), it->second.device());
  ops::cast(it->second, r);
  return r;
}

// FP8 weight elements [lo, hi) of bucket b's shard, for each FP8 weight with elements there.
template <class F>
static void for_each_fp8_shard(const Bucket& b, ParamAndGradBuffer& buffers, F&& f) {
  for (size_t i : b.params) {
    const auto [ps, pe] = buffers.range(i);
    const int64_t lo = std::max(ps, b.shard_start), hi = std::min(pe, b.shard_end);
    if (lo < hi) f(lo, hi);
  }
}

void DistributedDataParallel::release_model_dtype_fp8_params() {
  if (!buffers_.fp8_model_data().defined()) return;
  finish_param_sync();
  for (const auto& b : buckets_)
    if (b.fp8)
      for_each_fp8_shard(b, buffers_, [&](int64_t lo, int64_t hi) {
        MEGATRON_CHECK(fp8_main_.count(lo)) << "release_model_dtype_fp8_params: no fp32 main shard for FP8 weight "
                                            << "elements [" << lo << ", " << hi << ")";
      });
  buffers_.release_fp8_model_data();
}

void DistributedDataParallel::gather_model_dtype_params() {
  MEGATRON_CHECK(config_.use_distributed_optimizer) << "gather_model_dtype_params without the distributed optimizer";
  finish_param_sync();
  const bool was_released = buffers_.materialize_fp8_model_data();
  for (size_t k = 0; k < buckets_.size(); ++k)
    if (buckets_[k].fp8) {
      for_each_fp8_shard(buckets_[k], buffers_, [&](int64_t lo, int64_t hi) {
        Tensor v = fp8_model_dtype_shard(lo, hi);
        MEGATRON_CHECK(v.defined() || !was_released) << "FP8 weight elements [" << lo << ", " << hi
                                                     << ") were released without an fp32 main shard";
        if (v.defined()) buffers_.model_data(lo, hi - lo).copy_(v);
      });
      gather_bucket(k, /*fp8_bytes=*/false);
      auto& st = *state_[k];
      if (st.param_work) st.param_work->wait();
      st.param_work.reset();
    }
}

void DistributedDataParallel::finish_param_sync() {
  for (size_t k = 0; k < buckets_.size(); ++k) wait_param(k);
}

void DistributedDataParallel::wait_param(size_t k) {
  auto& st = *state_[k];
  if (st.param_work) st.param_work->wait();
  st.param_work.reset();
  if (st.fp8_pending) {
    // post_all_gather_processing: the gathered FP8 weights become their linears' operands.
    st.fp8_pending = false;
    for (size_t i : buckets_[k].params) {
      auto& prm = params_[i];
      fp8::post_all_gather_processing(*prm.fp8_state, prm.fp8_base, prm.fp8_data);
    }
  }
}

}  // namespace megatron::distributed
