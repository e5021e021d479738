// pretrain_gpt: GPT / LLaMA pretraining with Megatron-LM's flags and log lines
// (Megatron's pretrain_gpt.py: model_provider, train_valid_test_datasets_provider, pretrain).
// A problem the user can fix prints one line "error: ..." and exits with status 1.
#include <charconv>
#include <chrono>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <iostream>
#include <limits>
#include <memory>
#include <set>
#include <string>

#include "megatron/core/dist_checkpointing/file_utils.h"
#include "megatron/core/utils/parse.h"
#include "megatron/core/datasets/blended_megatron_dataset_builder.h"
#include "megatron/core/datasets/utils.h"
#include "megatron/core/distributed/distributed_data_parallel.h"
#include "megatron/core/distributed/finalize_model_grads.h"
#include "megatron/core/comm/comm_worker.h"
#include "megatron/core/optimizer/distributed_optimizer.h"
#include "megatron/core/comm/init_process_group.h"
#include "megatron/core/parallel_state.h"
#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/optimizer/grad_scaler.h"
#include "megatron/core/optimizer/optimizer.h"
#include "megatron/core/optimizer_param_scheduler.h"
#include "megatron/core/tensor_parallel/random.h"
#include "megatron/core/tokenizers/megatron_tokenizer.h"
#include "megatron/core/transformer/context_parallel.h"
#include "megatron/core/utils/errors.h"
#include "megatron/core/utils/kernel_profile.h"
#include "megatron/training/arguments.h"
#include "megatron/training/checkpoint_args.h"
#include "megatron/training/checkpointing.h"
#include "megatron/training/datasets/data_samplers.h"
#include "megatron/training/gpt_pipeline.h"
#include "megatron/training/gpt_trainable.h"
#include "megatron/training/param_dump.h"
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
// Several processes train on the GPU with NCCL (each rank on cuda:LOCAL_RANK, as Megatron).
// --save/--load work on the GPU too: dist_checkpointing copies device tensors to host buffers to
// write them and copies loaded shards back to the device.
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
  return Device::cuda(static_cast<int>(env_int("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", 0)));
}

// The loader's micro-batches as the model sees them: with context parallelism each rank keeps
// its two sequence chunks (Megatron's get_batch -> get_batch_on_this_cp_rank).
BatchIterator iterator_of(training::GPTDataLoader* loader, int cp_size, int cp_rank) {
  if (!loader) return nullptr;
  return [loader, cp_size, cp_rank]() -> std::optional<datasets::GPTBatch> {
    datasets::GPTBatch b;
    if (!loader->next(b)) return std::nullopt;
    return transformer::get_batch_on_this_cp_rank(b, cp_size, cp_rank);
  };
}

// Rejects the parallel layouts pretrain_gpt does not run yet, naming the flag (never a silent
// no-op).
void check_supported_parallelism(const Arguments& args) {
  for (const auto& t : args.cp_comm_type) {
    if (args.context_parallel_size > 1 && t != "p2p" && t != "a2a")
      user_error("--cp-comm-type ", t, ": only p2p (ring exchange of K/V) and a2a (all-to-all) are implemented");
    if (args.context_parallel_size > 1 && t != args.cp_comm_type.front())
      user_error("--cp-comm-type: one communication type per layer is not supported; give a single value");
  }
  const int64_t cp = std::max<int64_t>(args.context_parallel_size, 1);
  if (args.sequence_parallel && (*args.seq_length / cp) % args.tensor_model_parallel_size != 0)
    user_error("--sequence-parallel: --seq-length / --context-parallel-size (", *args.seq_length / cp,
               ") must be divisible by --tensor-model-parallel-size (", args.tensor_model_parallel_size, ")");
  // MoE: the layer supports EP and expert-TP (megatron/core/transformer/moe/, docs/moe.md), but the
  // training loop does not yet reduce expert gradients over the expert-data-parallel group (nor
  // count them in the grad norm across EP), so a training run needs expert-DP == DP.
  if (args.expert_model_parallel_size > 1)
    user_error("--expert-model-parallel-size ", args.expert_model_parallel_size,
               ": expert parallelism is not available in pretrain_gpt yet (expert-data-parallel gradient reduction); "
               "use --expert-model-parallel-size 1 (docs/moe.md)");
  if (args.num_experts && args.expert_tensor_parallel_size &&
      *args.expert_tensor_parallel_size != args.tensor_model_parallel_size)
    user_error("--expert-tensor-parallel-size ", *args.expert_tensor_parallel_size,
               " different from --tensor-model-parallel-size is not available in pretrain_gpt yet (expert-data-parallel "
               "gradient reduction); drop it (docs/moe.md)");
  if (args.num_experts && args.recompute_granularity == "full")
    user_error("--recompute-granularity full with --num-experts is not implemented in megatron.cpp yet (the router "
               "would count tokens twice); drop it");
}

// --distributed-backend -> init_process_group backend. On the GPU, "nccl" (Megatron's default) is
// NCCL over CUDA tensors; "gloo" (CPU tensors only) is refused. On the CPU, "nccl" maps to the CPU
// backend of the launcher: MPI under mpirun/PMI, TCP under torchrun/megatron_launch ("auto");
// "gloo" is the TCP backend.
std::string backend_for(const std::string& flag, const Device& device, int64_t world_size) {
  if (device.is_cuda() && world_size > 1) {
    if (flag == "gloo")
      user_error("--distributed-backend gloo: the gloo/TCP backend moves CPU tensors only; training on the GPU "
                 "needs --distributed-backend nccl (or MEGATRON_DEVICE=cpu to train on the CPU)");
    return "nccl";
  }
  return flag == "gloo" ? "tcp" : "auto";
}

// Whether --ckpt-format was given on the command line (set in run()).
bool& ckpt_format_given() {
  static bool given = false;
  return given;
}

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
  c.write_torch_dist = a.ckpt_format == "torch_dist" && ckpt_format_given();
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

// Megatron's OptimizerParamScheduler.load_state_dict (_check_and_set of each schedule field):
// with --override-opt_param-scheduler the flags' values stay; with
// --use-checkpoint-opt_param-scheduler the checkpoint's are used (also the default param groups'
// max/min lr); otherwise a value that differs from the checkpoint's is a UserError. Restores
// num_steps. `sd`: the checkpoint's "opt_param_scheduler" object (scheduler_state()).
void load_scheduler_state(OptimizerParamScheduler& sched, optimizer::MegatronOptimizer& opt, const nlohmann::json& sd,
                          const Arguments& args, const std::function<void(const std::string&)>& say) {
  if (args.override_opt_param_scheduler && args.use_checkpoint_opt_param_scheduler)
    user_error("--override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler: give at most one");
  auto text = [](const nlohmann::json& v) {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof(buf), v.get<double>());
    return std::string(buf, r.ptr);
  };
  OptimizerParamScheduler::Options o = sched.options();
  const nlohmann::json mine = scheduler_state(sched);
  auto check_and_set = [&](const char* key, const char* name, auto& field) {
    if (!sd.contains(key)) return;
    const nlohmann::json& ck = sd.at(key);
    if (args.override_opt_param_scheduler) {
      say(std::string(" > overriding ") + name + " value to " + text(mine.at(key)));
      return;
    }
    if (!args.use_checkpoint_opt_param_scheduler && ck != mine.at(key))
      user_error("OptimizerParamScheduler: class input value ", text(mine.at(key)), " and checkpoint value ", text(ck),
                 " for ", name, " do not match; pass --use-checkpoint-opt_param-scheduler to continue the "
                 "checkpoint's schedule or --override-opt_param-scheduler to use the flags' values");
    say(std::string(" > using checkpoint value ") + text(ck) + " for " + name);
    field = ck.get<std::remove_reference_t<decltype(field)>>();
  };
  const double flag_max = o.max_lr, flag_min = o.min_lr;
  check_and_set("max_lr", "learning rate", o.max_lr);
  check_and_set("min_lr", "minimum learning rate", o.min_lr);
  check_and_set("lr_warmup_steps", "warmup iterations", o.lr_warmup_steps);
  check_and_set("lr_decay_steps", "total number of iterations", o.lr_decay_steps);
  check_and_set("lr_decay_style", "learning rate decay style", o.lr_decay_style);
  check_and_set("start_wd", "start weight decay", o.start_wd);
  check_and_set("end_wd", "end weight decay", o.end_wd);
  check_and_set("wd_incr_steps", "total number of weight decay iterations", o.wd_incr_steps);
  check_and_set("wd_incr_style", "weight decay incr style", o.wd_incr_style);
  sched.set_options(o);
  for (auto& g : opt.mutable_param_groups()) {  // groups that follow --lr/--min-lr (not --decoupled-lr)
    if (g.is_decoupled_lr) continue;
    if (g.max_lr == flag_max) g.max_lr = o.max_lr;
    if (g.min_lr == flag_min) g.min_lr = o.min_lr;
  }
  if (sd.contains("num_steps")) sched.set_num_steps(sd.at("num_steps").get<int64_t>());
  opt.apply_schedule(sched);
}

// ---- Checkpointing glue (megatron/training/checkpointing.h) ----
// This rank's position for the checkpoint (DP = the dp-cp group: every rank holding the same
// model piece).
ParallelRanks checkpoint_ranks() {
  namespace ps = parallel_state;
  ParallelRanks r;
  r.tp_rank = ps::get_tensor_model_parallel_rank();
  r.tp_size = ps::get_tensor_model_parallel_world_size();
  r.pp_rank = ps::get_pipeline_model_parallel_rank();
  r.pp_size = ps::get_pipeline_model_parallel_world_size();
  r.dp_rank = ps::get_data_parallel_rank(/*with_context_parallel=*/true);
  r.dp_size = ps::get_data_parallel_world_size(/*with_context_parallel=*/true);
  return r;
}

// Views of the live model parameters and fp32 optimizer state (load writes into them, save reads
// them), in global coordinates whatever the layout.
// `params`: every model chunk's parameters of this rank (virtual pipeline stages: all chunks).
TrainingState training_state(std::vector<Parameter>& params, int64_t num_layers,
                             const optimizer::MegatronOptimizer& opt, const ParallelRanks& ranks,
                             bool distributed_optimizer, bool with_optim) {
  return model_and_optimizer_state(params, opt, num_layers, ranks, distributed_optimizer, with_optim);
}

// Megatron's optimizer.reload_model_params(): after loading weights without optimizer state,
// separate fp32 main params (bf16/fp16 models) start from the loaded weights.
void reload_main_params(optimizer::MegatronOptimizer& opt) {
  const auto& op = opt.params();
  for (size_t j = 0; j < op.size(); ++j) {
    Tensor mp = opt.main_param(j);
    if (mp.data_ptr() != op[j].param.data_ptr()) ops::cast(op[j].param, mp);  // on the params' device (CPU or GPU)
  }
}

// FP8 amax histories and scales of every model chunk (docs/fp8.md), as named extra checkpoint
// tensors. The state is identical on all ranks of the amax group (TP x DP x CP: amaxes are
// max-reduced every step), so only TP rank 0 of DP rank 0 writes it (one copy per pipeline stage).
std::vector<ShardedTensor> fp8_checkpoint_tensors(const std::vector<std::unique_ptr<models::gpt::GPTModel>>& chunks,
                                                  const ParallelRanks& ranks) {
  std::vector<ShardedTensor> out;
  const int replica = (ranks.tp_rank != 0 || ranks.dp_rank != 0) ? 1 : 0;
  for (const auto& m : chunks)
    if (auto* f8 = m->fp8_state())
      for (auto& t : f8->checkpoint_tensors(replica)) out.push_back(std::move(t));
  return out;
}

// Megatron's timers.log(names, barrier=True) for the setup timers: "(min, max) time across ranks
// (ms):" then one line per timer, "    <name + ' ' padded with '.' to 48>: (min, max)", min and
// max over all ranks (megatron/core/timers.py _get_global_min_max_time_string; timers that are 0
// on every rank are left out). Collective over `world`.
std::string setup_timers_string(const std::vector<std::pair<std::string, double>>& ms, comm::ProcessGroup& world) {
  const int64_t n = static_cast<int64_t>(ms.size());
  Tensor lo = Tensor::empty({n}, DType::kFloat64), hi = Tensor::empty({n}, DType::kFloat64);
  for (int64_t i = 0; i < n; ++i) lo.data<double>()[i] = hi.data<double>()[i] = ms[i].second;
  if (world.size() > 1) {
    world.all_reduce(lo, comm::ReduceOp::kMin);
    world.all_reduce(hi, comm::ReduceOp::kMax);
  }
  std::string out = "(min, max) time across ranks (ms):";
  bool any = false;
  for (int64_t i = 0; i < n; ++i) {
    if (hi.data<double>()[i] <= 0.0) continue;
    std::string label = ms[i].first + " ";
    if (label.size() < 48) label.resize(48, '.');
    char buf[160];
    std::snprintf(buf, sizeof(buf), "\n    %s: (%.2f, %.2f)", label.c_str(), lo.data<double>()[i], hi.data<double>()[i]);
    out += buf;
    any = true;
  }
  return any ? out : std::string();
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// MEGATRON_KERNEL_PROFILE=FIRST:LAST (1-based iterations, inclusive) is --profile
// --profile-step-start FIRST-1 --profile-step-end LAST on every rank.
void apply_kernel_profile_env(Arguments& args) {
  const char* v = std::getenv("MEGATRON_KERNEL_PROFILE");
  if (!v || !*v) return;
  const std::string s = v;
  if (s == "off" || s == "0") return;  // the opt-out (see install_kernel_profiler)
  const size_t colon = s.find(':');
  const auto first = colon == std::string::npos ? std::nullopt : parse_whole_integer(std::string_view(s).substr(0, colon));
  const auto last = colon == std::string::npos ? std::nullopt : parse_whole_integer(std::string_view(s).substr(colon + 1));
  if (!first || !last || *first < 1 || *last < *first)
    user_error("MEGATRON_KERNEL_PROFILE=", s, ": expected FIRST:LAST, 1-based iterations with 1 <= FIRST <= LAST (e.g. 3:5)");
  args.profile = true;
  args.profile_step_start = *first - 1;
  args.profile_step_end = *last;
  args.profile_ranks.clear();
  for (int64_t r = 0; r < args.world_size; ++r) args.profile_ranks.push_back(r);
}

// GPU kernel profiler for the --profile window (docs/performance.md): per-rank table on stdout
// and JSON in $MEGATRON_KERNEL_PROFILE_OUT (a folder), else --tensorboard-dir, else ".".
void install_kernel_profiler(const Arguments& args, const Device& device, TrainingHooks& hooks) {
  if (!args.profile) return;
  if (!device.is_cuda()) {
    if (std::getenv("MEGATRON_KERNEL_PROFILE") && args.rank == 0)
      std::fprintf(stderr, "warning: MEGATRON_KERNEL_PROFILE: the kernel profiler needs a CUDA device (this run is on "
                           "the CPU); only --profile's timer trace is written\n");
    return;
  }
  if (std::find(args.profile_ranks.begin(), args.profile_ranks.end(), args.rank) == args.profile_ranks.end()) return;
  if (const char* v = std::getenv("MEGATRON_KERNEL_PROFILE"); v && (std::string(v) == "off" || std::string(v) == "0"))
    return;
  // Under nsys / ncu (they attach through CUDA_INJECTION64_PATH) CUPTI belongs to them: --profile
  // then only marks the window with NVTX ranges, as before.
  if (const char* inj = std::getenv("CUDA_INJECTION64_PATH"); inj && *inj) {
    std::fprintf(stderr, "note: [Rank %lld] kernel profile off: another CUDA profiler is attached (CUDA_INJECTION64_PATH "
                         "is set); --profile marks its window with NVTX ranges\n", static_cast<long long>(args.rank));
    return;
  }
  std::shared_ptr<profiling::KernelProfiler> prof = profiling::make_kernel_profiler();
  if (!prof) return;
  auto on = std::make_shared<bool>(false);
  hooks.profile_start = [prof, on](int64_t first) { *on = prof->start(first); };
  const int rank = static_cast<int>(args.rank);
  std::string dir = args.tensorboard_dir.value_or(".");
  if (const char* o = std::getenv("MEGATRON_KERNEL_PROFILE_OUT"); o && *o) dir = o;
  hooks.profile_stop = [prof, on, rank, dir](int64_t last) {
    if (!*on) return;
    *on = false;
    const profiling::ProfileSummary s = prof->stop(last, rank);
    const std::string text = profiling::format_summary(s);
    std::fputs(text.c_str(), stdout);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    const std::string path = dir + "/kernel_profile_rank" + std::to_string(rank) + ".json";
    profiling::write_summary_json(s, path);
    std::printf("[Rank %d] kernel profile | wrote %s\n", rank, path.c_str());
    std::fflush(stdout);
  };
}

// Evaluation only: an optimizer over no parameters (the Trainer's interface needs one; it holds
// nothing) and a constant schedule (--lr/--train-iters are not required with --skip-train).
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

// One line per rank with the bytes this rank allocated for the model's parameters, its gradient
// buffer and the optimizer state (fp32 main params separate from the model's + Adam moments or SGD momentum):
// shows what --skip-train saves (no Megatron counterpart).
void print_allocated_bytes(const Arguments& args, const std::vector<std::unique_ptr<models::gpt::GPTModel>>& chunks,
                           const optimizer::MegatronOptimizer& opt) {
  int64_t params = 0, grads = 0, state = 0;
  auto bytes = [](const Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(dtype_size(t.dtype())) : 0; };
  for (const auto& m : chunks) {
    params += m->buffers().param_bytes_held();  // FP8 weights: FP8 bytes (+ model-dtype copy until released)
    grads += bytes(m->grad_buffer());
  }
  for (size_t j = 0; j < opt.params().size(); ++j) {
    if (!opt.main_param(j).shares_storage(opt.params()[j].param)) state += bytes(opt.main_param(j));
    state += bytes(opt.exp_avg(j)) + bytes(opt.exp_avg_sq(j)) + bytes(opt.momentum_buffer(j));  // undefined: 0
  }
  std::printf("[Rank %lld] allocated bytes: parameters %lld | main grads %lld | optimizer state %lld\n",
              static_cast<long long>(args.rank), static_cast<long long>(params), static_cast<long long>(grads),
              static_cast<long long>(state));
  std::fflush(stdout);
}

int run(int argc, char** argv) {
  Arguments args = parse_args(argc, argv);
  {
    const comm::LaunchEnv env = comm::detect_launch_env();
    args.world_size = env.world_size;
    args.rank = env.rank;
  }
  apply_kernel_profile_env(args);
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
      ", context-parallel size: " + std::to_string(args.context_parallel_size) +
      ", hierarchical context-parallel sizes: None" +
      ", tensor-model-parallel size: " + std::to_string(args.tensor_model_parallel_size) +
      ", pipeline-model-parallel size: " + std::to_string(args.pipeline_model_parallel_size));
  // Validated before the notes, so a rejected flag is not first announced as accepted.
  validate_args(args);
  for (const auto& m : args.messages) say(m);
  if (args.rank == 0)
    for (const auto& w : args.warnings) std::cerr << "UserWarning: " << w << "\n";
  std::set<std::string> noted;
  for (const auto& [flag, note] : args.notes) {
    if (noted.insert(flag).second) say("note: " + flag + " is accepted: " + note);
  }
  // --ckpt-format torch_dist on the command line writes Megatron-LM's torch_dist (PyTorch DCP)
  // files; without the flag our own layout is written (loading detects either format).
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--ckpt-format" || std::string(argv[i]).rfind("--ckpt-format=", 0) == 0)
      ckpt_format_given() = true;
  if (args.ckpt_format != "torch_dist" && (args.save || args.load))
    say("note: --ckpt-format " + args.ckpt_format + " is accepted, but megatron.cpp writes its own distributed "
        "checkpoint layout for it (per-rank safetensors files + metadata; docs/checkpointing.md)");
  if (args.profile) {  // a window that can never open would silently profile nothing
    if (args.profile_step_start < 0 || (args.train_iters && args.profile_step_start >= *args.train_iters))
      say("warning: --profile-step-start " + std::to_string(args.profile_step_start) + " is outside [0, --train-iters " +
          std::to_string(args.train_iters.value_or(0)) + "): nothing will be profiled");
    bool any_rank = false;
    for (int64_t r : args.profile_ranks) any_rank = any_rank || (r >= 0 && r < args.world_size);
    if (!any_rank) say("warning: --profile-ranks names no rank of this run (world size " +
                       std::to_string(args.world_size) + "): nothing will be profiled");
  }
  // Checkpoint I/O settings are checked now, not at the first save hours into the run.
  if (args.save || args.load) (void)dist_checkpointing::io_options_from_env();
  check_supported_parallelism(args);

  // --deterministic-mode (Megatron's): the CUDA backend reduces in a fixed order (no atomics), read
  // from the environment at its first use (megatron/core/ops/cuda/deterministic.h); the CPU
  // kernels are deterministic anyway.
  if (args.deterministic_mode) ::setenv("MEGATRON_DETERMINISTIC", "1", 1);

  // Process groups (Megatron's initialize_megatron: init_process_group + initialize_model_parallel).
  const Device device = choose_device(args, say);
  comm::InitOptions io;
  io.backend = backend_for(args.distributed_backend, device, args.world_size);
  io.timeout = std::chrono::minutes(args.distributed_timeout_minutes);
  auto world = comm::init_process_group(io);
  namespace ps = parallel_state;
  ps::ParallelConfig pc;
  pc.tensor_model_parallel_size = static_cast<int>(args.tensor_model_parallel_size);
  pc.pipeline_model_parallel_size = static_cast<int>(args.pipeline_model_parallel_size);
  pc.context_parallel_size = static_cast<int>(args.context_parallel_size);
  if (args.virtual_pipeline_model_parallel_size)
    pc.virtual_pipeline_model_parallel_size = static_cast<int>(*args.virtual_pipeline_model_parallel_size);
  pc.expert_model_parallel_size = static_cast<int>(args.expert_model_parallel_size);
  pc.expert_tensor_parallel_size = static_cast<int>(args.expert_tensor_parallel_size.value_or(0));
  ps::initialize_model_parallel(world, pc);
  const int tp_rank = ps::get_tensor_model_parallel_rank();
  const int pp_rank = ps::get_pipeline_model_parallel_rank();
  auto dp_group = ps::get_data_parallel_group(/*with_context_parallel=*/true);

  // The arguments block (Megatron's _print_args, at the end of validate_args), then the tokenizer
  // and vocab padding (build_tokenizer runs after it).
  say(format_args(args));
  say("> building " + args.tokenizer.tokenizer_type + " tokenizer ...");
  std::shared_ptr<tokenizers::MegatronTokenizer> tokenizer = tokenizers::build_tokenizer(args.tokenizer);
  say(set_padded_vocab_size(args, tokenizer->vocab_size()));

  // Model, optimizer, scheduler (Megatron's 'model-and-optimizer-setup' timer, started after a
  // barrier, covers setup_model_and_optimizer including the checkpoint load).
  world->barrier();
  const auto model_setup_start = std::chrono::steady_clock::now();
  tensor_parallel::set_use_cpu_initialization(
      std::any_of(args.notes.begin(), args.notes.end(), [](const auto& n) { return n.first == "--use-cpu-initialization"; }));
  say("building GPT model ...");
  if (device.is_cuda()) say("> training on cuda:" + std::to_string(device.index) + " (MEGATRON_DEVICE=cpu forces the CPU)");
  // This pipeline rank's model chunks: one, or one per virtual stage (interleaved schedule);
  // layers split evenly as Megatron's (megatron/training/gpt_pipeline.h).
  const int pp_size = static_cast<int>(args.pipeline_model_parallel_size);
  const int vp_size = static_cast<int>(args.virtual_pipeline_model_parallel_size.value_or(1));
  std::vector<std::unique_ptr<models::gpt::GPTModel>> chunks;
  // --skip-train (evaluation only): the model's parameters and nothing else -- no gradient
  // buffer, DDP, fp32 main params or optimizer state. (Megatron's setup_model_and_optimizer builds
  // them anyway; LLaMA-3 8B in bf16 is then 16 GB instead of ~144 GB, so one GPU evaluates it.)
  const bool eval_only = args.skip_train;
  if (eval_only) say("> evaluation only (--skip-train): no gradient buffers, DDP or optimizer state are allocated");
  for (const PipelineChunk& c : pipeline_chunks(*args.num_layers, pp_size, pp_rank, vp_size,
                                                           args.decoder_first_pipeline_num_layers,
                                                           args.decoder_last_pipeline_num_layers)) {
    models::gpt::GPTModelParallel par;
    par.tp_group = ps::get_tensor_model_parallel_group();
    par.pp_rank = pp_rank;
    par.cp_group = ps::get_context_parallel_group();
    par.cp_comm_type = args.cp_comm_type.front();
    par.pre_process = c.pre_process;
    par.post_process = c.post_process;
    par.layer_offset = c.layer_offset;
    par.num_layers = c.num_layers;
    par.allocate_main_grads = !eval_only;
    chunks.push_back(std::make_unique<models::gpt::GPTModel>(core_transformer_config_from_args(args),
                                                             args.padded_vocab_size, *args.max_position_embeddings,
                                                             static_cast<uint64_t>(args.seed), device, par));
  }
  models::gpt::GPTModel& model = *chunks.front();
  std::vector<Parameter> all_params;  // views; checkpointing sees every chunk
  for (auto& m : chunks) all_params.insert(all_params.end(), m->parameters().begin(), m->parameters().end());
  int64_t nparams = 0;
  for (auto& m : chunks)
    for (auto& p : m->parameters()) nparams += p.data.numel();
  // Megatron prints this on data-parallel rank 0 of every model-parallel rank.
  if (ps::get_data_parallel_rank(true) == 0) {
    std::printf(" > number of parameters on (tensor, pipeline) model parallel rank (%d, %d): %lld\n", tp_rank,
                pp_rank, static_cast<long long>(nparams));
    std::fflush(stdout);
  }
  world->barrier();
  GPTTrainable trainable(model);
  // DDP over the dp-cp group (Megatron's DistributedDataParallel wrapper): grads pre-scaled by
  // 1/(DP x CP) and summed (none with --calculate-per-token-loss), reduce-scattered with
  // --use-distributed-optimizer.
  distributed::DistributedDataParallelConfig dc;
  dc.overlap_grad_reduce = args.overlap_grad_reduce;
  dc.overlap_param_gather = args.overlap_param_gather;
  dc.use_distributed_optimizer = args.use_distributed_optimizer;
  dc.bucket_size = args.ddp_bucket_size;
  dc.calculate_per_token_loss = args.calculate_per_token_loss;
  dc.shared_embedding_own_bucket = pp_size > 1 && !args.untie_embeddings_and_output_weights;
  // One DDP per model chunk; with virtual stages only the first chunk is bucketed (Megatron).
  std::vector<std::unique_ptr<distributed::DistributedDataParallel>> ddps;
  std::vector<distributed::DistributedDataParallel*> ddp_ptrs;
  std::vector<optimizer::OptimizerParam> opt_params;
  for (size_t c = 0; c < (eval_only ? 0 : chunks.size()); ++c) {
    distributed::DistributedDataParallelConfig cc = dc;
    if (c > 0) cc.bucket_size = std::numeric_limits<int64_t>::max();  // one bucket
    ddps.push_back(std::make_unique<distributed::DistributedDataParallel>(cc, chunks[c]->buffers(),
                                                                          chunks[c]->parameters(), dp_group));
    ddp_ptrs.push_back(ddps.back().get());
    auto op = args.use_distributed_optimizer ? optimizer::distributed_optimizer_params(*ddps.back())
                                             : optimizer::optimizer_params(chunks[c]->parameters());
    opt_params.insert(opt_params.end(), op.begin(), op.end());
  }
  // Grad norm / zero counts: over the model-parallel group (grads are equal across DP), or with
  // the distributed optimizer over DP x model-parallel (each rank holds disjoint slices);
  // TP-duplicated parameters count on TP rank 0 only, the tied embedding's copy not at all.
  optimizer::MegatronOptimizer opt(eval_only ? eval_only_optimizer_config(args) : optimizer_config_from_args(args),
                                   std::move(opt_params),
                                   args.use_distributed_optimizer ? ps::get_world_group() : ps::get_model_parallel_group(),
                                   tp_rank);
  OptimizerParamScheduler sched(eval_only ? eval_only_scheduler_options() : scheduler_options_from_args(args));

  // Checkpoint (Megatron's load_checkpoint in setup_model_and_optimizer, before the data loaders
  // so they resume at consumed_train_samples).
  // The checkpoint's args: every argument (Megatron saves its whole args namespace), so that a
  // --load with other architecture flags is refused and converters read the architecture.
  // vocab_size: --vocab-size, else the tokenizer's (the unpadded size an HF export needs).
  nlohmann::json run_args = checkpoint_args(args);
  if (run_args.value("vocab_size", nlohmann::json()).is_null()) run_args["vocab_size"] = tokenizer->vocab_size();
  CheckpointConfig ckpt_cfg = checkpoint_config_from_args(args);
  ckpt_cfg.expected_args = run_args;
  const ParallelRanks ranks = checkpoint_ranks();
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
    TrainingState st = training_state(all_params, *args.num_layers, opt, ranks, args.use_distributed_optimizer,
                                      /*with_optim=*/!eval_only && !args.no_load_optim && !args.finetune);
    st.extra = fp8_checkpoint_tensors(chunks, ranks);
    loaded = load_checkpoint(st, ckpt_cfg, ranks, world.get());
    if (loaded.loaded && !args.finetune && !st.extra.empty()) {
      // FP8 state present in the checkpoint replaces the fresh one (a bf16 checkpoint has none).
      std::vector<std::string> got;
      for (const auto& t : st.extra)
        if (std::find(loaded.missing_extra.begin(), loaded.missing_extra.end(), t.key) == loaded.missing_extra.end())
          got.push_back(t.key);
      for (auto& m : chunks)
        if (auto* f8 = m->fp8_state()) f8->restore_checkpoint_tensors(st.extra, got);
    }
    if (loaded.loaded && loaded.optimizer_loaded && !eval_only) {  // eval only: no optimizer, no schedule
      const auto& c = loaded.optimizer_common;
      if (c.contains("step")) opt.set_step_count(c.at("step").get<int64_t>());
      if (auto* d = dynamic_cast<optimizer::DynamicGradScaler*>(opt.grad_scaler()); d && c.contains("grad_scaler")) {
        const auto& g = c.at("grad_scaler");
        d->load_state(g.at("scale").get<double>(), g.at("growth_tracker").get<int>(),
                      g.at("hysteresis_tracker").get<int>());
      }
      load_scheduler_state(sched, opt, loaded.opt_param_scheduler, args, say);
    }
    if (loaded.loaded && !loaded.optimizer_loaded) reload_main_params(opt);
    if (loaded.loaded && loaded.rng_loaded) {
      // Dropout stream position of every model chunk (virtual stages: one stream per chunk).
      const auto& r = loaded.rng_state;
      if (r.contains("dropout_rng_offsets") && r["dropout_rng_offsets"].size() == chunks.size()) {
        for (size_t c = 0; c < chunks.size(); ++c) chunks[c]->set_rng_offset(r["dropout_rng_offsets"][c].get<uint64_t>());
      } else if (r.contains("dropout_rng_offset")) {
        model.set_rng_offset(r.at("dropout_rng_offset").get<uint64_t>());
      }
    }
  }

  // --fp8-param-gather: the first cast of the FP8 primary weights (Megatron casts them at model
  // initialization, TE's fp8_model_init; here after a checkpoint load too, with the restored
  // scales), and their first all-gather. Records the weights' amax for the first step, as the
  // first forward would without the flag.
  // Then the FP8 weights' model-dtype copy is freed: as in Megatron/TE the FP8 weight is the model
  // parameter; its full-precision values are the optimizer's fp32 main shards, from which a
  // checkpoint save or a parameter dump rebuilds the model-dtype values temporarily.
  if (args.fp8_param_gather && args.use_distributed_optimizer) {
    for (auto* d : ddp_ptrs) d->start_param_sync();
    for (auto* d : ddp_ptrs) d->finish_param_sync();
    for (auto* d : ddp_ptrs) d->release_model_dtype_fp8_params();
  }
  print_allocated_bytes(args, chunks, opt);

  // Megatron's timers synchronize the device at stop: a one-element copy to the host waits for
  // the stream (initialization kernels and copies belong to the setup time).
  if (device.is_cuda()) (void)Tensor::zeros({1}, DType::kFloat32, device).to(Device::cpu());
  const double model_setup_ms = ms_since(model_setup_start);
  say("[after model, optimizer, and learning rate scheduler are built] datetime: " +
      format_log_timestamp(std::chrono::system_clock::now()) + " ");

  // Data (pretrain_gpt.py train_valid_test_datasets_provider); Megatron's
  // 'train/valid/test-data-iterators-setup' timer, started after a barrier.
  world->barrier();
  const auto data_setup_start = std::chrono::steady_clock::now();
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
  const int cp_size = ps::get_context_parallel_world_size(), cp_rank = ps::get_context_parallel_rank();
  BatchIterator train_it = iterator_of(train_loader.get(), cp_size, cp_rank);
  BatchIterator valid_it = iterator_of(valid_loader.get(), cp_size, cp_rank);
  BatchIterator test_it = iterator_of(test_loader.get(), cp_size, cp_rank);
  if (!train_it && !args.skip_train) user_error("no training data (check --data-path/--split)");
  const double data_setup_ms = ms_since(data_setup_start);
  say("[after dataloaders are built] datetime: " + format_log_timestamp(std::chrono::system_clock::now()) + " ");
  say("done with setup ...");
  {
    world->barrier();
    const std::string t = setup_timers_string(
        {{"model-and-optimizer-setup", model_setup_ms}, {"train/valid/test-data-iterators-setup", data_setup_ms}}, *world);
    if (args.rank == args.world_size - 1 && !t.empty()) {  // Megatron's timers.log prints on the last rank
      std::fputs((t + "\n").c_str(), stdout);
      std::fflush(stdout);
    }
  }

  std::function<void(const std::string&)> printer;  // default: stdout (print_rank_last)
  if (args.rank != args.world_size - 1) printer = [](const std::string&) {};
  // TensorBoard: written by the last rank, as Megatron's get_tensorboard_writer.
  std::unique_ptr<SummaryWriter> writer;
  TrainingHooks hooks;
  if (args.tensorboard_dir && args.rank == args.world_size - 1) {
    say("> setting tensorboard ...");
    writer = std::make_unique<SummaryWriter>(*args.tensorboard_dir, 120.0, args.tensorboard_queue_size);
    hooks.add_scalar = [&writer](const std::string& tag, double v, int64_t step) { writer->add_scalar(tag, v, step); };
    hooks.flush = [&writer] { writer->flush(); };
  }
  hooks.zero_grad = [&ddp_ptrs, &trainable] {
    for (auto* d : ddp_ptrs) d->zero_grad_buffer();
    trainable.begin_step();
  };
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
  hooks.finalize_model_grads = [&ddp_ptrs, fg, &args, &chunks, amax_group](double num_tokens) {
    if (args.calculate_per_token_loss) {
      Tensor n = Tensor::from_vector({static_cast<float>(num_tokens)}, {1});
      distributed::finalize_model_grads(ddp_ptrs, fg, &n);
    } else {
      distributed::finalize_model_grads(ddp_ptrs, fg);
    }
    for (auto& m : chunks)
      if (auto* f8 = m->fp8_state()) f8->reduce_and_update(amax_group.get());
  };
  if (args.use_distributed_optimizer) {
    hooks.after_optimizer_step = [&ddp_ptrs] {
      for (auto* d : ddp_ptrs) d->start_param_sync();
      for (auto* d : ddp_ptrs) d->finish_param_sync();
    };
  }
  // --overlap-grad-reduce: backward reports finished parameters to DDP, which launches a
  // bucket's reduction as soon as the bucket is complete.
  auto grad_ready_of = [](distributed::DistributedDataParallel* d) {
    return [d](const std::vector<size_t>& ready) {
      for (size_t i : ready) d->register_grad_ready(i);
    };
  };
  if (args.overlap_grad_reduce && !eval_only) trainable.set_grad_ready(grad_ready_of(ddp_ptrs.front()), num_microbatches(args));
  // Pipeline parallelism: the schedule runs the micro-batches (Megatron's forward_backward_func).
  std::unique_ptr<GPTPipeline> pipeline;
  if (pp_size > 1) {
    std::vector<models::gpt::GPTModel*> raw;
    for (auto& m : chunks) raw.push_back(m.get());
    const int64_t tp = args.tensor_model_parallel_size;
    // Activations between stages: this rank's sequence share, [s/(CP*TP if SP), mbs, h].
    const int64_t s_cp = *args.seq_length / std::max<int64_t>(args.context_parallel_size, 1);
    const int64_t s_local = args.sequence_parallel ? s_cp / tp : s_cp;
    pipeline = std::make_unique<GPTPipeline>(raw, ps::get_pipeline_model_parallel_group(),
                                             Shape{s_local, *args.micro_batch_size, *args.hidden_size},
                                             model.config().params_dtype, device, num_microbatches(args),
                                             args.calculate_per_token_loss,
                                             args.microbatch_group_size_per_vp_stage.value_or(0));
    if (args.overlap_grad_reduce)
      for (size_t c = 0; c < ddp_ptrs.size(); ++c) pipeline->set_grad_ready(c, grad_ready_of(ddp_ptrs[c]));
    hooks.forward_backward = [&pipeline](BatchIterator& data, bool forward_only, double loss_scale) {
      return pipeline->forward_backward(data, forward_only, loss_scale);
    };
  }
  if (cp_size > 1) {
    // Loss normalisation over the whole sequence: its tokens are spread over the CP ranks.
    auto cp_group = ps::get_context_parallel_group();
    hooks.microbatch_loss_tokens = [cp_group, cp_size](double local_tokens) {
      Tensor t = Tensor::empty({1}, DType::kFloat64);
      t.data<double>()[0] = local_tokens;
      cp_group->all_reduce(t, comm::ReduceOp::kSum);
      return std::max(t.data<double>()[0], 1.0) / static_cast<double>(cp_size);
    };
    if (pipeline) pipeline->set_microbatch_loss_tokens(hooks.microbatch_loss_tokens);
  }
  if (dp_group->size() > 1) {
    hooks.reduce_loss = [dp_group](LossReport& r) {
      Tensor t = Tensor::empty({2}, DType::kFloat64);
      double* p = t.data<double>();
      p[0] = r.loss_sum;
      p[1] = r.num_tokens;
      dp_group->all_reduce(t, comm::ReduceOp::kSum);
      r.loss_sum = p[0];
      r.num_tokens = p[1];
    };
  }
  Trainer* trainer_ptr = nullptr;
  if (args.save) {
    hooks.save_checkpoint = [&](int64_t iteration) {
      // --fp8-param-gather: the FP8 weights' model-dtype values are current on this rank's shard
      // only; gather them so the checkpoint's model weights are what a run without the flag saves.
      if (args.fp8_param_gather)
        for (auto* d : ddp_ptrs) d->gather_model_dtype_params();
      TrainingState st = training_state(all_params, *args.num_layers, opt, ranks, args.use_distributed_optimizer,
                                        /*with_optim=*/!args.no_save_optim);
      st.extra = fp8_checkpoint_tensors(chunks, ranks);
      st.optimizer_common = optimizer_common();
      st.opt_param_scheduler = scheduler_state(sched);
      nlohmann::json offsets = nlohmann::json::array();
      for (const auto& m : chunks) offsets.push_back(m->rng_offset());
      st.rng_state = {{"seed", args.seed}, {"dropout_rng_offset", model.rng_offset()}, {"dropout_rng_offsets", offsets}};
      const TrainCounters& c = trainer_ptr->state();
      st.iteration = iteration;
      st.consumed_train_samples = c.consumed_train_samples;
      st.consumed_valid_samples = c.consumed_valid_samples;
      st.num_floating_point_operations_so_far = c.floating_point_operations_so_far;
      st.args = run_args;
      st.args.update(nlohmann::json{{"num_layers", args.num_layers.value_or(0)}, {"hidden_size", args.hidden_size.value_or(0)},
                 {"num_attention_heads", args.num_attention_heads.value_or(0)}, {"seq_length", *args.seq_length},
                 {"padded_vocab_size", args.padded_vocab_size}, {"micro_batch_size", *args.micro_batch_size},
                 {"global_batch_size", *args.global_batch_size}, {"seed", args.seed},
                 {"tensor_model_parallel_size", args.tensor_model_parallel_size},
                 {"pipeline_model_parallel_size", args.pipeline_model_parallel_size},
                 {"data_parallel_size", ranks.dp_size},
                 {"use_distributed_optimizer", args.use_distributed_optimizer}});
      // --async-save: returns after the snapshot; the write overlaps the next iterations.
      // Megatron's save_checkpoint_and_time: the time training was blocked, on the last rank.
      Timers& timers = trainer_ptr->timers();
      timers("save-checkpoint", 0).start();
      save_checkpoint(st, ckpt_cfg, ranks, world.get());  // an async save has copied the tensors
      if (args.fp8_param_gather)
        for (auto* d : ddp_ptrs) d->release_model_dtype_fp8_params();
      timers("save-checkpoint", 0).stop();
      const std::string line = timers.log_string({"save-checkpoint"});
      if (args.rank == args.world_size - 1 && !line.empty()) {
        std::fputs((line + "\n").c_str(), stdout);
        std::fflush(stdout);
      }
    };
    if (args.async_save) {
      // Publish a finished background save at the start of the next iteration (all ranks agree
      // that every write is done; Megatron's maybe_finalize_async_save(blocking=False)).
      hooks.zero_grad = [zero = hooks.zero_grad, w = world.get()] {
        maybe_finalize_async_save(w, /*blocking=*/false);
        zero();
      };
    }
  }
  if (world->size() > 1) {
    hooks.any_rank = [w = world.get()](bool flag) {
      Tensor t = Tensor::from_vector({flag ? 1.0f : 0.0f}, {1});
      w->all_reduce(t, comm::ReduceOp::kMax)->wait();
      return t.to_float_vector()[0] > 0.5f;
    };
    hooks.barrier = [w = world.get()] { w->barrier(); };
    hooks.all_gather_times = [w = world.get()](const std::vector<double>& local) {
      const int64_t n = static_cast<int64_t>(local.size());
      Tensor in = Tensor::empty({n}, DType::kFloat64), out = Tensor::empty({n * w->size()}, DType::kFloat64);
      std::copy(local.begin(), local.end(), in.data<double>());
      w->all_gather(in, out)->wait();
      return std::vector<double>(out.data<double>(), out.data<double>() + n * w->size());
    };
  }
  hooks.memory_stats = [device] { return memory_stats(device.type, device.is_cuda() ? device.index : 0); };
  // Megatron's report_memory: every data-parallel rank 0 prints "[Rank r] ... memory (MB) | ...";
  // on a GPU the allocator/pool fields, on the CPU the resident set.
  hooks.report_memory = [&args, device, dp0 = ps::get_data_parallel_rank() == 0](const std::string& name) {
    if (!dp0) return;
    const std::string line =
        memory_report(name, static_cast<int>(args.rank), device.is_cuda() ? device.index : -1) + "\n";
    std::fputs(line.c_str(), stdout);
    std::fflush(stdout);
  };
  install_kernel_profiler(args, device, hooks);
  Trainer trainer(args, trainable, opt, sched, hooks, printer);
  trainer_ptr = &trainer;
  if (loaded.loaded) {
    trainer.state().iteration = loaded.iteration;
    trainer.state().consumed_train_samples = loaded.consumed_train_samples;
    trainer.state().consumed_valid_samples = loaded.consumed_valid_samples;
    trainer.state().floating_point_operations_so_far = loaded.num_floating_point_operations_so_far;
  }
  trainer.pretrain(train_it, valid_it ? &valid_it : nullptr, test_it ? &test_it : nullptr);
  if (const char* dump = std::getenv("MEGATRON_DUMP_PARAMS")) {  // parallel-equivalence tests
    if (args.fp8_param_gather)  // the FP8 weights' model-dtype values: whole and current
      for (auto* d : ddp_ptrs) d->gather_model_dtype_params();
    std::vector<models::gpt::GPTModel*> raw;
    for (auto& m : chunks) raw.push_back(m.get());
    dump_parameters(dump, pp_rank, raw, *ps::get_tensor_model_parallel_group(),
                    tp_rank == 0 && ps::get_data_parallel_rank(true) == 0);
    if (args.fp8_param_gather)
      for (auto* d : ddp_ptrs) d->release_model_dtype_fp8_params();
  }
  maybe_finalize_async_save(world.get(), /*blocking=*/true);  // a pending --async-save completes before exit
  world->barrier();
  ps::destroy_model_parallel();
  comm::destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
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
