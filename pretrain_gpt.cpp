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
#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/optimizer/optimizer.h"
#include "megatron/core/optimizer_param_scheduler.h"
#include "megatron/core/tokenizers/megatron_tokenizer.h"
#include "megatron/core/utils/errors.h"
#include "megatron/training/arguments.h"
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
Device choose_device() {
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

BatchIterator iterator_of(training::GPTDataLoader* loader) {
  if (!loader) return nullptr;
  return [loader]() -> std::optional<datasets::GPTBatch> {
    datasets::GPTBatch b;
    if (!loader->next(b)) return std::nullopt;
    return b;
  };
}

int run(int argc, char** argv) {
  Arguments args = parse_args(argc, argv);
  args.world_size = env_int("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", 1);
  args.rank = env_int("RANK", "OMPI_COMM_WORLD_RANK", 0);
  if (args.world_size != 1) {
    user_error("WORLD_SIZE=", args.world_size,
               ": multi-process training is not available in this build of pretrain_gpt yet; run one process");
  }
  auto say = [&](const std::string& s) {
    if (args.rank == 0) {
      std::fputs(s.c_str(), stdout);
      std::fputc('\n', stdout);
      std::fflush(stdout);
    }
  };
  say("using world size: " + std::to_string(args.world_size) + ", data-parallel size: " +
      std::to_string(args.world_size / (args.tensor_model_parallel_size * args.pipeline_model_parallel_size *
                                        std::max<int64_t>(args.context_parallel_size, 1))) +
      ", tensor-model-parallel size: " + std::to_string(args.tensor_model_parallel_size) +
      ", pipeline-model-parallel size: " + std::to_string(args.pipeline_model_parallel_size));
  std::set<std::string> noted;
  for (const auto& [flag, note] : args.notes) {
    if (noted.insert(flag).second) say("note: " + flag + " is accepted: " + note);
  }
  validate_args(args);
  if (args.save) say("note: --save: checkpoint saving is not available in this build yet; no checkpoint will be written");
  if (args.load) say("note: --load: checkpoint loading is not available in this build yet; training starts from scratch");

  // Tokenizer and vocab padding.
  say("> building " + args.tokenizer.tokenizer_type + " tokenizer ...");
  std::shared_ptr<tokenizers::MegatronTokenizer> tokenizer = tokenizers::build_tokenizer(args.tokenizer);
  say(set_padded_vocab_size(args, tokenizer->vocab_size()));
  say(format_args(args));

  // Model, optimizer, scheduler.
  say("building GPT model ...");
  const Device device = choose_device();
  if (device.is_cuda()) say("> training on cuda:" + std::to_string(device.index) + " (MEGATRON_DEVICE=cpu forces the CPU)");
  models::gpt::GPTModel model(core_transformer_config_from_args(args), args.padded_vocab_size,
                              *args.max_position_embeddings, static_cast<uint64_t>(args.seed), device);
  int64_t nparams = 0;
  for (auto& p : model.parameters()) nparams += p.data.numel();
  say(" > number of parameters on (tensor, pipeline) model parallel rank (0, 0): " + std::to_string(nparams));
  GPTTrainable trainable(model);
  optimizer::MegatronOptimizer opt(optimizer_config_from_args(args), trainable.optimizer_params());
  OptimizerParamScheduler sched(scheduler_options_from_args(args));

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
  lo.num_workers = static_cast<int>(args.num_workers);
  lo.attention_mask = args.reset_attention_mask && args.create_attention_mask_in_dataloader;
  auto train_loader = training::build_pretraining_data_loader(ds[0], lo);
  lo.cyclic = true;  // Megatron iterates valid/test cyclically
  auto valid_loader = training::build_pretraining_data_loader(ds[1], lo);
  auto test_loader = training::build_pretraining_data_loader(ds[2], lo);
  BatchIterator train_it = iterator_of(train_loader.get());
  BatchIterator valid_it = iterator_of(valid_loader.get());
  BatchIterator test_it = iterator_of(test_loader.get());
  if (!train_it && !args.skip_train) user_error("no training data (check --data-path/--split)");

  std::function<void(const std::string&)> printer;  // default: stdout
  if (args.rank != 0) printer = [](const std::string&) {};
  // TensorBoard: written by the last rank, as Megatron's get_tensorboard_writer.
  std::unique_ptr<SummaryWriter> writer;
  TrainingHooks hooks;
  if (args.tensorboard_dir && args.rank == args.world_size - 1) {
    say("> setting tensorboard ...");
    writer = std::make_unique<SummaryWriter>(*args.tensorboard_dir);
    hooks.add_scalar = [&writer](const std::string& tag, double v, int64_t step) { writer->add_scalar(tag, v, step); };
    hooks.flush = [&writer] { writer->flush(); };
  }
  Trainer trainer(args, trainable, opt, sched, hooks, printer);
  trainer.pretrain(train_it, valid_it ? &valid_it : nullptr, test_it ? &test_it : nullptr);
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
