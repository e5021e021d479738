// --fp8-output-proj on the CPU (docs/fp8.md "FP8 output layer"): the output layer's GEMM runs the
// FP8 recipe with roles of its own, and its logits equal an independent quantize-then-matmul
// reference written here from the rules in docs/fp8.md -- not from our FP8 code:
//
//   * E4M3 values enumerated from the format (bias 7, 3 mantissa bits, subnormals 2^-6 * m/8, the
//     top code S.1111.111 NaN, largest finite 448); q = the nearest value to v * scale (fp32
//     product), ties to the even code, |v * scale| >= 448 saturates to +-448;
//   * tensorwise: scale = 448 / amax(tensor) (fp32 division); delayed: scale = 448 / amax recorded
//     in the previous training step (history 1, most_recent); blockwise: one scale per 1 x 128 tile
//     of the input (per row here: hidden 32 < 128) and per 128 x 128 block of the weight (one block
//     here), rounded down to a power of 2;
//   * dequantize q * (1 / scale), multiply in float64.
//
// The model is a last pipeline stage without decoder layers (final RMSNorm + output layer), fed
// hidden states whose rows have a sum of squares of exactly 32 * 64^2: the RMSNorm output is then
// exactly h / 64 (mean 4096 + eps rounds to 4096 in fp32; gamma is 1 at init), so the reference
// knows the output layer's input bit for bit.
//
// Tolerance: the model multiplies the dequantized fp32 operands with an fp32 GEMM (K = 32), the
// reference in float64: |model - ref| <= (K + 2) * 2^-24 * sum_k |a_k b_k| (fp32 accumulation of K
// products plus the rounding of each dequantized operand); the test uses 4e-6 * sum|a b|. Negative
// control: the unquantized product differs from the FP8 logits by more than 100x that bound, so
// the check sees the quantization; with the flag off the logits equal the unquantized product
// within the same bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/utils/errors.h"
#include "megatron/training/arguments.h"
#include "megatron/training/config_from_args.h"
#include "test_utils/tiny_model.h"

namespace megatron {
namespace {

using models::gpt::GPTModel;
using models::gpt::GPTModelParallel;
using transformer::TransformerConfig;

constexpr int64_t kHidden = 32, kVocab = 64, kSeq = 8, kBatch = 2;

// All finite non-negative E4M3 values, index = code & 0x7f (code 0x7f is NaN, left out).
std::vector<double> e4m3_values() {
  std::vector<double> v;
  for (int e = 0; e < 16; ++e)
    for (int m = 0; m < 8; ++m) {
      if (e == 15 && m == 7) continue;
      v.push_back(e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7));
    }
  return v;
}

// Round-to-nearest-even onto E4M3 with saturation (first principles, see the file comment).
double to_e4m3(float scaled) {
  static const std::vector<double> vals = e4m3_values();
  const double a = std::fabs(static_cast<double>(scaled));
  double q;
  if (a >= 448.0) {
    q = 448.0;
  } else {
    size_t hi = std::upper_bound(vals.begin(), vals.end(), a) - vals.begin();  // vals[hi-1] <= a < vals[hi]
    const size_t lo = hi - 1;
    const double dlo = a - vals[lo], dhi = vals[hi] - a;
    q = dlo < dhi ? vals[lo] : dhi < dlo ? vals[hi] : (lo % 2 == 0 ? vals[lo] : vals[hi]);
  }
  return scaled < 0 ? -q : q;
}

double amax(const std::vector<float>& x) {
  double a = 0;
  for (float v : x) a = std::max(a, std::fabs(static_cast<double>(v)));
  return a;
}

// Quantize-dequantize of x with `scale` (the recipe's fp32 scale), in float64.
std::vector<double> qdq(const std::vector<float>& x, float scale) {
  const float inv = 1.0f / scale;
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = to_e4m3(x[i] * scale) * static_cast<double>(inv);
  return out;
}

float pow2_floor(float s) {
  int e;
  std::frexp(s, &e);  // s = f * 2^e, f in [0.5, 1)
  return std::ldexp(1.0f, e - 1);
}

// Hidden states [s, b, h] whose rows have sum of squares exactly 32 * 64^2 = 131072 (integers,
// varied magnitudes), so RMSNorm gives exactly h / 64. `salt` varies the pattern.
std::vector<float> exact_rows(int salt) {
  std::vector<float> h;
  uint32_t st = 12345u + 977u * static_cast<uint32_t>(salt);
  auto rnd = [&] {
    st = st * 1664525u + 1013904223u;
    return static_cast<int>((st >> 8) % 121) - 60;  // [-60, 60]
  };
  const int64_t target = 32 * 64 * 64;
  for (int64_t r = 0; r < kSeq * kBatch; ++r) {
    for (;;) {
      std::vector<int> v(kHidden - 2);
      int64_t ss = 0;
      for (int& x : v) {
        x = rnd() / (1 + (r + (&x - v.data())) % 3);  // mixed magnitudes
        ss += int64_t(x) * x;
      }
      const int64_t rem = target - ss;
      if (rem < 0) continue;
      bool found = false;
      for (int64_t a = 0; a * a <= rem && !found; ++a) {
        const int64_t b2 = rem - a * a;
        const int64_t b = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(b2))));
        if (b * b == b2) {
          v.push_back(static_cast<int>(a) * ((r % 2) ? -1 : 1));
          v.push_back(static_cast<int>(b));
          found = true;
        }
      }
      if (!found) continue;
      for (int x : v) h.push_back(static_cast<float>(x));
      break;
    }
  }
  return h;
}

TransformerConfig head_config(fp8::Fp8Recipe recipe, bool output_proj) {
  TransformerConfig c = megatron::testing::tiny_llama_config(kHidden, 2, 64);
  fp8::Fp8Config f;
  f.recipe = recipe;
  f.output_proj = output_proj;
  c.fp8 = f;
  return c;
}

GPTModelParallel last_stage_without_layers(const TransformerConfig& c) {
  GPTModelParallel p;
  p.pre_process = false;
  p.layer_offset = c.num_layers;
  p.num_layers = 0;
  return p;
}

datasets::GPTBatch labels_batch() {
  std::vector<int64_t> lab(kBatch * kSeq);
  for (size_t i = 0; i < lab.size(); ++i) lab[i] = static_cast<int64_t>((5 * i + 1) % kVocab);
  datasets::GPTBatch out;
  out.labels = Tensor::from_vector_i64(lab, {kBatch, kSeq});
  return out;
}

std::vector<float> output_weight(GPTModel& m) {
  for (auto& p : m.parameters())
    if (p.name == "output_layer.weight") return p.data.to_float_vector();
  ADD_FAILURE() << "no output_layer.weight";
  return {};
}

// Runs an evaluation forward of hidden states `h` (rows exact_rows) and returns the logits [n, V].
std::vector<float> eval_logits(GPTModel& m, const std::vector<float>& h) {
  m.set_input_tensor(Tensor::from_vector(h, {kSeq, kBatch, kHidden}));
  m.forward(labels_batch(), /*training=*/false);
  return m.last_logits().to_float_vector();
}

struct Check {
  double max_err_over_bound = 0;  // max_n,v |model - ref| / (4e-6 * sum|ab|)
  double max_rel_unquantized = 0;  // max_n,v |model - unquantized| / (4e-6 * sum|ab|)
};

// Compares logits [n, V] with x_ref [n, h] @ w_ref[V, h]^T (float64) and with the unquantized
// product of x, w.
Check compare(const std::vector<float>& logits, const std::vector<double>& xr, const std::vector<double>& wr,
              const std::vector<float>& x, const std::vector<float>& w) {
  Check c;
  const int64_t n = kSeq * kBatch;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t v = 0; v < kVocab; ++v) {
      double ref = 0, mag = 0, plain = 0;
      for (int64_t k = 0; k < kHidden; ++k) {
        ref += xr[i * kHidden + k] * wr[v * kHidden + k];
        mag += std::fabs(xr[i * kHidden + k] * wr[v * kHidden + k]);
        plain += static_cast<double>(x[i * kHidden + k]) * w[v * kHidden + k];
      }
      const double bound = 4e-6 * mag + 1e-30;
      const double got = logits[i * kVocab + v];
      c.max_err_over_bound = std::max(c.max_err_over_bound, std::fabs(got - ref) / bound);
      c.max_rel_unquantized = std::max(c.max_rel_unquantized, std::fabs(got - plain) / bound);
    }
  return c;
}

std::vector<float> normed(const std::vector<float>& h) {
  std::vector<float> x(h.size());
  for (size_t i = 0; i < h.size(); ++i) x[i] = h[i] / 64.0f;  // exact (see exact_rows)
  return x;
}

TEST(Fp8OutputProj, FlagReachesTheConfigAndNeedsFp8Format) {
  using namespace megatron::training;
  std::vector<std::string> f = megatron::testing::tiny_gpt_flags("1e-3");
  auto parsed = [&](std::vector<std::string> extra) {
    std::vector<std::string> v = f;
    v.insert(v.end(), extra.begin(), extra.end());
    Arguments a = parse_args(v);
    validate_args(a);
    return core_transformer_config_from_args(a);
  };
  auto c = parsed({"--fp8-format", "hybrid", "--fp8-output-proj"});
  ASSERT_TRUE(c.fp8.has_value());
  EXPECT_TRUE(c.fp8->output_proj);
  EXPECT_FALSE(parsed({"--fp8-format", "hybrid"}).fp8->output_proj);
  EXPECT_TRUE(parsed({"--fp8-format", "hybrid", "--fp8-recipe", "blockwise", "--fp8-output-proj"}).fp8->output_proj);
  try {
    parsed({"--fp8-output-proj"});
    ADD_FAILURE() << "--fp8-output-proj without --fp8-format was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--fp8-output-proj needs --fp8-format"), std::string::npos) << e.what();
  }
}

TEST(Fp8OutputProj, RegistersOutputLayerRolesAfterTheDecoder) {
  TransformerConfig c = head_config(fp8::Fp8Recipe::kDelayed, true);
  GPTModel m(c, kVocab, kSeq, 1234);
  fp8::Fp8State& st = *m.fp8_state();
  ASSERT_EQ(st.num_roles(), (2 * 4 + 1) * fp8::kNumRoles);
  const int base = st.find_linear("output_layer");
  EXPECT_EQ(base, 2 * 4 * fp8::kNumRoles);
  EXPECT_EQ(st.dtype(base + fp8::kInput), DType::kFloat8E4M3);
  EXPECT_EQ(st.dtype(base + fp8::kWeight), DType::kFloat8E4M3);
  EXPECT_EQ(st.dtype(base + fp8::kGradOutput), DType::kFloat8E5M2);  // hybrid: E5M2 gradients
  GPTModel off(head_config(fp8::Fp8Recipe::kDelayed, false), kVocab, kSeq, 1234);
  EXPECT_EQ(off.fp8_state()->find_linear("output_layer"), -1);
  // The checkpoint carries the output layer's histories and scales.
  int keys = 0;
  for (const auto& t : st.checkpoint_tensors())
    keys += t.key.rfind("output_layer._extra_state.fp8.", 0) == 0;
  EXPECT_EQ(keys, 3);
}

TEST(Fp8OutputProj, TensorwiseLogitsEqualQuantizeThenMatmul) {
  TransformerConfig c = head_config(fp8::Fp8Recipe::kTensorwise, true);
  GPTModel m(c, kVocab, kSeq, 1234, Device::cpu(), last_stage_without_layers(c));
  const std::vector<float> h = exact_rows(0), x = normed(h), w = output_weight(m);
  const std::vector<float> logits = eval_logits(m, h);
  const Check k = compare(logits, qdq(x, 448.0f / static_cast<float>(amax(x))),
                          qdq(w, 448.0f / static_cast<float>(amax(w))), x, w);
  EXPECT_LE(k.max_err_over_bound, 1.0);
  EXPECT_GT(k.max_rel_unquantized, 100.0);  // the flag changes the numerics

  // Flag off: the same model's logits are the unquantized product.
  TransformerConfig c0 = head_config(fp8::Fp8Recipe::kTensorwise, false);
  GPTModel m0(c0, kVocab, kSeq, 1234, Device::cpu(), last_stage_without_layers(c0));
  std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end());
  EXPECT_EQ(output_weight(m0), w);
  EXPECT_LE(compare(eval_logits(m0, h), xd, wd, x, w).max_err_over_bound, 1.0);
}

TEST(Fp8OutputProj, DelayedLogitsUseTheLastStepsAmaxes) {
  TransformerConfig c = head_config(fp8::Fp8Recipe::kDelayed, true);
  GPTModel m(c, kVocab, kSeq, 1234, Device::cpu(), last_stage_without_layers(c));
  fp8::Fp8State& st = *m.fp8_state();
  const int base = st.find_linear("output_layer");
  ASSERT_GE(base, 0);
  const std::vector<float> h1 = exact_rows(1), x1 = normed(h1), w = output_weight(m);
  // Step 1 (training): scale 1 (TE's initial scale) for every role; amaxes recorded.
  m.set_input_tensor(Tensor::from_vector(h1, {kSeq, kBatch, kHidden}));
  Tensor loss = m.forward(labels_batch(), /*training=*/true);
  const std::vector<float> logits1 = m.last_logits().to_float_vector();
  EXPECT_LE(compare(logits1, qdq(x1, 1.0f), qdq(w, 1.0f), x1, w).max_err_over_bound, 1.0);
  Tensor dloss = Tensor::zeros(loss.shape(), DType::kFloat32);
  dloss.fill_(1.0f / (kSeq * kBatch));
  m.backward(dloss);
  EXPECT_FLOAT_EQ(st.amax(base + fp8::kInput).item(), static_cast<float>(amax(x1)));
  EXPECT_FLOAT_EQ(st.amax(base + fp8::kWeight).item(), static_cast<float>(amax(w)));
  EXPECT_GT(st.amax(base + fp8::kGradOutput).item(), 0.0f);
  st.reduce_and_update(nullptr);
  // Step 2: scale = 448 / amax of step 1 (history 1, most_recent), applied to new inputs.
  const std::vector<float> h2 = exact_rows(2), x2 = normed(h2);
  const float sx = 448.0f / static_cast<float>(amax(x1)), sw = 448.0f / static_cast<float>(amax(w));
  EXPECT_FLOAT_EQ(st.host_scale(base + fp8::kInput), sx);
  EXPECT_FLOAT_EQ(st.host_scale(base + fp8::kWeight), sw);
  const Check k2 = compare(eval_logits(m, h2), qdq(x2, sx), qdq(w, sw), x2, w);
  EXPECT_LE(k2.max_err_over_bound, 1.0);
  EXPECT_GT(k2.max_rel_unquantized, 100.0);
}

TEST(Fp8OutputProj, BlockwiseLogitsEqualQuantizeThenMatmul) {
  TransformerConfig c = head_config(fp8::Fp8Recipe::kBlockwise, true);
  GPTModel m(c, kVocab, kSeq, 1234, Device::cpu(), last_stage_without_layers(c));
  const std::vector<float> h = exact_rows(3), x = normed(h), w = output_weight(m);
  // Input: one 1 x 128 tile per row (hidden 32); weight: one 128 x 128 block (64 x 32).
  std::vector<double> xr(x.size());
  for (int64_t r = 0; r < kSeq * kBatch; ++r) {
    std::vector<float> row(x.begin() + r * kHidden, x.begin() + (r + 1) * kHidden);
    const std::vector<double> q = qdq(row, pow2_floor(448.0f / static_cast<float>(amax(row))));
    std::copy(q.begin(), q.end(), xr.begin() + r * kHidden);
  }
  const Check k = compare(eval_logits(m, h), xr, qdq(w, pow2_floor(448.0f / static_cast<float>(amax(w)))), x, w);
  EXPECT_LE(k.max_err_over_bound, 1.0);
  EXPECT_GT(k.max_rel_unquantized, 100.0);
}

// (b) The per-token loss with the flag stays within the bound the logits' error implies: cross
// entropy's gradient with respect to the logits is softmax - onehot (l1 norm <= 2), so
// |loss_fp8 - loss| <= 2 max_v |logits_fp8 - logits|; and that logits error is itself within the
// FP8 GEMM error bound sum_k (|dx||w| + |x||dw| + |dx||dw|) with |dx| <= 2^-4 |x| (E4M3 half-ulp
// for normal values) + 2^-10 / scale (half the smallest subnormal, absolute), likewise dw.
TEST(Fp8OutputProj, LossWithinTheBoundOfTheLogitsError) {
  const std::vector<float> h = exact_rows(4), x = normed(h);
  TransformerConfig c = head_config(fp8::Fp8Recipe::kTensorwise, true);
  TransformerConfig c0 = head_config(fp8::Fp8Recipe::kTensorwise, false);
  GPTModel m(c, kVocab, kSeq, 1234, Device::cpu(), last_stage_without_layers(c));
  GPTModel m0(c0, kVocab, kSeq, 1234, Device::cpu(), last_stage_without_layers(c0));
  const std::vector<float> w = output_weight(m);
  auto loss = [&](GPTModel& g) {
    g.set_input_tensor(Tensor::from_vector(h, {kSeq, kBatch, kHidden}));
    return g.forward(labels_batch(), false).to_float_vector();  // [b, s]
  };
  const std::vector<float> l8 = loss(m), l0 = loss(m0);
  const std::vector<float> z8 = m.last_logits().to_float_vector(), z0 = m0.last_logits().to_float_vector();
  const double sx = 448.0 / amax(x), sw = 448.0 / amax(w);
  double worst_ratio = 0, total_diff = 0;
  for (int64_t s = 0; s < kSeq; ++s)
    for (int64_t b = 0; b < kBatch; ++b) {
      const int64_t i = s * kBatch + b;  // logits are [s, b, V]
      double dz = 0, bound = 0;
      for (int64_t v = 0; v < kVocab; ++v) {
        dz = std::max(dz, std::fabs(static_cast<double>(z8[i * kVocab + v]) - z0[i * kVocab + v]));
        double e = 0;
        for (int64_t k = 0; k < kHidden; ++k) {
          const double a = std::fabs(x[i * kHidden + k]), ww = std::fabs(w[v * kHidden + k]);
          const double da = a / 16 + std::ldexp(1.0, -10) / sx, dw = ww / 16 + std::ldexp(1.0, -10) / sw;
          e += da * ww + a * dw + da * dw;
        }
        bound = std::max(bound, e);
      }
      EXPECT_LE(dz, bound + 1e-6);
      const double dl = std::fabs(static_cast<double>(l8[b * kSeq + s]) - l0[b * kSeq + s]);
      EXPECT_LE(dl, 2 * dz + 1e-6) << "token " << s << "," << b;
      worst_ratio = std::max(worst_ratio, dl / (2 * bound));
      total_diff += dl;
    }
  EXPECT_LE(worst_ratio, 1.0);
  EXPECT_GT(total_diff, 0.0);  // the flag does change the loss
}

}  // namespace
}  // namespace megatron
