// Helpers shared by the preprocess_data tests: temp folders, files, MD5, running the pipeline.
#pragma once

#include <openssl/evp.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "megatron/core/datasets/preprocess/preprocess_pipeline.h"
#include "megatron/core/tokenizers/megatron_tokenizer.h"

namespace megatron::testing {

/// A fresh folder under /tmp, removed with its content at destruction.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/preprocess_test_XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};

inline void write_file(const std::string& path, const std::string& content) {
  std::ofstream f(path, std::ios::binary);
  f << content;
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline std::string md5_hex(const std::string& data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(data.data(), data.size(), md, &n, EVP_md5(), nullptr);
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned i = 0; i < n; ++i) {
    s += hex[md[i] >> 4];
    s += hex[md[i] & 15];
  }
  return s;
}

inline std::string md5_file(const std::string& path) { return md5_hex(read_file(path)); }

inline tokenizers::TokenizerConfig null_tokenizer_config(int64_t vocab_size) {
  tokenizers::TokenizerConfig c;
  c.tokenizer_type = "NullTokenizer";
  c.vocab_size = vocab_size;
  return c;
}

/// Runs the pipeline with quiet streams; returns the stats. Errors propagate (UserError).
inline datasets::preprocess::PreprocessStats run_pipeline(const datasets::preprocess::PreprocessConfig& cfg,
                                                          const tokenizers::MegatronTokenizer& tok,
                                                          std::string* err_text = nullptr) {
  std::ostringstream out, err;
  auto st = datasets::preprocess::run_preprocess(cfg, tok, out, err, std::chrono::steady_clock::now());
  if (err_text) *err_text = err.str();
  return st;
}

inline std::string source_dir() {
  const char* e = std::getenv("MEGATRON_SOURCE_DIR");
  return e ? e : MEGATRON_SOURCE_DIR;
}

}  // namespace megatron::testing
