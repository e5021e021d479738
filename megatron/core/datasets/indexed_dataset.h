// Megatron's IndexedDataset: the MMIDIDX .idx/.bin pair (megatron/core/datasets/indexed_dataset.py).
//
// Format (docs/megatron-reference.md#indexed-dataset-format): .idx = 9-byte magic "MMIDIDX\0\0", u64 version 1,
// u8 dtype code, u64 sequence_count S, u64 document_count D, int32 lengths[S], int64 byte
// pointers[S], int64 document_indices[D]; .bin = the tokens, concatenated, little-endian.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace megatron::datasets {

/// Megatron's DType codes of the .idx header.
enum class IndexDType : uint8_t {
  kUInt8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat64 = 6,
  kFloat32 = 7,
  kUInt16 = 8,
};

/// Bytes per element of a code; throws UserError for an unknown code.
size_t index_dtype_size(IndexDType t);
/// Megatron's DType.optimal_dtype(cardinality): uint16 if cardinality < 65500 else int32.
IndexDType optimal_index_dtype(int64_t cardinality);
/// "uint16", "int32", ...
const char* index_dtype_name(IndexDType t);
/// Converts n token ids to dtype `t` as little-endian bytes at `out` (n * index_dtype_size(t)
/// bytes, numpy's astype for in-range values). Returns the index of the first id outside the
/// dtype's range (nothing is written from there on), or n when all fit.
size_t encode_token_ids(IndexDType t, const int64_t* ids, size_t n, char* out);
/// Same into a vector (resized); throws UserError naming the first id that does not fit.
void encode_tokens(IndexDType t, const std::vector<int64_t>& ids, std::vector<char>& out);

/// Megatron's _IndexWriter._sequence_pointers: the byte offset of each sequence in the .bin when
/// the sequences are stored back to back, pointer[i] = itemsize * (lengths[0] + ... +
/// lengths[i-1]), in int64 (a .bin beyond 4 GiB has offsets beyond 32 bits).
std::vector<int64_t> sequence_pointers(const std::vector<int32_t>& lengths, size_t itemsize);

/// Writes a .bin/.idx pair (Megatron's IndexedDatasetBuilder).
///
/// Tokens go to "<bin_path>.tmp"; finalize() writes "<idx_path>.tmp", then renames the .bin
/// and finally the .idx, so an interrupted run never leaves a pair that looks complete.
/// Throws UserError if a token does not fit the dtype (e.g. id 70000 with uint16).
class IndexedDatasetBuilder {
 public:
  /// multimodal: also record one int8 mode per sequence (Megatron's multimodal=True; add_item /
  /// add_document record mode 0, add_index copies the input's modes).
  IndexedDatasetBuilder(std::string bin_path, IndexDType dtype, bool multimodal = false);
  ~IndexedDatasetBuilder();
  IndexedDatasetBuilder(const IndexedDatasetBuilder&) = delete;
  IndexedDatasetBuilder& operator=(const IndexedDatasetBuilder&) = delete;

  /// Appends one sequence (Megatron add_item).
  void add_item(const int64_t* tokens, size_t n);
  void add_item(const std::vector<int64_t>& tokens) { add_item(tokens.data(), tokens.size()); }
  /// Marks the end of a document (Megatron end_document).
  void end_document();
  /// Appends a document made of sequences of the given lengths (tokens concatenated). An empty
  /// `lengths` still records a document boundary (repeated index), as Megatron does.
  void add_document(const std::vector<int64_t>& tokens, const std::vector<int64_t>& lengths);
  /// Same, from raw arrays: `num_tokens` tokens split into `num_lengths` sequences.
  void add_document(const int64_t* tokens, size_t num_tokens, const int64_t* lengths, size_t num_lengths);
  /// add_document() with the tokens already converted to this builder's dtype (encode_tokens).
  void add_document_encoded(const char* bytes, size_t num_tokens, const int64_t* lengths, size_t num_lengths);
  /// Appends another dataset (prefix without extension): its sequence lengths, its document
  /// indices shifted past ours (its leading 0 dropped), its .bin bytes (Megatron add_index).
  /// UserError naming the .idx when its dtype differs from the builder's, or when the builder is
  /// multimodal and the input has no sequence modes.
  void add_index(const std::string& prefix);
  /// Writes the .idx and publishes both files: an existing .idx of the same name is removed
  /// first, then the .bin and last the .idx are renamed into place, so no moment exists where
  /// a new .bin sits beside an old .idx.
  void finalize(const std::string& idx_path);

  size_t num_sequences() const { return lengths_.size(); }
  size_t num_documents() const { return doc_idx_.size() - 1; }
  uint64_t num_tokens() const { return tokens_written_; }

 private:
  void write_tokens(const int64_t* tokens, size_t n);
  std::string bin_path_;
  IndexDType dtype_;
  FILE* bin_ = nullptr;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> doc_idx_{0};
  bool multimodal_ = false;
  std::vector<int8_t> modes_;
  std::vector<char> buf_;
  uint64_t tokens_written_ = 0;
  bool finalized_ = false;
};

/// Reads a .bin/.idx pair (Megatron IndexedDataset). Validates the header, that the .idx is
/// exactly as long as its header says (plus one int8 mode per sequence for a multimodal index),
/// that the sequences lie back to back and that the .bin holds exactly the bytes the .idx
/// describes (stricter than Megatron, which checks none of this); every failure is a UserError
/// naming the file(s).
class IndexedDataset {
 public:
  /// `prefix` without extension. mmap_bin=false reads tokens with pread (--no-mmap-bin-files).
  explicit IndexedDataset(const std::string& prefix, bool mmap_bin = true);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& prefix() const { return prefix_; }
  IndexDType dtype() const { return dtype_; }
  size_t num_sequences() const { return num_sequences_; }
  /// Number of documents (document_indices length - 1).
  size_t num_documents() const { return num_doc_idx_ - 1; }
  const int32_t* sequence_lengths() const { return lengths_; }
  const int64_t* sequence_pointers() const { return pointers_; }
  /// document_indices[0..num_documents()] (inclusive end).
  const int64_t* document_indices() const { return doc_idx_; }
  /// True when the .idx carries Megatron's multimodal per-sequence modes (int8 after the arrays).
  bool has_sequence_modes() const { return has_modes_; }
  /// The int8 mode of each sequence (nullptr unless has_sequence_modes()).
  const int8_t* sequence_modes() const {
    return has_modes_ ? reinterpret_cast<const int8_t*>(doc_idx_ + num_doc_idx_) : nullptr;
  }

  /// Tokens [offset, offset+length) of sequence idx appended to `out` as int64
  /// (length < 0: to the end of the sequence). Megatron's get(idx, offset, length).
  void get(size_t idx, int64_t offset, int64_t length, std::vector<int64_t>& out) const;
  std::vector<int64_t> get(size_t idx, int64_t offset = 0, int64_t length = -1) const {
    std::vector<int64_t> v;
    get(idx, offset, length, v);
    return v;
  }

 private:
  std::string prefix_;
  IndexDType dtype_{};
  size_t num_sequences_ = 0;
  size_t num_doc_idx_ = 0;
  bool has_modes_ = false;
  // .idx is always memory-mapped
  void* idx_map_ = nullptr;
  size_t idx_size_ = 0;
  const int32_t* lengths_ = nullptr;
  const int64_t* pointers_ = nullptr;
  const int64_t* doc_idx_ = nullptr;
  // .bin: mmap or fd
  bool mmap_bin_ = true;
  void* bin_map_ = nullptr;
  size_t bin_size_ = 0;
  int bin_fd_ = -1;
};

}  // namespace megatron::datasets
