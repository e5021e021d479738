// pretrain_gpt's command line read as Python's argparse reads Megatron-LM's (allow_abbrev=False):
// a value never looks like an option, the last occurrence of a flag wins (lists included), and the
// error lines argparse prints. Expected values: Python 3 Lib/argparse.py (_parse_optional,
// _negative_number_matcher '^-\d+$|^-\d*\.\d+$', _match_argument's messages), checked by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "megatron/core/utils/errors.h"
#include "megatron/training/arg_utils.h"
#include "megatron/training/arguments.h"
#include "megatron/training/config_from_args.h"
#include "arguments_test_util.h"

using megatron::UserError;
using namespace megatron::training;

namespace {
using test::with;
std::vector<std::string> base() { return test::tiny_gpt_flags("1e-3"); }
std::string parse_error(const std::vector<std::string>& flags) { return test::args_error(flags, false); }
}  // namespace

TEST(ArgparseRules, NegativeNumberMatcher) {
  for (const char* s : {"-1", "-10", "-0.5", "-.5", "-12.25"}) EXPECT_TRUE(looks_like_negative_number(s)) << s;
  for (const char* s : {"-", "-x", "-1e-3", "-1.", "--1", "-1a", "1", ""}) EXPECT_FALSE(looks_like_negative_number(s)) << s;
  for (const char* s : {"--bf16", "-h", "--x=1", "-1e-3"}) EXPECT_TRUE(looks_like_option(s)) << s;
  for (const char* s : {"-1", "-0.5", "-", "x", "-a b", ""}) EXPECT_FALSE(looks_like_option(s)) << s;
}

// A one-value flag followed by a switch or another flag: argparse refuses (the flag would otherwise
// swallow --finetune and train from random weights).
TEST(ArgparseRules, ValueFlagDoesNotSwallowAFlag) {
  EXPECT_EQ(parse_error(with(base(), {"--load", "--finetune"})), "argument --load: expected one argument");
  EXPECT_EQ(parse_error(with(base(), {"--tensorboard-dir", "--bf16"})), "argument --tensorboard-dir: expected one argument");
  EXPECT_EQ(parse_error(with(base(), {"--data-cache-path", "--no-load-optim"})),
            "argument --data-cache-path: expected one argument");
  EXPECT_EQ(parse_error(with(base(), {"--tensorboard-dir", "--seed", "5"})),
            "argument --tensorboard-dir: expected one argument");
  EXPECT_EQ(parse_error(with(base(), {"--load"})), "argument --load: expected one argument");
  // An unknown option-like token is not a value either.
  EXPECT_EQ(parse_error(with(base(), {"--save", "-x"})), "argument --save: expected one argument");
  // "-1e-3" does not match argparse's negative-number pattern: it is an option, not a value.
  EXPECT_EQ(parse_error(with(base(), {"--init-method-std", "-1e-3"})), "argument --init-method-std: expected one argument");
  // List flags stop at the next option and need at least one value where Megatron says nargs='+'.
  EXPECT_EQ(parse_error(with(base(), {"--profile-ranks", "--bf16"})), "argument --profile-ranks: expected at least one argument");
  // "=" glues anything, as in argparse.
  Arguments a = parse_args(with(base(), {"--load=--finetune"}));
  EXPECT_EQ(a.load, "--finetune");
  EXPECT_FALSE(a.finetune);
}

// An empty string is a value for argparse ("--tensorboard-dir ''" stores ''); Megatron tests such
// flags for truth, so '' is "not set" (no TensorBoard). The empty value must not make the parser
// take the next flag as the value either.
TEST(ArgparseRules, EmptyStringIsAValue) {
  for (const auto& flags : {with(base(), {"--tensorboard-dir", "", "--save", "/ck"}),
                            with(base(), {"--tensorboard-dir=", "--save", "/ck"})}) {
    Arguments a = parse_args(flags);
    EXPECT_FALSE(a.tensorboard_dir.has_value()) << *a.tensorboard_dir;
    EXPECT_EQ(a.save, "/ck");
  }
  Arguments b = parse_args(with(base(), {"--load", "", "--finetune"}));
  EXPECT_FALSE(b.load.has_value()) << *b.load;
  EXPECT_TRUE(b.finetune);
  // A number flag: '' is not a number (argparse: "invalid int value: ''"), never read as 0.
  EXPECT_NE(parse_error(with(base(), {"--seed", ""})).find("argument --seed: invalid"), std::string::npos);
  EXPECT_NE(parse_error(with(base(), {"--lr="})).find("argument --lr: invalid"), std::string::npos);
  // A string flag with choices: '' is a value, refused as argparse refuses an invalid choice.
  EXPECT_NE(parse_error(with(base(), {"--ckpt-format", ""})).find("--ckpt-format"), std::string::npos);
}

TEST(ArgparseRules, NegativeNumbersAreValues) {
  Arguments a = parse_args(with(base(), {"--null-tokenizer-pad-id", "-1", "--profile-ranks", "-1", "-2"}));
  EXPECT_EQ(a.tokenizer.null_tokenizer_pad_id, -1);
  EXPECT_EQ(a.profile_ranks, (std::vector<int64_t>{-1, -2}));
  // "-.5" is taken as the value (then refused by the flag's range), not as an option.
  EXPECT_EQ(parse_error(with(base(), {"--init-method-std", "-.5"})), "argument --init-method-std: invalid value -.5 (must be > 0)");
}

// argparse stores a list flag's values on each occurrence: the last one wins, for every list flag.
TEST(ArgparseRules, LastListOccurrenceWins) {
  Arguments a = parse_args(with(base(), {"--cp-comm-type", "p2p", "--cp-comm-type", "a2a", "--profile-ranks", "0", "1",
                                         "--profile-ranks", "3", "--tokenizer-special-tokens", "<a>", "<b>",
                                         "--tokenizer-special-tokens", "<c>", "--seed", "3", "--seed", "4"}));
  EXPECT_EQ(a.cp_comm_type, (std::vector<std::string>{"a2a"}));
  EXPECT_EQ(a.profile_ranks, (std::vector<int64_t>{3}));
  EXPECT_EQ(a.tokenizer.tokenizer_special_tokens, (std::vector<std::string>{"<c>"}));
  EXPECT_EQ(a.seed, 4);
  std::vector<std::string> flags = base();
  flags.erase(flags.begin() + 18);  // --mock-data
  Arguments d = parse_args(with(flags, {"--data-path", "A", "--data-path", "B", "--train-data-path", "X", "--train-data-path", "Y"}));
  EXPECT_EQ(d.data_path, (std::vector<std::string>{"B"}));
  EXPECT_EQ(d.train_data_path, (std::vector<std::string>{"Y"}));
  // "--profile-ranks=0 1": the "=" value is the one value, "1" is stray (argparse: unrecognized arguments).
  EXPECT_EQ(parse_error(with(base(), {"--profile-ranks=0", "1"})).rfind("unrecognized arguments: 1", 0), 0u);
}

TEST(ArgparseRules, MessagesForUnknownAndDoubleDash) {
  // A prefix of a flag is suggested before any edit-distance neighbour.
  EXPECT_EQ(parse_error(with(base(), {"--untie-embeddings"})),
            "unknown flag --untie-embeddings; did you mean --untie-embeddings-and-output-weights?");
  EXPECT_EQ(closest_flag("--untie-embeddings", {"--output-bert-embeddings", "--untie-embeddings-and-output-weights"}),
            "--untie-embeddings-and-output-weights");
  // After "--" everything is a positional value; pretrain_gpt has none.
  EXPECT_EQ(parse_error(with(base(), {"--", "--foo"})).rfind("unrecognized arguments: --foo", 0), 0u);
  EXPECT_EQ(parse_error(with(base(), {"stray"})).rfind("unrecognized arguments: stray", 0), 0u);
}

// Every integer flag, fed 0 and -1: parse + validate (+ the derived values pretrain_gpt computes
// next) either accepts it or stops with one UserError line that names the flag -- never a signal
// (a division by zero kills this test binary) and never an internal check failure.
TEST(ArgparseRules, EveryIntegerFlagZeroAndMinusOneIsCleanlyHandled) {
  const std::vector<std::string> ints = declared_int_flags();
  ASSERT_GT(ints.size(), 40u);  // the Binder's integer flags (sizes, counts, intervals, ...)
  for (const std::string& flag : ints) {
    for (const char* v : {"0", "-1"}) {
      std::vector<std::string> flags = with(base(), {flag, v});
      try {
        Arguments a = parse_args(flags);
        validate_args(a);
        core_transformer_config_from_args(a);
        num_microbatches(a);
        set_padded_vocab_size(a, 128);
      } catch (const UserError& e) {
        const std::string msg = e.what();
        EXPECT_EQ(msg.find('\n'), std::string::npos) << flag << " " << v << ": " << msg;
        EXPECT_EQ(msg.find("internal"), std::string::npos) << flag << " " << v << ": " << msg;
      } catch (const std::exception& e) {
        ADD_FAILURE() << flag << " " << v << ": not a UserError: " << e.what();
      }
    }
  }
}

// The sizes and divisors Megatron gives no meaning to at 0 are refused where they are parsed.
TEST(ArgparseRules, SizesAndDivisorsMustBePositive) {
  for (const char* flag : {"--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
                           "--num-layers", "--hidden-size", "--num-attention-heads", "--kv-channels", "--num-query-groups",
                           "--ffn-hidden-size", "--seq-length", "--micro-batch-size", "--global-batch-size",
                           "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
                           "--save-interval", "--log-interval", "--eval-interval", "--make-vocab-size-divisible-by"}) {
    EXPECT_EQ(parse_error(with(base(), {flag, "0"})), std::string("argument ") + flag + ": invalid value 0 (must be >= 1)");
    EXPECT_EQ(parse_error(with(base(), {flag, "-2"})), std::string("argument ") + flag + ": invalid value -2 (must be >= 1)");
  }
  // 0 has a meaning for these (Megatron: no evaluation; seed 0; no warmup).
  for (const char* flag : {"--eval-iters", "--seed", "--lr-warmup-iters"}) {
    EXPECT_EQ(parse_error(with(base(), {flag, "0"})), "") << flag;
    EXPECT_EQ(parse_error(with(base(), {flag, "-1"})), std::string("argument ") + flag + ": invalid value -1 (must be >= 0)");
  }
}

// Every float flag: nan and +-inf are refused where parsed (Python's float() accepts them, and
// Megatron would then train NaN); each flag with a range refuses a value just outside it and parses
// its boundary values. Ranges (checked by hand against their source): Megatron's
// OptimizerParamScheduler asserts min_lr >= 0 and start/end weight decay >= 0; torch.optim.Adam
// refuses betas outside [0, 1), torch.optim.SGD momentum < 0; a warmup fraction of 1 makes warmup
// steps == decay steps, which the scheduler asserts against; the rest is the mathematical domain
// (an epsilon, a std, a scale or a RoPE base of 0 divides by zero or gives identical weights; dropout
// 1 zeroes every activation and its keep-scale 1/(1-p) is inf).
TEST(ArgparseRules, EveryFloatFlagRefusesNanInfAndOutOfRange) {
  struct Case {
    const char* flag;
    const char* bad;     // just outside the range
    const char* rule;    // the range as the error line writes it
    std::vector<const char*> ok;  // boundary values that parse
  };
  const std::vector<Case> ranged = {
      {"--rotary-percent", "0", "in (0, 1]", {"1", "1e-9"}},
      {"--rope-scaling-factor", "0", "> 0", {"1e-9"}},
      {"--norm-epsilon", "0", "> 0", {"1e-12"}},
      {"--init-method-std", "0", "> 0", {"1e-9"}},
      {"--hidden-dropout", "1", "in [0, 1)", {"0", "0.999"}},
      {"--attention-dropout", "1.0", "in [0, 1)", {"0", "0.999"}},
      {"--lr", "-0.1", ">= 0", {"0"}},
      {"--min-lr", "-1e-9", ">= 0", {"0"}},
      {"--lr-warmup-fraction", "1", "in [0, 1)", {"0", "0.99"}},
      {"--lr-warmup-init", "-0.5", ">= 0", {"0"}},
      {"--decoupled-lr", "-0.5", ">= 0", {"0"}},
      {"--decoupled-min-lr", "-0.5", ">= 0", {"0"}},
      {"--weight-decay", "-0.5", ">= 0", {"0"}},
      {"--start-weight-decay", "-0.5", ">= 0", {"0"}},
      {"--end-weight-decay", "-0.5", ">= 0", {"0"}},
      {"--clip-grad", "-0.5", ">= 0", {"0"}},
      {"--adam-beta1", "1.5", "in [0, 1)", {"0", "0.999999"}},
      {"--adam-beta2", "1", "in [0, 1)", {"0", "0.999999"}},
      {"--adam-eps", "0", "> 0", {"1e-30"}},
      {"--sgd-momentum", "-0.5", ">= 0", {"0"}},
      {"--loss-scale", "0", "> 0", {"1e-3"}},
      {"--initial-loss-scale", "0", "> 0", {"1"}},
      {"--min-loss-scale", "-1.0", "> 0", {"1e-3"}},
      {"--loss-scale-window", "0.5", ">= 1", {"1"}},
      {"--mid-level-dataset-surplus", "-0.5", ">= 0", {"0"}},
      {"--moe-z-loss-coeff", "-0.5", ">= 0", {"0"}},
      {"--moe-router-topk-scaling-factor", "0", "> 0", {"1e-9"}},
      {"--moe-router-bias-update-rate", "-0.5", ">= 0", {"0"}},
      {"--moe-input-jitter-eps", "1", "in [0, 1)", {"0", "0.5"}},
      {"--mtp-loss-scaling-factor", "-0.1", ">= 0", {"0", "0.3"}},
  };
  // Float flags without a parse-time range: only nan/inf are refused when parsed.
  // --moe-expert-capacity-factor: negative means dropless (Megatron), 0 is refused by validate_args.
  const std::vector<std::string> unranged_noted = {"--moe-expert-capacity-factor"};
  const std::vector<std::string> floats = declared_float_flags();
  ASSERT_GE(floats.size(), ranged.size());
  for (const std::string& flag : floats) {
    const bool has_range = std::any_of(ranged.begin(), ranged.end(), [&](const Case& c) { return flag == c.flag; });
    const bool noted = std::find(unranged_noted.begin(), unranged_noted.end(), flag) != unranged_noted.end();
    EXPECT_TRUE(has_range || noted) << flag << ": a float flag without a declared range; add it to this test";
    for (const char* v : {"nan", "inf", "NaN", "-inf", "Infinity"}) {
      const std::string msg = parse_error(with(base(), {flag, v}));
      // "-inf" is an option token for argparse (not a negative number): then "expected one argument".
      if (std::string(v) == "-inf") {
        EXPECT_EQ(msg, "argument " + flag + ": expected one argument");
      } else {
        EXPECT_EQ(msg, "argument " + flag + ": invalid value " + v + " (must be a finite number)");
      }
    }
    EXPECT_EQ(parse_error(with(base(), {flag + "=-inf"})), "argument " + flag + ": invalid value -inf (must be a finite number)");
  }
  for (const Case& c : ranged) {
    EXPECT_NE(std::find(floats.begin(), floats.end(), c.flag), floats.end()) << c.flag << " is not a declared float flag";
    EXPECT_EQ(parse_error(with(base(), {std::string(c.flag) + "=" + c.bad})),
              std::string("argument ") + c.flag + ": invalid value " + c.bad + " (must be " + c.rule + ")");
    for (const char* v : c.ok) EXPECT_EQ(parse_error(with(base(), {c.flag, v})), "") << c.flag << " " << v;
  }
}

// The integer flags megatron.cpp only notes (no effect here) are still typed and bounded as
// Megatron uses them: worker processes >= 0, an fp8 update interval >= 1, a GC interval >= 0.
TEST(ArgparseRules, NotedIntegerFlagsHaveTheirMinimum) {
  EXPECT_EQ(parse_error(with(base(), {"--num-workers", "-1"})), "argument --num-workers: invalid value -1 (must be >= 0)");
  EXPECT_EQ(parse_error(with(base(), {"--fp8-interval", "0"})), "argument --fp8-interval: invalid value 0 (must be >= 1)");
  EXPECT_EQ(parse_error(with(base(), {"--manual-gc-interval", "-1"})),
            "argument --manual-gc-interval: invalid value -1 (must be >= 0)");
  EXPECT_EQ(parse_error(with(base(), {"--manual-gc-interval", "x"})), "--manual-gc-interval: expected an integer, got 'x'");
  for (const char* f : {"--num-workers", "--manual-gc-interval"}) EXPECT_EQ(parse_error(with(base(), {f, "0"})), "") << f;
  EXPECT_EQ(parse_error(with(base(), {"--fp8-interval", "1"})), "");
}
