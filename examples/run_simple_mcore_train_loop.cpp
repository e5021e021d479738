// The minimal distributed training loop, written against the library like Megatron-LM's
// examples/run_simple_mcore_train_loop.py (docs/megatron-reference.md#run_simple_mcore_train_loop):
//   mpirun -np 2 build/bin/run_simple_mcore_train_loop        (CPU, TP=2)
//   megatron_launch --nproc-per-node 2 build/bin/run_simple_mcore_train_loop
// Parallel state with TP2 (TP1 when started as one process), GPT model (2 layers, hidden 12, 4 heads,
// vocab 100, max sequence 64, fp32, dropout 0.1), Adam (lr 1e-3), MockGPTDataset (sequence 64,
// micro-batch 8), 5 iterations printing "Iteration i: Losses reduced: ...", then a distributed
// checkpoint saved to ./ckpt, loaded back, and "Successfully loaded the model".
// The functions are the Python example's (initialize_distributed, model_provider,
// get_train_data_iterator, forward_step_func with its loss_func, save/load_distributed_checkpoint,
// main), written against the library (parallel_state, GPTModel, DistributedDataParallel,
// finalize_model_grads, MegatronOptimizer, the checkpointing of megatron/training/checkpointing.h).
// Differences from the Python example: the data loader reads the mock samples in order (the
// Python one shuffles); the model has no autograd, so forward_step_func also runs the backward of
// its loss.
// Device (like pretrain_gpt): --device auto (default: GPU LOCAL_RANK when this build has CUDA and
// a GPU is visible, else the CPU), --device cpu or --device cuda (MEGATRON_DEVICE=cpu|cuda does the
// same). On the GPU each rank takes cuda:LOCAL_RANK and TP/DP communicate over NCCL; the head dim
// of 3 runs the generic CUDA attention kernels, whose dropout uses the CPU's random stream, so
// the GPU losses equal the CPU ones up to float32 rounding (tests/gpu/example_gpu_check.sh).
// --bf16: bfloat16 params and activations with fp32 main params in the optimizer (default fp32,
// as the Python example). The checkpoint is written from and loaded into the device tensors.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "megatron/core/comm/init_process_group.h"
#include "megatron/core/datasets/blended_megatron_dataset_builder.h"
#include "megatron/core/datasets/gpt_dataset.h"
#include "megatron/core/dist_checkpointing/serialization.h"
#include "megatron/core/distributed/distributed_data_parallel.h"
#include "megatron/core/distributed/finalize_model_grads.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/optimizer/distributed_optimizer.h"
#include "megatron/core/optimizer/optimizer.h"
#include "megatron/core/optimizer_param_scheduler.h"
#include "megatron/core/parallel_state.h"
#include "megatron/core/tokenizers/null_tokenizer.h"
#include "megatron/training/checkpointing.h"
#include "megatron/training/datasets/data_samplers.h"
#include "megatron/training/initialize.h"
#include "megatron/training/training.h"

using namespace megatron;
namespace ps = megatron::parallel_state;

namespace {

constexpr int64_t kSequenceLength = 64;

struct Options {
  std::string device = "auto";  // auto | cpu | cuda
  bool bf16 = false;
};

Options parse_options(int argc, char** argv) {
  Options o;
  std::string source = "--device";  // what set o.device, for the error message
  if (const char* e = std::getenv("MEGATRON_DEVICE"); e && *e) {
    o.device = e;
    source = "MEGATRON_DEVICE=";
  }
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--device") {
      if (i + 1 >= argc) user_error("--device needs a value: auto, cpu or cuda");
      o.device = argv[++i];
      source = "--device";
    } else if (a.rfind("--device=", 0) == 0) {
      o.device = a.substr(9);
      source = "--device";
    } else if (a == "--bf16") {
      o.bf16 = true;
    } else {
      user_error("run_simple_mcore_train_loop: unknown argument '", a, "' (use --device auto|cpu|cuda, --bf16)");
    }
  }
  if (o.device != "auto" && o.device != "cpu" && o.device != "cuda")
    user_error(source, source.back() == '=' ? "" : " ", o.device, ": unknown device (use auto, cpu or cuda)");
  return o;
}

// initialize_distributed(tensor_model_parallel_size, pipeline_model_parallel_size): the process
// group (NCCL for device tensors on the GPU) and the model-parallel groups. Returns the world.
std::shared_ptr<comm::ProcessGroup> initialize_distributed(int tensor_model_parallel_size,
                                                           int pipeline_model_parallel_size, const Device& device) {
  comm::InitOptions io;
  if (device.is_cuda() && comm::detect_launch_env().world_size > 1) io.backend = "nccl";  // collectives on device tensors
  auto world = comm::init_process_group(io);
  ps::ParallelConfig pc;
  pc.tensor_model_parallel_size = tensor_model_parallel_size;
  pc.pipeline_model_parallel_size = pipeline_model_parallel_size;
  ps::initialize_model_parallel(world, pc);
  return world;
}

// model_provider(): TransformerConfig(num_layers=2, hidden_size=12, num_attention_heads=4) and
// GPTModel(vocab_size=100, max_sequence_length=64); seed 123 (model_parallel_cuda_manual_seed).
std::unique_ptr<models::gpt::GPTModel> model_provider(const Device& device, bool bf16) {
  transformer::TransformerConfig transformer_config;
  transformer_config.num_layers = 2;
  transformer_config.hidden_size = 12;
  transformer_config.num_attention_heads = 4;
  transformer_config.tensor_model_parallel_size = ps::get_tensor_model_parallel_world_size();
  if (bf16) transformer_config.params_dtype = DType::kBFloat16;
  models::gpt::GPTModelParallel par;
  par.tp_group = ps::get_tensor_model_parallel_group();
  return std::make_unique<models::gpt::GPTModel>(transformer_config, /*vocab_size=*/100,
                                                 /*max_sequence_length=*/kSequenceLength, /*seed=*/123, device, par);
}

// get_train_data_iterator(): MockGPTDataset (1000 training samples of 64 tokens) in batches of 8.
std::unique_ptr<training::GPTDataLoader> get_train_data_iterator() {
  auto config = std::make_shared<datasets::GPTDatasetConfig>();
  config->random_seed = 0;
  config->sequence_length = kSequenceLength;
  config->reset_position_ids = config->reset_attention_mask = config->eod_mask_loss = false;
  config->tokenizer = std::make_shared<tokenizers::NullTokenizer>(kSequenceLength, std::nullopt, -1);
  config->mid_level_dataset_surplus = 0.005;
  config->finalize();
  auto datasets = datasets::BlendedMegatronDatasetBuilder({1000, std::nullopt, std::nullopt}, nullptr, config).build();
  training::DataLoaderOptions lo;
  lo.micro_batch_size = 8;
  lo.data_parallel_rank = ps::get_data_parallel_rank();
  lo.data_parallel_size = ps::get_data_parallel_world_size();
  return training::build_pretraining_data_loader(datasets[0], lo);
}

// forward_step_func(data_iterator, model) with loss_func(loss_mask, output_tensor): the masked
// mean of the per-token losses; then its backward (dloss = loss_mask / Σ loss_mask). Returns the
// loss.
double forward_step_func(training::GPTDataLoader& data_iterator, models::gpt::GPTModel& model) {
  datasets::GPTBatch data;
  if (!data_iterator.next(data)) user_error("mock dataset exhausted");
  Tensor output_tensor = model.forward(data, /*training=*/true);  // float32 [b, s]
  const training::LossReport r = training::masked_loss_report(output_tensor, data.loss_mask);
  const double loss = r.loss_sum / r.num_tokens;
  auto m = data.loss_mask.to_float_vector();
  std::vector<float> d(m.size());
  for (size_t i = 0; i < m.size(); ++i) d[i] = static_cast<float>(m[i] / r.num_tokens);
  model.backward(Tensor::from_vector(d, output_tensor.shape()));
  return loss;
}

// gpt_model.sharded_state_dict(prefix=''): every parameter at its global offsets (this rank's
// tensor/data-parallel position, checkpoint_ranks()).
dist_checkpointing::ShardedStateDict sharded_state_dict(models::gpt::GPTModel& model) {
  const training::ParallelRanks ranks = training::checkpoint_ranks();
  dist_checkpointing::ShardedStateDict sd;
  for (auto& p : model.parameters()) {
    auto v = training::parameter_sharded_tensors(p, model.config().num_layers, ranks);
    sd.tensors.insert(sd.tensors.end(), v.begin(), v.end());
  }
  return sd;
}

void save_distributed_checkpoint(const std::string& checkpoint_path, models::gpt::GPTModel& gpt_model,
                                 comm::ProcessGroup* world) {
  auto sharded = sharded_state_dict(gpt_model);
  dist_checkpointing::save(sharded, checkpoint_path, world);
}

void load_distributed_checkpoint(const std::string& checkpoint_path, models::gpt::GPTModel& gpt_model) {
  auto sharded = sharded_state_dict(gpt_model);  // views: the load writes into the model
  dist_checkpointing::load(sharded, checkpoint_path);
}

int run(const Options& opt) {
  // pretrain_gpt's device choice: cuda:LOCAL_RANK when the CUDA backend is built in and a GPU is
  // visible (Megatron's torch.cuda.set_device(LOCAL_RANK)), else the CPU; --device cpu/cuda forces one.
  const comm::LaunchEnv env = comm::detect_launch_env();
  const Device device = training::choose_device(opt.device == "auto" ? "" : opt.device, env.local_rank, "--device ");
  // TP2 as the Python example (TP1 when started as one process).
  auto world = initialize_distributed(/*tensor_model_parallel_size=*/env.world_size >= 2 ? 2 : 1,
                                      /*pipeline_model_parallel_size=*/1, device);
  const bool print = world->rank() == 0;
  std::unique_ptr<models::gpt::GPTModel> gpt_model = model_provider(device, opt.bf16);

  // optim = Adam(gpt_model.parameters()): lr 1e-3, no weight decay, no clipping; with --bf16 fp32
  // main params and Adam state for the bf16 model params.
  optimizer::OptimizerConfig oc;
  oc.lr = oc.min_lr = 1e-3;
  oc.weight_decay = 0.0;
  oc.clip_grad = 0.0;
  oc.bf16 = opt.bf16;
  optimizer::MegatronOptimizer optim(oc, optimizer::optimizer_params(gpt_model->parameters()),
                                     ps::get_model_parallel_group(), ps::get_tensor_model_parallel_rank());
  OptimizerParamScheduler::Options so;  // Adam's constant lr
  so.max_lr = so.min_lr = 1e-3;
  so.lr_decay_style = "constant";
  so.lr_decay_steps = 1;
  so.start_wd = so.end_wd = 0.0;
  OptimizerParamScheduler sched(so);
  optim.apply_schedule(sched);

  auto train_iterator = get_train_data_iterator();

  // forward_backward_func's gradient handling: Megatron's DDP wrapper (DistributedDataParallel
  // over the model's contiguous grad buffer) and finalize_model_grads (the DP all-reduce of the
  // averaged gradients, TP/embedding reductions).
  distributed::DistributedDataParallelConfig ddp_config;
  distributed::DistributedDataParallel ddp(ddp_config, gpt_model->buffers(), gpt_model->parameters(),
                                           ps::get_data_parallel_group());
  distributed::FinalizeGroups groups;
  groups.tp_group = ps::get_tensor_model_parallel_group();
  groups.pp_group = ps::get_pipeline_model_parallel_group();
  groups.dp_group = ps::get_data_parallel_group();
  groups.embedding_group = ps::get_embedding_group();
  groups.share_embeddings_and_output_weights = gpt_model->config().share_embeddings_and_output_weights;

  // Running the model for 5 iterations
  for (int it = 0; it < 5; ++it) {
    optim.zero_grad();
    const double loss = forward_step_func(*train_iterator, *gpt_model);
    distributed::finalize_model_grads({&ddp}, groups);
    optim.step();
    if (print) std::printf("Iteration %d: Losses reduced:  [{'lm loss': tensor(%.4f)}]\n", it, loss);
    std::fflush(stdout);
  }

  // Saving the model
  const std::string ckpt_path = std::filesystem::current_path().string() + "/ckpt";
  save_distributed_checkpoint(ckpt_path, *gpt_model, world.get());
  // Loading the model
  load_distributed_checkpoint(ckpt_path, *gpt_model);
  if (print) std::printf("Successfully loaded the model\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_options(argc, argv));
  } catch (const UserError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "internal error: %s\n", e.what());
    return 2;
  }
}
