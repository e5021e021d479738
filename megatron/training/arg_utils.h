// Command-line helpers shared by our programs (preprocess_data, pretrain_gpt, ...).
//
// Megatron-LM parses with Python's argparse: long flags only, unique prefixes accepted
// ("--output-pre" = "--output-prefix"), an unknown flag is an error. We parse with CLI11 and
// add the same prefix rule plus an error that names the closest known flag.
#pragma once

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

/// The known flag closest to `flag` (smallest edit distance; ties: first in `known`), or ""
/// when nothing is reasonably close (distance > max(3, |flag|/2)).
std::string closest_flag(const std::string& flag, const std::vector<std::string>& known);

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
