// BlendedDataset (megatron/core/datasets/blended_dataset.py): samples drawn from several
// GPTDatasets in proportion to weights, by helpers' greedy blending indices (docs/megatron-reference.md#blending).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "megatron/core/datasets/gpt_dataset.h"

namespace megatron::datasets {

class BlendedDataset final : public TopLevelDataset {
 public:
  /// datasets: same split, all non-empty. weights: > 0 each; when `weights_are_int` they are the
  /// datasets' lengths (Megatron's unweighted blend) and with size == nullopt exactly that many
  /// samples are drawn from each (exhaustive indices). With a size the weights are normalized.
  /// Throws UserError for non-positive weights, mismatched token dtypes, or a blend that would
  /// draw more samples from a dataset than it holds (raise --mid-level-dataset-surplus).
  BlendedDataset(std::vector<std::shared_ptr<GPTDataset>> datasets, std::vector<double> weights,
                 bool weights_are_int, std::optional<int64_t> size,
                 std::shared_ptr<const GPTDatasetConfig> config);

  int64_t size() const override { return dataset_index_.numel(); }
  /// The sample of datasets[dataset_index[idx]] at dataset_sample_index[idx], with dataset_id set.
  void get(int64_t idx, GPTSample& out, bool with_attention_mask = true) const override;
  using TopLevelDataset::get;
  Split index_split() const override { return split_; }
  const std::string& unique_description() const override { return description_; }
  const std::string& unique_description_hash() const override { return hash_; }

  /// int16 dataset ids and int64 per-dataset sample ids (owned after a build, mapped from the cache).
  const NpyView& dataset_index() const { return dataset_index_; }
  const NpyView& dataset_sample_index() const { return dataset_sample_index_; }
  const std::vector<std::shared_ptr<GPTDataset>>& datasets() const { return datasets_; }
  const std::vector<double>& weights() const { return weights_; }
  bool loaded_from_cache() const { return loaded_from_cache_; }

 private:
  std::vector<std::shared_ptr<GPTDataset>> datasets_;
  std::vector<double> weights_;
  bool weights_are_int_;
  std::optional<int64_t> size_;
  std::shared_ptr<const GPTDatasetConfig> config_;
  Split split_;
  std::string description_;
  std::string hash_;
  NpyView dataset_index_;
  NpyView dataset_sample_index_;
  bool loaded_from_cache_ = false;
};

}  // namespace megatron::datasets
