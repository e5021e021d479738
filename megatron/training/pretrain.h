// Megatron's pretrain() and its setup steps (megatron/training/training.py: pretrain,
// setup_model_and_optimizer, get_model, build_train_valid_test_data_iterators) for GPTModel. A
// program such as pretrain_gpt.cpp supplies the providers (model_provider,
// train_valid_test_datasets_provider, get_batch) and calls pretrain(); the loop itself (train,
// evaluate, training_log) is the Trainer of training.h.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <vector>

#include "megatron/core/datasets/blended_megatron_dataset_builder.h"
#include "megatron/core/distributed/distributed_data_parallel.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/optimizer/optimizer.h"
#include "megatron/core/optimizer_param_scheduler.h"
#include "megatron/training/checkpointing.h"
#include "megatron/training/datasets/data_samplers.h"
#include "megatron/training/gpt_pipeline.h"
#include "megatron/training/initialize.h"
#include "megatron/training/training.h"

namespace megatron::training {

/// What model_provider builds: one model chunk of this pipeline rank (Megatron's
/// model_provider(pre_process, post_process, vp_stage)).
struct ModelChunkSpec {
  PipelineChunk chunk;              ///< its layers and whether it is the first / last model stage
  int vp_stage = 0;                 ///< virtual pipeline stage (chunk index)
  bool allocate_main_grads = true;  ///< false with --skip-train: no gradient buffer
};
/// Builds one GPTModel chunk on rt.device (the parallel groups come from parallel_state).
using ModelProvider = std::function<std::unique_ptr<models::gpt::GPTModel>(const MegatronRuntime& rt,
                                                                           const ModelChunkSpec& spec)>;
/// Megatron's train_valid_test_datasets_provider(train_val_test_num_samples): the three datasets
/// (nullptr for a split that is not built).
using DatasetsProvider = std::function<std::array<std::shared_ptr<datasets::TopLevelDataset>, 3>(
    const MegatronRuntime& rt, const datasets::SplitSizes& train_val_test_num_samples)>;
/// Megatron's get_batch: a loader's micro-batch as this rank's model reads it (e.g. the context
/// parallel rank's sequence chunks).
using GetBatch = std::function<datasets::GPTBatch(const datasets::GPTBatch& batch)>;

/// Megatron's get_model: the model chunks of this pipeline rank (one, or one per virtual stage;
/// layers split as pipeline_chunks), built by `model_provider` after "building GPT model ...";
/// prints " > number of parameters on (tensor, pipeline) model parallel rank (t, p): n" on
/// data-parallel rank 0 of every model-parallel rank. Collective (a barrier over rt.world).
std::vector<std::unique_ptr<models::gpt::GPTModel>> get_model(const MegatronRuntime& rt,
                                                              const ModelProvider& model_provider);

/// The model, its DDP wrappers, the optimizer and the schedule, after --load.
struct ModelAndOptimizer {
  std::vector<std::unique_ptr<models::gpt::GPTModel>> model;  ///< chunk order
  distributed::DistributedDataParallelConfig ddp_config;
  /// One per chunk (none with --skip-train); with virtual stages only the first is bucketed.
  std::vector<std::unique_ptr<distributed::DistributedDataParallel>> ddp;
  /// Per chunk, the DDP of its expert_parallel_buffers over the expt-dp group (nullptr where the
  /// chunk has none): Megatron's expert_parallel_buffers of the same DistributedDataParallel.
  std::vector<std::unique_ptr<distributed::DistributedDataParallel>> expert_ddp;
  std::unique_ptr<optimizer::MegatronOptimizer> optimizer;
  std::unique_ptr<OptimizerParamScheduler> opt_param_scheduler;
  CheckpointConfig checkpoint;  ///< expected_args = this run's checkpoint args (checkpoint_args.h)
  ParallelRanks ranks;          ///< checkpoint_ranks()
  TrainCounters counters;       ///< restored by --load (iteration, consumed samples, FLOPs); else 0
  int64_t seed = 0;             ///< --seed (the checkpoint's rng_state)

  /// Every DDP in reduction order: per chunk the dense one, then its expert-parallel one (as
  /// Megatron's bucket_groups + expert_parallel_bucket_groups).
  std::vector<distributed::DistributedDataParallel*> ddp_ptrs() const;
  /// The DDPs of chunk c (dense, then expert-parallel if any).
  std::vector<distributed::DistributedDataParallel*> chunk_ddps(size_t c) const;
  /// The objects generate_state_dict / load_state_dict read and restore.
  TrainingObjects training_objects() const;
};

/// Megatron's setup_model_and_optimizer: get_model; DistributedDataParallel over the dp-cp group
/// for every chunk (ddp_config_from_args), and over the expt-dp group for a chunk's expert-parallel
/// buffers; the optimizer (optimizer_config_from_args; with the distributed optimizer over the DP /
/// expert-DP slices, grad norm over the world, else over the model-parallel group and, for the
/// expert-parallel params, the tp-ep-pp group: ChainedOptimizer, docs/moe.md) and
/// OptimizerParamScheduler (scheduler_options_from_args); then --load
/// (load_checkpoint + load_state_dict) and, with --fp8-param-gather, the first FP8 cast and
/// parameter all-gather. --skip-train: the parameters only (no grad buffer, DDP or optimizer
/// state; an empty optimizer and a constant schedule). Prints a per-rank "allocated bytes" line.
ModelAndOptimizer setup_model_and_optimizer(const MegatronRuntime& rt, const ModelProvider& model_provider);

/// The data loaders and the iterators the loop reads (the iterators point into the loaders).
struct DataIterators {
  std::unique_ptr<GPTDataLoader> train_loader, valid_loader, test_loader;
  BatchIterator train, valid, test;  ///< empty where the split has no data
};

/// Megatron's build_train_valid_test_data_iterators: the split sizes
/// (get_train_valid_test_num_samples), the datasets from `provider`, the loaders (train resumes at
/// counters.consumed_train_samples, valid at consumed_valid_samples unless --skip-train, both
/// cyclic as Megatron's), each micro-batch passed through `get_batch`. UserError when there is no
/// training data and --skip-train is not given.
DataIterators build_train_valid_test_data_iterators(const MegatronRuntime& rt, const DatasetsProvider& provider,
                                                    const GetBatch& get_batch, const TrainCounters& counters);

/// Megatron's pretrain(): initialize_megatron; setup_model_and_optimizer and
/// build_train_valid_test_data_iterators (Megatron's setup timers and datetime lines); the
/// loop's integrations (TensorBoard on the last rank, DDP grad sync and finalize_model_grads,
/// the pipeline schedule, context-parallel loss normalisation, DP loss reduction, --save through
/// generate_state_dict, --async-save, exit agreement, memory reports, the kernel profiler); the
/// Trainer's pretrain (train, then the final validation / test evaluations); a pending async
/// save; the process groups torn down. Returns the exit status (0). Throws UserError for bad
/// input.
int pretrain(int argc, char** argv, const DatasetsProvider& train_valid_test_datasets_provider,
             const ModelProvider& model_provider, const GetBatch& get_batch);

}  // namespace megatron::training
