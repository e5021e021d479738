// Megatron's initialize_megatron (megatron/training/initialize.py) for pretrain_gpt: flags,
// validate_args with its notes and warnings, the device, the process groups, the arguments block,
// the tokenizer and the padded vocabulary. Also print_rank_0 / print_rank_last
// (megatron/training/utils.py).
#pragma once

#include <memory>
#include <string>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/tensor/tensor.h"
#include "megatron/core/tokenizers/megatron_tokenizer.h"
#include "megatron/training/arguments.h"

namespace megatron::training {

/// What initialize_megatron sets up (Megatron keeps these in its global variables: get_args(),
/// the default process group, get_tokenizer()).
struct MegatronRuntime {
  Arguments args;  ///< validated, rank / world_size from the launcher, padded_vocab_size set
  Device device;   ///< where this rank trains (choose_device)
  std::shared_ptr<comm::ProcessGroup> world;
  std::shared_ptr<tokenizers::MegatronTokenizer> tokenizer;
  /// --ckpt-format was given on the command line (then torch_dist writes Megatron-LM's files).
  bool ckpt_format_given = false;
};

/// Megatron's initialize_megatron: parse_args(argv); with --use-checkpoint-args the checkpoint's
/// model arguments (checkpointing.h load_args_from_checkpoint; its lines printed on rank 0); rank
/// and world size from the launcher (torchrun / mpirun / megatron_launch); MEGATRON_KERNEL_PROFILE=FIRST:LAST as --profile
/// --profile-step-start FIRST-1 --profile-step-end LAST on every rank; prints "using world size:
/// ..." then validate_args and its messages, UserWarnings (stderr) and "note: <flag> is accepted:"
/// lines; checks the checkpoint I/O environment (with --save/--load) and the parallel layouts
/// pretrain_gpt runs; --deterministic-mode (ops::set_deterministic_mode); init_process_group
/// (--distributed-backend, --distributed-timeout-minutes) and initialize_model_parallel; the
/// arguments block; build_tokenizer and the padded vocabulary line. Prints on rank 0.
/// Throws UserError for bad flags or environment (naming them).
MegatronRuntime initialize_megatron(int argc, char** argv);

/// Megatron trains on the GPU whenever one is present (torch.cuda.set_device(LOCAL_RANK)). Here:
/// CUDA device `local_rank` when the CUDA backend is compiled in and a GPU is visible, else the
/// CPU. `want`: "" (that choice), "cpu" (the CPU also with a GPU) or "cuda" (a GPU or
/// a UserError "<source>cuda: no usable CUDA device ..."); any other value is a UserError naming
/// `source` (e.g. "MEGATRON_DEVICE=" or "--device ").
Device choose_device(const std::string& want, int local_rank, const std::string& source);

/// Megatron's print_rank_0: `line` and a newline on stdout (flushed) on global rank 0 only.
void print_rank_0(const Arguments& args, const std::string& line);
/// Megatron's print_rank_last: the same on the last rank (world_size - 1).
void print_rank_last(const Arguments& args, const std::string& line);

}  // namespace megatron::training
