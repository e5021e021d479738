#include "megatron/core/dist_checkpointing/torch_dist/torch_dist.h"

#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>

#include "megatron/core/dist_checkpointing/file_utils.h"
#include "megatron/core/dist_checkpointing/serialization.h"
#include "megatron/core/utils/errors.h"

namespace megatron::dist_checkpointing::torch_dist {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kMd = "torch.distributed.checkpoint.metadata.";

std::string join_dots(const Shape& s) {
  std::string o;
  for (size_t k = 0; k < s.size(); ++k) o += (k ? "." : "") + std::to_string(s[k]);
  return o;
}

std::string object_unique_key(const std::string& key, const Shape& offset, const Shape& shape) {
  return key + "/shard_" + join_dots(offset) + "_" + join_dots(shape);
}

bool any_rank_failed(comm::ProcessGroup* g, bool failed) {
  Tensor t = Tensor::from_vector({failed ? 1.0f : 0.0f}, {1});
  g->all_reduce(t, comm::ReduceOp::kMax)->wait();
  return t.to_float_vector()[0] > 0.5f;
}

}  // namespace

bool is_torch_dist_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_regular_file(dir + "/metadata.json", ec)) return false;
  try {
    json j = json::parse(read_text_file(dir + "/metadata.json"));
    return j.is_object() && j.value("sharded_backend", std::string()) == kTorchDistBackend;
  } catch (const std::exception&) {
    return false;
  }
}

// ---------------------------------------------------------------------------------------------
// .metadata
// ---------------------------------------------------------------------------------------------

DcpMetadata parse_dcp_metadata(const uint8_t* data, size_t size, const std::string& what) {
  PickleDoc doc;
  const PyValue* root = nullptr;
  UnpickleOptions uo;
  uo.what = what;
  try {
    root = unpickle(data, size, doc, uo);
  } catch (const PickleError& e) {
    user_error(e.what());
  }
  auto bad = [&](const std::string& m) { user_error(what, ": not a torch.distributed.checkpoint Metadata: ", m); };
  if (!root->is_object("torch.distributed.checkpoint.metadata.Metadata")) bad("top object is " + root->type_name());
  DcpMetadata md;
  if (const PyValue* v = root->attr("version"); v && v->is_str()) md.version = v->s;
  const PyValue* sdm = root->attr("state_dict_metadata");
  const PyValue* sto = root->attr("storage_data");
  if (!sdm || !sdm->is_dict()) bad("no state_dict_metadata dict");
  if (!sto || !sto->is_dict()) bad("no storage_data dict");
  // storage_data: MetadataIndex(fqn, offset) -> _StorageInfo(relative_path, offset, length)
  std::map<std::pair<std::string, Shape>, DcpBytesMeta> where;
  for (const auto& [k, v] : sto->dict) {
    if (!k->is_object((std::string(kMd) + "MetadataIndex").c_str())) bad("storage_data key is " + k->type_name());
    const PyValue* fqn = k->attr("fqn");
    if (!fqn || !fqn->is_str()) bad("MetadataIndex without fqn");
    Shape off;
    if (const PyValue* o = k->attr("offset"); o && !o->is_none()) off = int_tuple(o, what + " MetadataIndex(" + fqn->s + ").offset");
    if (!v->is_object("torch.distributed.checkpoint.filesystem._StorageInfo"))
      bad("storage of '" + fqn->s + "' is " + v->type_name());
    const PyValue *rp = v->attr("relative_path"), *of = v->attr("offset"), *ln = v->attr("length");
    if (!rp || !rp->is_str() || !of || !of->is_int() || !ln || !ln->is_int() || of->i < 0 || ln->i < 0)
      bad("malformed _StorageInfo of '" + fqn->s + "'");
    if (const PyValue* tr = v->attr("transform_descriptors"); tr && tr->is_seq() && !tr->items.empty())
      user_error(what, ": '", fqn->s, "' is stored with stream transforms (",
                 tr->items[0]->is_str() ? tr->items[0]->s : "?", "), which are not supported");
    if (rp->s.find('/') != std::string::npos || rp->s.find("..") != std::string::npos || rp->s.empty())
      bad("storage file name '" + rp->s + "' of '" + fqn->s + "' is not a plain file name");
    where[{fqn->s, off}] = DcpBytesMeta{rp->s, static_cast<uint64_t>(of->i), static_cast<uint64_t>(ln->i)};
  }
  for (const auto& [k, v] : sdm->dict) {
    if (!k->is_str()) bad("state_dict_metadata key is " + k->type_name());
    const std::string& key = k->s;
    if (v->is_object((std::string(kMd) + "BytesStorageMetadata").c_str())) {
      auto it = where.find({key, Shape{}});
      if (it == where.end()) bad("bytes item '" + key + "' has no storage_data entry");
      md.bytes[key] = it->second;
      continue;
    }
    if (!v->is_object((std::string(kMd) + "TensorStorageMetadata").c_str()))
      bad("'" + key + "' has metadata of type " + v->type_name());
    DcpTensorMeta t;
    const PyValue *props = v->attr("properties"), *sz = v->attr("size"), *chunks = v->attr("chunks");
    if (!props || !sz || !chunks || !chunks->is_seq()) bad("'" + key + "': TensorStorageMetadata without properties/size/chunks");
    // TensorProperties: state tuple (dtype, layout, requires_grad, memory format, pin_memory) or dict.
    const PyValue* dt = nullptr;
    if (props->kind == PyValue::Kind::kObject && props->state) {
      if (props->state->is_seq() && !props->state->items.empty()) dt = props->state->items[0];
      else dt = props->attr("dtype");
    }
    if (!dt || dt->kind != PyValue::Kind::kGlobal) bad("'" + key + "': no dtype in its TensorProperties");
    t.dtype = dtype_from_torch_name(dt->s, what + " '" + key + "'");
    t.size = int_tuple(sz, what + " '" + key + "' size");
    for (const PyValue* c : chunks->items) {
      if (!c->is_object((std::string(kMd) + "ChunkStorageMetadata").c_str())) bad("'" + key + "': chunk is " + c->type_name());
      const PyValue *o = c->attr("offsets"), *s = c->attr("sizes");
      if (!o || !s) bad("'" + key + "': chunk without offsets/sizes");
      DcpChunk ch;
      ch.offsets = int_tuple(o, what + " '" + key + "' chunk offsets");
      ch.sizes = int_tuple(s, what + " '" + key + "' chunk sizes");
      if (ch.offsets.size() != t.size.size() || ch.sizes.size() != t.size.size())
        bad("'" + key + "': chunk rank differs from the tensor's");
      for (size_t d = 0; d < t.size.size(); ++d)
        if (ch.offsets[d] < 0 || ch.sizes[d] < 0 || ch.offsets[d] + ch.sizes[d] > t.size[d])
          bad("'" + key + "': chunk at " + shape_str(ch.offsets) + " of size " + shape_str(ch.sizes) +
              " lies outside the tensor " + shape_str(t.size));
      auto it = where.find({key, ch.offsets});
      if (it == where.end()) bad("'" + key + "': chunk at " + shape_str(ch.offsets) + " has no storage_data entry");
      ch.file = it->second.file;
      ch.offset = it->second.offset;
      ch.length = it->second.length;
      t.chunks.push_back(std::move(ch));
    }
    md.tensors[key] = std::move(t);
  }
  return md;
}

DcpMetadata read_dcp_metadata(const std::string& dir) {
  if (!is_torch_dist_checkpoint(dir))
    user_error(dir, " is not a torch_dist checkpoint (its metadata.json does not name sharded_backend torch_dist)");
  const std::string path = dir + "/.metadata";
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) user_error(path, " is missing (incomplete torch_dist checkpoint)");
  MappedFile f(path);
  return parse_dcp_metadata(f.data(), f.size(), path);
}

std::string dcp_metadata_pickle(const DcpMetadata& md, const std::string& checkpoint_id) {
  PickleDoc d;
  const std::string M = kMd;
  auto obj = [&](const std::string& cls, const PyValue* state) { return d.object(cls, {}, state, /*newobj=*/true); };
  auto size = [&](const Shape& s) {
    std::vector<const PyValue*> v;
    for (auto x : s) v.push_back(d.integer(x));
    return d.object("torch.Size", {d.tuple(v)});
  };
  auto sdict = [&](std::vector<std::pair<std::string, const PyValue*>> kv) {
    PyValue* m = d.dict();
    for (auto& [k, v] : kv) m->dict.emplace_back(d.str(k), v);
    return m;
  };
  PyValue* sdm = d.dict();
  PyValue* sto = d.dict();
  auto storage = [&](const std::string& fqn, const PyValue* offset, const std::string& file, uint64_t off, uint64_t len,
                     const PyValue* index) {
    const PyValue* mi = obj(M + "MetadataIndex", sdict({{"fqn", d.str(fqn)}, {"offset", offset}, {"index", index}}));
    const PyValue* si =
        obj("torch.distributed.checkpoint.filesystem._StorageInfo",
            sdict({{"relative_path", d.str(file)}, {"offset", d.integer(static_cast<int64_t>(off))},
                   {"length", d.integer(static_cast<int64_t>(len))}}));
    sto->dict.emplace_back(mi, si);
  };
  for (const auto& [key, t] : md.tensors) {
    const PyValue* props = obj(
        M + "TensorProperties",
        d.tuple({d.global(std::string("torch.") + dtype_name(t.dtype)), d.global("torch.strided"), d.boolean(false),
                 d.object(M + "_MEM_FORMAT_ENCODING", {d.integer(0)}), d.boolean(false)}));
    PyValue* chunks = d.list();
    for (size_t c = 0; c < t.chunks.size(); ++c) {
      const auto& ch = t.chunks[c];
      chunks->items.push_back(obj(M + "ChunkStorageMetadata", sdict({{"offsets", size(ch.offsets)}, {"sizes", size(ch.sizes)}})));
      storage(key, size(ch.offsets), ch.file, ch.offset, ch.length, d.integer(static_cast<int64_t>(c)));
    }
    sdm->dict.emplace_back(d.str(key), obj(M + "TensorStorageMetadata",
                                           sdict({{"properties", props}, {"size", size(t.size)}, {"chunks", chunks}})));
  }
  for (const auto& [key, b] : md.bytes) {
    sdm->dict.emplace_back(d.str(key), obj(M + "BytesStorageMetadata", d.dict()));
    storage(key, d.none(), b.file, b.offset, b.length, d.none());
  }
  const PyValue* smeta = obj(M + "StorageMeta", sdict({{"checkpoint_id", d.str(checkpoint_id)},
                                                       {"save_id", d.none()},
                                                       {"load_id", d.none()},
                                                       {"modules", d.list()}}));
  const PyValue* root = obj(M + "Metadata", sdict({{"state_dict_metadata", sdm},
                                                   {"planner_data", d.dict()},
                                                   {"storage_data", sto},
                                                   {"storage_meta", smeta},
                                                   {"version", d.str(md.version.empty() ? "1.0.0" : md.version)}}));
  return pickle_dumps(root);
}

// ---------------------------------------------------------------------------------------------
// Python values <-> JSON
// ---------------------------------------------------------------------------------------------

namespace {
json py_to_json_rec(const PyValue* v, const TorchArchive* a, const std::string& where, int depth) {
  if (depth > 64) user_error(where, ": value nested deeper than 64 levels");
  using K = PyValue::Kind;
  switch (v->kind) {
    case K::kNone: return nullptr;
    case K::kBool: return v->b;
    case K::kInt: return v->i;
    case K::kFloat: return std::isfinite(v->f) ? json(v->f) : json(std::to_string(v->f));
    case K::kStr: return v->s;
    case K::kBytes: return json{{"__bytes__", v->s.size()}};
    case K::kGlobal: return v->s;
    case K::kPersId: return json{{"__persistent_id__", true}};
    case K::kList:
    case K::kTuple: {
      json arr = json::array();
      for (const PyValue* x : v->items) arr.push_back(py_to_json_rec(x, a, where, depth + 1));
      return arr;
    }
    case K::kDict: {
      json o = json::object();
      for (const auto& [k, x] : v->dict) {
        std::string key = k->is_str() ? k->s : py_to_json_rec(k, a, where, depth + 1).dump();
        o[key] = py_to_json_rec(x, a, where, depth + 1);
      }
      return o;
    }
    case K::kObject: {
      if (v->s == "torch._utils._rebuild_tensor_v2" && a && v->i >= 0 && static_cast<size_t>(v->i) < a->tensors.size()) {
        const TorchTensor& t = a->tensors[static_cast<size_t>(v->i)];
        if (shape_numel(t.shape) == 1 && t.data) {
          Tensor x = Tensor::empty({1}, t.dtype, Device::cpu());
          std::memcpy(x.data_ptr(), t.data, dtype_size(t.dtype));
          if (t.dtype == DType::kInt64) return x.data<int64_t>()[0];
          if (t.dtype == DType::kInt32) return x.data<int32_t>()[0];
          if (is_floating(t.dtype)) return x.to_float_vector()[0];
        }
        return json{{"__tensor__", t.shape}, {"dtype", dtype_name(t.dtype)}};
      }
      if (v->s == "torch.Size" && v->items.size() == 1) return py_to_json_rec(v->items[0], a, where, depth + 1);
      // Enum(value) and similar one-argument constructions: the value.
      if (!v->state && v->items.size() == 1 && !v->newobj) return py_to_json_rec(v->items[0], a, where, depth + 1);
      if (v->state && v->state->is_dict()) return py_to_json_rec(v->state, a, where, depth + 1);
      json o = {{"__class__", v->s}};
      json args = json::array();
      for (const PyValue* x : v->items) args.push_back(py_to_json_rec(x, a, where, depth + 1));
      o["args"] = args;
      if (v->state) o["state"] = py_to_json_rec(v->state, a, where, depth + 1);
      return o;
    }
  }
  return nullptr;
}
}  // namespace

json py_to_json(const PyValue* v, const TorchArchive* archive, const std::string& where) {
  return py_to_json_rec(v, archive, where, 0);
}

const PyValue* json_to_py(const json& j, PickleDoc& d) {
  switch (j.type()) {
    case json::value_t::null: return d.none();
    case json::value_t::boolean: return d.boolean(j.get<bool>());
    case json::value_t::number_integer: return d.integer(j.get<int64_t>());
    case json::value_t::number_unsigned: return d.integer(static_cast<int64_t>(j.get<uint64_t>()));
    case json::value_t::number_float: return d.real(j.get<double>());
    case json::value_t::string: return d.str(j.get<std::string>());
    case json::value_t::array: {
      PyValue* l = d.list();
      for (const auto& x : j) l->items.push_back(json_to_py(x, d));
      return l;
    }
    case json::value_t::object: {
      PyValue* m = d.dict();
      for (auto it = j.begin(); it != j.end(); ++it) m->dict.emplace_back(d.str(it.key()), json_to_py(it.value(), d));
      return m;
    }
    default: return d.none();
  }
}

json load_common(const std::string& dir) {
  const std::string path = dir + "/common.pt";
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) {  // the layout of Megatron-LM before July 2026 (and ours)
    MappedFile f(path);
    TorchArchive a;
    read_torch_archive(f.data(), f.size(), path, a);
    return py_to_json(a.root, &a, path);
  }
  // Megatron-LM's current layout (dist_checkpointing/serialization.py load_common_state_dict):
  // the common state is the ShardedObject "common_state", a torch.save of [dict].
  const DcpMetadata md = read_dcp_metadata(dir);
  auto it = md.bytes.find(kCommonStateKey);
  if (it == md.bytes.end())
    user_error("checkpoint ", dir, " (torch_dist) has neither common.pt nor the '", kCommonStateKey,
               "' object of its .metadata (incomplete checkpoint)");
  const std::string file = dir + "/" + it->second.file;
  if (!fs::is_regular_file(file, ec)) user_error("checkpoint ", dir, ": file ", it->second.file, " holding '", kCommonStateKey, "' is missing");
  MappedFile f(file);
  const std::string what = file + " (object '" + std::string(kCommonStateKey) + "')";
  if (it->second.offset > f.size() || it->second.length > f.size() - it->second.offset)
    user_error(what, ": the file has only ", f.size(), " bytes (truncated .distcp)");
  TorchArchive a;
  read_torch_archive(f.data() + it->second.offset, static_cast<size_t>(it->second.length), what, a);
  json j = py_to_json(a.root, &a, what);
  if (!j.is_array() || j.size() != 1 || !j[0].is_object())
    user_error(what, ": expected a one-element list holding the common state dict");
  return j[0];
}

// ---------------------------------------------------------------------------------------------
// Load
// ---------------------------------------------------------------------------------------------

json load(ShardedStateDict& sd, const std::string& dir_in, const LoadOptions& opts) {
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const DcpMetadata md = read_dcp_metadata(dir);
  json common = load_common(dir);
  std::map<std::string, std::unique_ptr<MappedFile>> files;
  auto file = [&](const std::string& name, const std::string& key) -> const MappedFile& {
    auto it = files.find(name);
    if (it == files.end()) {
      std::error_code ec;
      if (!fs::is_regular_file(dir + "/" + name, ec))
        user_error("checkpoint ", dir, ": file ", name, " holding '", key, "' is missing");
      it = files.emplace(name, std::make_unique<MappedFile>(dir + "/" + name)).first;
    }
    return *it->second;
  };
  // Parsed chunk archives, by (file, offset).
  std::map<std::pair<std::string, uint64_t>, std::unique_ptr<TorchArchive>> archives;
  auto chunk_tensor = [&](const std::string& key, const DcpTensorMeta& t, const DcpChunk& c) -> const TorchTensor& {
    auto& slot = archives[{c.file, c.offset}];
    if (!slot) {
      const MappedFile& f = file(c.file, key);
      const std::string what = dir + "/" + c.file + " (bytes " + std::to_string(c.offset) + ".." +
                               std::to_string(c.offset + c.length) + ", chunk of '" + key + "' at " +
                               shape_str(c.offsets) + ")";
      if (c.offset > f.size() || c.length > f.size() - c.offset)
        user_error(what, ": the file has only ", f.size(), " bytes (truncated .distcp)");
      auto a = std::make_unique<TorchArchive>();
      read_torch_archive(f.data() + c.offset, static_cast<size_t>(c.length), what, *a);
      if (!a->root->is_object("torch._utils._rebuild_tensor_v2") || a->tensors.size() != 1)
        user_error(what, ": the item is not one tensor (", a->root->type_name(), ")");
      const TorchTensor& tt = a->tensors[0];
      if (shape_numel(tt.shape) != shape_numel(c.sizes))
        user_error(what, ": stored tensor has shape ", shape_str(tt.shape), " but the metadata says ", shape_str(c.sizes));
      if (tt.dtype != t.dtype && !(is_floating(tt.dtype) && is_floating(t.dtype)))
        user_error(what, ": stored tensor is ", dtype_name(tt.dtype), " but the metadata says ", dtype_name(t.dtype));
      slot = std::move(a);
    }
    return slot->tensors[0];
  };
  for (auto& t : sd.tensors) {
    t.validate();
    const std::string ck = opts.key_map ? opts.key_map(t.key) : t.key;
    auto it = md.tensors.find(ck);
    if (it == md.tensors.end())
      user_error("checkpoint ", dir, " (torch_dist) has no tensor '", ck, "'",
                 md.bytes.count(ck) ? " (it is stored as a bytes object)" : "");
    const DcpTensorMeta& st = it->second;
    if (st.size != t.global_shape)
      user_error("checkpoint ", dir, " (torch_dist): '", ck, "' has global shape ", shape_str(st.size),
                 " but the model expects ", shape_str(t.global_shape),
                 " (load with the model flags the checkpoint was trained with; the padded vocabulary is a multiple of "
                 "--make-vocab-size-divisible-by x TP)");
    if (st.dtype != t.data.dtype() && !(is_floating(st.dtype) && is_floating(t.data.dtype())))
      user_error("checkpoint ", dir, " (torch_dist): '", ck, "' is stored as ", dtype_name(st.dtype), ", cannot load into ",
                 dtype_name(t.data.dtype()));
    Tensor target = t.data.is_cpu() ? t.data : Tensor::empty(t.data.shape(), t.data.dtype(), Device::cpu());
    const int64_t db = t.flattened_range ? t.flattened_range->first : 0;
    const int64_t de = t.flattened_range ? t.flattened_range->second : shape_numel(t.local_shape);
    int64_t copied = 0;
    for (const auto& c : st.chunks) {
      bool overlap = true;
      for (size_t i = 0; i < c.offsets.size() && overlap; ++i)
        overlap = std::max(c.offsets[i], t.global_offset[i]) < std::min(c.offsets[i] + c.sizes[i], t.global_offset[i] + t.local_shape[i]);
      if (!overlap) continue;
      const TorchTensor& src = chunk_tensor(ck, st, c);
      copied += copy_box_overlap(src.data, src.dtype, c.offsets, c.sizes, 0, shape_numel(c.sizes),
                                 static_cast<uint8_t*>(target.data_ptr()), target.dtype(), t.global_offset, t.local_shape,
                                 db, de);
    }
    if (copied != de - db)
      user_error("checkpoint ", dir, " (torch_dist): the chunks of '", ck, "' cover ", copied, " of the ", de - db,
                 " elements requested at offset ", shape_str(t.global_offset), " (.metadata lists too few chunks)");
    if (!t.data.is_cpu()) t.data.copy_(target);
  }
  for (auto& o : sd.objects) {
    o.loaded = false;
    const std::string uk = object_unique_key(kOwnObjectPrefix + o.key, o.global_offset, o.global_shape);
    auto it = md.bytes.find(uk);
    if (it == md.bytes.end()) continue;
    const MappedFile& f = file(it->second.file, uk);
    if (it->second.offset > f.size() || it->second.length > f.size() - it->second.offset)
      user_error("checkpoint ", dir, ": ", it->second.file, " is shorter than the object '", uk, "' it should hold (truncated)");
    const char* p = reinterpret_cast<const char*>(f.data() + it->second.offset);
    try {
      o.value = json::parse(p, p + it->second.length);
    } catch (const json::exception& e) {
      user_error("checkpoint ", dir, ": object '", uk, "' in ", it->second.file, " is not valid JSON (", e.what(), ")");
    }
    o.loaded = true;
  }
  return common;
}

// ---------------------------------------------------------------------------------------------
// Save
// ---------------------------------------------------------------------------------------------

std::vector<std::pair<Shape, Shape>> flat_range_boxes(const Shape& shape, int64_t b, int64_t e) {
  std::vector<std::pair<Shape, Shape>> out;
  if (b >= e) return out;
  if (shape.empty()) {
    out.push_back({{}, {}});
    return out;
  }
  const Shape rest(shape.begin() + 1, shape.end());
  const int64_t row = shape_numel(rest);
  if (row == 0) return out;
  auto prepend = [&](int64_t r, std::vector<std::pair<Shape, Shape>> sub) {
    for (auto& [o, s] : sub) {
      o.insert(o.begin(), r);
      s.insert(s.begin(), 1);
      out.push_back({o, s});
    }
  };
  if (b % row != 0) {
    const int64_t r = b / row;
    const int64_t end_in_row = std::min(e, (r + 1) * row);
    prepend(r, flat_range_boxes(rest, b - r * row, end_in_row - r * row));
    b = end_in_row;
    if (b >= e) return out;
  }
  const int64_t full = (e - b) / row;
  if (full > 0) {
    Shape o(shape.size(), 0), s = shape;
    o[0] = b / row;
    s[0] = full;
    out.push_back({o, s});
    b += full * row;
  }
  if (b < e) prepend(b / row, flat_range_boxes(rest, 0, e - b));
  return out;
}

namespace {

struct RankRecord {  // one item this rank wrote
  bool bytes = false;
  std::string key;
  DType dtype = DType::kFloat32;
  Shape size, offsets, sizes;
  uint64_t offset = 0, length = 0;
};

json record_json(const RankRecord& r) {
  return {{"bytes", r.bytes},   {"key", r.key},         {"dtype", dtype_name(r.dtype)}, {"size", r.size},
          {"offsets", r.offsets}, {"sizes", r.sizes}, {"offset", r.offset},                  {"length", r.length}};
}

std::string rank_file(int rank) { return "__" + std::to_string(rank) + "_0.distcp"; }
std::string rank_index(int rank) { return ".__" + std::to_string(rank) + "_0.items.json"; }

}  // namespace

void save(const ShardedStateDict& sd, const std::string& dir_in, comm::ProcessGroup* group, const SaveOptions& opts) {
  std::shared_ptr<comm::ProcessGroup> owned;
  if (!group) {
    owned = comm::make_single_rank_group();
    group = owned.get();
  }
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const int rank = group->rank(), world = group->size();
  // Refuse to replace anything that is not a checkpoint (as our own format does).
  std::string unsafe;
  if (rank == 0) {
    std::error_code ec;
    const auto st = fs::symlink_status(dir, ec);
    if (!ec && fs::exists(st)) {
      if (!fs::is_directory(st)) {
        unsafe = "it exists and is not a directory";
      } else {
        for (const auto& e : fs::directory_iterator(dir, ec)) {
          const std::string n = e.path().filename().string();
          const bool ours = n == ".metadata" || n == "common.pt" || n == "metadata.json" || n == "common.json" ||
                            (n.size() > 7 && n.compare(n.size() - 7, 7, ".distcp") == 0) ||
                            (n.size() > 12 && n.compare(n.size() - 12, 12, ".safetensors") == 0);
          if (!ours) {
            unsafe = "it holds '" + n + "', which is not part of a checkpoint";
            break;
          }
        }
      }
    }
  }
  if (any_rank_failed(group, !unsafe.empty())) {
    if (!unsafe.empty()) user_error("checkpoint save: refusing to replace ", dir, ": ", unsafe, "; move it away or save to another directory");
    user_error("checkpoint save: rank 0 refused to replace ", dir);
  }
  Tensor pid = Tensor::from_vector_i64({static_cast<int64_t>(::getpid())}, {1});
  group->broadcast(pid, 0)->wait();
  const std::string tmp = dir + ".tmp-" + std::to_string(pid.data<int64_t>()[0]);
  auto discard = [&] {
    std::error_code ec;
    if (rank == 0) fs::remove_all(tmp, ec);
  };
  std::exception_ptr err;
  try {
    std::error_code ec;
    fs::create_directories(tmp, ec);
    if (ec) user_error("cannot create checkpoint directory ", tmp, ": ", ec.message());
    std::vector<RankRecord> recs;
    FileWriter w(tmp + "/" + rank_file(rank));
    auto put = [&](RankRecord r, const std::string& bytes) {
      r.offset = w.position();
      r.length = bytes.size();
      w.write(bytes.data(), bytes.size());
      recs.push_back(std::move(r));
    };
    std::set<std::pair<std::string, Shape>> seen;
    for (const auto& t : sd.tensors) {
      if (t.replica_id != 0) continue;
      t.validate();
      const std::string key = opts.key_map ? opts.key_map(t.key) : t.key;
      if (key.empty()) continue;  // not part of the checkpoint (SaveOptions::key_map)
      Tensor cpu = t.data.to(Device::cpu());
      const size_t esz = dtype_size(cpu.dtype());
      // Boxes this piece covers: the whole local box, or those of its flattened range.
      std::vector<std::pair<Shape, Shape>> boxes;
      if (t.flattened_range) boxes = flat_range_boxes(t.local_shape, t.flattened_range->first, t.flattened_range->second);
      else if (shape_numel(t.local_shape) > 0) boxes.push_back({Shape(t.local_shape.size(), 0), t.local_shape});
      const int64_t base = t.flattened_range ? t.flattened_range->first : 0;
      for (const auto& [rel, sizes] : boxes) {
        Shape off(rel.size());
        for (size_t k = 0; k < rel.size(); ++k) off[k] = t.global_offset[k] + rel[k];
        if (!seen.insert({key, off}).second) user_error("checkpoint save: two pieces of '", key, "' at ", shape_str(off));
        // The box's elements are contiguous in the flat local data: [flat(rel), flat(rel) + numel).
        int64_t first = 0;
        for (size_t k = 0, stride = 1; k < rel.size(); ++k) {
          stride = 1;
          for (size_t j = k + 1; j < rel.size(); ++j) stride *= static_cast<size_t>(t.local_shape[j]);
          first += rel[k] * static_cast<int64_t>(stride);
        }
        const uint8_t* p = static_cast<const uint8_t*>(cpu.data_ptr()) + static_cast<size_t>(first - base) * esz;
        TorchArchiveWriter aw("archive");
        const PyValue* tv = aw.tensor(cpu.dtype(), sizes, p);
        RankRecord r;
        r.key = key;
        r.dtype = cpu.dtype();
        r.size = t.global_shape;
        r.offsets = off;
        r.sizes = sizes;
        put(std::move(r), aw.finish(tv));
      }
    }
    for (const auto& o : sd.objects) {
      if (o.replica_id != 0) continue;
      RankRecord r;
      r.bytes = true;
      r.key = object_unique_key(kOwnObjectPrefix + o.key, o.global_offset, o.global_shape);
      put(std::move(r), o.value.dump());
    }
    for (const auto& uk : opts.none_objects) {
      TorchArchiveWriter aw("archive");
      const PyValue* v = aw.doc().list({aw.doc().none()});
      RankRecord r;
      r.bytes = true;
      r.key = uk;
      put(std::move(r), aw.finish(v));
    }
    if (rank == 0) {
      // Megatron-LM's current layout keeps the common state as the ShardedObject "common_state"
      // (torch.save of [dict], serialization.py save); common.pt below serves older readers.
      TorchArchiveWriter aw("archive");
      const PyValue* root = opts.common ? opts.common(aw) : json_to_py(sd.common, aw.doc());
      RankRecord r;
      r.bytes = true;
      r.key = kCommonStateKey;
      put(std::move(r), aw.finish(aw.doc().list({root})));
    }
    w.close();
    json idx = json::array();
    for (const auto& r : recs) idx.push_back(record_json(r));
    FileWriter wi(tmp + "/" + rank_index(rank));
    const std::string s = idx.dump();
    wi.write(s.data(), s.size());
    wi.close();
  } catch (...) {
    err = std::current_exception();
  }
  if (any_rank_failed(group, static_cast<bool>(err))) {
    discard();
    if (err) std::rethrow_exception(err);
    user_error("checkpoint save to ", dir, " failed on another rank");
  }
  if (rank == 0) {
    try {
      DcpMetadata md;
      md.version = "1.0.0";
      for (int r = 0; r < world; ++r) {
        const std::string ip = tmp + "/" + rank_index(r);
        for (const auto& j : json::parse(read_text_file(ip))) {
          const std::string key = j.at("key");
          if (j.at("bytes").get<bool>()) {
            if (md.bytes.count(key)) user_error("checkpoint save: object '", key, "' written by two ranks");
            md.bytes[key] = DcpBytesMeta{rank_file(r), j.at("offset"), j.at("length")};
            continue;
          }
          auto [pos, fresh] = md.tensors.try_emplace(key);
          DcpTensorMeta& t = pos->second;
          const DType dt = dtype_from_torch_name(std::string("torch.") + j.at("dtype").get<std::string>(), key);
          const Shape size = j.at("size").get<Shape>();
          if (fresh) {
            t.dtype = dt;
            t.size = size;
          } else if (t.dtype != dt || t.size != size) {
            user_error("checkpoint save: ranks disagree on '", key, "': ", shape_str(t.size), " vs ", shape_str(size));
          }
          DcpChunk c{j.at("offsets").get<Shape>(), j.at("sizes").get<Shape>(), rank_file(r), j.at("offset"), j.at("length")};
          for (const auto& o : t.chunks)
            if (o.offsets == c.offsets)
              user_error("checkpoint save: chunk of '", key, "' at ", shape_str(c.offsets), " is written by two ranks (",
                         o.file, " and ", c.file, ")");
          t.chunks.push_back(std::move(c));
        }
        fs::remove(ip);
      }
      for (const auto& [key, t] : md.tensors) {
        int64_t n = 0;
        for (const auto& c : t.chunks) n += shape_numel(c.sizes);
        if (n != shape_numel(t.size))
          user_error("checkpoint save: the chunks of '", key, "' hold ", n, " elements but its shape ", shape_str(t.size),
                     " has ", shape_numel(t.size), " (a rank did not contribute its piece)");
      }
      auto write = [&](const std::string& name, const std::string& bytes) {
        FileWriter fw(tmp + "/" + name);
        fw.write(bytes.data(), bytes.size());
        fw.close();
      };
      TorchArchiveWriter cw("common");
      const PyValue* croot = opts.common ? opts.common(cw) : json_to_py(sd.common, cw.doc());
      write("common.pt", cw.finish(croot));
      write(".metadata", dcp_metadata_pickle(md, dir));
      write("metadata.json", json({{"sharded_backend", kTorchDistBackend}, {"sharded_backend_version", 1}}).dump());
      fsync_dir(tmp);
      // Put the directory in place (replacing an earlier checkpoint of the same name).
      std::error_code ec;
      if (fs::exists(dir, ec)) {
        const std::string old = dir + ".old-" + std::to_string(::getpid());
        fs::rename(dir, old);
        fs::rename(tmp, dir);
        fs::remove_all(old, ec);
      } else {
        fs::rename(tmp, dir);
      }
      const auto parent = fs::path(dir).parent_path();
      fsync_dir(parent.empty() ? "." : parent.string());
    } catch (...) {
      err = std::current_exception();
    }
  }
  if (any_rank_failed(group, static_cast<bool>(err))) {
    discard();
    if (err) std::rethrow_exception(err);
    user_error("checkpoint save to ", dir, " failed on rank 0");
  }
}

}  // namespace megatron::dist_checkpointing::torch_dist
