// Megatron's pretraining sampler and data loader (megatron/training/datasets/data_samplers.py),
// yielding GPTBatch micro-batches from a background prefetch thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "megatron/core/datasets/gpt_batch.h"
#include "megatron/core/datasets/megatron_dataset.h"

namespace megatron::training {

/// MegatronPretrainingSampler (--dataloader-type single): global indices consumed_samples,
/// consumed_samples+1, ... < total_samples are grouped in chunks of micro_batch_size *
/// data_parallel_size; rank r gets the slice [r*mbs, (r+1)*mbs) of each chunk; an incomplete
/// last chunk is dropped (unless drop_last=false, then the rank's slice of it, possibly short
/// or empty, is yielded as Python does). Throws UserError on Megatron's sanity checks
/// (no samples, consumed >= total, mbs <= 0, rank >= size).
class MegatronPretrainingSampler {
 public:
  MegatronPretrainingSampler(int64_t total_samples, int64_t consumed_samples, int64_t micro_batch_size,
                             int64_t data_parallel_rank, int64_t data_parallel_size, bool drop_last = true);
  /// Next micro-batch of dataset indices for this rank; false when exhausted.
  bool next(std::vector<int64_t>& indices);
  /// Restart from the constructor's consumed_samples (a new Python __iter__).
  void reset() { pos_ = consumed_samples_; }

 private:
  int64_t total_samples_, consumed_samples_, micro_batch_size_, rank_, chunk_;
  bool drop_last_;
  int64_t pos_;
};

/// Loader options (Megatron's args of the same meaning).
struct DataLoaderOptions {
  int64_t micro_batch_size = 1;    ///< --micro-batch-size (or --eval-micro-batch-size)
  int64_t data_parallel_rank = 0;
  int64_t data_parallel_size = 1;
  int64_t consumed_samples = 0;    ///< resume point (consumed_train_samples of the checkpoint)
  int num_workers = 2;             ///< --num-workers: prefetch depth = max(2, 2 * num_workers)
  /// Build GPTBatch::attention_mask ([b,1,s,s] uint8). Leave false for the plain causal mask
  /// (set it with --reset-attention-mask and the dataloader mask enabled).
  bool attention_mask = false;
  bool cyclic = false;             ///< restart at the end (Megatron's cyclic_iter for valid/test)
  bool drop_last = true;
};

/// Iterates a dataset in MegatronPretrainingSampler order, collating each rank's micro-batch into a
/// CPU GPTBatch on a background thread. Errors from the dataset are rethrown by next().
class GPTDataLoader {
 public:
  GPTDataLoader(std::shared_ptr<const datasets::TopLevelDataset> dataset, DataLoaderOptions opts);
  ~GPTDataLoader();
  GPTDataLoader(const GPTDataLoader&) = delete;
  GPTDataLoader& operator=(const GPTDataLoader&) = delete;

  /// Next micro-batch (tokens/labels/position_ids int64 [b,s], loss_mask float32 [b,s],
  /// attention_mask uint8 [b,1,s,s] when requested). False when the sampler is exhausted.
  bool next(datasets::GPTBatch& batch);
  /// Dataset samples this rank has received so far plus the resume point, counted globally
  /// (consumed_samples + batches * mbs * dp).
  int64_t consumed_samples() const { return consumed_; }

  /// Collates samples [indices] of `ds` into a batch (synchronous; used by the thread).
  static datasets::GPTBatch collate(const datasets::TopLevelDataset& ds, const std::vector<int64_t>& indices,
                                    bool attention_mask);

 private:
  void run();
  std::shared_ptr<const datasets::TopLevelDataset> dataset_;
  DataLoaderOptions opts_;
  MegatronPretrainingSampler sampler_;
  size_t depth_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<datasets::GPTBatch> queue_;
  bool done_ = false;
  bool stop_ = false;
  std::exception_ptr error_;
  int64_t consumed_;
  std::thread thread_;
};

/// build_pretraining_data_loader: nullptr for a null or empty dataset, else a loader.
std::unique_ptr<GPTDataLoader> build_pretraining_data_loader(
    std::shared_ptr<const datasets::TopLevelDataset> dataset, DataLoaderOptions opts);

}  // namespace megatron::training
