// The FP8 experts' A/B leg of `gpu_bench moe_fp8` (docs/moe.md "FP8 experts", Session 11), kept free
// of CUDA like moe_layer_leg.h: the Experts module alone (E SwiGLU experts, hidden H, ffn F, on
// given routed-row counts) forward + backward, in bf16 and in FP8 under each of
//   off          MEGATRON_MOE_FP8_FUSE=0, no weight cache (session 10's path; every call casts each
//                expert weight twice: E4M3 in the forward, its transpose in the backward);
//   on           MEGATRON_MOE_FP8_FUSE=1, no weight cache;
//   cache_first  on + the weight cache (docs/fp8.md "Weight cache") invalidated before every call:
//                the first micro-batch of a step, one pass writes the weight and its transpose;
//   cache_later  on + the cache valid: a later micro-batch of the same step, no weight cast;
// and checks that off, on and cache_first give the same bits (outputs, input gradients,
// probability gradients, every main grad) from zeroed main grads.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "bench/gpu/moe_layer_leg.h"
#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/tensor/tensor.h"
#include "megatron/core/transformer/moe/experts.h"

namespace megatron::bench {

/// Times in ms (as the timer returns them) and the bitwise comparison of the FP8 variants.
struct MoEFp8AbResult {
  double bf16_ms = 0, off_ms = 0, on_ms = 0, cache_first_ms = 0, cache_later_ms = 0;
  bool same_bits = false;  ///< off, on and cache_first: identical y, dx, dprobs and main grads
  std::string detail;      ///< the first difference found, or the number of tensors compared
};

/// Runs the leg (see the file comment). `counts`: E routed-row counts (their sum R rows); params,
/// activations and gradients in `dt` on `dev`, fp32 main grads; rnd / time as moe_layer_leg's.
/// Sets and finally unsets MEGATRON_MOE_FP8_FUSE. Throws what the Experts module throws.
inline MoEFp8AbResult moe_fp8_experts_ab(int64_t H, int64_t F, const std::vector<int64_t>& counts, int64_t K,
                                         DType dt, Device dev, const fp8::Fp8Config& f8,
                                         const std::function<Tensor(const Shape&, DType, float)>& rnd,
                                         const std::function<double(const std::function<void()>&)>& time) {
  using namespace megatron::transformer;
  using namespace megatron::transformer::moe;
  const int64_t E = static_cast<int64_t>(counts.size());
  const TransformerConfig cb = moe_leg_config(H, F, E, K, dt), c8 = moe_leg_config(H, F, E, K, dt, &f8);
  auto st = std::make_shared<fp8::Fp8State>(f8, dev);
  st->set_weight_cache_mode(fp8::Fp8State::WeightCacheMode::kOff);
  ParamRegistry rb, r8;
  Experts eb(rb, "decoder.layers.0.mlp.experts", cb, 0, E, 0, 1);
  Experts e8(r8, "decoder.layers.0.mlp.experts", c8, 0, E, 0, 1, st);
  for (ParamRegistry* r : {&rb, &r8})
    for (size_t i = 0; i < r->params().size(); ++i) {
      Parameter& p = r->params()[i];
      p.data = rnd(r->local_shape(i), dt, 0.02f);
      p.main_grad = Tensor::zeros(r->local_shape(i), DType::kFloat32, dev);
    }
  int64_t R = 0;
  for (int64_t n : counts) R += n;
  const Tensor x = rnd({R, H}, dt, 1.0f), pr = rnd({R}, DType::kFloat32, 0.3f), dy = rnd({R, H}, dt, 0.1f);
  Tensor y, dx;
  std::vector<double> dprobs;
  auto call = [&](const Experts& e) {
    ExpertsCtx ctx;
    y = e.forward(x, counts, pr, ctx);
    dx = e.backward(dy, ctx, &dprobs);
  };
  auto fuse = [](const char* v) { setenv("MEGATRON_MOE_FP8_FUSE", v, 1); };
  MoEFp8AbResult res;
  res.bf16_ms = time([&] { call(eb); });
  fuse("0");
  res.off_ms = time([&] { call(e8); });
  fuse("1");
  res.on_ms = time([&] { call(e8); });
  st->set_weight_cache_mode(fp8::Fp8State::WeightCacheMode::kOn);
  res.cache_first_ms = time([&] {
    st->invalidate_weight_cache();
    call(e8);
  });
  res.cache_later_ms = time([&] { call(e8); });

  // Bits: one call of each variant from zeroed main grads (the scales do not move without a step
  // boundary, so every call quantizes with the same scales).
  struct Out {
    std::vector<Tensor> t;  // y, dx, then every main grad (device copies)
    std::vector<double> dp;
  };
  auto once = [&](const char* f, bool cache) {
    fuse(f);
    st->set_weight_cache_mode(cache ? fp8::Fp8State::WeightCacheMode::kOn : fp8::Fp8State::WeightCacheMode::kOff);
    st->invalidate_weight_cache();
    for (auto& p : r8.params()) p.main_grad.zero_();
    call(e8);
    Out o{{y, dx}, dprobs};
    for (auto& p : r8.params()) o.t.push_back(p.main_grad.clone());
    return o;
  };
  const Out ref = once("0", false);
  res.same_bits = true;
  int64_t compared = 0;
  using Variant = std::tuple<const char*, bool, const char*>;  // MEGATRON_MOE_FP8_FUSE, cache, name
  for (auto [f, cache, name] : {Variant{"1", false, "on"}, Variant{"1", true, "cache_first"}}) {
    const Out o = once(f, cache);
    if (o.dp != ref.dp) {
      res.same_bits = false;
      res.detail = std::string(name) + ": dprobs differ from off";
      break;
    }
    for (size_t i = 0; i < ref.t.size() && res.same_bits; ++i) {
      const Tensor a = ref.t[i].to(Device::cpu()), b = o.t[i].to(Device::cpu());
      ++compared;
      if (a.nbytes() != b.nbytes() || std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) != 0) {
        res.same_bits = false;
        const std::string what = i == 0 ? "y" : i == 1 ? "dx" : r8.params()[i - 2].name;
        res.detail = std::string(name) + ": " + what + " differs from off";
      }
    }
    if (!res.same_bits) break;
  }
  if (res.same_bits)
    res.detail = std::to_string(compared) + " tensors and 2 x " + std::to_string(R) + " dprobs compared";
  unsetenv("MEGATRON_MOE_FP8_FUSE");
  return res;
}

}  // namespace megatron::bench
