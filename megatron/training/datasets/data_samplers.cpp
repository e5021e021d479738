#include "megatron/training/datasets/data_samplers.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "megatron/core/utils/env.h"
#include "megatron/core/utils/errors.h"

namespace megatron::training {

MegatronPretrainingSampler::MegatronPretrainingSampler(int64_t total, int64_t consumed, int64_t mbs, int64_t rank,
                                                       int64_t dp, bool drop_last)
    : total_samples_(total), consumed_samples_(consumed), micro_batch_size_(mbs), rank_(rank),
      chunk_(mbs * dp), drop_last_(drop_last), pos_(consumed) {
  if (total <= 0) user_error("data loader: no sample to consume (dataset size ", total, ")");
  if (consumed >= total)
    user_error("data loader: no samples left to consume (consumed ", consumed, " of ", total,
               "); the checkpoint's consumed samples exceed the dataset: raise --train-samples/--train-iters");
  if (mbs <= 0) user_error("--micro-batch-size must be > 0");
  if (dp <= 0) user_error("data-parallel size must be > 0");
  if (rank < 0 || rank >= dp) user_error("data-parallel rank ", rank, " must be < data-parallel size ", dp);
}

bool MegatronPretrainingSampler::next(std::vector<int64_t>& out) {
  out.clear();
  const int64_t remaining = total_samples_ - pos_;
  if (remaining <= 0) return false;
  if (remaining >= chunk_) {
    for (int64_t k = 0; k < micro_batch_size_; ++k) out.push_back(pos_ + rank_ * micro_batch_size_ + k);
    pos_ += chunk_;
    return true;
  }
  pos_ = total_samples_;
  if (drop_last_) return false;
  // Python slice of the partial chunk: may be short or empty
  for (int64_t k = rank_ * micro_batch_size_; k < std::min(remaining, (rank_ + 1) * micro_batch_size_); ++k)
    out.push_back(total_samples_ - remaining + k);
  return true;
}

datasets::GPTBatch GPTDataLoader::collate(const datasets::TopLevelDataset& ds, const std::vector<int64_t>& idx,
                                          bool attention_mask) {
  datasets::GPTBatch b;
  const int64_t n = static_cast<int64_t>(idx.size());
  datasets::GPTSample smp;
  // MEGATRON_DUMP_SAMPLES=1 (docs/environment.md): one line per sample the loader fetches, for
  // diffing against Megatron-LM's samples (tests/gpu/megatron_samples.py).
  static const bool dump = env_switch("MEGATRON_DUMP_SAMPLES", false);
  for (int64_t r = 0; r < n; ++r) {
    ds.get(idx[r], smp, attention_mask);
    if (dump) {  // one write per line: the lines of several loaders and ranks stay whole
      const std::string line = datasets::sample_digest(datasets::split_name(ds.index_split()), idx[r], smp) + "\n";
      std::fwrite(line.data(), 1, line.size(), stderr);
    }
    const int64_t s = static_cast<int64_t>(smp.tokens.size());
    if (r == 0) {
      b.tokens = Tensor::empty({n, s}, DType::kInt64);
      b.labels = Tensor::empty({n, s}, DType::kInt64);
      b.loss_mask = Tensor::empty({n, s}, DType::kFloat32);
      b.position_ids = Tensor::empty({n, s}, DType::kInt64);
      if (attention_mask) {
        if (smp.attention_mask.empty())
          user_error("the attention mask was requested from the loader but the dataset does not create it "
                     "(--no-create-attention-mask-in-dataloader)");
        b.attention_mask = Tensor::empty({n, 1, s, s}, DType::kUInt8);
      }
    }
    std::memcpy(b.tokens.data<int64_t>() + r * s, smp.tokens.data(), s * 8);
    std::memcpy(b.labels.data<int64_t>() + r * s, smp.labels.data(), s * 8);
    std::memcpy(b.loss_mask.data<float>() + r * s, smp.loss_mask.data(), s * 4);
    std::memcpy(b.position_ids.data<int64_t>() + r * s, smp.position_ids.data(), s * 8);
    if (attention_mask) std::memcpy(b.attention_mask.data<uint8_t>() + r * s * s, smp.attention_mask.data(), s * s);
  }
  return b;
}

GPTDataLoader::GPTDataLoader(std::shared_ptr<const datasets::TopLevelDataset> dataset, DataLoaderOptions opts)
    : dataset_(std::move(dataset)),
      opts_(opts),
      sampler_(dataset_->size(), opts.consumed_samples, opts.micro_batch_size, opts.data_parallel_rank,
               opts.data_parallel_size, opts.drop_last),
      depth_(static_cast<size_t>(std::max(2, 2 * opts.num_workers))),
      consumed_(opts.consumed_samples) {
  thread_ = std::thread([this] { run(); });
}

GPTDataLoader::~GPTDataLoader() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void GPTDataLoader::run() {
  try {
    std::vector<int64_t> idx;
    while (true) {
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stop_ || queue_.size() < depth_; });
        if (stop_) return;
      }
      if (!sampler_.next(idx)) {
        if (opts_.cyclic) {
          sampler_.reset();
          if (!sampler_.next(idx)) break;
        } else {
          break;
        }
      }
      datasets::GPTBatch b = collate(*dataset_, idx, opts_.attention_mask);
      {
        std::lock_guard<std::mutex> l(mu_);
        queue_.push_back(std::move(b));
      }
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> l(mu_);
    error_ = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    done_ = true;
  }
  cv_.notify_all();
}

bool GPTDataLoader::next(datasets::GPTBatch& batch) {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return !queue_.empty() || done_; });
  if (queue_.empty()) {
    if (error_) std::rethrow_exception(error_);
    return false;
  }
  batch = std::move(queue_.front());
  queue_.pop_front();
  consumed_ += opts_.micro_batch_size * opts_.data_parallel_size;
  l.unlock();
  cv_.notify_all();
  return true;
}

std::unique_ptr<GPTDataLoader> build_pretraining_data_loader(std::shared_ptr<const datasets::TopLevelDataset> dataset,
                                                             DataLoaderOptions opts) {
  if (!dataset || dataset->size() == 0) return nullptr;
  return std::make_unique<GPTDataLoader>(std::move(dataset), opts);
}

}  // namespace megatron::training
