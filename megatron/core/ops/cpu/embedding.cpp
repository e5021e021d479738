// CPU reference: (vocab-parallel) embedding lookup and its gradient.
#include "megatron/core/ops/cpu/cpu_ops.h"
#include "megatron/core/ops/cpu/cpu_util.h"

namespace megatron::ops::cpu {

void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out, int64_t vocab_start) {
  MEGATRON_CHECK(ids.dtype() == DType::kInt64 && table.dim() == 2 && out.numel() == ids.numel() * table.size(1))
      << "embedding_forward ids " << ids.str() << " table " << table.str() << " out " << out.str();
  const int64_t n = ids.numel(), h = table.size(1), v = table.size(0);
  const int64_t* id = ids.data<int64_t>();
  FloatIn t(table);
  FloatOut o(out);
#pragma omp parallel for schedule(static) if (n * h > 65536)
  for (int64_t r = 0; r < n; ++r) {
    const int64_t local = id[r] - vocab_start;
    const bool in_range = local >= 0 && local < v;
    for (int64_t j = 0; j < h; ++j) o[r * h + j] = in_range ? t[local * h + j] : 0.0f;
  }
  o.commit();
}

void embedding_backward(const Tensor& dout, const Tensor& ids, Tensor& dtable, int64_t vocab_start) {
  MEGATRON_CHECK(ids.dtype() == DType::kInt64 && dtable.dim() == 2 && dout.numel() == ids.numel() * dtable.size(1))
      << "embedding_backward dout " << dout.str() << " ids " << ids.str() << " dtable " << dtable.str();
  const int64_t n = ids.numel(), h = dtable.size(1), v = dtable.size(0);
  const int64_t* id = ids.data<int64_t>();
  FloatIn d(dout);
  FloatOut t(dtable, /*load=*/true);
  // Sequential over rows: the same id may repeat (a deterministic summation order).
  for (int64_t r = 0; r < n; ++r) {
    const int64_t local = id[r] - vocab_start;
    if (local < 0 || local >= v) continue;
    for (int64_t j = 0; j < h; ++j) t[local * h + j] += d[r * h + j];
  }
  t.commit();
}

}  // namespace megatron::ops::cpu
