// megatron/training/arg_utils: argparse-like flag handling (unique prefixes, unknown flag ->
// closest known flag). Expected behaviour from Python's argparse (allow_abbrev=True).
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>

#include "megatron/core/tokenizers/megatron_tokenizer.h"
#include "megatron/core/utils/errors.h"
#include "megatron/training/arg_utils.h"

namespace megatron {
namespace {

struct Args {
  CLI::App app{"t"};
  tokenizers::TokenizerConfig tok;
  std::string output_prefix;
  int workers = 0;
  Args() {
    training::add_tokenizer_args(app, tok);
    app.add_option("--output-prefix", output_prefix);
    app.add_option("--workers", workers);
  }
  std::string parse(std::vector<const char*> argv) {
    argv.insert(argv.begin(), "prog");
    try {
      training::parse_args(app, static_cast<int>(argv.size()), argv.data());
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  }
};

TEST(ArgUtils, EditDistanceAndClosest) {
  EXPECT_EQ(training::edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(training::closest_flag("--vocab-szie", {"--vocab-size", "--vocab-file"}), "--vocab-size");
  EXPECT_EQ(training::closest_flag("--completely-different-thing", {"--workers"}), "");
}

TEST(ArgUtils, UnknownFlagNamesClosest) {
  Args a;
  EXPECT_EQ(a.parse({"--tokenizer-typ", "NullTokenizer", "--wrokers", "2"}),
            "unknown flag --wrokers; did you mean --workers?");
}

TEST(ArgUtils, PrefixAndEqualsAndNegativeValues) {
  Args a;
  EXPECT_EQ(a.parse({"--output-pre", "x", "--workers=3", "--tokenizer-type", "NullTokenizer", "--vocab-size", "10",
                     "--null-tokenizer-pad-id", "-5"}),
            "");
  EXPECT_EQ(a.output_prefix, "x");
  EXPECT_EQ(a.workers, 3);
  EXPECT_EQ(a.tok.tokenizer_type, "NullTokenizer");
  EXPECT_EQ(a.tok.vocab_size, 10);
  EXPECT_EQ(a.tok.null_tokenizer_pad_id, -5);
}

TEST(ArgUtils, AmbiguousPrefix) {
  Args a;
  std::string e = a.parse({"--vocab", "5"});
  EXPECT_NE(e.find("ambiguous flag --vocab"), std::string::npos) << e;
}

// argparse's wording for a missing value and a non-numeric value, naming the flag.
TEST(ArgUtils, MissingAndNonNumericValues) {
  Args a;
  EXPECT_EQ(a.parse({"--workers", "2", "--output-prefix"}),
            "--output-prefix: expected one argument (give its value after the flag)");
  Args b;
  EXPECT_EQ(b.parse({"--workers", "abc"}), "--workers: invalid value 'abc' (expected a number)");
}

TEST(ArgUtils, BadChoice) {
  Args a;
  EXPECT_NE(a.parse({"--tokenizer-type", "Foo"}), "");
  Args b;
  EXPECT_EQ(b.parse({"--tokenizer-hf-no-include-special-tokens"}), "");
  EXPECT_FALSE(b.tok.tokenizer_hf_include_special_tokens);
}

}  // namespace
}  // namespace megatron
