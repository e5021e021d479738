// The preprocess_data pipeline against Megatron's documented behaviour (docs/megatron-reference.md#preprocess_data
// #preprocess_data): the golden vectors through the whole pipeline, output order independent of
// worker count and batch size, Megatron's partition order, compressed inputs, log lines.
#include <gtest/gtest.h>
#include <zlib.h>
#include <zstd.h>

#include <random>
#include <regex>

#include "megatron/core/datasets/indexed_dataset.h"
#include "megatron/core/datasets/preprocess/json_record.h"
#include "megatron/core/datasets/preprocess/sentence_splitter.h"
#include "megatron/core/utils/errors.h"
#include "preprocess_test_util.h"

namespace megatron {
namespace {

namespace pp = datasets::preprocess;
using testing::TempDir;

// Appendix A: 10 docs, doc i = (i mod 4)+3 ids 10i+1.. then EOD 999; vocab 1000 -> uint16.
const char* kGoldenIdxHex =
    "4d4d494449445800000100000000000000080a000000000000000b0000000000000004000000050000000600000007000000040000"
    "0005000000060000000700000004000000050000000000000000000000080000000000000012000000000000001e00000000000000"
    "2c0000000000000034000000000000003e000000000000004a000000000000005800000000000000600000000000000000000000000"
    "000000100000000000000020000000000000003000000000000000400000000000000050000000000000006000000000000000700"
    "000000000000080000000000000009000000000000000a00000000000000";

std::string golden_jsonl() {
  std::string s;
  for (int i = 0; i < 10; ++i) {
    s += "{\"text\": \"";
    for (int j = 1; j <= (i % 4) + 3; ++j) s += (j > 1 ? " " : "") + std::to_string(10 * i + j);
    s += "\"}\n";
  }
  return s;
}

std::string hex(const std::string& b) {
  static const char* h = "0123456789abcdef";
  std::string s;
  for (unsigned char c : b) {
    s += h[c >> 4];
    s += h[c & 15];
  }
  return s;
}

pp::PreprocessConfig base_cfg(const TempDir& d, const std::string& in, const std::string& out) {
  pp::PreprocessConfig c;
  c.inputs = {d / in};
  c.output_prefix = d / out;
  c.append_eod = true;
  c.progress_bar = 0;
  return c;
}

TEST(PreprocessPipeline, AppendixAGoldenVectors) {
  TempDir d;
  testing::write_file(d / "in.jsonl", golden_jsonl());
  auto tok = tokenizers::build_tokenizer(testing::null_tokenizer_config(1000));
  for (int workers : {1, 3}) {
    auto cfg = base_cfg(d, "in.jsonl", "w" + std::to_string(workers));
    cfg.workers = workers;
    auto st = testing::run_pipeline(cfg, *tok);
    EXPECT_EQ(st.documents, 10u);
    EXPECT_EQ(st.tokens, 53u);
    std::string p = d / ("w" + std::to_string(workers) + "_text_document");
    EXPECT_EQ(hex(testing::read_file(p + ".idx")), kGoldenIdxHex);
    EXPECT_EQ(testing::md5_file(p + ".bin"), "89a5cacce6396cc0bd067b7ae4febd06");
  }
}

// Random NullTokenizer documents; returns the JSONL and the expected id lists (with EOD).
std::string random_corpus(int n, std::vector<std::vector<int64_t>>& docs) {
  std::mt19937 rng(7);
  std::string s;
  for (int i = 0; i < n; ++i) {
    int len = 1 + static_cast<int>(rng() % 40);
    std::vector<int64_t> ids;
    s += "{\"id\": " + std::to_string(i) + ", \"text\": \"";
    for (int j = 0; j < len; ++j) {
      ids.push_back(rng() % 999);
      s += (j ? " " : "") + std::to_string(ids.back());
    }
    s += "\"}\n";
    ids.push_back(999);
    docs.push_back(ids);
  }
  return s;
}

std::vector<std::vector<int64_t>> read_docs(const std::string& prefix) {
  datasets::IndexedDataset ds(prefix);
  std::vector<std::vector<int64_t>> v;
  for (size_t i = 0; i < ds.num_sequences(); ++i) v.push_back(ds.get(i));
  return v;
}

TEST(PreprocessPipeline, OutputOrderIndependentOfWorkersAndBatches) {
  TempDir d;
  std::vector<std::vector<int64_t>> docs;
  testing::write_file(d / "in.jsonl", random_corpus(700, docs));
  auto tok = tokenizers::build_tokenizer(testing::null_tokenizer_config(1000));
  std::string ref_bin, ref_idx;
  for (auto [workers, batch] : std::vector<std::pair<int, size_t>>{{1, 1 << 20}, {4, 64}, {3, 1000}, {8, 1}}) {
    auto cfg = base_cfg(d, "in.jsonl", "o");
    cfg.workers = workers;
    cfg.batch_bytes = batch;
    testing::run_pipeline(cfg, *tok);
    std::string p = d / "o_text_document";
    if (ref_bin.empty()) {
      ref_bin = testing::read_file(p + ".bin");
      ref_idx = testing::read_file(p + ".idx");
      EXPECT_EQ(read_docs(p), docs);  // input order, expected ids built independently
    } else {
      EXPECT_EQ(testing::read_file(p + ".bin"), ref_bin) << workers << " workers, batch " << batch;
      EXPECT_EQ(testing::read_file(p + ".idx"), ref_idx) << workers << " workers, batch " << batch;
    }
  }
}

// Megatron: --partitions P without --keep-sequential-samples deals line i to partition i % P and
// merges partitions 0..P-1 in order; with --keep-sequential-samples the order is kept.
TEST(PreprocessPipeline, PartitionOrderAsMegatron) {
  TempDir d;
  std::vector<std::vector<int64_t>> docs;
  testing::write_file(d / "in.jsonl", random_corpus(101, docs));
  auto tok = tokenizers::build_tokenizer(testing::null_tokenizer_config(1000));
  auto cfg = base_cfg(d, "in.jsonl", "rr");
  cfg.workers = 3;
  cfg.partitions = 3;
  cfg.batch_bytes = 200;
  testing::run_pipeline(cfg, *tok);
  std::vector<std::vector<int64_t>> expect;
  for (int p = 0; p < 3; ++p)
    for (size_t i = static_cast<size_t>(p); i < docs.size(); i += 3) expect.push_back(docs[i]);
  EXPECT_EQ(read_docs(d / "rr_text_document"), expect);
  for (const auto& e : std::filesystem::directory_iterator(d.path))
    EXPECT_EQ(e.path().filename().string().find("tmp"), std::string::npos) << "leftover " << e.path();

  cfg.output_prefix = d / "seq";
  cfg.keep_sequential_samples = true;
  testing::run_pipeline(cfg, *tok);
  EXPECT_EQ(read_docs(d / "seq_text_document"), docs);
}

TEST(PreprocessPipeline, CompressedInputsGiveSameBytes) {
  TempDir d;
  std::vector<std::vector<int64_t>> docs;
  std::string text = random_corpus(300, docs);
  testing::write_file(d / "in.jsonl", text);
  gzFile gz = gzopen((d / "in.jsonl.gz").c_str(), "wb");
  gzwrite(gz, text.data(), static_cast<unsigned>(text.size()));
  gzclose(gz);
  std::string z(ZSTD_compressBound(text.size()), '\0');
  z.resize(ZSTD_compress(z.data(), z.size(), text.data(), text.size(), 3));
  testing::write_file(d / "in.jsonl.zst", z);
  auto tok = tokenizers::build_tokenizer(testing::null_tokenizer_config(1000));
  std::vector<std::string> bins;
  for (std::string in : {"in.jsonl", "in.jsonl.gz", "in.jsonl.zst"}) {
    auto cfg = base_cfg(d, in, "o");
    cfg.workers = 2;
    cfg.batch_bytes = 4096;
    auto st = testing::run_pipeline(cfg, *tok);
    EXPECT_EQ(st.documents, 300u) << in;
    bins.push_back(testing::read_file(d / "o_text_document.bin") + testing::read_file(d / "o_text_document.idx"));
  }
  EXPECT_EQ(bins[0], bins[1]);
  EXPECT_EQ(bins[0], bins[2]);
}

// A truncated .gz/.zst (cut inside the compressed stream, here right after a complete line's
// worth of data may already be decodable) is an error naming the file, not a shorter dataset:
// Python's gzip/zstd readers raise EOFError there.
TEST(PreprocessPipeline, TruncatedCompressedInputStops) {
  TempDir d;
  std::vector<std::vector<int64_t>> docs;
  std::string text = random_corpus(300, docs);
  gzFile gz = gzopen((d / "in.jsonl.gz").c_str(), "wb");
  gzwrite(gz, text.data(), static_cast<unsigned>(text.size()));
  gzclose(gz);
  std::string z(ZSTD_compressBound(text.size()), '\0');
  z.resize(ZSTD_compress(z.data(), z.size(), text.data(), text.size(), 3));
  std::string g = testing::read_file(d / "in.jsonl.gz");
  testing::write_file(d / "in.jsonl.gz", g.substr(0, g.size() - 12));  // drop part of the deflate end + trailer
  testing::write_file(d / "in.jsonl.zst", z.substr(0, z.size() - 8));
  auto tok = tokenizers::build_tokenizer(testing::null_tokenizer_config(1000));
  for (std::string in : {"in.jsonl.gz", "in.jsonl.zst"}) {
    auto cfg = base_cfg(d, in, "o");
    std::string err;
    try {
      testing::run_pipeline(cfg, *tok);
    } catch (const UserError& e) {
      err = e.what();
    }
    EXPECT_NE(err.find(in + ": truncated"), std::string::npos) << in << ": " << err;
    EXPECT_FALSE(std::filesystem::exists(d / "o_text_document.idx")) << in;
  }
}

// Lines far longer than the read batch, with every kind of line end at awkward places.
TEST(PreprocessPipeline, LongLinesAndLineEnds) {
  TempDir d;
  std::string big;
  for (int i = 0; i < 1500000; ++i) big += i ? " 3" : "3";  // 3 MB of text in one record
  std::string in = "{\"text\": \"1\"}\r\n{\"text\": \"" + big + "\"}\r{\"text\": \"2\"}\r\n{\"text\": \"" + big +
                   "\"}\n{\"text\": \"4\"}";
  testing::write_file(d / "in.jsonl", in);
  auto tok = tokenizers::build_tokenizer(testing::null_tokenizer_config(1000));
  auto cfg = base_cfg(d, "in.jsonl", "o");
  cfg.batch_bytes = 1000;
  auto st = testing::run_pipeline(cfg, *tok);
  EXPECT_EQ(st.documents, 5u);
  auto docs = read_docs(d / "o_text_document");
  ASSERT_EQ(docs.size(), 5u);
  EXPECT_EQ(docs[1].size(), 1500001u);
  EXPECT_EQ(docs[2], (std::vector<int64_t>{2, 999}));
  EXPECT_EQ(docs[4], (std::vector<int64_t>{4, 999}));
}

// A "\r\n" split exactly across the reader's 1 MiB read boundary is one line end, not two
// (a blank line in between would be an error).
TEST(PreprocessPipeline, CrLfAcrossReadBoundary) {
  TempDir d;
  const size_t kChunk = 1 << 20;
  std::string head = "{\"text\": \"1\", \"pad\": \"";
  std::string line = head + std::string(kChunk - 1 - head.size() - 2, 'x') + "\"}";
  ASSERT_EQ(line.size(), kChunk - 1);  // '\r' is the chunk's last byte, '\n' the next one's first
  testing::write_file(d / "in.jsonl", line + "\r\n{\"text\": \"2\"}\r\n");
  auto tok = tokenizers::build_tokenizer(testing::null_tokenizer_config(1000));
  auto cfg = base_cfg(d, "in.jsonl", "o");
  auto st = testing::run_pipeline(cfg, *tok);
  EXPECT_EQ(st.documents, 2u);
  EXPECT_EQ(read_docs(d / "o_text_document"), (std::vector<std::vector<int64_t>>{{1, 999}, {2, 999}}));
}

// One dataset per key, named {prefix}_{key}_document; --append-eod skips empty documents but
// they keep a boundary (repeated document index, docs/megatron-reference.md#indexed-dataset-format).
TEST(PreprocessPipeline, SeveralKeysAndEmptyDocuments) {
  TempDir d;
  testing::write_file(d / "in.jsonl",
                      "{\"a\": \"1 2\", \"b\": \"3\"}\n{\"a\": [], \"b\": \"4\"}\n{\"a\": \"5\", \"b\": [\"6\", \"7 8\"]}\n");
  auto tok = tokenizers::build_tokenizer(testing::null_tokenizer_config(1000));
  auto cfg = base_cfg(d, "in.jsonl", "o");
  cfg.json_keys = {"a", "b"};
  cfg.workers = 2;
  testing::run_pipeline(cfg, *tok);
  datasets::IndexedDataset a(d / "o_a_document"), b(d / "o_b_document");
  EXPECT_EQ(a.num_documents(), 3u);
  EXPECT_EQ(a.num_sequences(), 2u);
  EXPECT_EQ(std::vector<int64_t>(a.document_indices(), a.document_indices() + 4), (std::vector<int64_t>{0, 1, 1, 2}));
  EXPECT_EQ(b.num_sequences(), 4u);
  EXPECT_EQ(b.get(2), (std::vector<int64_t>{6}));
  EXPECT_EQ(b.get(3), (std::vector<int64_t>{7, 8, 999}));  // EOD counted in the last sentence
}

// --split-sentences writes {prefix}_{key}_sentence with one sequence per non-empty sentence
// (ICU boundaries; NullTokenizer text has none inside "1 2 3", so the list gives the sentences).
TEST(PreprocessPipeline, SplitSentencesOutputName) {
  TempDir d;
  testing::write_file(d / "in.jsonl", "{\"text\": \"1 2 3\"}\n{\"text\": [\"4\", \"5 6\"]}\n");
  auto tok = tokenizers::build_tokenizer(testing::null_tokenizer_config(1000));
  auto cfg = base_cfg(d, "in.jsonl", "o");
  cfg.split_sentences = true;
  testing::run_pipeline(cfg, *tok);
  EXPECT_EQ(read_docs(d / "o_text_sentence"), (std::vector<std::vector<int64_t>>{{1, 2, 3, 999}, {4}, {5, 6, 999}}));
  EXPECT_FALSE(std::filesystem::exists(d / "o_text_document.bin"));
}

// Progress lines: Megatron's exact text with Python float reprs, every log_interval docs.
TEST(PreprocessPipeline, ProgressLines) {
  TempDir d;
  testing::write_file(d / "in.jsonl", golden_jsonl());
  auto tok = tokenizers::build_tokenizer(testing::null_tokenizer_config(1000));
  auto cfg = base_cfg(d, "in.jsonl", "o");
  cfg.log_interval = 4;
  std::string err;
  testing::run_pipeline(cfg, *tok, &err);
  std::regex line(R"(Processed (\d+) documents \([0-9.e+-]+ docs/s, [0-9.e+-]+ MB/s\)\.)");
  std::vector<std::string> counts;
  for (std::sregex_iterator it(err.begin(), err.end(), line), end; it != end; ++it) counts.push_back((*it)[1]);
  EXPECT_EQ(counts, (std::vector<std::string>{"4", "8"})) << err;
}

// Python's repr(float) for values we print (values and reprs checked against CPython rules:
// shortest round-trip digits, scientific below 1e-4 and from 1e16).
TEST(PreprocessPipeline, PythonFloatRepr) {
  EXPECT_EQ(pp::python_float_repr(5.0), "5.0");
  EXPECT_EQ(pp::python_float_repr(0.1), "0.1");
  EXPECT_EQ(pp::python_float_repr(1234.5), "1234.5");
  EXPECT_EQ(pp::python_float_repr(123456789.0), "123456789.0");
  EXPECT_EQ(pp::python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(pp::python_float_repr(1.5e-05), "1.5e-05");
  EXPECT_EQ(pp::python_float_repr(1e16), "1e+16");
  EXPECT_EQ(pp::python_float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(pp::python_float_repr(1.0 / 3), "0.3333333333333333");
  EXPECT_EQ(pp::python_float_repr(2.0 / 3 * 1000), "666.6666666666666");
  EXPECT_EQ(pp::python_float_repr(0.0), "0.0");
}

// Characters, not bytes, as Python's len(json_line) (+1 for the newline).
TEST(PreprocessPipeline, CharacterCount) {
  EXPECT_EQ(pp::count_code_points("a\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80", 10), 4u);
}

// The Python-compatible parser and the simdjson path agree on what they both accept.
TEST(PreprocessPipeline, JsonPathsAgree) {
  std::vector<std::string> keys{"text", "t2"};
  pp::JsonRecordParser parser(keys);
  for (std::string line : {std::string(R"({"text": "a\u00e9\ud83d\ude00\n\"x\"", "t2": ["p", "q"]})"),
                           std::string(R"({"t2": "z", "text": "", "n": [1, {"a": null}]})"),
                           std::string(R"(  {"text":"x","text":"y","t2":"w"}  )")}) {
    std::vector<pp::KeyValue> a, b;
    std::string padded = line + std::string(64, ' ');
    EXPECT_EQ(parser.parse(std::string_view(padded.data(), line.size()), a), "");
    EXPECT_EQ(pp::parse_record_python_compatible(line, keys, b), "");
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].kind, b[i].kind) << line;
      EXPECT_EQ(a[i].strings, b[i].strings) << line;
    }
  }
  std::vector<pp::KeyValue> v;
  EXPECT_EQ(pp::parse_record_python_compatible(R"({"text": "\ud83d\ude00"})", {"text"}, v), "");
  EXPECT_EQ(v[0].strings[0], "\xf0\x9f\x98\x80");
  EXPECT_NE(pp::parse_record_python_compatible(R"({"text": "a"} x)", {"text"}, v).find("Extra data"), std::string::npos);
  EXPECT_NE(pp::parse_record_python_compatible(R"({"text": 01})", {"text"}, v).find("Expecting ','"), std::string::npos);
  EXPECT_NE(pp::parse_record_python_compatible("\xEF\xBB\xBF{}", {"text"}, v).find("BOM"), std::string::npos);
}

// ICU sentence segmentation (UAX #29): "." "?" "!" followed by space and an uppercase letter end
// a sentence; surrounding whitespace is stripped unless keep_newlines.
TEST(PreprocessPipeline, SentenceSplitterIcu) {
  pp::SentenceSplitter s("english", false);
  auto v = s.split("Hello world. How are you?  Fine!\nNext line");
  EXPECT_EQ(v, (std::vector<std::string_view>{"Hello world.", "How are you?", "Fine!", "Next line"}));
  pp::SentenceSplitter k("english", true);
  auto w = k.split("One.\n\nTwo.");
  EXPECT_EQ(w, (std::vector<std::string_view>{"One.\n\n", "Two."}));
  EXPECT_EQ(pp::punkt_lang_to_locale("german"), "de");
}

}  // namespace
}  // namespace megatron
