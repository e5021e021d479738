#include "megatron/core/models/gpt/gpt_model.h"

#include <algorithm>

#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/models/common/embeddings/language_model_embedding.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/tensor_parallel/layers.h"
#include "megatron/core/tensor_parallel/random.h"
#include "megatron/core/transformer/context_parallel.h"
#include "megatron/core/transformer/inference_context.h"
#include "megatron/core/transformer/multi_token_prediction.h"
#include "megatron/core/transformer/transformer_block.h"
#include "megatron/core/utils/env.h"

namespace megatron::models::gpt {

struct GPTModel::LmHead {
  Tensor labels;  // [s, b]
  tensor_parallel::LinearCtx output_layer;
  Tensor logits;  // [s, b, V/TP]; with ce_fused the unscaled gradient softmax - onehot instead
  Tensor lse;     // [s*b] float32
  bool ce_fused = false;  // forward ran ops::cross_entropy_fused_ (see GPTModel::head_forward)
  Tensor global_max, pred;  // [s*b] float32, unfused path only (MTP acceptance counts)
};

// One MTP module's activations and loss weights (process_mtp_loss).
struct GPTModelMtpDepth {
  common::EmbeddingCtx embedding;
  transformer::MultiTokenPredictionLayerCtx layer;
  Tensor mask_sb;  // the loss mask rolled left k+1 times, float32 [s, b] on the host
  double num_tokens = 0.0;
};

struct GPTModel::State {
  bool has_forward = false;
  common::EmbeddingCtx embedding;
  transformer::TransformerBlockCtx decoder;
  LmHead head;
  std::vector<GPTModelMtpDepth> mtp;  // training forwards with MTP only
  std::vector<LmHead> mtp_heads;
  double mtp_original_tokens = 0.0;  // Σ loss_mask before rolling
};

struct GPTModel::MtpPending {
  Tensor loss_sb, mask_sb, global_max, pred;
  double num_tokens = 0.0;
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
  if (config_.fp8) fp8_state_ = std::make_shared<fp8::Fp8State>(*config_.fp8, device_);
  const int64_t stage_layers = parallel_.num_layers < 0 ? config_.num_layers : parallel_.num_layers;
  if (parallel_.layer_offset < 0 || stage_layers < 0 || parallel_.layer_offset + stage_layers > config_.num_layers)
    user_error("GPTModel: pipeline stage layers [", parallel_.layer_offset, ", ", parallel_.layer_offset + stage_layers,
               ") are outside --num-layers ", config_.num_layers);
  const bool tied = config_.share_embeddings_and_output_weights;
  // MTP lives on the last pipeline stage (Megatron's mtp_on_this_rank without a custom layout),
  // which then also holds the shared embedding.
  const bool mtp_process = config_.mtp_num_layers > 0 && parallel_.post_process;
  // Registration order = Megatron's named_parameters(): embedding, decoder, mtp, output_layer.
  if (parallel_.pre_process || mtp_process)
    embedding_ = std::make_unique<common::LanguageModelEmbedding>(registry_, config_, padded_vocab_size,
                                                                   max_sequence_length, tp);
  if (!parallel_.pre_process && embedding_) {
    // The MTP stage's copy of the word embedding: initialized from the same stream as the
    // first stage's (same name), saved as its replica, gradient summed over the embedding group.
    Parameter& copy = embedding_->word_embeddings_weight().param();
    copy.shared = true;
    copy.init_key = copy.name;
  }
  decoder_ = std::make_unique<transformer::TransformerBlock>(registry_, config_, tp, parallel_.layer_offset,
                                                             stage_layers, parallel_.post_process, fp8_state_);
  for (int64_t k = 0; mtp_process && k < config_.mtp_num_layers; ++k)
    mtp_.push_back(std::make_unique<transformer::MultiTokenPredictionLayer>(
        registry_, "mtp.layers." + std::to_string(k), config_, tp, fp8_state_));
  if (parallel_.post_process) {
    // Tied and on a stage with the embedding: reuse the word embedding. Tied on another stage:
    // a copy ("output_layer.weight", shared) initialized from the embedding's stream; the
    // pipeline layer all-reduces the two copies' gradients (embedding group).
    const bool reuse = tied && embedding_;
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
    // --fp8-output-proj: the output layer's GEMMs through the FP8 linear with roles of its own,
    // registered after the decoder's (docs/fp8.md "FP8 output layer"). Tied, the FP8 casts are
    // copies of the word embedding for the GEMMs; the embedding lookup reads the table itself.
    if (fp8_state_ && config_.fp8->output_proj) output_layer_->enable_fp8(fp8_state_, "output_layer");
  }

  // --fp8-param-gather: the weights of the FP8 GEMMs become FP8 primary weights (fp8/fp8_param.h),
  // laid out after the other parameters with an FP8 buffer of their own (training only).
  std::vector<bool> fp8_weights;
  if (fp8_state_ && config_.fp8->param_gather && parallel_.allocate_main_grads) {
    for (auto& p : registry_.params()) {
      int base = -1;
      // The output layer's weight stays in the model dtype (cast per step by the weight cache).
      if (p.name.ends_with(".weight") && !p.name.starts_with("output_layer"))
        base = fp8_state_->find_linear(p.name.substr(0, p.name.size() - 7));
      fp8_weights.push_back(base >= 0);
      if (base >= 0) {
        p.fp8_state = fp8_state_;
        p.fp8_base = base;
      }
    }
  }
  // Megatron's non_homogeneous_layers checkpoint keys (decoder.layers.N.…, no layer axis).
  if (config_.moe_non_homogeneous_layers)
    for (auto& p : registry_.params())
      if (p.name.starts_with("decoder.layers.")) p.stack_layers = false;
  // Megatron's buffer groups by is_expert_parallel: the routed experts on the expert process
  // groups (Parameter::allreduce false) get a buffer of their own, reduced over expt-dp.
  std::vector<bool> dense, expert;
  for (const auto& p : registry_.params()) {
    dense.push_back(p.allreduce);
    expert.push_back(!p.allreduce);
  }
  const bool has_expert = std::find(expert.begin(), expert.end(), true) != expert.end();
  buffers_ = std::make_unique<distributed::ParamAndGradBuffer>(
      registry_.params(), registry_.local_shapes(), config_.params_dtype, config_.main_grads_dtype, device_,
      parallel_.allocate_main_grads, fp8_weights, has_expert ? dense : std::vector<bool>{});
  if (has_expert)
    expert_buffers_ = std::make_unique<distributed::ParamAndGradBuffer>(
        registry_.params(), registry_.local_shapes(), config_.params_dtype, config_.main_grads_dtype, device_,
        parallel_.allocate_main_grads, fp8_weights, expert);
  for (auto& p : registry_.params()) tensor_parallel::initialize_parameter(p, seed_);
  // --sequence-parallel: the norms marked their own parameters (transformer/norm.h).

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
    } else if (n.starts_with("mtp.")) {
      mtp_params_.push_back(i);
    } else {
      embedding_params_.push_back(i);
    }
  }
}

GPTModel::~GPTModel() = default;

std::vector<size_t> GPTModel::forward_stage_of_params() const {
  const size_t L = layer_params_.size();
  std::vector<size_t> stage(registry_.params().size(), 0);  // embedding_params_: stage 0
  for (size_t l = 0; l < L; ++l)
    for (size_t i : layer_params_[l]) stage[i] = 1 + l;
  for (size_t i : final_norm_params_) stage[i] = L + 1;
  for (size_t i : output_params_) stage[i] = L + 2;
  for (size_t i : mtp_params_) stage[i] = L + 2;
  return stage;
}

std::vector<Parameter>& GPTModel::parameters() { return registry_.params(); }
Tensor& GPTModel::param_buffer() { return buffers_->param_data(); }
Tensor& GPTModel::grad_buffer() { return buffers_->grad_data(); }
distributed::ParamAndGradBuffer& GPTModel::buffers() { return *buffers_; }
distributed::ParamAndGradBuffer* GPTModel::expert_parallel_buffers() { return expert_buffers_.get(); }
void GPTModel::zero_grad() {
  if (buffers_->grad_data().defined()) buffers_->grad_data().zero_();
  if (expert_buffers_ && expert_buffers_->grad_data().defined()) expert_buffers_->grad_data().zero_();
}
const Tensor& GPTModel::last_logits() const { return state_->head.logits; }
void GPTModel::set_input_tensor(const Tensor& hidden) { input_tensor_ = hidden; }
const Tensor& GPTModel::input_tensor_grad() const { return input_tensor_grad_; }

std::vector<transformer::moe::TopKRouter*> GPTModel::moe_routers() const {
  std::vector<transformer::moe::TopKRouter*> out = decoder_->moe_routers();
  for (const auto& m : mtp_)
    if (transformer::moe::TopKRouter* r = m->moe_router()) out.push_back(r);
  return out;
}

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

  if (fp8_state_) fp8_state_->set_recording(training);  // eval forwards leave the amax histories alone
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
    wait_for_stage(0);
    h = embedding_->forward(ids, position_ids, fc, st.embedding);
  } else {
    MEGATRON_CHECK(input_tensor_.dim() == 3 && input_tensor_.size(0) * sp_factor == s && input_tensor_.size(1) == b &&
                   input_tensor_.size(2) == config_.hidden_size)
        << "input tensor " << input_tensor_.str() << " for batch " << b << " x seq " << s;
    h = input_tensor_;
    input_tensor_ = Tensor();
  }
  h = decoder_->forward(h, fc, st.decoder, [this](size_t i) { wait_for_stage(1 + i); });
  st.has_forward = true;
  if (!parallel_.post_process) {
    rng_offset_ = fc.rng_offset;
    return h;
  }

  wait_for_stage(layer_params_.size() + 2);  // the output layer (and the MTP modules after it)
  Tensor loss_sb = head_forward(h, to_seq_first(batch.labels, device_), training, /*allow_fused=*/true, st.head);
  // MTP (Megatron's self.mtp + process_mtp_loss) in training forwards only: evaluation would
  // compute the same main loss and discard the MTP losses (Megatron logs them only in training).
  if (training && !mtp_.empty()) mtp_forward(batch, h, fc);
  rng_offset_ = fc.rng_offset;
  Tensor loss = Tensor::empty({b, s}, DType::kFloat32, device_);
  ops::transpose01(loss_sb, loss);
  return loss;
}

Tensor GPTModel::head_forward(const Tensor& h, const Tensor& labels, bool training, bool allow_fused, LmHead& hd) {
  hd.labels = labels;
  hd.logits = output_layer_->forward(h, hd.output_layer);
  const int64_t s = labels.size(0), b = labels.size(1);

  // Vocab-parallel cross entropy in fp32 (docs/megatron-reference.md#vocab-parallel-cross-entropy).
  const int64_t n = s * b;
  const int64_t vocab_start = parallel_.tp_group->rank() * (padded_vocab_size_ / parallel_.tp_group->size());
  Tensor logits2d = hd.logits.view({n, hd.logits.size(-1)});
  Tensor labels1d = hd.labels.view({n});
  // Training without TP: one pass computes the loss and overwrites the logits with the unscaled
  // gradient softmax - onehot; backward applies dloss to the output layer's small operands
  // instead of to the [n, V] tensor (one read of the logits fewer). Not for fp16 logits (their
  // gradient keeps the loss-scaled dloss factor inside the fp16 range, as in the unfused path),
  // nor for eval forwards (the logits stay readable through last_logits()), nor for an FP8 output
  // layer (its grad-output quantization needs dlogits itself: a per-token dloss cannot be moved to
  // the other FP8 operand, whose scale is the forward input's).
  const auto& olc = hd.output_layer;
  const bool fp8_head = fp8_state_ && config_.fp8->output_proj;
  hd.ce_fused = allow_fused && training && !fp8_head && parallel_.tp_group->size() == 1 && ce_fused_enabled() &&
                hd.logits.dtype() != DType::kFloat16 && olc.input.defined() && !olc.regather &&
                !olc.fp8_input_t.defined() && olc.input.dim() > 0 &&
                olc.input.numel() == n * olc.input.size(-1);
  Tensor loss_sb = Tensor::empty({s, b}, DType::kFloat32, device_);
  hd.lse = Tensor::empty({n}, DType::kFloat32, device_);
  Tensor loss_flat = loss_sb.view({n});
  if (hd.ce_fused) {
    ops::cross_entropy_fused_(logits2d, labels1d, vocab_start, loss_flat, hd.lse);
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
    ops::cross_entropy_loss(global_max, sumexp, pred, loss_flat, hd.lse);
    if (!allow_fused) {
      hd.global_max = global_max;
      hd.pred = pred;
    }
  }
  return loss_sb;
}

Tensor GPTModel::head_backward(const Tensor& dloss_sb, LmHead& hd) {
  const int64_t n = hd.labels.numel();
  const int64_t vocab_start = parallel_.tp_group->rank() * (padded_vocab_size_ / parallel_.tp_group->size());
  Tensor dh;
  if (hd.ce_fused) {
    // hd.logits holds g = softmax - onehot; dlogits = diag(dloss) g, so
    // dW = dlogits^T x = g^T (diag(dloss) x) and dx = dlogits W = diag(dloss) (g W).
    const Tensor dl = dloss_sb.view({n});
    tensor_parallel::LinearCtx ctx = hd.output_layer;
    const int64_t hid = ctx.input.size(-1);
    Tensor xs = Tensor::empty(ctx.input.shape(), ctx.input.dtype(), device_);
    Tensor xs2d = xs.view({n, hid});
    ops::scale_rows(ctx.input.view({n, hid}), dl, xs2d);
    ctx.input = xs;
    dh = output_layer_->backward(hd.logits, ctx, true);
    Tensor dh2d = dh.view({n, hid});
    ops::scale_rows(dh2d, dl, dh2d);
  } else {
    // dlogits overwrite the logits (they are not needed any more).
    Tensor logits2d = hd.logits.view({n, hd.logits.size(-1)});
    ops::cross_entropy_backward(logits2d, hd.labels.view({n}), vocab_start, hd.lse, dloss_sb.view({n}), logits2d);
    dh = output_layer_->backward(hd.logits, hd.output_layer, true);
  }
  return dh;
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
  std::vector<int64_t> pos(static_cast<size_t>(s * b));
  for (int64_t i = 0; i < s * b; ++i) pos[i] = offset + i / b;
  Tensor position_ids = Tensor::from_vector_i64(pos, {s, b}).to(device_);
  return forward_logits_device(to_seq_first(tokens, device_), position_ids, inference_context);
}

Tensor GPTModel::forward_logits_device(const Tensor& ids_sb, const Tensor& position_ids_sb,
                                       transformer::InferenceContext* inference_context) {
  MEGATRON_CHECK(parallel_.pre_process && parallel_.post_process && ids_sb.dim() == 2 &&
                 position_ids_sb.shape() == ids_sb.shape() && ids_sb.device() == device_ &&
                 position_ids_sb.device() == device_)
      << "forward_logits_device needs the whole model on one stage and ids / positions [s, b] on " << device_.str()
      << ", got " << ids_sb.str() << " and " << position_ids_sb.str();
  MEGATRON_CHECK(!parallel_.cp_group || parallel_.cp_group->size() == 1) << "forward_logits: no context parallelism";
  const bool learned = config_.position_embedding_type == transformer::PositionEmbeddingType::kLearnedAbsolute;
  if (fp8_state_) fp8_state_->set_recording(false);
  transformer::ForwardContext fc;
  fc.training = false;
  fc.inference_context = inference_context;
  if (config_.position_embedding_type == transformer::PositionEmbeddingType::kRope)
    fc.rotary_position_ids = position_ids_sb;
  common::EmbeddingCtx ectx;
  transformer::TransformerBlockCtx dctx;
  tensor_parallel::LinearCtx octx;
  Tensor h = embedding_->forward(ids_sb, learned ? position_ids_sb : Tensor(), fc, ectx);
  h = decoder_->forward(h, fc, dctx);
  return output_layer_->forward(h, octx);
}

void GPTModel::backward(const Tensor& dloss) {
  State& st = *state_;
  if (!st.has_forward) user_error("GPTModel.backward called without a preceding forward");
  wait_for_stage(num_forward_stages());
  Tensor dh;
  if (parallel_.post_process) {
    const int64_t s = st.head.labels.size(0), b = st.head.labels.size(1);
    MEGATRON_CHECK(dloss.dim() == 2 && dloss.size(0) == b && dloss.size(1) == s && dloss.dtype() == DType::kFloat32)
        << "dloss " << dloss.str() << " for batch " << b << " x seq " << s;
    dh = head_backward(to_seq_first(dloss, device_), st.head);
    if (!st.mtp.empty()) ops::add_(dh, mtp_backward());
    if (grad_ready_hook_ && !output_params_.empty()) grad_ready_hook_(output_params_);
    if (grad_ready_hook_ && !mtp_params_.empty()) grad_ready_hook_(mtp_params_);
    // The MTP stage's embedding copy is complete once the MTP modules ran backward.
    if (grad_ready_hook_ && !parallel_.pre_process && !embedding_params_.empty()) grad_ready_hook_(embedding_params_);
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

void GPTModel::mtp_forward(const datasets::GPTBatch& batch, const Tensor& h, transformer::ForwardContext& fc) {
  State& st = *state_;
  const size_t D = mtp_.size();
  MEGATRON_CHECK(batch.tokens.defined()) << "MTP needs the tokens on the last pipeline stage";
  check_ids(batch.tokens, padded_vocab_size_, "token id");
  comm::ProcessGroup* cp = parallel_.cp_group && parallel_.cp_group->size() > 1 ? parallel_.cp_group.get() : nullptr;
  // Megatron's roll_tensor works on the [b, s] batch tensors; here on their host copies.
  Tensor ids = batch.tokens.to(Device::cpu()), labels = batch.labels.to(Device::cpu());
  Tensor mask = batch.loss_mask.defined() ? batch.loss_mask.to(Device::cpu())
                                          : Tensor::empty(labels.shape(), DType::kFloat32);
  if (!batch.loss_mask.defined()) ops::fill(mask, 1.0f);
  MEGATRON_CHECK(mask.dtype() == DType::kFloat32 && mask.shape() == labels.shape())
      << "loss_mask " << mask.str() << " for labels " << labels.str();
  auto mask_sum = [](const Tensor& m) {
    double t = 0.0;
    for (int64_t i = 0; i < m.numel(); ++i) t += static_cast<double>(m.data<float>()[i]);
    return t;
  };
  st.mtp_original_tokens = mask_sum(mask);
  st.mtp.assign(D, GPTModelMtpDepth{});
  st.mtp_heads.assign(D, LmHead{});
  std::vector<MtpPending> pending(D);
  Tensor hk = h;
  for (size_t k = 0; k < D; ++k) {
    GPTModelMtpDepth& d = st.mtp[k];
    // _get_embeddings: ids rolled once more, embedded by the shared embedding (its dropout too).
    // Position ids are not rolled: RoPE ignores them in training, learned positions are refused.
    ids = transformer::roll_tensor(ids, cp, device_);
    Tensor emb = embedding_->forward(to_seq_first(ids, device_), Tensor(), fc, d.embedding);
    hk = mtp_[k]->forward(hk, emb, fc, d.layer);
    // process_mtp_loss: labels and loss mask rolled k+1 times; the shared output layer.
    labels = transformer::roll_tensor(labels, cp, device_);
    mask = transformer::roll_tensor(mask, cp, device_);
    d.num_tokens = mask_sum(mask);
    d.mask_sb = to_seq_first(mask, Device::cpu());
    LmHead& hd = st.mtp_heads[k];
    pending[k].loss_sb = head_forward(hk, to_seq_first(labels, device_), /*training=*/true, /*allow_fused=*/false, hd);
    pending[k].mask_sb = d.mask_sb;
    pending[k].global_max = hd.global_max;
    pending[k].pred = hd.pred;
    pending[k].num_tokens = d.num_tokens;
    hd.global_max = hd.pred = Tensor();
  }
  mtp_pending_.push_back(std::move(pending));
}

Tensor GPTModel::mtp_backward() {
  State& st = *state_;
  const size_t D = st.mtp.size();
  // MTPLossAutoScaler: d(mtp loss)/d(per-token loss) = mask · scale, where the module's loss is
  // mtp_loss_scaling_factor / D · Σ(loss·mask) / max(Σ mask, 1) (calculate_per_token_loss:
  // · Σ original mask instead of the division, the grads being divided by the global count later).
  const double per_module = mtp_loss_scale_ * static_cast<double>(config_.mtp_loss_scaling_factor) /
                            static_cast<double>(D);
  Tensor dnext;  // dL/d(hidden input of module k+1) = dL/dh_k through the next module
  for (size_t k = D; k-- > 0;) {
    GPTModelMtpDepth& d = st.mtp[k];
    const double n = std::max(d.num_tokens, 1.0);
    const double c = config_.calculate_per_token_loss ? per_module * st.mtp_original_tokens / n : per_module / n;
    Tensor seed = d.mask_sb.clone();
    float* p = seed.data<float>();
    for (int64_t i = 0; i < seed.numel(); ++i) p[i] *= static_cast<float>(c);
    Tensor dk = head_backward(seed.to(device_), st.mtp_heads[k]);
    st.mtp_heads[k] = LmHead();  // this module's logits are no longer needed
    if (dnext.defined()) ops::add_(dk, dnext);
    auto [dhidden, demb] = mtp_[k]->backward(dk, d.layer);
    embedding_->backward(demb, d.embedding);
    dnext = dhidden;
    d = GPTModelMtpDepth{};
  }
  return dnext;
}

std::vector<GPTModel::MtpMetrics> GPTModel::take_mtp_metrics() {
  std::vector<MtpMetrics> out(mtp_.size());
  for (const auto& forward : mtp_pending_)
    for (size_t k = 0; k < forward.size(); ++k) {
      const MtpPending& p = forward[k];
      const Tensor loss = p.loss_sb.to(Device::cpu()), mx = p.global_max.to(Device::cpu()),
                   pred = p.pred.to(Device::cpu());
      const float *l = loss.data<float>(), *m = p.mask_sb.data<float>(), *x = mx.data<float>(),
                  *y = pred.data<float>();
      double sum = 0.0;
      for (int64_t i = 0; i < loss.numel(); ++i) {
        sum += static_cast<double>(l[i]) * static_cast<double>(m[i]);
        if (m[i] != 0.0f) {
          out[k].total += 1.0;
          // argmax == label <=> the label's logit is the row maximum (ties aside: torch.argmax
          // takes the first maximal index, here any maximal label counts).
          if (y[i] == x[i]) out[k].correct += 1.0;
        }
      }
      out[k].loss += p.num_tokens > 0.0 ? sum / p.num_tokens : 0.0;
    }
  mtp_pending_.clear();
  return out;
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
