#include "megatron/core/fp8/fp8_recipe.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "megatron/core/utils/errors.h"

namespace megatron::fp8 {

Fp8Format parse_fp8_format(const std::string& v) {
  if (v == "e4m3") return Fp8Format::kE4M3;
  if (v == "hybrid") return Fp8Format::kHybrid;
  user_error("--fp8-format: '", v, "' is not one of e4m3, hybrid");
}

Fp8Recipe parse_fp8_recipe(const std::string& v) {
  if (v == "delayed") return Fp8Recipe::kDelayed;
  if (v == "tensorwise") return Fp8Recipe::kTensorwise;
  if (v == "blockwise") return Fp8Recipe::kBlockwise;
  if (v == "mxfp8" || v == "custom")
    user_error("--fp8-recipe ", v, " is not supported (Hopper recipes here: delayed, tensorwise, blockwise)");
  user_error("--fp8-recipe: '", v, "' is not one of delayed, tensorwise, blockwise");
}

AmaxComputeAlgo parse_amax_compute_algo(const std::string& v) {
  if (v == "max") return AmaxComputeAlgo::kMax;
  if (v == "most_recent") return AmaxComputeAlgo::kMostRecent;
  user_error("--fp8-amax-compute-algo: '", v, "' is not one of max, most_recent");
}

float fp8_max(DType t) {
  if (t == DType::kFloat8E4M3) return 448.0f;
  if (t == DType::kFloat8E5M2) return 57344.0f;
  MEGATRON_CHECK(false) << "fp8_max of non-FP8 dtype " << dtype_name(t);
  return 0;
}

DType fp8_dtype_for(Fp8Format f, bool is_gradient) {
  return (f == Fp8Format::kHybrid && is_gradient) ? DType::kFloat8E5M2 : DType::kFloat8E4M3;
}

Fp8TensorMeta::Fp8TensorMeta(int history_len, DType fp8_dtype)
    : amax_history(static_cast<size_t>(std::max(1, history_len)), 0.0f), dtype(fp8_dtype) {}

void Fp8TensorMeta::record_amax(float amax) {
  // NaN must propagate (a NaN amax keeps the old scale in update()).
  if (std::isnan(amax) || amax > amax_history[0]) amax_history[0] = amax;
}

namespace {
float compute_scale(float amax, float old_scale, float fmax, int margin) {
  if (!std::isfinite(amax) || !(amax > 0.0f)) return old_scale;
  float s = (fmax / amax) / std::ldexp(1.0f, margin);
  if (std::isinf(s)) s = FLT_MAX;
  return s;
}
}  // namespace

void Fp8TensorMeta::update(const Fp8Config& cfg) {
  float used;
  if (cfg.amax_compute_algo == AmaxComputeAlgo::kMax) {
    // fmaxf semantics as TE's kernel: a NaN entry is ignored, the max starts at 0.
    used = 0.0f;
    for (float a : amax_history) used = std::fmax(used, a);
  } else {
    used = amax_history[0];
  }
  scale = compute_scale(used, scale, fp8_max(dtype), cfg.margin);
  scale_inv = 1.0f / scale;
  std::rotate(amax_history.begin(), amax_history.begin() + 1, amax_history.end());
  amax_history[0] = 0.0f;
}

void Fp8TensorMeta::set_current_scale(float amax, const Fp8Config& cfg) {
  scale = compute_scale(amax, scale, fp8_max(dtype), cfg.margin);
  scale_inv = 1.0f / scale;
}

float quantize_cpu(const Tensor& x, const Fp8TensorMeta& meta, Tensor& q) {
  MEGATRON_CHECK(x.is_cpu() && q.is_cpu() && x.numel() == q.numel() && dtype_size(q.dtype()) == 1)
      << "quantize_cpu(" << x.str() << " -> " << q.str() << ")";
  std::vector<float> v = x.to_float_vector();
  auto* out = static_cast<uint8_t*>(q.data_ptr());
  float amax = 0.0f;
  const bool e4m3 = meta.dtype == DType::kFloat8E4M3;
  for (size_t i = 0; i < v.size(); ++i) {
    float a = std::fabs(v[i]);
    if (std::isnan(a) || a > amax) amax = a;
    float s = v[i] * meta.scale;
    out[i] = e4m3 ? float_to_e4m3_bits(s) : float_to_e5m2_bits(s);
  }
  return amax;
}

void dequantize_cpu(const Tensor& q, float scale_inv, Tensor& y) {
  MEGATRON_CHECK(q.is_cpu() && y.is_cpu() && q.numel() == y.numel() && y.dtype() == DType::kFloat32)
      << "dequantize_cpu(" << q.str() << " -> " << y.str() << ")";
  const auto* in = static_cast<const uint8_t*>(q.data_ptr());
  float* out = y.data<float>();
  const bool e4m3 = q.dtype() == DType::kFloat8E4M3;
  for (int64_t i = 0; i < q.numel(); ++i)
    out[i] = (e4m3 ? e4m3_bits_to_float(in[i]) : e5m2_bits_to_float(in[i])) * scale_inv;
}

}  // namespace megatron::fp8
