#include "megatron/training/arg_utils.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <iostream>
#include <map>

#include "megatron/core/tokenizers/megatron_tokenizer.h"
#include "megatron/core/utils/errors.h"

namespace megatron::training {

namespace {
constexpr const char* kIgnoredGroup = "Accepted for compatibility (no effect)";
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string prefix_flag(const std::string& flag, const std::vector<std::string>& known) {
  std::string best;
  if (flag.size() < 3) return best;  // "--" or "-x" is a prefix of everything
  for (const auto& k : known)
    if (k.size() > flag.size() && k.compare(0, flag.size(), flag) == 0 && (best.empty() || k.size() < best.size()))
      best = k;
  return best;
}

std::string closest_flag(const std::string& flag, const std::vector<std::string>& known) {
  if (std::string p = prefix_flag(flag, known); !p.empty()) return p;
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& k : known) {
    size_t d = edit_distance(flag, k);
    if (d < best_d) {
      best_d = d;
      best = k;
    }
  }
  size_t limit = std::max<size_t>(3, flag.size() / 2);
  return best_d <= limit ? best : std::string();
}

std::vector<std::string> known_flags(const CLI::App& app) {
  std::vector<std::string> out;
  for (const CLI::Option* o : app.get_options())
    for (const auto& n : o->get_lnames()) out.push_back("--" + n);
  return out;
}

bool looks_like_negative_number(const std::string& s) {
  // '^-\d+$|^-\d*\.\d+$'
  if (s.size() < 2 || s[0] != '-') return false;
  size_t i = 1, d1 = 0, d2 = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, ++d1;
  if (i == s.size()) return d1 > 0;
  if (s[i] != '.') return false;
  ++i;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, ++d2;
  return i == s.size() && d2 > 0;
}

bool looks_like_option(const std::string& s) {
  if (s.size() < 2 || s[0] != '-') return false;
  if (looks_like_negative_number(s)) return false;
  return s.find(' ') == std::string::npos;
}

std::vector<std::string> argparse_normalize(const CLI::App& app, const std::vector<std::string>& in,
                                            const std::function<std::string(const std::string&)>& resolve,
                                            const std::function<void(const std::string&)>& stray) {
  std::vector<std::vector<std::string>> groups;  // one per occurrence, in order
  std::map<std::string, size_t> last;            // value-taking option -> its group (last wins)
  for (size_t i = 0; i < in.size(); ++i) {
    const std::string& tok = in[i];
    if (tok == "--") {  // argparse: everything after "--" is a positional value
      for (size_t j = i + 1; j < in.size(); ++j) stray(in[j]);
      break;
    }
    if (!looks_like_option(tok)) {
      stray(tok);
      continue;
    }
    const size_t eq = tok.find('=');
    const bool explicit_value = eq != std::string::npos;
    const std::string name = resolve(explicit_value ? tok.substr(0, eq) : tok);
    const CLI::Option* o = app.get_option_no_throw(name);
    if (o == nullptr) {  // resolve() knows the name but the app does not hold it (e.g. -h)
      groups.push_back({explicit_value ? name + tok.substr(eq) : name});
      continue;
    }
    const int lo = o->get_items_expected_min();
    const int hi = o->get_items_expected_max();
    if (hi == 0) {
      if (explicit_value) reject_switch_value(app, name + tok.substr(eq));
      groups.push_back({name});
      continue;
    }
    std::vector<std::string> values;
    if (explicit_value) {
      values.push_back(tok.substr(eq + 1));
    } else {
      while (i + 1 < in.size() && static_cast<int>(values.size()) < hi && in[i + 1] != "--" &&
             !looks_like_option(in[i + 1]))
        values.push_back(in[++i]);
    }
    if (static_cast<int>(values.size()) < lo) {
      if (hi == 1) user_error("argument ", name, ": expected one argument");
      if (lo == hi) user_error("argument ", name, ": expected ", lo, " arguments");
      user_error("argument ", name, ": expected at least one argument");
    }
    std::vector<std::string> group;
    // An empty value ('' in the shell, or "--x="): argparse stores ''. CLI11 reads "--x=" as "no
    // value" and would take the next token instead, so pass it as "--x" followed by "".
    for (const auto& v : values) {
      if (v.empty()) {  // a number: CLI11 would read '' as 0, argparse refuses it
        const std::string t = o->get_type_name();
        for (const char* num : {"INT", "UINT", "FLOAT", "NUMBER"})
          if (t.rfind(num, 0) == 0)
            user_error("argument ", name, ": invalid ", t, " value: '' (an empty string is not a number)");
      }
      if (v.empty()) {
        group.push_back(name);
        group.push_back("");
      } else {
        group.push_back(name + "=" + v);
      }
    }
    if (group.empty()) group.push_back(name);
    if (auto it = last.find(name); it != last.end()) groups[it->second].clear();
    last[name] = groups.size();
    groups.push_back(std::move(group));
  }
  std::vector<std::string> out;
  for (auto& g : groups)
    for (auto& t : g) out.push_back(std::move(t));
  return out;
}

void reject_switch_value(const CLI::App& app, const std::string& arg) {
  const size_t eq = arg.find('=');
  if (arg.rfind("--", 0) != 0 || eq == std::string::npos) return;
  const std::string name = arg.substr(0, eq);
  const CLI::Option* o = app.get_option_no_throw(name);
  if (o == nullptr || o->get_items_expected_max() != 0) return;
  user_error("argument ", name, ": ignored explicit argument '", arg.substr(eq + 1), "' (", name,
             " is a switch and takes no value: give ", name, " alone, or leave it out)");
}

bool parse_args(CLI::App& app, int argc, const char* const* argv) {
  const std::vector<std::string> known = known_flags(app);
  auto resolve = [&](const std::string& name) -> std::string {
    if (name == "-h" || std::find(known.begin(), known.end(), name) != known.end()) return name;
    if (name.rfind("--", 0) == 0 && name.size() > 2) {
      std::vector<std::string> cands;  // argparse's allow_abbrev: a unique prefix
      for (const auto& k : known)
        if (k.compare(0, name.size(), name) == 0) cands.push_back(k);
      if (cands.size() == 1) return cands[0];
      if (cands.size() > 1) {
        std::string list;
        for (const auto& c : cands) list += (list.empty() ? "" : ", ") + c;
        user_error("ambiguous flag ", name, ": it could be ", list);
      }
    }
    std::string near = closest_flag(name, known);
    if (near.empty()) user_error("unknown flag ", name, "; run with --help for the list of flags");
    user_error("unknown flag ", name, "; did you mean ", near, "?");
  };
  auto stray = [](const std::string& tok) { user_error("unrecognized arguments: ", tok); };
  std::vector<std::string> args =
      argparse_normalize(app, std::vector<std::string>(argv + 1, argv + argc), resolve, stray);
  std::reverse(args.begin(), args.end());  // CLI11 takes them reversed
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return false;
  } catch (const CLI::ParseError& e) {
    std::string msg = e.what();
    // CLI11 says "--flag: 1 required TEXT missing"; say it as argparse does, naming the flag.
    std::string flag = msg.substr(0, msg.find(':'));
    if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) && flag.rfind("--", 0) == 0 &&
        msg.find("required") != std::string::npos)
      user_error("argument ", flag, ": expected one argument");
    // CLI11: "Could not convert: --workers = abc" (argparse: "invalid int value: 'abc'").
    const std::string conv = "Could not convert: ";
    size_t eq = msg.find(" = ");
    if (msg.rfind(conv, 0) == 0 && eq != std::string::npos)
      user_error(msg.substr(conv.size(), eq - conv.size()), ": invalid value '", msg.substr(eq + 3),
                 "' (expected a number)");
    user_error(msg.empty() ? std::string("invalid command line") : msg);
  }
  return true;
}

void mark_ignored(CLI::App& app, const std::string& flag) {
  CLI::Option* o = app.get_option_no_throw(flag);
  MEGATRON_CHECK(o != nullptr) << "no option " << flag;
  o->group(kIgnoredGroup);
}

void warn_ignored_flags(const CLI::App& app) {
  for (const CLI::Option* o : app.get_options())
    if (o->get_group() == kIgnoredGroup && o->count() > 0)
      std::cerr << "WARNING: " << o->get_name() << " is accepted for compatibility with Megatron-LM and ignored\n";
}

void add_tokenizer_args(CLI::App& app, tokenizers::TokenizerConfig& cfg) {
  static const std::vector<std::string> kTypes = {
      "BertWordPieceLowerCase", "BertWordPieceCase", "GPT2BPETokenizer", "SentencePieceTokenizer",
      "GPTSentencePieceTokenizer", "HuggingFaceTokenizer", "Llama2Tokenizer", "TikTokenizer",
      "MultimodalTokenizer", "NullTokenizer", "NullMultimodalTokenizer", "SFTTokenizer"};
  app.add_option("--tokenizer-type", cfg.tokenizer_type, "What type of tokenizer to use")
      ->check(CLI::IsMember(kTypes));
  app.add_option("--tokenizer-model", cfg.tokenizer_model,
                 "Tokenizer model: HF folder/tokenizer.json, SentencePiece model or tiktoken JSON");
  app.add_option("--vocab-file", cfg.vocab_file, "Path to the vocab file (GPT-2: vocab.json/encoder.json)");
  app.add_option("--merge-file", cfg.merge_file, "Path to the BPE merge file (GPT-2: merges.txt/vocab.bpe)");
  app.add_option("--vocab-size", cfg.vocab_size, "Vocabulary size (NullTokenizer)");
  app.add_option("--vocab-extra-ids", cfg.vocab_extra_ids, "Number of additional vocabulary tokens (T5)");
  app.add_option("--tiktoken-pattern", cfg.tiktoken_pattern, "Which tiktoken pattern to use: v1 or v2")
      ->check(CLI::IsMember({"v1", "v2"}));
  app.add_option("--tiktoken-num-special-tokens", cfg.tiktoken_num_special_tokens,
                 "Number of special tokens in the tiktoken tokenizer");
  app.add_option("--tokenizer-special-tokens", cfg.tokenizer_special_tokens, "Special tokens (tiktoken)");
  app.add_flag_callback("--tokenizer-hf-no-include-special-tokens",
                        [&cfg] { cfg.tokenizer_hf_include_special_tokens = false; },
                        "HF tokenizer: do not add special tokens (no BOS)");
  app.add_flag("--tokenizer-sentencepiece-legacy", cfg.tokenizer_sentencepiece_legacy,
               "SentencePiece: legacy behaviour");
  app.add_option("--null-tokenizer-eod-id", cfg.null_tokenizer_eod_id, "NullTokenizer eod id (default vocab_size-1)");
  app.add_option("--null-tokenizer-pad-id", cfg.null_tokenizer_pad_id, "NullTokenizer pad id");
  // Accepted, no effect on preprocessing here.
  static int64_t padded;
  static std::string str_sink;
  static bool flag_sink;
  app.add_option("--padded-vocab-size", padded, "Padded vocabulary size (training only)");
  app.add_flag("--no-pad-vocab-size,--disable-pad-vocab-size", flag_sink, "Disable vocab padding (training only)");
  app.add_option("--tokenizer-metadata", str_sink, "Tokenizer metadata JSON path");
  app.add_flag("--no-tokenizer-sentencepiece-ignore-extra-whitespaces", flag_sink,
               "SentencePiece: keep extra whitespace");
  app.add_flag("--tokenizer-hf-no-use-fast", flag_sink, "HF: slow tokenizer (same ids)");
  app.add_flag("--trust-remote-code", flag_sink, "HF: allow remote code (not applicable)");
  app.add_option("--chat-template", str_sink, "Chat template (SFT only)");
  app.add_flag("--use-gigatoken", flag_sink, "Use GigaToken (same ids; our tokenizer is native)");
  for (const char* f : {"--padded-vocab-size", "--no-pad-vocab-size", "--tokenizer-metadata",
                        "--no-tokenizer-sentencepiece-ignore-extra-whitespaces", "--tokenizer-hf-no-use-fast",
                        "--trust-remote-code", "--chat-template", "--use-gigatoken"})
    mark_ignored(app, f);
}

}  // namespace megatron::training
