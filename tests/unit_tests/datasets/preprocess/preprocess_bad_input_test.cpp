// Bad input to preprocess_data: each case is handled as Megatron-LM's tools/preprocess_data.py
// handles it (docs/megatron-reference.md#preprocess_data: Python's json.loads + `data[key]` + numpy), or
// stopped with an error naming file:line; --skip-invalid-lines counts and skips instead.
// Expected bytes come from Megatron's own run (tests/reference/preprocess/megatron_oracle_md5.txt)
// or from hand computation of the .idx layout (docs/megatron-reference.md#indexed-dataset-format).
#include <gtest/gtest.h>

#include <filesystem>

#include "megatron/core/datasets/indexed_dataset.h"
#include "megatron/core/datasets/preprocess/json_record.h"
#include "megatron/core/utils/errors.h"
#include "preprocess_test_util.h"

namespace megatron {
namespace {

using datasets::IndexedDataset;
using datasets::preprocess::PreprocessConfig;
using testing::TempDir;

struct Fixture {
  TempDir dir;
  std::unique_ptr<tokenizers::MegatronTokenizer> tok =
      tokenizers::build_tokenizer(testing::null_tokenizer_config(1000));
  PreprocessConfig cfg;
  Fixture() {
    cfg.inputs = {dir / "in.jsonl"};
    cfg.output_prefix = dir / "out";
    cfg.append_eod = true;
    cfg.workers = 2;
    cfg.progress_bar = 0;
  }
  std::string prefix() const { return dir / "out_text_document"; }
  /// Runs and returns the UserError message ("" if none).
  std::string run_error(const std::string& content) {
    testing::write_file(cfg.inputs[0], content);
    try {
      testing::run_pipeline(cfg, *tok);
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  }
  bool outputs_exist() const {
    return std::filesystem::exists(prefix() + ".bin") || std::filesystem::exists(prefix() + ".idx") ||
           std::filesystem::exists(prefix() + ".bin.tmp") || std::filesystem::exists(prefix() + ".idx.tmp");
  }
  std::vector<std::vector<int64_t>> sequences() const {
    IndexedDataset ds(prefix());
    std::vector<std::vector<int64_t>> v;
    for (size_t i = 0; i < ds.num_sequences(); ++i) v.push_back(ds.get(i));
    return v;
  }
};

// Megatron: json.loads raises JSONDecodeError and the run dies. Ours: stop naming file:line.
TEST(PreprocessBadInput, MalformedJsonStopsWithFileAndLine) {
  Fixture f;
  std::string e = f.run_error("{\"text\": \"1 2\"}\n{\"text\": \"3 4\",}\n");
  EXPECT_NE(e.find("in.jsonl:2: invalid JSON"), std::string::npos) << e;
  EXPECT_FALSE(f.outputs_exist()) << "no .bin/.idx (not even temporary ones) after a failed run";
}

// A blank line: json.loads('\n') raises in Megatron (docs/megatron-reference.md#preprocess_data).
TEST(PreprocessBadInput, BlankLineStops) {
  Fixture f;
  std::string e = f.run_error("{\"text\": \"1 2\"}\n\n{\"text\": \"3\"}\n");
  EXPECT_NE(e.find("in.jsonl:2:"), std::string::npos) << e;
  EXPECT_NE(e.find("blank line"), std::string::npos) << e;
}

// Lines are cut like Python's universal newlines: "\r\n" and a lone "\r" end a line, so an
// error after them is reported on the right line.
TEST(PreprocessBadInput, LineNumbersFollowUniversalNewlines) {
  Fixture f;
  std::string e = f.run_error("{\"text\": \"1\"}\r\n{\"text\": \"2\"}\r{\"text\": \"3\"}\n{oops}\n");
  EXPECT_NE(e.find("in.jsonl:4:"), std::string::npos) << e;
}

// data[key] raises KeyError in Megatron.
TEST(PreprocessBadInput, MissingKeyStops) {
  Fixture f;
  std::string e = f.run_error("{\"text\": \"1\"}\n{\"txt\": \"2\"}\n");
  EXPECT_NE(e.find("in.jsonl:2: key 'text' is missing"), std::string::npos) << e;
}

// A key requested twice would write the same output files twice in Megatron: refused up front.
// (Before, the Python-compatible JSON path filled only the last of the two and said "missing".)
TEST(PreprocessBadInput, DuplicateJsonKeyIsRefused) {
  std::vector<datasets::preprocess::KeyValue> out;
  // Python: d = json.loads('{"text": "x"}'); [d[k] for k in ("text", "text")] == ["x", "x"].
  EXPECT_EQ(datasets::preprocess::parse_record_python_compatible("{\"text\": \"x\"}", {"text", "text"}, out), "");
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].kind, datasets::preprocess::KeyValue::Kind::kString);
  EXPECT_EQ(out[1].kind, datasets::preprocess::KeyValue::Kind::kString);
  EXPECT_EQ(out[0].strings, std::vector<std::string>{"x"});
  Fixture f;
  f.cfg.json_keys = {"text", "text"};
  std::string e = f.run_error("{\"text\": \"1\"}\n");
  EXPECT_NE(e.find("argument --json-keys: key 'text' is given twice"), std::string::npos) << e;
}

// A number/null/object as the value: Megatron's tokenizer fails on a non-string.
TEST(PreprocessBadInput, NonStringValueStops) {
  for (const char* v : {"12", "null", "{\"a\": 1}", "[\"1\", 2]", "true"}) {
    Fixture f;
    std::string e = f.run_error(std::string("{\"text\": ") + v + "}\n");
    EXPECT_NE(e.find("in.jsonl:1: key 'text' is a JSON"), std::string::npos) << v << ": " << e;
  }
}

// A list of strings is valid in Megatron: each string is a sentence (one sequence each, empty
// token lists dropped, EOD on the last one).
TEST(PreprocessBadInput, ListOfStringsIsSentences) {
  Fixture f;
  EXPECT_EQ(f.run_error("{\"text\": [\"1 2\", \"3\"]}\n"), "");
  EXPECT_EQ(f.sequences(), (std::vector<std::vector<int64_t>>{{1, 2}, {3, 999}}));
}

// Raw invalid UTF-8: Python's decoding of the file fails and the run dies.
TEST(PreprocessBadInput, InvalidUtf8Stops) {
  Fixture f;
  std::string e = f.run_error("{\"text\": \"1\"}\n{\"text\": \"2\", \"x\": \"\xff\xfe\"}\n");
  EXPECT_NE(e.find("in.jsonl:2: invalid JSON: invalid UTF-8"), std::string::npos) << e;
}

// --output-prefix in a folder that does not exist: Megatron dies (FileNotFoundError); we stop
// before reading, naming the folder and how to fix it, and write nothing.
TEST(PreprocessBadInput, MissingOutputFolderStops) {
  Fixture f;
  f.cfg.output_prefix = f.dir / "nodir/out";
  std::string e = f.run_error("{\"text\": \"1\"}\n");
  EXPECT_NE(e.find("does not exist; create it first (mkdir -p "), std::string::npos) << e;
  EXPECT_FALSE(std::filesystem::exists(f.dir / "nodir"));
}

// "\ud800" in the tokenized value: json.loads accepts it, the tokenizer cannot encode it.
// In another field Python accepts it and so do we.
TEST(PreprocessBadInput, LoneSurrogate) {
  Fixture f;
  std::string e = f.run_error("{\"text\": \"1 \\ud800\"}\n");
  EXPECT_NE(e.find("in.jsonl:1: key 'text' holds an unpaired UTF-16 surrogate"), std::string::npos) << e;
  Fixture g;
  EXPECT_EQ(g.run_error("{\"text\": \"1 2\", \"other\": \"\\ud800\"}\n"), "");
  EXPECT_EQ(g.sequences(), (std::vector<std::vector<int64_t>>{{1, 2, 999}}));
}

// A record over 1 MB (simdjson's default batch size) and over our 1 MB read batch.
TEST(PreprocessBadInput, RecordOverOneMegabyte) {
  Fixture f;
  std::string text;
  const int n = 400000;  // "7 " * 400000 = 800 KB of text; the line with the padding field > 1 MB
  for (int i = 0; i < n; ++i) text += i ? " 7" : "7";
  std::string line = "{\"pad\": \"" + std::string(300000, 'x') + "\", \"text\": \"" + text + "\"}\n";
  ASSERT_GT(line.size(), 1u << 20);
  EXPECT_EQ(f.run_error("{\"text\": \"1\"}\n" + line + "{\"text\": \"2\"}\n"), "");
  auto s = f.sequences();
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[1].size(), static_cast<size_t>(n + 1));
  EXPECT_EQ(s[2], (std::vector<int64_t>{2, 999}));
}

// Empty input: Megatron's builder finalizes an empty dataset: .bin of 0 bytes, .idx with
// S = 0 and D = 1 (document_indices = [0]) = 34 + 8 bytes.
TEST(PreprocessBadInput, EmptyFileGivesEmptyDataset) {
  Fixture f;
  EXPECT_EQ(f.run_error(""), "");
  EXPECT_EQ(testing::read_file(f.prefix() + ".bin").size(), 0u);
  std::string idx = testing::read_file(f.prefix() + ".idx");
  ASSERT_EQ(idx.size(), 42u);
  EXPECT_EQ(idx.substr(0, 9), std::string("MMIDIDX\0\0", 9));
  EXPECT_EQ(static_cast<uint8_t>(idx[17]), 8) << "uint16 for vocab 1000";
  IndexedDataset ds(f.prefix());
  EXPECT_EQ(ds.num_sequences(), 0u);
  EXPECT_EQ(ds.num_documents(), 0u);
}

// Duplicate keys: Python's dict keeps the LAST value (simdjson's lookup would take the first).
TEST(PreprocessBadInput, DuplicateKeysLastWins) {
  Fixture f;
  EXPECT_EQ(f.run_error("{\"text\": \"1\", \"text\": \"5 6\"}\n"), "");
  EXPECT_EQ(f.sequences(), (std::vector<std::vector<int64_t>>{{5, 6, 999}}));
}

// Python accepts NaN, Infinity and integers of any size in other fields.
TEST(PreprocessBadInput, PythonOnlyNumbersInOtherFields) {
  Fixture f;
  EXPECT_EQ(f.run_error("{\"a\": NaN, \"b\": -Infinity, \"c\": 123456789012345678901234567890, \"text\": \"4\"}\n"),
            "");
  EXPECT_EQ(f.sequences(), (std::vector<std::vector<int64_t>>{{4, 999}}));
  Fixture g;
  std::string e = g.run_error("{\"text\": NaN}\n");
  EXPECT_NE(e.find("key 'text' is a JSON number"), std::string::npos) << e;
}

// Token ids >= vocab_size but inside the dtype are written silently by Megatron (its run on
// {"1 2 3", "1500 2"} with --append-eod gave the bytes below); an id outside the dtype (70000
// for uint16) kills Megatron with numpy's OverflowError: we stop naming file:line.
TEST(PreprocessBadInput, TokenIdTooLargeForDtype) {
  Fixture f;
  EXPECT_EQ(f.run_error("{\"text\": \"1 2 3\"}\n{\"text\": \"1500 2\"}\n"), "");
  EXPECT_EQ(testing::md5_file(f.prefix() + ".bin"), "4f251ee296fbcda89767a8a656eb2725");  // Megatron nullbig
  EXPECT_EQ(testing::md5_file(f.prefix() + ".idx"), "f47a078312017dd4c4a27b4fe59dd95c");
  Fixture g;
  std::string e = g.run_error("{\"text\": \"1 2 3\"}\n{\"text\": \"70000 2\"}\n");
  EXPECT_NE(e.find("in.jsonl:2: key 'text': token id 70000 does not fit the dataset dtype uint16"), std::string::npos)
      << e;
  EXPECT_FALSE(g.outputs_exist());
}

// NullTokenizer on empty text: Python int('') raises ValueError in Megatron; we stop.
TEST(PreprocessBadInput, TokenizerFailureStops) {
  Fixture f;
  std::string e = f.run_error("{\"text\": \"1\"}\n{\"text\": \"x\"}\n");
  EXPECT_NE(e.find("in.jsonl:2: key 'text': tokenizer failed"), std::string::npos) << e;
}

// A top-level value that is not an object: `data[key]` raises TypeError in Megatron.
TEST(PreprocessBadInput, NonObjectRecordStops) {
  Fixture f;
  std::string e = f.run_error("[1, 2]\n");
  EXPECT_NE(e.find("in.jsonl:1: invalid JSON: the record is a JSON array, not an object"), std::string::npos) << e;
}

// Raw control characters inside a string: Python's strict decoder rejects them (simdjson
// would accept), a TAB between tokens is fine.
TEST(PreprocessBadInput, RawControlCharacters) {
  Fixture f;
  std::string e = f.run_error("{\"text\": \"1\t2\"}\n");
  EXPECT_NE(e.find("in.jsonl:1: invalid JSON: Invalid control character"), std::string::npos) << e;
  Fixture g;
  EXPECT_EQ(g.run_error("{\t\"text\":\t\"3\"}\n"), "");
  EXPECT_EQ(g.sequences(), (std::vector<std::vector<int64_t>>{{3, 999}}));
}

// --skip-invalid-lines: every bad case above is skipped and counted; the good lines are kept
// in order; a skipped line produces no document.
TEST(PreprocessBadInput, SkipInvalidLinesCountsAndSkips) {
  Fixture f;
  f.cfg.skip_invalid_lines = true;
  f.cfg.batch_bytes = 16;  // several batches, so skipping crosses batch boundaries
  std::string in =
      "{\"text\": \"1\"}\n"
      "{bad json\n"
      "\n"
      "{\"txt\": \"1\"}\n"
      "{\"text\": 5}\n"
      "{\"text\": \"\xff\"}\n"
      "{\"text\": \"\\ud800\"}\n"
      "{\"text\": \"70000\"}\n"
      "{\"text\": \"2 3\"}\n";
  testing::write_file(f.cfg.inputs[0], in);
  std::string err;
  auto st = testing::run_pipeline(f.cfg, *f.tok, &err);
  EXPECT_EQ(st.skipped_lines, 7u);
  EXPECT_EQ(st.documents, 2u);
  EXPECT_EQ(f.sequences(), (std::vector<std::vector<int64_t>>{{1, 999}, {2, 3, 999}}));
  EXPECT_NE(err.find("WARNING: skipping "), std::string::npos);
  EXPECT_NE(err.find("in.jsonl:2:"), std::string::npos) << err;
}

// A missing input file names the file and the flag.
TEST(PreprocessBadInput, MissingInputFile) {
  Fixture f;
  f.cfg.inputs = {f.dir / "nope.jsonl"};
  try {
    testing::run_pipeline(f.cfg, *f.tok);
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("nope.jsonl: cannot open input"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace megatron
