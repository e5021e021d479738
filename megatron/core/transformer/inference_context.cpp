#include "megatron/core/transformer/inference_context.h"

#include <vector>

#include "megatron/core/utils/errors.h"

namespace megatron::transformer {

InferenceContext::InferenceContext(int64_t max_batch_size, int64_t max_sequence_length)
    : max_batch_size_(max_batch_size), max_sequence_length_(max_sequence_length) {
  if (max_batch_size <= 0 || max_sequence_length <= 0)
    user_error("InferenceContext: max batch size ", max_batch_size, " and max sequence length ", max_sequence_length,
               " must be positive");
}

std::pair<Tensor, Tensor>& InferenceContext::caches(const void* layer, const Shape& shape, DType dtype,
                                                    Device device) {
  MEGATRON_CHECK(shape.size() == 4) << "InferenceContext: keys must be [s, b, ng, d]";
  const int64_t s = shape[0], b = shape[1], off = sequence_len_offset, total = off + s;
  if (total > max_sequence_length_)
    user_error("InferenceContext: ", total, " tokens exceed the KV cache length ", max_sequence_length_,
               " (--inference-max-seq-length)");
  if (b > max_batch_size_) user_error("InferenceContext: batch ", b, " exceeds the KV cache batch ", max_batch_size_);
  auto& kv = key_value_memory_dict_[layer];
  auto& [kc, vc] = kv;
  if (device_positions()) {
    MEGATRON_CHECK(s == 1 && kc.defined() && kc.size(1) == b)
        << "InferenceContext: device positions need one token per sequence and the caches of a prefill, got keys ["
        << s << ", " << b << ", ...]";
  }
  if (!kc.defined() || kc.size(1) != b) {
    MEGATRON_CHECK(off == 0) << "KV cache of a layer first seen at offset " << off << " or with a new batch size";
    Shape full = shape;
    full[0] = max_sequence_length_;
    kc = Tensor::empty(full, dtype, device);
    vc = Tensor::empty(full, dtype, device);
  }
  MEGATRON_CHECK(shape[2] == kc.size(2) && shape[3] == kc.size(3) && dtype == kc.dtype() && device == kc.device())
      << "keys [" << s << ", " << b << ", " << shape[2] << ", " << shape[3] << "] " << dtype_name(dtype)
      << " do not fit the cache " << kc.str();
  return kv;
}

void InferenceContext::kv_slots(const void* layer, const Shape& shape, DType dtype, Device device, Tensor& k_slot,
                                Tensor& v_slot) {
  auto& [kc, vc] = caches(layer, shape, dtype, device);
  if (device_positions()) {  // written into the caches by update_kv_cache (the row is in memory)
    k_slot = Tensor::empty(shape, dtype, device);
    v_slot = Tensor::empty(shape, dtype, device);
    return;
  }
  k_slot = kc.narrow0(sequence_len_offset, shape[0]);
  v_slot = vc.narrow0(sequence_len_offset, shape[0]);
}

void InferenceContext::set_device_positions(const Tensor* positions) {
  if (!positions) {
    dev_offset_ = dev_count_ = Tensor();
    return;
  }
  MEGATRON_CHECK(positions->dtype() == DType::kInt64 && positions->numel() == 2)
      << "InferenceContext: device positions must be int64 [2], got " << positions->str();
  dev_offset_ = positions->flat_slice(0, {1});
  dev_count_ = positions->flat_slice(1, {1});
}

void InferenceContext::update_kv_cache(const void* layer, Tensor& k, Tensor& v, ops::AttentionParams& p,
                                       Tensor& mask) {
  const int64_t s = k.size(0), b = k.size(1), off = sequence_len_offset, total = off + s;
  auto& [kc, vc] = caches(layer, k.shape(), k.dtype(), k.device());
  MEGATRON_CHECK(v.shape() == k.shape() && v.dtype() == k.dtype()) << "values " << v.str() << " keys " << k.str();
  mask = Tensor();
  p.attention_mask = nullptr;
  if (device_positions()) {
    ops::kv_cache_write(k, v, dev_offset_, kc, vc);
    k = kc;
    v = vc;
    p.causal = false;
    p.kv_len = &dev_count_;
    return;
  }
  Tensor k_slot = kc.narrow0(off, s), v_slot = vc.narrow0(off, s);
  if (k.data_ptr() != k_slot.data_ptr()) k_slot.copy_(k);  // else written there by kv_slots' caller
  if (v.data_ptr() != v_slot.data_ptr()) v_slot.copy_(v);
  k = kc.narrow0(0, total);
  v = vc.narrow0(0, total);
  if (off == 0) {
    p.causal = true;
  } else if (s == 1) {
    p.causal = false;
  } else {  // a chunk after the first: bottom-right aligned causal mask (1 = masked out)
    std::vector<uint8_t> m(static_cast<size_t>(b * s * total));
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t i = 0; i < s; ++i)
        for (int64_t j = 0; j < total; ++j) m[(bi * s + i) * total + j] = j > off + i ? 1 : 0;
    Tensor host = Tensor::empty({b, 1, s, total}, DType::kUInt8);
    std::copy(m.begin(), m.end(), host.data<uint8_t>());
    mask = host.to(k.device());
    p.attention_mask = &mask;
  }
}

}  // namespace megatron::transformer
