// MegatronDataset (megatron/core/datasets/megatron_dataset.py): the mid-level dataset base, the
// low-level dataset interface under it, and the sample that GPT datasets return.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "megatron/core/datasets/indexed_dataset.h"
#include "megatron/core/datasets/utils.h"

namespace megatron::datasets {

/// One sample as Megatron's GPTDataset.__getitem__ returns it (docs/megatron-reference.md#samples-and-masks), s = sequence
/// length. All vectors have s entries except attention_mask (s*s, row-major [query, key],
/// 1 = masked out; empty when not created).
struct GPTSample {
  int16_t dataset_id = -1;              ///< BlendedDataset's "dataset_id" (-1 when not blended)
  std::vector<int64_t> tokens;          ///< int64 [s]
  std::vector<int64_t> labels;          ///< int64 [s]
  std::vector<uint8_t> attention_mask;  ///< bool [1, s, s] flattened, True = masked
  std::vector<float> loss_mask;         ///< float32 [s]
  std::vector<int64_t> position_ids;    ///< int64 [s]
};

/// One text line describing a sample, for comparing what two implementations feed the model
/// (MEGATRON_DUMP_SAMPLES, docs/environment.md; tests/gpu/megatron_samples.py prints the same
/// line from Megatron-LM's own GPTDataset.__getitem__):
///   `SAMPLE <split> <idx> tokens=<t0,t1,...> labels=<l0,...> loss_mask_zero=<p,...|-> position_ids=<arange|p0,...>`
/// idx is the dataset index the loader asked for (before the shuffle mapping); loss_mask_zero
/// lists the positions whose loss mask is 0; position_ids is `arange` when it is 0..s-1.
std::string sample_digest(const char* split, int64_t idx, const GPTSample& sample);

/// The token store a GPTDataset draws from: an IndexedDataset or the mock generator.
class LowLevelDataset {
 public:
  virtual ~LowLevelDataset() = default;
  /// Number of sequences (the unit --split divides).
  virtual int64_t num_sequences() const = 0;
  /// int32 lengths of all sequences.
  virtual const int32_t* sequence_lengths() const = 0;
  /// Appends tokens [offset, offset+length) of sequence idx (length < 0: to its end) to out.
  virtual void get(int64_t idx, int64_t offset, int64_t length, std::vector<int64_t>& out) const = 0;
  /// The .bin/.idx prefix, or nullopt for mock data.
  virtual std::optional<std::string> path_prefix() const = 0;
  /// dtype of the .bin tokens (mock: int64 -> reported as kInt64).
  virtual IndexDType token_dtype() const = 0;
};

/// LowLevelDataset over Megatron's IndexedDataset (.bin/.idx pair).
class IndexedLowLevelDataset final : public LowLevelDataset {
 public:
  IndexedLowLevelDataset(const std::string& prefix, bool mmap_bin)
      : ds_(std::make_shared<IndexedDataset>(prefix, mmap_bin)) {}
  int64_t num_sequences() const override { return static_cast<int64_t>(ds_->num_sequences()); }
  const int32_t* sequence_lengths() const override { return ds_->sequence_lengths(); }
  void get(int64_t idx, int64_t offset, int64_t length, std::vector<int64_t>& out) const override {
    ds_->get(static_cast<size_t>(idx), offset, length, out);
  }
  std::optional<std::string> path_prefix() const override { return ds_->prefix(); }
  IndexDType token_dtype() const override { return ds_->dtype(); }
  const IndexedDataset& indexed() const { return *ds_; }

 private:
  std::shared_ptr<IndexedDataset> ds_;
};

/// What the loader and the blend consume: a sized, randomly accessible set of GPT samples.
class TopLevelDataset {
 public:
  virtual ~TopLevelDataset() = default;
  virtual int64_t size() const = 0;
  /// Fills `out` with sample idx (0 <= idx < size()). with_attention_mask=false skips building
  /// the s*s mask even when the config asks for it (the model builds a causal mask itself).
  virtual void get(int64_t idx, GPTSample& out, bool with_attention_mask = true) const = 0;
  GPTSample get(int64_t idx) const {
    GPTSample s;
    get(idx, s);
    return s;
  }
  virtual Split index_split() const = 0;
  /// Megatron's unique_description (json.dumps(..., indent=4)) and its MD5.
  virtual const std::string& unique_description() const = 0;
  virtual const std::string& unique_description_hash() const = 0;
};

}  // namespace megatron::datasets
