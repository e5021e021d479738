// Megatron-LM's command line (megatron/training/arguments.py) for pretrain_gpt.
//
// Arguments is Megatron's `args` namespace as a plain struct: every field is named after the
// flag's argparse `dest` (--hidden-size -> hidden_size, --norm-epsilon -> layernorm_epsilon,
// --disable-bias-linear -> add_bias_linear), with Megatron's default. std::nullopt is Python's
// None. parse_args() fills it from argv (CLI11), validate_args() applies Megatron's derived
// defaults and consistency checks. See docs/training.md for the list of flags and for those
// that are accepted with a note.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "megatron/core/tokenizers/megatron_tokenizer.h"
#include "megatron/core/transformer/transformer_config.h"

namespace megatron::training {

struct Arguments {
  // ---- network size (arguments.py _add_network_size_args / TransformerConfig) ----
  std::optional<int64_t> num_layers;
  std::optional<int64_t> hidden_size;
  std::optional<int64_t> ffn_hidden_size;           // None -> 4h (swiglu: int(8h/3/64)*64)
  std::optional<int64_t> num_attention_heads;
  std::optional<int64_t> kv_channels;               // None -> h / heads
  bool group_query_attention = false;
  int64_t num_query_groups = 1;
  std::optional<int64_t> max_position_embeddings;
  std::string position_embedding_type = "learned_absolute";  // learned_absolute|rope|none|...
  int64_t rotary_base = 10000;
  double rotary_percent = 1.0;
  bool rotary_interleaved = false;
  std::optional<int64_t> rotary_seq_len_interpolation_factor;  // Megatron: type=int
  bool use_rope_scaling = false;
  double rope_scaling_factor = 8.0;
  int64_t make_vocab_size_divisible_by = 128;
  std::string normalization = "LayerNorm";  // LayerNorm | RMSNorm
  double layernorm_epsilon = 1e-5;          // --norm-epsilon
  bool layernorm_zero_centered_gamma = false;  // --apply-layernorm-1p
  bool apply_residual_connection_post_layernorm = false;
  bool openai_gelu = false;
  bool squared_relu = false;
  /// --mtp-num-layers (None = no multi-token prediction) and --mtp-loss-scaling-factor.
  std::optional<int64_t> mtp_num_layers;
  double mtp_loss_scaling_factor = 0.1;
  bool swiglu = false;
  bool untie_embeddings_and_output_weights = false;
  bool add_bias_linear = true;   // --disable-bias-linear
  bool add_qkv_bias = false;
  bool qk_layernorm = false;
  double init_method_std = 0.02;
  double hidden_dropout = 0.1;
  double attention_dropout = 0.1;
  bool attention_softmax_in_fp32 = false;
  bool apply_query_key_layer_scaling = false;
  bool fp32_residual_connection = false;
  bool bias_gelu_fusion = true;    // --no-bias-gelu-fusion: exact erf GeLU instead of the tanh form
  bool bias_swiglu_fusion = true;  // --no-bias-swiglu-fusion (same math for SwiGLU)
  std::string attention_backend = "auto";           // flash|fused|unfused|local|auto
  std::string transformer_impl = "transformer_engine";  // local|transformer_engine

  // ---- training ----
  std::optional<int64_t> micro_batch_size;
  std::optional<int64_t> global_batch_size;  // None -> mbs * DP
  std::optional<int64_t> train_iters;
  std::optional<int64_t> train_samples;
  std::optional<int64_t> exit_interval;
  std::optional<int64_t> exit_duration_in_mins;
  bool exit_signal_handler = false;
  int64_t seed = 1234;
  bool calculate_per_token_loss = false;
  int64_t empty_unused_memory_level = 0;
  bool skip_train = false;
  std::optional<std::string> recompute_granularity;  // full | selective
  std::optional<std::string> recompute_method;       // uniform | block
  std::optional<int64_t> recompute_num_layers;
  bool recompute_activations = false;  // --recompute-activations: validate_args -> granularity selective
  std::vector<std::string> recompute_modules;  // --recompute-modules (empty: Megatron's None = core_attn)
  bool moe_layer_recompute = false;            // deprecated: selective + recompute_modules moe
  bool check_for_nan_in_loss_and_grad = true;
  bool deterministic_mode = false;

  // ---- optimizer / learning rate (docs/megatron-reference.md#optimizer-defaults) ----
  std::string optimizer = "adam";  // adam | sgd
  std::optional<double> lr;
  double min_lr = 0.0;
  std::string lr_decay_style = "linear";  // constant|linear|cosine|inverse-square-root|WSD
  std::string lr_wsd_decay_style = "exponential";  // exponential|linear|cosine|minus_sqrt
  std::optional<int64_t> lr_decay_iters;
  std::optional<int64_t> lr_decay_samples;
  std::optional<int64_t> lr_wsd_decay_iters;
  std::optional<int64_t> lr_wsd_decay_samples;
  std::optional<double> lr_warmup_fraction;
  int64_t lr_warmup_iters = 0;
  int64_t lr_warmup_samples = 0;
  double lr_warmup_init = 0.0;
  std::optional<double> decoupled_lr;
  std::optional<double> decoupled_min_lr;
  bool override_opt_param_scheduler = false;
  bool use_checkpoint_opt_param_scheduler = false;
  double weight_decay = 0.01;
  std::optional<double> start_weight_decay;
  std::optional<double> end_weight_decay;
  std::string weight_decay_incr_style = "constant";  // constant|linear|cosine
  double clip_grad = 1.0;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  double sgd_momentum = 0.9;
  bool decoupled_weight_decay = true;  // --no-decoupled-weight-decay

  // ---- mixed precision (docs/megatron-reference.md#loss-scaling) ----
  bool fp16 = false;
  bool bf16 = false;
  std::optional<double> loss_scale;  // constant scale; None -> dynamic (fp16)
  double initial_loss_scale = 4294967296.0;
  double min_loss_scale = 1.0;
  double loss_scale_window = 1000;  // a float in Megatron; validated: a whole number of iterations
  int64_t hysteresis = 2;
  bool grad_reduce_in_bf16 = false;
  bool accumulate_allreduce_grads_in_fp32 = false;
  bool fp16_lm_cross_entropy = false;

  // ---- FP8 (docs/megatron-reference.md#fp8-delayed-scaling; stored for the FP8 code) ----
  std::optional<std::string> fp8;  // --fp8-format: e4m3 | hybrid
  std::string fp8_recipe = "delayed";
  int64_t fp8_margin = 0;
  int64_t fp8_interval = 1;
  int64_t fp8_amax_history_len = 1;
  std::string fp8_amax_compute_algo = "most_recent";
  bool fp8_wgrad = true;
  bool fp8_param_gather = false;
  bool fp8_output_proj = false;  // --fp8-output-proj (docs/fp8.md "FP8 output layer")

  // ---- Mixture of Experts (Megatron's MoE flags; docs/moe.md) ----
  std::optional<int64_t> num_experts;                 // --num-experts (0 -> None)
  std::optional<int64_t> moe_ffn_hidden_size;         // None -> ffn_hidden_size
  std::string moe_layer_freq = "1";                   // int or list expression (moe_config.h)
  std::vector<int> moe_layer_pattern;                 // derived from moe_layer_freq
  std::optional<int64_t> moe_shared_expert_intermediate_size;
  bool moe_shared_expert_overlap = false;
  bool moe_shared_expert_gate = false;  // --moe-shared-expert-gate
  std::vector<std::string> moe_router_load_balancing_type = {"aux_loss"};
  std::vector<double> moe_aux_loss_coeff = {0.0};
  std::optional<double> moe_z_loss_coeff;
  std::string moe_router_score_function = "softmax";
  bool moe_router_pre_softmax = false;
  int64_t moe_router_topk = 2;
  std::optional<double> moe_router_topk_scaling_factor;
  bool moe_router_enable_expert_bias = false;
  double moe_router_bias_update_rate = 1e-3;
  std::optional<int64_t> moe_router_num_groups;
  std::optional<int64_t> moe_router_group_topk;
  std::optional<std::string> moe_router_dtype;        // fp32 | fp64
  std::string moe_token_dispatcher_type = "allgather";
  std::optional<double> moe_expert_capacity_factor;
  bool moe_pad_expert_input_to_capacity = false;
  std::string moe_token_drop_policy = "probs";
  bool moe_grouped_gemm = false;
  bool moe_permute_fusion = false;
  bool moe_router_fusion = false;
  bool moe_per_layer_logging = false;
  std::optional<double> moe_input_jitter_eps;
  std::optional<int64_t> expert_tensor_parallel_size;  // None -> tensor_model_parallel_size

  // ---- parallelism (stored for the distributed code) ----
  int64_t tensor_model_parallel_size = 1;
  int64_t pipeline_model_parallel_size = 1;
  int64_t context_parallel_size = 1;
  std::vector<std::string> cp_comm_type = {"p2p"};  // one value, or one per layer
  int64_t expert_model_parallel_size = 1;
  std::optional<int64_t> num_layers_per_virtual_pipeline_stage;
  std::optional<int64_t> decoder_first_pipeline_num_layers;  // uneven pipeline split (first stage)
  std::optional<int64_t> decoder_last_pipeline_num_layers;   // uneven pipeline split (last stage)
  std::optional<int64_t> num_virtual_stages_per_pipeline_rank;
  std::optional<int64_t> virtual_pipeline_model_parallel_size;  // derived
  /// --microbatch-group-size-per-virtual-pipeline-stage: micro-batches run back to back through a
  /// virtual stage in the interleaved schedule (Megatron's microbatch_group_size_per_vp_stage);
  /// unset = PP.
  std::optional<int64_t> microbatch_group_size_per_vp_stage;
  bool sequence_parallel = false;
  bool use_distributed_optimizer = false;
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;
  std::optional<int64_t> ddp_bucket_size;
  std::string distributed_backend = "nccl";
  int64_t distributed_timeout_minutes = 10;
  int64_t world_size = 1;          // from the launcher environment, not a flag
  int64_t rank = 0;                // global rank
  int64_t data_parallel_size = 1;  // derived

  // ---- data and tokenizer ----
  std::vector<std::string> data_path;
  std::optional<std::string> split;
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;
  std::optional<std::string> data_cache_path;
  bool mock_data = false;
  bool mmap_bin_files = true;
  int64_t num_workers = 2;
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  bool eod_mask_loss = false;
  bool create_attention_mask_in_dataloader = true;
  int64_t num_dataset_builder_threads = 1;
  double mid_level_dataset_surplus = 0.005;
  std::optional<std::string> dataloader_type;  // None -> single
  std::optional<int64_t> seq_length;
  tokenizers::TokenizerConfig tokenizer;  // --tokenizer-type, --vocab-size, ...

  // ---- evaluation ----
  int64_t eval_iters = 100;
  std::optional<int64_t> eval_interval;

  // ---- logging ----
  int64_t log_interval = 100;
  bool log_params_norm = false;
  bool log_num_zeros_in_grad = false;
  bool log_throughput = false;
  bool log_progress = false;
  int64_t timing_log_level = 0;
  std::string timing_log_option = "minmax";
  bool barrier_with_L1_time = true;
  std::optional<std::string> tensorboard_dir;
  int64_t tensorboard_log_interval = 1;
  int64_t tensorboard_queue_size = 1000;
  bool log_timers_to_tensorboard = false;
  bool log_loss_scale_to_tensorboard = true;
  bool log_learning_rate_to_tensorboard = true;
  bool log_validation_ppl_to_tensorboard = false;
  bool log_memory_to_tensorboard = false;
  bool log_world_size_to_tensorboard = false;
  bool log_batch_size_to_tensorboard = true;

  // ---- checkpointing (passed to megatron/training/checkpointing) ----
  std::optional<std::string> save;
  std::optional<std::string> load;
  std::optional<int64_t> save_interval;
  bool no_save_optim = false;
  bool no_save_rng = false;
  bool no_load_optim = false;
  bool no_load_rng = false;
  bool finetune = false;
  std::string ckpt_format = "torch_dist";
  std::optional<int64_t> ckpt_step;
  bool exit_on_missing_checkpoint = false;
  bool async_save = false;
  /// --use-checkpoint-args / --use-mp-args-from-checkpoint-args /
  /// --no-use-tokenizer-model-from-checkpoint-args: read by load_args_from_checkpoint
  /// (checkpointing.h) before validate_args.
  bool use_checkpoint_args = false;
  bool use_mp_args_from_checkpoint_args = false;
  bool use_tokenizer_model_from_checkpoint_args = true;

  // ---- profiling ----
  bool profile = false;
  int64_t profile_step_start = 10;
  int64_t profile_step_end = 12;
  std::vector<int64_t> profile_ranks = {0};
  bool use_pytorch_profiler = false;

  // ---- derived by validate_args ----
  int64_t padded_vocab_size = 0;  // docs/megatron-reference.md#vocab-padding, set by set_padded_vocab_size()
  /// Flags given on the command line that are accepted with a note (flag -> note), in order.
  std::vector<std::pair<std::string, std::string>> notes;
  /// Warnings validate_args raises as Megatron's does (warn_rank_0), without the "UserWarning: "
  /// prefix; pretrain_gpt prints them on stderr on rank 0.
  std::vector<std::string> warnings;
  /// Lines validate_args prints as Megatron's does (print on rank 0, stdout), e.g. its
  /// "WARNING: Setting args.overlap_p2p_comm ..." line.
  std::vector<std::string> messages;
  /// All flags given on the command line (as typed, e.g. "--bf16").
  std::vector<std::string> given_flags;
  /// Values of the accepted-with-a-note flags that were given (flag -> its values; empty for a
  /// switch), for the arguments block.
  std::map<std::string, std::vector<std::string>> noted_values;
};

/// What a registered flag does (docs/training.md, "Every flag has a disposition"). Every path that
/// registers a flag records one; flag_registry_test checks each against the code.
enum class FlagDisposition {
  kImplemented,  // stored in Arguments members that code outside the parser reads (FlagInfo::reads)
  kNoted,        // accepted with a one-line note printed when given (FlagInfo::note)
  kRefused,      // refused with a one-line error naming the flag
  kDefaultOnly,  // Megatron's default value is what the code does; any other value is refused by
                 // validate_args naming the flag (FlagInfo::note holds such a value)
};

/// One flag pretrain_gpt's parser registers.
struct FlagInfo {
  std::string flag;                  // the primary spelling, "--save-interval"
  std::vector<std::string> aliases;  // Megatron's other spellings of it ("--persistent-save-interval")
  std::string dest;                  // Megatron's argparse dest
  FlagDisposition disposition = FlagDisposition::kImplemented;
  std::vector<std::string> reads;    // kImplemented: Arguments (or TokenizerConfig) members read by code
  std::string note;                  // kNoted
  int arity = 0;                     // values it takes: 0 switch, 1, -1 a list
};

/// Every option pretrain_gpt's parser holds, in declaration order. An option registered without
/// a disposition (added to the CLI11 app around the Binder) is listed with flag set and
/// `dest` == "" -- flag_registry_test fails on it.
std::vector<FlagInfo> flag_registry();

/// One flag of Megatron-LM's own pretrain_gpt parser (megatron_flag_names.inc, generated from
/// Megatron's argparse actions by tests/reference/training/gen_megatron_flags.py).
struct MegatronFlagInfo {
  std::string name, dest, default_str;
  int arity = 0;  // 0 switch, n values, -1 one or more
  char kind = 's';  // T store_true, F store_false, B BooleanOptional, i int, f float, e enum, s other
};
/// Every flag of Megatron's parser, in the table's order.
std::vector<MegatronFlagInfo> megatron_flag_table();

/// Parses argv (argv[0] is the program name) into Arguments with Megatron's defaults.
/// Throws UserError (one line) for: a flag Megatron does not have (naming the closest
/// Megatron flag), a Megatron flag megatron.cpp does not implement, a bad value or choice.
/// Does not run validate_args.
Arguments parse_args(int argc, const char* const* argv);
/// Same, from a list of arguments without the program name.
Arguments parse_args(const std::vector<std::string>& args);

/// Whether pretrain_gpt's parser declares a flag whose argparse dest is `dest`.
bool declares_dest(const std::string& dest);

/// `args` parsed as argparse would parse them if every flag whose dest is a key of `overrides`
/// were left out and each override given instead (Megatron's setattr(args, dest, value) in
/// load_args_from_checkpoint, done through our flags so that their checks and derived fields
/// apply). An override's values are Python's str() of the value: "True"/"False" for a switch
/// (given as the flag that stores it; nothing when no flag does: the default), one value for a
/// one-value flag (several are joined as Python prints a list, "[1, 0]"), the elements for a
/// list flag; no values: None (the flag is left out, so the dest keeps its default).
/// Throws UserError for a value the flag refuses (the flag's own message) or a switch given
/// anything but True/False, and InternalError for a dest no flag declares (check declares_dest
/// first).
Arguments parse_args_with_overrides(const std::vector<std::string>& args,
                                    const std::vector<std::pair<std::string, std::vector<std::string>>>& overrides);

/// Megatron's validate_args subset for pretrain_gpt (arguments.py): derives data_parallel_size
/// from world_size, global_batch_size, ffn_hidden_size, kv_channels, start/end weight decay,
/// dataloader_type, and checks the combinations (one UserError line each, naming the flags).
void validate_args(Arguments& args);

/// Megatron's vocab padding (docs/megatron-reference.md#vocab-padding): sets args.padded_vocab_size from the tokenizer's vocab size
/// and returns Megatron's log line " > padded vocab (size: V) with K dummy tokens (new size: Vp)".
/// When args.padded_vocab_size is already set (by load_args_from_checkpoint) it is kept and ""
/// returned (Megatron's _set_padded_vocab_size: only if None); UserError when it is below
/// `vocab_size` or not divisible by --tensor-model-parallel-size.
std::string set_padded_vocab_size(Arguments& args, int64_t vocab_size);

/// The known Megatron flag closest to `flag` by edit distance (for error messages).
std::string closest_flag(const std::string& flag);

/// Number of micro-batches per iteration: global_batch_size / (micro_batch_size * DP).
int64_t num_microbatches(const Arguments& args);

/// Megatron's _print_args("arguments", args) block (megatron/training/arguments.py): one line
/// "  <dest> <dots> <str(value)>" for every argument pretrain_gpt declares (under Megatron's
/// argparse dest, one line per dest) plus the fields validate_args and the tokenizer derive that
/// we have (world_size, rank, data_parallel_size, params_dtype, padded_vocab_size,
/// virtual_pipeline_model_parallel_size, and the sample counters, 0 before training); values as Python's str() prints them (None,
/// True/False, ['a', 'b'], float repr 1e-05). No trailing newline. Call after validate_args.
std::string format_args(const Arguments& args);

/// The (name, value) lines of format_args, in declaration order (before sorting).
std::vector<std::pair<std::string, std::string>> args_items(const Arguments& args);

/// Every flag pretrain_gpt's parser declares, with the argparse dest it is printed under
/// (Megatron's dest from megatron_flag_names.inc; for the few flags Megatron lacks, the name with
/// dashes as underscores and a leading "no_" dropped).
std::vector<std::pair<std::string, std::string>> declared_flag_dests();

/// Every one-value integer flag pretrain_gpt's parser declares (for tests that feed each of them
/// out-of-range values).
std::vector<std::string> declared_int_flags();

/// Every one-value float flag pretrain_gpt's parser declares (for tests that feed each of them
/// nan, inf and out-of-range values).
std::vector<std::string> declared_float_flags();

/// Megatron's _print_args layout for already formatted values: the title lines, then
/// "  name " + '.' * max(0, 48 - len(name)) + " value" per item, the lines sorted by their
/// lower-cased text (Python's sorted(key=str.lower), stable), then the end line.
std::string format_args_block(const std::string& title, const std::vector<std::pair<std::string, std::string>>& items);

/// Python's repr(float) (== str(float)): shortest round-trip digits; positional when the decimal
/// exponent is in [-4, 16), e.g. 0.0001, 1000.0, else d.ddde±XX, e.g. 1e-05, 3e-05, 1e+16;
/// nan, inf, -inf.
std::string py_float_repr(double v);

/// Python's repr(str): single quotes unless the text holds ' and no ", backslash and the quote
/// escaped, \t \n \r and other control bytes as escapes; bytes >= 0x80 copied as they are.
std::string py_str_repr(const std::string& s);


}  // namespace megatron::training
