#include "megatron/training/initialize.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <set>

#include "megatron/core/comm/init_process_group.h"
#include "megatron/core/dist_checkpointing/file_utils.h"
#include "megatron/core/ops/deterministic.h"
#include "megatron/core/parallel_state.h"
#include "megatron/core/utils/errors.h"
#include "megatron/core/utils/parse.h"
#include "megatron/training/checkpointing.h"
#include "megatron/training/config_from_args.h"

namespace megatron::training {

namespace {

int64_t env_int(const char* a, const char* b, int64_t dflt) {
  for (const char* n : {a, b}) {
    if (const char* v = std::getenv(n)) return std::atoll(v);
  }
  return dflt;
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

}  // namespace

void print_rank_0(const Arguments& args, const std::string& line) {
  if (args.rank != 0) return;
  std::fputs(line.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

void print_rank_last(const Arguments& args, const std::string& line) {
  if (args.rank != args.world_size - 1) return;
  std::fputs(line.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

// MEGATRON_DEVICE=cpu forces the CPU (also with a GPU); MEGATRON_DEVICE=cuda demands a GPU.
// Several processes train on the GPU with NCCL (each rank on cuda:LOCAL_RANK, as Megatron).
// --save/--load work on the GPU too: dist_checkpointing copies device tensors to host buffers to
// write them and copies loaded shards back to the device.
Device choose_device(const std::string& w, int local_rank, const std::string& source) {
  if (!w.empty() && w != "cpu" && w != "cuda")
    user_error(source, w, ": unknown device (use cpu or cuda, or leave it unset for GPU when present)");
  if (w == "cpu") return Device::cpu();
  const bool have_cuda = backend_available(DeviceType::kCUDA);
  if (w == "cuda" && !have_cuda)
    user_error(source, "cuda: no usable CUDA device (this build has no CUDA backend or no GPU is visible)");
  if (!have_cuda) return Device::cpu();
  return Device::cuda(local_rank);
}

MegatronRuntime initialize_megatron(int argc, char** argv) {
  MegatronRuntime rt;
  Arguments& args = rt.args;
  std::vector<std::string> argv_list(argv + 1, argv + argc);
  args = parse_args(argv_list);
  const comm::LaunchEnv env = comm::detect_launch_env();
  // Megatron's parse_and_validate_args: --use-checkpoint-args takes the checkpoint's model
  // arguments before validate_args (checkpointing.h load_args_from_checkpoint).
  if (args.use_checkpoint_args) {
    std::vector<std::string> lines;
    args = load_args_from_checkpoint(argv_list, args, lines);
    if (env.rank == 0)
      for (const auto& l : lines) std::printf("%s\n", l.c_str());
    std::fflush(stdout);
  }
  args.world_size = env.world_size;
  args.rank = env.rank;
  apply_kernel_profile_env(args);
  // Megatron prints most setup lines on rank 0 (print_rank_0) and the training/validation log
  // lines on the last rank (print_rank_last).
  auto say = [&](const std::string& s) { print_rank_0(args, s); };
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
      rt.ckpt_format_given = true;
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

  // --deterministic-mode (Megatron's): the CUDA backend reduces in a fixed order (no atomics);
  // the CPU kernels are deterministic anyway.
  if (args.deterministic_mode) ops::set_deterministic_mode(true);

  // Process groups (Megatron's _initialize_distributed: init_process_group +
  // initialize_model_parallel).
  const char* want = std::getenv("MEGATRON_DEVICE");
  rt.device = choose_device(want ? want : "", static_cast<int>(env_int("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", 0)),
                            "MEGATRON_DEVICE=");
  comm::InitOptions io;
  io.backend = backend_for(args.distributed_backend, rt.device, args.world_size);
  io.timeout = std::chrono::minutes(args.distributed_timeout_minutes);
  rt.world = comm::init_process_group(io);
  parallel_state::initialize_model_parallel(rt.world, parallel_config_from_args(args));

  // The arguments block (Megatron's _print_args, at the end of validate_args), then the tokenizer
  // and vocab padding (build_tokenizer runs after it).
  say(format_args(args));
  say("> building " + args.tokenizer.tokenizer_type + " tokenizer ...");
  rt.tokenizer = tokenizers::build_tokenizer(args.tokenizer);
  if (const std::string l = set_padded_vocab_size(args, rt.tokenizer->vocab_size()); !l.empty()) say(l);
  return rt;
}

}  // namespace megatron::training
