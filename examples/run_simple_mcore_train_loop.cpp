// The minimal distributed training loop, written against the library like Megatron-LM's
// examples/run_simple_mcore_train_loop.py (docs/megatron-reference.md#run_simple_mcore_train_loop):
//   mpirun -np 2 build/bin/run_simple_mcore_train_loop        (CPU, TP=2)
//   megatron_launch --nproc-per-node 2 build/bin/run_simple_mcore_train_loop
// Parallel state with TP2 (TP1 when started as one process), GPT model (2 layers, hidden 12, 4 heads,
// vocab 100, max sequence 64, fp32, dropout 0.1), Adam (lr 1e-3), MockGPTDataset (sequence 64,
// micro-batch 8), 5 iterations printing "Iteration i: Losses reduced: ...", then a distributed
// checkpoint saved to ./ckpt, loaded back, and "Successfully loaded the model".
// Differences from the Python example: the data loader reads the mock samples in order (the
// Python one shuffles).
// Device (like pretrain_gpt): --device auto (default: GPU LOCAL_RANK when this build has CUDA and
// a GPU is visible, else the CPU), --device cpu or --device cuda (MEGATRON_DEVICE=cpu|cuda does the
// same). On the GPU each rank takes cuda:LOCAL_RANK and TP/DP communicate over NCCL; the head dim
// of 3 runs the generic CUDA attention kernels, whose dropout uses the CPU's random stream, so
// the GPU losses equal the CPU ones up to float32 rounding (tests/gpu/example_gpu_check.sh).
// --bf16: bfloat16 params and activations with fp32 main params in the optimizer (default fp32,
// as the Python example). The checkpoint is written from and loaded into the device tensors.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "megatron/core/datasets/blended_megatron_dataset_builder.h"
#include "megatron/core/datasets/gpt_dataset.h"
#include "megatron/core/dist_checkpointing/serialization.h"
#include "megatron/core/distributed/distributed_data_parallel.h"
#include "megatron/core/distributed/finalize_model_grads.h"
#include "megatron/core/comm/init_process_group.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/optimizer/optimizer.h"
#include "megatron/core/optimizer_param_scheduler.h"
#include "megatron/core/parallel_state.h"
#include "megatron/core/tokenizers/null_tokenizer.h"
#include "megatron/training/checkpointing.h"
#include "megatron/training/datasets/data_samplers.h"

using namespace megatron;
namespace ps = megatron::parallel_state;

namespace {

constexpr int64_t kSequenceLength = 64;

dist_checkpointing::ShardedStateDict sharded_state_dict(models::gpt::GPTModel& model) {
  training::ParallelRanks r;
  r.tp_rank = ps::get_tensor_model_parallel_rank();
  r.tp_size = ps::get_tensor_model_parallel_world_size();
  r.dp_rank = ps::get_data_parallel_rank();
  r.dp_size = ps::get_data_parallel_world_size();
  dist_checkpointing::ShardedStateDict sd;
  for (auto& p : model.parameters()) {
    auto v = training::parameter_sharded_tensors(p, model.config().num_layers, r);
    sd.tensors.insert(sd.tensors.end(), v.begin(), v.end());
  }
  return sd;
}

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

// pretrain_gpt's choice: cuda:LOCAL_RANK when the CUDA backend is built in and a GPU is visible
// (Megatron's torch.cuda.set_device(LOCAL_RANK)), else the CPU; --device cpu/cuda forces one.
Device choose_device(const Options& o, int local_rank) {
  if (o.device == "cpu") return Device::cpu();
  const bool have_cuda = backend_available(DeviceType::kCUDA);
  if (o.device == "cuda" && !have_cuda)
    user_error("--device cuda: no usable CUDA device (this build has no CUDA backend or no GPU is visible)");
  if (!have_cuda) return Device::cpu();
  return Device::cuda(local_rank);
}

int run(const Options& opt) {
  const comm::LaunchEnv env = comm::detect_launch_env();
  const Device device = choose_device(opt, env.local_rank);
  comm::InitOptions io;
  if (device.is_cuda() && env.world_size > 1) io.backend = "nccl";  // TP/DP collectives on device tensors
  auto world = comm::init_process_group(io);
  ps::ParallelConfig pc;
  pc.tensor_model_parallel_size = world->size() >= 2 ? 2 : 1;
  ps::initialize_model_parallel(world, pc);
  const bool print = world->rank() == 0;

  transformer::TransformerConfig config;
  config.num_layers = 2;
  config.hidden_size = 12;
  config.num_attention_heads = 4;
  config.tensor_model_parallel_size = pc.tensor_model_parallel_size;
  if (opt.bf16) config.params_dtype = DType::kBFloat16;
  models::gpt::GPTModelParallel par;
  par.tp_group = ps::get_tensor_model_parallel_group();
  models::gpt::GPTModel model(config, /*padded_vocab_size=*/100, /*max_sequence_length=*/kSequenceLength,
                              /*seed=*/123, device, par);

  optimizer::OptimizerConfig oc;  // torch.optim.Adam(params): lr 1e-3, no weight decay, no clipping
  oc.lr = oc.min_lr = 1e-3;
  oc.weight_decay = 0.0;
  oc.clip_grad = 0.0;
  oc.bf16 = opt.bf16;  // fp32 main params + Adam state for the bf16 model params
  std::vector<optimizer::OptimizerParam> params;
  for (auto& p : model.parameters())
    params.push_back({p.name, p.data, p.main_grad, p.no_weight_decay, p.is_embedding_or_output, p.tensor_parallel, p.shared});
  optimizer::MegatronOptimizer optim(oc, params, ps::get_model_parallel_group(), ps::get_tensor_model_parallel_rank());
  OptimizerParamScheduler::Options so;
  so.max_lr = so.min_lr = 1e-3;
  so.lr_decay_style = "constant";
  so.lr_decay_steps = 1;
  so.start_wd = so.end_wd = 0.0;
  OptimizerParamScheduler sched(so);
  optim.apply_schedule(sched);

  auto cfg = std::make_shared<datasets::GPTDatasetConfig>();
  cfg->random_seed = 0;
  cfg->sequence_length = kSequenceLength;
  cfg->reset_position_ids = cfg->reset_attention_mask = cfg->eod_mask_loss = false;
  cfg->tokenizer = std::make_shared<tokenizers::NullTokenizer>(kSequenceLength, std::nullopt, -1);
  cfg->mid_level_dataset_surplus = 0.005;
  cfg->finalize();
  auto ds = datasets::BlendedMegatronDatasetBuilder({1000, std::nullopt, std::nullopt}, nullptr, cfg).build();
  training::DataLoaderOptions lo;
  lo.micro_batch_size = 8;
  lo.data_parallel_rank = ps::get_data_parallel_rank();
  lo.data_parallel_size = ps::get_data_parallel_world_size();
  auto loader = training::build_pretraining_data_loader(ds[0], lo);

  // Megatron's DDP wrapper (DistributedDataParallel over the model's contiguous grad buffer) and
  // finalize_model_grads: the DP all-reduce of the averaged gradients, TP/embedding reductions.
  auto dp = ps::get_data_parallel_group();
  distributed::DistributedDataParallelConfig ddp_config;
  distributed::DistributedDataParallel ddp(ddp_config, model.buffers(), model.parameters(), dp);
  distributed::FinalizeGroups groups;
  groups.tp_group = ps::get_tensor_model_parallel_group();
  groups.pp_group = ps::get_pipeline_model_parallel_group();
  groups.dp_group = dp;
  groups.embedding_group = ps::get_embedding_group();
  for (int it = 0; it < 5; ++it) {
    optim.zero_grad();
    datasets::GPTBatch batch;
    if (!loader->next(batch)) user_error("mock dataset exhausted");
    Tensor losses = model.forward(batch, /*training=*/true);  // float32 [b, s]
    auto l = losses.to_float_vector(), m = batch.loss_mask.to_float_vector();
    double num = 0, den = 0;
    for (size_t i = 0; i < l.size(); ++i) num += static_cast<double>(l[i]) * m[i], den += m[i];
    const double loss = num / den;  // the example's loss_func: masked mean
    std::vector<float> d(m.size());
    for (size_t i = 0; i < m.size(); ++i) d[i] = static_cast<float>(m[i] / den);
    model.backward(Tensor::from_vector(d, losses.shape()));
    distributed::finalize_model_grads({&ddp}, groups);
    optim.step();
    if (print) std::printf("Iteration %d: Losses reduced:  [{'lm loss': tensor(%.4f)}]\n", it, loss);
    std::fflush(stdout);
  }

  const std::string ckpt = std::filesystem::current_path().string() + "/ckpt";
  auto sd = sharded_state_dict(model);
  dist_checkpointing::save(sd, ckpt, world.get());
  auto back = sharded_state_dict(model);
  dist_checkpointing::load(back, ckpt);
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
