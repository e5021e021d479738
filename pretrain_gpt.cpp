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

/// Megatron's core_transformer_config_from_args for the fields GPTModel has.
transformer::TransformerConfig transformer_config_from_args(const Arguments& a) {
  transformer::TransformerConfig c;
  c.num_layers = *a.num_layers;
  c.hidden_size = *a.hidden_size;
  c.ffn_hidden_size = *a.ffn_hidden_size;
  c.num_attention_heads = *a.num_attention_heads;
  c.kv_channels = *a.kv_channels;
  c.num_query_groups = a.num_query_groups;
  c.hidden_dropout = static_cast<float>(a.hidden_dropout);
  c.attention_dropout = static_cast<float>(a.attention_dropout);
  c.init_method_std = static_cast<float>(a.init_method_std);
  c.normalization = transformer::parse_normalization(a.normalization);
  c.layernorm_epsilon = static_cast<float>(a.layernorm_epsilon);
  c.layernorm_zero_centered_gamma = a.layernorm_zero_centered_gamma;
  c.qk_layernorm = a.qk_layernorm;
  c.gated_linear_unit = a.swiglu;
  c.add_bias_linear = a.add_bias_linear;
  c.add_qkv_bias = a.add_qkv_bias;
  c.bias_activation_fusion = a.swiglu ? a.bias_swiglu_fusion : a.bias_gelu_fusion;
  c.position_embedding_type = transformer::parse_position_embedding_type(a.position_embedding_type);
  c.rotary_base = static_cast<float>(a.rotary_base);
  c.rotary_percent = static_cast<float>(a.rotary_percent);
  c.rotary_interleaved = a.rotary_interleaved;
  c.share_embeddings_and_output_weights = !a.untie_embeddings_and_output_weights;
  c.params_dtype = a.bf16 ? DType::kBFloat16 : a.fp16 ? DType::kFloat16 : DType::kFloat32;
  // --grad-reduce-in-bf16 makes the DDP grad buffer bf16 (Megatron's grad_reduce_in_fp32=False).
  c.main_grads_dtype = (a.bf16 && a.grad_reduce_in_bf16) ? DType::kBFloat16 : DType::kFloat32;
  c.tensor_model_parallel_size = a.tensor_model_parallel_size;
  c.pipeline_model_parallel_size = a.pipeline_model_parallel_size;
  c.sequence_parallel = a.sequence_parallel;
  return c;
}

/// GPTModel seen through the loop's TrainableModel interface.
class GPTTrainable final : public TrainableModel {
 public:
  explicit GPTTrainable(models::gpt::GPTModel& m) : m_(m) {}
  Tensor forward(const datasets::GPTBatch& b, bool training) override { return m_.forward(b, training); }
  void backward(const Tensor& dloss) override { m_.backward(dloss); }
  std::vector<optimizer::OptimizerParam> optimizer_params() override {
    std::vector<optimizer::OptimizerParam> out;
    for (auto& p : m_.parameters()) {
      optimizer::OptimizerParam o;
      o.name = p.name;
      o.param = p.data;
      o.main_grad = p.main_grad;
      o.no_weight_decay = p.no_weight_decay;
      o.is_embedding_or_output = p.is_embedding_or_output;
      o.tensor_parallel = p.tensor_parallel;
      o.shared = p.shared;
      out.push_back(std::move(o));
    }
    return out;
  }

 private:
  models::gpt::GPTModel& m_;
};

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
  if (args.tensorboard_dir)
    say("note: --tensorboard-dir: the TensorBoard writer is not available in this build yet; no events are written");

  // Tokenizer and vocab padding.
  say("> building " + args.tokenizer.tokenizer_type + " tokenizer ...");
  std::shared_ptr<tokenizers::MegatronTokenizer> tokenizer = tokenizers::build_tokenizer(args.tokenizer);
  say(set_padded_vocab_size(args, tokenizer->vocab_size()));
  say(format_args(args));

  // Model, optimizer, scheduler.
  say("building GPT model ...");
  models::gpt::GPTModel model(transformer_config_from_args(args), args.padded_vocab_size,
                              *args.max_position_embeddings, static_cast<uint64_t>(args.seed));
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
  Trainer trainer(args, trainable, opt, sched, {}, printer);
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
