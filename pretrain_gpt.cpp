// pretrain_gpt: GPT / LLaMA pretraining with Megatron-LM's flags and log lines. Like Megatron's
// pretrain_gpt.py this file holds the providers (model_provider, get_batch,
// train_valid_test_datasets_provider) and main, which calls pretrain()
// (megatron/training/pretrain.h: initialization, setup_model_and_optimizer, the data iterators,
// the training loop). The loss (pretrain_gpt.py's loss_func: Σ(loss·mask) / Σ(mask)) is the
// loop's masked_loss_report (megatron/training/training.h).
// A problem the user can fix prints one line "error: ..." and exits with status 1.
#include <cstdio>
#include <exception>
#include <memory>

#include "megatron/core/comm/comm_worker.h"
#include "megatron/core/datasets/blended_megatron_dataset_builder.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/parallel_state.h"
#include "megatron/core/transformer/context_parallel.h"
#include "megatron/core/utils/errors.h"
#include "megatron/training/config_from_args.h"
#include "megatron/training/initialize.h"
#include "megatron/training/pretrain.h"

using namespace megatron;
using namespace megatron::training;
namespace ps = megatron::parallel_state;

namespace {

// Megatron's model_provider: one GPTModel chunk from core_transformer_config_from_args, with this
// rank's tensor / context parallel groups and the chunk's layers.
std::unique_ptr<models::gpt::GPTModel> model_provider(const MegatronRuntime& rt, const ModelChunkSpec& spec) {
  const Arguments& args = rt.args;
  models::gpt::GPTModelParallel par;
  par.tp_group = ps::get_tensor_model_parallel_group();
  par.pp_rank = ps::get_pipeline_model_parallel_rank();
  par.cp_group = ps::get_context_parallel_group();
  par.cp_comm_type = args.cp_comm_type.front();
  par.pre_process = spec.chunk.pre_process;
  par.post_process = spec.chunk.post_process;
  par.layer_offset = spec.chunk.layer_offset;
  par.num_layers = spec.chunk.num_layers;
  par.allocate_main_grads = spec.allocate_main_grads;
  return std::make_unique<models::gpt::GPTModel>(core_transformer_config_from_args(args), args.padded_vocab_size,
                                                 *args.max_position_embeddings, static_cast<uint64_t>(args.seed),
                                                 rt.device, par);
}

// Megatron's get_batch: with context parallelism each rank keeps its two sequence chunks
// (get_batch_on_this_cp_rank).
datasets::GPTBatch get_batch(const datasets::GPTBatch& batch) {
  return transformer::get_batch_on_this_cp_rank(batch, ps::get_context_parallel_world_size(),
                                                ps::get_context_parallel_rank());
}

// Megatron's train_valid_test_datasets_provider: GPT datasets (mock, one prefix, a blend or
// per-split blends) of the requested sizes.
std::array<std::shared_ptr<datasets::TopLevelDataset>, 3> train_valid_test_datasets_provider(
    const MegatronRuntime& rt, const datasets::SplitSizes& train_val_test_num_samples) {
  print_rank_0(rt.args, "> building train, validation, and test datasets ...");
  auto config = core_gpt_dataset_config_from_args(rt.args, rt.tokenizer, rt.world);
  auto ds = datasets::BlendedMegatronDatasetBuilder(train_val_test_num_samples, nullptr, config).build();
  print_rank_0(rt.args, "> finished creating GPT datasets ...");
  return ds;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return pretrain(argc, argv, train_valid_test_datasets_provider, model_provider, get_batch);
  } catch (const UserError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    std::fflush(stderr);
    megatron::comm::run_job_abort_hook(1);  // the other ranks too (MPI), not a 10-minute hang
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "internal error: %s\n", e.what());
    std::fflush(stderr);
    megatron::comm::run_job_abort_hook(2);
    return 2;
  }
}
