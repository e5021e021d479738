// Checkpoint args (checkpoint_args.h) and the HF export/import of the architecture they record
// (hf/hf_args.h). Expected values by hand from Megatron's semantics: argparse dests and str()
// of values (megatron_flag_names.inc), check_checkpoint_args in megatron/training/checkpointing.py
// (compare a named arg, error naming it and both values), the MLP activation TransformerConfig /
// MLP compute (squared ReLU; fused bias-GeLU = tanh approximation, else exact erf GeLU), and
// transformers' ACT2FN name "relu2" for ReLUSquaredActivation (relu(x)^2, src/transformers/activations.py).
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "megatron/core/utils/errors.h"
#include "megatron/training/arguments.h"
#include "megatron/training/checkpoint_args.h"
#include "megatron/training/hf/hf_args.h"
#include "megatron/training/hf/hf_checkpoint.h"
#include "megatron/training/hf/hf_model.h"
#include "arguments_test_util.h"

using megatron::UserError;
using nlohmann::json;
using namespace megatron::training;
namespace hf = megatron::hf;

namespace {

std::vector<std::string> base_flags() { return test::tiny_gpt_flags("3e-5"); }

json run_args(const std::vector<std::string>& extra) {
  auto f = base_flags();
  f.insert(f.end(), extra.begin(), extra.end());
  Arguments a = parse_args(f);
  validate_args(a);
  set_padded_vocab_size(a, 128);
  return checkpoint_args(a);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

/// The ~15 keys pretrain_gpt stored before the whole argument set.
json old_style(const json& full) {
  json o;
  for (const char* k : {"num_layers", "hidden_size", "num_attention_heads", "seq_length", "padded_vocab_size",
                        "micro_batch_size", "global_batch_size", "seed", "tensor_model_parallel_size",
                        "pipeline_model_parallel_size", "data_parallel_size", "use_distributed_optimizer"})
    o[k] = full.at(k);
  return o;
}

}  // namespace

TEST(CheckpointArgs, PyStrTyping) {
  EXPECT_EQ(py_str_to_json("True"), json(true));
  EXPECT_EQ(py_str_to_json("False"), json(false));
  EXPECT_TRUE(py_str_to_json("None").is_null());
  EXPECT_EQ(py_str_to_json("128"), json(128));
  EXPECT_TRUE(py_str_to_json("128").is_number_integer());
  EXPECT_DOUBLE_EQ(py_str_to_json("1e-05").get<double>(), 1e-5);
  EXPECT_DOUBLE_EQ(py_str_to_json("0.02").get<double>(), 0.02);
  EXPECT_EQ(py_str_to_json("LayerNorm"), json("LayerNorm"));
  EXPECT_EQ(py_str_to_json("['a', 'b']"), json("['a', 'b']"));
  EXPECT_EQ(py_str_to_json("torch.float32"), json("torch.float32"));
  EXPECT_EQ(py_str_to_json(""), json(""));
}

TEST(CheckpointArgs, RecordsEveryDeclaredDest) {
  const json a = run_args({"--squared-relu", "--no-bias-gelu-fusion", "--normalization", "RMSNorm"});
  for (const auto& [flag, dest] : declared_flag_dests()) EXPECT_TRUE(a.contains(dest)) << flag << " -> " << dest;
  EXPECT_EQ(a.at("squared_relu"), json(true));
  EXPECT_EQ(a.at("bias_gelu_fusion"), json(false));
  EXPECT_EQ(a.at("swiglu"), json(false));
  EXPECT_EQ(a.at("normalization"), json("RMSNorm"));
  EXPECT_EQ(a.at("position_embedding_type"), json("learned_absolute"));
  EXPECT_EQ(a.at("add_bias_linear"), json(true));
  EXPECT_EQ(a.at("num_layers"), json(2));
  EXPECT_EQ(a.at("padded_vocab_size"), json(128));
  EXPECT_DOUBLE_EQ(a.at("layernorm_epsilon").get<double>(), 1e-5);
}

TEST(CheckpointArgs, MlpActivation) {
  EXPECT_EQ(mlp_activation(json::object()), "gelu_tanh");  // pretrain_gpt's defaults: fused bias-GeLU
  EXPECT_EQ(mlp_activation({{"bias_gelu_fusion", false}}), "gelu");
  EXPECT_EQ(mlp_activation({{"add_bias_linear", false}}), "gelu");  // the fused path needs a bias
  EXPECT_EQ(mlp_activation({{"squared_relu", true}, {"bias_gelu_fusion", false}}), "squared_relu");
  EXPECT_EQ(mlp_activation({{"swiglu", true}}), "swiglu");
}

TEST(CheckpointArgs, CheckRefusesChangedArchitecture) {
  const json sq = run_args({"--squared-relu", "--no-bias-gelu-fusion"});
  const json plain = run_args({});
  EXPECT_EQ(error_of([&] { check_checkpoint_args(sq, sq, "ck"); }), "");
  EXPECT_EQ(error_of([&] { check_checkpoint_args(sq, plain, "ck/iter_0000002"); }),
            "ck/iter_0000002: squared_relu (--squared-relu) is False in this run but True in the checkpoint; train "
            "with the checkpoint's architecture flags (Megatron's check_checkpoint_args)");
  struct Case {
    std::vector<std::string> flags;
    std::string needle;
  };
  for (const auto& c : std::vector<Case>{
           {{"--swiglu"}, "swiglu (--swiglu) is True in this run but False"},
           {{"--normalization", "RMSNorm"}, "normalization (--normalization) is RMSNorm in this run but LayerNorm"},
           {{"--position-embedding-type", "rope"}, "position_embedding_type (--position-embedding-type) is rope"},
           {{"--disable-bias-linear"}, "add_bias_linear (--disable-bias-linear) is False in this run but True"},
           {{"--qk-layernorm"}, "qk_layernorm (--qk-layernorm) is True"},
           {{"--untie-embeddings-and-output-weights"}, "untie_embeddings_and_output_weights"},
           {{"--apply-layernorm-1p"}, "layernorm_zero_centered_gamma (--apply-layernorm-1p)"},
           {{"--norm-epsilon", "1e-6"}, "layernorm_epsilon (--norm-epsilon) is 1e-06 in this run but 1e-05"},
           {{"--add-qkv-bias", "--disable-bias-linear"}, "add_bias_linear"},
       }) {
    const json cur = run_args(c.flags);
    const std::string e = error_of([&] { check_checkpoint_args(plain, cur, "ck"); });
    EXPECT_NE(e.find(c.needle), std::string::npos) << c.flags.front() << ": " << e;
  }
  // Megatron's own list: sizes.
  json bigger = plain;
  bigger["num_layers"] = 4;
  EXPECT_NE(error_of([&] { check_checkpoint_args(bigger, plain, "ck"); }).find("num_layers (--num-layers) is 2 in this run but 4"),
            std::string::npos);
}

TEST(CheckpointArgs, CheckAcceptsEquivalentSettings) {
  const json plain = run_args({});
  // Old checkpoints recorded ~15 keys: whatever activation this run uses, nothing to compare.
  EXPECT_EQ(error_of([&] { check_checkpoint_args(old_style(plain), run_args({"--squared-relu", "--no-bias-gelu-fusion"}), "ck"); }), "");
  // Parallel sizes reshard; non-architecture flags (lr, batch) may change on resume.
  EXPECT_EQ(error_of([&] { check_checkpoint_args(plain, run_args({"--tensor-model-parallel-size", "1", "--lr", "1e-4"}), "ck"); }), "");
  // An HF import records rotary_base 10000.0 (float); the run's 10000 (int): equal.
  json ck = run_args({"--position-embedding-type", "rope"});
  ck["rotary_base"] = 10000.0;
  EXPECT_EQ(error_of([&] { check_checkpoint_args(ck, run_args({"--position-embedding-type", "rope"}), "ck"); }), "");
  ck["rotary_base"] = 500000.0;
  EXPECT_NE(error_of([&] { check_checkpoint_args(ck, run_args({"--position-embedding-type", "rope"}), "ck"); }).find("rotary_base"),
            std::string::npos);
  // QKV bias: add_bias_linear already adds it; --add-qkv-bias on top changes nothing.
  EXPECT_EQ(error_of([&] { check_checkpoint_args(plain, run_args({"--add-qkv-bias"}), "ck"); }), "");
  // --finetune-like TP change of a GQA-less model: num_query_groups is not compared without GQA.
  json g = plain;
  g["num_query_groups"] = 4;
  EXPECT_EQ(error_of([&] { check_checkpoint_args(g, plain, "ck"); }), "");
}

TEST(CheckpointArgs, HFImportArgsPassTheLoadCheck) {
  // A GPT-2 import trained with the flags the converter prints.
  hf::HFModelSpec s = hf::read_hf_config(std::string(MEGATRON_SOURCE_DIR) + "/tests/reference/hf/gpt2_tiny/config.json");
  const json ck = hf::spec_to_args(s, 256, 128);
  std::vector<std::string> f = {"--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "8",
                                "--train-iters", "10", "--lr", "3e-5", "--mock-data", "--tokenizer-type",
                                "NullTokenizer", "--vocab-size", "256"};
  for (const auto& x : s.megatron_args()) f.push_back(x);
  Arguments a = parse_args(f);
  validate_args(a);
  set_padded_vocab_size(a, 256);
  EXPECT_EQ(error_of([&] { check_checkpoint_args(ck, checkpoint_args(a), "ck"); }), "");
  a.squared_relu = true;
  EXPECT_NE(error_of([&] { check_checkpoint_args(ck, checkpoint_args(a), "ck"); }).find("squared_relu"), std::string::npos);
}

TEST(HFArgs, SquaredReluGptExportsRelu2) {
  json a = run_args({"--squared-relu", "--no-bias-gelu-fusion"});
  a["vocab_size"] = 128;
  hf::HFModelSpec s = hf::spec_from_args(a, "ck");
  EXPECT_EQ(s.model_type, "gpt2");
  EXPECT_EQ(s.activation, "relu2");
  EXPECT_EQ(hf::hf_config_json(s).at("activation_function"), json("relu2"));
  // and back: relu2 -> --squared-relu, TransformerConfig.squared_relu
  std::vector<std::string> flags = s.megatron_args();
  EXPECT_NE(std::find(flags.begin(), flags.end(), "--squared-relu"), flags.end());
  EXPECT_TRUE(hf::transformer_config_from_hf(s).squared_relu);
  EXPECT_EQ(hf::spec_to_args(s, 128, 128).at("squared_relu"), json(true));
  // Exact GeLU (--no-bias-gelu-fusion) exports "gelu"; the default fused path "gelu_new".
  json g = run_args({"--no-bias-gelu-fusion"});
  g["vocab_size"] = 128;
  EXPECT_EQ(hf::hf_config_json(hf::spec_from_args(g, "ck")).at("activation_function"), json("gelu"));
  g = run_args({});
  g["vocab_size"] = 128;
  EXPECT_EQ(hf::hf_config_json(hf::spec_from_args(g, "ck")).at("activation_function"), json("gelu_new"));
}

TEST(HFArgs, RefusesWhatHFCannotRepresent) {
  auto spec_err = [](const std::vector<std::string>& flags) {
    json a = run_args(flags);
    a["vocab_size"] = 128;
    return error_of([&] { hf::spec_from_args(a, "ck"); });
  };
  EXPECT_EQ(spec_err({"--qk-layernorm"}),
            "ck: the checkpoint was trained with --qk-layernorm, which GPT-2 (GPT2LMHeadModel) cannot represent; not "
            "exported (a silently different model)");
  EXPECT_NE(spec_err({"--apply-layernorm-1p"}).find("--apply-layernorm-1p"), std::string::npos);
  // A rope / RMSNorm model is a LLaMA: squared ReLU without SwiGLU is not representable there.
  EXPECT_NE(spec_err({"--position-embedding-type", "rope", "--normalization", "RMSNorm", "--squared-relu",
                      "--disable-bias-linear"})
                .find("--squared-relu without --swiglu"),
            std::string::npos);
  EXPECT_NE(spec_err({"--position-embedding-type", "rope", "--swiglu", "--disable-bias-linear"}).find("--normalization LayerNorm"),
            std::string::npos);
  EXPECT_NE(spec_err({"--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear"}).find("--position-embedding-type learned_absolute"),
            std::string::npos);
  EXPECT_NE(spec_err({"--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
                      "--disable-bias-linear", "--rotary-percent", "0.5"})
                .find("--rotary-percent 0.5"),
            std::string::npos);
  EXPECT_EQ(spec_err({"--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
                      "--disable-bias-linear"}),
            "");
  // GPT-2 (--hf-config names gpt2) with rope: refused.
  json a = run_args({"--position-embedding-type", "rope"});
  hf::HFModelSpec g = hf::read_hf_config(std::string(MEGATRON_SOURCE_DIR) + "/tests/reference/hf/gpt2_tiny/config.json");
  EXPECT_NE(error_of([&] { hf::check_hf_export(a, g, "ck", "cfg.json"); }).find("--position-embedding-type rope, which GPT-2"),
            std::string::npos);
}

TEST(HFArgs, HfConfigMustAgreeWithTheCheckpoint) {
  hf::HFModelSpec g = hf::read_hf_config(std::string(MEGATRON_SOURCE_DIR) + "/tests/reference/hf/gpt2_tiny/config.json");
  // gpt2_tiny: 2 layers, 64 hidden, 4 heads, gelu_new, 64 positions (run_args: 32 positions)
  json a = run_args({"--squared-relu", "--no-bias-gelu-fusion"});
  a["max_position_embeddings"] = 64;
  EXPECT_EQ(error_of([&] { hf::check_hf_export(a, g, "ck", "cfg.json"); }),
            "ck: --hf-config cfg.json gives activation_function 'gelu_new' but the checkpoint was trained with MLP "
            "activation --squared-relu (HF 'relu2'); fix the config or omit --hf-config to take the architecture "
            "from the checkpoint");
  json b = run_args({});
  EXPECT_NE(error_of([&] { hf::check_hf_export(b, g, "ck", "cfg.json"); }).find("gives n_positions 64 but the checkpoint was trained with max_position_embeddings 32"),
            std::string::npos);
  b["max_position_embeddings"] = 64;
  EXPECT_EQ(error_of([&] { hf::check_hf_export(b, g, "ck", "cfg.json"); }), "");
  // Old-style args (~15 keys): only the sizes are known, and they agree.
  json o = old_style(b);
  EXPECT_EQ(error_of([&] { hf::check_hf_export(o, g, "ck", "cfg.json"); }), "");
  // An HF import written before the full args (hf_activation, no squared_relu) keeps its activation.
  json imp = {{"num_layers", 2}, {"hidden_size", 64}, {"ffn_hidden_size", 256}, {"num_attention_heads", 4},
              {"max_position_embeddings", 64}, {"vocab_size", 256}, {"swiglu", false}, {"hf_activation", "gelu"}};
  EXPECT_EQ(hf::spec_from_args(imp, "ck").activation, "gelu");
}

TEST(CheckpointArgs, RopeScalingIsArchitecture) {
  json ck = run_args({"--position-embedding-type", "rope"});
  json cur = ck;
  ck["use_rope_scaling"] = true;
  ck["rope_scaling_factor"] = 8.0;
  cur["use_rope_scaling"] = false;
  cur["rope_scaling_factor"] = 8.0;
  EXPECT_NE(error_of([&] { check_checkpoint_args(ck, cur, "ck"); }).find("use_rope_scaling (--use-rope-scaling) is False in this run but True"),
            std::string::npos);
  cur["use_rope_scaling"] = true;
  cur["rope_scaling_factor"] = 16.0;
  EXPECT_NE(error_of([&] { check_checkpoint_args(ck, cur, "ck"); }).find("rope_scaling_factor (--rope-scaling-factor) is 16.0"),
            std::string::npos);
  cur["rope_scaling_factor"] = 8.0;
  EXPECT_EQ(error_of([&] { check_checkpoint_args(ck, cur, "ck"); }), "");
  // LLaMA exports it as rope_scaling {"rope_type": "llama3", "factor": ...}; GPT-2 (no RoPE) refuses it.
  ck["normalization"] = "RMSNorm";
  ck["swiglu"] = true;
  ck["add_bias_linear"] = false;
  ck["add_qkv_bias"] = false;
  ck["vocab_size"] = 128;
  const hf::HFModelSpec spec = hf::spec_from_args(ck, "ck");
  EXPECT_TRUE(spec.use_rope_scaling);
  EXPECT_DOUBLE_EQ(spec.rope_scaling_factor, 8.0);
  ck["hf_model_type"] = "gpt2";
  EXPECT_NE(error_of([&] { hf::spec_from_args(ck, "ck"); }).find("--use-rope-scaling, which GPT-2"), std::string::npos);
}

// make_vocab_size_divisible_by matters only through the padded vocabulary: --use-checkpoint-args
// takes padded_vocab_size (Megatron's list), not the divisor.
TEST(CheckpointArgs, VocabDivisorComparedOnlyWithADifferentPaddedVocab) {
  const json plain = run_args({});  // divisor 128, padded 128
  json ck = plain;
  ck["make_vocab_size_divisible_by"] = 32;  // the same padded vocabulary (128)
  EXPECT_EQ(error_of([&] { check_checkpoint_args(ck, plain, "ck"); }), "");
  ck["padded_vocab_size"] = 160;
  EXPECT_NE(error_of([&] { check_checkpoint_args(ck, plain, "ck"); }).find("make_vocab_size_divisible_by"), std::string::npos);
  ck.erase("padded_vocab_size");
  EXPECT_NE(error_of([&] { check_checkpoint_args(ck, plain, "ck"); }).find("make_vocab_size_divisible_by"), std::string::npos);
}

// parse_args_with_overrides (Megatron's setattr of load_args_from_checkpoint, through our flags):
// the expected values are what parse_args gives for the command line a user would type.
TEST(CheckpointArgs, OverridesReplaceTheFlagsOfTheirDest) {
  const auto f = test::with(base_flags(), {"--swiglu", "--disable-bias-linear", "--attention-dropout", "0.1",
                                           "--moe-ffn-hidden-size", "32", "--normalization", "RMSNorm",
                                           "--profile-ranks", "2", "3", "--moe-layer-freq", "[1, 1]"});
  const Arguments a = parse_args_with_overrides(
      f, {{"swiglu", {"False"}},                 // no flag stores False: --swiglu is left out
          {"add_bias_linear", {"True"}},         // the default: --disable-bias-linear is left out
          {"squared_relu", {"True"}},            // a switch that stores it: given
          {"hidden_size", {"48"}},               // a value replaces the user's
          {"attention_dropout", {"0.0"}},
          {"moe_ffn_hidden_size", {}},           // None: left out
          {"data_path", {"x", "y"}}});           // a list flag: its elements
  EXPECT_FALSE(a.swiglu);
  EXPECT_TRUE(a.add_bias_linear);
  EXPECT_TRUE(a.squared_relu);
  EXPECT_EQ(a.hidden_size, 48);
  EXPECT_EQ(a.attention_dropout, 0.0);
  EXPECT_FALSE(a.moe_ffn_hidden_size.has_value());
  EXPECT_EQ(a.data_path, (std::vector<std::string>{"x", "y"}));
  // Flags without an override stay as given (a list's values all, a value with a space whole).
  EXPECT_EQ(a.profile_ranks, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a.moe_layer_freq, "[1, 1]");
  EXPECT_EQ(a.normalization, "RMSNorm");
  EXPECT_EQ(a.num_layers, 2);
  // The same as typing the flags.
  const Arguments typed = parse_args(test::with(base_flags(), {"--normalization", "RMSNorm", "--squared-relu",
                                                               "--hidden-size", "48", "--attention-dropout", "0.0",
                                                               "--profile-ranks", "2", "3", "--moe-layer-freq",
                                                               "[1, 1]", "--data-path", "x", "y"}));
  EXPECT_EQ(format_args(a), format_args(typed));
  // Several values for a one-value flag: Python's str() of the list.
  EXPECT_EQ(parse_args_with_overrides(test::with(base_flags(), {"--num-experts", "2"}), {{"moe_layer_freq", {"1", "0"}}})
                .moe_layer_freq,
            "[1, 0]");
  // A value the flag refuses: the flag's own message.
  try {
    parse_args_with_overrides(base_flags(), {{"normalization", {"Foo"}}});
    ADD_FAILURE() << "normalization Foo accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--normalization: invalid choice 'Foo'"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(declares_dest("layernorm_zero_centered_gamma"));  // --apply-layernorm-1p's dest
  EXPECT_FALSE(declares_dest("apply_layernorm_1p"));
  EXPECT_FALSE(declares_dest("hybrid_layer_pattern"));
}

// The flags themselves: implemented (not refused as unimplemented Megatron flags), with
// Megatron's defaults and both spellings of the tokenizer switch.
TEST(CheckpointArgs, UseCheckpointArgsFlagsParse) {
  const Arguments d = parse_args(base_flags());
  EXPECT_FALSE(d.use_checkpoint_args);
  EXPECT_FALSE(d.use_mp_args_from_checkpoint_args);
  EXPECT_TRUE(d.use_tokenizer_model_from_checkpoint_args);
  const Arguments a = parse_args(test::with(base_flags(), {"--use-checkpoint-args", "--use-mp-args-from-checkpoint-args",
                                                           "--disable-use-tokenizer-model-from-checkpoint-args"}));
  EXPECT_TRUE(a.use_checkpoint_args);
  EXPECT_TRUE(a.use_mp_args_from_checkpoint_args);
  EXPECT_FALSE(a.use_tokenizer_model_from_checkpoint_args);
  EXPECT_FALSE(parse_args(test::with(base_flags(), {"--no-use-tokenizer-model-from-checkpoint-args"}))
                   .use_tokenizer_model_from_checkpoint_args);
}
