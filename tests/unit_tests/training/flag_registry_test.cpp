// Generated over the parser's own registry (flag_registry()) and Megatron-LM's flag table
// (megatron_flag_names.inc, produced from Megatron's argparse actions): no registered flag may be
// silent. Every flag pretrain_gpt accepts must be
//  - implemented: the Arguments / TokenizerConfig members it is stored in are read by code outside
//    the parser (the source tree is scanned for reads: "x.member" not followed by a plain "=");
//  - noted: giving it records the one-line note pretrain_gpt prints ("note: --x is accepted: ...");
//  - refused: giving it is a UserError naming it.
// Also: every Megatron spelling of a registered option (same argparse dest) is accepted, every
// other Megatron flag is refused with a line naming it, and the flags Megatron lacks are
// documented in docs/training.md. A new flag without a disposition, or whose field nothing reads,
// fails here by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "megatron/core/utils/errors.h"
#include "megatron/training/arguments.h"

using namespace megatron;
using namespace megatron::training;
namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// The text with // and /* */ comments blanked (string literals kept: a comment's "args.x" is
/// not a read).
std::string strip_comments(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (s[i] == '"') {  // a string literal, copied whole
      size_t j = i + 1;
      while (j < s.size() && s[j] != '"' && s[j] != '\n') j += (s[j] == '\\') ? 2 : 1;
      out.append(s, i, std::min(j + 1, s.size()) - i);
      i = j + 1;
    } else if (s.compare(i, 2, "//") == 0) {
      while (i < s.size() && s[i] != '\n') ++i;
    } else if (s.compare(i, 2, "/*") == 0) {
      const size_t e = s.find("*/", i + 2);
      i = e == std::string::npos ? s.size() : e + 2;
    } else {
      out += s[i++];
    }
  }
  return out;
}

/// Member names read in `code`: ".name" or "->name" not followed by "=" (an assignment; "==" is a read).
void collect_reads(const std::string& code, std::set<std::string>& reads) {
  auto ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t i = 0; i + 1 < code.size(); ++i) {
    const bool dot = code[i] == '.' && !(i > 0 && std::isdigit(static_cast<unsigned char>(code[i - 1])));
    const bool arrow = code[i] == '>' && i > 0 && code[i - 1] == '-';
    if (!dot && !arrow) continue;
    size_t j = i + 1;
    while (j < code.size() && ident(code[j])) ++j;
    if (j == i + 1) continue;
    size_t k = j;
    while (k < code.size() && (code[k] == ' ' || code[k] == '\t')) ++k;
    const bool assigned = k + 1 < code.size() && code[k] == '=' && code[k + 1] != '=';
    if (!assigned) reads.insert(code.substr(i + 1, j - i - 1));
  }
}

/// Members read by the code that consumes Arguments: the files outside the parser that use
/// Arguments or TokenizerConfig, and arguments.cpp's regions marked
/// "flag-registry: consumers begin/end" (core_transformer_config_from_args & co.).
const std::set<std::string>& consumer_reads() {
  static const std::set<std::string> reads = [] {
    std::set<std::string> r;
    const fs::path root = MEGATRON_SOURCE_DIR;
    const std::set<std::string> parser = {"megatron/training/arguments.cpp", "megatron/training/arguments.h",
                                          "megatron/training/arg_utils.cpp", "megatron/training/checkpoint_args.cpp"};
    std::vector<fs::path> files = {root / "pretrain_gpt.cpp"};
    // pretrain_gpt's consumers: the library and the program (tools/ and examples/ are other
    // programs with parsers of their own: their reads of a TokenizerConfig member do not count).
    for (const char* dir : {"megatron"}) {
      if (!fs::exists(root / dir)) continue;
      for (const auto& e : fs::recursive_directory_iterator(root / dir)) {
        const std::string ext = e.path().extension().string();
        if (e.is_regular_file() && (ext == ".cpp" || ext == ".h" || ext == ".cu" || ext == ".cuh")) files.push_back(e.path());
      }
    }
    for (const auto& f : files) {
      const std::string rel = fs::relative(f, root).generic_string();
      const std::string code = strip_comments(read_file(f));
      if (rel == "megatron/training/arguments.cpp") {
        const std::string raw = read_file(f);
        for (size_t a = raw.find("flag-registry: consumers begin"); a != std::string::npos;
             a = raw.find("flag-registry: consumers begin", a + 1)) {
          const size_t b = raw.find("flag-registry: consumers end", a);
          collect_reads(strip_comments(raw.substr(a, b - a)), r);
        }
        continue;
      }
      if (parser.count(rel)) continue;
      if (code.find("Arguments") == std::string::npos && code.find("TokenizerConfig") == std::string::npos) continue;
      collect_reads(code, r);
    }
    return r;
  }();
  return reads;
}

/// A value Megatron's parser would take for `m` (its default, the enum prefix stripped), or a
/// typed sample when the default is None.
std::vector<std::string> sample_values(const MegatronFlagInfo& m) {
  if (m.arity == 0) return {};
  std::string v = m.default_str;
  if (m.kind == 'e' && v.find('.') != std::string::npos) v = v.substr(v.rfind('.') + 1);
  if (v == "None" || v.empty() || v.front() == '[') v = m.kind == 'i' ? "1" : m.kind == 'f' ? "0.5" : "x";
  return std::vector<std::string>(m.arity > 1 ? static_cast<size_t>(m.arity) : 1u, v);
}

const MegatronFlagInfo* megatron_flag_of(const std::string& flag) {
  static const std::vector<MegatronFlagInfo> table = megatron_flag_table();
  for (const auto& m : table)
    if (m.name == flag) return &m;
  return nullptr;
}

/// The error text of parsing `args` (empty when it parses).
std::string parse_error(const std::vector<std::string>& args) {
  try {
    parse_args(args);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(FlagRegistry, EveryOptionHasADisposition) {
  const auto reg = flag_registry();
  ASSERT_GT(reg.size(), 150u);
  for (const auto& f : reg) EXPECT_FALSE(f.dest.empty()) << f.flag << " is registered without a disposition";
  // And the registry is what parse_args accepts: a flag outside it is refused.
  EXPECT_NE(parse_error({"--no-such-flag"}).find("--no-such-flag"), std::string::npos);
}

TEST(FlagRegistry, ImplementedFlagsAreReadByCode) {
  const auto& reads = consumer_reads();
  ASSERT_GT(reads.size(), 100u);  // the scan found the consumers
  int checked = 0;
  for (const auto& f : flag_registry()) {
    if (f.disposition != FlagDisposition::kImplemented) continue;
    EXPECT_FALSE(f.reads.empty()) << f.flag << ": implemented but names no member it is read through";
    for (const auto& m : f.reads) {
      EXPECT_TRUE(reads.count(m)) << f.flag << " is stored in '" << m
                                  << "', which no code outside the parser reads: implement it, or note/refuse it";
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(FlagRegistry, NotedFlagsRecordTheirNote) {
  int checked = 0;
  for (const auto& f : flag_registry()) {
    if (f.disposition != FlagDisposition::kNoted) continue;
    const MegatronFlagInfo* m = megatron_flag_of(f.flag);
    ASSERT_NE(m, nullptr) << f.flag;
    std::vector<std::string> args = {f.flag};
    for (const auto& v : sample_values(*m)) args.push_back(v);
    Arguments a;
    try {
      a = parse_args(args);
    } catch (const UserError& e) {
      ADD_FAILURE() << f.flag << ": " << e.what();
      continue;
    }
    bool found = false;
    for (const auto& [flag, note] : a.notes) found = found || (flag == f.flag && !note.empty() && note == f.note);
    EXPECT_TRUE(found) << f.flag << " given without its note";
    ++checked;
  }
  EXPECT_GT(checked, 10);
}

TEST(FlagRegistry, RefusedFlagsNameThemselves) {
  for (const auto& f : flag_registry()) {
    if (f.disposition != FlagDisposition::kRefused) continue;
    std::vector<std::string> args = {f.flag};
    if (const MegatronFlagInfo* m = megatron_flag_of(f.flag))
      for (const auto& v : sample_values(*m)) args.push_back(v);
    const std::string err = parse_error(args);
    EXPECT_NE(err.find(f.flag), std::string::npos) << f.flag << ": refusal does not name it: '" << err << "'";
  }
}

// Flags whose only implemented value is Megatron's default: another value stops at validate_args
// with a line naming the flag.
TEST(FlagRegistry, DefaultOnlyFlagsRefuseOtherValuesByName) {
  int checked = 0;
  for (const auto& f : flag_registry()) {
    if (f.disposition != FlagDisposition::kDefaultOnly) continue;
    std::vector<std::string> args = {"--num-layers", "1", "--hidden-size", "8", "--num-attention-heads", "1",
                                     "--seq-length", "4", "--max-position-embeddings", "4", "--micro-batch-size", "1",
                                     "--train-iters", "1", "--lr", "0.1", "--mock-data", f.flag, f.note};
    std::string err;
    try {
      Arguments a = parse_args(args);
      validate_args(a);
    } catch (const UserError& e) {
      err = e.what();
    }
    EXPECT_NE(err.find(f.flag), std::string::npos) << f.flag << " " << f.note << " was not refused by name: '" << err << "'";
    ++checked;
  }
  EXPECT_GE(checked, 1);
}

// Megatron's parser has several option strings for some actions (--save-interval and
// --persistent-save-interval; --no-fp8-wgrad and --disable-fp8-wgrad; ...) and several actions
// for some dests (--x / --no-x): for every dest we register, every Megatron spelling is accepted.
TEST(FlagRegistry, EveryMegatronSpellingOfARegisteredDestIsAccepted) {
  std::set<std::string> names, dests;
  std::map<std::string, std::string> primary;
  for (const auto& f : flag_registry()) {
    names.insert(f.flag);
    primary[f.flag] = f.flag;
    for (const auto& a : f.aliases) {
      names.insert(a);
      primary[a] = f.flag;
    }
    if (megatron_flag_of(f.flag)) dests.insert(f.dest);
  }
  for (const auto& m : megatron_flag_table()) {
    if (!dests.count(m.dest)) continue;
    EXPECT_TRUE(names.count(m.name)) << m.name << " (dest " << m.dest << ") is Megatron's spelling of a flag we register";
    if (!names.count(m.name)) continue;
    std::vector<std::string> args = {m.name};
    for (const auto& v : sample_values(m)) args.push_back(v);
    Arguments a;
    try {
      a = parse_args(args);
    } catch (const UserError& e) {
      // A value the flag's own checks refuse is fine here (the spelling was recognised).
      EXPECT_EQ(std::string(e.what()).find("unknown flag"), std::string::npos) << m.name << ": " << e.what();
      continue;
    }
    EXPECT_NE(std::find(a.given_flags.begin(), a.given_flags.end(), primary[m.name]), a.given_flags.end())
        << m.name << " did not reach " << primary[m.name];
  }
}

TEST(FlagRegistry, OtherMegatronFlagsAreRefusedByName) {
  std::set<std::string> names;
  for (const auto& f : flag_registry()) {
    names.insert(f.flag);
    names.insert(f.aliases.begin(), f.aliases.end());
  }
  int refused = 0;
  for (const auto& m : megatron_flag_table()) {
    if (names.count(m.name)) continue;
    std::vector<std::string> args = {m.name};
    for (const auto& v : sample_values(m)) args.push_back(v);
    const std::string err = parse_error(args);
    EXPECT_NE(err.find(m.name), std::string::npos) << m.name << " was not refused by name: '" << err << "'";
    ++refused;
  }
  EXPECT_GT(refused, 100);
}

TEST(FlagRegistry, FlagsMegatronLacksAreDocumented) {
  const std::string doc = read_file(fs::path(MEGATRON_SOURCE_DIR) / "docs" / "training.md");
  ASSERT_FALSE(doc.empty());
  for (const auto& f : flag_registry()) {
    if (megatron_flag_of(f.flag)) continue;
    EXPECT_NE(doc.find("`" + f.flag + "`"), std::string::npos)
        << f.flag << " is not a Megatron-LM flag: docs/training.md must say why it exists";
  }
}
