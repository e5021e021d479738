// Line-oriented reading of JSONL inputs (.jsonl, .jsonl.gz, .jsonl.zst) in batches.
//
// Lines are cut exactly as Python's text-mode file iteration cuts them (universal newlines:
// "\n", "\r\n" and a lone "\r" each end a line), which is what Megatron-LM's
// tools/preprocess_data.py does with `for line in fin`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace megatron::datasets::preprocess {

/// A batch of consecutive input lines. `data` holds the raw bytes of the lines, each followed
/// by at least 64 readable bytes (simdjson's padding), so a line can be parsed in place.
struct LineBatch {
  uint64_t seq = 0;              ///< batch number, 0-based, in input order
  uint64_t first_line = 0;       ///< 1-based line number of lines[0] within its file
  std::string file;              ///< input file the lines come from
  std::vector<char> data;        ///< raw bytes (+ padding)
  struct Line {
    uint64_t offset;             ///< byte offset into data
    uint32_t length;             ///< bytes, line terminator excluded
    bool has_newline;            ///< a terminator followed (Python counts it as 1 character)
  };
  std::vector<Line> lines;
  uint64_t input_bytes_done = 0; ///< bytes of the (possibly compressed) file consumed so far
};

/// Reads one input file and cuts it into LineBatch'es of about `batch_bytes` bytes (a batch
/// always holds whole lines; a line longer than batch_bytes makes a batch of its own).
/// Throws UserError naming the file on open/read/decompression errors.
class InputReader {
 public:
  /// Compression is chosen by the file name: ".gz" = gzip/zlib, ".zst" = zstd, else plain.
  InputReader(const std::string& path, size_t batch_bytes = 1 << 20);
  ~InputReader();
  InputReader(const InputReader&) = delete;
  InputReader& operator=(const InputReader&) = delete;

  /// Fills `out` with the next batch; returns false at end of file (out untouched).
  bool next(LineBatch& out);
  /// Size of the file on disk (compressed bytes for .gz/.zst).
  uint64_t file_size() const { return file_size_; }
  const std::string& path() const { return path_; }

  class Source;  ///< byte source (plain, gzip, zstd); defined in the .cpp

 private:
  size_t fill();  // reads more raw bytes into pending_, returns bytes added (0 = EOF)
  std::string path_;
  size_t batch_bytes_;
  uint64_t file_size_ = 0;
  std::unique_ptr<Source> src_;
  std::vector<char> pending_;  // decoded bytes not yet handed out
  size_t pending_start_ = 0;
  size_t scanned_ = 0;  // prefix of the pending bytes known to hold no line end
  bool eof_ = false;
  uint64_t next_line_ = 1;
  uint64_t next_seq_ = 0;
};

}  // namespace megatron::datasets::preprocess
