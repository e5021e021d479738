// torch.save archives (PyTorch's zip serialization, torch/serialization.py `_save` and
// caffe2/serialize/inline_container): read and write without Python.
//
// An archive is a zip file whose entries sit under one folder `<archive>/` and are stored
// uncompressed ("stored", method 0), data aligned to 64 bytes by padding in the local header's
// extra field:
//   <archive>/data.pkl     the pickled object (protocol 2). Tensors are
//                          torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride,
//                          requires_grad, OrderedDict()), the storage a persistent id
//                          ('storage', torch.<Type>Storage, '<key>', '<location>', numel)
//   <archive>/byteorder    "little"
//   <archive>/data/<key>   raw little-endian bytes of storage <key>
//   <archive>/version      "3\n" (the format version torch.load checks)
// Zip64 records are read and written when an entry or offset does not fit 32 bits.
// A DCP `.distcp` file is a concatenation of such archives (one per tensor chunk) and raw
// byte blobs; each archive's offsets are relative to its own first byte.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "megatron/core/dist_checkpointing/torch_dist/pickle.h"
#include "megatron/core/tensor/tensor.h"

namespace megatron::dist_checkpointing::torch_dist {

/// CRC-32 (ISO-HDLC / zlib polynomial 0xEDB88320), as stored in zip headers.
uint32_t crc32_zip(const void* data, size_t n, uint32_t crc = 0);

/// One stored entry of a zip archive (offsets relative to the archive's first byte).
struct ZipEntry {
  std::string name;
  uint64_t data_offset = 0;
  uint64_t size = 0;
  uint32_t crc32 = 0;
};

/// Parses the central directory of an uncompressed zip archive held in [data, data + size).
/// Throws UserError "<what>: ..." for anything malformed (truncated, compressed entries,
/// offsets outside the buffer, CRC mismatch when `verify_crc`).
std::vector<ZipEntry> parse_zip(const uint8_t* data, size_t size, const std::string& what, bool verify_crc = true);

/// A tensor read from a torch.save archive: contiguous row-major bytes, pointing into the
/// archive's buffer (which must outlive it) or, for a strided view, into `owned`.
struct TorchTensor {
  DType dtype = DType::kFloat32;
  Shape shape;
  const uint8_t* data = nullptr;  // numel * dtype_size bytes
  std::vector<uint8_t> owned;
  size_t nbytes() const { return static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype); }
};

/// A parsed torch.save archive.
struct TorchArchive {
  PickleDoc doc;
  const PyValue* root = nullptr;
  /// Tensors referenced by `root`: every `_rebuild_tensor_v2` object is given the index of its
  /// tensor here in PyValue::i (the object's `i` field).
  std::vector<TorchTensor> tensors;
};

/// Reads a torch.save archive from memory. `what` names it in errors (e.g.
/// "ckpt/iter_0000005/__0_0.distcp at byte 1234 (key 'embedding.word_embeddings.weight')").
/// Throws UserError for malformed archives, refused pickle globals, storage types we have no
/// dtype for, and tensors that reach outside their storage.
void read_torch_archive(const uint8_t* data, size_t size, const std::string& what, TorchArchive& out);

/// Builder for torch.save archives.
class TorchArchiveWriter {
 public:
  /// `archive_name`: the folder inside the zip ("archive" for streams, the file stem for files).
  explicit TorchArchiveWriter(std::string archive_name = "archive") : name_(std::move(archive_name)) {}
  PickleDoc& doc() { return doc_; }
  /// A `_rebuild_tensor_v2` value for a contiguous CPU tensor (its bytes are copied at finish()).
  const PyValue* tensor(DType dtype, const Shape& shape, const void* data);
  /// The complete archive with `root` as data.pkl.
  std::string finish(const PyValue* root);

 private:
  std::string name_;
  PickleDoc doc_;
  std::vector<std::pair<const uint8_t*, size_t>> storages_;
};

/// Writes zip records (stored, 64-byte aligned data) in order; used by TorchArchiveWriter.
std::string write_zip(const std::vector<std::pair<std::string, std::string_view>>& records);

/// DType for a torch dtype global name ("torch.float32"; torch's names are dtype_name()'s);
/// throws UserError "<where>: unsupported tensor dtype ..." otherwise.
DType dtype_from_torch_name(const std::string& name, const std::string& where);

/// Integers of a tuple / list / torch.Size value; throws UserError "<where>: ..." otherwise.
std::vector<int64_t> int_tuple(const PyValue* v, const std::string& where);

}  // namespace megatron::dist_checkpointing::torch_dist
