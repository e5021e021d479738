// Reads the named-tensor fixtures written by tests/reference/model/*.py:
// <name>.json = {"tensors": {key: {"dtype": "float32"|"int64", "shape": [...], "offset": bytes}}}
// and <name>.bin = the raw little-endian data.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "megatron/core/datasets/gpt_batch.h"
#include "megatron/core/tensor/tensor.h"

namespace megatron::testing {

class Fixture {
 public:
  /// Loads tests/reference/model/data/<name>.{json,bin} from the source tree.
  explicit Fixture(const std::string& name);
  /// Loads <dir>/<name>.{json,bin}, dir relative to the source tree (e.g. "tests/reference/mtp/data").
  Fixture(const std::string& dir, const std::string& name);
  /// Whether <dir>/<name>.json exists in the source tree.
  static bool exists(const std::string& dir, const std::string& name);
  bool has(const std::string& key) const { return index_.count(key) != 0; }
  /// CPU tensor (float32 or int64) with the stored shape; throws if absent.
  Tensor get(const std::string& key) const;
  std::vector<std::string> keys_with_prefix(const std::string& prefix) const;

 private:
  struct Entry {
    std::string dtype;
    Shape shape;
    size_t offset;
  };
  std::map<std::string, Entry> index_;
  std::vector<char> data_;
};

/// max |a - b| / max |b| over all elements (0 if b is all zero and a equals it).
double max_rel_error(const Tensor& a, const Tensor& b);

/// A micro-batch of b sequences of length s from row-major token / label ids (b*s each):
/// tokens, labels, position_ids 0..s-1 per row (int64 [b, s]), loss_mask all ones (float32 [b, s]).
datasets::GPTBatch gpt_batch(const std::vector<int64_t>& tokens, const std::vector<int64_t>& labels, int64_t b, int64_t s);

}  // namespace megatron::testing
