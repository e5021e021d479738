// pretrain_gpt: GPT / LLaMA pretraining with Megatron-LM's flags and log lines
// (Megatron's pretrain_gpt.py: model_provider, train_valid_test_datasets_provider, pretrain).
// A problem the user can fix prints one line "error: ..." and exits with status 1.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <memory>
#include <set>
#include <string>

#include "megatron/core/datasets/blended_megatron_dataset_builder.h"
#include "megatron/core/datasets/utils.h"
#include "megatron/core/distributed/distributed_data_parallel.h"
#include "megatron/core/distributed/distributed_optimizer.h"
#include "megatron/core/distributed/init_process_group.h"
#include "megatron/core/parallel_state.h"
#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/optimizer/grad_scaler.h"
#include "megatron/core/optimizer/optimizer.h"
#include "megatron/core/optimizer_param_scheduler.h"
#include "megatron/core/tokenizers/megatron_tokenizer.h"
#include "megatron/core/utils/errors.h"
#include "megatron/training/arguments.h"
#include "megatron/training/checkpointing.h"
#include "megatron/training/datasets/data_samplers.h"
#include "megatron/training/gpt_trainable.h"
#include "megatron/training/tensorboard/summary_writer.h"
#include "megatron/training/training.h"
#include "megatron/training/training_log.h"

using namespace megatron;
using namespace megatron::training;

namespace {

int64_t env_int(const char* a, const char* b, int64_t dflt) {
  for (const char* n : {a, b}) {
    if (const char* v = std::getenv(n)) return std::atoll(v);
  }
  return dflt;
}

// Megatron trains on the GPU whenever one is present (torch.cuda.set_device(LOCAL_RANK)). Here:
// CUDA device LOCAL_RANK when the CUDA backend is compiled in and a GPU is visible, else the CPU.
// MEGATRON_DEVICE=cpu forces the CPU (also with a GPU); MEGATRON_DEVICE=cuda demands a GPU and
// fails with a UserError when none is usable. Any other value is a UserError.
// Not wired for the GPU yet (the CPU is used, with a note): more than one process (the process
// groups are CPU backends) and --save/--load (checkpointing reads CPU tensors).
Device choose_device(const Arguments& args, const std::function<void(const std::string&)>& say) {
  const char* want = std::getenv("MEGATRON_DEVICE");
  const std::string w = want ? want : "";
  if (!w.empty() && w != "cpu" && w != "cuda")
    user_error("MEGATRON_DEVICE=", w, ": unknown device (use cpu or cuda, or leave it unset for GPU when present)");
  if (w == "cpu") return Device::cpu();
  const bool have_cuda = backend_available(DeviceType::kCUDA);
  if (w == "cuda" && !have_cuda)
    user_error("MEGATRON_DEVICE=cuda: no usable CUDA device (this build has no CUDA backend or no GPU is visible)");
  if (!have_cuda) return Device::cpu();
  const char* why = args.world_size > 1 ? "more than one process"
                    : (args.save || args.load) ? "--save/--load (checkpointing)" : nullptr;
  if (why) {
    if (w == "cuda") user_error("MEGATRON_DEVICE=cuda: ", why, " is not supported on the GPU yet; unset MEGATRON_DEVICE");
    say(std::string("note: training on the CPU: ") + why + " is not supported on the GPU yet");
    return Device::cpu();
  }
  return Device::cuda(static_cast<int>(env_int("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", 0)));
}

BatchIterator iterator_of(training::GPTDataLoader* loader) {
  if (!loader) return nullptr;
  return [loader]() -> std::optional<datasets::GPTBatch> {
    datasets::GPTBatch b;
    if (!loader->next(b)) return std::nullopt;
    return b;
  };
}

// Rejects the parallel layouts pretrain_gpt does not run yet, naming the flag (never a silent
// no-op).
void check_supported_parallelism(const Arguments& args) {
  if (args.pipeline_model_parallel_size > 1)
    user_error("--pipeline-model-parallel-size ", args.pipeline_model_parallel_size,
               ": pipeline parallelism is not wired into pretrain_gpt yet; use --pipeline-model-parallel-size 1");
  if (args.context_parallel_size > 1)
    user_error("--context-parallel-size ", args.context_parallel_size,
               ": context-parallel attention is not available yet; use --context-parallel-size 1");
  if (args.sequence_parallel && args.tensor_model_parallel_size > 1)
    user_error("--sequence-parallel: the model's layers do not support sequence parallelism yet; drop the flag");
  if (args.num_layers_per_virtual_pipeline_stage || args.num_virtual_stages_per_pipeline_rank)
    user_error("--num-layers-per-virtual-pipeline-stage/--num-virtual-stages-per-pipeline-rank: the interleaved "
               "pipeline schedule is not wired into pretrain_gpt yet; drop the flag");
  if (args.expert_model_parallel_size > 1)
    user_error("--expert-model-parallel-size ", args.expert_model_parallel_size,
               ": expert parallelism is not available; use --expert-model-parallel-size 1");
}

// --distributed-backend -> init_process_group backend. pretrain_gpt trains on the CPU here, so
// "nccl" (Megatron's default) maps to the CPU backend of the launcher: MPI under mpirun/PMI, TCP
// under torchrun/megatron_launch ("auto"); "gloo" is the TCP backend.
std::string cpu_backend_for(const std::string& flag) { return flag == "gloo" ? "tcp" : "auto"; }

CheckpointConfig checkpoint_config_from_args(const Arguments& a) {
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
  return c;
}

// Megatron's OptimizerParamScheduler.state_dict keys.
nlohmann::json scheduler_state(const OptimizerParamScheduler& s) {
  const auto& o = s.options();
  return {{"max_lr", o.max_lr},           {"lr_warmup_steps", o.lr_warmup_steps}, {"num_steps", s.num_steps()},
          {"lr_decay_style", o.lr_decay_style}, {"lr_decay_steps", o.lr_decay_steps}, {"min_lr", o.min_lr},
          {"start_wd", o.start_wd},       {"end_wd", o.end_wd},                   {"wd_incr_style", o.wd_incr_style},
          {"wd_incr_steps", o.wd_incr_steps}};
}

// Views of the live model parameters and fp32 optimizer state (TrainingState's tensors are
// views: load writes into them, save reads them). Optimizer param i is model parameter i.
TrainingState training_state(models::gpt::GPTModel& model, const optimizer::MegatronOptimizer& opt, bool with_optim) {
  TrainingState st;
  const int64_t num_layers = model.config().num_layers;
  auto params = model.parameters();
  MEGATRON_CHECK(params.size() == opt.params().size()) << params.size() << " vs " << opt.params().size();
  for (size_t i = 0; i < params.size(); ++i) {
    auto pieces = parameter_sharded_tensors(params[i], num_layers);
    const bool adam = opt.exp_avg(i).defined();
    for (auto& piece : pieces) {
      if (with_optim) {
        // The piece is a view into the parameter: take the same element range of the
        // (flat) optimizer tensors.
        const auto* base = static_cast<const char*>(params[i].data.data_ptr());
        const auto* at = static_cast<const char*>(piece.data.data_ptr());
        const int64_t off = (at - base) / static_cast<int64_t>(dtype_size(params[i].data.dtype()));
        const Shape shape = piece.data.shape();
        add_optimizer_state(st, piece, opt.main_param(i).flat_slice(off, shape),
                            adam ? opt.exp_avg(i).flat_slice(off, shape) : Tensor(),
                            adam ? opt.exp_avg_sq(i).flat_slice(off, shape) : Tensor());
      }
      st.model.push_back(std::move(piece));
    }
  }
  // FP8 amax histories and scales (replicated over the amax group: one copy per pipeline stage).
  if (auto* f8 = model.fp8_state()) st.extra = f8->checkpoint_tensors();
  return st;
}

int run(int argc, char** argv) {
  Arguments args = parse_args(argc, argv);
  {
    const distributed::LaunchEnv env = distributed::detect_launch_env();
    args.world_size = env.world_size;
    args.rank = env.rank;
  }
  // Megatron prints most setup lines on rank 0 (print_rank_0) and the training/validation log
  // lines on the last rank (print_rank_last).
  auto say = [&](const std::string& s) {
    if (args.rank == 0) {
      std::fputs(s.c_str(), stdout);
      std::fputc('\n', stdout);
      std::fflush(stdout);
    }
  };
  say("using world size: " + std::to_string(args.world_size) + ", data-parallel size: " +
      std::to_string(args.world_size / std::max<int64_t>(1, args.tensor_model_parallel_size *
                                                                 args.pipeline_model_parallel_size *
                                                                 std::max<int64_t>(args.context_parallel_size, 1))) +
      ", tensor-model-parallel size: " + std::to_string(args.tensor_model_parallel_size) +
      ", pipeline-model-parallel size: " + std::to_string(args.pipeline_model_parallel_size));
  std::set<std::string> noted;
  for (const auto& [flag, note] : args.notes) {
    if (noted.insert(flag).second) say("note: " + flag + " is accepted: " + note);
  }
  validate_args(args);
  check_supported_parallelism(args);
  if (args.world_size > 1 && (args.save || args.load))
    user_error("--save/--load: checkpointing is wired for single-process pretrain_gpt runs only so far; "
               "run with one process, or drop --save/--load");

  // Process groups (Megatron's initialize_megatron: init_process_group + initialize_model_parallel).
  distributed::InitOptions io;
  io.backend = cpu_backend_for(args.distributed_backend);
  io.timeout = std::chrono::minutes(args.distributed_timeout_minutes);
  auto world = distributed::init_process_group(io);
  namespace ps = parallel_state;
  ps::ParallelConfig pc;
  pc.tensor_model_parallel_size = static_cast<int>(args.tensor_model_parallel_size);
  pc.pipeline_model_parallel_size = static_cast<int>(args.pipeline_model_parallel_size);
  pc.context_parallel_size = static_cast<int>(args.context_parallel_size);
  ps::initialize_model_parallel(world, pc);
  const int tp_rank = ps::get_tensor_model_parallel_rank();
  const int pp_rank = ps::get_pipeline_model_parallel_rank();
  auto dp_group = ps::get_data_parallel_group(/*with_context_parallel=*/true);

  // Tokenizer and vocab padding.
  say("> building " + args.tokenizer.tokenizer_type + " tokenizer ...");
  std::shared_ptr<tokenizers::MegatronTokenizer> tokenizer = tokenizers::build_tokenizer(args.tokenizer);
  say(set_padded_vocab_size(args, tokenizer->vocab_size()));
  say(format_args(args));

  // Model, optimizer, scheduler.
  say("building GPT model ...");
  const Device device = choose_device(args, say);
  if (device.is_cuda()) say("> training on cuda:" + std::to_string(device.index) + " (MEGATRON_DEVICE=cpu forces the CPU)");
  models::gpt::GPTModelParallel par;
  par.tp_group = ps::get_tensor_model_parallel_group();
  par.pp_rank = pp_rank;
  models::gpt::GPTModel model(core_transformer_config_from_args(args), args.padded_vocab_size,
                              *args.max_position_embeddings, static_cast<uint64_t>(args.seed), device, par);
  int64_t nparams = 0;
  for (auto& p : model.parameters()) nparams += p.data.numel();
  // Megatron prints this on data-parallel rank 0 of every model-parallel rank.
  if (ps::get_data_parallel_rank(true) == 0) {
    std::printf(" > number of parameters on (tensor, pipeline) model parallel rank (%d, %d): %lld\n", tp_rank,
                pp_rank, static_cast<long long>(nparams));
    std::fflush(stdout);
  }
  world->barrier();
  GPTTrainable trainable(model);
  // DDP over the dp-cp group (Megatron's DistributedDataParallel wrapper): grads pre-scaled by
  // 1/DP and summed (none with --calculate-per-token-loss), reduce-scattered with
  // --use-distributed-optimizer.
  distributed::DistributedDataParallelConfig dc;
  dc.overlap_grad_reduce = args.overlap_grad_reduce;
  dc.overlap_param_gather = args.overlap_param_gather;
  dc.use_distributed_optimizer = args.use_distributed_optimizer;
  dc.bucket_size = args.ddp_bucket_size;
  dc.calculate_per_token_loss = args.calculate_per_token_loss;
  distributed::DistributedDataParallel ddp(dc, model.buffers(), model.parameters(), dp_group);
  // Grad norm / zero counts: over the model-parallel group (grads are equal across DP), or with
  // the distributed optimizer over DP x model-parallel (each rank holds disjoint slices);
  // TP-duplicated parameters count on TP rank 0 only.
  optimizer::MegatronOptimizer opt(
      optimizer_config_from_args(args),
      args.use_distributed_optimizer ? distributed::distributed_optimizer_params(ddp) : trainable.optimizer_params(),
      args.use_distributed_optimizer ? ps::get_world_group() : ps::get_model_parallel_group(), tp_rank);
  OptimizerParamScheduler sched(scheduler_options_from_args(args));

  // Checkpoint (Megatron's load_checkpoint in setup_model_and_optimizer, before the data loaders
  // so they resume at consumed_train_samples).
  const CheckpointConfig ckpt_cfg = checkpoint_config_from_args(args);
  const ParallelRanks ranks;
  auto optimizer_common = [&opt]() {
    nlohmann::json c = {{"step", opt.step_count()}};
    if (auto* d = dynamic_cast<optimizer::DynamicGradScaler*>(opt.grad_scaler())) {
      c["grad_scaler"] = {{"scale", d->scale()},
                          {"growth_tracker", d->growth_tracker()},
                          {"hysteresis_tracker", d->hysteresis_tracker()}};
    }
    return c;
  };
  LoadResult loaded;
  if (!ckpt_cfg.load.empty()) {
    TrainingState st = training_state(model, opt, /*with_optim=*/!args.no_load_optim && !args.finetune);
    loaded = load_checkpoint(st, ckpt_cfg, ranks);
    if (auto* f8 = model.fp8_state(); f8 && loaded.loaded) f8->restore_checkpoint_tensors(st.extra, loaded.extra_loaded_keys);
    if (loaded.loaded && loaded.optimizer_loaded) {
      const auto& c = loaded.optimizer_common;
      if (c.contains("step")) opt.set_step_count(c.at("step").get<int64_t>());
      if (auto* d = dynamic_cast<optimizer::DynamicGradScaler*>(opt.grad_scaler()); d && c.contains("grad_scaler")) {
        const auto& g = c.at("grad_scaler");
        d->load_state(g.at("scale").get<double>(), g.at("growth_tracker").get<int>(),
                      g.at("hysteresis_tracker").get<int>());
      }
      if (loaded.opt_param_scheduler.contains("num_steps"))
        sched.set_num_steps(loaded.opt_param_scheduler.at("num_steps").get<int64_t>());
    }
    if (loaded.loaded && !loaded.optimizer_loaded) {
      // Megatron's optimizer.reload_model_params(): separate fp32 main params (bf16/fp16) start
      // from the loaded weights, not from the initialization they were copied from.
      auto params = model.parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        Tensor mp = opt.main_param(i);
        if (mp.data_ptr() != params[i].data.data_ptr()) mp.copy_(params[i].data.to(DType::kFloat32));
      }
    }
    if (loaded.loaded && loaded.rng_loaded && loaded.rng_state.contains("dropout_rng_offset"))
      model.set_rng_offset(loaded.rng_state.at("dropout_rng_offset").get<uint64_t>());
  }

  // Data (pretrain_gpt.py train_valid_test_datasets_provider).
  say("> building train, validation, and test datasets ...");
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
  cfg->tokenizer = tokenizer;
  cfg->mid_level_dataset_surplus = args.mid_level_dataset_surplus;
  cfg->reset_position_ids = args.reset_position_ids;
  cfg->reset_attention_mask = args.reset_attention_mask;
  cfg->eod_mask_loss = args.eod_mask_loss;
  cfg->create_attention_mask = args.create_attention_mask_in_dataloader;
  if (world->size() > 1) {
    // Megatron builds the index caches on global rank 0 while the other ranks wait, then they read them.
    cfg->distributed.initialized = true;
    cfg->distributed.rank = args.rank;
    cfg->distributed.barrier = [world] { world->barrier(); };
  }
  cfg->finalize();
  datasets::NumSamplesArgs ns;
  const int64_t train_iters =
      args.train_iters ? *args.train_iters : (args.train_samples ? *args.train_samples / *args.global_batch_size : 0);
  ns.train_iters = train_iters;
  ns.train_samples = args.train_samples;
  ns.global_batch_size = *args.global_batch_size;
  ns.eval_interval = args.eval_interval.value_or(train_iters + 1);  // None: only the final evaluation
  ns.eval_iters = args.eval_iters;
  ns.skip_train = args.skip_train;
  auto sizes = datasets::get_train_valid_test_num_samples(ns);
  auto ds = datasets::BlendedMegatronDatasetBuilder(sizes, nullptr, cfg).build();
  say("> finished creating GPT datasets ...");

  training::DataLoaderOptions lo;
  lo.micro_batch_size = *args.micro_batch_size;
  lo.data_parallel_size = args.data_parallel_size;
  lo.data_parallel_rank = ps::get_data_parallel_rank();
  lo.num_workers = static_cast<int>(args.num_workers);
  lo.attention_mask = args.reset_attention_mask && args.create_attention_mask_in_dataloader;
  lo.consumed_samples = loaded.consumed_train_samples;
  auto train_loader = training::build_pretraining_data_loader(ds[0], lo);
  lo.cyclic = true;  // Megatron iterates valid/test cyclically
  lo.consumed_samples = args.skip_train ? 0 : loaded.consumed_valid_samples;
  auto valid_loader = training::build_pretraining_data_loader(ds[1], lo);
  lo.consumed_samples = 0;
  auto test_loader = training::build_pretraining_data_loader(ds[2], lo);
  BatchIterator train_it = iterator_of(train_loader.get());
  BatchIterator valid_it = iterator_of(valid_loader.get());
  BatchIterator test_it = iterator_of(test_loader.get());
  if (!train_it && !args.skip_train) user_error("no training data (check --data-path/--split)");

  std::function<void(const std::string&)> printer;  // default: stdout (print_rank_last)
  if (args.rank != args.world_size - 1) printer = [](const std::string&) {};
  // TensorBoard: written by the last rank, as Megatron's get_tensorboard_writer.
  std::unique_ptr<SummaryWriter> writer;
  TrainingHooks hooks;
  if (args.tensorboard_dir && args.rank == args.world_size - 1) {
    say("> setting tensorboard ...");
    writer = std::make_unique<SummaryWriter>(*args.tensorboard_dir);
    hooks.add_scalar = [&writer](const std::string& tag, double v, int64_t step) { writer->add_scalar(tag, v, step); };
    hooks.flush = [&writer] { writer->flush(); };
  }
  hooks.zero_grad = [&ddp] { ddp.zero_grad_buffer(); };
  distributed::FinalizeGroups fg;
  fg.tp_group = ps::get_tensor_model_parallel_group();
  fg.pp_group = ps::get_pipeline_model_parallel_group();
  fg.dp_group = dp_group;
  fg.embedding_group = ps::get_embedding_group();
  fg.sequence_parallel = args.sequence_parallel;
  fg.share_embeddings_and_output_weights = !args.untie_embeddings_and_output_weights;
  // FP8: after the step's last backward, the amaxes are reduced (MAX) over TP x DP x CP (Megatron's
  // amax reduction group) and every scale is updated for the next step.
  auto amax_group = ps::get_tensor_and_data_parallel_group(/*with_context_parallel=*/true);
  hooks.finalize_model_grads = [&ddp, fg, &args, &model, amax_group](double num_tokens) {
    if (args.calculate_per_token_loss) {
      Tensor n = Tensor::from_vector({static_cast<float>(num_tokens)}, {1});
      distributed::finalize_model_grads({&ddp}, fg, &n);
    } else {
      distributed::finalize_model_grads({&ddp}, fg);
    }
    if (auto* f8 = model.fp8_state()) f8->reduce_and_update(amax_group.get());
  };
  if (args.use_distributed_optimizer) {
    hooks.after_optimizer_step = [&ddp] {
      ddp.start_param_sync();
      ddp.finish_param_sync();
    };
  }
  if (dp_group->size() > 1) {
    hooks.reduce_loss = [dp_group](LossReport& r) {
      Tensor t = Tensor::empty({2}, DType::kFloat64);
      double* p = t.data<double>();
      p[0] = r.loss_sum;
      p[1] = r.num_tokens;
      dp_group->all_reduce(t, distributed::ReduceOp::kSum);
      r.loss_sum = p[0];
      r.num_tokens = p[1];
    };
  }
  Trainer* trainer_ptr = nullptr;
  if (args.save) {
    hooks.save_checkpoint = [&](int64_t iteration) {
      TrainingState st = training_state(model, opt, /*with_optim=*/!args.no_save_optim);
      st.optimizer_common = optimizer_common();
      st.opt_param_scheduler = scheduler_state(sched);
      st.rng_state = {{"seed", args.seed}, {"dropout_rng_offset", model.rng_offset()}};
      const TrainCounters& c = trainer_ptr->state();
      st.iteration = iteration;
      st.consumed_train_samples = c.consumed_train_samples;
      st.consumed_valid_samples = c.consumed_valid_samples;
      st.num_floating_point_operations_so_far = c.floating_point_operations_so_far;
      st.args = {{"num_layers", args.num_layers.value_or(0)}, {"hidden_size", args.hidden_size.value_or(0)},
                 {"num_attention_heads", args.num_attention_heads.value_or(0)}, {"seq_length", *args.seq_length},
                 {"padded_vocab_size", args.padded_vocab_size}, {"micro_batch_size", *args.micro_batch_size},
                 {"global_batch_size", *args.global_batch_size}, {"seed", args.seed},
                 {"tensor_model_parallel_size", args.tensor_model_parallel_size},
                 {"pipeline_model_parallel_size", args.pipeline_model_parallel_size}};
      save_checkpoint(st, ckpt_cfg, ranks);
      maybe_finalize_async_save(nullptr, /*blocking=*/true);
    };
  }
  Trainer trainer(args, trainable, opt, sched, hooks, printer);
  trainer_ptr = &trainer;
  if (loaded.loaded) {
    trainer.state().iteration = loaded.iteration;
    trainer.state().consumed_train_samples = loaded.consumed_train_samples;
    trainer.state().consumed_valid_samples = loaded.consumed_valid_samples;
    trainer.state().floating_point_operations_so_far = loaded.num_floating_point_operations_so_far;
  }
  trainer.pretrain(train_it, valid_it ? &valid_it : nullptr, test_it ? &test_it : nullptr);
  world->barrier();
  ps::destroy_model_parallel();
  distributed::destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const UserError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "internal error: %s\n", e.what());
    return 2;
  }
}
