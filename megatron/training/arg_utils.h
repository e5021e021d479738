// Command-line helpers shared by our programs (preprocess_data, pretrain_gpt, ...).
//
// Megatron-LM parses with Python's argparse: long flags only, unique prefixes accepted
// ("--output-pre" = "--output-prefix"), an unknown flag is an error. We parse with CLI11 and
// add the same prefix rule plus an error that names the closest known flag.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace CLI {
class App;
}
namespace megatron::tokenizers {
struct TokenizerConfig;
}

namespace megatron::training {

/// Edit (Levenshtein) distance between two strings.
size_t edit_distance(const std::string& a, const std::string& b);

/// The known flag closest to `flag`: one that starts with `flag` (prefix_flag) if any, else the
/// smallest edit distance (ties: first in `known`), or "" when nothing is reasonably close
/// (distance > max(3, |flag|/2)).
std::string closest_flag(const std::string& flag, const std::vector<std::string>& known);

/// argparse's _negative_number_matcher: "-1", "-0.5", "-.5" (not "-1e-3", not "-x").
bool looks_like_negative_number(const std::string& s);

/// argparse's test for "this token is an option, not a value": it starts with '-', is not "-"
/// alone, is not a negative number (our parsers have no option that looks like one) and holds no
/// space. A value-taking option never takes such a token as its value.
bool looks_like_option(const std::string& s);

/// Reads `in` (argv without the program name) as argparse does and returns it in a form CLI11
/// cannot misread: every value glued to its option ("--load=x"), a list option's values as one
/// "--name=v" token each (a list option given with no value: "--name" alone). Rules (Python's
/// argparse, Lib/argparse.py _parse_known_args / _match_argument):
///  - an option-like token (looks_like_option) is an option; `resolve` maps it to the option's
///    name in `app` ("--x" or "-h"), or throws UserError for an unknown one;
///  - a one-value option takes "=value" or the next token if that is not option-like, else
///    UserError "argument --x: expected one argument"; an empty value ('' or "--x=") is a value,
///    returned as the two tokens "--x" and "" (CLI11 stores "" for a string, std::nullopt for an
///    optional one: Megatron tests such flags for truth, so '' means "not set" there too);
///  - a list option (nargs '*'/'+'/N) takes "=value" (exactly one value, as argparse) or the
///    following tokens up to the next option-like one; too few: "expected at least one argument"
///    / "expected N arguments";
///  - given twice, the last occurrence wins (for lists too: argparse replaces, not appends);
///  - a switch given "=value" is refused (reject_switch_value);
///  - any other token (a stray value, or anything after "--") goes to `stray`, which throws.
std::vector<std::string> argparse_normalize(const CLI::App& app, const std::vector<std::string>& in,
                                            const std::function<std::string(const std::string&)>& resolve,
                                            const std::function<void(const std::string&)>& stray);

/// The known flag that `flag` is a prefix of (the shortest; ties: first in `known`), or "".
std::string prefix_flag(const std::string& flag, const std::vector<std::string>& known);

/// All long flags of `app` ("--name"), in declaration order.
std::vector<std::string> known_flags(const CLI::App& app);

/// argparse's rule for switches (store_true/store_false): "--flag=value" is an error, whatever the
/// value ("--bf16=0" does not turn --bf16 off). Throws UserError "argument --flag: ignored explicit
/// argument 'value' ..." when `arg` is "--name=value" and --name is an option of `app` that takes
/// no value; does nothing otherwise.
void reject_switch_value(const CLI::App& app, const std::string& arg);

/// Parses argv with `app`. Before CLI11 sees them, long flags are checked: an exact name passes,
/// a unique prefix of a known flag is expanded (argparse's allow_abbrev), anything else throws
/// UserError "unknown flag --x; did you mean --y?" (or "ambiguous flag ..."). CLI11's own errors
/// (missing value, bad number, missing required flag) are rethrown as UserError. A switch given a
/// value ("--flag=0") is refused (reject_switch_value). Returns false
/// if --help was printed (the caller should exit 0).
bool parse_args(CLI::App& app, int argc, const char* const* argv);

/// Adds Megatron's tokenizer flags (megatron/training/arguments.py _add_tokenizer_args, via
/// TokenizerConfig) to `app`, bound to `cfg`. Flags that we accept but that have no effect in
/// this implementation are recorded; call warn_ignored_flags(app) after parsing.
void add_tokenizer_args(CLI::App& app, tokenizers::TokenizerConfig& cfg);

/// Prints "WARNING: --x is accepted for compatibility and ignored" once per such flag given.
void warn_ignored_flags(const CLI::App& app);

/// Marks an option of `app` (by long name, "--x") as accepted-but-ignored.
void mark_ignored(CLI::App& app, const std::string& flag);

}  // namespace megatron::training
