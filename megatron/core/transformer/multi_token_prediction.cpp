#include "megatron/core/transformer/multi_token_prediction.h"

#include <cstring>

#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/tensor_parallel/mappings.h"

namespace megatron::transformer {

namespace {

template <class T>
void roll_rows(const T* src, T* dst, int64_t rows, int64_t s, int64_t chunks) {
  const int64_t c = s / chunks;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < chunks; ++k) {
      const T* in = src + r * s + k * c;
      T* out = dst + r * s + k * c;
      std::memcpy(out, in + 1, static_cast<size_t>(c - 1) * sizeof(T));
      out[c - 1] = T(0);
    }
}

// The CP boundary exchange of roll_tensor: every rank's first element of each chunk, gathered.
template <class T>
void fill_cp_boundaries(const T* src, T* dst, int64_t rows, int64_t s, comm::ProcessGroup& cp, DType dt, Device dev) {
  const int64_t c = s / 2;
  const int P = cp.size(), r = cp.rank();
  Tensor mine = Tensor::empty({2, rows}, dt);
  T* m = mine.data<T>();
  for (int64_t i = 0; i < rows; ++i) {
    m[i] = src[i * s];             // first element of chunk 0 (global chunk r)
    m[rows + i] = src[i * s + c];  // first element of chunk 1 (global chunk 2P-1-r)
  }
  // On the device the group works on (an NCCL group takes device buffers only).
  Tensor all = Tensor::empty({P, 2, rows}, dt, dev);
  Tensor in = mine.to(dev);
  cp.all_gather(in, all);
  if (!dev.is_cpu()) all = all.to(Device::cpu());
  const T* g = all.data<T>();
  auto at = [&](int rank, int chunk, int64_t i) { return g[(static_cast<int64_t>(rank) * 2 + chunk) * rows + i]; };
  for (int64_t i = 0; i < rows; ++i) {
    // Chunk 0 (global chunk r) is followed by global chunk r+1: chunk 0 of rank r+1, or for the
    // last rank its own chunk 1 (global chunk P). Chunk 1 (global 2P-1-r) is followed by global
    // chunk 2P-r: chunk 1 of rank r-1; rank 0's chunk 1 ends the sequence (0).
    dst[i * s + c - 1] = r + 1 < P ? at(r + 1, 0, i) : at(r, 1, i);
    dst[i * s + s - 1] = r > 0 ? at(r - 1, 1, i) : T(0);
  }
}

template <class T>
Tensor roll_typed(const Tensor& x, comm::ProcessGroup* cp, Device dev) {
  const int64_t s = x.size(-1), rows = x.numel() / s;
  Tensor y = Tensor::empty(x.shape(), x.dtype());
  const bool with_cp = cp && cp->size() > 1;
  MEGATRON_CHECK(!with_cp || s % 2 == 0) << "roll_tensor with context parallelism: local length " << s << " is odd";
  roll_rows(x.data<T>(), y.data<T>(), rows, s, with_cp ? 2 : 1);
  if (with_cp) fill_cp_boundaries(x.data<T>(), y.data<T>(), rows, s, *cp, x.dtype(), dev);
  return y;
}

// [n, a] and [n, b'] halves <-> [n, 2, h] interleaving via the [2, n, h] stack and transpose01.
Tensor concat_last(const Tensor& first, const Tensor& second) {
  const int64_t h = first.size(-1), n = first.numel() / h;
  Tensor stacked = Tensor::empty({2, n, h}, first.dtype(), first.device());
  stacked.flat_slice(0, {n, h}).copy_(first.view({n, h}));
  stacked.flat_slice(n * h, {n, h}).copy_(second.view({n, h}));
  Tensor out = Tensor::empty({n, 2, h}, first.dtype(), first.device());
  ops::transpose01(stacked, out);
  Shape s = first.shape();
  s.back() = 2 * h;
  return out.view(s);
}

// Megatron's gather_from_tensor_model_parallel_region: [..., h/T] shards -> [..., h].
Tensor gather_last(const Tensor& x, comm::ProcessGroup& g) {
  const int T = g.size();
  if (T == 1) return x;
  const int64_t hl = x.size(-1), rows = x.numel() / hl;
  Tensor all = Tensor::empty({T, rows, hl}, x.dtype(), x.device());
  g.all_gather(x.view({x.numel()}), all);
  Tensor out = Tensor::empty({rows, T, hl}, x.dtype(), x.device());
  ops::transpose01(all, out);
  Shape s = x.shape();
  s.back() = hl * T;
  return out.view(s);
}

// Its backward: this rank's [..., h/T] slice of dy [..., h].
Tensor split_last(const Tensor& dy, comm::ProcessGroup& g) {
  const int T = g.size();
  if (T == 1) return dy;
  const int64_t H = dy.size(-1), hl = H / T, rows = dy.numel() / H;
  Tensor t = Tensor::empty({T, rows, hl}, dy.dtype(), dy.device());
  ops::transpose01(dy.view({rows, T, hl}), t);
  Shape s = dy.shape();
  s.back() = hl;
  return t.narrow0(g.rank(), 1).clone().view(s);
}

}  // namespace

Tensor roll_tensor(const Tensor& x, comm::ProcessGroup* cp_group, Device comm_device) {
  MEGATRON_CHECK(x.is_cpu() && x.dim() >= 1 && x.size(-1) >= 1) << "roll_tensor of " << x.str();
  if (x.dtype() == DType::kInt64) return roll_typed<int64_t>(x, cp_group, comm_device);
  MEGATRON_CHECK(x.dtype() == DType::kFloat32) << "roll_tensor: int64 or float32, got " << x.str();
  return roll_typed<float>(x, cp_group, comm_device);
}

MultiTokenPredictionLayer::MultiTokenPredictionLayer(ParamRegistry& reg, const std::string& prefix,
                                                     const TransformerConfig& config,
                                                     const tensor_parallel::TPContext& tp,
                                                     std::shared_ptr<fp8::Fp8State> fp8)
    : config_(config), tp_(tp), fp8_(std::move(fp8)) {
  const int64_t h = config.hidden_size;
  enorm_ = std::make_unique<Norm>(reg, prefix + ".enorm", h, config);
  hnorm_ = std::make_unique<Norm>(reg, prefix + ".hnorm", h, config);
  eh_proj_ = std::make_unique<tensor_parallel::ColumnParallelLinear>(reg, prefix + ".eh_proj", 2 * h, h,
                                                                     /*bias=*/false, config.init_method_std, tp);
  if (fp8_) eh_proj_->enable_fp8(fp8_, prefix + ".eh_proj");
  // Megatron's MultiTokenPredictionBlock numbers its layers 1..D (layer_number = depth + 1).
  const std::string index = prefix.substr(prefix.rfind('.') + 1);
  MEGATRON_CHECK(!index.empty() && index.find_first_not_of("0123456789") == std::string::npos)
      << "MTP layer prefix " << prefix << " must end in its depth (mtp.layers.<k>)";
  const int64_t depth = std::stoll(index);
  transformer_layer_ =
      std::make_unique<TransformerLayer>(reg, prefix + ".transformer_layer", config, tp, fp8_, depth + 1);
  final_layernorm_ = std::make_unique<Norm>(reg, prefix + ".final_layernorm", h, config);
}

Tensor MultiTokenPredictionLayer::run(const Tensor& hidden, const Tensor& decoder_input, ForwardContext& fc,
                                      MultiTokenPredictionLayerCtx& ctx) const {
  // _concat_embeddings: [enorm(embedding), hnorm(hidden)] -> eh_proj -> gather over TP -> (SP) scatter.
  Tensor e = enorm_->forward(decoder_input, ctx.enorm);
  Tensor hn = hnorm_->forward(hidden, ctx.hnorm);
  Tensor x = eh_proj_->forward(concat_last(e, hn), ctx.eh_proj);
  x = gather_last(x, *tp_.group);
  if (tp_.sequence_parallel && tp_.size() > 1) x = tensor_parallel::split_along_first_dim(x, *tp_.group);
  Tensor y = transformer_layer_->forward(x, fc, ctx.transformer_layer);
  return final_layernorm_->forward(y, ctx.final_layernorm);
}

Tensor MultiTokenPredictionLayer::forward(const Tensor& hidden, const Tensor& decoder_input, ForwardContext& fc,
                                          MultiTokenPredictionLayerCtx& ctx) const {
  MEGATRON_CHECK(hidden.shape() == decoder_input.shape() && hidden.dtype() == decoder_input.dtype())
      << "MTP layer: hidden " << hidden.str() << " vs decoder input " << decoder_input.str();
  ctx = MultiTokenPredictionLayerCtx{};
  // Megatron checkpoints the whole module with --recompute-method uniform (its
  // recompute_num_layers must be 1, TransformerConfig::validate) and skips recomputation with
  // block; evaluation forwards never recompute.
  ctx.recompute = fc.training && config_.recompute_granularity == RecomputeGranularity::kFull &&
                  config_.recompute_method == RecomputeMethod::kUniform;
  if (!ctx.recompute) return run(hidden, decoder_input, fc, ctx);
  ctx.hidden_in = hidden;
  ctx.decoder_in = decoder_input;
  ctx.fc = fc;
  MultiTokenPredictionLayerCtx dropped;
  const bool grad_enabled = fc.grad_enabled;
  fc.grad_enabled = false;  // as TransformerBlock's recomputed chunks (forward_context.h)
  Tensor out = run(hidden, decoder_input, fc, dropped);
  fc.grad_enabled = grad_enabled;
  return out;
}

std::pair<Tensor, Tensor> MultiTokenPredictionLayer::backward(const Tensor& dy, MultiTokenPredictionLayerCtx& ctx) const {
  if (ctx.recompute) {
    // Replay with the saved dropout streams; the replay's collectives run in the same order on
    // every rank of the group; FP8 quantizes as in the original forward without recording amaxes.
    fp8::ScopedNoAmaxRecording no_amax(fp8_.get());
    ForwardContext fc = ctx.fc;
    const Tensor hidden = ctx.hidden_in, decoder_input = ctx.decoder_in;
    run(hidden, decoder_input, fc, ctx);
  }
  Tensor d = final_layernorm_->backward(dy, ctx.final_layernorm);
  d = transformer_layer_->backward(d, ctx.transformer_layer);
  if (tp_.sequence_parallel && tp_.size() > 1) d = tensor_parallel::gather_along_first_dim(d, *tp_.group);
  d = split_last(d, *tp_.group);
  Tensor dcat = eh_proj_->backward(d, ctx.eh_proj, /*need_dx=*/true);
  const int64_t h = config_.hidden_size, n = dcat.numel() / (2 * h);
  Tensor halves = Tensor::empty({2, n, h}, dcat.dtype(), dcat.device());
  ops::transpose01(dcat.view({n, 2, h}), halves);
  Shape s = dcat.shape();
  s.back() = h;
  Tensor d_emb = enorm_->backward(halves.narrow0(0, 1).view(s), ctx.enorm);
  Tensor d_hidden = hnorm_->backward(halves.narrow0(1, 1).view(s), ctx.hnorm);
  ctx = MultiTokenPredictionLayerCtx{};
  return {d_hidden, d_emb};
}

}  // namespace megatron::transformer
