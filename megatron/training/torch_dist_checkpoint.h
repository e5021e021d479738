// Megatron-LM torch_dist checkpoints in pretrain_gpt's --load / --save (docs/checkpointing.md,
// "Megatron-LM torch_dist checkpoints"): the mapping between Megatron's GPTModel / optimizer
// state-dict keys and common state (megatron/training/checkpointing.py generate_state_dict) and
// ours. The file format itself is dist_checkpointing/torch_dist/.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "megatron/core/dist_checkpointing/mapping.h"
#include "megatron/core/dist_checkpointing/torch_dist/torch_dist.h"

namespace megatron::training {

/// How our keys are found in one torch_dist checkpoint.
struct TorchDistReadPlan {
  /// Our key -> the checkpoint's key (TE-fused layer-norm names, the distributed optimizer's
  /// "optimizer.state.param.*", fp32 training's missing main params -> the model weight).
  std::function<std::string(const std::string&)> key_map;
  /// Whether the checkpoint holds (a mapping of) our key.
  std::function<bool(const std::string&)> has;
  /// True when the checkpoint was written by megatron.cpp (it has our RNG objects' prefix keys
  /// or "megatron_cpp" in its common state).
  bool ours = false;
  /// True when the checkpoint holds megatron.cpp's FP8 state (amax histories and scales, stored
  /// under "megatron_cpp." + `<linear>._extra_state.fp8.*`; docs/checkpointing.md).
  bool fp8_state = false;
  /// The checkpoint's tensor keys (its .metadata), sorted.
  std::vector<std::string> tensor_keys;
};

/// Reads `dir/.metadata` and checks that every tensor is one we can map: throws UserError naming
/// the file and key for a key of another architecture or layer type, or the
/// distributed optimizer's DP-specific layouts (dp_reshardable / dp_zero_gather_scatter:
/// re-save with --dist-ckpt-optim-fully-reshardable, or load with --no-load-optim).
/// `with_optim`: whether optimizer keys will be requested (the DP-layout check applies then).
/// Our FP8 state tensors are accepted (and mapped back by key_map) whether or not they are loaded.
TorchDistReadPlan plan_torch_dist_read(const std::string& dir, bool with_optim);

/// The key checks before a torch_dist load; `requested` are the keys of our ShardedTensors (model,
/// optimizer) this rank loads. unused_torch_dist_keys: the checkpoint's tensors none of
/// `requested` maps to, which are not loaded (Megatron's default --dist-ckpt-strictness
/// assume_ok_unexpected); optimizer tensors are left out of it when `with_optim` is false, and so
/// are megatron.cpp's own tensors (FP8 state, "megatron_cpp." prefix).
std::vector<std::string> unused_torch_dist_keys(const TorchDistReadPlan& plan, const std::vector<std::string>& requested,
                                                bool with_optim);
/// Throws UserError with one line listing every requested key the checkpoint lacks (each once,
/// with the checkpoint key it was looked for under), as Megatron's strict load of a missing key:
/// `DIR/.metadata: 2 tensor(s) of this model are not in the checkpoint: 'decoder.layers.mlp.router.weight', ...`.
void check_torch_dist_keys_present(const TorchDistReadPlan& plan, const std::vector<std::string>& requested,
                                   const std::string& dir);

/// Megatron's common.pt (as JSON) in our common-state layout: "args" (its Namespace attributes),
/// "iteration", "checkpoint_version", "num_floating_point_operations_so_far",
/// "opt_param_scheduler", "optimizer" {"step": the optimizer step (common_step or the param
/// groups' step), "grad_scaler" when saved}. Our own torch_dist checkpoints pass through.
nlohmann::json common_from_torch_dist(const nlohmann::json& megatron_common);

/// Megatron's torch_dist key of one of our model (or optimizer-state) keys: the layer norms of
/// every transformer layer (decoder layers, stacked "decoder.layers.X" or per layer
/// "decoder.layers.<i>.X", and the MTP modules' "mtp.layers.<k>.transformer_layer.X") under the
/// names of TransformerLayer's sharded_state_dict_keys_map (local and TE specs):
/// "…input_layernorm.{weight,bias}" -> "…self_attention.linear_qkv.layer_norm_{weight,bias}",
/// "…pre_mlp_layernorm.{…}" -> "…mlp.linear_fc1.layer_norm_{…}"; every other key unchanged.
std::string torch_dist_model_key(const std::string& key);
/// The inverse of torch_dist_model_key for a checkpoint's model key.
std::string model_key_from_torch_dist(const std::string& key);

/// The unique keys ("<linear>._extra_state/shard_<offsets>_<shape>", Megatron's
/// ShardedObject.unique_key) of the None `_extra_state` objects Megatron's local-spec linear layers
/// (ColumnParallelLinear / RowParallelLinear: linear_qkv, linear_proj, linear_fc1, linear_fc2 of
/// dense MLPs, routed experts and shared experts, the MTP eh_proj; not output_layer, which
/// Megatron's GPTModel drops) save beside the weights in `tensors` (our ShardedTensors; optimizer states skipped):
/// offsets and shape are the weight's leading layer / expert axes (Megatron's
/// _get_extra_state_offsets: "0" and "1" without any), written for the pieces with replica_id 0
/// that start the weight's own axes, so each object has one writer across all ranks.
std::vector<std::string> torch_dist_extra_state_keys(const std::vector<dist_checkpointing::ShardedTensor>& tensors);

/// Saves `sd` (our keys and common state) as a torch_dist checkpoint Megatron-LM's --load reads:
/// keys mapped to Megatron's (with the distributed optimizer, fp32 main params as
/// "optimizer.state.param.<key>" of its fully_reshardable layout), args pickled as an
/// argparse.Namespace, the None `_extra_state` objects Megatron's linear layers request
/// (torch_dist_extra_state_keys), our RNG state as an object Megatron ignores, our FP8 state
/// tensors under "megatron_cpp." + their key (Megatron ignores them too).
/// `tp_rank`, `dp_rank`, `last_stage`: this rank's position.
void save_torch_dist_checkpoint(const dist_checkpointing::ShardedStateDict& sd, const std::string& dir,
                                comm::ProcessGroup* world, bool distributed_optimizer, int tp_rank, int dp_rank,
                                bool last_stage);

}  // namespace megatron::training
