// Parameters of a model built from explicit-forward/backward modules (no autograd).
//
// Every module registers its parameters, in Megatron's named_parameters() order, in a
// ParamRegistry owned by the model. After construction the model lays all parameters out in
// one contiguous parameter buffer and one contiguous gradient buffer
// (distributed/param_and_grad_buffer.h) and each Parameter's `data`/`main_grad` become views
// into them. Modules keep a ParamRef (registry + index) and read the views at call time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "megatron/core/tensor/tensor.h"

namespace megatron::fp8 {
class Fp8State;
}

namespace megatron {

/// How a parameter is initialized (Megatron: init_method / output-layer scaled init / zeros / ones).
enum class InitKind { kNormal, kZeros, kOnes };

/// One parameter tensor (this rank's TP shard of a global weight).
struct Parameter {
  /// Megatron name, e.g. "decoder.layers.0.self_attention.linear_qkv.weight".
  std::string name;
  /// Model dtype; a view into the contiguous parameter buffer. Shape = local (sharded) shape.
  Tensor data;
  /// float32 (or bfloat16 with --grad-reduce-in-bf16); a view into the contiguous grad buffer.
  Tensor main_grad;
  /// ndim == 1 or a bias (docs/megatron-reference.md#param-groups): weight decay multiplier 0.
  bool no_weight_decay = false;
  /// Word embedding (first stage) or untied output layer weight (--decoupled-lr group).
  bool is_embedding_or_output = false;
  /// Sharded across tensor-parallel ranks (otherwise a TP duplicate: counted once in grad norm).
  bool tensor_parallel = false;
  /// Duplicate of the tied embedding on the last pipeline stage (excluded from grad norm).
  bool shared = false;
  /// --sequence-parallel: used on this rank's 1/TP of the sequence (norm weights), so its
  /// gradient is a partial sum that finalize_model_grads all-reduces over TP (Megatron's
  /// `sequence_parallel` parameter attribute).
  bool sequence_parallel = false;
  /// Megatron's `allreduce` parameter attribute: false for the routed experts' weights when they
  /// use the expert process groups (--expert-model-parallel-size > 1 or --expert-tensor-parallel-size
  /// != --tensor-model-parallel-size; Megatron's use_expert_pgs). Such a parameter lives in the
  /// model's expert-parallel buffer, its gradient is reduced over the expert-data-parallel group
  /// and its grad norm is taken over the expert tensor-model-pipeline group (docs/moe.md);
  /// `tp_rank`/`tp_size` are then its expert-TP rank and size.
  bool allreduce = true;
  /// Checkpoint layout (Megatron's sharded_offsets): a routed expert's weight is one slice of its
  /// layer's `...mlp.experts.experts.linear_fc{1,2}.weight` tensor, along an expert axis of size
  /// `num_experts` at `expert_index` (its global index; -1: not an expert's weight).
  int64_t expert_index = -1;
  int64_t num_experts = 0;
  /// false: a decoder-layer parameter keyed per layer ("decoder.layers.N.…", no layer axis), as
  /// Megatron's TransformerBlock.sharded_state_dict with non_homogeneous_layers (--moe-layer-freq
  /// a list or an integer > 1).
  bool stack_layers = true;
  /// Shape of the unsharded weight.
  std::vector<int64_t> global_shape;

  // ---- sharding and initialization details (for init and checkpoint resharding) ----
  /// Dimension split across TP ranks (-1 = not split), and the number of consecutive
  /// blocks along it that are split separately (2 for SwiGLU fc1 = [gate; up]).
  int partition_dim = -1;
  int partition_stride = 1;
  int tp_rank = 0;
  int tp_size = 1;
  InitKind init = InitKind::kZeros;
  float init_std = 0.0f;
  /// Name whose random stream initializes this parameter (empty = `name`). The last pipeline
  /// stage's copy of a tied embedding ("output_layer.weight", shared = true) uses
  /// "embedding.word_embeddings.weight", so both copies start equal without communication.
  std::string init_key;

  // ---- --fp8-param-gather (docs/fp8.md, "FP8 parameters") ----
  /// The weight of an FP8 GEMM kept as an FP8 primary weight: float8_e4m3, same shape as
  /// `data`, a view into the FP8 parameter buffer (undefined otherwise). The distributed
  /// optimizer casts its main-param shard into it and all-gathers these bytes; `data` then only
  /// holds this rank's shard up to date (refreshed whole before a checkpoint save).
  Tensor fp8_data;
  /// The FP8 state and linear index (Fp8State::register_linear) whose weight role scales it.
  std::shared_ptr<fp8::Fp8State> fp8_state;
  int fp8_base = -1;
};

/// The ordered list of a model's parameters.
class ParamRegistry {
 public:
  /// Registers a parameter with its local shape; returns its index (registration order).
  size_t add(Parameter p, Shape local_shape);
  std::vector<Parameter>& params() { return params_; }
  const std::vector<Parameter>& params() const { return params_; }
  const Shape& local_shape(size_t i) const { return local_shapes_[i]; }
  const std::vector<Shape>& local_shapes() const { return local_shapes_; }

 private:
  std::vector<Parameter> params_;
  std::vector<Shape> local_shapes_;
};

/// A module's handle on one of its parameters.
class ParamRef {
 public:
  ParamRef() = default;
  ParamRef(ParamRegistry* reg, size_t index) : reg_(reg), index_(index) {}
  bool defined() const { return reg_ != nullptr; }
  Parameter& param() const { return reg_->params()[index_]; }
  const Tensor& data() const { return param().data; }
  Tensor& grad() const { return param().main_grad; }

 private:
  ParamRegistry* reg_ = nullptr;
  size_t index_ = 0;
};

}  // namespace megatron
