#include "megatron/core/fp8/fp8_param.h"

#include <cstring>

#include "megatron/core/ops/ops.h"
#include "megatron/core/utils/errors.h"

namespace megatron::fp8 {

void quantize_param_shard(Fp8State& st, int base, const Tensor& shard, Tensor& out) {
  MEGATRON_CHECK(out.numel() == shard.numel() && out.dtype() == st.dtype(base + kWeight) &&
                 out.device() == shard.device())
      << "quantize_param_shard: shard " << shard.str() << " out " << out.str();
  if (shard.numel() == 0) return;
  if (!shard.is_cpu()) {
    // Device state: the scale and amax live on the device (no host round trip).
    ops::fp8_quantize(shard, static_cast<const float*>(st.scale(base + kWeight).data_ptr()),
                      static_cast<float*>(st.amax(base + kWeight).data_ptr()), &out, nullptr);
    return;
  }
  const float amax = quantize_cpu(shard, st.meta(base + kWeight), out);
  st.record_host_amax(base + kWeight, amax);
}

Tensor fp8_transpose_cpu(const Tensor& q) {
  MEGATRON_CHECK(q.dim() == 2 && dtype_size(q.dtype()) == 1 && q.is_cpu()) << "fp8_transpose_cpu(" << q.str() << ")";
  Tensor t = Tensor::empty({q.size(1), q.size(0)}, q.dtype());
  ops::fp8_transpose(q, t);
  return t;
}

void post_all_gather_processing(Fp8State& st, int base, const Tensor& w) {
  MEGATRON_CHECK(w.dim() == 2 && w.dtype() == st.dtype(base + kWeight)) << "post_all_gather_processing(" << w.str() << ")";
  Fp8State::WeightCache& c = st.weight_cache(base);
  st.snapshot_param_scale_inv(base);
  c.primary = true;
  if (!w.is_cpu()) {
    // The FP8 GEMM path keeps the FP8 weight and its transpose (fp8_linear.cpp).
    c.q = w;
    if (!(c.q_t.defined() && c.q_t.size(0) == w.size(1) && c.q_t.size(1) == w.size(0) && c.q_t.device() == w.device()))
      c.q_t = Tensor::empty({w.size(1), w.size(0)}, w.dtype(), w.device());
    ops::fp8_transpose(w, c.q_t);
  } else {
    // The CPU emulation keeps the dequantized weight.
    if (!(c.q.defined() && c.q.shape() == w.shape() && c.q.dtype() == DType::kFloat32))
      c.q = Tensor::empty(w.shape(), DType::kFloat32);
    dequantize_cpu(w, c.param_scale_inv, c.q);
    c.q_t = Tensor();
  }
  c.ptr = w.data_ptr();
  c.numel = w.numel();
  c.valid = true;
}

}  // namespace megatron::fp8
