#include "megatron/core/datasets/helpers.h"

#include <cmath>
#include <limits>
#include <set>

#include "megatron/core/utils/errors.h"

namespace megatron::datasets {

std::vector<int64_t> build_sample_idx(const int32_t* sizes, const int32_t* document_idx,
                                      int64_t n_doc, int32_t seq_length, int32_t num_epochs,
                                      int64_t tokens_per_epoch, bool drop_last_partial_sequence,
                                      int x) {
  MEGATRON_CHECK(seq_length > 1) << "seq_length " << seq_length;
  MEGATRON_CHECK(num_epochs > 0) << "num_epochs " << num_epochs;
  MEGATRON_CHECK(tokens_per_epoch > 1) << "tokens_per_epoch " << tokens_per_epoch;
  MEGATRON_CHECK(n_doc > 0) << "empty document index";
  int64_t num_samples;
  const int64_t total = static_cast<int64_t>(num_epochs) * tokens_per_epoch - x;
  if (drop_last_partial_sequence) {
    num_samples = total / seq_length;
  } else {
    num_samples = static_cast<int64_t>(std::ceil(static_cast<float>(total) / seq_length));
  }
  std::vector<int64_t> out(static_cast<size_t>(2 * (num_samples + 1)));
  int64_t sample = 0;
  int64_t pos = 0;
  int64_t offset = 0;
  out[0] = 0;
  out[1] = 0;
  ++sample;
  while (sample <= num_samples) {
    int64_t remaining = seq_length + x;
    while (remaining != 0) {
      const int64_t doc_len = sizes[document_idx[pos]] - offset;
      remaining -= doc_len;
      if (remaining <= 0) {
        offset += remaining + doc_len - x;
        remaining = 0;
      } else {
        if (pos == n_doc - 1) {
          offset = sizes[document_idx[pos]] - x;
          break;
        }
        ++pos;
        offset = 0;
      }
    }
    out[2 * sample] = pos;
    out[2 * sample + 1] = offset;
    ++sample;
  }
  return out;
}

void build_blending_indices(const std::vector<double>& weights, int64_t size,
                            std::vector<int16_t>& dataset_index,
                            std::vector<int64_t>& dataset_sample_index) {
  const size_t n = weights.size();
  MEGATRON_CHECK(n > 0 && n < 32767) << "num_datasets " << n;
  dataset_index.assign(static_cast<size_t>(size), 0);
  dataset_sample_index.assign(static_cast<size_t>(size), 0);
  std::vector<int64_t> current(n, 0);
  for (int64_t k = 0; k < size; ++k) {
    const double xk = std::max(static_cast<double>(k), 1.0);
    size_t best = 0;
    double best_err = weights[0] * xk - static_cast<double>(current[0]);
    for (size_t d = 1; d < n; ++d) {
      const double err = weights[d] * xk - static_cast<double>(current[d]);
      if (err > best_err) {
        best_err = err;
        best = d;
      }
    }
    dataset_index[k] = static_cast<int16_t>(best);
    dataset_sample_index[k] = current[best];
    current[best] += 1;
  }
}

void build_exhaustive_blending_indices(const std::vector<int64_t>& sizes,
                                       std::vector<int16_t>& dataset_index,
                                       std::vector<int64_t>& dataset_sample_index) {
  const size_t n = sizes.size();
  MEGATRON_CHECK(n > 0 && n < 32767) << "num_datasets " << n;
  int64_t total = 0;
  for (auto s : sizes) total += s;
  std::vector<int64_t> counts(n, 0);
  std::set<int32_t> unspent;
  std::vector<double> w(n);
  for (size_t i = 0; i < n; ++i) {
    unspent.insert(static_cast<int32_t>(i));
    w[i] = sizes[i] / static_cast<double>(total);
  }
  dataset_index.assign(static_cast<size_t>(total), 0);
  dataset_sample_index.assign(static_cast<size_t>(total), 0);
  int64_t k = 0;
  while (!unspent.empty()) {
    const double xk = std::max(static_cast<double>(k), 1.0);
    int64_t arg = -1;
    double best = std::numeric_limits<double>::lowest();
    for (int32_t d : unspent) {
      const double err = w[d] * xk - static_cast<double>(counts[d]);
      if (err > best) {
        arg = d;
        best = err;
      }
    }
    MEGATRON_CHECK(arg >= 0 && k < total) << "exhaustive blending overran";
    dataset_index[k] = static_cast<int16_t>(arg);
    dataset_sample_index[k] = counts[arg];
    counts[arg] += 1;
    if (sizes[arg] - static_cast<double>(counts[arg]) == 0) unspent.erase(static_cast<int32_t>(arg));
    ++k;
  }
}

}  // namespace megatron::datasets
