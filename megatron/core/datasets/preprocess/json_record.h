// Extracting the --json-keys values of one JSONL record with Python json.loads semantics.
//
// Megatron-LM's tools/preprocess_data.py runs `json.loads(line)` then `data[key]`. The fast
// path is simdjson's DOM parser (full validation, UTF-8 included); when it rejects a line, a
// small Python-compatible parser decides, so that every input Python accepts is accepted the
// same way (NaN/Infinity, integers of any size, lone surrogate escapes in other fields) and
// every input Python rejects is rejected with a column. Duplicate keys: the LAST occurrence
// wins, as in Python (simdjson's own lookup would return the first).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace megatron::datasets::preprocess {

/// The value found for one requested key.
struct KeyValue {
  enum class Kind { kMissing, kString, kStringList, kOther };
  Kind kind = Kind::kMissing;
  /// kString: one entry; kStringList: the list's strings in order (Megatron treats a list as
  /// pre-split sentences). UTF-8.
  std::vector<std::string> strings;
  /// For kOther / a non-string list element: the JSON type name ("number", "null", ...).
  std::string type_name;
  /// True if a string contains an unpaired UTF-16 surrogate escape (e.g. "\ud800"): Python
  /// accepts it in json.loads, but no tokenizer can encode it.
  bool lone_surrogate = false;
};

/// Parses JSON records and pulls out the requested keys. One instance per thread.
class JsonRecordParser {
 public:
  explicit JsonRecordParser(std::vector<std::string> keys);
  ~JsonRecordParser();
  JsonRecordParser(const JsonRecordParser&) = delete;
  JsonRecordParser& operator=(const JsonRecordParser&) = delete;

  /// Parses `line` (which must be followed by 64 readable bytes). On success fills `out`
  /// (one KeyValue per key, in key order) and returns an empty string; on a record Python's
  /// json.loads rejects (or a top-level value that is not an object) returns a one-line reason.
  std::string parse(std::string_view line, std::vector<KeyValue>& out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The Python-compatible fallback parser alone (exposed for tests). Same contract as
/// JsonRecordParser::parse, without the padding requirement.
std::string parse_record_python_compatible(std::string_view line, const std::vector<std::string>& keys,
                                           std::vector<KeyValue>& out);

}  // namespace megatron::datasets::preprocess
