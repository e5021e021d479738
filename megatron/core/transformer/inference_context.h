// The KV cache of incremental decoding: Megatron's StaticInferenceContext
// (megatron/core/inference/contexts/static_context.py, formerly InferenceParams), the object
// GPTModel.forward(..., inference_context=...) threads through every attention layer.
//
// A generation runs the model first on the prompt prefix (prefill) and then on one new token per
// step (decode); every self-attention layer appends the keys/values of the tokens of the current
// forward to its cache at sequence_len_offset and attends to the cache [0, offset + s). The caller
// (megatron/core/inference/text_generation.h) advances sequence_len_offset by s after each forward.
// Lives in transformer/ because attention.cpp calls it; created and owned by the inference engine.
#pragma once

#include <cstdint>
#include <map>
#include <utility>

#include "megatron/core/ops/ops.h"
#include "megatron/core/tensor/tensor.h"

namespace megatron::transformer {

class InferenceContext {
 public:
  /// Caches hold at most max_batch_size sequences of max_sequence_length tokens each (allocated
  /// per layer at the first forward, in the dtype/device of that layer's keys). Throws UserError
  /// for non-positive sizes.
  InferenceContext(int64_t max_batch_size, int64_t max_sequence_length);

  /// Tokens of every sequence already in the cache (the position of the next forward's first token).
  int64_t sequence_len_offset = 0;
  int64_t max_batch_size() const { return max_batch_size_; }
  int64_t max_sequence_length() const { return max_sequence_length_; }
  /// Megatron's reset(): offset 0; the allocated caches are kept and overwritten.
  void reset() { sequence_len_offset = 0; }
  /// True after the first forward (Megatron's is_decode_only / enable_decode_mode).
  bool is_decode_only() const { return sequence_len_offset > 0; }

  /// The attention hook (SelfAttention::forward). k, v: this forward's keys/values [s, b, ng, d]
  /// after RoPE. Copies them into `layer`'s cache at rows [offset, offset + s) and replaces k, v by
  /// views of the cache rows [0, offset + s). Sets the masking of p: causal when offset == 0
  /// (s == sk), nothing masked when s == 1 (the new token sees every cached one), otherwise an
  /// explicit mask [b, 1, s, offset + s] (query i sees keys j <= offset + i) kept alive in `mask`.
  /// Throws UserError when offset + s exceeds max_sequence_length or b exceeds max_batch_size,
  /// and InternalError when b or the key shape changes between forwards of one generation.
  void update_kv_cache(const void* layer, Tensor& k, Tensor& v, ops::AttentionParams& p, Tensor& mask);

  /// The cache rows [offset, offset + s) of `layer` as views k_slot, v_slot of `shape` [s, b, ng, d]
  /// (allocating the caches, in `dtype` on `device`, at the first forward as update_kv_cache): the
  /// QKV split writes this forward's keys/values straight into the cache, and update_kv_cache then
  /// skips its copies (it recognizes the views). Same errors as update_kv_cache.
  void kv_slots(const void* layer, const Shape& shape, DType dtype, Device device, Tensor& k_slot, Tensor& v_slot);

  /// The decode step with its position in memory (text generation's CUDA graph,
  /// docs/inference.md "CUDA graph of the decode step"). `positions`: int64 [2] = {offset,
  /// offset + 1} on the caches' device, kept alive by the caller; nullptr returns to
  /// sequence_len_offset. While set, a forward must have s == 1 and find its layers' caches
  /// allocated (by a prefill; InternalError otherwise): kv_slots gives fresh [1, b, ng, d]
  /// tensors, update_kv_cache writes them at row positions[0] (ops::kv_cache_write) and leaves k, v
  /// as the whole caches with p.kv_len = positions[1] keys, not causal. No shape, pointer or
  /// launch argument then depends on the position, so one captured step replays at every
  /// position; sequence_len_offset is only checked against max_sequence_length.
  void set_device_positions(const Tensor* positions);
  bool device_positions() const { return dev_offset_.defined(); }

 private:
  /// The caches of `layer`, allocated for keys of `shape` [s, b, ng, d] (checks as above).
  std::pair<Tensor, Tensor>& caches(const void* layer, const Shape& shape, DType dtype, Device device);

  int64_t max_batch_size_, max_sequence_length_;
  Tensor dev_offset_, dev_count_;  // set_device_positions' elements 0 and 1 (views)
  /// Megatron's key_value_memory_dict: per layer (keyed by the attention module) the key and
  /// value caches [max_sequence_length, b, ng, d].
  std::map<const void*, std::pair<Tensor, Tensor>> key_value_memory_dict_;
};

}  // namespace megatron::transformer
