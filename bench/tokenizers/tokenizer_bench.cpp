// Tokenizer throughput: MB/s of UTF-8 text per thread for any --tokenizer-type.
//
//   build/bin/tokenizer_bench --tokenizer-type HuggingFaceTokenizer \
//       --tokenizer-model third_party/npm/@lenml__tokenizer-llama3/models [--threads 1] [--seconds 3]
//       [--input file.json|file.jsonl ...] [--dump-ids out.txt]
//
// Input: JSON arrays of strings (default: every npm nlp-corpus build, ~9.4 MB of real English)
// or JSONL files with a "text" field; the documents are tokenized one by one (as
// preprocess_data does), repeatedly until --seconds of thread CPU time have passed. MB = 10^6
// bytes of text. "per core" figures divide by the thread's CPU time (CLOCK_THREAD_CPUTIME_ID),
// so they hold on a shared, oversubscribed machine; wall-clock MB/s is printed beside them.
// --dump-ids writes one line of ids per document (for comparison with a reference).
#include <CLI/CLI.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <time.h>

#include "megatron/core/tokenizers/megatron_tokenizer.h"
#include "megatron/core/utils/errors.h"

namespace fs = std::filesystem;
using megatron::tokenizers::TokenizerConfig;

static std::vector<std::string> load_docs(const std::vector<std::string>& inputs) {
  std::vector<std::string> docs;
  for (const auto& p : inputs) {
    std::ifstream f(p, std::ios::binary);
    if (!f) megatron::user_error("--input: cannot open ", p);
    if (p.size() > 6 && p.substr(p.size() - 6) == ".jsonl") {
      std::string line;
      while (std::getline(f, line))
        if (!line.empty()) docs.push_back(nlohmann::json::parse(line)["text"].get<std::string>());
    } else {
      std::stringstream ss;
      ss << f.rdbuf();
      for (auto& s : nlohmann::json::parse(ss.str())) docs.push_back(s.get<std::string>());
    }
  }
  return docs;
}

int main(int argc, char** argv) {
  CLI::App app{"Tokenizer throughput benchmark"};
  TokenizerConfig cfg;
  std::string model, vocab, merges, pattern, dump;
  std::vector<std::string> inputs;
  int threads = 1;
  double seconds = 3.0;
  int64_t vocab_size = 0;
  app.add_option("--tokenizer-type", cfg.tokenizer_type)->required();
  app.add_option("--tokenizer-model", model);
  app.add_option("--vocab-file", vocab);
  app.add_option("--merge-file", merges);
  app.add_option("--vocab-size", vocab_size);
  app.add_option("--tiktoken-pattern", pattern);
  app.add_option("--input", inputs, "JSON array files or .jsonl files");
  app.add_option("--threads", threads);
  app.add_option("--seconds", seconds);
  app.add_option("--dump-ids", dump);
  CLI11_PARSE(app, argc, argv);
  try {
    if (!model.empty()) cfg.tokenizer_model = model;
    if (!vocab.empty()) cfg.vocab_file = vocab;
    if (!merges.empty()) cfg.merge_file = merges;
    if (!pattern.empty()) cfg.tiktoken_pattern = pattern;
    if (vocab_size) cfg.vocab_size = vocab_size;
    if (inputs.empty()) {
      fs::path d = fs::path(MEGATRON_SOURCE_DIR) / "third_party/npm/nlp-corpus/builds";
      if (!fs::exists(d)) megatron::user_error(d.string(), " missing: run scripts/setup.sh or pass --input");
      for (auto& e : fs::directory_iterator(d))
        if (e.path().extension() == ".json") inputs.push_back(e.path().string());
      std::sort(inputs.begin(), inputs.end());
    }
    auto t0 = std::chrono::steady_clock::now();
    auto tok = megatron::tokenizers::build_tokenizer(cfg);
    double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    auto docs = load_docs(inputs);
    size_t bytes = 0;
    for (auto& d : docs) bytes += d.size();
    if (!dump.empty()) {
      std::ofstream o(dump + ".tmp");
      for (auto& d : docs) {
        auto ids = tok->tokenize(d);
        for (size_t i = 0; i < ids.size(); ++i) o << (i ? " " : "") << ids[i];
        o << '\n';
      }
      o.close();
      fs::rename(dump + ".tmp", dump);
    }
    // Warm-up pass (fills the per-thread word caches as a long preprocessing run would).
    std::vector<double> mbps(threads), wall(threads);
    std::vector<size_t> tokens(threads);
    std::vector<std::thread> th;
    for (int t = 0; t < threads; ++t)
      th.emplace_back([&, t] {
        size_t ntok = 0;
        for (size_t i = t; i < docs.size(); i += threads) ntok += tok->tokenize(docs[i]).size();
        auto cpu = [] {
          timespec ts;
          clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
          return ts.tv_sec + ts.tv_nsec * 1e-9;
        };
        auto start = std::chrono::steady_clock::now();
        double c0 = cpu();
        size_t done = 0, n = 0;
        double el = 0;
        while (el < seconds) {
          for (size_t i = t; i < docs.size(); i += threads) {
            done += docs[i].size();
            n += tok->tokenize(docs[i]).size();
          }
          el = cpu() - c0;
        }
        mbps[t] = done / el / 1e6;
        wall[t] = done / std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / 1e6;
        tokens[t] = ntok;
      });
    for (auto& x : th) x.join();
    double total = 0, total_wall = 0;
    size_t ntok = 0;
    for (int t = 0; t < threads; ++t) total += mbps[t], total_wall += wall[t], ntok += tokens[t];
    std::cout << cfg.tokenizer_type << " " << model << vocab << ": " << docs.size() << " docs, "
              << bytes / 1e6 << " MB, " << ntok << " tokens (" << double(bytes) / ntok << " bytes/token), load "
              << load_s << " s; " << threads << " thread(s): " << total / threads << " MB/s per core (CPU time), "
              << total_wall << " MB/s wall total\n";
  } catch (const megatron::UserError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
