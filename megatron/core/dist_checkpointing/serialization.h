// Save and load of sharded state (Megatron's dist_checkpointing.save / .load), our on-disk
// format (docs/checkpointing.md):
//
//   <checkpoint_dir>/
//     __<rank>_0.safetensors   one per rank: the shards this rank writes (replica 0 only), in
//                              safetensors layout; tensor names "<key>/shard_<o0>_<o1>..." and
//                              the shard records in __metadata__["megatron_cpp.shards"]
//     common.json              common state (rank 0)
//     .metadata                JSON index: every key → dtype, global shape, shards (global offset,
//                              local shape, flattened range, file, absolute byte range, crc32c)
//     metadata.json            {"sharded_backend": "megatron_cpp_safetensors",
//                               "sharded_backend_version": 1} — written last
//
// Crash safety: everything is written into "<checkpoint_dir>.tmp-<pid of rank 0>/", each file
// fsynced; rank 0 then atomically puts the finished directory in place (rename, or an atomic
// exchange with an existing directory of the same name, which is then removed). A process killed
// at any moment leaves either the old directory or the complete new one.
//
// Collectives: every rank of `group` must call save/finalize/load in the same order. With
// group == nullptr a single-rank group is used. All files must be on a filesystem every rank sees.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "megatron/core/dist_checkpointing/mapping.h"
#include "megatron/core/comm/process_group.h"

namespace megatron::dist_checkpointing {

/// Name in metadata.json["sharded_backend"].
inline constexpr const char* kShardedBackend = "megatron_cpp_safetensors";
inline constexpr int kShardedBackendVersion = 1;

/// One stored chunk of a tensor (from the .metadata index).
struct StoredShard {
  Shape global_offset;
  Shape local_shape;
  std::optional<std::pair<int64_t, int64_t>> flattened_range;
  std::string file;          // relative to the checkpoint dir
  std::string name;          // tensor name inside the file
  uint64_t byte_begin = 0;   // absolute offsets in `file`
  uint64_t byte_end = 0;
  uint32_t crc32c = 0;       // CRC-32C of bytes [byte_begin, byte_end)
};

/// Index entry of one key.
struct StoredTensor {
  std::string key;
  DType dtype = DType::kFloat32;
  Shape global_shape;
  std::vector<StoredShard> shards;
};

/// The parsed .metadata index.
struct CheckpointIndex {
  std::string dir;
  std::map<std::string, StoredTensor> tensors;
  std::map<std::string, StoredTensor> objects;  // JSON objects stored as U8 tensors (grid shape)
};

/// An in-flight save. Created by save_async() (write running in the background) or used
/// internally by save(). finalize() must be called by every rank, on the thread that owns the
/// group: it joins the writer, synchronises the ranks, and rank 0 publishes the checkpoint and
/// then runs the registered finalize functions (e.g. the tracker-file update).
class AsyncSaveRequest {
 public:
  ~AsyncSaveRequest();
  /// True once this rank's background write finished (successfully or not). Local, no collective.
  bool write_done() const;
  /// Blocks until the write is done, then publishes (collective). Rethrows a writer failure.
  void finalize();
  /// Runs on rank 0 after the checkpoint is in place (in registration order).
  void add_finalize_fn(std::function<void()> fn) { finalize_fns_.push_back(std::move(fn)); }
  const std::string& checkpoint_dir() const { return dir_; }
  struct State;  // implementation detail (serialization.cpp)

 private:
  friend std::unique_ptr<AsyncSaveRequest> save_async(const ShardedStateDict&, const std::string&,
                                                      comm::ProcessGroup*);
  friend void save(const ShardedStateDict&, const std::string&, comm::ProcessGroup*,
                   std::vector<std::function<void()>>);
  std::unique_ptr<State> st_;
  std::string dir_;
  std::vector<std::function<void()>> finalize_fns_;
  bool finalized_ = false;
};

/// Saves `sd` into `checkpoint_dir` (created; an existing directory of that name is replaced
/// atomically). Synchronous: returns after the checkpoint is complete on disk on every rank.
/// Throws UserError on I/O failures (naming the file) and on inconsistent shards (two ranks
/// writing the same piece, pieces not covering a tensor, dtype/shape disagreement across ranks).
/// `finalize_fns` run on rank 0 once the checkpoint is in place (as AsyncSaveRequest's); a
/// failure in one of them is reported on every rank (collective vote), none waits forever.
/// metadata.json records the CRC-32C of common.json, .metadata and itself (load refuses a
/// mismatch, naming the file).
void save(const ShardedStateDict& sd, const std::string& checkpoint_dir, comm::ProcessGroup* group = nullptr,
          std::vector<std::function<void()>> finalize_fns = {});

/// Like save(), but takes a snapshot (a CPU copy of every tensor this rank writes) and writes it on
/// a background thread; training may modify the tensors as soon as this returns. Call
/// finalize() on the returned request (all ranks) to publish the checkpoint.
std::unique_ptr<AsyncSaveRequest> save_async(const ShardedStateDict& sd, const std::string& checkpoint_dir,
                                             comm::ProcessGroup* group = nullptr);

/// Options for load().
struct LoadOptions {
  /// Verify the CRC-32C of every stored chunk that is read (default on).
  bool verify_checksums = true;
  /// Bytes per pread (a multiple of 8); 0: MEGATRON_CKPT_READ_CHUNK_MB, else 4 MiB. Tests use
  /// tiny values to put chunk boundaries inside every stored piece.
  size_t read_chunk_bytes = 0;
};

/// Loads every requested tensor of `sd` in place: each ShardedTensor's `data` (pre-allocated,
/// any device, any float dtype — values are converted when the stored dtype differs) receives
/// its box / flattened range, assembled from whichever stored chunks overlap it (resharding
/// across TP/PP/DP). ShardedObjects found get `value` and `loaded = true`; missing ones keep
/// loaded = false. Returns the common state.
/// Throws UserError naming the key and file for: not a checkpoint (no metadata.json), missing
/// key, global-shape mismatch, missing file, checksum mismatch, chunks not covering the request.
nlohmann::json load(ShardedStateDict& sd, const std::string& checkpoint_dir, const LoadOptions& opts = {});

/// Only the common state (common.json).
nlohmann::json load_common_state(const std::string& checkpoint_dir);

/// Parses the .metadata index (after checking metadata.json).
CheckpointIndex load_index(const std::string& checkpoint_dir);

/// Throws UserError unless `checkpoint_dir` holds a complete checkpoint in our format.
void check_is_distributed_checkpoint(const std::string& checkpoint_dir);

/// Copies the overlap of two boxes (exposed for tests). Source: box (so, ss) of a global tensor,
/// holding flat elements [sb, se) of the box at `src` (dtype sdt); destination likewise. Returns
/// the number of elements copied. Floating dtypes are converted; other dtypes must match.
int64_t copy_box_overlap(const uint8_t* src, DType sdt, const Shape& so, const Shape& ss, int64_t sb, int64_t se,
                         uint8_t* dst, DType ddt, const Shape& dof, const Shape& ds, int64_t db, int64_t de);

}  // namespace megatron::dist_checkpointing
