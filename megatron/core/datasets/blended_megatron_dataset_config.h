// BlendedMegatronDatasetConfig (megatron/core/datasets/blended_megatron_dataset_config.py).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "megatron/core/datasets/utils.h"
#include "megatron/core/tokenizers/megatron_tokenizer.h"

namespace megatron::datasets {

/// How dataset building cooperates across ranks (torch.distributed in Megatron). Default: a single
/// process. The distributed runtime plugs in its global rank and a barrier: rank 0 builds and
/// writes the caches, everybody waits at the barrier, then the other ranks read the caches.
struct DatasetDistributed {
  bool initialized = false;          ///< torch.distributed.is_initialized()
  int rank = 0;                      ///< global rank
  std::function<void()> barrier;     ///< global barrier (required when initialized)
};

/// Megatron's BlendedMegatronDatasetConfig; field names as in Python. Call finalize() (Python's
/// __post_init__) after filling it: it sets `mock`, defaults `split` for mock data and computes
/// `split_matrix`; it throws UserError for inconsistent fields.
struct BlendedMegatronDatasetConfig {
  int64_t random_seed = 1234;   ///< --seed
  int64_t sequence_length = 0;  ///< --seq-length
  std::optional<Blend> blend;   ///< --data-path
  /// --train-data-path / --valid-data-path / --test-data-path (all three slots; nullopt = none).
  std::optional<std::array<std::optional<Blend>, 3>> blend_per_split;
  std::optional<std::string> split;     ///< --split (raw string; enters the cache hash)
  std::optional<SplitMatrix> split_matrix;  ///< derived (None with blend_per_split, as Megatron)
  std::optional<std::string> path_to_cache;  ///< --data-cache-path
  bool mmap_bin_files = true;                ///< --no-mmap-bin-files
  bool mock = false;                         ///< derived: no blend at all
  std::shared_ptr<tokenizers::MegatronTokenizer> tokenizer;
  double mid_level_dataset_surplus = 0.005;  ///< --mid-level-dataset-surplus
  bool allow_ambiguous_pad_tokens = false;   ///< --allow-ambiguous-pad-tokens
  bool multiple_validation_sets = false;     ///< --multiple-validation-sets
  bool full_validation = false;              ///< --full-validation
  DatasetDistributed distributed;

  void finalize();
};

}  // namespace megatron::datasets
