// Every conversion of the parsed flags (Arguments) into the configuration objects the library
// reads, in one place (Megatron: core_transformer_config_from_args in megatron/training/arguments.py,
// get_optimizer_param_scheduler in training.py, core_gpt_dataset_config_from_args in
// pretrain_gpt.py, the DDP/optimizer configs built in setup_model_and_optimizer). Nothing below
// megatron/training/ reads Arguments: the model, DDP, optimizer, schedule, checkpointing and data
// code each read their own config.
// All functions need validated args (validate_args) unless noted.
#pragma once

#include <memory>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/datasets/gpt_dataset.h"
#include "megatron/core/distributed/distributed_data_parallel.h"
#include "megatron/core/fp8/fp8_config.h"
#include "megatron/core/optimizer/optimizer.h"
#include "megatron/core/optimizer_param_scheduler.h"
#include "megatron/core/parallel_state.h"
#include "megatron/core/tokenizers/megatron_tokenizer.h"
#include "megatron/core/transformer/transformer_config.h"
#include "megatron/training/arguments.h"
#include "megatron/training/checkpointing.h"

namespace megatron::training {

/// Megatron's core_transformer_config_from_args (megatron/training/arguments.py) for the fields
/// GPTModel has: sizes, dropout, init, norm, bias/GLU/activation-fusion choices, positions, tying,
/// params dtype (--bf16/--fp16), main-grad dtype (bf16 with --bf16 --grad-reduce-in-bf16), TP/PP/SP,
/// recomputation, FP8 (fp8_config_from_args).
transformer::TransformerConfig core_transformer_config_from_args(const Arguments& args);

/// The FP8 recipe of --fp8-format / --fp8-recipe / --fp8-margin / --fp8-amax-history-len /
/// --fp8-amax-compute-algo / --fp8-wgrad / --fp8-param-gather; nullopt without --fp8-format.
std::optional<fp8::Fp8Config> fp8_config_from_args(const Arguments& args);

/// The parallel layout for initialize_model_parallel (--tensor/pipeline/context-parallel sizes and
/// the virtual pipeline size).
parallel_state::ParallelConfig parallel_config_from_args(const Arguments& args);

/// Megatron's DistributedDataParallelConfig as setup_model_and_optimizer builds it from
/// --overlap-grad-reduce, --overlap-param-gather, --use-distributed-optimizer, --ddp-bucket-size,
/// --calculate-per-token-loss; tied embeddings over several pipeline stages get their own bucket.
distributed::DistributedDataParallelConfig ddp_config_from_args(const Arguments& args);

/// OptimizerConfig from args (--optimizer, --lr, --decoupled-lr, --clip-grad, --adam-*, loss scale,
/// --fp16/--bf16, ...). Needs --lr.
optimizer::OptimizerConfig optimizer_config_from_args(const Arguments& args);

/// Builds the OptimizerParamScheduler options from args exactly as Megatron's
/// get_optimizer_param_scheduler: iteration-based runs count iters x global batch size,
/// sample-based runs samples; --override-opt_param-scheduler / --use-checkpoint-opt_param-scheduler
/// are carried for load_state_dict. Throws UserError when neither --train-iters nor
/// --train-samples is given.
OptimizerParamScheduler::Options scheduler_options_from_args(const Arguments& args);

/// Evaluation only (--skip-train): an optimizer over no parameters (the loop's interface needs
/// one; it holds nothing) with --bf16/--fp16 and --lr (0 when absent), and a constant schedule
/// (--lr/--train-iters are not required with --skip-train).
optimizer::OptimizerConfig eval_only_optimizer_config(const Arguments& args);
OptimizerParamScheduler::Options eval_only_scheduler_options();

/// Checkpoint flags (--save, --load, --no-save-optim, --no-load-optim, --no-load-rng, --finetune,
/// --async-save, --exit-on-missing-checkpoint, --ckpt-step, --ckpt-format). write_torch_dist:
/// --ckpt-format torch_dist given on the command line (`ckpt_format_given`). expected_args is left
/// null (the caller sets the run's checkpoint_args).
CheckpointConfig checkpoint_config_from_args(const Arguments& args, bool ckpt_format_given);

/// Megatron's core_gpt_dataset_config_from_args (pretrain_gpt.py): --seed, --seq-length, the blend
/// (--data-path or --train/valid/test-data-path), --split, --data-cache-path, --mmap-bin-files,
/// --mid-level-dataset-surplus, --reset-position-ids, --reset-attention-mask, --eod-mask-loss,
/// --create-attention-mask-in-dataloader; with several ranks the index caches are built on
/// global rank 0 while the others wait at `world`'s barrier. Finalized (UserError on a bad blend).
std::shared_ptr<datasets::GPTDatasetConfig> core_gpt_dataset_config_from_args(
    const Arguments& args, std::shared_ptr<tokenizers::MegatronTokenizer> tokenizer,
    std::shared_ptr<comm::ProcessGroup> world);

}  // namespace megatron::training
