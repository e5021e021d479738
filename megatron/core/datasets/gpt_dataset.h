// GPTDataset, MockGPTDataset and GPTDatasetConfig (megatron/core/datasets/gpt_dataset.py).
//
// Index building follows docs/megatron-reference.md#index-building (epochs, separate final epoch, numpy RandomState
// shuffles, helpers' build_sample_idx), sample retrieval docs/megatron-reference.md#samples-and-masks, cache files docs/megatron-reference.md#cache-files, mock data docs/megatron-reference.md#mock-dataset.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "megatron/core/datasets/blended_megatron_dataset_config.h"
#include "megatron/core/datasets/megatron_dataset.h"
#include "megatron/core/datasets/npy.h"

namespace megatron::datasets {

/// GPTDatasetConfig: BlendedMegatronDatasetConfig plus the GPT sample options.
struct GPTDatasetConfig : BlendedMegatronDatasetConfig {
  bool reset_position_ids = false;     ///< --reset-position-ids
  bool reset_attention_mask = false;   ///< --reset-attention-mask
  bool eod_mask_loss = false;          ///< --eod-mask-loss
  bool create_attention_mask = true;   ///< --no-create-attention-mask-in-dataloader clears it
  bool drop_last_partial_validation_sequence = true;
  bool add_extra_token_to_sequence = true;  ///< --no-... clears it (x = 0)
};

/// Megatron's MockGPTLowLevelDataset: 100000 sequences whose lengths are
/// numpy.random.default_rng(0).integers(1, 4096, 100000, dtype=int32); sequence i is
/// [(1..len-1) % vocab_size..., eod].
class MockGPTLowLevelDataset final : public LowLevelDataset {
 public:
  static constexpr int64_t kSeed = 0;
  static constexpr int64_t kSize = 100000;
  static constexpr int32_t kMaxSequenceLength = 4096;
  MockGPTLowLevelDataset(int64_t vocab_size, int64_t eod);
  int64_t num_sequences() const override { return kSize; }
  const int32_t* sequence_lengths() const override { return lengths_.data(); }
  void get(int64_t idx, int64_t offset, int64_t length, std::vector<int64_t>& out) const override;
  std::optional<std::string> path_prefix() const override { return std::nullopt; }
  IndexDType token_dtype() const override { return IndexDType::kInt64; }

 private:
  int64_t vocab_size_;
  int64_t eod_;
  std::vector<int32_t> lengths_;
};

/// Megatron's GPTDataset over sequences [index_beg, index_end) of a low-level dataset.
///
/// Builds (or loads from the cache) document_index (int32), sample_index ([n+1, 2], int32 or int64)
/// and shuffle_index (uint32 or int64) exactly as Megatron; size() = sample_index rows - 1.
/// Throws UserError when the split holds no tokens or cannot yield one sample, naming the dataset
/// and split.
class GPTDataset : public TopLevelDataset {
 public:
  GPTDataset(std::shared_ptr<LowLevelDataset> dataset, std::optional<std::string> dataset_path,
             int64_t index_beg, int64_t index_end, std::optional<int64_t> num_samples, Split split,
             std::shared_ptr<const GPTDatasetConfig> config)
      : GPTDataset("GPTDataset", std::move(dataset), std::move(dataset_path), index_beg, index_end,
                   num_samples, split, std::move(config)) {}

  int64_t size() const override { return num_samples_total_; }
  void get(int64_t idx, GPTSample& out, bool with_attention_mask = true) const override;
  using TopLevelDataset::get;
  Split index_split() const override { return split_; }
  const std::string& unique_description() const override { return description_; }
  const std::string& unique_description_hash() const override { return hash_; }
  /// The ordered identifier dict (for BlendedDataset's description).
  const JsonValue& unique_identifiers() const { return identifiers_; }
  std::optional<int64_t> num_samples() const { return num_samples_; }
  const LowLevelDataset& low_level_dataset() const { return *dataset_; }

  /// The indices in their file dtypes (int32; [size()+1, 2] int32|int64; uint32|int64), owned
  /// after a build, memory-mapped after a cache load.
  const NpyView& document_index() const { return document_index_; }
  const NpyView& sample_index() const { return sample_index_; }
  const NpyView& shuffle_index() const { return shuffle_index_; }
  /// Cache folder used (empty when the indices were not cached).
  const std::string& cache_dir() const { return cache_dir_; }
  /// Whether the indices were read from the cache rather than built.
  bool loaded_from_cache() const { return loaded_from_cache_; }
  /// The pad id used for short samples (Megatron's _pad_token_id); nullopt = tokenizer has none.
  std::optional<int64_t> pad_token_id() const { return pad_token_id_; }

 protected:
  GPTDataset(const char* class_name, std::shared_ptr<LowLevelDataset> dataset,
             std::optional<std::string> dataset_path, int64_t index_beg, int64_t index_end,
             std::optional<int64_t> num_samples, Split split,
             std::shared_ptr<const GPTDatasetConfig> config);

 private:
  void build_or_load_indices();
  void build_indices();
  bool load_indices(const std::string& base);
  void save_indices(const std::string& base) const;

  std::string class_name_;
  std::shared_ptr<LowLevelDataset> dataset_;
  std::optional<std::string> dataset_path_;
  int64_t index_beg_;
  int64_t index_end_;
  std::optional<int64_t> num_samples_;
  Split split_;
  std::shared_ptr<const GPTDatasetConfig> config_;
  JsonValue identifiers_;
  std::string description_;
  std::string hash_;
  std::optional<int64_t> pad_token_id_;
  int64_t eod_ = -1;

  NpyView document_index_;
  NpyView sample_index_;
  NpyView shuffle_index_;
  int64_t num_samples_total_ = 0;
  std::string cache_dir_;
  bool loaded_from_cache_ = false;
};

/// Megatron's MockGPTDataset: GPTDataset over MockGPTLowLevelDataset, class "MockGPTDataset",
/// dataset_path null; cached only when --data-cache-path is given.
class MockGPTDataset final : public GPTDataset {
 public:
  MockGPTDataset(std::shared_ptr<LowLevelDataset> dataset, int64_t index_beg, int64_t index_end,
                 std::optional<int64_t> num_samples, Split split,
                 std::shared_ptr<const GPTDatasetConfig> config)
      : GPTDataset("MockGPTDataset", std::move(dataset), std::nullopt, index_beg, index_end,
                   num_samples, split, std::move(config)) {}
};

/// Megatron's _get_ltor_masks_and_position_ids on `tokens` (length s): fills loss_mask (float32
/// ones; 0 at EOD with eod_mask_loss), position_ids (reset after each EOD with
/// reset_position_ids) and, when attention_mask != nullptr, the s*s mask (1 = masked; causal, and
/// with reset_attention_mask rows after an EOD at i cannot see columns <= i).
void get_ltor_masks_and_position_ids(const int64_t* tokens, int64_t s, int64_t eod_token,
                                     bool reset_position_ids, bool reset_attention_mask,
                                     bool eod_mask_loss, uint8_t* attention_mask, float* loss_mask,
                                     int64_t* position_ids);

}  // namespace megatron::datasets
