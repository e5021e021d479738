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
  std::vector<std::string> json_keys{"text"};
  Args() {
    training::add_tokenizer_args(app, tok);
    app.add_option("--output-prefix", output_prefix);
    app.add_option("--workers", workers);
    app.add_option("--json-keys", json_keys);
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
  EXPECT_EQ(a.parse({"--workers", "2", "--output-prefix"}), "argument --output-prefix: expected one argument");
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

// Python's argparse (preprocess_data.py's parser): an option-like token is never a value, the last
// occurrence wins (nargs='+' lists are replaced, not appended), "--x=v" is one value.
TEST(ArgUtils, ArgparseValueAndRepeatRules) {
  Args a;
  EXPECT_EQ(a.parse({"--output-prefix", "--workers", "2"}), "argument --output-prefix: expected one argument");
  Args b;
  EXPECT_EQ(b.parse({"--json-keys", "--workers", "2"}), "argument --json-keys: expected at least one argument");
  Args c;
  EXPECT_EQ(c.parse({"--json-keys", "text", "--json-keys", "text", "--workers", "1", "--workers", "2",
                     "--output-prefix", "a", "--output-prefix", "b"}), "");
  EXPECT_EQ(c.json_keys, (std::vector<std::string>{"text"}));
  EXPECT_EQ(c.workers, 2);
  EXPECT_EQ(c.output_prefix, "b");
  Args d;
  EXPECT_EQ(d.parse({"--json-keys", "a", "b", "--json-keys", "c", "d"}), "");
  EXPECT_EQ(d.json_keys, (std::vector<std::string>{"c", "d"}));
  Args e;
  EXPECT_EQ(e.parse({"--json-keys=a", "b"}), "unrecognized arguments: b");
  Args f;
  EXPECT_EQ(f.parse({"--workers", "2", "stray"}), "unrecognized arguments: stray");
  Args g;
  EXPECT_EQ(g.parse({"--workers", "-1"}), "");  // a negative number is a value
  EXPECT_EQ(g.workers, -1);
  Args h;
  EXPECT_EQ(h.parse({"--workers=1", "--", "--foo"}), "unrecognized arguments: --foo");
}

TEST(ArgUtils, PrefixPreferredInSuggestions) {
  EXPECT_EQ(training::closest_flag("--untie-embeddings",
                                   {"--output-bert-embeddings", "--untie-embeddings-and-output-weights"}),
            "--untie-embeddings-and-output-weights");
  EXPECT_EQ(training::prefix_flag("--vocab", {"--vocab-size", "--vocab-file", "--vocab-extra-ids"}), "--vocab-size");
  EXPECT_EQ(training::prefix_flag("--", {"--vocab-size"}), "");
}

}  // namespace
}  // namespace megatron
