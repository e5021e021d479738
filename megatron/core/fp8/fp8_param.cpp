#include "megatron/core/fp8/fp8_param.h"

#include <cstring>

#include "megatron/core/utils/errors.h"
#ifdef MEGATRON_WITH_CUDA
#include "megatron/core/ops/cuda/fp8_cuda.h"
#endif

namespace megatron::fp8 {

void quantize_param_shard(Fp8State& st, int base, const Tensor& shard, Tensor& out) {
  MEGATRON_CHECK(out.numel() == shard.numel() && out.dtype() == st.dtype(base + kWeight) &&
                 out.device() == shard.device())
      << "quantize_param_shard: shard " << shard.str() << " out " << out.str();
  if (shard.numel() == 0) return;
  if (shard.is_cuda()) {
#ifdef MEGATRON_WITH_CUDA
    ops::cuda::fp8_quantize(shard, static_cast<const float*>(st.scale(base + kWeight).data_ptr()),
                            static_cast<float*>(st.amax(base + kWeight).data_ptr()), &out, nullptr);
    return;
#else
    user_error("quantize_param_shard: a CUDA tensor reached a build without the CUDA backend");
#endif
  }
  const float amax = quantize_cpu(shard, st.meta(base + kWeight), out);
  st.record_host_amax(base + kWeight, amax);
}

Tensor fp8_transpose_cpu(const Tensor& q) {
  MEGATRON_CHECK(q.dim() == 2 && dtype_size(q.dtype()) == 1 && q.is_cpu()) << "fp8_transpose_cpu(" << q.str() << ")";
  const int64_t r = q.size(0), c = q.size(1);
  Tensor t = Tensor::empty({c, r}, q.dtype());
  const auto* a = static_cast<const uint8_t*>(q.data_ptr());
  auto* b = static_cast<uint8_t*>(t.data_ptr());
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) b[j * r + i] = a[i * c + j];
  return t;
}

void post_all_gather_processing(Fp8State& st, int base, const Tensor& w) {
  MEGATRON_CHECK(w.dim() == 2 && w.dtype() == st.dtype(base + kWeight)) << "post_all_gather_processing(" << w.str() << ")";
  Fp8State::WeightCache& c = st.weight_cache(base);
  st.snapshot_param_scale_inv(base);
  c.primary = true;
  if (w.is_cuda()) {
#ifdef MEGATRON_WITH_CUDA
    c.q = w;
    if (!(c.q_t.defined() && c.q_t.size(0) == w.size(1) && c.q_t.size(1) == w.size(0) && c.q_t.device() == w.device()))
      c.q_t = Tensor::empty({w.size(1), w.size(0)}, w.dtype(), w.device());
    ops::cuda::fp8_transpose(w, c.q_t);
#else
    user_error("post_all_gather_processing: a CUDA tensor reached a build without the CUDA backend");
#endif
  } else {
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
