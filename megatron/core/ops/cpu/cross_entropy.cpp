// CPU reference: (vocab-parallel) softmax cross entropy in fp32 (Megatron's
// megatron/core/tensor_parallel/cross_entropy.py; docs/megatron-reference.md#vocab-parallel-cross-entropy).
#include <cmath>

#include "megatron/core/ops/cpu/cpu_ops.h"
#include "megatron/core/ops/cpu/cpu_util.h"

namespace megatron::ops::cpu {

namespace {
void check_rows(const Tensor& logits, const Tensor& labels, std::initializer_list<const Tensor*> stats, const char* op) {
  const int64_t n = rows_of(logits);
  MEGATRON_CHECK(labels.dtype() == DType::kInt64 && labels.numel() == n) << op << " logits " << logits.str() << " labels " << labels.str();
  for (const Tensor* t : stats)
    MEGATRON_CHECK(t->dtype() == DType::kFloat32 && t->numel() == n) << op << " per-row tensor " << t->str() << " for " << n << " rows";
}
}  // namespace

void cross_entropy_stats(const Tensor& logits, const Tensor& labels, int64_t vocab_start, Tensor& row_max,
                         Tensor& row_sumexp, Tensor& pred) {
  check_rows(logits, labels, {&row_max, &row_sumexp, &pred}, "cross_entropy_stats");
  const int64_t n = rows_of(logits), v = logits.size(-1);
  FloatIn fl(logits);
  const int64_t* lab = labels.data<int64_t>();
  float *m = row_max.data<float>(), *s = row_sumexp.data<float>(), *pr = pred.data<float>();
#pragma omp parallel for schedule(static) if (n * v > 16384)
  for (int64_t r = 0; r < n; ++r) {
    const float* row = fl.data() + r * v;
    float mx = row[0];
    for (int64_t j = 1; j < v; ++j) mx = std::max(mx, row[j]);
    double sum = 0.0;
    for (int64_t j = 0; j < v; ++j) sum += std::exp(row[j] - mx);
    m[r] = mx;
    s[r] = static_cast<float>(sum);
    const int64_t local = lab[r] - vocab_start;
    pr[r] = (local >= 0 && local < v) ? row[local] : 0.0f;
  }
}

void cross_entropy_rescale_(Tensor& row_sumexp, const Tensor& row_max, const Tensor& global_max) {
  const int64_t n = row_sumexp.numel();
  MEGATRON_CHECK(row_max.numel() == n && global_max.numel() == n) << "cross_entropy_rescale_ " << row_sumexp.str();
  float* s = row_sumexp.data<float>();
  const float *m = row_max.data<float>(), *gm = global_max.data<float>();
  for (int64_t r = 0; r < n; ++r) s[r] *= std::exp(m[r] - gm[r]);
}

void cross_entropy_loss(const Tensor& global_max, const Tensor& global_sumexp, const Tensor& pred, Tensor& loss,
                        Tensor& lse) {
  const int64_t n = pred.numel();
  MEGATRON_CHECK(global_max.numel() == n && global_sumexp.numel() == n && loss.numel() == n && lse.numel() == n &&
                 loss.dtype() == DType::kFloat32 && lse.dtype() == DType::kFloat32)
      << "cross_entropy_loss " << pred.str();
  const float *m = global_max.data<float>(), *s = global_sumexp.data<float>(), *p = pred.data<float>();
  float *l = loss.data<float>(), *ls = lse.data<float>();
  for (int64_t r = 0; r < n; ++r) {
    ls[r] = std::log(s[r]) + m[r];
    l[r] = ls[r] - p[r];
  }
}

void cross_entropy_backward(const Tensor& logits, const Tensor& labels, int64_t vocab_start, const Tensor& lse,
                            const Tensor& dloss, Tensor& dlogits) {
  check_rows(logits, labels, {&lse, &dloss}, "cross_entropy_backward");
  MEGATRON_CHECK(dlogits.numel() == logits.numel()) << "cross_entropy_backward dlogits " << dlogits.str();
  const int64_t n = rows_of(logits), v = logits.size(-1);
  FloatIn fl(logits);  // a copy for reduced dtypes, so dlogits may alias logits
  FloatOut fd(dlogits);
  const int64_t* lab = labels.data<int64_t>();
  const float *ls = lse.data<float>(), *dl = dloss.data<float>();
#pragma omp parallel for schedule(static) if (n * v > 16384)
  for (int64_t r = 0; r < n; ++r) {
    const int64_t local = lab[r] - vocab_start;
    for (int64_t j = 0; j < v; ++j) {
      const float sm = std::exp(fl[r * v + j] - ls[r]);
      fd[r * v + j] = (sm - (j == local ? 1.0f : 0.0f)) * dl[r];
    }
  }
  fd.commit();
}

void cross_entropy_fused_(Tensor& logits, const Tensor& labels, int64_t vocab_start, Tensor& loss, Tensor& lse) {
  check_rows(logits, labels, {&loss, &lse}, "cross_entropy_fused_");
  const int64_t n = rows_of(logits), v = logits.size(-1);
  FloatOut fl(logits, /*load=*/true);  // fp32: the tensor itself; else a copy committed at the end
  const int64_t* lab = labels.data<int64_t>();
  float *l = loss.data<float>(), *ls = lse.data<float>();
#pragma omp parallel for schedule(static) if (n * v > 16384)
  for (int64_t r = 0; r < n; ++r) {
    float* row = fl.data() + r * v;
    // The arithmetic of cross_entropy_stats + cross_entropy_loss + cross_entropy_backward
    // (without the dloss factor), so TP = 1 losses match the unfused path bit for bit.
    float mx = row[0];
    for (int64_t j = 1; j < v; ++j) mx = std::max(mx, row[j]);
    double sum = 0.0;
    for (int64_t j = 0; j < v; ++j) sum += std::exp(row[j] - mx);
    const int64_t local = lab[r] - vocab_start;
    const float pred = (local >= 0 && local < v) ? row[local] : 0.0f;
    ls[r] = std::log(static_cast<float>(sum)) + mx;
    l[r] = ls[r] - pred;
    for (int64_t j = 0; j < v; ++j) row[j] = std::exp(row[j] - ls[r]) - (j == local ? 1.0f : 0.0f);
  }
  fl.commit();
}

void scale_rows(const Tensor& x, const Tensor& scale, Tensor& out) {
  const int64_t n = rows_of(x), h = x.dim() ? x.size(-1) : 1;
  MEGATRON_CHECK(out.numel() == x.numel() && out.dtype() == x.dtype() && scale.dtype() == DType::kFloat32 &&
                 scale.numel() == n)
      << "scale_rows: x " << x.str() << " scale " << scale.str() << " out " << out.str();
  FloatIn fx(x);  // a copy for reduced dtypes, so out may alias x
  FloatOut fo(out);
  const float* sc = scale.data<float>();
#pragma omp parallel for schedule(static) if (n * h > 32768)
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < h; ++j) fo[r * h + j] = fx[r * h + j] * sc[r];
  fo.commit();
}

}  // namespace megatron::ops::cpu

namespace megatron::ops::cpu {

void argmax_last_dim(const Tensor& x, Tensor& idx) {
  const int64_t n = rows_of(x), v = x.dim() == 0 ? 1 : x.size(-1);
  MEGATRON_CHECK(v >= 1 && idx.is_cpu() && idx.dtype() == DType::kInt64 && idx.numel() == n)
      << "argmax_last_dim: x " << x.str() << " idx " << idx.str() << " (int64, one per row of x)";
  FloatIn fl(x);  // bf16/fp16 -> fp32 is exact: the order of the values is kept
  int64_t* out = idx.data<int64_t>();
  for (int64_t r = 0; r < n; ++r) {
    const float* row = fl.data() + r * v;
    int64_t best = 0;
    for (int64_t j = 1; j < v && !std::isnan(row[best]); ++j)
      if (std::isnan(row[j]) || row[j] > row[best]) best = j;
    out[r] = best;
  }
}

}  // namespace megatron::ops::cpu
