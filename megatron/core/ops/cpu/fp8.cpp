// CPU reference of the FP8 ops (op_table.h, "FP8"): saturating round-to-nearest-even casts of
// tensor/dtype.h (bit-identical to CUDA's __nv_cvt_float_to_fp8(v, __NV_SATFINITE, fmt)), the
// scale bookkeeping of fp8_recipe.h, and an FP8 GEMM computed in fp32 from the decoded operands.
// Scale and amax pointers are host pointers here. CPU training emulates FP8 with
// fp8::quantize_dequantize_cpu (fp8_linear.h) and does not call these; they are the reference
// the CUDA kernels are checked against.
#include <algorithm>
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

// The blockwise fused producers run on CUDA only (the caller falls back to producer + quantize).
bool fp8_block_swiglu_quantize(const Tensor&, DType, bool, Tensor*, Tensor*, Tensor*, Tensor*) { return false; }

bool fp8_block_swiglu_backward_quantize(const Tensor&, const Tensor&, bool, Tensor*, Tensor*, Tensor*, Tensor*) {
  return false;
}

bool fp8_block_rmsnorm_quantize(const Tensor&, const Tensor&, const Tensor&, bool, DType, bool, Tensor*, Tensor*,
                                Tensor*, Tensor*) {
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

// ------------------------------------------------------------------ blockwise (op_table.h)
namespace megatron::ops::cpu {
namespace {
constexpr int64_t kBlk = 128;
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round4(int64_t a) { return (a + 3) / 4 * 4; }

// TE's compute_scale_from_amax (common/recipe/recipe_common.cuh) with epsilon 0 and FLT_MAX for
// an overflowing division, as its blockwise quantizers call it.
float block_scale(float amax, float fmax, bool pow2) {
  if (std::isinf(amax) || amax == 0.0f || std::isnan(amax)) return 1.0f;
  float s = fmax / amax;
  if (std::isinf(s)) s = FLT_MAX;
  if (pow2) {
    uint32_t b;
    std::memcpy(&b, &s, 4);
    b &= 0xFF800000u;  // keep sign and exponent: round down to a power of 2
    std::memcpy(&s, &b, 4);
  }
  return s;
}

// One quantization of v [R, C] into q (row-major [R, C]) with blocks of br rows x bc cols; the
// scale_inv of block (i, j) goes to si[i * si_ld_i + j * si_ld_j].
void quantize_blocks(const std::vector<float>& v, int64_t R, int64_t C, int64_t br, int64_t bc, bool e4m3,
                     bool pow2, uint8_t* q, float* si, int64_t si_ld_i, int64_t si_ld_j, bool transpose_out) {
  const float fmax = e4m3 ? 448.0f : 57344.0f;
  for (int64_t i0 = 0; i0 < R; i0 += br)
    for (int64_t j0 = 0; j0 < C; j0 += bc) {
      const int64_t i1 = std::min(R, i0 + br), j1 = std::min(C, j0 + bc);
      float amax = 0.0f;
      for (int64_t i = i0; i < i1; ++i)
        for (int64_t j = j0; j < j1; ++j) amax = std::fmax(amax, std::fabs(v[i * C + j]));
      const float s = block_scale(amax, fmax, pow2);
      si[(i0 / br) * si_ld_i + (j0 / bc) * si_ld_j] = 1.0f / s;
      for (int64_t i = i0; i < i1; ++i)
        for (int64_t j = j0; j < j1; ++j) q[transpose_out ? j * R + i : i * C + j] = encode(v[i * C + j] * s, e4m3);
    }
}
}  // namespace

void fp8_block_quantize(const Tensor& x, bool block_2d, bool pow2_scales, Tensor* q, Tensor* s, Tensor* q_t,
                        Tensor* s_t) {
  const int64_t C = x.dim() ? x.size(-1) : 1, R = C ? x.numel() / C : 0;
  const int64_t cb = ceil_div(C, kBlk), rb = ceil_div(R, kBlk);
  const Shape s_shape = block_2d ? Shape{rb, round4(cb)} : Shape{cb, round4(R)};
  const Shape st_shape = block_2d ? Shape{cb, round4(rb)} : Shape{rb, round4(C)};
  auto ok = [&](Tensor* t, Tensor* ts, const Shape& ss) {
    return !t || (t->is_cpu() && t->numel() == x.numel() && is_fp8(t->dtype()) && ts && ts->is_cpu() &&
                  ts->dtype() == DType::kFloat32 && ts->shape() == ss);
  };
  MEGATRON_CHECK(x.is_cpu() && ok(q, s, s_shape) && ok(q_t, s_t, st_shape) && (!q || !q_t || q->dtype() == q_t->dtype()))
      << "fp8_block_quantize: x " << x.str() << (q ? " q " + q->str() + " s " + s->str() : "")
      << (q_t ? " q_t " + q_t->str() + " s_t " + s_t->str() : "") << " (scale_inv shapes " << shape_str(s_shape)
      << " / " << shape_str(st_shape) << ")";
  const std::vector<float> v = x.to_float_vector();
  if (q) {
    s->zero_();
    const bool e4 = q->dtype() == DType::kFloat8E4M3;
    auto* qb = static_cast<uint8_t*>(q->data_ptr());
    if (block_2d) quantize_blocks(v, R, C, kBlk, kBlk, e4, pow2_scales, qb, s->data<float>(), round4(cb), 1, false);
    else quantize_blocks(v, R, C, 1, kBlk, e4, pow2_scales, qb, s->data<float>(), 1, round4(R), false);
  }
  if (q_t) {
    s_t->zero_();
    const bool e4 = q_t->dtype() == DType::kFloat8E4M3;
    auto* qb = static_cast<uint8_t*>(q_t->data_ptr());
    // 128 x 128: the same blocks, stored transposed (s_t[c/128][r/128]); 1 x 128 of the transpose:
    // 128 x 1 column tiles of x (s_t[r/128][c]).
    if (block_2d) quantize_blocks(v, R, C, kBlk, kBlk, e4, pow2_scales, qb, s_t->data<float>(), 1, round4(rb), true);
    else quantize_blocks(v, R, C, kBlk, 1, e4, pow2_scales, qb, s_t->data<float>(), round4(C), 1, true);
  }
}

void fp8_block_gemm_tn(const Tensor& a, const Tensor& a_s, bool a_2d, const Tensor& b, const Tensor& b_s, bool b_2d,
                       Tensor& c, float beta) {
  MEGATRON_CHECK(a.dim() == 2 && b.dim() == 2 && c.dim() == 2 && a.size(1) == b.size(1) && c.size(0) == a.size(0) &&
                 c.size(1) == b.size(0) && !(a_2d && b_2d) && a_s.dtype() == DType::kFloat32 &&
                 b_s.dtype() == DType::kFloat32)
      << "fp8_block_gemm_tn: a " << a.str() << " b " << b.str() << " c " << c.str();
  // Dequantize each operand with its block's scale_inv, then an fp32 GEMM (the emulation's math).
  auto deq = [](const Tensor& q, const Tensor& si, bool two_d) {
    Tensor y = decoded(q);
    const int64_t R = q.size(0), K = q.size(1);
    const float* s = si.data<float>();
    float* p = y.data<float>();
    const int64_t ld = si.size(1);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t k = 0; k < K; ++k)
        p[r * K + k] *= two_d ? s[(r / kBlk) * ld + k / kBlk] : s[(k / kBlk) * ld + r];
    return y;
  };
  Tensor ad = deq(a, a_s, a_2d), bd = deq(b, b_s, b_2d);
  Tensor c32 = Tensor::empty(c.shape(), DType::kFloat32);
  gemm(ad, false, bd, true, c32, 1.0f, 0.0f);
  if (beta != 0.0f) {
    std::vector<float> old = c.to_float_vector();
    float* p = c32.data<float>();
    for (int64_t i = 0; i < c32.numel(); ++i) p[i] += beta * old[i];
  }
  cast(c32, c);
}
}  // namespace megatron::ops::cpu
