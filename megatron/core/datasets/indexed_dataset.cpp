#include "megatron/core/datasets/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include "megatron/core/utils/errors.h"
#include "megatron/core/utils/temp_file.h"

namespace megatron::datasets {

namespace {
constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
constexpr size_t kHeaderSize = 34;

void write_all(FILE* f, const void* p, size_t n, const std::string& path) {
  if (n && std::fwrite(p, 1, n, f) != n) user_error(path, ": write failed: ", std::strerror(errno));
}

template <class T>
void store_le(char* dst, T v) {
  std::memcpy(dst, &v, sizeof(T));  // x86-64 / aarch64 are little-endian
}
}  // namespace

size_t index_dtype_size(IndexDType t) {
  switch (t) {
    case IndexDType::kUInt8:
    case IndexDType::kInt8: return 1;
    case IndexDType::kInt16:
    case IndexDType::kUInt16: return 2;
    case IndexDType::kInt32:
    case IndexDType::kFloat32: return 4;
    case IndexDType::kInt64:
    case IndexDType::kFloat64: return 8;
  }
  user_error("unknown .idx dtype code ", static_cast<int>(t));
}

const char* index_dtype_name(IndexDType t) {
  switch (t) {
    case IndexDType::kUInt8: return "uint8";
    case IndexDType::kInt8: return "int8";
    case IndexDType::kInt16: return "int16";
    case IndexDType::kInt32: return "int32";
    case IndexDType::kInt64: return "int64";
    case IndexDType::kFloat64: return "float64";
    case IndexDType::kFloat32: return "float32";
    case IndexDType::kUInt16: return "uint16";
  }
  return "?";
}

IndexDType optimal_index_dtype(int64_t cardinality) {
  return cardinality < 65500 ? IndexDType::kUInt16 : IndexDType::kInt32;
}

std::vector<int64_t> sequence_pointers(const std::vector<int32_t>& lengths, size_t itemsize) {
  std::vector<int64_t> pointers(lengths.size());
  int64_t p = 0;
  const int64_t isz = static_cast<int64_t>(itemsize);
  for (size_t i = 0; i < lengths.size(); ++i) {
    pointers[i] = p;
    p += static_cast<int64_t>(lengths[i]) * isz;
  }
  return pointers;
}

// ------------------------------------------------------------------------------------------
// Builder
// ------------------------------------------------------------------------------------------

IndexedDatasetBuilder::IndexedDatasetBuilder(std::string bin_path, IndexDType dtype, bool multimodal)
    : bin_path_(std::move(bin_path)), dtype_(dtype), multimodal_(multimodal) {
  index_dtype_size(dtype_);  // validates
  std::string tmp = bin_path_ + ".tmp";
  bin_ = std::fopen(tmp.c_str(), "wb");
  if (!bin_) user_error(tmp, ": cannot create: ", std::strerror(errno));
  std::setvbuf(bin_, nullptr, _IOFBF, 1 << 20);  // few large writes instead of one per 4 KiB
}

IndexedDatasetBuilder::~IndexedDatasetBuilder() {
  if (bin_) std::fclose(bin_);
  if (!finalized_) std::remove((bin_path_ + ".tmp").c_str());
}

namespace {
template <class T>
size_t encode_as(const int64_t* ids, size_t n, char* out, int64_t lo, int64_t hi) {
  for (size_t i = 0; i < n; ++i) {
    const int64_t v = ids[i];
    if (v < lo || v > hi) return i;
    store_le<T>(out + sizeof(T) * i, static_cast<T>(v));
  }
  return n;
}
}  // namespace

size_t encode_token_ids(IndexDType t, const int64_t* ids, size_t n, char* out) {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min(), kMax = std::numeric_limits<int64_t>::max();
  switch (t) {
    case IndexDType::kUInt8: return encode_as<uint8_t>(ids, n, out, 0, 255);
    case IndexDType::kInt8: return encode_as<int8_t>(ids, n, out, -128, 127);
    case IndexDType::kInt16: return encode_as<int16_t>(ids, n, out, -32768, 32767);
    case IndexDType::kUInt16: return encode_as<uint16_t>(ids, n, out, 0, 65535);
    case IndexDType::kInt32:
      return encode_as<int32_t>(ids, n, out, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max());
    case IndexDType::kInt64: return encode_as<int64_t>(ids, n, out, kMin, kMax);
    case IndexDType::kFloat32:
      for (size_t i = 0; i < n; ++i) store_le<float>(out + 4 * i, static_cast<float>(ids[i]));
      return n;
    case IndexDType::kFloat64:
      for (size_t i = 0; i < n; ++i) store_le<double>(out + 8 * i, static_cast<double>(ids[i]));
      return n;
  }
  return 0;
}

void encode_tokens(IndexDType t, const std::vector<int64_t>& ids, std::vector<char>& out) {
  out.resize(ids.size() * index_dtype_size(t));
  size_t ok = encode_token_ids(t, ids.data(), ids.size(), out.data());
  if (ok != ids.size())
    user_error("token id ", ids[ok], " does not fit the dataset dtype ", index_dtype_name(t),
               " (the tokenizer's vocab_size chose it); check --vocab-size / the tokenizer");
}

void IndexedDatasetBuilder::write_tokens(const int64_t* tokens, size_t n) {
  buf_.resize(n * index_dtype_size(dtype_));
  size_t ok = encode_token_ids(dtype_, tokens, n, buf_.data());
  if (ok != n)
    user_error(bin_path_, ": token id ", tokens[ok], " does not fit the dataset dtype ", index_dtype_name(dtype_),
               " (the tokenizer's vocab_size chose it); check --vocab-size / the tokenizer");
  write_all(bin_, buf_.data(), buf_.size(), bin_path_ + ".tmp");
  tokens_written_ += n;
}

void IndexedDatasetBuilder::add_item(const int64_t* tokens, size_t n) {
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    user_error(bin_path_, ": a sequence of ", n, " tokens exceeds the int32 length field of the .idx");
  write_tokens(tokens, n);
  lengths_.push_back(static_cast<int32_t>(n));
  if (multimodal_) modes_.push_back(0);
}

void IndexedDatasetBuilder::end_document() { doc_idx_.push_back(static_cast<int64_t>(lengths_.size())); }

void IndexedDatasetBuilder::add_document(const std::vector<int64_t>& tokens, const std::vector<int64_t>& lengths) {
  add_document(tokens.data(), tokens.size(), lengths.data(), lengths.size());
}

namespace {
// The sequence lengths of one document: each must fit the .idx's int32 length field (UserError
// naming the .bin otherwise) and together they must cover the document's num_tokens tokens.
void check_document_lengths(const std::string& bin_path, const int64_t* lengths, size_t num_lengths,
                            size_t num_tokens, const char* caller) {
  int64_t total = 0;
  for (size_t i = 0; i < num_lengths; ++i) {
    if (lengths[i] < 0 || lengths[i] > std::numeric_limits<int32_t>::max())
      user_error(bin_path, ": a sequence of ", lengths[i], " tokens does not fit the int32 length field of the .idx");
    total += lengths[i];
  }
  MEGATRON_CHECK(total == static_cast<int64_t>(num_tokens))
      << caller << ": lengths sum " << total << " != " << num_tokens << " tokens";
}
}  // namespace

void IndexedDatasetBuilder::add_document(const int64_t* tokens, size_t num_tokens, const int64_t* lengths,
                                         size_t num_lengths) {
  check_document_lengths(bin_path_, lengths, num_lengths, num_tokens, "add_document");
  write_tokens(tokens, num_tokens);
  for (size_t i = 0; i < num_lengths; ++i) lengths_.push_back(static_cast<int32_t>(lengths[i]));
  if (multimodal_) modes_.resize(lengths_.size(), 0);
  doc_idx_.push_back(static_cast<int64_t>(lengths_.size()));
}

void IndexedDatasetBuilder::add_document_encoded(const char* bytes, size_t num_tokens, const int64_t* lengths,
                                                 size_t num_lengths) {
  check_document_lengths(bin_path_, lengths, num_lengths, num_tokens, "add_document_encoded");
  write_all(bin_, bytes, num_tokens * index_dtype_size(dtype_), bin_path_ + ".tmp");
  tokens_written_ += num_tokens;
  for (size_t i = 0; i < num_lengths; ++i) lengths_.push_back(static_cast<int32_t>(lengths[i]));
  if (multimodal_) modes_.resize(lengths_.size(), 0);
  doc_idx_.push_back(static_cast<int64_t>(lengths_.size()));
}

void IndexedDatasetBuilder::add_index(const std::string& prefix) {
  IndexedDataset other(prefix, true);
  if (other.dtype() != dtype_)
    user_error(prefix, ".idx: dtype ", index_dtype_name(other.dtype()), " differs from the merged dataset's ",
               index_dtype_name(dtype_), " (datasets of different token dtypes, i.e. tokenizers, cannot be merged)");
  if (multimodal_ && other.num_sequences() > 0 && !other.has_sequence_modes())
    user_error(prefix, ".idx: has no sequence modes (not a multimodal index); drop --multimodal or rebuild it");
  int64_t offset = static_cast<int64_t>(lengths_.size());
  for (size_t i = 0; i < other.num_sequences(); ++i) lengths_.push_back(other.sequence_lengths()[i]);
  if (multimodal_)
    for (size_t i = 0; i < other.num_sequences(); ++i) modes_.push_back(other.sequence_modes()[i]);
  for (size_t i = 1; i <= other.num_documents(); ++i) doc_idx_.push_back(other.document_indices()[i] + offset);
  // byte-copy the .bin
  std::string bin = prefix + ".bin";
  FILE* in = std::fopen(bin.c_str(), "rb");
  if (!in) user_error(bin, ": cannot open: ", std::strerror(errno));
  struct Closer {
    FILE* f;
    ~Closer() { std::fclose(f); }
  } closer{in};
  std::vector<char> chunk(1 << 22);
  size_t n;
  uint64_t bytes = 0;
  while ((n = std::fread(chunk.data(), 1, chunk.size(), in)) > 0) {
    write_all(bin_, chunk.data(), n, bin_path_ + ".tmp");
    bytes += n;
  }
  if (std::ferror(in)) user_error(bin, ": read failed: ", std::strerror(errno));
  // IndexedDataset checked the .bin holds exactly the bytes its .idx describes; a file that
  // changed since is refused rather than concatenated with wrong pointers.
  const uint64_t expect = other.num_sequences() ? static_cast<uint64_t>(other.sequence_pointers()[other.num_sequences() - 1]) +
                                                      static_cast<uint64_t>(other.sequence_lengths()[other.num_sequences() - 1]) *
                                                          index_dtype_size(dtype_)
                                                : 0;
  if (bytes != expect) user_error(bin, ": changed while it was read (", bytes, " bytes, ", prefix, ".idx describes ", expect, ")");
  tokens_written_ += bytes / index_dtype_size(dtype_);
}

void IndexedDatasetBuilder::finalize(const std::string& idx_path) {
  MEGATRON_CHECK(!finalized_) << "finalize() called twice";
  if (std::fflush(bin_) != 0 || std::fclose(bin_) != 0) {
    bin_ = nullptr;
    user_error(bin_path_, ".tmp: write failed: ", std::strerror(errno));
  }
  bin_ = nullptr;
  const uint64_t S = lengths_.size(), D = doc_idx_.size();
  const std::vector<int64_t> pointers = sequence_pointers(lengths_, index_dtype_size(dtype_));
  // The .bin.tmp is removed by the destructor (not finalized); the .idx.tmp by this guard, on
  // every path out of here but the last rename.
  std::string tmp = idx_path + ".tmp";
  TempFileGuard idx_guard(tmp);
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) user_error(tmp, ": cannot create: ", std::strerror(errno));
  struct Closer {
    FILE*& f;
    ~Closer() {
      if (f) std::fclose(f);
    }
  } closer{f};
  char header[kHeaderSize];
  std::memcpy(header, kMagic, 9);
  store_le<uint64_t>(header + 9, 1);
  header[17] = static_cast<char>(dtype_);
  store_le<uint64_t>(header + 18, S);
  store_le<uint64_t>(header + 26, D);
  write_all(f, header, kHeaderSize, tmp);
  write_all(f, lengths_.data(), S * 4, tmp);
  write_all(f, pointers.data(), S * 8, tmp);
  write_all(f, doc_idx_.data(), D * 8, tmp);
  if (multimodal_) write_all(f, modes_.data(), modes_.size(), tmp);
  const bool flushed = std::fflush(f) == 0;
  const int err = errno;
  const bool closed = std::fclose(f) == 0;
  f = nullptr;
  if (!flushed || !closed) user_error(tmp, ": write failed: ", std::strerror(flushed ? errno : err));
  std::error_code ec;
  std::filesystem::remove(idx_path, ec);  // never leave an old .idx beside the new .bin
  if (std::rename((bin_path_ + ".tmp").c_str(), bin_path_.c_str()) != 0)
    user_error("cannot rename ", bin_path_, ".tmp to ", bin_path_, ": ", std::strerror(errno));
  if (std::rename(tmp.c_str(), idx_path.c_str()) != 0) {
    const int rerr = errno;
    std::remove(bin_path_.c_str());  // a .bin without its .idx is not a dataset
    user_error("cannot rename ", tmp, " to ", idx_path, ": ", std::strerror(rerr));
  }
  idx_guard.release();
  finalized_ = true;
}

// ------------------------------------------------------------------------------------------
// Reader
// ------------------------------------------------------------------------------------------

IndexedDataset::IndexedDataset(const std::string& prefix, bool mmap_bin) : prefix_(prefix), mmap_bin_(mmap_bin) {
  std::string idx = prefix + ".idx", bin = prefix + ".bin";
  int fd = ::open(idx.c_str(), O_RDONLY);
  if (fd < 0) user_error(idx, ": cannot open (", std::strerror(errno), "); is --data-path the prefix without .idx/.bin?");
  struct stat st {};
  ::fstat(fd, &st);
  idx_size_ = static_cast<size_t>(st.st_size);
  if (idx_size_ < kHeaderSize) {
    ::close(fd);
    user_error(idx, ": truncated header (", idx_size_, " bytes; a Megatron .idx has at least 34)");
  }
  idx_map_ = ::mmap(nullptr, idx_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (idx_map_ == MAP_FAILED) {
    idx_map_ = nullptr;
    user_error(idx, ": mmap failed: ", std::strerror(errno));
  }
  const char* base = static_cast<const char*>(idx_map_);
  if (std::memcmp(base, kMagic, 9) != 0) user_error(idx, ": bad magic (not a Megatron MMIDIDX index file)");
  uint64_t version, S, D;
  std::memcpy(&version, base + 9, 8);
  if (version != 1) user_error(idx, ": unsupported index version ", version, " (expected 1)");
  uint8_t code = static_cast<uint8_t>(base[17]);
  if (code < 1 || code > 8) user_error(idx, ": unknown dtype code ", static_cast<int>(code));
  dtype_ = static_cast<IndexDType>(code);
  std::memcpy(&S, base + 18, 8);
  std::memcpy(&D, base + 26, 8);
  uint64_t need = kHeaderSize + 12 * S + 8 * D;
  if (S > (1ull << 40) || D > (1ull << 40) || idx_size_ < need)
    user_error(idx, ": truncated (", idx_size_, " bytes, header says ", need, ")");
  // The arrays end the file; a multimodal index (Megatron's --multimodal) appends one int8 mode
  // per sequence, which a text dataset ignores (as Megatron's multimodal=False reader does). Any
  // other size means the header does not describe this file (Megatron reads it silently).
  if (idx_size_ != need && idx_size_ != need + S)
    user_error(idx, ": has ", idx_size_, " bytes but its header (", S, " sequences, ", D, " document indices) describes ",
               need, " (", need + S, " with sequence modes): corrupt or not a Megatron index; rebuild it with preprocess_data");
  has_modes_ = idx_size_ == need + S && S > 0;
  num_sequences_ = S;
  num_doc_idx_ = D;
  lengths_ = reinterpret_cast<const int32_t*>(base + kHeaderSize);
  pointers_ = reinterpret_cast<const int64_t*>(base + kHeaderSize + 4 * S);
  doc_idx_ = reinterpret_cast<const int64_t*>(base + kHeaderSize + 12 * S);
  if (D < 1 || doc_idx_[0] != 0 || static_cast<uint64_t>(doc_idx_[D - 1]) != S)
    user_error(idx, ": document indices do not span the ", S, " sequences (corrupt index)");

  int bfd = ::open(bin.c_str(), O_RDONLY);
  if (bfd < 0) user_error(bin, ": cannot open (", std::strerror(errno), ")");
  ::fstat(bfd, &st);
  bin_size_ = static_cast<size_t>(st.st_size);
  const uint64_t isz = index_dtype_size(dtype_);
  // Every writer of the format (Megatron's _IndexWriter, preprocess_data, merge_datasets) lays the
  // sequences out back to back from byte 0: pointer[i] = isz * (lengths[0] + ... + lengths[i-1]),
  // and the .bin holds exactly isz * sum(lengths) bytes. Both are required: a .bin of another
  // size is another dataset's, or the index was written for another dtype (uint16 tokens read as
  // int32 give garbage ids), and Megatron would train on it silently.
  uint64_t expect = 0;
  for (uint64_t i = 0; i < S; ++i) {
    const int64_t p = pointers_[i];
    const int32_t n = lengths_[i];
    if (n < 0 || p < 0 || static_cast<uint64_t>(p) != expect) {
      ::close(bfd);
      user_error(idx, ": sequence ", i, " (pointer ", p, ", length ", n, ") does not follow the previous one (expected pointer ",
                 expect, "): corrupt index; rebuild it with preprocess_data");
    }
    expect += static_cast<uint64_t>(n) * isz;
  }
  if (bin_size_ != expect) {
    ::close(bfd);
    user_error(bin, ": has ", bin_size_, " bytes but ", idx, " describes ", expect, " (", expect / isz, " ",
               index_dtype_name(dtype_), " tokens): the files do not belong together (another dataset's index, a "
               "different dtype, or a truncated copy); rebuild the pair with preprocess_data");
  }
  for (uint64_t j = 1; j < D; ++j) {
    if (doc_idx_[j] < doc_idx_[j - 1] || static_cast<uint64_t>(doc_idx_[j]) > S) {
      ::close(bfd);
      user_error(idx, ": document index ", j, " (", doc_idx_[j], ") is out of order or beyond the ", S,
                 " sequences: corrupt index; rebuild it with preprocess_data");
    }
  }
  if (mmap_bin_ && bin_size_ > 0) {
    bin_map_ = ::mmap(nullptr, bin_size_, PROT_READ, MAP_PRIVATE, bfd, 0);
    ::close(bfd);
    if (bin_map_ == MAP_FAILED) {
      bin_map_ = nullptr;
      user_error(bin, ": mmap failed: ", std::strerror(errno));
    }
  } else {
    bin_fd_ = bfd;
  }
}

IndexedDataset::~IndexedDataset() {
  if (idx_map_) ::munmap(idx_map_, idx_size_);
  if (bin_map_) ::munmap(bin_map_, bin_size_);
  if (bin_fd_ >= 0) ::close(bin_fd_);
}

void IndexedDataset::get(size_t idx, int64_t offset, int64_t length, std::vector<int64_t>& out) const {
  MEGATRON_CHECK(idx < num_sequences_) << "sequence " << idx << " of " << num_sequences_ << " in " << prefix_;
  int64_t len = lengths_[idx];
  if (length < 0) length = len - offset;
  MEGATRON_CHECK(offset >= 0 && offset + length <= len)
      << "get(" << idx << ", " << offset << ", " << length << ") beyond sequence length " << len;
  size_t isz = index_dtype_size(dtype_);
  size_t byte_off = static_cast<size_t>(pointers_[idx]) + static_cast<size_t>(offset) * isz;
  size_t nbytes = static_cast<size_t>(length) * isz;
  std::vector<char> tmp;
  const char* src;
  if (bin_map_) {
    src = static_cast<const char*>(bin_map_) + byte_off;
  } else {
    tmp.resize(nbytes);
    size_t done = 0;
    while (done < nbytes) {
      ssize_t r = ::pread(bin_fd_, tmp.data() + done, nbytes - done, static_cast<off_t>(byte_off + done));
      if (r <= 0) user_error(prefix_, ".bin: read failed at byte ", byte_off + done);
      done += static_cast<size_t>(r);
    }
    src = tmp.data();
  }
  size_t base = out.size();
  out.resize(base + static_cast<size_t>(length));
  int64_t* dst = out.data() + base;
  for (int64_t i = 0; i < length; ++i) {
    const char* p = src + static_cast<size_t>(i) * isz;
    switch (dtype_) {
      case IndexDType::kUInt8: dst[i] = *reinterpret_cast<const uint8_t*>(p); break;
      case IndexDType::kInt8: dst[i] = *reinterpret_cast<const int8_t*>(p); break;
      case IndexDType::kInt16: { int16_t v; std::memcpy(&v, p, 2); dst[i] = v; break; }
      case IndexDType::kUInt16: { uint16_t v; std::memcpy(&v, p, 2); dst[i] = v; break; }
      case IndexDType::kInt32: { int32_t v; std::memcpy(&v, p, 4); dst[i] = v; break; }
      case IndexDType::kInt64: { int64_t v; std::memcpy(&v, p, 8); dst[i] = v; break; }
      case IndexDType::kFloat32: { float v; std::memcpy(&v, p, 4); dst[i] = static_cast<int64_t>(v); break; }
      case IndexDType::kFloat64: { double v; std::memcpy(&v, p, 8); dst[i] = static_cast<int64_t>(v); break; }
    }
  }
}

}  // namespace megatron::datasets
