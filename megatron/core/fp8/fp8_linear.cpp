#include "megatron/core/fp8/fp8_linear.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "megatron/core/ops/fp8_env.h"
#include "megatron/core/ops/device.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/utils/env.h"
#include "megatron/core/utils/errors.h"

namespace megatron::fp8 {

bool fusion_enabled() {
  // 0: quantize every FP8 GEMM input in a separate pass; 1 (default): fused into RMSNorm/SwiGLU.
  static const bool on = env_switch("MEGATRON_FP8_FUSE", true);
  return on;
}

bool block_fusion_enabled() {
  // 1 (default; bit-identical losses to 0 and 1.00-1.01x its speed on the H200, docs/performance.md
  // "Session 9: blockwise"): fused; 0: the blockwise recipe's producers write their bf16 output,
  // quantized by a separate pass.
  static const bool on = ops::block_fused_from_env();
  return on;
}

bool fused_input_ok(const Fp8State& st, const Tensor& like) {
  // The fused producers exist for the FP8-GEMM recipes of device tensors only: delayed scaling
  // (the scale is known before the producer runs) and blockwise (every scale is the block's own).
  const Fp8Recipe r = st.config().recipe;
  const bool recipe_ok = r == Fp8Recipe::kDelayed || (r == Fp8Recipe::kBlockwise && block_fusion_enabled());
  return !like.is_cpu() && recipe_ok && st.config().wgrad && fusion_enabled();
}

namespace {
bool is_tensorwise(const Fp8State& st) { return st.config().recipe == Fp8Recipe::kTensorwise; }
bool is_blockwise(const Fp8State& st) { return st.config().recipe == Fp8Recipe::kBlockwise; }

float host_amax(const Tensor& x) {
  float a = 0.0f;
  for (float v : x.to_float_vector()) {
    const float f = std::fabs(v);
    if (std::isnan(f) || f > a) a = f;
  }
  return a;
}

Shape rows_cols(const Tensor& x) {
  const int64_t c = x.size(-1);
  return {x.numel() / std::max<int64_t>(c, 1), c};
}

// ---------------------------------------------------------------------------------- CPU
// The weight quantized-dequantized with its role's scale: from the weight cache when the cast
// of this step is still valid, else cast now (recording the amax when `record`).
Tensor weight_cpu(Fp8State& st, int base, const Tensor& w, bool record) {
  Fp8State::WeightCache& c = st.weight_cache(base);
  // --fp8-param-gather: the gathered FP8 parameter (its amax was recorded when it was cast).
  if (c.primary && c.valid) {
    MEGATRON_CHECK(c.q.shape() == w.shape()) << "FP8 parameter " << c.q.str() << " for weight " << w.str();
    return c.q;
  }
  MEGATRON_CHECK(w.storage_bytes() != 0)
      << "FP8 weight " << w.str() << ": its model-dtype copy was released (--fp8-param-gather) and no gathered "
      << "FP8 parameter is valid";
  if (st.weight_cache_hit(base, w, record) && c.q.defined()) return c.q;
  Tensor wq = quantize_dequantize_cpu(st, base + kWeight, w, record);
  st.count_weight_cast();
  if (st.weight_cache_admit(base, w.numel() * 4, nullptr)) {  // host memory: no budget
    c.q = wq;
    st.weight_cache_mark(base, w, record);
  }
  return wq;
}

void forward_cpu(Fp8State& st, int base, const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y,
                 const Tensor* residual) {
  const bool rec = st.recording();
  Tensor xq = is_blockwise(st) ? block_quantize_dequantize_cpu(st, base + kInput, x, false)
                               : quantize_dequantize_cpu(st, base + kInput, x, rec);
  Tensor wq = weight_cpu(st, base, w, rec);
  Tensor y32 = Tensor::empty(y.shape(), DType::kFloat32);
  ops::linear_forward(xq, wq, nullptr, y32);
  ops::cast(y32, y);
  if (bias) ops::bias_add_(y, *bias);
  if (residual) ops::add_(y, *residual);
}

void backward_cpu(Fp8State& st, int base, const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx, Tensor* dw,
                  Tensor* dbias, bool accumulate) {
  const bool bw = is_blockwise(st);
  Tensor dyq = bw ? block_quantize_dequantize_cpu(st, base + kGradOutput, dy, false)
                  : quantize_dequantize_cpu(st, base + kGradOutput, dy, st.recording());
  if (dx) {
    Tensor wq = weight_cpu(st, base, w, false);
    Tensor dx32 = Tensor::empty(dx->shape(), DType::kFloat32);
    ops::gemm(dyq, false, wq, false, dx32);  // [N, out] @ [out, in]
    ops::cast(dx32, *dx);
  }
  if (dw) {
    if (st.config().wgrad) {
      // Blockwise: the wgrad GEMM contracts over the tokens, so both operands are quantized in
      // 128 x 1 tiles along the tokens (TE's columnwise copies), not the forward's 1 x 128 ones.
      Tensor xq = bw ? block_quantize_dequantize_cpu(st, base + kInput, x, true)
                     : quantize_dequantize_cpu(st, base + kInput, x, false);
      Tensor dyq_w = bw ? block_quantize_dequantize_cpu(st, base + kGradOutput, dy, true) : dyq;
      Tensor dw32 = Tensor::empty(dw->shape(), DType::kFloat32);
      ops::gemm(dyq_w, true, xq, false, dw32);  // [N, out]^T @ [N, in]
      if (accumulate) ops::add_(*dw, dw32);
      else ops::cast(dw32, *dw);
    } else {
      ops::linear_backward(dy, x, w, nullptr, dw, nullptr, accumulate);
    }
  }
  if (dbias) ops::linear_backward(dy, x, w, nullptr, nullptr, dbias, accumulate);
}

// --------------------------------------------------------- blockwise recipe (device tensors)
// TE's Float8BlockScaling with cuBLASLt's block-scaled GEMMs (docs/fp8.md "Blockwise recipe"):
// input and grad-output in 1 x 128 tiles (row layout for the forward / dgrad GEMMs; 128 x 1 tiles
// of the tokens, stored transposed, for the wgrad GEMM), the weight in 128 x 128 blocks (one pass
// writes it and its transpose for the dgrad GEMM; cached per step like the other recipes'). No
// amaxes are recorded: every scale comes from its own block.
int64_t ceil128(int64_t v) { return (v + 127) / 128; }
int64_t round4(int64_t v) { return (v + 3) / 4 * 4; }

struct BlockQ {
  Tensor q, s;
};
// x [rows, cols] quantized: `row` 1 x 128 tiles along cols (q [rows, cols]); `col` 128 x 1 tiles
// along rows, stored transposed (q [cols, rows]).
void block_quantize_1d(const Fp8State& st, DType dt, const Tensor& x2, BlockQ* row, BlockQ* col) {
  const int64_t R = x2.size(0), C = x2.size(1);
  if (row) *row = {Tensor::empty({R, C}, dt, x2.device()), Tensor::empty({ceil128(C), round4(R)}, DType::kFloat32, x2.device())};
  if (col) *col = {Tensor::empty({C, R}, dt, x2.device()), Tensor::empty({ceil128(R), round4(C)}, DType::kFloat32, x2.device())};
  ops::fp8_block_quantize(x2, false, st.config().block_pow2_scales, row ? &row->q : nullptr, row ? &row->s : nullptr,
                          col ? &col->q : nullptr, col ? &col->s : nullptr);
}

// The 128 x 128-block FP8 weight [out, in] and its transpose [in, out] with their scale_inv
// blocks, from the weight cache when valid (same rules as weight_fp8 below).
Fp8State::WeightCache weight_block_fp8(Fp8State& st, int base, const Tensor& w, bool record) {
  const int64_t out = w.size(0), in = w.size(1);
  const DType wdt = st.dtype(base + kWeight);
  Fp8State::WeightCache& c = st.weight_cache(base);
  MEGATRON_CHECK(w.storage_bytes() != 0) << "FP8 weight " << w.str() << ": its model-dtype copy was released";
  const bool on = st.weight_cache_admit(base, 2 * w.numel(), &ops::device_free_bytes);
  if (on && st.weight_cache_hit(base, w, record) && c.q.defined() && c.q_t.defined() && c.s.defined()) return c;
  Fp8State::WeightCache r;
  r.q = Tensor::empty({out, in}, wdt, w.device());
  r.q_t = Tensor::empty({in, out}, wdt, w.device());
  r.s = Tensor::empty({ceil128(out), round4(ceil128(in))}, DType::kFloat32, w.device());
  r.s_t = Tensor::empty({ceil128(in), round4(ceil128(out))}, DType::kFloat32, w.device());
  ops::fp8_block_quantize(w, true, st.config().block_pow2_scales, &r.q, &r.s, &r.q_t, &r.s_t);
  st.count_weight_cast();
  if (on) {
    c.q = r.q;
    c.q_t = r.q_t;
    c.s = r.s;
    c.s_t = r.s_t;
    st.weight_cache_mark(base, w, record);
  }
  return r;
}

// `pre`: x quantized by its producer (both copies); else x is quantized here, with its columnwise
// copy also written into *keep_x_t / *keep_x_st for the wgrad when both are given and
// fused_input_ok (one read of x instead of a second one in backward).
void forward_block(Fp8State& st, int base, const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y,
                   const Tensor* residual, const Fp8Input* pre, Tensor* keep_x_t, Tensor* keep_x_st) {
  const Shape xs = pre ? Shape{pre->q.size(0), pre->q.size(1)} : rows_cols(x);
  const int64_t out = w.size(0);
  BlockQ xq;
  if (pre) {
    MEGATRON_CHECK(pre->s.defined() && pre->q.dtype() == st.dtype(base + kInput))
        << "fp8::linear_forward: blockwise input " << pre->q.str() << " without its scales";
    xq = {pre->q, pre->s};
  } else if (keep_x_t && keep_x_st && fused_input_ok(st, x)) {
    BlockQ xc;
    block_quantize_1d(st, st.dtype(base + kInput), x.view(xs), &xq, &xc);
    *keep_x_t = xc.q;
    *keep_x_st = xc.s;
  } else {
    block_quantize_1d(st, st.dtype(base + kInput), x.view(xs), &xq, nullptr);
  }
  const Fp8State::WeightCache wq = weight_block_fp8(st, base, w, st.recording());
  Tensor y2 = y.view({xs[0], out});
  ops::fp8_block_gemm_tn(xq.q, xq.s, false, wq.q, wq.s, true, y2, 0.0f);
  if (bias) ops::bias_add_(y, *bias);
  if (residual) ops::add_(y, *residual);
}

// `pre`: dy quantized by its producer (both copies); x_t / x_st: x's columnwise copy from the
// forward (Fp8Input::q_t / s_t or keep_x_t / keep_x_st), else x is quantized here.
void backward_block(Fp8State& st, int base, const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx,
                    Tensor* dw, Tensor* dbias, bool accumulate, const Fp8Input* pre, const Tensor* x_t,
                    const Tensor* x_st) {
  const Shape ds = pre ? Shape{pre->q.size(0), pre->q.size(1)} : rows_cols(dy);
  const int64_t N = ds[0], in = w.size(1);
  const bool fp8_wgrad = dw && st.config().wgrad;
  // dy once for both GEMMs: 1 x 128 tiles along out (dgrad) and 128 x 1 along the tokens (wgrad).
  BlockQ dyr, dyc;
  if (pre) {
    MEGATRON_CHECK(pre->s.defined() && pre->s_t.defined() && pre->q.dtype() == st.dtype(base + kGradOutput))
        << "fp8::linear_backward: blockwise dyq " << pre->q.str() << " without its scales";
    dyr = {pre->q, pre->s};
    dyc = {pre->q_t, pre->s_t};
  } else if (dx || fp8_wgrad) {
    block_quantize_1d(st, st.dtype(base + kGradOutput), dy.view(ds), dx ? &dyr : nullptr, fp8_wgrad ? &dyc : nullptr);
  }
  if (dx) {
    const Fp8State::WeightCache wq = weight_block_fp8(st, base, w, /*record=*/false);
    Tensor dx2 = dx->view({N, in});
    ops::fp8_block_gemm_tn(dyr.q, dyr.s, false, wq.q_t, wq.s_t, true, dx2, 0.0f);
  }
  if (dw) {
    if (fp8_wgrad) {
      BlockQ xc;
      if (x_t && x_t->defined() && x_st && x_st->defined()) {
        MEGATRON_CHECK(x_t->dim() == 2 && x_t->size(0) == in && x_t->size(1) == N &&
                       x_t->dtype() == st.dtype(base + kInput))
            << "fp8::linear_backward: x_t " << x_t->str() << " for dy " << dy.str() << " w " << w.str();
        xc = {*x_t, *x_st};  // the forward's columnwise copy: the same bytes as quantizing x again
      } else {
        MEGATRON_CHECK(x.defined()) << "fp8::linear_backward: blockwise wgrad without x or its columnwise copy";
        block_quantize_1d(st, st.dtype(base + kInput), x.view(rows_cols(x)), nullptr, &xc);
      }
      ops::fp8_block_gemm_tn(dyc.q, dyc.s, false, xc.q, xc.s, false, *dw, accumulate ? 1.0f : 0.0f);
    } else {
      ops::linear_backward(dy, x, w, nullptr, dw, nullptr, accumulate);
    }
  }
  if (dbias) ops::linear_backward(dy, x, w, nullptr, nullptr, dbias, accumulate);
}

// ------------------------------------------------------------------ FP8 GEMMs (device tensors)
// The recipe with real FP8 operands: quantize with the role's device-resident scale, FP8 GEMM
// (ops::fp8_gemm_tn), the weight and its transpose cached in FP8. All through the op contract.
float* fptr(Tensor t) { return static_cast<float*>(t.data_ptr()); }

// Quantizes x with role r (q row layout and/or q_t transposed). Tensorwise: scale from x's own
// amax first (recorded into the step amax when `record`).
void quantize_fp8(Fp8State& st, int r, const Tensor& x, bool record, Tensor* q, Tensor* q_t) {
  float* amax = record ? fptr(st.amax(r)) : nullptr;
  if (is_tensorwise(st)) {
    Tensor cur = st.current_amax(r);  // zero here; fp8_scale_from_amax zeroes it again
    ops::fp8_amax(x, fptr(cur));
    ops::fp8_scale_from_amax(cur, fp8_max(st.dtype(r)), st.config().margin, fptr(st.scale(r)), fptr(st.scale_inv(r)),
                             amax);
    amax = nullptr;
  }
  ops::fp8_quantize(x, fptr(st.scale(r)), amax, q, q_t);
}

void check_aligned(const char* what, int64_t v) {
  if (v % 16 != 0)
    user_error("FP8 GEMM (", what, " = ", v, "): cuBLASLt FP8 needs every GEMM dimension divisible by 16; "
               "choose --hidden-size/--ffn-hidden-size/--kv-channels and micro-batch x sequence length accordingly, "
               "or drop --fp8-format");
}

// The FP8 weight (and/or its transpose) for this GEMM, from the weight cache when valid.
// Training forward with the cache on: one pass makes both layouts (the dgrad GEMM of every
// micro-batch of this step reuses the transpose). Buffers of an invalidated entry are reused.
struct WeightOperands {
  Tensor q, q_t;
};
WeightOperands weight_fp8(Fp8State& st, int base, const Tensor& w, bool record, bool need_q, bool need_q_t) {
  const int64_t out = w.size(0), in = w.size(1);
  const DType wdt = st.dtype(base + kWeight);
  Fp8State::WeightCache& c = st.weight_cache(base);
  // --fp8-param-gather: the gathered FP8 parameter and its transpose (post_all_gather_processing).
  if (c.primary && c.valid) {
    MEGATRON_CHECK(c.q.shape() == w.shape()) << "FP8 parameter " << c.q.str() << " for weight " << w.str();
    return {c.q, c.q_t};
  }
  MEGATRON_CHECK(w.storage_bytes() != 0)
      << "FP8 weight " << w.str() << ": its model-dtype copy was released (--fp8-param-gather) and no gathered "
      << "FP8 parameter is valid";
  // FP8 weight + its transpose: 2 bytes per element, admitted against the device's free memory.
  const bool on = st.weight_cache_admit(base, 2 * w.numel(), &ops::device_free_bytes);
  if (on && st.weight_cache_hit(base, w, record) && (!need_q || c.q.defined()) && (!need_q_t || c.q_t.defined()))
    return {c.q, c.q_t};
  // A training forward with the cache on also makes the transpose for this step's backwards.
  const bool make_q = need_q, make_q_t = need_q_t || (on && record);
  auto buffer = [&](Tensor& cached, Shape s) {
    if (on && cached.defined() && cached.shape() == s && cached.dtype() == wdt && cached.device() == w.device())
      return cached;
    return Tensor::empty(s, wdt, w.device());
  };
  WeightOperands r;
  if (make_q) r.q = buffer(c.q, {out, in});
  if (make_q_t) r.q_t = buffer(c.q_t, {in, out});
  quantize_fp8(st, base + kWeight, w, record, make_q ? &r.q : nullptr, make_q_t ? &r.q_t : nullptr);
  st.count_weight_cast();
  if (on) {
    // A backward-only cast (entry invalid, e.g. no forward this step) keeps what it made.
    c.q = make_q ? r.q : Tensor();
    c.q_t = make_q_t ? r.q_t : Tensor();
    st.weight_cache_mark(base, w, record);
  }
  return r;
}

void forward_fp8(Fp8State& st, int base, const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y,
                  const Fp8Input* pre, Tensor* keep_x_t, const Tensor* residual, Tensor* keep_x_st) {
  if (is_blockwise(st)) {
    forward_block(st, base, x, w, bias, y, residual, pre, keep_x_t, keep_x_st);
    return;
  }
  const bool rec = st.recording();
  const Shape xs = pre ? Shape{pre->q.size(0), pre->q.size(1)} : rows_cols(x);
  const int64_t out = w.size(0), in = w.size(1);
  check_aligned("tokens", xs[0]);
  check_aligned("in_features", in);
  check_aligned("out_features", out);
  const DType fwd = st.dtype(base + kInput);
  Tensor xq;
  if (pre) {
    xq = pre->q;  // quantized (and its amax recorded) by the producer
  } else {
    xq = Tensor::empty(xs, fwd, x.device());
    if (keep_x_t && fused_input_ok(st, x)) {
      // One pass writes both layouts; the transpose waits for this micro-batch's wgrad GEMM.
      *keep_x_t = Tensor::empty({xs[1], xs[0]}, fwd, x.device());
      quantize_fp8(st, base + kInput, x, rec, &xq, keep_x_t);
    } else {
      quantize_fp8(st, base + kInput, x, rec, &xq, nullptr);
    }
  }
  const WeightOperands wq = weight_fp8(st, base, w, rec, /*need_q=*/true, /*need_q_t=*/false);
  Tensor y2 = y.view({xs[0], out});
  const float* sx = fptr(st.scale_inv(base + kInput));
  const float* sw = fptr(st.weight_scale_inv(base));
  if (residual && !bias && ops::fp8_gemm_tn_residual(xq, sx, wq.q, sw, residual->view({xs[0], out}), y2,
                                                           /*fast_accum=*/true))
    return;
  ops::fp8_gemm_tn(xq, sx, wq.q, sw, y2, 0.0f, /*fast_accum=*/true);
  if (bias) ops::bias_add_(y, *bias);
  if (residual) ops::add_(y, *residual);
}

void backward_fp8(Fp8State& st, int base, const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx, Tensor* dw,
                   Tensor* dbias, bool accumulate, const Tensor* x_t, const Fp8Input* pre, const Tensor* x_st) {
  if (is_blockwise(st)) {
    backward_block(st, base, dy, x, w, dx, dw, dbias, accumulate, pre, x_t, x_st);
    return;
  }
  const Shape ds = pre ? Shape{pre->q.size(0), pre->q.size(1)} : rows_cols(dy);  // [N, out]
  const int64_t N = ds[0], out = w.size(0), in = w.size(1);
  const bool fp8_wgrad = dw && st.config().wgrad;
  const DType gdt = st.dtype(base + kGradOutput);
  // dy is quantized once for both GEMMs: row layout for dgrad, transposed for wgrad (one pass).
  Tensor dyq, dyq_t;
  if (pre) {
    MEGATRON_CHECK(pre->q.dtype() == gdt && pre->q_t.size(0) == out) << "fp8::linear_backward: dyq " << pre->q.str();
    dyq = pre->q;  // quantized (and its amax recorded) by the producer
    dyq_t = pre->q_t;
  } else {
    if (dx) dyq = Tensor::empty({N, out}, gdt, dy.device());
    if (fp8_wgrad) dyq_t = Tensor::empty({out, N}, gdt, dy.device());
    if (dx || fp8_wgrad)
      quantize_fp8(st, base + kGradOutput, dy, st.recording(), dx ? &dyq : nullptr, fp8_wgrad ? &dyq_t : nullptr);
  }
  const float* sg = fptr(st.scale_inv(base + kGradOutput));
  if (dx) {
    const WeightOperands wq = weight_fp8(st, base, w, /*record=*/false, /*need_q=*/false, /*need_q_t=*/true);
    Tensor dx2 = dx->view({N, in});
    ops::fp8_gemm_tn(dyq, sg, wq.q_t, fptr(st.weight_scale_inv(base)), dx2, 0.0f, false);
  }
  if (dw) {
    if (fp8_wgrad) {
      Tensor xq_t;
      if (x_t && x_t->defined()) {
        MEGATRON_CHECK(x_t->dim() == 2 && x_t->size(0) == in && x_t->size(1) == N &&
                       x_t->dtype() == st.dtype(base + kInput))
            << "fp8::linear_backward: x_t " << x_t->str() << " for dy " << dy.str() << " w " << w.str();
        xq_t = *x_t;  // the forward's transpose: the same bytes as quantizing x again
      } else {
        xq_t = Tensor::empty({in, N}, st.dtype(base + kInput), x.device());
        quantize_fp8(st, base + kInput, x, false, nullptr, &xq_t);
      }
      ops::fp8_gemm_tn(dyq_t, sg, xq_t, fptr(st.scale_inv(base + kInput)), *dw, accumulate ? 1.0f : 0.0f,
                             false);
    } else {
      ops::linear_backward(dy, x, w, nullptr, dw, nullptr, accumulate);
    }
  }
  if (dbias) ops::linear_backward(dy, x, w, nullptr, nullptr, dbias, accumulate);
}
}  // namespace

Tensor quantize_dequantize_cpu(Fp8State& st, int r, const Tensor& x, bool record) {
  MEGATRON_CHECK(x.is_cpu()) << "quantize_dequantize_cpu(" << x.str() << ")";
  if (is_blockwise(st)) return block_quantize_dequantize_cpu(st, r, x, false);
  if (is_tensorwise(st)) {
    Fp8TensorMeta m = st.meta(r);
    m.set_current_scale(host_amax(x), st.config());
    st.set_scale(r, m.scale);
  }
  Tensor q = Tensor::empty(x.shape(), st.dtype(r));
  const float amax = quantize_cpu(x, st.meta(r), q);
  if (record) st.record_host_amax(r, amax);
  Tensor y = Tensor::empty(x.shape(), DType::kFloat32);
  dequantize_cpu(q, st.meta(r).scale_inv, y);
  return y;
}

Tensor block_quantize_dequantize_cpu(const Fp8State& st, int r, const Tensor& x, bool columnwise) {
  MEGATRON_CHECK(x.is_cpu() && is_blockwise(st) && x.dim() >= 1) << "block_quantize_dequantize_cpu(" << x.str() << ")";
  const bool two_d = r % kNumRoles == kWeight;  // weights: 128 x 128 blocks (the same both ways)
  const int64_t C = x.size(-1), R = C ? x.numel() / C : 0;
  const DType dt = st.dtype(r);
  const bool e4 = dt == DType::kFloat8E4M3;
  Tensor x2 = x.view({R, C});
  Tensor y = Tensor::empty(x.shape(), DType::kFloat32);
  float* out = y.data<float>();
  auto dec = [e4](uint8_t b) { return e4 ? e4m3_bits_to_float(b) : e5m2_bits_to_float(b); };
  if (!columnwise || two_d) {
    Tensor q = Tensor::empty({R, C}, dt);
    Tensor s = two_d ? Tensor::empty({ceil128(R), round4(ceil128(C))}, DType::kFloat32)
                     : Tensor::empty({ceil128(C), round4(R)}, DType::kFloat32);
    ops::fp8_block_quantize(x2, two_d, st.config().block_pow2_scales, &q, &s, nullptr, nullptr);
    const auto* qb = static_cast<const uint8_t*>(q.data_ptr());
    const float* sp = s.data<float>();
    const int64_t ld = s.size(1);
    for (int64_t i = 0; i < R; ++i)
      for (int64_t j = 0; j < C; ++j)
        out[i * C + j] = dec(qb[i * C + j]) * (two_d ? sp[(i / 128) * ld + j / 128] : sp[(j / 128) * ld + i]);
  } else {
    Tensor qt = Tensor::empty({C, R}, dt);
    Tensor st_ = Tensor::empty({ceil128(R), round4(C)}, DType::kFloat32);
    ops::fp8_block_quantize(x2, false, st.config().block_pow2_scales, nullptr, nullptr, &qt, &st_);
    const auto* qb = static_cast<const uint8_t*>(qt.data_ptr());
    const float* sp = st_.data<float>();
    const int64_t ld = st_.size(1);
    for (int64_t i = 0; i < R; ++i)
      for (int64_t j = 0; j < C; ++j) out[i * C + j] = dec(qb[j * R + i]) * sp[(i / 128) * ld + j];
  }
  return y;
}

void linear_forward(Fp8State& st, int base, const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y,
                    const Fp8Input* xq, Tensor* keep_x_t, const Tensor* residual, Tensor* keep_x_st) {
  const int64_t in = xq ? xq->shape.back() : x.size(-1);
  MEGATRON_CHECK(w.dim() == 2 && in == w.size(1) && y.size(-1) == w.size(0) && base >= 0 &&
                 base + kNumRoles <= st.num_roles() && (!xq || (xq->defined() && !xq->q.is_cpu())) &&
                 (!residual || (residual->numel() == y.numel() && residual->dtype() == y.dtype())))
      << "fp8::linear_forward: x " << x.str() << " w " << w.str() << " y " << y.str() << " base " << base;
  // Device tensors take the FP8-GEMM recipe, host tensors its emulation (fp8_linear.h).
  if (xq || !x.is_cpu()) {
    forward_fp8(st, base, x, w, bias, y, xq, keep_x_t, residual, keep_x_st);
    return;
  }
  forward_cpu(st, base, x, w, bias, y, residual);
}

void linear_backward(Fp8State& st, int base, const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx,
                     Tensor* dw, Tensor* dbias, bool accumulate, const Tensor* x_t, const Fp8Input* dyq,
                     const Tensor* x_st) {
  const bool have_t = x_t && x_t->defined();
  const int64_t dy_out = dyq ? dyq->shape.back() : dy.size(-1);
  MEGATRON_CHECK(w.dim() == 2 && dy_out == w.size(0) && (x.defined() ? x.size(-1) == w.size(1) : have_t) &&
                 base >= 0 && base + kNumRoles <= st.num_roles() && (!dyq || (dyq->defined() && !dbias)) &&
                 (!dyq || !dw || st.config().wgrad))
      << "fp8::linear_backward: dy " << dy.str() << " x " << x.str() << " w " << w.str();
  // Without x only the FP8 wgrad (from x_t) and dgrad can run.
  MEGATRON_CHECK(x.defined() || (!dbias && (!dw || st.config().wgrad)))
      << "fp8::linear_backward: the bf16 input is needed (bias or --no-fp8-wgrad) but was not kept";
  if (dyq || !dy.is_cpu()) {
    backward_fp8(st, base, dy, x, w, dx, dw, dbias, accumulate, x_t, dyq, x_st);
    return;
  }
  backward_cpu(st, base, dy, x, w, dx, dw, dbias, accumulate);
}

void cast_weight(Fp8State& st, int base, const Tensor& w) {
  MEGATRON_CHECK(w.dim() == 2 && base >= 0 && base + kNumRoles <= st.num_roles())
      << "fp8::cast_weight: w " << w.str() << " base " << base;
  if (is_blockwise(st)) return;
  if (w.is_cpu()) {
    weight_cpu(st, base, w, st.recording());
  } else {
    weight_fp8(st, base, w, st.recording(), /*need_q=*/true, /*need_q_t=*/false);
  }
}

namespace {
// The buffers of a fused producer's [rows, cols] output quantized for role r: q, q_t and, for the
// blockwise recipe, their scale_inv tensors (Fp8Input's layouts), on like's device.
Fp8Input fused_buffers(const Fp8State& st, int r, int64_t rows, int64_t cols, const Tensor& like) {
  const DType dt = st.dtype(r);
  Fp8Input o;
  o.q = Tensor::empty({rows, cols}, dt, like.device());
  o.q_t = Tensor::empty({cols, rows}, dt, like.device());
  if (is_blockwise(st)) {
    o.s = Tensor::empty({ceil128(cols), round4(rows)}, DType::kFloat32, like.device());
    o.s_t = Tensor::empty({ceil128(rows), round4(cols)}, DType::kFloat32, like.device());
  }
  return o;
}
}  // namespace

Fp8Input rmsnorm_fp8(Fp8State& st, int base, const Tensor& x, const Tensor& gamma, float eps, bool zero_centered_gamma,
                     Tensor& rstd) {
  if (!fused_input_ok(st, x) || x.dim() < 1) return {};
  const int64_t h = x.size(-1), rows = h ? x.numel() / h : 0;
  if (rows == 0 || rows % 16 != 0 || h % 16 != 0) return {};
  auto f32_bf16 = [](DType t) { return t == DType::kBFloat16 || t == DType::kFloat32; };
  if (!f32_bf16(x.dtype()) || !f32_bf16(gamma.dtype())) return {};  // the fused kernel's types
  Fp8Input r = fused_buffers(st, base + kInput, rows, h, x);
  r.shape = x.shape();
  r.dtype = x.dtype();
  ops::rmsnorm_rstd(x, gamma, eps, rstd);
  if (is_blockwise(st)) {
    if (!ops::fp8_block_rmsnorm_quantize(x, gamma, rstd, zero_centered_gamma, x.dtype(),
                                         st.config().block_pow2_scales, &r.q, &r.s, &r.q_t, &r.s_t))
      return {};
    return r;
  }
  float* amax = st.recording() ? fptr(st.amax(base + kInput)) : nullptr;
  if (!ops::fp8_rmsnorm_quantize(x, gamma, rstd, zero_centered_gamma, x.dtype(), fptr(st.scale(base + kInput)),
                                       amax, &r.q, &r.q_t))
    return {};
  return r;
}

Fp8Input swiglu_fp8(Fp8State& st, int base, const Tensor& fc1_out) {
  if (!fused_input_ok(st, fc1_out) || fc1_out.dim() < 1 || fc1_out.size(-1) % 2 != 0) return {};
  const int64_t f = fc1_out.size(-1) / 2, rows = f ? fc1_out.numel() / (2 * f) : 0;
  if (rows == 0 || rows % 16 != 0 || f % 16 != 0) return {};
  Fp8Input r = fused_buffers(st, base + kInput, rows, f, fc1_out);
  r.shape = fc1_out.shape();
  r.shape.back() = f;
  r.dtype = fc1_out.dtype();
  if (is_blockwise(st)) {
    if (!ops::fp8_block_swiglu_quantize(fc1_out, fc1_out.dtype(), st.config().block_pow2_scales, &r.q, &r.s, &r.q_t,
                                        &r.s_t))
      return {};
    return r;
  }
  float* amax = st.recording() ? fptr(st.amax(base + kInput)) : nullptr;
  if (!ops::fp8_swiglu_quantize(fc1_out, fc1_out.dtype(), fptr(st.scale(base + kInput)), amax, &r.q, &r.q_t))
    return {};
  return r;
}

Fp8Input swiglu_backward_fp8(Fp8State& st, int base, const Tensor& dact, const Tensor& fc1_out) {
  if (!fused_input_ok(st, fc1_out) || dact.device() != fc1_out.device() || fc1_out.dim() < 1 ||
      fc1_out.size(-1) % 2 != 0)
    return {};
  const int64_t two_f = fc1_out.size(-1), rows = two_f ? fc1_out.numel() / two_f : 0;
  if (rows == 0 || rows % 16 != 0 || two_f % 32 != 0 || dact.numel() * 2 != fc1_out.numel()) return {};
  Fp8Input r = fused_buffers(st, base + kGradOutput, rows, two_f, fc1_out);
  r.shape = fc1_out.shape();
  r.dtype = dact.dtype();
  if (is_blockwise(st)) {
    if (!ops::fp8_block_swiglu_backward_quantize(dact, fc1_out, st.config().block_pow2_scales, &r.q, &r.s, &r.q_t,
                                                 &r.s_t))
      return {};
    return r;
  }
  float* amax = st.recording() ? fptr(st.amax(base + kGradOutput)) : nullptr;
  if (!ops::fp8_swiglu_backward_quantize(dact, fc1_out, fptr(st.scale(base + kGradOutput)), amax, &r.q, &r.q_t))
    return {};
  return r;
}

}  // namespace megatron::fp8
