#include "megatron/core/transformer/moe/experts.h"

#include <algorithm>
#include <cmath>

#include "megatron/core/fp8/fp8_linear.h"
#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/ops/fp8_moe.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/transformer/moe/moe_utils.h"
#include "megatron/core/utils/env.h"
#include "megatron/core/utils/errors.h"

namespace megatron::transformer::moe {

bool moe_fp8_fuse_enabled() { return env_switch("MEGATRON_MOE_FP8_FUSE", true); }

namespace {

ParamRef add_expert_param(ParamRegistry& reg, const std::string& name, Shape global, int partition_dim, int stride,
                          int etp_rank, int etp_size, float std) {
  Parameter p;
  p.name = name;
  p.global_shape = global;
  p.tensor_parallel = partition_dim >= 0 && etp_size > 1;
  p.partition_dim = etp_size > 1 ? partition_dim : -1;
  p.partition_stride = stride;
  p.tp_rank = etp_rank;
  p.tp_size = etp_size;
  p.init = InitKind::kNormal;
  p.init_std = std;
  Shape local = global;
  if (etp_size > 1) {
    if (global[static_cast<size_t>(partition_dim)] % (etp_size * stride) != 0)
      user_error(name, ": dimension ", global[static_cast<size_t>(partition_dim)],
                 " is not divisible by --expert-tensor-parallel-size ", etp_size, stride > 1 ? " times 2 (SwiGLU halves)" : "");
    local[static_cast<size_t>(partition_dim)] /= etp_size;
  }
  return ParamRef(&reg, reg.add(std::move(p), local));
}

}  // namespace

Experts::Experts(ParamRegistry& reg, const std::string& prefix, const TransformerConfig& config, int64_t first_expert,
                 int64_t num_local_experts, int etp_rank, int etp_size, std::shared_ptr<fp8::Fp8State> fp8)
    : config_(config), ffn_local_(config.moe_ffn_hidden_size / etp_size),
      recompute_act_(config.moe_grouped_gemm && config.recompute_granularity == RecomputeGranularity::kSelective &&
                     std::count(config.recompute_modules.begin(), config.recompute_modules.end(), "moe_act") > 0),
      fp8_(std::move(fp8)) {
  MEGATRON_CHECK(!config.add_bias_linear) << "MoE experts with bias";
  const int64_t fc1_rows = config.gated_linear_unit ? 2 * config.moe_ffn_hidden_size : config.moe_ffn_hidden_size;
  const float out_std = config.init_method_std / std::sqrt(2.0f * static_cast<float>(config.num_layers));
  for (int64_t i = 0; i < num_local_experts; ++i) {
    const std::string e = std::to_string(first_expert + i);
    const std::string n1 = config.moe_grouped_gemm ? prefix + ".linear_fc1.weight" + e
                                                   : prefix + ".local_experts." + e + ".linear_fc1.weight";
    const std::string n2 = config.moe_grouped_gemm ? prefix + ".linear_fc2.weight" + e
                                                   : prefix + ".local_experts." + e + ".linear_fc2.weight";
    fc1_.push_back(add_expert_param(reg, n1, {fc1_rows, config.hidden_size}, 0, config.gated_linear_unit ? 2 : 1,
                                    etp_rank, etp_size, config.init_method_std));
    fc2_.push_back(add_expert_param(reg, n2, {config.hidden_size, config.moe_ffn_hidden_size}, 1, 1, etp_rank, etp_size,
                                    out_std));
  }
  // Megatron's use_expert_pgs: the experts' weights then take the expert-parallel gradient path.
  const int64_t tp = config.tensor_model_parallel_size;
  const bool expert_pgs = config.expert_model_parallel_size > 1 ||
                          (config.expert_tensor_parallel_size > 0 ? config.expert_tensor_parallel_size : tp) != tp;
  for (auto* refs : {&fc1_, &fc2_})
    for (size_t i = 0; i < refs->size(); ++i) {
      Parameter& p = (*refs)[i].param();
      p.allreduce = !expert_pgs;
      p.expert_index = first_expert + static_cast<int64_t>(i);  // checkpoint expert axis
      p.num_experts = config.num_moe_experts.value_or(0);
    }
  // FP8: one FP8 meta per expert GEMM (TE GroupedLinear's per-GEMM quantizers), named by the
  // SequentialMLP module path with the global expert index whatever the parameter naming, so the
  // state follows its expert through EP resharding and --moe-grouped-gemm changes.
  if (fp8_)
    for (int64_t i = 0; i < num_local_experts; ++i) {
      const std::string e = prefix + ".local_experts." + std::to_string(first_expert + i);
      fp8_fc1_.push_back(fp8_->register_linear(e + ".linear_fc1", /*expert=*/true));
      fp8_fc2_.push_back(fp8_->register_linear(e + ".linear_fc2", /*expert=*/true));
    }
}

namespace {
std::vector<Tensor> weights_of(const std::vector<ParamRef>& refs) {
  std::vector<Tensor> w;
  w.reserve(refs.size());
  for (const ParamRef& r : refs) w.push_back(r.data());
  return w;
}
std::vector<Tensor> grads_of(const std::vector<ParamRef>& refs) {
  std::vector<Tensor> g;
  g.reserve(refs.size());
  for (const ParamRef& r : refs) g.push_back(r.grad());  // shares the main_grad storage
  return g;
}

void activation_forward(const TransformerConfig& c, const Tensor& f1, Tensor& act) {
  if (c.gated_linear_unit) {
    ops::swiglu_forward(f1, act);
  } else if (c.squared_relu) {
    ops::squared_relu_forward(f1, act);
  } else {
    ops::gelu_forward(f1, act, false);
  }
}
void activation_backward(const TransformerConfig& c, const Tensor& dact, const Tensor& f1, Tensor& df1) {
  if (c.gated_linear_unit) {
    ops::swiglu_backward(dact, f1, df1);
  } else if (c.squared_relu) {
    ops::squared_relu_backward(dact, f1, df1);
  } else {
    ops::gelu_backward(dact, f1, df1, false);
  }
}

// FP8 row padding per expert (TE's Fp8Padding / Fp8Unpadding as TEGroupedMLP applies them): expert
// i's n[i] rows move from the start of its src_rows[i]-row block of src to the start of its
// dst_rows[i]-row block of the result; every other row of the result is zero.
// `zero_fill`: start from zeros (needed when dst has rows no expert writes: the padding rows);
// false when every row of dst is copied (unpadding), which skips one memset of the whole result.
Tensor regroup_rows(const Tensor& src, const std::vector<int64_t>& n, const std::vector<int64_t>& src_rows,
                    const std::vector<int64_t>& dst_rows, bool zero_fill = true) {
  int64_t total = 0;
  for (int64_t r : dst_rows) total += r;
  Shape s = src.shape();
  s[0] = total;
  Tensor dst = zero_fill ? Tensor::zeros(s, src.dtype(), src.device()) : Tensor::empty(s, src.dtype(), src.device());
  int64_t o = 0, od = 0;
  for (size_t i = 0; i < n.size(); ++i) {
    if (n[i] > 0) dst.narrow0(od, n[i]).copy_(src.narrow0(o, n[i]));
    o += src_rows[i];
    od += dst_rows[i];
  }
  return dst;
}
Tensor pad_rows(const Tensor& x, const std::vector<int64_t>& counts, const std::vector<int64_t>& padded) {
  return regroup_rows(x, counts, counts, padded);
}
// Every row of the result is one of y's real rows, so no zero fill (MEGATRON_MOE_FP8_FUSE=0 keeps it).
Tensor unpad_rows(const Tensor& y, const std::vector<int64_t>& counts, const std::vector<int64_t>& padded) {
  return regroup_rows(y, counts, padded, counts, /*zero_fill=*/!moe_fp8_fuse_enabled());
}
}  // namespace

Tensor Experts::forward(const Tensor& x, const std::vector<int64_t>& tokens_per_expert, const Tensor& probs,
                        ExpertsCtx& ctx) const {
  const int64_t L = num_local_experts(), h = config_.hidden_size;
  MEGATRON_CHECK(static_cast<int64_t>(tokens_per_expert.size()) == L) << "experts: " << tokens_per_expert.size() << " counts";
  int64_t total = 0;
  for (int64_t n : tokens_per_expert) total += n;
  const int64_t N = x.size(0);
  MEGATRON_CHECK(total == N) << "experts: " << total << " of " << N << " rows assigned";
  if (fp8_) return forward_fp8(x, tokens_per_expert, probs, ctx);
  ctx.tokens_per_expert = tokens_per_expert;
  ctx.input = x;
  ctx.probs = probs;
  Tensor y = Tensor::empty({N, h}, x.dtype(), x.device());
  if (N == 0) return y;
  const int64_t fc1_local = config_.gated_linear_unit ? 2 * ffn_local_ : ffn_local_;
  // GroupedMLP: fc1 of every expert in one grouped GEMM, the activation on all rows (elementwise,
  // so per row the same as per expert), the probs scale, fc2 grouped.
  Tensor f1 = Tensor::empty({N, fc1_local}, x.dtype(), x.device());
  ops::grouped_linear_forward(x, weights_of(fc1_), tokens_per_expert, f1);
  Tensor act = Tensor::empty({N, ffn_local_}, x.dtype(), x.device());
  activation_forward(config_, f1, act);
  Tensor scaled = Tensor::empty(act.shape(), act.dtype(), act.device());
  ops::scale_rows(act, probs, scaled);
  ops::grouped_linear_forward(scaled, weights_of(fc2_), tokens_per_expert, y);
  ctx.fc1_out = f1;
  if (!recompute_act_) ctx.act = act;  // --recompute-modules moe_act: rebuilt from f1 in backward
  return y;
}

Tensor Experts::backward(const Tensor& dy, ExpertsCtx& ctx, std::vector<double>* dprobs) const {
  const int64_t N = dy.size(0), h = config_.hidden_size;
  dprobs->assign(static_cast<size_t>(N), 0.0);
  if (N == 0) return Tensor::zeros({N, h}, dy.dtype(), dy.device());
  if (fp8_) return backward_fp8(dy, ctx, dprobs);
  Tensor dx = Tensor::empty({N, h}, dy.dtype(), dy.device());  // every row written by the dgrad
  const Tensor& f1 = ctx.fc1_out;
  // moe_act: the same activation op on the same fc1 output as the forward, so bitwise its act.
  Tensor act = ctx.act;
  if (!act.defined()) {
    act = Tensor::empty({N, ffn_local_}, f1.dtype(), f1.device());
    activation_forward(config_, f1, act);
  }
  Tensor scaled = Tensor::empty(act.shape(), act.dtype(), act.device());
  ops::scale_rows(act, ctx.probs, scaled);  // recomputed (cheaper to keep than the fc2 input)
  Tensor dscaled = Tensor::empty(act.shape(), dy.dtype(), dy.device());
  std::vector<Tensor> dw2 = grads_of(fc2_), dw1 = grads_of(fc1_);
  ops::grouped_linear_backward(dy, scaled, weights_of(fc2_), ctx.tokens_per_expert, &dscaled, &dw2, true);
  // d probs[r] = <dscaled[r], act[r]>; d act = dscaled * probs.
  *dprobs = row_dot(dscaled, act);
  Tensor dact = Tensor::empty(act.shape(), dy.dtype(), dy.device());
  ops::scale_rows(dscaled, ctx.probs, dact);
  Tensor df1 = Tensor::empty(f1.shape(), dy.dtype(), dy.device());
  activation_backward(config_, dact, f1, df1);
  ops::grouped_linear_backward(df1, ctx.input, weights_of(fc1_), ctx.tokens_per_expert, &dx, &dw1, true);
  return dx;
}

// ---- FP8 (TEGroupedMLP over TE's GroupedLinear; docs/moe.md "FP8 experts") ----------------------
// The per-expert loop of FP8 linears (fp8_linear.h) on row views of the padded rows.

Tensor Experts::forward_fp8(const Tensor& x_in, const std::vector<int64_t>& counts, const Tensor& probs_in,
                            ExpertsCtx& ctx) const {
  fp8::Fp8State& st = *fp8_;
  const int64_t L = num_local_experts(), h = config_.hidden_size;
  const int64_t mult = x_in.is_cpu() ? fp8_host_row_multiple_
                                     : (st.config().recipe == fp8::Fp8Recipe::kBlockwise ? 128 : 16);
  std::vector<int64_t> padded(counts);
  bool pad = false;
  for (int64_t& n : padded) {
    const int64_t r = (n + mult - 1) / mult * mult;
    pad = pad || r != n;
    n = r;
  }
  const Tensor x = pad ? pad_rows(x_in, counts, padded) : x_in;
  const Tensor probs = pad ? pad_rows(probs_in, counts, padded) : probs_in;  // padding rows: prob 0
  const int64_t N = x.size(0);
  ctx.tokens_per_expert = padded;
  ctx.unpadded_tokens_per_expert = pad ? counts : std::vector<int64_t>{};
  ctx.input = x;
  ctx.probs = probs;
  ctx.fc1_input_t.assign(static_cast<size_t>(L), Tensor());
  ctx.fc2_input_t.assign(static_cast<size_t>(L), Tensor());
  const int64_t fc1_local = config_.gated_linear_unit ? 2 * ffn_local_ : ffn_local_;
  Tensor f1 = Tensor::empty({N, fc1_local}, x.dtype(), x.device());
  Tensor act = Tensor::empty({N, ffn_local_}, x.dtype(), x.device());
  Tensor scaled;  // act * probs in bf16, unless every expert's is quantized by the fused producer
  Tensor y = Tensor::empty({N, h}, x.dtype(), x.device());
  // One linear of every local expert; an expert without rows only casts its weight (as TE).
  // `in_q[i]` defined: expert i's input already quantized by its producer (in's rows not read).
  auto linear = [&](const std::vector<ParamRef>& w, const std::vector<int>& base, const Tensor& in, Tensor& out,
                    std::vector<Tensor>& keep_t, const std::vector<fp8::Fp8Input>* in_q) {
    int64_t o = 0;
    for (int64_t i = 0; i < L; ++i) {
      const size_t k = static_cast<size_t>(i);
      const int64_t n = padded[k];
      const Tensor& wi = w[k].data();
      if (n == 0) {
        fp8::cast_weight(st, base[k], wi);
        continue;
      }
      Tensor yi = out.narrow0(o, n);
      if (in_q && (*in_q)[k].defined()) {
        fp8::linear_forward(st, base[k], Tensor(), wi, nullptr, yi, &(*in_q)[k]);
        keep_t[k] = (*in_q)[k].q_t;  // the wgrad's transpose, as keep_x_t would hold it
      } else {
        fp8::linear_forward(st, base[k], in.narrow0(o, n), wi, nullptr, yi, nullptr, &keep_t[k]);
      }
      o += n;
    }
  };
  linear(fc1_, fp8_fc1_, x, f1, ctx.fc1_input_t, nullptr);
  if (N > 0) activation_forward(config_, f1, act);
  // fc2's input act * probs quantized per expert by the fused producer (ops/fp8_moe.h: the same
  // bytes and amax as scale_rows + the quantize; CUDA, delayed recipe, MEGATRON_MOE_FP8_FUSE): its
  // bf16 copy is neither written nor read. Experts the kernel does not take get the unfused pair.
  std::vector<fp8::Fp8Input> in2_q(static_cast<size_t>(L));
  int64_t fused = 0, with_rows = 0;
  if (N > 0 && moe_fp8_fuse_enabled() && st.config().recipe == fp8::Fp8Recipe::kDelayed &&
      fp8::fused_input_ok(st, act)) {
    int64_t o = 0;
    for (int64_t i = 0; i < L; ++i) {
      const size_t k = static_cast<size_t>(i);
      const int64_t n = padded[k];
      if (n == 0) continue;
      ++with_rows;
      const int r = fp8_fc2_[k] + fp8::kInput;
      fp8::Fp8Input q;
      q.q = Tensor::empty({n, ffn_local_}, st.dtype(r), act.device());
      q.q_t = Tensor::empty({ffn_local_, n}, st.dtype(r), act.device());
      q.shape = {n, ffn_local_};
      q.dtype = act.dtype();
      float* amax = st.recording() ? static_cast<float*>(st.amax(r).data_ptr()) : nullptr;
      if (ops::fp8_scale_rows_quantize(act.narrow0(o, n), probs.narrow0(o, n),
                                       static_cast<const float*>(st.scale(r).data_ptr()), amax, &q.q, &q.q_t)) {
        in2_q[k] = q;
        ++fused;
      }
      o += n;
    }
  }
  if (with_rows == 0 || fused < with_rows) {
    scaled = Tensor::empty({N, ffn_local_}, x.dtype(), x.device());
    if (N > 0) ops::scale_rows(act, probs, scaled);
  }
  linear(fc2_, fp8_fc2_, scaled, y, ctx.fc2_input_t, &in2_q);
  ctx.fc1_out = f1;
  ctx.act = act;
  return pad ? unpad_rows(y, counts, padded) : y;
}

Tensor Experts::backward_fp8(const Tensor& dy_in, ExpertsCtx& ctx, std::vector<double>* dprobs) const {
  fp8::Fp8State& st = *fp8_;
  const int64_t L = num_local_experts(), h = config_.hidden_size;
  const std::vector<int64_t>& padded = ctx.tokens_per_expert;
  const bool pad = !ctx.unpadded_tokens_per_expert.empty();
  const Tensor dy = pad ? pad_rows(dy_in, ctx.unpadded_tokens_per_expert, padded) : dy_in;
  const int64_t N = dy.size(0);
  const Tensor& act = ctx.act;
  const Tensor& f1 = ctx.fc1_out;
  const bool fast = moe_fp8_fuse_enabled();
  // fc2's bf16 input (act * probs) is read by the backward only where the forward kept no FP8
  // transpose for the wgrad (CPU, tensorwise or blockwise recipe, unfused) or the wgrad is in the
  // model dtype: only then is it recomputed (as the bf16 path does).
  bool need_scaled = !fast || !st.config().wgrad;
  for (size_t k = 0; k < padded.size(); ++k) need_scaled = need_scaled || (padded[k] > 0 && !ctx.fc2_input_t[k].defined());
  Tensor scaled;
  if (need_scaled) {
    scaled = Tensor::empty(act.shape(), act.dtype(), act.device());
    ops::scale_rows(act, ctx.probs, scaled);
  }
  Tensor dscaled = Tensor::empty(act.shape(), dy.dtype(), dy.device());
  Tensor dx = Tensor::empty({N, h}, dy.dtype(), dy.device());
  // dgrad + wgrad of one linear of every local expert with rows (no rows: nothing to quantize, and
  // the accumulated main_grad stays as it is). `d_out_q[i]` defined: expert i's d_out already
  // quantized by its producer (d_out's rows of i are then not read).
  auto linear = [&](const std::vector<ParamRef>& w, const std::vector<int>& base, const Tensor& d_out,
                    const Tensor& in, Tensor& d_in, const std::vector<Tensor>& in_t,
                    const std::vector<fp8::Fp8Input>* d_out_q) {
    int64_t o = 0;
    for (int64_t i = 0; i < L; ++i) {
      const size_t k = static_cast<size_t>(i);
      const int64_t n = padded[k];
      if (n == 0) continue;
      Tensor di = d_in.narrow0(o, n);
      Tensor dw = w[k].grad();
      const fp8::Fp8Input* q = d_out_q && (*d_out_q)[k].defined() ? &(*d_out_q)[k] : nullptr;
      fp8::linear_backward(st, base[k], q ? Tensor() : d_out.narrow0(o, n), in.defined() ? in.narrow0(o, n) : Tensor(),
                           w[k].data(), &di, &dw, nullptr, /*accumulate=*/true, &in_t[k], q);
      o += n;
    }
  };
  linear(fc2_, fp8_fc2_, dy, scaled, dscaled, ctx.fc2_input_t, nullptr);
  std::vector<double> dp = row_dot(dscaled, act);  // padding rows: 0, dropped below
  Tensor dact = Tensor::empty(act.shape(), dy.dtype(), dy.device());
  ops::scale_rows(dscaled, ctx.probs, dact);
  // SwiGLU's backward fused with the quantization of fc1's grad-output, per expert on its rows
  // (fp8::swiglu_backward_fp8: the same bytes and amax as swiglu_backward + the quantize; CUDA,
  // delayed recipe): fc1's bf16 output gradient is neither written nor read again. Experts the
  // fused kernel does not take (and everything when it is off) get the unfused activation backward.
  std::vector<fp8::Fp8Input> df1_q(static_cast<size_t>(L));
  int64_t fused = 0, with_rows = 0;
  if (fast && config_.gated_linear_unit && st.config().recipe == fp8::Fp8Recipe::kDelayed &&
      fp8::fused_input_ok(st, f1)) {
    int64_t o = 0;
    for (int64_t i = 0; i < L; ++i) {
      const size_t k = static_cast<size_t>(i);
      const int64_t n = padded[k];
      if (n == 0) continue;
      df1_q[k] = fp8::swiglu_backward_fp8(st, fp8_fc1_[k], dact.narrow0(o, n), f1.narrow0(o, n));
      fused += df1_q[k].defined() ? 1 : 0;
      ++with_rows;
      o += n;
    }
  }
  Tensor df1;
  if (fused == 0) {
    df1 = Tensor::empty(f1.shape(), dy.dtype(), dy.device());
    activation_backward(config_, dact, f1, df1);
  } else if (fused < with_rows) {  // elementwise: per expert the same values as on all rows
    df1 = Tensor::empty(f1.shape(), dy.dtype(), dy.device());
    int64_t o = 0;
    for (int64_t i = 0; i < L; ++i) {
      const size_t k = static_cast<size_t>(i);
      const int64_t n = padded[k];
      if (n > 0 && !df1_q[k].defined()) {
        Tensor dfi = df1.narrow0(o, n);
        activation_backward(config_, dact.narrow0(o, n), f1.narrow0(o, n), dfi);
      }
      o += n;
    }
  }
  linear(fc1_, fp8_fc1_, df1, ctx.input, dx, ctx.fc1_input_t, &df1_q);
  if (!pad) {
    *dprobs = std::move(dp);
    return dx;
  }
  const std::vector<int64_t>& counts = ctx.unpadded_tokens_per_expert;
  dprobs->clear();
  int64_t op = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    dprobs->insert(dprobs->end(), dp.begin() + op, dp.begin() + op + counts[i]);
    op += padded[i];
  }
  return unpad_rows(dx, counts, padded);
}

}  // namespace megatron::transformer::moe
