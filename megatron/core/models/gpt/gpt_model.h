// GPTModel: the GPT / LLaMA decoder-only language model (Megatron-Core's
// megatron/core/models/gpt/gpt_model.py), flavour chosen by TransformerConfig:
//   GPT:   learned absolute positions, LayerNorm, GeLU MLP, biases, tied output layer;
//   LLaMA: RoPE, RMSNorm, SwiGLU, GQA, no biases, untied output layer.
//
// No autograd: forward() keeps the activations backward() needs; backward() walks the layers
// in reverse and ACCUMULATES into every Parameter's main_grad (gradient accumulation over
// micro-batches; zero_grad() clears). A forward is normally followed by its backward; pipeline
// schedules keep several micro-batches in flight by parking each forward's activations under a
// key (stash_activations) and bringing them back before that micro-batch's backward
// (restore_activations).
//
// Mixed precision as Megatron: parameters and activations in config.params_dtype (bfloat16 /
// float16 emulated by rounding on CPU), main grads in config.main_grads_dtype (float32 default),
// softmax and cross entropy in float32.
//
// Initialization (docs/architecture.md#initialization): weights N(0, init_method_std); linear_proj and
// linear_fc2 N(0, init_method_std / sqrt(2 * num_layers)); biases 0; norm weights 1 (0 with
// layernorm_zero_centered_gamma). Each global weight is drawn from an RNG keyed by (seed,
// parameter name), so the values do not depend on the TP/PP layout.
//
// Multi-token prediction (config.mtp_num_layers = D > 0, docs/training.md "Multi-token
// prediction"): the last pipeline stage also holds D MTP modules ("mtp.layers.<k>.*",
// transformer/multi_token_prediction.h) after the decoder, the shared embedding (a copy
// "embedding.word_embeddings.weight" marked `shared` when the stage is not the first, whose
// gradient the embedding group sums with the first stage's) and the shared output layer.
// A training forward runs them after the main head; their losses (Megatron's process_mtp_loss)
// only enter the gradient, seeded in backward() with set_mtp_loss_scale(); forward() still
// returns the main model's per-token loss.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "megatron/core/datasets/gpt_batch.h"
#include "megatron/core/distributed/param_and_grad_buffer.h"
#include "megatron/core/comm/process_group.h"
#include "megatron/core/tensor/tensor.h"
#include "megatron/core/tensor/parameter.h"
#include "megatron/core/transformer/transformer_config.h"

namespace megatron::transformer {
class TransformerBlock;
class MultiTokenPredictionLayer;
struct ForwardContext;
class InferenceContext;
namespace moe {
class TopKRouter;
}
}
namespace megatron::models::common {
class LanguageModelEmbedding;
}
namespace megatron::tensor_parallel {
class ColumnParallelLinear;
}

namespace megatron::models::gpt {

using transformer::TransformerConfig;

/// How this model instance is placed in the parallel layout. Defaults = one process.
struct GPTModelParallel {
  /// Tensor-parallel group (nullptr = single rank).
  std::shared_ptr<comm::ProcessGroup> tp_group;
  /// Pipeline stage (Megatron's pre_process / post_process): the first stage owns the
  /// embedding, the last stage the final norm, output layer and loss. A stage that is not
  /// first takes its input from set_input_tensor(); a stage that is not last returns its
  /// hidden states from forward() and takes their gradient in backward().
  bool pre_process = true;
  bool post_process = true;
  /// Decoder layers of this stage: global indices [layer_offset, layer_offset + num_layers)
  /// (num_layers = -1: all config.num_layers). Parameter names use the global index.
  int64_t layer_offset = 0;
  int64_t num_layers = -1;
  /// Pipeline rank: dropout seeds are seed + 100 * pp_rank as in Megatron (init is not
  /// affected: weights are keyed by name).
  int pp_rank = 0;
  /// Context-parallel group (nullptr or size 1 = none). With CP, forward() takes this rank's
  /// two sequence chunks (transformer::get_batch_on_this_cp_rank), RoPE uses their global
  /// positions and attention runs as a K/V ring over the group (context_parallel.h).
  std::shared_ptr<comm::ProcessGroup> cp_group;
  /// --cp-comm-type ("p2p").
  std::string cp_comm_type = "p2p";
  /// false: no gradient buffer (evaluation only, pretrain_gpt --skip-train): every
  /// Parameter::main_grad stays undefined, grad_buffer() is an undefined tensor and backward()
  /// must not be called.
  bool allocate_main_grads = true;
};

class GPTModel {
 public:
  /// Builds and initializes the model. padded_vocab_size = vocab padded to
  /// make_vocab_size_divisible_by * TP (docs/megatron-reference.md#vocab-padding); max_sequence_length = size of the
  /// learned position table (--max-position-embeddings). config.validate() is called here.
  /// Throws UserError for an inconsistent configuration.
  GPTModel(const TransformerConfig& config, int64_t padded_vocab_size, int64_t max_sequence_length, uint64_t seed,
           Device device = Device::cpu(), GPTModelParallel parallel = {});
  ~GPTModel();
  GPTModel(const GPTModel&) = delete;
  GPTModel& operator=(const GPTModel&) = delete;

  /// All parameters of this rank in Megatron's named_parameters() order.
  std::vector<Parameter>& parameters();
  /// Contiguous buffers (reverse registration order, docs/megatron-reference.md#ddp-buffers) that every
  /// Parameter::data / main_grad views.
  Tensor& param_buffer();
  Tensor& grad_buffer();
  distributed::ParamAndGradBuffer& buffers();
  /// Megatron's expert_parallel_buffers: the buffers of the routed experts' weights when they use
  /// the expert process groups (Parameter::allreduce false: --expert-model-parallel-size > 1 or
  /// --expert-tensor-parallel-size != --tensor-model-parallel-size), else nullptr. buffers() then
  /// holds every other parameter; param_buffer()/grad_buffer() are those of buffers().
  distributed::ParamAndGradBuffer* expert_parallel_buffers();

  /// Runs the model on a micro-batch (tokens/labels/position_ids [b, s] int64, optional
  /// attention_mask [b, 1, s, s] uint8, 1 = masked; loss_mask is NOT applied to the returned
  /// loss; with MTP in training it weights the MTP losses, float32 [b, s], undefined = ones).
  /// training=false disables dropout. Returns the per-token cross-entropy loss float32 [b, s]
  /// (Megatron's compute_language_model_loss output, before loss_mask); on a stage without
  /// post_process, the output hidden states [s, b, h] in the model dtype instead. A stage
  /// without pre_process reads only labels (last stage) and attention_mask from the batch;
  /// a middle stage needs neither tokens nor labels.
  /// Throws UserError if s exceeds max_sequence_length (learned positions) or a token id or
  /// label is outside the vocabulary.
  Tensor forward(const datasets::GPTBatch& batch, bool training);
  /// Logits of the last forward, [s, b, padded_vocab/TP] in the model dtype (sequence-first);
  /// valid until backward() (which reuses their memory for the logits' gradient). After a
  /// training forward without TP and with fp32/bf16 logits (the fused cross entropy,
  /// MEGATRON_CE_FUSED unset or 1) they already hold softmax - onehot(label): read logits from a
  /// training=false forward.
  const Tensor& last_logits() const;
  /// Inference forward (Megatron's GPTModel.forward(input_ids, position_ids, attention_mask,
  /// inference_context) without labels): tokens int64 [b, s] (any device) at positions
  /// offset .. offset+s-1, offset = inference_context->sequence_len_offset (0 without a context).
  /// With a context every attention layer appends to and reads from its KV cache (the caller
  /// advances the offset by s afterwards); without one this is a full causal forward. No dropout,
  /// no activations kept, last_logits() untouched. Returns this rank's vocab shard of the logits
  /// [s, b, padded_vocab/TP] in the model dtype. Needs pre_process and post_process (no pipeline
  /// split) and no context parallelism (InternalError otherwise); UserError for a token id outside
  /// the vocabulary (CPU tokens) or positions beyond --max-position-embeddings (learned positions).
  Tensor forward_logits(const Tensor& tokens, transformer::InferenceContext* inference_context = nullptr);
  /// forward_logits on inputs already in this model's device memory (text generation's decode
  /// step as a CUDA graph, docs/inference.md "CUDA graph of the decode step"): ids_sb,
  /// position_ids_sb int64 [s, b] (sequence-first) on device(); the caller checks their range
  /// (nothing here reads them on the host). No host synchronization, no host-to-device copy, so
  /// the call can be captured. Returns logits [s, b, V/TP]. Throws InternalError for other shapes
  /// or devices.
  Tensor forward_logits_device(const Tensor& ids_sb, const Tensor& position_ids_sb,
                               transformer::InferenceContext* inference_context);
  /// Backward of the last forward. With post_process: dloss float32 [b, s] = dL/dloss;
  /// otherwise dL/d(output hidden states) [s, b, h]. ACCUMULATES into main_grad. With MTP the
  /// MTP losses' gradient is added: module k's per-token loss is seeded with rolled_mask ·
  /// mtp_loss_scale · mtp_loss_scaling_factor / D / max(Σ rolled_mask, 1) (times Σ loss_mask with
  /// calculate_per_token_loss), as Megatron's MTPLossAutoScaler.
  void backward(const Tensor& dloss);
  /// Megatron's MTPLossAutoScaler.set_loss_scale: the main loss's backward scale (loss scale /
  /// num_microbatches, or the loss scale with --calculate-per-token-loss), read by the next
  /// backward(). Default 1.
  void set_mtp_loss_scale(double scale) { mtp_loss_scale_ = scale; }
  /// Per MTP module, summed over the training forwards since the last call (Megatron's
  /// MTPLossLoggingHelper tracker, this rank only): `loss` = Σ over micro-batches of
  /// Σ(loss·rolled_mask) / max(Σ rolled_mask, 1); `correct` / `total` = positions with a nonzero
  /// rolled mask whose label is the argmax of the module's logits / all of them. Empty without
  /// MTP on this stage. Copies device values to the host (synchronizes).
  struct MtpMetrics {
    double loss = 0.0, correct = 0.0, total = 0.0;
  };
  std::vector<MtpMetrics> take_mtp_metrics();
  /// Megatron's set_input_tensor: the hidden states [s, b, h] from the previous pipeline
  /// stage, used by the next forward() of a stage without pre_process.
  void set_input_tensor(const Tensor& hidden);
  /// After backward() on a stage without pre_process: dL/d(input hidden states) [s, b, h],
  /// to send to the previous stage.
  const Tensor& input_tensor_grad() const;
  /// main_grad = 0 for every parameter (zeros the grad buffer).
  void zero_grad();

  /// Pipeline schedules: parks the activations of the last forward under `key` (e.g. the
  /// micro-batch id) so another micro-batch can run forward; restore_activations(key) makes
  /// them current again for that micro-batch's backward. Throws InternalError (MEGATRON_CHECK)
  /// when `key` is already parked / not parked.
  void stash_activations(int64_t key);
  void restore_activations(int64_t key);
  /// Number of parked micro-batches (0 after a complete pipeline step).
  size_t num_stashed_activations() const;

  /// Called during backward() with the registration indices (into parameters()) of parameters
  /// whose gradient of this backward is complete: the output layer (after the MTP modules, which
  /// follow it, when there are any), then per decoder layer (the final norm with the last layer),
  /// then the embedding. DDP's register_grad_ready for
  /// --overlap-grad-reduce. Empty function = none (default).
  using GradReadyHook = std::function<void(const std::vector<size_t>& param_indices)>;
  void set_grad_ready_hook(GradReadyHook hook) { grad_ready_hook_ = std::move(hook); }

  /// The forward stages of this chunk, in the order a forward first reads their parameters:
  /// 0 the embedding, 1 + i local decoder layer i, L + 1 the final norm, L + 2 the output layer
  /// and the MTP modules (which run after it), L = this chunk's decoder layers; so
  /// num_forward_stages() = L + 3 (a stage may hold no parameter on a pipeline stage).
  size_t num_forward_stages() const { return layer_params_.size() + 3; }
  /// The forward stage (as above) of every parameter, in registration order (as parameters()).
  std::vector<size_t> forward_stage_of_params() const;
  /// Called with stage s before a forward() first reads the parameters of forward stage s
  /// (stages in increasing order, each once per forward; a stage this chunk does not run is
  /// skipped), and with num_forward_stages() when backward() starts, before it reads or
  /// accumulates into any parameter or gradient. Megatron's forward pre-hooks (the overlapped
  /// optimizer step, optimizer/step_overlap.h, makes the compute stream wait there for the
  /// update of those parameters). Empty function = none (default).
  using ParamWaitHook = std::function<void(size_t stage)>;
  void set_param_wait_hook(ParamWaitHook hook) { param_wait_hook_ = std::move(hook); }

  const TransformerConfig& config() const { return config_; }
  /// FP8 state of this model's FP8 linear layers (nullptr without --fp8-format): call its
  /// reduce_and_update() once per training step, save/restore it with checkpoints.
  fp8::Fp8State* fp8_state() const { return fp8_state_.get(); }
  /// The routers of this chunk's MoE decoder layers in layer order, then those of its MoE MTP
  /// layers (the last decoder layer is MoE; MTP stage only) by depth (empty for a dense model):
  /// expert-bias updates at the optimizer step and the expert_bias checkpoint buffers.
  std::vector<transformer::moe::TopKRouter*> moe_routers() const;
  int64_t padded_vocab_size() const { return padded_vocab_size_; }
  /// --max-position-embeddings (the limit of learned absolute positions).
  int64_t max_sequence_length() const { return max_sequence_length_; }
  /// True for learned absolute position embeddings (positions must stay below max_sequence_length()).
  bool learned_positions() const {
    return config_.position_embedding_type == transformer::PositionEmbeddingType::kLearnedAbsolute;
  }
  Device device() const { return device_; }
  /// Parameter by Megatron name; throws UserError if absent.
  Parameter& parameter(const std::string& name);
  /// Dropout stream position (offset counter of the per-call random streams); saved in
  /// checkpoints so a resumed run draws the same dropout masks (Megatron saves its RNG tracker).
  uint64_t rng_offset() const;
  void set_rng_offset(uint64_t offset);

 private:
  struct State;
  struct LmHead;
  /// Output layer + vocab-parallel cross entropy of h [s', b, h] against labels [s, b] (device):
  /// per-token loss float32 [s, b]; `allow_fused` permits ops::cross_entropy_fused_.
  Tensor head_forward(const Tensor& h, const Tensor& labels, bool training, bool allow_fused, LmHead& hd);
  /// dloss float32 [s, b] on the device -> dL/dh.
  Tensor head_backward(const Tensor& dloss_sb, LmHead& hd);
  /// The MTP modules of a training forward after the main head (h = decoder output).
  void mtp_forward(const datasets::GPTBatch& batch, const Tensor& h, transformer::ForwardContext& fc);
  /// Their backward; returns dL/d(decoder output) from the MTP path.
  Tensor mtp_backward();
  TransformerConfig config_;
  /// Runtime FP8 state shared by this model's FP8 linear layers (null without config_.fp8).
  std::shared_ptr<fp8::Fp8State> fp8_state_;
  int64_t padded_vocab_size_;
  int64_t max_sequence_length_;
  uint64_t seed_;
  Device device_;
  GPTModelParallel parallel_;
  ParamRegistry registry_;
  std::unique_ptr<models::common::LanguageModelEmbedding> embedding_;
  std::unique_ptr<transformer::TransformerBlock> decoder_;
  std::unique_ptr<tensor_parallel::ColumnParallelLinear> output_layer_;
  std::vector<std::unique_ptr<transformer::MultiTokenPredictionLayer>> mtp_;  // MTP stage only
  double mtp_loss_scale_ = 1.0;
  struct MtpPending;  // per training forward, per module: device values for take_mtp_metrics
  std::vector<std::vector<MtpPending>> mtp_pending_;
  std::unique_ptr<distributed::ParamAndGradBuffer> buffers_;
  std::unique_ptr<distributed::ParamAndGradBuffer> expert_buffers_;  // expert_parallel_buffers()
  std::unique_ptr<State> state_;  // activations of the current micro-batch
  std::map<int64_t, std::unique_ptr<State>> stashed_;
  uint64_t rng_offset_ = 0;       // dropout stream position
  GradReadyHook grad_ready_hook_;
  ParamWaitHook param_wait_hook_;
  void wait_for_stage(size_t stage) const {
    if (param_wait_hook_) param_wait_hook_(stage);
  }
  // Registration indices per local decoder layer, of output layer (+ final norm), of embedding.
  std::vector<std::vector<size_t>> layer_params_;
  std::vector<size_t> output_params_, final_norm_params_, embedding_params_, mtp_params_;
  Tensor input_tensor_;           // set_input_tensor()
  Tensor input_tensor_grad_;
};

}  // namespace megatron::models::gpt
