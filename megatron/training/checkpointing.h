// Trainer-side checkpointing (Megatron's megatron/training/checkpointing.py): --save/--load
// directory conventions, the tracker file, what goes into a checkpoint, and the
// --no-load-optim / --no-load-rng / --finetune / --async-save semantics.
//
// Layout (docs/checkpointing.md):
//   <save>/latest_checkpointed_iteration.txt   "<iteration>" without newline (written last)
//   <save>/iter_0000100/                        a dist_checkpointing directory
//
// How the trainer uses it (every rank calls every function, in the same order):
//
//   TrainingState st;
//   st.model = model_sharded_tensors(...);              // this rank's params, global coordinates
//   add_optimizer_state(st, i, main_param, exp_avg, exp_avg_sq);  // per param (fp32), optional
//   st.optimizer_common = {{"step", step}, {"param_groups", ...}};
//   st.opt_param_scheduler = scheduler.state_dict();   st.rng_state = rng.state();
//   LoadResult r = load_checkpoint(st, cfg, ranks, world);  // fills tensors in place
//   ... train; every --save-interval:
//   st.iteration = it; st.consumed_train_samples = ...;
//   save_checkpoint(st, cfg, ranks, world);
//   maybe_finalize_async_save(world, /*blocking=*/false) each iteration; blocking at exit.
//
// The tensors in TrainingState are *views* of the live parameters/optimizer state: load writes
// into them; a synchronous save reads them; an async save copies them before returning.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "megatron/core/dist_checkpointing/mapping.h"
#include "megatron/core/comm/process_group.h"

namespace megatron {
struct Parameter;
class OptimizerParamScheduler;
}
namespace megatron::optimizer {
class MegatronOptimizer;
}
namespace megatron::models::gpt {
class GPTModel;
}

namespace megatron::training {

struct Arguments;
using dist_checkpointing::ShardedTensor;

/// Checkpoint flags, named as Megatron's.
struct CheckpointConfig {
  std::string save;                        // --save
  std::string load;                        // --load
  bool no_save_optim = false;              // --no-save-optim
  bool no_save_rng = false;                // --no-save-rng
  bool no_load_optim = false;              // --no-load-optim (also skips the scheduler)
  bool no_load_rng = false;                // --no-load-rng
  bool finetune = false;                   // --finetune: weights only, iteration and samples start at 0
  bool async_save = false;                 // --async-save
  bool exit_on_missing_checkpoint = false; // --exit-on-missing-checkpoint
  int64_t ckpt_step = -1;                  // --ckpt-step: load this iteration instead of the tracker's
  std::string ckpt_format = "torch_dist";  // --ckpt-format (printed in the save line)
  /// Write Megatron-LM's torch_dist (PyTorch DCP) files instead of our own layout (pretrain_gpt
  /// sets it when --ckpt-format torch_dist is given on the command line). Loading detects the
  /// format from the checkpoint's metadata.json whatever this says.
  bool write_torch_dist = false;
  /// This run's arguments (checkpoint_args.h checkpoint_args()); when an object, load_checkpoint
  /// runs check_checkpoint_args against the checkpoint's args before reading any tensor (not
  /// with --finetune, as Megatron). Null: no check.
  nlohmann::json expected_args;
};

/// This rank's position (printed in the log lines, RNG state grid). dp_rank/dp_size: the
/// data-parallel group with context parallelism (every rank holding the same model piece).
struct ParallelRanks {
  int tp_rank = 0, tp_size = 1;
  int pp_rank = 0, pp_size = 1;
  int dp_rank = 0, dp_size = 1;
  /// Expert-data-parallel rank (expt-dp): the replica index of the expert-parallel parameters
  /// (Parameter::allreduce false), whose expert-TP rank/size come from the parameter itself.
  int edp_rank = 0;
  /// Expert-tensor-parallel rank (expt-tp): with edp_rank, which copy of a routed expert's FP8
  /// state is the one written (fp8::Fp8State::checkpoint_tensors' expert replica).
  int etp_rank = 0;
};

/// This rank's position from parallel_state (initialize_model_parallel must have run); DP is
/// the data-parallel group with context parallelism (every rank holding the same model piece).
ParallelRanks checkpoint_ranks();

/// What a checkpoint holds for one rank.
struct TrainingState {
  /// Model parameters: Megatron keys, global shapes, this rank's boxes (see model_sharded_tensors).
  std::vector<ShardedTensor> model;
  /// fp32 optimizer state pieces, keys "optimizer.state.{fp32_param,exp_avg,exp_avg_sq}.<model key>"
  /// (use add_optimizer_state). Saved unless --no-save-optim; loaded unless --no-load-optim/--finetune.
  std::vector<ShardedTensor> optimizer;
  /// Optimizer state that exists only after the first optimizer step (SGD's
  /// "optimizer.state.momentum_buffer.<key>", which torch.optim.SGD creates at step 1): never
  /// saved from here (once it exists, model_and_optimizer_state lists it in `optimizer`); loaded
  /// with the optimizer state when the checkpoint has the key, else left as it is and listed in
  /// LoadResult::missing_optimizer.
  std::vector<ShardedTensor> optimizer_if_present;
  /// Non-tensor optimizer state, e.g. {"step": 100, "param_groups": [...], "grad_scaler": {...}}.
  nlohmann::json optimizer_common = nlohmann::json::object();
  /// OptimizerParamScheduler state (Megatron keys: max_lr, lr_warmup_steps, num_steps, ...).
  nlohmann::json opt_param_scheduler = nlohmann::json::object();
  /// This rank's RNG state (any JSON). Stored per (pp, tp) position, written by dp rank 0.
  nlohmann::json rng_state = nlohmann::json::object();
  int64_t iteration = 0;
  int64_t consumed_train_samples = 0;
  int64_t consumed_valid_samples = 0;
  double num_floating_point_operations_so_far = 0.0;
  /// All arguments (argparse dest → typed value, checkpoint_args.h checkpoint_args()); stored as
  /// common "args".
  nlohmann::json args = nlohmann::json::object();
  /// Further named state (e.g. FP8 amax history / scales), saved always and loaded unless
  /// --finetune; a key the checkpoint does not have is left as it is (listed in
  /// LoadResult::missing_extra), so older checkpoints stay loadable. Build pieces with
  /// ShardedTensor::from_tensor / from_rank_offsets; give replicas replica_id != 0.
  std::vector<ShardedTensor> extra;
  /// Non-tensor extra state, stored as common "extra" (loaded into LoadResult::extra_common).
  nlohmann::json extra_common = nlohmann::json::object();
};

/// Result of load_checkpoint.
struct LoadResult {
  bool loaded = false;             // false: no checkpoint found (start from scratch)
  int64_t iteration = 0;           // iteration to continue from (0 with --finetune)
  int64_t consumed_train_samples = 0;
  int64_t consumed_valid_samples = 0;
  double num_floating_point_operations_so_far = 0.0;
  bool optimizer_loaded = false;   // optimizer tensors + optimizer_common + scheduler were loaded
  bool rng_loaded = false;         // rng_state was loaded
  nlohmann::json optimizer_common;
  nlohmann::json opt_param_scheduler;
  nlohmann::json rng_state;
  nlohmann::json args;             // the checkpoint's arguments
  std::string checkpoint_dir;      // the iter_XXXXXXX directory read
  std::vector<std::string> missing_extra;  // TrainingState::extra keys the checkpoint lacked
  std::vector<std::string> missing_optimizer;  // TrainingState::optimizer_if_present keys it lacked
  nlohmann::json extra_common;     // the checkpoint's "extra" common state (null if none)
};

/// "<save>/iter_0000100" (Megatron's get_checkpoint_name for the dist format), or
/// "<save>/release" for release checkpoints.
std::string checkpoint_dir_name(const std::string& root, int64_t iteration, bool release = false);
/// "<root>/latest_checkpointed_iteration.txt".
std::string tracker_filename(const std::string& root);
/// Reads the tracker: {iteration, release}. nullopt when the file does not exist. Throws UserError
/// naming the file when its content is neither an integer nor "release".
std::optional<std::pair<int64_t, bool>> read_tracker(const std::string& root);

/// Stacked-layer key mapping (docs/megatron-reference.md#distributed-checkpoint): "decoder.layers.3.self_attention.linear_qkv.weight" →
/// ("decoder.layers.self_attention.linear_qkv.weight", 3). Other names → (name, -1).
std::pair<std::string, int64_t> stacked_layer_key(const std::string& param_name);

/// Megatron's checkpoint key of a routed expert's weight (SequentialMLP / TEGroupedMLP
/// sharded_state_dict, interchangeable): "...mlp.experts.local_experts.E.linear_fc1.weight" and
/// "...mlp.experts.linear_fc1.weightE" → "...mlp.experts.experts.linear_fc1.weight". InternalError
/// for another name.
std::string expert_checkpoint_key(const std::string& name);

/// How one model parameter is split across tensor-parallel ranks.
struct ParamSharding {
  int tp_axis = -1;          // axis split over TP (-1: replicated over TP)
  bool swiglu_fc1 = false;   // linear_fc1 of a SwiGLU MLP: local [gate_shard; up_shard] rows
  bool stack_layers = true;  // false: decoder-layer names keep their layer index (no layer axis)
  /// A routed expert's weight (Megatron's SequentialMLP / TEGroupedMLP sharded_state_dict): the
  /// key is its layer's "...mlp.experts.experts.linear_fc{1,2}.weight" (from
  /// "...mlp.experts.local_experts.E.linear_fc1.weight" or the grouped "...linear_fc1.weightE")
  /// with an expert axis of size num_experts (after the layer axis) at expert_index.
  int64_t expert_index = -1, num_experts = 0;
};

/// ShardedTensors of one parameter: `name` with a GLOBAL layer index (decoder.layers.{i}.…),
/// `data` this rank's piece, split as `sh` over ranks.tp_size. Layer parameters become the
/// stacked key with a leading layer axis of size `num_layers` (unless sh.stack_layers is false),
/// a routed expert's weight the expert key and axis of `sh`; TP-replicated tensors get
/// replica_id = tp_rank; everything gets replica ids over DP (dp_rank). SwiGLU fc1 returns two
/// pieces (gate and up rows) so the global tensor is [W_gate; W_up] whatever the TP size.
std::vector<ShardedTensor> model_sharded_tensors(const std::string& name, const Tensor& data, const ParamSharding& sh,
                                                 int64_t num_layers, const ParallelRanks& ranks);

/// The persistent buffers of the chunks' MoE routers as model-state ShardedTensors: Megatron's
/// TopKRouter `expert_bias` (float32 [E], with --moe-router-enable-expert-bias) under the stacked
/// key "decoder.layers.mlp.router.expert_bias" [num_layers, E] (Megatron's module state-dict key
/// for a buffer; "decoder.layers.N.mlp.router.expert_bias" [E] per layer when the model's
/// --moe-layer-freq is a list or > 1, as its parameters), replicated over TP and DP (replica ids as
/// model_sharded_tensors). The views
/// share the routers' storage, so a load fills the routers in place. Megatron's non-persistent
/// buffers (local_tokens_per_expert, the global aux loss counts) are not saved: they are zero
/// after every step's finalize_model_grads (transformer/moe/router.h finalize_router_state).
std::vector<ShardedTensor> router_state_tensors(const std::vector<models::gpt::GPTModel*>& chunks, int64_t num_layers,
                                                const ParallelRanks& ranks);

/// ShardedTensors of a GPTModel parameter (megatron/core/tensor/parameter.h): uses its name,
/// data, partition_dim / partition_stride (2 = SwiGLU fc1) and tp_rank / tp_size. The tied
/// output-layer duplicate on a later pipeline stage (p.shared) yields pieces keyed by its
/// init_key (the word embedding) with a non-zero replica id: never written, but loaded (as
/// Megatron's GPTModel.sharded_state_dict does for the tied output layer).
/// `ranks` gives the TP rank for TP-replicated parameters (replica id = tp_rank) and the DP rank
/// (dp_rank > 0 marks the pieces as replicas).
std::vector<ShardedTensor> parameter_sharded_tensors(const Parameter& p, int64_t num_layers,
                                                     const ParallelRanks& ranks = {});

/// The checkpoint view of a whole model and its optimizer (what pretrain_gpt saves and loads),
/// keyed by global names and per-rank ownership so that any TP/PP/DP layout and either optimizer
/// sharding can read what any other wrote:
///  * model: parameter_sharded_tensors of every parameter (TP shards at their global offsets,
///    global layer index in the stacked layer axis, DP copies as replicas; the tied output-layer
///    copy of a later pipeline stage as a never-written replica of the word embedding, so it is
///    loaded too);
///  * optimizer (with_optimizer): fp32 main params and Adam m/v (or SGD's momentum_buffer:
///    in `optimizer` once opt.step_count() > 0, before that in `optimizer_if_present`) for every
///    optimizer parameter, all with the same sharding.
///    opt.params()[j].param must view a model parameter or a contiguous element range of one
///    (the distributed optimizer's slices, optimizer/distributed_optimizer.h). Without the
///    distributed optimizer the state is a box like the parameter piece (replicated over DP like
///    it); with it (`distributed_optimizer`) each DP rank writes its own flat element ranges of
///    the parameters in global coordinates (Megatron's fully-reshardable layout, docs/megatron-reference.md#distributed-checkpoint), so DP
///    ranks never write the same element and a load with another DP size, TP/PP size or without
///    the distributed optimizer reads the overlapping ranges.
/// Throws InternalError when an optimizer parameter does not lie inside one model parameter.
TrainingState model_and_optimizer_state(const std::vector<Parameter>& params,
                                        const optimizer::MegatronOptimizer& opt, int64_t num_layers,
                                        const ParallelRanks& ranks, bool distributed_optimizer, bool with_optimizer);

/// One optimizer state piece "optimizer.state.<what>.<key>" of `model_piece` (sharding as for
/// add_optimizer_state).
ShardedTensor optimizer_piece(const std::string& what, const ShardedTensor& model_piece, const Tensor& t,
                              std::optional<std::pair<int64_t, int64_t>> flattened_range = std::nullopt,
                              int replica_id = 0);

/// Adds the fp32 optimizer state of model tensor piece `model_piece` (same local shape as its
/// data, or a 1-D flat range when `flattened_range` is given) to st.optimizer, keys
/// "optimizer.state.fp32_param.<key>", "optimizer.state.exp_avg.<key>", "optimizer.state.exp_avg_sq.<key>".
/// Undefined tensors are skipped. replica_id: without a flat range the model piece's (state is
/// replicated like the parameter); with one (distributed optimizer: each DP rank owns a different
/// range) pass the TP-replica id (tp_rank for TP-replicated parameters, else 0).
void add_optimizer_state(TrainingState& st, const ShardedTensor& model_piece, const Tensor& main_param,
                         const Tensor& exp_avg, const Tensor& exp_avg_sq,
                         std::optional<std::pair<int64_t, int64_t>> flattened_range = std::nullopt,
                         int replica_id = 0);

/// Saves `st` to <cfg.save>/iter_{st.iteration:07d} (collective over `world`; nullptr = single
/// rank) and then updates the tracker (rank 0, atomically). Prints Megatron's lines on rank 0:
///   "[<time>] saving checkpoint at iteration {it:7d} to {save} in {format} format"
///   "  [<time>] successfully saved checkpoint from iteration {it:7d} to {save} [ t a/b, gtp_remat 1/1, p c/d ]"
/// With cfg.async_save the data is snapshotted and written in the background; the tracker and
/// the second line come from maybe_finalize_async_save(). A pending async save is finalized
/// (blocking) before a new one starts. Throws UserError when cfg.save is empty or on I/O errors.
void save_checkpoint(const TrainingState& st, const CheckpointConfig& cfg, const ParallelRanks& ranks,
                     comm::ProcessGroup* world = nullptr);

/// Finalizes a pending async save when every rank's write is done (blocking: waits for it).
/// Returns true if nothing is pending afterwards. Collective when a save is pending.
bool maybe_finalize_async_save(comm::ProcessGroup* world = nullptr, bool blocking = false);

/// Loads from cfg.load (tracker → iter dir, or cfg.ckpt_step) into the tensors of `st` (in place)
/// following --no-load-optim/--no-load-rng/--finetune. With no tracker file it prints Megatron's
/// warning and returns loaded=false (UserError with --exit-on-missing-checkpoint). RNG state is
/// skipped with a message when (TP, PP) differ from the checkpoint's. Prints
/// " loading distributed checkpoint from {load} at iteration {it}" and
/// "  successfully loaded checkpoint from {load} [ t a/b, p c/d ] at iteration {it}" on rank 0.
LoadResult load_checkpoint(TrainingState& st, const CheckpointConfig& cfg, const ParallelRanks& ranks,
                           comm::ProcessGroup* world = nullptr);

/// The common (non-tensor) state of checkpoint directory `dir` ("args", "iteration",
/// "checkpoint_version", "opt_param_scheduler", "optimizer", ...): common.json of our layout, or a
/// Megatron-LM torch_dist checkpoint's common state (torch_dist_checkpoint.h
/// common_from_torch_dist; "args" is then its argparse.Namespace, {} when it has none). Throws
/// UserError naming the file when it is missing or malformed.
nlohmann::json load_checkpoint_common(const std::string& dir);

/// Megatron's load_args_from_checkpoint (megatron/training/checkpointing.py), run for
/// --use-checkpoint-args between parse_args and validate_args: the "args" of the checkpoint
/// --load would read (--ckpt-step, else the tracker's iteration) replace the model arguments of
/// `args`, which was parsed from `argv` (the command line without the program name); returns the
/// arguments re-parsed with them (parse_args_with_overrides, so every flag's checks apply and the
/// arguments block shows them). Megatron's rules, in its order: always taken from the checkpoint
/// (when it holds a value other than None): num_query_groups, group_query_attention,
/// position_embedding_type, rotary_base/percent/interleaved, add_bias_linear, add_qkv_bias,
/// squared_relu, swiglu, untie_embeddings_and_output_weights, normalization,
/// apply_query_key_layer_scaling, attention_dropout, hidden_dropout, mtp_num_layers, the MoE
/// choices (num_experts, moe_layer_freq, moe_ffn_hidden_size -- None without experts --,
/// moe_router_topk, ...), tokenizer_type and tokenizer_model (unless
/// --no-use-tokenizer-model-from-checkpoint-args), tiktoken_pattern; taken only when this run's
/// value is None: num_layers, hidden_size, ffn_hidden_size, seq_length, num_attention_heads,
/// kv_channels, max_position_embeddings, padded_vocab_size (then kept by set_padded_vocab_size),
/// moe_token_dispatcher_type and ckpt_format (never None, so never taken). With
/// --use-mp-args-from-checkpoint-args also the tensor / pipeline / expert parallel sizes
/// (always) and num_layers_per_virtual_pipeline_stage (when None). Megatron looks
/// apply_layernorm_1p up under that name, which its parser no longer stores (the dest is
/// layernorm_zero_centered_gamma), so --apply-layernorm-1p is never taken either.
/// `log` gets Megatron's lines, for rank 0 to print: "Setting <name> to <value> from checkpoint",
/// "Checkpoint did not provide arguments <name>", and, returning `args` unchanged, "Checkpoint not
/// found to provide arguments, using provided arguments." (no tracker) or "Checkpoint provided does
/// not have arguments saved, using provided arguments." (no or empty "args").
/// Throws UserError (one line): without --load; with --exit-on-missing-checkpoint and no
/// checkpoint; a checkpoint value our flag refuses or a non-default value of an argument
/// megatron.cpp does not implement (naming it, e.g. hybrid_layer_pattern); an unreadable checkpoint.
Arguments load_args_from_checkpoint(const std::vector<std::string>& argv, const Arguments& args,
                                    std::vector<std::string>& log);

// ---- The training state of a run: what save writes and load restores (one pair) ----

struct TrainCounters;

/// The live objects whose state a checkpoint holds (Megatron's model, optimizer,
/// opt_param_scheduler triple) and the layout facts the state needs.
struct TrainingObjects {
  std::vector<models::gpt::GPTModel*> model;  ///< this rank's model chunks (virtual stages: all), chunk order
  optimizer::MegatronOptimizer* optimizer = nullptr;
  OptimizerParamScheduler* opt_param_scheduler = nullptr;
  int64_t num_layers = 0;              ///< --num-layers (the stacked layer axis of the keys)
  bool distributed_optimizer = false;  ///< --use-distributed-optimizer (optimizer state layout)
  int64_t seed = 0;                    ///< --seed (stored in rng_state)
};

/// Megatron's generate_state_dict (megatron/training/checkpointing.py): this rank's TrainingState
///  * model / optimizer: model_and_optimizer_state of every chunk's parameters (views; the
///    optimizer state only `with_optimizer`);
///  * extra: the FP8 amax histories and scales of every chunk (docs/fp8.md), written by TP rank 0
///    of DP rank 0 only (they are equal on the whole amax group);
///  * optimizer_common: {"step", "grad_scaler": {scale, growth_tracker, hysteresis_tracker}}
///    (the grad scaler with fp16's dynamic loss scaling only);
///  * opt_param_scheduler: OptimizerParamScheduler::state_dict();
///  * rng_state: {"seed", "dropout_rng_offset" (first chunk), "dropout_rng_offsets" (per chunk)};
///  * iteration and the sample / FLOP counters from `counters`, `args` as given.
/// load_checkpoint reads into the tensors of the same state; load_state_dict then restores the rest.
TrainingState generate_state_dict(const TrainingObjects& objects, const TrainCounters& counters,
                                  const nlohmann::json& args, const ParallelRanks& ranks, bool with_optimizer);

/// The inverse of generate_state_dict after load_checkpoint(st, ...) filled st's tensors and
/// returned `loaded` (nothing happens when loaded.loaded is false):
///  * FP8 state: the checkpoint's amax histories / scales replace the fresh ones (not with
///    `finetune`; keys the checkpoint lacks stay, so a bf16 checkpoint loads into an FP8 run);
///  * when the optimizer state was loaded and `restore_optimizer`: step count, grad scaler, and
///    OptimizerParamScheduler::load_state_dict (its messages go to `log`), whose max/min lr also
///    replace those of the param groups that follow --lr/--min-lr (not --decoupled-lr);
///  * when it was not loaded: Megatron's reload_model_params (fp32 main params from the weights);
///  * when the RNG state was loaded: every chunk's dropout stream position;
///  * counters: iteration and the sample / FLOP counters.
/// Throws UserError from the scheduler's consistency check (see load_state_dict there).
void load_state_dict(const TrainingObjects& objects, TrainCounters& counters, const TrainingState& st,
                     const LoadResult& loaded, bool finetune, bool restore_optimizer,
                     const std::function<void(const std::string&)>& log);

}  // namespace megatron::training
