#include "megatron/core/dist_checkpointing/serialization.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "megatron/core/dist_checkpointing/file_utils.h"
#include "megatron/core/dist_checkpointing/safetensors.h"
#include "megatron/core/utils/crc32c.h"
#include "megatron/core/utils/errors.h"

namespace megatron::dist_checkpointing {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kShardsMetaKey = "megatron_cpp.shards";
constexpr const char* kIndexFile = ".metadata";
constexpr const char* kCommonFile = "common.json";
constexpr const char* kMarkerFile = "metadata.json";
// metadata.json: {file name: CRC-32C ("0x" and 8 hex digits) of its bytes} for common.json and .metadata,
// and the CRC-32C of metadata.json's own content (see marker_checksum).
constexpr const char* kChecksumsKey = "megatron_cpp_crc32c";
constexpr const char* kSelfChecksumKey = "megatron_cpp_crc32c_self";

std::string rank_file(int rank) { return "__" + std::to_string(rank) + "_0.safetensors"; }

std::string shard_name(const std::string& key, const Shape& offset,
                       const std::optional<std::pair<int64_t, int64_t>>& flat) {
  std::string n = key + "/shard";
  for (auto o : offset) n += "_" + std::to_string(o);
  if (flat) n += "_flat_" + std::to_string(flat->first) + "_" + std::to_string(flat->second);
  return n;
}

std::string hex32(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", v);
  return b;
}

// Error flag agreement across ranks: returns true if any rank reported failure.
bool any_rank_failed(comm::ProcessGroup* g, bool failed) {
  Tensor t = Tensor::from_vector({failed ? 1.0f : 0.0f}, {1});
  g->all_reduce(t, comm::ReduceOp::kMax)->wait();
  return t.to_float_vector()[0] > 0.5f;
}

json shard_json(const StoredShard& s) {
  json j = {{"global_offset", s.global_offset}, {"local_shape", s.local_shape}, {"file", s.file},
            {"name", s.name},                   {"byte_range", {s.byte_begin, s.byte_end}}, {"crc32c", s.crc32c}};
  if (s.flattened_range) j["flattened_range"] = {s.flattened_range->first, s.flattened_range->second};
  return j;
}

StoredShard shard_from_json(const json& j) {
  StoredShard s;
  s.global_offset = j.at("global_offset").get<Shape>();
  s.local_shape = j.at("local_shape").get<Shape>();
  if (j.contains("flattened_range"))
    s.flattened_range = std::make_pair(j["flattened_range"][0].get<int64_t>(), j["flattened_range"][1].get<int64_t>());
  s.file = j.at("file").get<std::string>();
  s.name = j.at("name").get<std::string>();
  s.byte_begin = j.at("byte_range")[0].get<uint64_t>();
  s.byte_end = j.at("byte_range")[1].get<uint64_t>();
  s.crc32c = j.at("crc32c").get<uint32_t>();
  return s;
}

int64_t shard_numel(const StoredShard& s) {
  return s.flattened_range ? s.flattened_range->second - s.flattened_range->first : shape_numel(s.local_shape);
}

// Atomically installs directory `src` at `dst` (replacing an existing `dst`).
void install_dir(const std::string& src, const std::string& dst) {
  if (fs::exists(dst)) {
    if (::renameat2(AT_FDCWD, src.c_str(), AT_FDCWD, dst.c_str(), RENAME_EXCHANGE) != 0)
      user_error("cannot replace ", dst, " with ", src, ": ", std::strerror(errno));
    fs::remove_all(src);  // now holds the old checkpoint
  } else {
    if (std::rename(src.c_str(), dst.c_str()) != 0)
      user_error("cannot rename ", src, " to ", dst, ": ", std::strerror(errno));
  }
  auto parent = fs::path(dst).parent_path();
  fsync_dir(parent.empty() ? "." : parent.string());
}

// Why `dst` must not be replaced by a checkpoint, or "" when it may: it does not exist, or it is
// a directory holding only a checkpoint's files (an earlier save of the same step, replaced
// atomically). Megatron's dist_checkpointing.save refuses a destination that is not empty;
// we never delete anything that is not ours.
std::string unsafe_destination(const std::string& dst) {
  std::error_code ec;
  const auto st = fs::symlink_status(dst, ec);
  if (ec || !fs::exists(st)) return "";
  if (!fs::is_directory(st)) return "it exists and is not a directory";
  for (const auto& e : fs::directory_iterator(dst, ec)) {
    const std::string n = e.path().filename().string();
    const bool ours = n == kIndexFile || n == kCommonFile || n == kMarkerFile ||
                      (n.size() > 12 && n.compare(n.size() - 12, 12, ".safetensors") == 0);
    if (!ours) return "it holds '" + n + "', which is not part of a checkpoint";
  }
  return "";
}

// CRC-32C of metadata.json's content without its own checksum field, over nlohmann's compact
// dump (keys sorted, so the value depends only on the content, not on its spelling).
std::string marker_checksum(json m) {
  m.erase(kSelfChecksumKey);
  const std::string text = m.dump();
  return hex32(crc32c(text.data(), text.size()));
}

std::string normalize_dir(const std::string& d) {
  std::string s = d;
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Save
// ---------------------------------------------------------------------------------------------

namespace {

// CRC-32C of every item's bytes, on min(hardware threads, 8, items) threads.
std::vector<uint32_t> parallel_crc32c(const std::vector<SafetensorsItem>& items) {
  std::vector<uint32_t> crc(items.size());
  std::vector<size_t> nbytes(items.size()), order(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    nbytes[i] = static_cast<size_t>(shape_numel(items[i].shape)) * dtype_size(items[i].dtype);
    order[i] = i;
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return nbytes[a] > nbytes[b]; });
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t k; (k = next.fetch_add(1)) < order.size();) crc[order[k]] = crc32c(items[order[k]].data, nbytes[order[k]]);
  };
  const size_t hw = std::max(1u, std::thread::hardware_concurrency());
  const size_t nt = std::min<size_t>({hw, 8, items.size()});
  std::vector<std::thread> ts;
  for (size_t t = 1; t < nt; ++t) ts.emplace_back(work);
  work();
  for (auto& t : ts) t.join();
  return crc;
}

}  // namespace

struct AsyncSaveRequest::State {
  std::shared_ptr<comm::ProcessGroup> owned_group;
  comm::ProcessGroup* group = nullptr;
  int rank = 0;
  int size = 1;
  std::string tmp_dir;
  json common;
  std::vector<Tensor> keep;         // CPU data (snapshot copies for async)
  bool pooled = false;              // keep holds snapshot buffers to hand back to the pool
  std::vector<std::string> blobs;   // serialized ShardedObjects
  std::vector<SafetensorsItem> items;
  json records = json::array();
  std::thread writer;
  std::atomic<bool> done{false};
  std::exception_ptr error;

  void write_rank_file() {
    try {
      // The checksums go into the file's header, so they are computed before the first byte is
      // written: on several threads (largest tensors first), then the data streams to the disk.
      std::vector<uint32_t> crcs = parallel_crc32c(items);
      for (size_t i = 0; i < items.size(); ++i) records[i]["crc32c"] = crcs[i];
      SafetensorsLayout L = plan_safetensors(items, {{kShardsMetaKey, records.dump()}});
      AlignedFileWriter w(tmp_dir + "/" + rank_file(rank));
      w.write(L.header.data(), L.header.size());
      for (size_t k = 0; k < L.order.size(); ++k) w.write(items[L.order[k]].data, L.entries[k].nbytes());
      w.close();
    } catch (...) {
      error = std::current_exception();
    }
    done = true;
  }
};

namespace {

// Host buffers of finished async snapshots, reused by the next snapshot of the same sizes (a
// fresh allocation costs a page fault per 4 KiB on first touch, often more than the copy).
// A request owns its buffers until finalize() hands them back.
struct SnapshotPool {
  std::mutex mu;
  std::multimap<std::pair<int, int64_t>, Tensor> free;  // (dtype, numel) -> buffer
  Tensor take(const Tensor& like) {
    std::lock_guard<std::mutex> g(mu);
    auto it = free.find({static_cast<int>(like.dtype()), like.numel()});
    if (it == free.end()) return Tensor::empty(like.shape(), like.dtype(), Device::cpu());
    Tensor t = std::move(it->second);
    free.erase(it);
    return t.flat_slice(0, like.shape());
  }
  void give(std::vector<Tensor>& ts) {
    std::lock_guard<std::mutex> g(mu);
    free.clear();  // keep only the latest snapshot's buffers
    for (auto& t : ts)
      if (t.defined() && t.is_cpu()) free.emplace(std::make_pair(static_cast<int>(t.dtype()), t.numel()), std::move(t));
    ts.clear();
  }
};
SnapshotPool& snapshot_pool() {
  static SnapshotPool p;
  return p;
}

void fill_request(AsyncSaveRequest::State& state, const ShardedStateDict& sd, bool snapshot);

std::unique_ptr<AsyncSaveRequest::State> prepare(const ShardedStateDict& sd, const std::string& dir,
                                                 comm::ProcessGroup* group, bool snapshot) {
  auto st = std::make_unique<AsyncSaveRequest::State>();
  if (!group) {
    st->owned_group = comm::make_single_rank_group();
    group = st->owned_group.get();
  }
  st->group = group;
  st->rank = group->rank();
  st->size = group->size();
  const std::string unsafe = st->rank == 0 ? unsafe_destination(dir) : "";
  if (any_rank_failed(group, !unsafe.empty())) {
    if (!unsafe.empty())
      user_error("checkpoint save: refusing to replace ", dir, ": ", unsafe, "; move it away or save to another directory");
    user_error("checkpoint save: rank 0 refused to replace ", dir);
  }
  // Everyone writes into <dir>.tmp-<pid of rank 0>.
  Tensor pid = Tensor::from_vector_i64({static_cast<int64_t>(::getpid())}, {1});
  group->broadcast(pid, 0)->wait();
  st->tmp_dir = dir + ".tmp-" + std::to_string(pid.data<int64_t>()[0]);
  std::error_code ec;
  fs::create_directories(st->tmp_dir, ec);
  if (ec) user_error("cannot create checkpoint directory ", st->tmp_dir, ": ", ec.message());
  try {
    fill_request(*st, sd, snapshot);
  } catch (...) {
    fs::remove_all(st->tmp_dir, ec);  // a refused state dict leaves no empty <dir>.tmp-<pid> behind
    throw;
  }
  return st;
}

// The records and items of the tensors and objects this rank writes (replica 0 only).
void fill_request(AsyncSaveRequest::State& state, const ShardedStateDict& sd, bool snapshot) {
  AsyncSaveRequest::State* st = &state;
  if (st->rank == 0) st->common = sd.common;

  std::set<std::string> names;
  for (const auto& t : sd.tensors) {
    if (t.replica_id != 0) continue;
    t.validate();
    Tensor cpu = t.data.to(Device::cpu());
    if (snapshot && cpu.shares_storage(t.data)) {
      cpu = snapshot_pool().take(t.data);
      cpu.copy_(t.data);
      st->pooled = true;
    }
    std::string name = shard_name(t.key, t.global_offset, t.flattened_range);
    if (!names.insert(name).second) user_error("checkpoint save: two shards of '", t.key, "' at the same offset on rank ", st->rank);
    Shape shape = t.flattened_range ? Shape{t.local_numel()} : t.local_shape;
    json r = {{"kind", "tensor"},          {"name", name},
              {"key", t.key},              {"global_shape", t.global_shape},
              {"global_offset", t.global_offset}, {"local_shape", t.local_shape}};
    if (t.flattened_range) r["flattened_range"] = {t.flattened_range->first, t.flattened_range->second};
    st->records.push_back(r);
    st->items.push_back({name, cpu.dtype(), shape, cpu.data_ptr()});
    st->keep.push_back(std::move(cpu));
  }
  st->blobs.reserve(sd.objects.size());
  for (const auto& o : sd.objects) {
    if (o.replica_id != 0) continue;
    MEGATRON_CHECK(o.global_shape.size() == o.global_offset.size()) << o.key << ": object grid/offset rank mismatch";
    std::string name = shard_name(o.key, o.global_offset, std::nullopt);
    if (!names.insert(name).second) user_error("checkpoint save: object '", o.key, "' twice at the same offset");
    st->blobs.push_back(o.value.dump());
    st->records.push_back({{"kind", "object"},
                           {"name", name},
                           {"key", o.key},
                           {"global_shape", o.global_shape},
                           {"global_offset", o.global_offset},
                           {"local_shape", Shape(o.global_shape.size(), 1)}});
    st->items.push_back({name, DType::kUInt8, Shape{static_cast<int64_t>(st->blobs.back().size())}, st->blobs.back().data()});
  }
}

// Rank 0: reads every rank file's header and writes common.json, .metadata, metadata.json.
void write_index(const AsyncSaveRequest::State& st) {
  json tensors = json::object(), objects = json::object();
  std::map<std::string, StoredTensor> index[2];
  for (int r = 0; r < st.size; ++r) {
    const std::string file = rank_file(r);
    SafetensorsReader rd(st.tmp_dir + "/" + file);
    auto it = rd.metadata().find(kShardsMetaKey);
    if (it == rd.metadata().end()) user_error(st.tmp_dir, "/", file, ": no shard records (", kShardsMetaKey, ")");
    for (const auto& rec : json::parse(it->second)) {
      const auto& e = rd.at(rec.at("name").get<std::string>());
      bool is_obj = rec.at("kind") == "object";
      auto& idx = index[is_obj ? 1 : 0];
      const std::string key = rec.at("key");
      Shape gshape = rec.at("global_shape").get<Shape>();
      auto [pos, inserted] = idx.try_emplace(key);
      StoredTensor& stt = pos->second;
      if (inserted) {
        stt.key = key;
        stt.dtype = e.dtype;
        stt.global_shape = gshape;
      } else if (stt.global_shape != gshape || (!is_obj && stt.dtype != e.dtype)) {
        user_error("checkpoint save: ranks disagree on '", key, "': ", shape_str(stt.global_shape), " ",
                   dtype_name(stt.dtype), " vs ", shape_str(gshape), " ", dtype_name(e.dtype), " (rank ", r, ")");
      }
      StoredShard s;
      s.global_offset = rec.at("global_offset").get<Shape>();
      s.local_shape = rec.at("local_shape").get<Shape>();
      if (rec.contains("flattened_range"))
        s.flattened_range = std::make_pair(rec["flattened_range"][0].get<int64_t>(), rec["flattened_range"][1].get<int64_t>());
      s.file = file;
      s.name = e.name;
      s.byte_begin = rd.data_start() + e.begin;
      s.byte_end = rd.data_start() + e.end;
      s.crc32c = rec.at("crc32c").get<uint32_t>();
      for (const auto& o : stt.shards)
        if (o.global_offset == s.global_offset && o.flattened_range == s.flattened_range)
          user_error("checkpoint save: shard of '", key, "' at offset ", shape_str(s.global_offset),
                     " is written by two ranks (", o.file, " and ", file, "): set replica_id != 0 on replicas");
      stt.shards.push_back(std::move(s));
    }
  }
  for (auto& [key, stt] : index[0]) {
    int64_t covered = 0;
    for (const auto& s : stt.shards) covered += shard_numel(s);
    if (covered != shape_numel(stt.global_shape))
      user_error("checkpoint save: the shards of '", key, "' hold ", covered, " elements but its global shape ",
                 shape_str(stt.global_shape), " has ", shape_numel(stt.global_shape),
                 " (a rank did not contribute its piece, or replica ids are wrong)");
  }
  auto dump = [](const std::map<std::string, StoredTensor>& m) {
    json out = json::object();
    for (const auto& [key, stt] : m) {
      json shards = json::array();
      for (const auto& s : stt.shards) shards.push_back(shard_json(s));
      out[key] = {{"dtype", safetensors_dtype_name(stt.dtype)}, {"global_shape", stt.global_shape}, {"shards", shards}};
    }
    return out;
  };
  json meta = {{"format", kShardedBackend},    {"version", kShardedBackendVersion}, {"world_size", st.size},
               {"tensors", dump(index[0])}, {"objects", dump(index[1])}};
  json checksums = json::object();
  auto write = [&](const char* name, const std::string& text) {
    FileWriter w(st.tmp_dir + "/" + name);
    w.write(text.data(), text.size());
    w.close();
    checksums[name] = hex32(crc32c(text.data(), text.size()));
  };
  write(kCommonFile, st.common.dump(1));
  write(kIndexFile, meta.dump());
  // metadata.json, written last, records the CRC-32C of the other non-shard files and of itself
  // (the shards' checksums are in .metadata): see marker_checksum().
  json marker = {{"sharded_backend", kShardedBackend}, {"sharded_backend_version", kShardedBackendVersion},
                 {kChecksumsKey, checksums}};
  marker[kSelfChecksumKey] = marker_checksum(marker);
  write(kMarkerFile, marker.dump());
  fsync_dir(st.tmp_dir);
}

}  // namespace

AsyncSaveRequest::~AsyncSaveRequest() {
  if (st_ && st_->writer.joinable()) st_->writer.join();
}

bool AsyncSaveRequest::write_done() const { return !st_ || st_->done.load(); }

void AsyncSaveRequest::finalize() {
  if (finalized_) return;
  finalized_ = true;
  State& st = *st_;
  if (st.writer.joinable()) st.writer.join();
  bool failed = static_cast<bool>(st.error);
  // A failed save removes its temporary directory (every rank has stopped writing once the
  // vote is taken), so a full disk does not leave partial copies behind at each attempt.
  auto discard_tmp = [&st] {
    std::error_code ec;
    if (st.rank == 0) fs::remove_all(st.tmp_dir, ec);
  };
  if (any_rank_failed(st.group, failed)) {
    discard_tmp();
    if (st.error) std::rethrow_exception(st.error);
    user_error("checkpoint save to ", dir_, " failed on another rank");
  }
  std::exception_ptr err;
  if (st.rank == 0) {
    try {
      write_index(st);
      install_dir(st.tmp_dir, dir_);
      // Leftovers of earlier killed saves of the same directory.
      const fs::path d(dir_);
      const std::string prefix = d.filename().string() + ".tmp-";
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(d.parent_path().empty() ? fs::path(".") : d.parent_path(), ec))
        if (e.path().filename().string().rfind(prefix, 0) == 0) fs::remove_all(e.path(), ec);
      for (auto& fn : finalize_fns_) fn();
    } catch (...) {
      err = std::current_exception();
    }
  }
  if (any_rank_failed(st.group, static_cast<bool>(err))) {
    discard_tmp();
    if (err) std::rethrow_exception(err);
    user_error("checkpoint save to ", dir_, " failed on rank 0");
  }
  if (st.pooled) snapshot_pool().give(st.keep);
  st.keep.clear();
  st.blobs.clear();
}

std::unique_ptr<AsyncSaveRequest> save_async(const ShardedStateDict& sd, const std::string& checkpoint_dir,
                                             comm::ProcessGroup* group) {
  auto req = std::unique_ptr<AsyncSaveRequest>(new AsyncSaveRequest());
  req->dir_ = normalize_dir(checkpoint_dir);
  req->st_ = prepare(sd, req->dir_, group, /*snapshot=*/true);
  AsyncSaveRequest::State* s = req->st_.get();
  s->writer = std::thread([s] { s->write_rank_file(); });
  return req;
}

void save(const ShardedStateDict& sd, const std::string& checkpoint_dir, comm::ProcessGroup* group,
          std::vector<std::function<void()>> finalize_fns) {
  AsyncSaveRequest req;
  req.finalize_fns_ = std::move(finalize_fns);
  req.dir_ = normalize_dir(checkpoint_dir);
  req.st_ = prepare(sd, req.dir_, group, /*snapshot=*/false);
  req.st_->write_rank_file();
  req.finalize();
}

// ---------------------------------------------------------------------------------------------
// Load
// ---------------------------------------------------------------------------------------------

namespace {
// Parses and checks metadata.json (see check_is_distributed_checkpoint); returns it.
json read_marker(const std::string& dir) {
  const std::string marker = dir + "/" + kMarkerFile;
  // status() with an error code: a symlink loop or unreadable path is the user's, not a crash.
  std::error_code ec;
  const fs::file_status ds = fs::status(dir, ec);
  if (ds.type() == fs::file_type::not_found) user_error("checkpoint directory ", dir, " does not exist");
  if (ec) user_error("checkpoint directory ", dir, ": ", ec.message(), " (a symlink loop or unreadable path?)");
  if (ds.type() != fs::file_type::directory) user_error("checkpoint directory ", dir, " is not a directory");
  const fs::file_status ms = fs::status(marker, ec);
  if (ms.type() == fs::file_type::not_found)
    user_error(dir, " is not a complete distributed checkpoint (no metadata.json; an interrupted save?)");
  if (ec) user_error(marker, ": ", ec.message());
  json m;
  try {
    m = json::parse(read_text_file(marker));
  } catch (const json::exception& e) {
    user_error(marker, ": not valid JSON (", e.what(), ")");
  }
  // A field of the wrong type (an edited or foreign file) is bad input, not a bug: one line.
  try {
    std::string backend = m.value("sharded_backend", "");
    if (backend != kShardedBackend) {
      if (backend == "torch_dist" || backend == "zarr")
        user_error(dir, ": written by Megatron-LM's '", backend, "' backend, which this program cannot read; "
                   "export it from Megatron-LM to Hugging Face safetensors and import with convert_checkpoint");
      user_error(marker, ": unknown sharded_backend '", backend, "' (expected ", kShardedBackend, ")");
    }
    if (m.value("sharded_backend_version", 0) > kShardedBackendVersion)
      user_error(marker, ": sharded_backend_version ", m.value("sharded_backend_version", 0),
                 " is newer than this program supports (", kShardedBackendVersion, ")");
    if (m.contains(kChecksumsKey) || m.contains(kSelfChecksumKey)) {
      if (!m.contains(kSelfChecksumKey) || !m.contains(kChecksumsKey) || !m[kChecksumsKey].is_object() ||
          !m[kSelfChecksumKey].is_string())
        user_error(marker, ": incomplete checksum records (", kChecksumsKey, ", ", kSelfChecksumKey,
                   "): the file was edited or damaged after the save; restore it from a copy or re-save the checkpoint");
      const std::string got = marker_checksum(m), want = m[kSelfChecksumKey].get<std::string>();
      if (got != want)
        user_error(marker, ": crc32c ", got, " != stored ", want,
                   ": the file was edited or damaged after the save; restore it from a copy or re-save the checkpoint");
    } else {
      // Checkpoints written before the checksums existed: their files cannot be verified.
      static std::set<std::string> warned;
      if (warned.insert(dir).second)
        std::fprintf(stderr, "WARNING: %s records no checksums (an older checkpoint): %s and %s are not verified\n",
                     marker.c_str(), kCommonFile, kIndexFile);
    }
  } catch (const json::exception& e) {
    user_error(marker, ": a field is missing or of the wrong type (", e.what(),
               "): the file was edited or damaged after the save; restore it from a copy or re-save the checkpoint");
  }
  return m;
}

// The bytes of a non-shard file of `dir`, verified against the CRC-32C recorded in metadata.json
// (when it records checksums). UserError naming the file on a mismatch or a missing record.
std::string read_verified(const std::string& dir, const char* name) {
  const json m = read_marker(dir);
  const std::string path = dir + "/" + name;
  std::string text = read_text_file(path);
  if (!m.contains(kChecksumsKey)) return text;
  const json& sums = m[kChecksumsKey];
  if (!sums.contains(name) || !sums[name].is_string())
    user_error(dir, "/", kMarkerFile, ": records no checksum for ", name, ": the file was edited or damaged after the save");
  const std::string got = hex32(crc32c(text.data(), text.size())), want = sums[name].get<std::string>();
  if (got != want)
    user_error(path, ": crc32c ", got, " != ", want, " recorded in ", dir, "/", kMarkerFile,
               ": the file was edited or damaged after the save; restore it from a copy or re-save the checkpoint");
  return text;
}
}  // namespace

void check_is_distributed_checkpoint(const std::string& dir) { read_marker(dir); }

CheckpointIndex load_index(const std::string& checkpoint_dir) {
  const std::string dir = normalize_dir(checkpoint_dir);
  check_is_distributed_checkpoint(dir);
  const std::string path = dir + "/" + kIndexFile;
  CheckpointIndex idx;
  idx.dir = dir;
  const std::string text = read_verified(dir, kIndexFile);
  try {
    json m = json::parse(text);
    for (int k = 0; k < 2; ++k) {
      auto& out = k == 0 ? idx.tensors : idx.objects;
      for (auto it = m.at(k == 0 ? "tensors" : "objects").begin(); it != m.at(k == 0 ? "tensors" : "objects").end(); ++it) {
        StoredTensor s;
        s.key = it.key();
        s.dtype = safetensors_dtype_from_name(it.value().at("dtype").get<std::string>(), path + ": '" + s.key + "'");
        s.global_shape = it.value().at("global_shape").get<Shape>();
        for (const auto& sh : it.value().at("shards")) s.shards.push_back(shard_from_json(sh));
        out.emplace(s.key, std::move(s));
      }
    }
  } catch (const json::exception& e) {
    user_error(path, ": corrupt checkpoint index (", e.what(), ")");
  }
  return idx;
}

nlohmann::json load_common_state(const std::string& checkpoint_dir) {
  const std::string dir = normalize_dir(checkpoint_dir);
  check_is_distributed_checkpoint(dir);
  const std::string path = dir + "/" + kCommonFile;
  const std::string text = read_verified(dir, kCommonFile);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    user_error(path, ": not valid JSON (", e.what(), ")");
  }
}

int64_t copy_box_overlap(const uint8_t* src, DType sdt, const Shape& so_in, const Shape& ss_in, int64_t sb, int64_t se,
                         uint8_t* dst, DType ddt, const Shape& do_in, const Shape& ds_in, int64_t db, int64_t de) {
  Shape so = so_in, ss = ss_in, dof = do_in, ds = ds_in;
  if (so.empty()) so = dof = {0}, ss = ds = {1};
  const size_t nd = so.size();
  MEGATRON_CHECK(ss.size() == nd && dof.size() == nd && ds.size() == nd) << "box ranks differ";
  if (sdt != ddt) {
    MEGATRON_CHECK(is_floating(sdt) && is_floating(ddt)) << "cannot convert " << dtype_name(sdt) << " to " << dtype_name(ddt);
  }
  Shape lo(nd), hi(nd);
  for (size_t i = 0; i < nd; ++i) {
    lo[i] = std::max(so[i], dof[i]);
    hi[i] = std::min(so[i] + ss[i], dof[i] + ds[i]);
    if (lo[i] >= hi[i]) return 0;
  }
  Shape sstr(nd, 1), dstr(nd, 1);
  for (size_t i = nd - 1; i > 0; --i) {
    sstr[i - 1] = sstr[i] * ss[i];
    dstr[i - 1] = dstr[i] * ds[i];
  }
  // Merge trailing axes that both boxes hold whole into one contiguous run.
  size_t k = nd - 1;
  while (k > 0 && lo[k] == so[k] && lo[k] == dof[k] && hi[k] - lo[k] == ss[k] && ss[k] == ds[k]) --k;
  const int64_t run = (hi[k] - lo[k]) * sstr[k];
  const size_t sz = dtype_size(sdt), dz = dtype_size(ddt);
  std::vector<float> tmp;
  int64_t copied = 0;
  Shape p(lo.begin(), lo.begin() + static_cast<long>(k));  // index over axes [0, k)
  while (true) {
    int64_t fs0 = (lo[k] - so[k]) * sstr[k], fd0 = (lo[k] - dof[k]) * dstr[k];
    for (size_t i = 0; i < k; ++i) {
      fs0 += (p[i] - so[i]) * sstr[i];
      fd0 += (p[i] - dof[i]) * dstr[i];
    }
    const int64_t a = std::max<int64_t>({0, sb - fs0, db - fd0});
    const int64_t b = std::min<int64_t>({run, se - fs0, de - fd0});
    if (a < b) {
      const uint8_t* s = src + (fs0 + a - sb) * static_cast<int64_t>(sz);
      uint8_t* d = dst + (fd0 + a - db) * static_cast<int64_t>(dz);
      const int64_t n = b - a;
      if (sdt == ddt) {
        std::memcpy(d, s, static_cast<size_t>(n) * sz);
      } else {
        tmp.resize(static_cast<size_t>(n));
        cpu_convert_to_float(s, sdt, tmp.data(), n);
        cpu_convert_from_float(tmp.data(), d, ddt, n);
      }
      copied += n;
    }
    // next index tuple over axes [0, k)
    size_t i = k;
    while (i > 0) {
      --i;
      if (++p[i] < hi[i]) break;
      p[i] = lo[i];
      if (i == 0) return copied;
    }
    if (k == 0) return copied;
  }
}

namespace {

class ShardReaderCache {
 public:
  explicit ShardReaderCache(std::string dir, bool verify) : dir_(std::move(dir)), verify_(verify) {}

  // Throws unless the shard's file opens and its header lists the shard at the indexed bytes.
  void check(const StoredTensor& t, const StoredShard& s) { entry(t, s); }

  // Bytes of a stored shard, verified once.
  const uint8_t* bytes(const StoredTensor& t, const StoredShard& s) {
    const auto [rd, e] = entry(t, s);
    const uint8_t* p = rd->bytes(*e);
    if (verify_ && verified_.insert(s.file + "\n" + s.name).second) {
      uint32_t c = crc32c(p, e->nbytes());
      if (c != s.crc32c)
        user_error("checkpoint ", dir_, ": corrupt shard '", s.name, "' of '", t.key, "' in ", s.file, " (bytes ",
                   s.byte_begin, "..", s.byte_end, "): crc32c ", hex32(c), " != stored ", hex32(s.crc32c));
    }
    return p;
  }

 private:
  std::pair<const SafetensorsReader*, const SafetensorsEntry*> entry(const StoredTensor& t, const StoredShard& s) {
    auto it = files_.find(s.file);
    if (it == files_.end()) {
      try {
        it = files_.emplace(s.file, std::make_unique<SafetensorsReader>(dir_ + "/" + s.file)).first;
      } catch (const UserError& e) {
        user_error("checkpoint ", dir_, ": shard file ", s.file, " holding '", t.key, "' at offset ",
                   shape_str(s.global_offset), " is missing or unreadable (", e.what(), ")");
      }
    }
    const SafetensorsReader& rd = *it->second;
    const SafetensorsEntry* e = rd.find(s.name);
    if (!e || rd.data_start() + e->begin != s.byte_begin || rd.data_start() + e->end != s.byte_end)
      user_error("checkpoint ", dir_, ": shard '", s.name, "' of '", t.key, "' is missing from ", s.file,
                 " or at other bytes than the index says (file replaced?)");
    return {&rd, e};
  }

  std::string dir_;
  bool verify_;
  std::map<std::string, std::unique_ptr<SafetensorsReader>> files_;
  std::set<std::string> verified_;
};

// Streams the stored shards a load needs from one file: a reader thread preads each shard in
// chunks (buffered, POSIX_FADV_SEQUENTIAL, shards in file order) into a ring of buffers — or,
// when the shard is exactly one requested CPU tensor (no resharding, same dtype), straight into
// that tensor — while the loading thread checksums and copies the previous chunk. Chunks start
// at shard begin + k·chunk (chunk: a multiple of 8 bytes), so no element is split between chunks.
class ShardStreamer {
 public:
  struct Range {
    uint64_t begin, end;
    uint8_t* dest = nullptr;  // read here (dest[0] = byte `begin`) instead of into a ring buffer
  };
  struct Chunk {
    size_t range;      // index into ranges
    uint64_t offset;   // absolute file offset
    size_t len;
    const uint8_t* data;
    int buf;  // ring buffer, -1 when read into Range::dest
  };
  ShardStreamer(const std::string& path, std::vector<Range> ranges, const IoOptions& o)
      : path_(path), ranges_(std::move(ranges)), chunk_(o.read_chunk_bytes) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) user_error("cannot open ", path, ": ", std::strerror(errno));
    ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
    const int nbuf = std::max(2, o.buffers - 1);
    for (int i = 0; i < nbuf; ++i) {
      bufs_.push_back(take_aligned_buffer(chunk_));
      free_.push_back(i);
    }
    reader_ = std::thread([this] { read_loop(); });
  }
  ~ShardStreamer() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    reader_.join();
    ::close(fd_);
    for (auto* b : bufs_) give_aligned_buffer(b, chunk_);
  }
  // Next chunk in order; false after the last one. Throws UserError on a read failure.
  bool next(Chunk& c) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return !ready_.empty() || finished_ || !error_.empty(); });
    if (!error_.empty()) user_error(error_);
    if (ready_.empty()) return false;
    c = ready_.front();
    ready_.pop_front();
    return true;
  }
  void release(const Chunk& c) {
    if (c.buf < 0) return;
    {
      std::lock_guard<std::mutex> g(mu_);
      free_.push_back(c.buf);
    }
    cv_.notify_all();
  }

 private:
  void read_loop() {
    // Keep kAhead bytes of the coming ranges requested from the disk (WILLNEED starts large
    // asynchronous reads into the page cache), so a cold load is not limited to the kernel's
    // small default read-ahead window; warm (cached) loads are unaffected.
    constexpr uint64_t kAhead = 64ull << 20;
    size_t pr = 0;                                      // range being prefetched
    uint64_t pf = ranges_.empty() ? 0 : ranges_[0].begin;  // prefetched up to here in range pr
    uint64_t consumed = 0, requested = 0;               // bytes read / prefetched so far
    auto prefetch = [&] {
      while (pr < ranges_.size() && requested < consumed + kAhead) {
        const uint64_t n = std::min<uint64_t>(ranges_[pr].end - pf, 16ull << 20);
        if (n > 0) ::posix_fadvise(fd_, static_cast<off_t>(pf), static_cast<off_t>(n), POSIX_FADV_WILLNEED);
        pf += n;
        requested += n;
        if (pf >= ranges_[pr].end && ++pr < ranges_.size()) pf = ranges_[pr].begin;
      }
    };
    for (size_t r = 0; r < ranges_.size(); ++r) {
      for (uint64_t off = ranges_[r].begin; off < ranges_[r].end;) {
        const size_t len = static_cast<size_t>(std::min<uint64_t>(chunk_, ranges_[r].end - off));
        prefetch();
        consumed += len;
        int b = -1;
        uint8_t* dst = nullptr;
        if (ranges_[r].dest) {
          std::lock_guard<std::mutex> g(mu_);
          if (stop_) return;
          dst = ranges_[r].dest + (off - ranges_[r].begin);
        } else {
          std::unique_lock<std::mutex> lk(mu_);
          cv_.wait(lk, [&] { return stop_ || !free_.empty(); });
          if (stop_) return;
          b = free_.back();
          free_.pop_back();
          dst = bufs_[b];
        }
        size_t got = 0;
        std::string err;
        while (got < len) {
          ssize_t n = ::pread(fd_, dst + got, len - got, static_cast<off_t>(off + got));
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) {
            err = "cannot read " + path_ + " at byte " + std::to_string(off + got) + ": " +
                  (n < 0 ? std::string(std::strerror(errno)) : std::string("file is shorter than its header says"));
            break;
          }
          got += static_cast<size_t>(n);
        }
        {
          std::lock_guard<std::mutex> g(mu_);
          if (!err.empty()) {
            error_ = err;
          } else {
            ready_.push_back({r, off, len, dst, b});
          }
        }
        cv_.notify_all();
        if (!err.empty()) return;
        off += len;
      }
    }
    {
      std::lock_guard<std::mutex> g(mu_);
      finished_ = true;
    }
    cv_.notify_all();
  }

  std::string path_;
  std::vector<Range> ranges_;
  size_t chunk_;
  int fd_ = -1;
  std::vector<uint8_t*> bufs_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> free_;
  std::deque<Chunk> ready_;
  bool stop_ = false, finished_ = false;
  std::string error_;
  std::thread reader_;
};

}  // namespace

nlohmann::json load(ShardedStateDict& sd, const std::string& checkpoint_dir, const LoadOptions& opts) {
  const std::string dir = normalize_dir(checkpoint_dir);
  CheckpointIndex idx = load_index(dir);
  json common = load_common_state(dir);
  ShardReaderCache cache(dir, opts.verify_checksums);
  // Plan: every requested tensor's CPU target and, per file, the stored shards that overlap a
  // request (each read once, in file order, even when several requests need it).
  struct Request {
    ShardedTensor* t;
    const StoredTensor* stored;
    Tensor target;
    int64_t db, de, copied = 0;
  };
  std::vector<Request> reqs;
  reqs.reserve(sd.tensors.size());
  std::map<std::string, std::map<uint64_t, std::pair<const StoredShard*, std::vector<size_t>>>> plan;
  for (auto& t : sd.tensors) {
    t.validate();
    auto it = idx.tensors.find(t.key);
    if (it == idx.tensors.end()) user_error("checkpoint ", dir, " has no tensor '", t.key, "'");
    const StoredTensor& stt = it->second;
    if (stt.global_shape != t.global_shape) {
      // The padding hint only where the padded vocabulary is a dimension (embedding, output layer).
      const bool vocab = t.key.find("word_embeddings") != std::string::npos ||
                         t.key.find("output_layer") != std::string::npos;
      user_error("checkpoint ", dir, ": '", t.key, "' has global shape ", shape_str(stt.global_shape),
                 " but the model expects ", shape_str(t.global_shape),
                 vocab ? " (different model configuration? The padded vocabulary is a multiple of "
                         "--make-vocab-size-divisible-by x TP: to change TP, pick a divisor that gives the same padding)"
                       : " (different model configuration: layer sizes, --fp8-amax-history-len, ...? Load with "
                         "the flags the checkpoint was saved with)");
    }
    if (stt.dtype != t.data.dtype() && !(is_floating(stt.dtype) && is_floating(t.data.dtype())))
      user_error("checkpoint ", dir, ": '", t.key, "' is stored as ", dtype_name(stt.dtype), ", cannot load into ",
                 dtype_name(t.data.dtype()));
    Request rq{&t, &stt, t.data.is_cpu() ? t.data : Tensor::empty(t.data.shape(), t.data.dtype(), Device::cpu()),
               t.flattened_range ? t.flattened_range->first : 0,
               t.flattened_range ? t.flattened_range->second : shape_numel(t.local_shape)};
    for (const auto& s : stt.shards) {
      bool overlap = true;
      for (size_t i = 0; i < s.global_offset.size() && overlap; ++i)
        overlap = std::max(s.global_offset[i], t.global_offset[i]) <
                  std::min(s.global_offset[i] + s.local_shape[i], t.global_offset[i] + t.local_shape[i]);
      if (!overlap) continue;
      cache.check(stt, s);  // file present, header lists the shard at the indexed bytes
      auto& slot = plan[s.file][s.byte_begin];
      slot.first = &s;
      slot.second.push_back(reqs.size());
    }
    reqs.push_back(std::move(rq));
  }
  IoOptions io = io_options_from_env();
  if (opts.read_chunk_bytes) {
    MEGATRON_CHECK(opts.read_chunk_bytes % 8 == 0) << "read_chunk_bytes " << opts.read_chunk_bytes << " must be a multiple of 8";
    io.read_chunk_bytes = opts.read_chunk_bytes;
  }
  for (const auto& [file, shards] : plan) {
    std::vector<ShardStreamer::Range> ranges;
    std::vector<const std::pair<const StoredShard*, std::vector<size_t>>*> items;
    for (const auto& [begin, item] : shards) {
      const StoredShard& s = *item.first;
      if (s.byte_end == begin) continue;  // empty shard: nothing to read or copy
      uint8_t* dest = nullptr;
      if (item.second.size() == 1) {
        Request& rq = reqs[item.second[0]];
        if (rq.stored->dtype == rq.target.dtype() && s.global_offset == rq.t->global_offset &&
            s.local_shape == rq.t->local_shape && s.flattened_range == rq.t->flattened_range)
          dest = static_cast<uint8_t*>(rq.target.data_ptr());  // the same bytes: read in place
      }
      ranges.push_back({begin, s.byte_end, dest});
      items.push_back(&item);
    }
    ShardStreamer stream(dir + "/" + file, ranges, io);
    ShardStreamer::Chunk c{};
    uint32_t crc = 0;
    while (stream.next(c)) {
      const StoredShard& s = *items[c.range]->first;
      const StoredTensor& stt = *reqs[items[c.range]->second.front()].stored;
      const int64_t esz = static_cast<int64_t>(dtype_size(stt.dtype));
      if (c.offset == s.byte_begin) crc = 0;
      if (opts.verify_checksums) crc = crc32c_extend(crc, c.data, c.len);
      // This chunk holds flat elements [e0, e1) of the stored shard's box.
      const int64_t base = s.flattened_range ? s.flattened_range->first : 0;
      const int64_t e0 = base + static_cast<int64_t>(c.offset - s.byte_begin) / esz;
      const int64_t e1 = e0 + static_cast<int64_t>(c.len) / esz;
      if (c.buf < 0) {  // read in place: nothing to copy
        reqs[items[c.range]->second[0]].copied += e1 - e0;
      } else {
        for (size_t ri : items[c.range]->second) {
          Request& rq = reqs[ri];
          rq.copied += copy_box_overlap(c.data, stt.dtype, s.global_offset, s.local_shape, e0, e1,
                                        static_cast<uint8_t*>(rq.target.data_ptr()), rq.target.dtype(),
                                        rq.t->global_offset, rq.t->local_shape, rq.db, rq.de);
        }
      }
      stream.release(c);
      if (opts.verify_checksums && c.offset + c.len == s.byte_end && crc != s.crc32c)
        user_error("checkpoint ", dir, ": corrupt shard '", s.name, "' of '", stt.key, "' in ", s.file, " (bytes ",
                   s.byte_begin, "..", s.byte_end, "): crc32c ", hex32(crc), " != stored ", hex32(s.crc32c));
    }
  }
  for (auto& rq : reqs) {
    if (rq.copied != rq.de - rq.db)
      user_error("checkpoint ", dir, ": the stored shards of '", rq.t->key, "' cover ", rq.copied, " of the ",
                 rq.de - rq.db, " elements requested at offset ", shape_str(rq.t->global_offset),
                 " (a shard is missing from the index)");
    if (!rq.t->data.is_cpu()) rq.t->data.copy_(rq.target);
  }
  for (auto& o : sd.objects) {
    o.loaded = false;
    auto it = idx.objects.find(o.key);
    if (it == idx.objects.end()) continue;
    for (const auto& s : it->second.shards) {
      if (s.global_offset != o.global_offset || it->second.global_shape != o.global_shape) continue;
      const uint8_t* p = cache.bytes(it->second, s);
      try {
        o.value = json::parse(reinterpret_cast<const char*>(p), reinterpret_cast<const char*>(p) + (s.byte_end - s.byte_begin));
      } catch (const json::exception& e) {
        user_error("checkpoint ", dir, ": object '", o.key, "' in ", s.file, " is not valid JSON (", e.what(), ")");
      }
      o.loaded = true;
    }
  }
  return common;
}

}  // namespace megatron::dist_checkpointing
