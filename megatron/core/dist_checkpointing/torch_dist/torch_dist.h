// Megatron-LM `--ckpt-format torch_dist` checkpoints (PyTorch Distributed Checkpoint, DCP, as
// written by Megatron's TorchDistSaveShardedStrategy): read and write, without Python.
//
// Layout of a checkpoint directory (docs/checkpointing.md, "torch_dist"):
//   metadata.json        {"sharded_backend": "torch_dist", "sharded_backend_version": 1}
//   common.pt            torch.save of the non-sharded state (args Namespace, iteration, scheduler,
//                        optimizer param groups, ...); Megatron-LM since July 2026 writes it as the
//                        ShardedObject "common_state" of the .distcp files instead (we write both)
//   .metadata            pickled torch.distributed.checkpoint.metadata.Metadata: per key either
//                        TensorStorageMetadata (dtype, global size, chunks = boxes (offsets, sizes))
//                        or BytesStorageMetadata; storage_data maps MetadataIndex(key, chunk offsets)
//                        to _StorageInfo(relative_path, offset, length)
//   __<rank>_<i>.distcp  per writing rank (and writer thread): concatenated items; a tensor chunk is
//                        one complete torch.save archive, a bytes item (ShardedObject) raw bytes
//                        (Megatron: torch.save of [object])
// Keys are Megatron's ShardedTensor keys (decoder.layers.* stacked with a leading layer axis);
// ShardedObjects appear under their unique key "<key>/shard_<offsets joined by .>_<shape ...>".
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/dist_checkpointing/mapping.h"
#include "megatron/core/dist_checkpointing/torch_dist/torch_save.h"

namespace megatron::dist_checkpointing::torch_dist {

/// metadata.json["sharded_backend"] of Megatron's torch_dist format.
inline constexpr const char* kTorchDistBackend = "torch_dist";
/// Prefix of the ShardedObjects we add (our RNG state etc.), which Megatron ignores.
inline constexpr const char* kOwnObjectPrefix = "megatron_cpp.";

/// Unique key of the ShardedObject holding the common state in Megatron-LM's current layout
/// (torch.save of [dict]; older checkpoints have common.pt instead).
inline constexpr const char* kCommonStateKey = "common_state/shard_0_1";

/// True if `dir/metadata.json` names the torch_dist backend (no other file is opened).
bool is_torch_dist_checkpoint(const std::string& dir);

/// One stored chunk (a box of the global tensor) and where its torch.save archive lies.
struct DcpChunk {
  Shape offsets, sizes;
  std::string file;
  uint64_t offset = 0, length = 0;
};
struct DcpTensorMeta {
  DType dtype = DType::kFloat32;
  Shape size;
  std::vector<DcpChunk> chunks;
};
struct DcpBytesMeta {
  std::string file;
  uint64_t offset = 0, length = 0;
};
/// The parsed `.metadata`.
struct DcpMetadata {
  std::map<std::string, DcpTensorMeta> tensors;
  std::map<std::string, DcpBytesMeta> bytes;
  std::string version;  // DCP format version ("1.0.0"; empty for older writers)
};

/// Parses a `.metadata` pickle. `what` names the file in errors. Throws UserError for refused
/// globals, malformed records, chunks without storage, unsupported stream transforms.
DcpMetadata parse_dcp_metadata(const uint8_t* data, size_t size, const std::string& what);
/// Reads and parses `dir/.metadata` (after checking metadata.json names torch_dist).
DcpMetadata read_dcp_metadata(const std::string& dir);
/// `.metadata` pickle for `md` (torch's Metadata / TensorStorageMetadata / ... classes, as
/// torch.distributed.checkpoint writes them; loadable by its FileSystemReader).
std::string dcp_metadata_pickle(const DcpMetadata& md, const std::string& checkpoint_id);

/// A torch.save value as JSON: scalars, str, lists/tuples (arrays), dicts (objects; non-string
/// keys as their JSON text), argparse.Namespace and dataclasses (their attribute dicts), enums
/// (their value), torch dtypes ("torch.bfloat16"), one-element tensors (their number), other
/// tensors ({"__tensor__": shape}), bytes ({"__bytes__": n}). Throws UserError past depth 64.
nlohmann::json py_to_json(const PyValue* v, const TorchArchive* archive, const std::string& where);
/// The inverse for JSON values (objects become dicts; strings "torch.<dtype>" stay strings).
const PyValue* json_to_py(const nlohmann::json& j, PickleDoc& doc);

/// The common state as JSON via py_to_json(): `dir/common.pt` (torch.save archive) when present,
/// else the `common_state` object of `.metadata` (Megatron-LM since July 2026). Throws UserError
/// when neither exists or the archive is malformed.
nlohmann::json load_common(const std::string& dir);

/// Options of load().
struct LoadOptions {
  /// Checkpoint key for one of our tensor keys (default: the same key).
  std::function<std::string(const std::string&)> key_map;
};

/// Loads every tensor of `sd` in place from a torch_dist checkpoint, assembled from whichever
/// stored chunks overlap it (any TP/PP/DP layout, flattened ranges included; floating dtypes
/// converted). Objects of `sd` are looked up under kOwnObjectPrefix + key and parsed as JSON
/// (`loaded` false when absent). Returns common.pt as JSON.
/// Throws UserError naming the file and key for: missing key, global shape mismatch, chunks not
/// covering the request, truncated / corrupt archives, refused pickle globals.
nlohmann::json load(ShardedStateDict& sd, const std::string& dir, const LoadOptions& opts = {});

/// Options of save().
struct SaveOptions {
  /// Checkpoint key for one of our tensor keys (default: the same key); an empty string leaves
  /// the tensor out of the checkpoint.
  std::function<std::string(const std::string&)> key_map;
  /// Rank 0: builds the value pickled into common.pt and the "common_state" object (default:
  /// json_to_py(sd.common)); called once per archive, tensors may be added to the writer.
  std::function<const PyValue*(TorchArchiveWriter&)> common;
  /// ShardedObject unique keys whose value is None, written by this rank as torch.save([None])
  /// (Megatron's `_extra_state` entries of its linear layers, which its loader requests).
  std::vector<std::string> none_objects;
};

/// Writes `sd` as a torch_dist checkpoint into `dir` (collective over `group`): every rank writes
/// `__<rank>_0.distcp` with its replica-0 tensors (a flattened range is written as the few boxes
/// it covers) and its objects (rank 0 also the common state as the object kCommonStateKey, like
/// Megatron-LM since July 2026); rank 0 then writes `.metadata`, `common.pt`, `metadata.json`. Done
/// in `<dir>.tmp-<pid>` and renamed into place (an existing checkpoint there is replaced).
/// Throws UserError on I/O failure or when two ranks write the same chunk.
void save(const ShardedStateDict& sd, const std::string& dir, comm::ProcessGroup* group, const SaveOptions& opts = {});

/// Splits the flat range [b, e) of a row-major box of shape `shape` into the boxes it covers
/// (offsets relative to the box), at most 2 * rank - 1 of them, in order. Exposed for tests.
std::vector<std::pair<Shape, Shape>> flat_range_boxes(const Shape& shape, int64_t b, int64_t e);

}  // namespace megatron::dist_checkpointing::torch_dist
