#include "megatron/core/models/gpt/gpt_model.h"

#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/models/common/embeddings/language_model_embedding.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/tensor_parallel/layers.h"
#include "megatron/core/tensor_parallel/random.h"
#include "megatron/core/transformer/context_parallel.h"
#include "megatron/core/transformer/inference_context.h"
#include "megatron/core/transformer/transformer_block.h"
#include "megatron/core/utils/env.h"

namespace megatron::models::gpt {

struct GPTModel::State {
  bool has_forward = false;
  Tensor labels;  // [s, b]
  common::EmbeddingCtx embedding;
  transformer::TransformerBlockCtx decoder;
  tensor_parallel::LinearCtx output_layer;
  Tensor logits;  // [s, b, V/TP]; with ce_fused the unscaled gradient softmax - onehot instead
  Tensor lse;     // [s*b] float32
  bool ce_fused = false;  // forward ran ops::cross_entropy_fused_ (see GPTModel::forward)
};

namespace {
/// [b, s, ...] batch tensor -> [s, b, ...] on `device`.
Tensor to_seq_first(const Tensor& t, Device device) {
  Tensor src = t.to(device);
  Shape s = src.shape();
  std::swap(s[0], s[1]);
  Tensor out = Tensor::empty(s, src.dtype(), device);
  ops::transpose01(src, out);
  return out;
}

// MEGATRON_CE_FUSED=0: the unfused cross entropy (stats pass in forward, gradient pass in
// backward) also where the fused one applies (A/B comparisons). Read at every forward (one
// getenv per micro-batch), so a test may switch it between forwards.
bool ce_fused_enabled() { return env_switch("MEGATRON_CE_FUSED", true); }

void check_ids(const Tensor& t, int64_t limit, const char* what) {
  if (!t.is_cpu()) return;
  const int64_t* p = t.data<int64_t>();
  for (int64_t i = 0; i < t.numel(); ++i)
    if (p[i] < 0 || p[i] >= limit)
      user_error("GPTModel.forward: ", what, " value ", p[i], " at flat index ", i, " is outside [0, ", limit,
                 "); check --vocab-size / --max-position-embeddings against the data");
}
}  // namespace

GPTModel::GPTModel(const TransformerConfig& config, int64_t padded_vocab_size, int64_t max_sequence_length,
                   uint64_t seed, Device device, GPTModelParallel parallel)
    : config_(config),
      padded_vocab_size_(padded_vocab_size),
      max_sequence_length_(max_sequence_length),
      seed_(seed),
      device_(device),
      parallel_(std::move(parallel)),
      state_(std::make_unique<State>()) {
  config_.validate();
  if (!parallel_.tp_group) parallel_.tp_group = comm::make_single_rank_group();
  if (parallel_.tp_group->size() != config_.tensor_model_parallel_size)
    user_error("GPTModel: the TP group has ", parallel_.tp_group->size(),
               " ranks but --tensor-model-parallel-size is ", config_.tensor_model_parallel_size);
  if (padded_vocab_size <= 0 || padded_vocab_size % config_.tensor_model_parallel_size != 0)
    user_error("GPTModel: padded vocab size ", padded_vocab_size,
               " must be positive and divisible by --tensor-model-parallel-size");
  if (max_sequence_length <= 0) user_error("GPTModel: --max-position-embeddings must be positive");

  tensor_parallel::TPContext tp{parallel_.tp_group, config_.sequence_parallel};
  if (config_.fp8) config_.fp8_state = std::make_shared<fp8::Fp8State>(*config_.fp8, device_);
  const int64_t stage_layers = parallel_.num_layers < 0 ? config_.num_layers : parallel_.num_layers;
  if (parallel_.layer_offset < 0 || stage_layers < 0 || parallel_.layer_offset + stage_layers > config_.num_layers)
    user_error("GPTModel: pipeline stage layers [", parallel_.layer_offset, ", ", parallel_.layer_offset + stage_layers,
               ") are outside --num-layers ", config_.num_layers);
  const bool tied = config_.share_embeddings_and_output_weights;
  // Registration order = Megatron's named_parameters(): embedding, decoder, output_layer.
  if (parallel_.pre_process)
    embedding_ = std::make_unique<common::LanguageModelEmbedding>(registry_, config_, padded_vocab_size,
                                                                   max_sequence_length, tp);
  decoder_ = std::make_unique<transformer::TransformerBlock>(registry_, config_, tp, parallel_.layer_offset,
                                                             stage_layers, parallel_.post_process);
  if (parallel_.post_process) {
    // Tied and on the embedding's stage: reuse the word embedding. Tied on another stage:
    // a copy ("output_layer.weight", shared) initialized from the embedding's stream; the
    // pipeline layer all-reduces the two copies' gradients (embedding group).
    const bool reuse = tied && parallel_.pre_process;
    output_layer_ = std::make_unique<tensor_parallel::ColumnParallelLinear>(
        registry_, "output_layer", config_.hidden_size, padded_vocab_size, /*bias=*/false, config_.init_method_std, tp,
        1, /*skip_weight=*/reuse, /*is_embedding_or_output=*/true);
    if (reuse) {
      output_layer_->set_shared_weight(embedding_->word_embeddings_weight());
    } else if (tied) {
      Parameter& copy = output_layer_->weight().param();
      copy.shared = true;
      copy.init_key = "embedding.word_embeddings.weight";
    }
  }

  // --fp8-param-gather: the weights of the FP8 GEMMs become FP8 primary weights (fp8/fp8_param.h),
  // laid out after the other parameters with an FP8 buffer of their own (training only).
  std::vector<bool> fp8_weights;
  if (config_.fp8_state && config_.fp8->param_gather && parallel_.allocate_main_grads) {
    for (auto& p : registry_.params()) {
      int base = -1;
      if (p.name.ends_with(".weight")) base = config_.fp8_state->find_linear(p.name.substr(0, p.name.size() - 7));
      fp8_weights.push_back(base >= 0);
      if (base >= 0) {
        p.fp8_state = config_.fp8_state;
        p.fp8_base = base;
      }
    }
  }
  buffers_ = std::make_unique<distributed::ParamAndGradBuffer>(registry_.params(), registry_.local_shapes(),
                                                               config_.params_dtype, config_.main_grads_dtype, device_,
                                                               parallel_.allocate_main_grads, fp8_weights);
  for (auto& p : registry_.params()) tensor_parallel::initialize_parameter(p, seed_);
  // --sequence-parallel: the block's norms (not the per-head q/k norms) see 1/TP of the sequence.
  if (config_.sequence_parallel && config_.tensor_model_parallel_size > 1)
    for (auto& p : registry_.params())
      if ((p.name.find("layernorm.") != std::string::npos || p.name.find("layer_norm") != std::string::npos) &&
          p.name.find("q_layernorm") == std::string::npos && p.name.find("k_layernorm") == std::string::npos)
        p.sequence_parallel = true;

  // Which parameters each backward stage completes (grad-ready hook).
  layer_params_.assign(static_cast<size_t>(stage_layers), {});
  const std::string layer_prefix = "decoder.layers.";
  for (size_t i = 0; i < registry_.params().size(); ++i) {
    const std::string& n = registry_.params()[i].name;
    if (n.starts_with(layer_prefix)) {
      const int64_t global = std::stoll(n.substr(layer_prefix.size()));
      layer_params_.at(static_cast<size_t>(global - parallel_.layer_offset)).push_back(i);
    } else if (n.starts_with("decoder.final_layernorm")) {
      final_norm_params_.push_back(i);
    } else if (n.starts_with("output_layer")) {
      output_params_.push_back(i);
    } else {
      embedding_params_.push_back(i);
    }
  }
}

GPTModel::~GPTModel() = default;

std::vector<Parameter>& GPTModel::parameters() { return registry_.params(); }
Tensor& GPTModel::param_buffer() { return buffers_->param_data(); }
Tensor& GPTModel::grad_buffer() { return buffers_->grad_data(); }
distributed::ParamAndGradBuffer& GPTModel::buffers() { return *buffers_; }
void GPTModel::zero_grad() {
  if (buffers_->grad_data().defined()) buffers_->grad_data().zero_();
}
const Tensor& GPTModel::last_logits() const { return state_->logits; }
void GPTModel::set_input_tensor(const Tensor& hidden) { input_tensor_ = hidden; }
const Tensor& GPTModel::input_tensor_grad() const { return input_tensor_grad_; }

Parameter& GPTModel::parameter(const std::string& name) {
  for (auto& p : registry_.params())
    if (p.name == name) return p;
  user_error("GPTModel: no parameter named '", name, "'");
}

Tensor GPTModel::forward(const datasets::GPTBatch& batch, bool training) {
  if (!parallel_.pre_process && !input_tensor_.defined())
    user_error("GPTModel.forward: a pipeline stage without pre_process needs set_input_tensor() first");
  // Sizes from the tokens (first stage) or from the received hidden states [s, b, h].
  if (parallel_.pre_process) {
    MEGATRON_CHECK(batch.tokens.dim() == 2) << "tokens " << batch.tokens.str();
  }
  const int64_t b = parallel_.pre_process ? batch.tokens.size(0) : input_tensor_.size(1);
  // A received activation holds 1/TP of the sequence with --sequence-parallel.
  const int64_t sp_factor = config_.sequence_parallel ? config_.tensor_model_parallel_size : 1;
  const int64_t s = parallel_.pre_process ? batch.tokens.size(1) : input_tensor_.size(0) * sp_factor;
  if (parallel_.pre_process) check_ids(batch.tokens, padded_vocab_size_, "token id");
  if (parallel_.post_process) {
    MEGATRON_CHECK(batch.labels.dim() == 2 && batch.labels.size(0) == b && batch.labels.size(1) == s)
        << "labels " << batch.labels.str() << " for batch " << b << " x seq " << s;
    check_ids(batch.labels, padded_vocab_size_, "label");
  }
  const bool learned = config_.position_embedding_type == transformer::PositionEmbeddingType::kLearnedAbsolute;
  if (learned && s > max_sequence_length_)
    user_error("GPTModel.forward: sequence length ", s, " exceeds --max-position-embeddings ", max_sequence_length_);

  if (config_.fp8_state) config_.fp8_state->set_recording(training);  // eval forwards leave the amax histories alone
  State& st = *state_;
  st = State();
  transformer::ForwardContext fc;
  fc.training = training;
  fc.seed = seed_ + 100 * static_cast<uint64_t>(parallel_.pp_rank);
  fc.tp_seed = tensor_parallel::model_parallel_seed(fc.seed, parallel_.tp_group->rank());
  fc.rng_offset = rng_offset_;
  if (batch.attention_mask.defined()) fc.attention_mask = batch.attention_mask.to(device_);
  const int cp = parallel_.cp_group ? parallel_.cp_group->size() : 1;
  if (cp > 1) {  // the batch holds this rank's two chunks (get_batch_on_this_cp_rank)
    fc.cp_group = parallel_.cp_group;
    fc.cp_comm_type = parallel_.cp_comm_type;
    // s = this rank's whole local sequence (a later stage's SP input is rescaled above).
    if (config_.position_embedding_type == transformer::PositionEmbeddingType::kRope)
      fc.rotary_position_ids = transformer::cp_rank_global_positions(s, b, cp, parallel_.cp_group->rank(), device_);
  }

  Tensor h;
  if (parallel_.pre_process) {
    Tensor ids = to_seq_first(batch.tokens, device_);
    Tensor position_ids;
    if (learned) {
      if (batch.position_ids.defined()) {
        check_ids(batch.position_ids, max_sequence_length_, "position id");
        position_ids = to_seq_first(batch.position_ids, device_);
      } else if (cp > 1) {
        position_ids = transformer::cp_rank_global_positions(s, b, cp, parallel_.cp_group->rank(), device_);
      } else {
        std::vector<int64_t> pos(static_cast<size_t>(s * b));
        for (int64_t i = 0; i < s * b; ++i) pos[i] = i / b;
        position_ids = Tensor::from_vector_i64(pos, {s, b}).to(device_);
      }
    }
    // RoPE uses positions 0..s-1 (Megatron's rotary embedding ignores position_ids in training;
    // with CP the global positions of this rank's chunks, fc.rotary_position_ids).
    h = embedding_->forward(ids, position_ids, fc, st.embedding);
  } else {
    MEGATRON_CHECK(input_tensor_.dim() == 3 && input_tensor_.size(0) * sp_factor == s && input_tensor_.size(1) == b &&
                   input_tensor_.size(2) == config_.hidden_size)
        << "input tensor " << input_tensor_.str() << " for batch " << b << " x seq " << s;
    h = input_tensor_;
    input_tensor_ = Tensor();
  }
  h = decoder_->forward(h, fc, st.decoder);
  rng_offset_ = fc.rng_offset;
  st.has_forward = true;
  if (!parallel_.post_process) return h;

  st.labels = to_seq_first(batch.labels, device_);
  st.logits = output_layer_->forward(h, st.output_layer);

  // Vocab-parallel cross entropy in fp32 (docs/megatron-reference.md#vocab-parallel-cross-entropy).
  const int64_t n = s * b;
  const int64_t vocab_start = parallel_.tp_group->rank() * (padded_vocab_size_ / parallel_.tp_group->size());
  Tensor logits2d = st.logits.view({n, st.logits.size(-1)});
  Tensor labels1d = st.labels.view({n});
  // Training without TP: one pass computes the loss and overwrites the logits with the unscaled
  // gradient softmax - onehot; backward applies dloss to the output layer's small operands
  // instead of to the [n, V] tensor (one read of the logits fewer). Not for fp16 logits (their
  // gradient keeps the loss-scaled dloss factor inside the fp16 range, as in the unfused path),
  // nor for eval forwards (the logits stay readable through last_logits()).
  const auto& olc = st.output_layer;
  st.ce_fused = training && parallel_.tp_group->size() == 1 && ce_fused_enabled() &&
                st.logits.dtype() != DType::kFloat16 && olc.input.defined() && !olc.regather &&
                !olc.fp8_input_t.defined() && olc.input.dim() > 0 &&
                olc.input.numel() == n * olc.input.size(-1);
  Tensor loss_sb = Tensor::empty({s, b}, DType::kFloat32, device_);
  st.lse = Tensor::empty({n}, DType::kFloat32, device_);
  Tensor loss_flat = loss_sb.view({n});
  if (st.ce_fused) {
    ops::cross_entropy_fused_(logits2d, labels1d, vocab_start, loss_flat, st.lse);
  } else {
    Tensor row_max = Tensor::empty({n}, DType::kFloat32, device_);
    Tensor sumexp = Tensor::empty({n}, DType::kFloat32, device_);
    Tensor pred = Tensor::empty({n}, DType::kFloat32, device_);
    ops::cross_entropy_stats(logits2d, labels1d, vocab_start, row_max, sumexp, pred);
    Tensor global_max = row_max;
    auto& tpg = *parallel_.tp_group;
    if (tpg.size() > 1) {
      global_max = row_max.clone();
      tpg.all_reduce(global_max, comm::ReduceOp::kMax);
      ops::cross_entropy_rescale_(sumexp, row_max, global_max);
      tpg.all_reduce(sumexp, comm::ReduceOp::kSum);
      tpg.all_reduce(pred, comm::ReduceOp::kSum);
    }
    ops::cross_entropy_loss(global_max, sumexp, pred, loss_flat, st.lse);
  }
  Tensor loss = Tensor::empty({b, s}, DType::kFloat32, device_);
  ops::transpose01(loss_sb, loss);
  return loss;
}

Tensor GPTModel::forward_logits(const Tensor& tokens, transformer::InferenceContext* inference_context) {
  MEGATRON_CHECK(parallel_.pre_process && parallel_.post_process && tokens.dim() == 2)
      << "forward_logits needs the whole model on one stage and tokens [b, s], got " << tokens.str();
  MEGATRON_CHECK(!parallel_.cp_group || parallel_.cp_group->size() == 1) << "forward_logits: no context parallelism";
  const int64_t b = tokens.size(0), s = tokens.size(1);
  const int64_t offset = inference_context ? inference_context->sequence_len_offset : 0;
  check_ids(tokens, padded_vocab_size_, "token id");
  const bool learned = config_.position_embedding_type == transformer::PositionEmbeddingType::kLearnedAbsolute;
  if (learned && offset + s > max_sequence_length_)
    user_error("GPTModel.forward: positions up to ", offset + s, " exceed --max-position-embeddings ",
               max_sequence_length_);
  if (config_.fp8_state) config_.fp8_state->set_recording(false);
  transformer::ForwardContext fc;
  fc.training = false;
  fc.inference_context = inference_context;
  std::vector<int64_t> pos(static_cast<size_t>(s * b));
  for (int64_t i = 0; i < s * b; ++i) pos[i] = offset + i / b;
  Tensor position_ids = Tensor::from_vector_i64(pos, {s, b}).to(device_);
  if (config_.position_embedding_type == transformer::PositionEmbeddingType::kRope) fc.rotary_position_ids = position_ids;
  common::EmbeddingCtx ectx;
  transformer::TransformerBlockCtx dctx;
  tensor_parallel::LinearCtx octx;
  Tensor h = embedding_->forward(to_seq_first(tokens, device_), learned ? position_ids : Tensor(), fc, ectx);
  h = decoder_->forward(h, fc, dctx);
  return output_layer_->forward(h, octx);
}

void GPTModel::backward(const Tensor& dloss) {
  State& st = *state_;
  if (!st.has_forward) user_error("GPTModel.backward called without a preceding forward");
  Tensor dh;
  if (parallel_.post_process) {
    const int64_t s = st.labels.size(0), b = st.labels.size(1), n = s * b;
    MEGATRON_CHECK(dloss.dim() == 2 && dloss.size(0) == b && dloss.size(1) == s && dloss.dtype() == DType::kFloat32)
        << "dloss " << dloss.str() << " for batch " << b << " x seq " << s;
    const int64_t vocab_start = parallel_.tp_group->rank() * (padded_vocab_size_ / parallel_.tp_group->size());
    Tensor dloss_sb = to_seq_first(dloss, device_);
    if (st.ce_fused) {
      // st.logits holds g = softmax - onehot; dlogits = diag(dloss) g, so
      // dW = dlogits^T x = g^T (diag(dloss) x) and dx = dlogits W = diag(dloss) (g W).
      const Tensor dl = dloss_sb.view({n});
      tensor_parallel::LinearCtx ctx = st.output_layer;
      const int64_t hid = ctx.input.size(-1);
      Tensor xs = Tensor::empty(ctx.input.shape(), ctx.input.dtype(), device_);
      Tensor xs2d = xs.view({n, hid});
      ops::scale_rows(ctx.input.view({n, hid}), dl, xs2d);
      ctx.input = xs;
      dh = output_layer_->backward(st.logits, ctx, true);
      Tensor dh2d = dh.view({n, hid});
      ops::scale_rows(dh2d, dl, dh2d);
    } else {
      // dlogits overwrite the logits (they are not needed any more).
      Tensor logits2d = st.logits.view({n, st.logits.size(-1)});
      ops::cross_entropy_backward(logits2d, st.labels.view({n}), vocab_start, st.lse, dloss_sb.view({n}), logits2d);
      dh = output_layer_->backward(st.logits, st.output_layer, true);
    }
    if (grad_ready_hook_ && !output_params_.empty()) grad_ready_hook_(output_params_);
  } else {
    dh = dloss.to(device_);
  }
  std::function<void(size_t)> layer_done;
  if (grad_ready_hook_) {
    const size_t last = layer_params_.size() - 1;
    layer_done = [this, last](size_t i) {
      std::vector<size_t> ready = layer_params_[i];
      if (i == last) ready.insert(ready.end(), final_norm_params_.begin(), final_norm_params_.end());
      grad_ready_hook_(ready);
    };
  }
  dh = decoder_->backward(dh, st.decoder, layer_done);
  if (grad_ready_hook_ && layer_params_.empty() && !final_norm_params_.empty()) grad_ready_hook_(final_norm_params_);
  if (parallel_.pre_process) {
    embedding_->backward(dh, st.embedding);
    if (grad_ready_hook_ && !embedding_params_.empty()) grad_ready_hook_(embedding_params_);
    input_tensor_grad_ = Tensor();
  } else {
    input_tensor_grad_ = dh;
  }
  st = State();  // release the activations
}

void GPTModel::stash_activations(int64_t key) {
  MEGATRON_CHECK(state_->has_forward) << "stash_activations(" << key << ") without a forward";
  MEGATRON_CHECK(!stashed_.count(key)) << "activations of key " << key << " are already stashed";
  stashed_[key] = std::move(state_);
  state_ = std::make_unique<State>();
}

void GPTModel::restore_activations(int64_t key) {
  auto it = stashed_.find(key);
  MEGATRON_CHECK(it != stashed_.end()) << "no stashed activations for key " << key;
  MEGATRON_CHECK(!state_->has_forward) << "restore_activations(" << key << ") over unfinished activations";
  state_ = std::move(it->second);
  stashed_.erase(it);
}

size_t GPTModel::num_stashed_activations() const { return stashed_.size(); }

uint64_t GPTModel::rng_offset() const { return rng_offset_; }
void GPTModel::set_rng_offset(uint64_t offset) { rng_offset_ = offset; }

}  // namespace megatron::models::gpt
