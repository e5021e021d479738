// BlendedMegatronDatasetBuilder (megatron/core/datasets/blended_megatron_dataset_builder.py) and
// the requested sample counts of megatron/training/training.py (get_train_valid_test_num_samples).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "megatron/core/datasets/blended_dataset.h"
#include "megatron/core/datasets/gpt_dataset.h"

namespace megatron::datasets {

/// Requested samples per split; nullopt = Megatron's None (one full epoch).
using SplitSizes = std::array<std::optional<int64_t>, 3>;

/// Inputs of get_train_valid_test_num_samples (Megatron's args of the same names).
struct NumSamplesArgs {
  int64_t train_iters = 0;
  std::optional<int64_t> train_samples;  ///< --train-samples
  int64_t global_batch_size = 1;
  std::optional<int64_t> eval_global_batch_size;  ///< --eval-global-batch-size (default gbs)
  int64_t eval_interval = 1000;
  int64_t eval_iters = 100;
  bool full_validation = false;
  std::optional<int64_t> start_eval_at_iter;  ///< --start-eval-at-iter
  bool skip_train = false;
};
/// docs/megatron-reference.md#sample-counts / training.py: train = train_samples or train_iters*gbs; valid =
/// max(0, train_iters // eval_interval + 1 - start_eval_at_iter // eval_interval) * eval_iters *
/// eval_gbs (eval_iters * eval_gbs with skip_train; nullopt with full_validation);
/// test = eval_iters * eval_gbs. With train_samples, train_iters = train_samples // gbs.
SplitSizes get_train_valid_test_num_samples(const NumSamplesArgs& a);

/// Builds the train/valid/test datasets of a GPTDatasetConfig (finalize() already called):
/// mock data, one prefix, a weighted or unweighted blend over --split, or per-split blends.
/// Returns one dataset per split (nullptr when the split is None or not built on this rank).
/// Rank 0 builds and writes the caches first; other ranks wait at config.distributed.barrier and
/// then read them. Throws UserError for bad input (naming the file or flag).
class BlendedMegatronDatasetBuilder {
 public:
  BlendedMegatronDatasetBuilder(SplitSizes sizes, std::function<bool()> is_built_on_rank,
                                std::shared_ptr<const GPTDatasetConfig> config);
  std::array<std::shared_ptr<TopLevelDataset>, 3> build();

 private:
  using MidLevel = std::array<std::shared_ptr<GPTDataset>, 3>;
  MidLevel build_megatron_dataset_splits(const std::optional<std::string>& path, const SplitMatrix& split,
                                         const SplitSizes& sizes, bool synchronize_ranks);
  std::vector<MidLevel> build_megatron_datasets_parallel(const std::vector<std::string>& prefixes,
                                                         const SplitMatrix& split,
                                                         const std::vector<SplitSizes>& sizes);
  std::shared_ptr<BlendedDataset> build_blended(std::vector<std::shared_ptr<GPTDataset>> ds,
                                                std::vector<double> weights, bool weights_are_int,
                                                std::optional<int64_t> size);
  void barrier();

  SplitSizes sizes_;
  std::function<bool()> is_built_on_rank_;
  std::shared_ptr<const GPTDatasetConfig> config_;
};

/// _get_size_per_split_per_dataset: [dataset][split] = ceil(ceil(target * w) * (1 + surplus)).
std::vector<SplitSizes> get_size_per_split_per_dataset(const std::vector<double>& normalized_weights,
                                                       const SplitSizes& target, double surplus = 0.0);

}  // namespace megatron::datasets
