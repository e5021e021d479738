// The arguments block (Megatron's _print_args) and argparse's rule for switches given a value.
// Expected values: tests/reference/arguments/print_args.json, written by gen_print_args.py with
// Python's argparse and str()/repr() (Python 3.11); Megatron's dests and defaults from its parser
// (megatron_flag_names.inc, gen_megatron_flags.py); argparse's error for "--switch=value".
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>

#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "megatron/core/utils/errors.h"
#include "megatron/training/arg_utils.h"
#include "megatron/training/arguments.h"
#include "arguments_test_util.h"

using megatron::UserError;
using namespace megatron::training;

namespace {

nlohmann::json load_fixture() {
  std::ifstream f(std::string(MEGATRON_SOURCE_DIR) + "/tests/reference/arguments/print_args.json");
  EXPECT_TRUE(f.good()) << "missing tests/reference/arguments/print_args.json";
  return nlohmann::json::parse(f);
}

using test::with;
std::vector<std::string> base_flags() { return test::tiny_gpt_flags("3e-5"); }
std::string parse_error(const std::vector<std::string>& flags) { return test::args_error(flags, false); }

/// name -> value of each "  name <dots> value" line of a block; counts every name.
std::map<std::string, std::string> block_values(const std::string& block, std::map<std::string, int>* counts = nullptr) {
  std::map<std::string, std::string> out;
  std::istringstream is(block);
  std::string line;
  while (std::getline(is, line)) {
    if (line.rfind("  ", 0) != 0) continue;
    const size_t sp = line.find(' ', 2);
    const std::string name = line.substr(2, sp - 2);
    const size_t dots_end = line.find_first_not_of('.', sp + 1);  // npos: no dots and no value
    out[name] = dots_end == std::string::npos ? "" : line.substr(dots_end + 1);
    if (counts) ++(*counts)[name];
  }
  return out;
}

}  // namespace

TEST(PrintArgs, FloatReprMatchesPython) {
  const nlohmann::json fx = load_fixture();
  ASSERT_GT(fx["floats"].size(), 400u);
  for (const auto& pair : fx["floats"]) {
    const std::string hex = pair[0], repr = pair[1];
    const double v = std::strtod(hex.c_str(), nullptr);  // exact: C99 hex float (or inf/nan)
    EXPECT_EQ(py_float_repr(v), repr) << hex;
  }
}

TEST(PrintArgs, BlockMatchesPythonArgparse) {
  // The same namespace values, formatted by our helpers, must give Python's exact text
  // (dots, sort by lower-cased line, 48+ character names without dots, '' values, list reprs).
  const nlohmann::json fx = load_fixture();
  std::vector<std::pair<std::string, std::string>> items;
  for (const auto& it : fx["items"]) {
    const std::string type = it["type"];
    std::string v;
    if (type == "none") v = "None";
    else if (type == "bool") v = it["value"].get<bool>() ? "True" : "False";
    else if (type == "int") v = std::to_string(it["value"].get<int64_t>());
    else if (type == "float") v = py_float_repr(std::strtod(it["hex"].get<std::string>().c_str(), nullptr));
    else if (type == "str") v = it["value"].get<std::string>();
    else if (type == "str_list" || type == "int_list") {
      v = "[";
      for (size_t i = 0; i < it["value"].size(); ++i) {
        v += i ? ", " : "";
        v += type == "str_list" ? py_str_repr(it["value"][i].get<std::string>()) : std::to_string(it["value"][i].get<int64_t>());
      }
      v += "]";
    } else {
      FAIL() << "unknown type " << type;
    }
    items.emplace_back(it["name"].get<std::string>(), v);
  }
  EXPECT_EQ(format_args_block("arguments", items), fx["block"].get<std::string>());
}

TEST(PrintArgs, PyStrRepr) {
  // Python: repr("a") == "'a'", repr("it's") == "\"it's\"", repr("a'b\"c") == "'a\\'b\"c'",
  // repr("t\tn\n\\") == "'t\\tn\\n\\\\'", repr("\x01") == "'\\x01'".
  EXPECT_EQ(py_str_repr("a"), "'a'");
  EXPECT_EQ(py_str_repr("it's"), "\"it's\"");
  EXPECT_EQ(py_str_repr("a'b\"c"), "'a\\'b\"c'");
  EXPECT_EQ(py_str_repr("t\tn\n\\"), "'t\\tn\\n\\\\'");
  EXPECT_EQ(py_str_repr("\x01"), "'\\x01'");
}

TEST(PrintArgs, EveryDeclaredFlagOnceUnderMegatronDest) {
  Arguments a = parse_args(base_flags());
  validate_args(a);
  a.padded_vocab_size = 128;
  const std::string block = format_args(a);
  ASSERT_EQ(block.rfind("------------------------ arguments ------------------------\n", 0), 0u);
  ASSERT_EQ(block.substr(block.size() - 60), "\n-------------------- end of arguments ---------------------");
  std::map<std::string, int> counts;
  const auto values = block_values(block, &counts);
  const auto dests = declared_flag_dests();
  ASSERT_GT(dests.size(), 180u);  // pretrain_gpt declares ~200 flags
  std::set<std::string> distinct;
  for (const auto& [flag, dest] : dests) {
    distinct.insert(dest);
    EXPECT_EQ(counts[dest], 1) << flag << " (dest " << dest << ")";
  }
  // Fields Megatron's parse/validate set that are not flags.
  EXPECT_EQ(counts.count("padded_vocab_size"), 0u);  // set by build_tokenizer, after Megatron's _print_args
  for (const char* derived : {"world_size", "rank", "data_parallel_size", "params_dtype",
                              "virtual_pipeline_model_parallel_size", "consumed_train_samples", "skipped_train_samples",
                              "consumed_valid_samples"}) {
    EXPECT_EQ(counts[derived], 1) << derived;
    distinct.insert(derived);
  }
  EXPECT_EQ(counts.size(), distinct.size()) << "a line that is neither a declared flag's dest nor a derived field";
  for (const auto& [name, n] : counts) EXPECT_EQ(n, 1) << name;
  // Megatron's dests where they differ from the flag name (arguments.py: dest= / store_false).
  std::map<std::string, std::string> by_flag(dests.begin(), dests.end());
  EXPECT_EQ(by_flag["--norm-epsilon"], "layernorm_epsilon");
  EXPECT_EQ(by_flag["--apply-layernorm-1p"], "layernorm_zero_centered_gamma");
  EXPECT_EQ(by_flag["--disable-bias-linear"], "add_bias_linear");
  EXPECT_EQ(by_flag["--fp8-format"], "fp8");
  EXPECT_EQ(by_flag["--no-barrier-with-level-1-timing"], "barrier_with_L1_time");
  EXPECT_EQ(by_flag["--tokenizer-special-tokens"], "special_tokens");
  EXPECT_EQ(by_flag["--use-mcore-models"], "deprecated_use_mcore_models");
  EXPECT_EQ(by_flag["--no-check-for-nan-in-loss-and-grad"], "check_for_nan_in_loss_and_grad");
  // The line layout: 48 - len(name) dots.
  EXPECT_NE(block.find("\n  lr " + std::string(46, '.') + " 3e-05\n"), std::string::npos) << block;
}

TEST(PrintArgs, ValuesAsPythonPrintsThem) {
  // Expected texts: Python's str() of what Megatron's parser stores for these flags.
  Arguments a = parse_args(with(base_flags(), {"--bf16", "--disable-bias-linear", "--norm-epsilon", "1e-6",
                                                "--attention-backend", "flash", "--no-masked-softmax-fusion",
                                                "--use-mcore-models", "--tokenizer-hf-no-include-special-tokens",
                                                "--loss-scale-window", "500", "--timing-log-level", "2",
                                                "--recompute-activations", "--num-workers", "8", "--fp8-interval",
                                                "3", "--profile-ranks", "0", "2", "--cp-comm-type", "a2a"}));
  validate_args(a);
  auto v = block_values(format_args(a));
  EXPECT_EQ(v["lr"], "3e-05");
  EXPECT_EQ(v["min_lr"], "0.0");
  EXPECT_EQ(v["adam_eps"], "1e-08");
  EXPECT_EQ(v["adam_beta2"], "0.999");
  EXPECT_EQ(v["layernorm_epsilon"], "1e-06");
  EXPECT_EQ(v["initial_loss_scale"], "4294967296");  // argparse keeps the int default 2**32 as is
  EXPECT_EQ(v["loss_scale_window"], "500.0");         // given: type=float applied
  EXPECT_EQ(v["min_loss_scale"], "1.0");
  EXPECT_EQ(v["bf16"], "True");
  EXPECT_EQ(v["fp16"], "False");
  EXPECT_EQ(v["params_dtype"], "torch.bfloat16");
  EXPECT_EQ(v["add_bias_linear"], "False");
  EXPECT_EQ(v["attention_backend"], "AttnBackend.flash");
  EXPECT_EQ(v["masked_softmax_fusion"], "False");
  EXPECT_EQ(v["deprecated_use_mcore_models"], "True");
  EXPECT_EQ(v["tokenizer_hf_no_include_special_tokens"], "True");
  EXPECT_EQ(v["timing_log_level"], "2");
  EXPECT_EQ(v["recompute_activations"], "True");
  EXPECT_EQ(v["recompute_granularity"], "selective");
  EXPECT_EQ(v["num_workers"], "8");
  EXPECT_EQ(v["fp8_interval"], "3");
  EXPECT_EQ(v["profile_ranks"], "[0, 2]");
  EXPECT_EQ(v["cp_comm_type"], "['a2a']");
  EXPECT_EQ(v["fp8"], "None");
  EXPECT_EQ(v["tokenizer_model"], "None");
  EXPECT_EQ(v["data_path"], "None");
  EXPECT_EQ(v["split"], "None");  // --mock-data: validate_args sets no split
  EXPECT_EQ(v["tokenizer_type"], "NullTokenizer");
  EXPECT_EQ(v["vocab_size"], "128");
  EXPECT_EQ(v["ffn_hidden_size"], "256");  // derived by validate_args: 4h
  EXPECT_EQ(v["num_query_groups"], "4");
  EXPECT_EQ(v["global_batch_size"], "8");
  EXPECT_EQ(v["transformer_impl"], "transformer_engine");
  EXPECT_EQ(v["manual_gc"], "False");  // noted flag not given: Megatron's default
  EXPECT_EQ(v["wandb_project"], "None");  // noted, not given: Megatron's default None
  EXPECT_EQ(v["world_size"], "1");
  EXPECT_EQ(v["virtual_pipeline_model_parallel_size"], "None");
  EXPECT_EQ(v.count("padded_vocab_size"), 0u);  // build_tokenizer sets it after _print_args
  // validate_args without virtual pipeline stages: both False (their flags' defaults are True).
  EXPECT_EQ(v["overlap_p2p_comm"], "False");
  EXPECT_EQ(v["align_param_gather"], "False");
  EXPECT_EQ(v["attention_softmax_in_fp32"], "False");
  EXPECT_EQ(v["consumed_train_samples"], "0");  // validate_args: args.consumed_train_samples = 0

  Arguments b = parse_args({"--data-path", "0.3", "it's", "0.7", "b", "--tokenizer-type", "GPT2BPETokenizer"});
  auto w = block_values(format_args(b));
  EXPECT_EQ(w["data_path"], "['0.3', \"it's\", '0.7', 'b']");
  EXPECT_EQ(w["lr"], "None");
  EXPECT_EQ(w["global_batch_size"], "None");
}

TEST(PrintArgs, SwitchWithValueIsRefusedLikeArgparse) {
  EXPECT_EQ(parse_error(with(base_flags(), {"--bf16=0"})),
            "argument --bf16: ignored explicit argument '0' (--bf16 is a switch and takes no value: give --bf16 "
            "alone, or leave it out)");
  // Every switch pretrain_gpt declares (found by behaviour: it parses alone and does not take the
  // next word as its value), including store_false and noted ones, refuses "=value".
  int switches = 0;
  for (const auto& [flag, dest] : declared_flag_dests()) {
    const bool alone_ok = parse_error(with(base_flags(), {flag})).empty();
    const bool takes_no_word = parse_error(with(base_flags(), {flag, "7"})).rfind("unrecognized arguments: 7", 0) == 0;
    const std::string err = parse_error(with(base_flags(), {flag + "=false"}));
    const bool refused = err.rfind("argument " + flag + ": ignored explicit argument 'false'", 0) == 0;
    EXPECT_EQ(refused, alone_ok && takes_no_word) << flag << ": " << err;
    switches += refused;
  }
  EXPECT_GT(switches, 60);
  // The shared parser of the other programs (preprocess_data, ...), with prefix expansion.
  CLI::App app;
  bool append_eod = false;
  std::string input;
  app.add_flag("--append-eod", append_eod);
  app.add_option("--input", input);
  const char* argv1[] = {"prog", "--append-eod=1"};
  try {
    parse_args(app, 2, argv1);
    ADD_FAILURE() << "--append-eod=1 accepted";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("argument --append-eod: ignored explicit argument '1'", 0), 0u) << e.what();
  }
  const char* argv2[] = {"prog", "--append-e=0"};
  EXPECT_THROW(parse_args(app, 2, argv2), UserError);
  const char* argv3[] = {"prog", "--input=x", "--append-eod"};
  EXPECT_TRUE(parse_args(app, 3, argv3));
  EXPECT_TRUE(append_eod);
  EXPECT_EQ(input, "x");
}

TEST(PrintArgs, ValidateArgsDerivationsAsMegatron) {
  // arguments.py validate_args: --apply-query-key-layer-scaling sets attention_softmax_in_fp32.
  Arguments a = parse_args(with(base_flags(), {"--apply-query-key-layer-scaling"}));
  validate_args(a);
  EXPECT_TRUE(a.attention_softmax_in_fp32);
  EXPECT_EQ(block_values(format_args(a))["attention_softmax_in_fp32"], "True");
  // --data-path without --split: the legacy default and Megatron's warning text (warn_rank_0).
  std::vector<std::string> flags = base_flags();
  flags.erase(std::find(flags.begin(), flags.end(), "--mock-data"));
  Arguments d = parse_args(with(flags, {"--data-path", "x"}));
  validate_args(d);
  EXPECT_EQ(*d.split, "969, 30, 1");
  ASSERT_EQ(d.warnings.size(), 1u);
  EXPECT_EQ(d.warnings[0], "Please specify --split when using --data-path. Using legacy default value of \"969, 30, 1\"");
  Arguments e = parse_args(with(flags, {"--data-path", "x", "--split", "98,2,0"}));
  validate_args(e);
  EXPECT_TRUE(e.warnings.empty());
  EXPECT_TRUE(e.messages.empty());  // PP = 1: Megatron prints no line
}

TEST(PrintArgs, OverlapP2pFollowsVirtualPipeline) {
  // arguments.py validate_args: PP > 1 without virtual stages sets both False and prints the line;
  // with virtual stages they keep the flags' values (defaults True).
  Arguments a = parse_args(with(base_flags(), {"--pipeline-model-parallel-size", "2"}));
  a.world_size = 2;
  validate_args(a);
  ASSERT_EQ(a.messages.size(), 1u);
  EXPECT_EQ(a.messages[0], "WARNING: Setting args.overlap_p2p_comm and args.align_param_gather to False since "
                           "non-interleaved schedule does not support overlapping p2p communication and aligned param AG");
  auto v = block_values(format_args(a));
  EXPECT_EQ(v["overlap_p2p_comm"], "False");
  EXPECT_EQ(v["align_param_gather"], "False");
  Arguments b = parse_args(with(base_flags(), {"--pipeline-model-parallel-size", "2",
                                               "--num-virtual-stages-per-pipeline-rank", "2", "--num-layers", "4"}));
  b.world_size = 2;
  validate_args(b);
  EXPECT_TRUE(b.messages.empty());
  auto w = block_values(format_args(b));
  EXPECT_EQ(w["overlap_p2p_comm"], "True");
  EXPECT_EQ(w["align_param_gather"], "True");
  EXPECT_EQ(w["virtual_pipeline_model_parallel_size"], "2");
}
