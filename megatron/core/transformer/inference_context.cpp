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

void InferenceContext::update_kv_cache(const void* layer, Tensor& k, Tensor& v, ops::AttentionParams& p,
                                       Tensor& mask) {
  const int64_t s = k.size(0), b = k.size(1), off = sequence_len_offset, total = off + s;
  if (total > max_sequence_length_)
    user_error("InferenceContext: ", total, " tokens exceed the KV cache length ", max_sequence_length_,
               " (--inference-max-seq-length)");
  if (b > max_batch_size_) user_error("InferenceContext: batch ", b, " exceeds the KV cache batch ", max_batch_size_);
  auto& [kc, vc] = key_value_memory_dict_[layer];
  if (!kc.defined() || kc.size(1) != b) {
    MEGATRON_CHECK(off == 0) << "KV cache of a layer first seen at offset " << off << " or with a new batch size";
    Shape shape = k.shape();
    shape[0] = max_sequence_length_;
    kc = Tensor::empty(shape, k.dtype(), k.device());
    vc = Tensor::empty(shape, v.dtype(), v.device());
  }
  MEGATRON_CHECK(k.size(2) == kc.size(2) && k.size(3) == kc.size(3) && k.dtype() == kc.dtype())
      << "keys " << k.str() << " do not fit the cache " << kc.str();
  kc.narrow0(off, s).copy_(k);
  vc.narrow0(off, s).copy_(v);
  k = kc.narrow0(0, total);
  v = vc.narrow0(0, total);
  mask = Tensor();
  p.attention_mask = nullptr;
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
