// CPU reference of the FP8 ops (op_table.h, "FP8"): saturating round-to-nearest-even casts of
// tensor/dtype.h (bit-identical to CUDA's __nv_cvt_float_to_fp8(v, __NV_SATFINITE, fmt)), the
// scale bookkeeping of fp8_recipe.h, and an FP8 GEMM computed in fp32 from the decoded operands.
// Scale and amax pointers are host pointers here. CPU training emulates FP8 with
// fp8::quantize_dequantize_cpu (fp8_linear.h) and does not call these; they are the reference
// the CUDA kernels are checked against.
#include <cfloat>
#include <cmath>
#include <cstring>

#include "megatron/core/ops/cpu/cpu_ops.h"
#include "megatron/core/ops/cpu/cpu_util.h"

namespace megatron::ops::cpu {

namespace {
bool is_fp8(DType t) { return t == DType::kFloat8E4M3 || t == DType::kFloat8E5M2; }
uint8_t encode(float v, bool e4m3) { return e4m3 ? float_to_e4m3_bits(v) : float_to_e5m2_bits(v); }
float decode(uint8_t b, bool e4m3) { return e4m3 ? e4m3_bits_to_float(b) : e5m2_bits_to_float(b); }
void fold_amax(float* amax, float a) {
  if (std::isnan(a) || a > *amax) *amax = a;  // NaN propagates
}
// The decoded values of an FP8 tensor as a float32 tensor of the same shape.
Tensor decoded(const Tensor& q) {
  MEGATRON_CHECK(q.is_cpu() && is_fp8(q.dtype())) << "fp8 tensor expected, got " << q.str();
  Tensor y = Tensor::empty(q.shape(), DType::kFloat32);
  const auto* in = static_cast<const uint8_t*>(q.data_ptr());
  float* out = y.data<float>();
  const bool e4 = q.dtype() == DType::kFloat8E4M3;
  for (int64_t i = 0; i < q.numel(); ++i) out[i] = decode(in[i], e4);
  return y;
}
}  // namespace

void fp8_quantize(const Tensor& x, const float* scale, float* amax, Tensor* q, Tensor* q_t) {
  const int64_t cols = x.dim() ? x.size(-1) : 1, rows = cols ? x.numel() / cols : 0;
  MEGATRON_CHECK(scale && (!q || (q->numel() == x.numel() && is_fp8(q->dtype()))) &&
                 (!q_t || (q_t->numel() == x.numel() && is_fp8(q_t->dtype()))) &&
                 (!q || !q_t || q->dtype() == q_t->dtype()))
      << "fp8_quantize: x " << x.str() << (q ? " q " + q->str() : "") << (q_t ? " q_t " + q_t->str() : "");
  FloatIn in(x);
  const bool e4 = (q ? q->dtype() : q_t ? q_t->dtype() : DType::kFloat8E4M3) == DType::kFloat8E4M3;
  auto* qo = q ? static_cast<uint8_t*>(q->data_ptr()) : nullptr;
  auto* to = q_t ? static_cast<uint8_t*>(q_t->data_ptr()) : nullptr;
  float a = 0.0f;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float v = in[r * cols + c];
      fold_amax(&a, std::fabs(v));
      const uint8_t b = encode(v * scale[0], e4);
      if (qo) qo[r * cols + c] = b;
      if (to) to[c * rows + r] = b;
    }
  if (amax) fold_amax(amax, a);
}

bool fp8_swiglu_quantize(const Tensor&, DType, const float*, float*, Tensor*, Tensor*) { return false; }

bool fp8_swiglu_backward_quantize(const Tensor&, const Tensor&, const float*, float*, Tensor*, Tensor*) {
  return false;
}

bool fp8_rmsnorm_quantize(const Tensor&, const Tensor&, const Tensor&, bool, DType, const float*, float*, Tensor*,
                          Tensor*) {
  return false;
}

void fp8_transpose(const Tensor& q, Tensor& q_t) {
  MEGATRON_CHECK(q.is_cpu() && q_t.is_cpu() && q.dim() == 2 && dtype_size(q.dtype()) == 1 &&
                 q_t.dtype() == q.dtype() && q_t.dim() == 2 && q_t.size(0) == q.size(1) && q_t.size(1) == q.size(0))
      << "fp8_transpose: " << q.str() << " -> " << q_t.str();
  const int64_t r = q.size(0), c = q.size(1);
  const auto* a = static_cast<const uint8_t*>(q.data_ptr());
  auto* b = static_cast<uint8_t*>(q_t.data_ptr());
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) b[j * r + i] = a[i * c + j];
}

void fp8_amax(const Tensor& x, float* amax) {
  MEGATRON_CHECK(amax) << "fp8_amax: null amax";
  FloatIn in(x);
  float a = 0.0f;
  for (int64_t i = 0; i < x.numel(); ++i) fold_amax(&a, std::fabs(in[i]));
  fold_amax(amax, a);
}

void fp8_scale_from_amax(Tensor& cur_amax, float fp8_max, int margin, float* scale, float* scale_inv,
                         float* step_amax) {
  MEGATRON_CHECK(cur_amax.is_cpu() && cur_amax.dtype() == DType::kFloat32 && cur_amax.numel() >= 1 && scale &&
                 scale_inv)
      << "fp8_scale_from_amax: cur_amax " << cur_amax.str();
  float* cur = cur_amax.data<float>();
  const float a = *cur;
  *cur = 0.0f;
  if (std::isfinite(a) && a > 0.0f) {
    float s = (fp8_max / a) / std::ldexp(1.0f, margin);
    if (std::isinf(s)) s = FLT_MAX;
    *scale = s;
    *scale_inv = 1.0f / s;
  }
  if (step_amax) fold_amax(step_amax, a);
}

void fp8_update_scales(Tensor& amax_t, int64_t slot, float* hist, int history_len, int64_t pos, int roles,
                       const float* fmax, int margin, bool max_algo, bool update_scale, float* scale,
                       float* scale_inv) {
  if (roles == 0) return;
  MEGATRON_CHECK(amax_t.is_cpu() && amax_t.dtype() == DType::kFloat32 && amax_t.numel() >= (roles - 1) * slot + 1 &&
                 history_len > 0)
      << "fp8_update_scales: amax " << amax_t.str() << " history " << history_len;
  float* amax = amax_t.data<float>();
  const int H = history_len;
  for (int r = 0; r < roles; ++r) {
    float* h = hist + static_cast<int64_t>(r) * H;
    const int i0 = static_cast<int>(pos % H), i1 = static_cast<int>((pos + 1) % H);
    const float a = amax[r * slot];
    float h0 = h[i0];
    if (std::isnan(a) || a > h0) h0 = a;
    if (update_scale) {
      float m = 0.0f;  // "max": fmaxf over the window (a NaN entry is ignored), from 0
      if (max_algo)
        for (int i = 0; i < H; ++i) m = std::fmax(m, i == i0 ? h0 : h[i]);
      else
        m = h0;  // "most_recent": entry 0 as is (a NaN keeps the old scale)
      if (std::isfinite(m) && m > 0.0f) {
        float s = (fmax[r] / m) / std::ldexp(1.0f, margin);
        if (std::isinf(s)) s = FLT_MAX;
        scale[r * slot] = s;
      }
      scale_inv[r * slot] = 1.0f / scale[r * slot];
    }
    h[i0] = h0;    // becomes logical entry H - 1
    h[i1] = 0.0f;  // the new logical entry 0
    amax[r * slot] = 0.0f;
  }
}

void fp8_gemm_tn(const Tensor& a, const float* a_scale_inv, const Tensor& b, const float* b_scale_inv, Tensor& c,
                 float beta, bool /*fast_accum*/) {
  MEGATRON_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(1) && c.numel() == a.size(0) * b.size(0) &&
                 !(a.dtype() == DType::kFloat8E5M2 && b.dtype() == DType::kFloat8E5M2) && a_scale_inv && b_scale_inv)
      << "fp8_gemm_tn: a " << a.str() << " b " << b.str() << " c " << c.str();
  const Tensor a32 = decoded(a), b32 = decoded(b);
  Tensor c32 = c.dtype() == DType::kFloat32 ? c.view({a.size(0), b.size(0)})
                                            : Tensor::zeros({a.size(0), b.size(0)}, DType::kFloat32);
  if (c.dtype() != DType::kFloat32 && beta != 0.0f) cast(c, c32);
  gemm(a32, false, b32, true, c32, a_scale_inv[0] * b_scale_inv[0], beta);
  if (c.dtype() != DType::kFloat32) cast(c32, c);
}

bool fp8_gemm_tn_residual(const Tensor&, const float*, const Tensor&, const float*, const Tensor&, Tensor&, bool) {
  return false;
}

}  // namespace megatron::ops::cpu
