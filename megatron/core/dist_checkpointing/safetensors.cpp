#include "megatron/core/dist_checkpointing/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "megatron/core/dist_checkpointing/file_utils.h"
#include "megatron/core/utils/errors.h"
#include "megatron/core/utils/temp_file.h"

namespace megatron::dist_checkpointing {

namespace {

struct DTypeName {
  DType t;
  const char* name;
  int rank;  // position in the reference implementation's Dtype enum order (sort key)
};

constexpr DTypeName kNames[] = {
    {DType::kBool, "BOOL", 0},        {DType::kUInt8, "U8", 1},        {DType::kInt8, "I8", 2},
    {DType::kFloat8E5M2, "F8_E5M2", 3}, {DType::kFloat8E4M3, "F8_E4M3", 4}, {DType::kInt16, "I16", 5},
    {DType::kUInt16, "U16", 6},       {DType::kFloat16, "F16", 7},     {DType::kBFloat16, "BF16", 8},
    {DType::kInt32, "I32", 9},        {DType::kFloat32, "F32", 10},    {DType::kFloat64, "F64", 11},
    {DType::kInt64, "I64", 12},
};

int dtype_rank(DType t) {
  for (const auto& n : kNames)
    if (n.t == t) return n.rank;
  MEGATRON_CHECK(false) << "dtype without safetensors name: " << dtype_name(t);
  return -1;
}

constexpr uint64_t kMaxHeader = 100ull << 20;  // the reference refuses headers over 100 MB

}  // namespace

const char* safetensors_dtype_name(DType t) {
  for (const auto& n : kNames)
    if (n.t == t) return n.name;
  MEGATRON_CHECK(false) << "dtype without safetensors name: " << dtype_name(t);
  return "";
}

DType safetensors_dtype_from_name(const std::string& name, const std::string& where) {
  for (const auto& n : kNames)
    if (name == n.name) return n.t;
  user_error(where, ": unsupported safetensors dtype '", name,
             "' (supported: BOOL U8 I8 F8_E5M2 F8_E4M3 I16 U16 F16 BF16 I32 F32 F64 I64)");
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  file_ = std::make_unique<MappedFile>(path);
  const size_t size = file_->size();
  if (size < 8) user_error(path, ": not a safetensors file (", size, " bytes, shorter than the 8-byte header length)");
  uint64_t n;
  std::memcpy(&n, file_->data(), 8);  // little-endian host (x86-64/aarch64)
  if (n > kMaxHeader || n + 8 > size)
    user_error(path, ": corrupt safetensors header length ", n, " (file has ", size, " bytes)");
  data_start_ = 8 + n;
  const char* hp = reinterpret_cast<const char*>(file_->data() + 8);
  if (n == 0 || hp[0] != '{') user_error(path, ": safetensors header does not start with '{'");
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(hp, hp + n);
  } catch (const std::exception& e) {
    user_error(path, ": safetensors header is not valid JSON (", e.what(), ")");
  }
  if (!h.is_object()) user_error(path, ": safetensors header is not a JSON object");
  const uint64_t buf = size - data_start_;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& key = it.key();
    const auto& v = it.value();
    if (key == "__metadata__") {
      if (!v.is_object()) user_error(path, ": __metadata__ must be an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) user_error(path, ": __metadata__['", m.key(), "'] is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor '" + key + "'";
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      user_error(where, " needs dtype, shape and data_offsets");
    SafetensorsEntry e;
    e.name = key;
    if (!v["dtype"].is_string()) user_error(where, ": dtype is not a string");
    e.dtype = safetensors_dtype_from_name(v["dtype"].get<std::string>(), where);
    if (!v["shape"].is_array()) user_error(where, ": shape is not an array");
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) user_error(where, ": shape entries must be non-negative integers");
      e.shape.push_back(d.get<int64_t>());
    }
    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      user_error(where, ": data_offsets must be [begin, end]");
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    if (e.end < e.begin || e.end > buf)
      user_error(where, ": data_offsets [", e.begin, ", ", e.end, "] outside the ", buf, "-byte buffer (truncated file?)");
    const uint64_t want = static_cast<uint64_t>(shape_numel(e.shape)) * dtype_size(e.dtype);
    if (e.nbytes() != want)
      user_error(where, ": ", e.nbytes(), " bytes for shape ", shape_str(e.shape), " ", v["dtype"].get<std::string>(),
                 " (expected ", want, ")");
    entries_.push_back(std::move(e));
  }
  std::sort(entries_.begin(), entries_.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (i > 0 && entries_[i].begin < entries_[i - 1].end)
      user_error(path, ": tensors '", entries_[i - 1].name, "' and '", entries_[i].name, "' overlap");
    index_[entries_[i].name] = i;
  }
}

SafetensorsReader::~SafetensorsReader() = default;

const SafetensorsEntry* SafetensorsReader::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

const SafetensorsEntry& SafetensorsReader::at(const std::string& name) const {
  const auto* e = find(name);
  if (!e) user_error(path_, ": no tensor '", name, "'");
  return *e;
}

const uint8_t* SafetensorsReader::bytes(const SafetensorsEntry& e) const {
  return file_->data() + data_start_ + e.begin;
}

Tensor SafetensorsReader::tensor(const std::string& name) const {
  const auto& e = at(name);
  Tensor t = Tensor::empty(e.shape, e.dtype);
  if (e.nbytes()) std::memcpy(t.data_ptr(), bytes(e), e.nbytes());
  return t;
}

SafetensorsLayout plan_safetensors(const std::vector<SafetensorsItem>& items,
                                   const std::map<std::string, std::string>& metadata) {
  SafetensorsLayout L;
  L.order.resize(items.size());
  for (size_t i = 0; i < items.size(); ++i) L.order[i] = i;
  std::sort(L.order.begin(), L.order.end(), [&](size_t a, size_t b) {
    int ra = dtype_rank(items[a].dtype), rb = dtype_rank(items[b].dtype);
    return ra != rb ? ra > rb : items[a].name < items[b].name;
  });
  // Header as the reference writes it: "__metadata__" first (our keys sorted), then the tensors in
  // buffer order, each as {"dtype", "shape", "data_offsets"} in that field order.
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = std::move(m);
  }
  uint64_t off = 0;
  for (size_t i : L.order) {
    const auto& it = items[i];
    if (it.name == "__metadata__") user_error("safetensors: a tensor cannot be named __metadata__");
    if (h.contains(it.name)) user_error("safetensors: duplicate tensor name '", it.name, "'");
    SafetensorsEntry e;
    e.name = it.name;
    e.dtype = it.dtype;
    e.shape = it.shape;
    e.begin = off;
    off += static_cast<uint64_t>(shape_numel(it.shape)) * dtype_size(it.dtype);
    e.end = off;
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = safetensors_dtype_name(it.dtype);
    entry["shape"] = it.shape;
    entry["data_offsets"] = {e.begin, e.end};
    h[it.name] = std::move(entry);
    L.entries.push_back(std::move(e));
  }
  L.data_bytes = off;
  std::string js = h.dump();
  while (js.size() % 8 != 0) js.push_back(' ');
  uint64_t n = js.size();
  L.header.resize(8);
  std::memcpy(L.header.data(), &n, 8);
  L.header += js;
  return L;
}

void save_safetensors(const std::string& path, const std::vector<SafetensorsItem>& items,
                      const std::map<std::string, std::string>& metadata) {
  SafetensorsLayout L = plan_safetensors(items, metadata);
  std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  TempFileGuard guard(tmp);  // removed on every failure below (ENOSPC, EFBIG, EIO, rename)
  {
    AlignedFileWriter w(tmp);
    w.write(L.header.data(), L.header.size());
    for (size_t k = 0; k < L.order.size(); ++k) w.write(items[L.order[k]].data, L.entries[k].nbytes());
    w.close();
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) user_error("cannot rename ", tmp, " to ", path, ": ", ec.message());
  guard.release();
  auto parent = std::filesystem::path(path).parent_path();
  fsync_dir(parent.empty() ? "." : parent.string());
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<Tensor> cpu;
  std::vector<SafetensorsItem> items;
  cpu.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    cpu.push_back(t.to(Device::cpu()));
    items.push_back({name, t.dtype(), t.shape(), cpu.back().data_ptr()});
  }
  save_safetensors(path, items, metadata);
}

}  // namespace megatron::dist_checkpointing
