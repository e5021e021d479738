#include "megatron/training/config_from_args.h"

#include <algorithm>
#include <array>

#include "megatron/core/datasets/utils.h"
#include "megatron/core/transformer/moe/moe_config.h"
#include "megatron/core/utils/env.h"
#include "megatron/core/utils/errors.h"

namespace megatron::training {

std::optional<fp8::Fp8Config> fp8_config_from_args(const Arguments& a) {
  if (!a.fp8) return std::nullopt;
  fp8::Fp8Config f;
  f.format = fp8::parse_fp8_format(*a.fp8);
  f.recipe = fp8::parse_fp8_recipe(a.fp8_recipe);
  f.margin = static_cast<int>(a.fp8_margin);
  f.amax_history_len = static_cast<int>(a.fp8_amax_history_len);
  f.amax_compute_algo = fp8::parse_amax_compute_algo(a.fp8_amax_compute_algo);
  f.wgrad = a.fp8_wgrad;
  f.param_gather = a.fp8_param_gather;
  f.output_proj = a.fp8_output_proj;
  // TE's Float8BlockScaling: power-of-2 scales unless NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1.
  f.block_pow2_scales = !env_switch("NVTE_FP8_BLOCK_SCALING_FP32_SCALES", false);
  return f;
}

transformer::TransformerConfig core_transformer_config_from_args(const Arguments& a) {
  transformer::TransformerConfig c;
  c.num_layers = *a.num_layers;
  c.hidden_size = *a.hidden_size;
  c.ffn_hidden_size = *a.ffn_hidden_size;
  c.num_attention_heads = *a.num_attention_heads;
  c.kv_channels = *a.kv_channels;
  c.num_query_groups = a.num_query_groups;
  c.hidden_dropout = static_cast<float>(a.hidden_dropout);
  c.attention_dropout = static_cast<float>(a.attention_dropout);
  c.init_method_std = static_cast<float>(a.init_method_std);
  c.normalization = transformer::parse_normalization(a.normalization);
  c.layernorm_epsilon = static_cast<float>(a.layernorm_epsilon);
  c.layernorm_zero_centered_gamma = a.layernorm_zero_centered_gamma;
  c.qk_layernorm = a.qk_layernorm;
  c.gated_linear_unit = a.swiglu;
  c.squared_relu = a.squared_relu;
  c.mtp_num_layers = a.mtp_num_layers.value_or(0);
  c.mtp_loss_scaling_factor = static_cast<float>(a.mtp_loss_scaling_factor);
  c.calculate_per_token_loss = a.calculate_per_token_loss;
  c.add_bias_linear = a.add_bias_linear;
  c.add_qkv_bias = a.add_qkv_bias;
  c.bias_activation_fusion = a.swiglu ? a.bias_swiglu_fusion : a.bias_gelu_fusion;
  c.position_embedding_type = transformer::parse_position_embedding_type(a.position_embedding_type);
  c.rotary_base = static_cast<float>(a.rotary_base);
  c.rotary_percent = static_cast<float>(a.rotary_percent);
  c.rotary_interleaved = a.rotary_interleaved;
  c.rope_scaling = a.use_rope_scaling;
  c.rope_scaling_factor = static_cast<float>(a.rope_scaling_factor);
  c.seq_len_interpolation_factor =
      a.rotary_seq_len_interpolation_factor ? static_cast<double>(*a.rotary_seq_len_interpolation_factor) : 0.0;
  c.share_embeddings_and_output_weights = !a.untie_embeddings_and_output_weights;
  c.params_dtype = a.bf16 ? DType::kBFloat16 : a.fp16 ? DType::kFloat16 : DType::kFloat32;
  // --grad-reduce-in-bf16 makes the DDP grad buffer bf16 (Megatron's grad_reduce_in_fp32=False).
  // The DDP grad buffer (Megatron's grad_reduce_in_fp32 = args.accumulate_allreduce_grads_in_fp32):
  // fp32 when that is set -- validate_args sets it for --bf16 unless --grad-reduce-in-bf16 --, else
  // the param dtype: bf16 with --bf16 --grad-reduce-in-bf16, fp16 with --fp16 (Megatron's fp16
  // default: grads accumulated and all-reduced in fp16, copied to fp32 main grads in the optimizer).
  if (!a.fp16 && !a.bf16) c.main_grads_dtype = DType::kFloat32;
  else if (a.accumulate_allreduce_grads_in_fp32) c.main_grads_dtype = DType::kFloat32;
  else c.main_grads_dtype = a.bf16 ? DType::kBFloat16 : DType::kFloat16;
  c.tensor_model_parallel_size = a.tensor_model_parallel_size;
  c.pipeline_model_parallel_size = a.pipeline_model_parallel_size;
  c.sequence_parallel = a.sequence_parallel;
  // Full recomputation: TransformerBlock counts --recompute-num-layers per model chunk (one
  // pipeline stage, or one virtual stage), as Megatron's num_layers_per_pipeline_rank.
  if (a.recompute_granularity == "full") {
    c.recompute_granularity = transformer::RecomputeGranularity::kFull;
    c.recompute_method = *a.recompute_method == "uniform" ? transformer::RecomputeMethod::kUniform
                                                          : transformer::RecomputeMethod::kBlock;
    c.recompute_num_layers = *a.recompute_num_layers;
  } else if (a.recompute_granularity == "selective") {
    c.recompute_granularity = transformer::RecomputeGranularity::kSelective;
    c.recompute_modules = a.recompute_modules;
  }
  // Megatron's TransformerConfig.__post_init__: the deprecated --moe-layer-recompute is selective
  // recomputation of the MoE layer (the arguments keep their values).
  if (a.moe_layer_recompute) {
    c.recompute_granularity = transformer::RecomputeGranularity::kSelective;
    c.recompute_modules = a.recompute_modules;
    if (std::find(c.recompute_modules.begin(), c.recompute_modules.end(), "moe") == c.recompute_modules.end())
      c.recompute_modules.push_back("moe");
  }
  if (a.num_experts) {
    c.num_moe_experts = *a.num_experts;
    c.moe_ffn_hidden_size = a.moe_ffn_hidden_size.value_or(0);
    c.moe_layer_pattern = a.moe_layer_pattern;
    bool is_int = false;
    const std::vector<int64_t> freq = transformer::moe::eval_moe_layer_freq(a.moe_layer_freq, &is_int);
    c.moe_non_homogeneous_layers = !is_int || freq.front() > 1;
    c.moe_shared_expert_intermediate_size = a.moe_shared_expert_intermediate_size.value_or(0);
    c.moe_shared_expert_gate = a.moe_shared_expert_gate;
    c.moe_router_topk = a.moe_router_topk;
    c.moe_router_load_balancing_type = a.moe_router_load_balancing_type;
    c.moe_aux_loss_coeff = a.moe_aux_loss_coeff;
    c.moe_z_loss_coeff = a.moe_z_loss_coeff;
    c.moe_router_score_function = a.moe_router_score_function;
    c.moe_router_pre_softmax = a.moe_router_pre_softmax;
    c.moe_router_topk_scaling_factor = a.moe_router_topk_scaling_factor;
    c.moe_router_enable_expert_bias = a.moe_router_enable_expert_bias;
    c.moe_router_bias_update_rate = a.moe_router_bias_update_rate;
    c.moe_router_num_groups = a.moe_router_num_groups.value_or(0);
    c.moe_router_group_topk = a.moe_router_group_topk.value_or(0);
    c.moe_router_dtype = a.moe_router_dtype.value_or("");
    c.moe_token_dispatcher_type = a.moe_token_dispatcher_type;
    c.moe_expert_capacity_factor = a.moe_expert_capacity_factor;
    c.moe_pad_expert_input_to_capacity = a.moe_pad_expert_input_to_capacity;
    c.moe_token_drop_policy = a.moe_token_drop_policy;
    c.moe_grouped_gemm = a.moe_grouped_gemm;
    c.moe_input_jitter_eps = a.moe_input_jitter_eps;
    c.moe_per_layer_logging = a.moe_per_layer_logging;
    c.expert_model_parallel_size = a.expert_model_parallel_size;
    c.expert_tensor_parallel_size = a.expert_tensor_parallel_size.value_or(a.tensor_model_parallel_size);
  }
  c.fp8 = fp8_config_from_args(a);
  return c;
}

parallel_state::ParallelConfig parallel_config_from_args(const Arguments& a) {
  parallel_state::ParallelConfig pc;
  pc.tensor_model_parallel_size = static_cast<int>(a.tensor_model_parallel_size);
  pc.pipeline_model_parallel_size = static_cast<int>(a.pipeline_model_parallel_size);
  pc.context_parallel_size = static_cast<int>(a.context_parallel_size);
  if (a.virtual_pipeline_model_parallel_size)
    pc.virtual_pipeline_model_parallel_size = static_cast<int>(*a.virtual_pipeline_model_parallel_size);
  pc.expert_model_parallel_size = static_cast<int>(a.expert_model_parallel_size);
  pc.expert_tensor_parallel_size = static_cast<int>(a.expert_tensor_parallel_size.value_or(0));
  return pc;
}

distributed::DistributedDataParallelConfig ddp_config_from_args(const Arguments& a) {
  distributed::DistributedDataParallelConfig dc;
  dc.overlap_grad_reduce = a.overlap_grad_reduce;
  dc.overlap_param_gather = a.overlap_param_gather;
  dc.use_distributed_optimizer = a.use_distributed_optimizer;
  dc.bucket_size = a.ddp_bucket_size;
  dc.calculate_per_token_loss = a.calculate_per_token_loss;
  dc.shared_embedding_own_bucket = a.pipeline_model_parallel_size > 1 &&
                                  (!a.untie_embeddings_and_output_weights || a.mtp_num_layers.value_or(0) > 0);
  return dc;
}

optimizer::OptimizerConfig optimizer_config_from_args(const Arguments& a) {
  optimizer::OptimizerConfig c;
  c.optimizer = a.optimizer;
  c.lr = *a.lr;
  c.min_lr = a.min_lr;
  c.decoupled_lr = a.decoupled_lr;
  c.decoupled_min_lr = a.decoupled_min_lr;
  c.weight_decay = a.weight_decay;
  c.decoupled_weight_decay = a.decoupled_weight_decay;
  c.fp16 = a.fp16;
  c.bf16 = a.bf16;
  c.loss_scale = a.loss_scale;
  c.initial_loss_scale = a.initial_loss_scale;
  c.min_loss_scale = a.min_loss_scale;
  c.loss_scale_window = static_cast<int>(a.loss_scale_window);
  c.hysteresis = static_cast<int>(a.hysteresis);
  c.adam_beta1 = a.adam_beta1;
  c.adam_beta2 = a.adam_beta2;
  c.adam_eps = a.adam_eps;
  c.sgd_momentum = a.sgd_momentum;
  c.use_distributed_optimizer = a.use_distributed_optimizer;
  c.clip_grad = a.clip_grad;
  c.log_num_zeros_in_grad = a.log_num_zeros_in_grad;
  return c;
}

OptimizerParamScheduler::Options scheduler_options_from_args(const Arguments& a) {
  OptimizerParamScheduler::Options o;
  const int64_t gbs = *a.global_batch_size;
  if (a.train_iters) {
    const int64_t decay_iters = a.lr_decay_iters.value_or(*a.train_iters);
    o.lr_decay_steps = decay_iters * gbs;
    o.wd_incr_steps = *a.train_iters * gbs;
    o.wsd_decay_steps = a.lr_wsd_decay_iters ? *a.lr_wsd_decay_iters * gbs : 0;
    o.lr_warmup_steps = a.lr_warmup_fraction ? *a.lr_warmup_fraction * static_cast<double>(o.lr_decay_steps)
                                             : static_cast<double>(a.lr_warmup_iters * gbs);
  } else if (a.train_samples) {
    o.lr_decay_steps = a.lr_decay_samples.value_or(*a.train_samples);
    o.wd_incr_steps = *a.train_samples;
    o.wsd_decay_steps = a.lr_wsd_decay_samples.value_or(0);
    o.lr_warmup_steps = a.lr_warmup_fraction ? *a.lr_warmup_fraction * static_cast<double>(o.lr_decay_steps)
                                             : static_cast<double>(a.lr_warmup_samples);
  } else {
    user_error("one of --train-iters or --train-samples is required");
  }
  o.init_lr = a.lr_warmup_init;
  o.max_lr = *a.lr;
  o.min_lr = a.min_lr;
  o.lr_decay_style = a.lr_decay_style;
  o.start_wd = a.start_weight_decay.value_or(a.weight_decay);
  o.end_wd = a.end_weight_decay.value_or(a.weight_decay);
  o.wd_incr_style = a.weight_decay_incr_style;
  o.lr_wsd_decay_style = a.lr_wsd_decay_style;
  o.override_opt_param_scheduler = a.override_opt_param_scheduler;
  o.use_checkpoint_opt_param_scheduler = a.use_checkpoint_opt_param_scheduler;
  return o;
}

optimizer::OptimizerConfig eval_only_optimizer_config(const Arguments& a) {
  optimizer::OptimizerConfig c;
  c.bf16 = a.bf16;
  c.fp16 = a.fp16;
  c.lr = a.lr.value_or(0.0);
  c.min_lr = std::min(a.min_lr, c.lr);
  return c;
}

OptimizerParamScheduler::Options eval_only_scheduler_options() {
  OptimizerParamScheduler::Options o;
  o.lr_decay_steps = 1;
  o.lr_decay_style = "constant";
  return o;
}

CheckpointConfig checkpoint_config_from_args(const Arguments& a, bool ckpt_format_given) {
  CheckpointConfig c;
  c.save = a.save.value_or("");
  c.load = a.load.value_or("");
  c.no_save_optim = a.no_save_optim;
  c.no_save_rng = a.no_save_rng;
  c.no_load_optim = a.no_load_optim;
  c.no_load_rng = a.no_load_rng;
  c.finetune = a.finetune;
  c.async_save = a.async_save;
  c.exit_on_missing_checkpoint = a.exit_on_missing_checkpoint;
  c.ckpt_step = a.ckpt_step.value_or(-1);
  c.ckpt_format = a.ckpt_format;
  c.write_torch_dist = a.ckpt_format == "torch_dist" && ckpt_format_given;
  return c;
}

std::shared_ptr<datasets::GPTDatasetConfig> core_gpt_dataset_config_from_args(
    const Arguments& args, std::shared_ptr<tokenizers::MegatronTokenizer> tokenizer,
    std::shared_ptr<comm::ProcessGroup> world) {
  auto cfg = std::make_shared<datasets::GPTDatasetConfig>();
  cfg->random_seed = args.seed;
  cfg->sequence_length = *args.seq_length;
  if (!args.data_path.empty()) cfg->blend = datasets::get_blend_from_list(args.data_path, "--data-path");
  if (!args.train_data_path.empty() || !args.valid_data_path.empty() || !args.test_data_path.empty()) {
    std::array<std::optional<datasets::Blend>, 3> per;
    if (!args.train_data_path.empty()) per[0] = datasets::get_blend_from_list(args.train_data_path, "--train-data-path");
    if (!args.valid_data_path.empty()) per[1] = datasets::get_blend_from_list(args.valid_data_path, "--valid-data-path");
    if (!args.test_data_path.empty()) per[2] = datasets::get_blend_from_list(args.test_data_path, "--test-data-path");
    cfg->blend_per_split = per;
  }
  if (!args.mock_data || cfg->blend) cfg->split = args.split;
  cfg->path_to_cache = args.data_cache_path;
  cfg->mmap_bin_files = args.mmap_bin_files;
  cfg->tokenizer = std::move(tokenizer);
  cfg->mid_level_dataset_surplus = args.mid_level_dataset_surplus;
  cfg->reset_position_ids = args.reset_position_ids;
  cfg->reset_attention_mask = args.reset_attention_mask;
  cfg->eod_mask_loss = args.eod_mask_loss;
  cfg->create_attention_mask = args.create_attention_mask_in_dataloader;
  if (world && world->size() > 1) {
    // Megatron builds the index caches on global rank 0 while the other ranks wait, then they read them.
    cfg->distributed.initialized = true;
    cfg->distributed.rank = args.rank;
    cfg->distributed.barrier = [world] { world->barrier(); };
  }
  cfg->finalize();
  return cfg;
}

}  // namespace megatron::training
