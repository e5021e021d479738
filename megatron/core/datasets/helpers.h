// Index-building kernels of Megatron's megatron/core/datasets/helpers.cpp, reimplemented.
#pragma once

#include <cstdint>
#include <vector>

namespace megatron::datasets {

/// build_sample_idx: the 2-D sample index [num_samples + 1, 2] (flattened row-major) of
/// (position in document_index, token offset in that sequence) rows.
///  num_samples = (num_epochs * tokens_per_epoch - x) / seq_length when drop_last_partial_sequence,
///  else ceil(float32(num_epochs * tokens_per_epoch - x) / seq_length) (float32 as helpers.cpp).
/// sizes: sequence lengths (int32) indexed by the values of document_index.
/// Requires seq_length > 1, num_epochs > 0, tokens_per_epoch > 1 (InternalError otherwise;
/// callers check user input first).
std::vector<int64_t> build_sample_idx(const int32_t* sizes, const int32_t* document_index,
                                      int64_t document_index_size, int32_t seq_length,
                                      int32_t num_epochs, int64_t tokens_per_epoch,
                                      bool drop_last_partial_sequence = true,
                                      int add_extra_token_to_sequence = 1);

/// build_blending_indices: greedy assignment of `size` samples to datasets by largest
/// weights[i] * max(k, 1) - count[i] (ties -> lowest index). Outputs dataset_index (int16 values)
/// and dataset_sample_index (running count of the chosen dataset).
void build_blending_indices(const std::vector<double>& weights, int64_t size,
                            std::vector<int16_t>& dataset_index,
                            std::vector<int64_t>& dataset_sample_index);

/// build_exhaustive_blending_indices: draw exactly sizes[i] samples from dataset i, interleaved
/// with the same greedy rule (weights sizes[i] / total) over datasets not yet exhausted.
void build_exhaustive_blending_indices(const std::vector<int64_t>& sizes,
                                       std::vector<int16_t>& dataset_index,
                                       std::vector<int64_t>& dataset_sample_index);

}  // namespace megatron::datasets
