#include "megatron/core/dist_checkpointing/torch_dist/torch_save.h"

#include <array>
#include <cstring>
#include <map>
#include <string_view>

#include "megatron/core/utils/errors.h"

namespace megatron::dist_checkpointing::torch_dist {

// ---------------------------------------------------------------------------------------------
// CRC-32 (slicing by 8)
// ---------------------------------------------------------------------------------------------

namespace {
struct Crc32Tables {
  std::array<std::array<uint32_t, 256>, 8> t;
  Crc32Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
};
const Crc32Tables& crc_tables() {
  static const Crc32Tables t;
  return t;
}
}  // namespace

uint32_t crc32_zip(const void* data, size_t n, uint32_t crc) {
  const auto& T = crc_tables().t;
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  while (n >= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = T[7][lo & 0xff] ^ T[6][(lo >> 8) & 0xff] ^ T[5][(lo >> 16) & 0xff] ^ T[4][lo >> 24] ^ T[3][hi & 0xff] ^
        T[2][(hi >> 8) & 0xff] ^ T[1][(hi >> 16) & 0xff] ^ T[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--) c = T[0][(c ^ *p++) & 0xff] ^ (c >> 8);
  return ~c;
}

// ---------------------------------------------------------------------------------------------
// Zip reading
// ---------------------------------------------------------------------------------------------

namespace {

uint64_t rd(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int k = 0; k < n; ++k) v |= static_cast<uint64_t>(p[k]) << (8 * k);
  return v;
}

}  // namespace

std::vector<ZipEntry> parse_zip(const uint8_t* d, size_t n, const std::string& what, bool verify_crc) {
  auto bad = [&](const std::string& m) { user_error(what, ": not a valid torch.save archive: ", m); };
  if (n < 22 || rd(d, 4) != 0x04034b50) bad("no zip local header at its start");
  // End of central directory: the last "PK\5\6" within the final 64 KiB + 22 bytes.
  size_t eocd = SIZE_MAX;
  const size_t lo = n > 65557 ? n - 65557 : 0;
  for (size_t p = n - 22 + 1; p-- > lo;)
    if (rd(d + p, 4) == 0x06054b50) {
      eocd = p;
      break;
    }
  if (eocd == SIZE_MAX) bad("no end-of-central-directory record (truncated?)");
  uint64_t count = rd(d + eocd + 10, 2), cd_size = rd(d + eocd + 12, 4), cd_off = rd(d + eocd + 16, 4);
  if (count == 0xffff || cd_size == 0xffffffffu || cd_off == 0xffffffffu) {
    // Zip64: locator right before the EOCD points at the zip64 EOCD record.
    if (eocd < 20 || rd(d + eocd - 20, 4) != 0x07064b50) bad("zip64 locator missing");
    const uint64_t z = rd(d + eocd - 20 + 8, 8);
    if (z > n || n - z < 56 || rd(d + z, 4) != 0x06064b50) bad("zip64 end-of-central-directory record missing");
    count = rd(d + z + 32, 8);
    cd_size = rd(d + z + 40, 8);
    cd_off = rd(d + z + 48, 8);
  }
  if (cd_off > n || cd_size > n - cd_off) bad("central directory outside the archive");
  if (count > cd_size / 46 + 1) bad("central directory entry count " + std::to_string(count) + " too large");
  std::vector<ZipEntry> out;
  size_t p = static_cast<size_t>(cd_off);
  const size_t cd_end = static_cast<size_t>(cd_off + cd_size);
  for (uint64_t e = 0; e < count; ++e) {
    if (cd_end - p < 46 || rd(d + p, 4) != 0x02014b50) bad("central directory entry " + std::to_string(e) + " malformed");
    const uint64_t method = rd(d + p + 10, 2);
    const uint32_t crc = static_cast<uint32_t>(rd(d + p + 16, 4));
    uint64_t csize = rd(d + p + 20, 4), usize = rd(d + p + 24, 4);
    const size_t name_len = rd(d + p + 28, 2), extra_len = rd(d + p + 30, 2), comment_len = rd(d + p + 32, 2);
    uint64_t local = rd(d + p + 42, 4);
    if (cd_end - p - 46 < name_len + extra_len + comment_len) bad("central directory entry " + std::to_string(e) + " truncated");
    ZipEntry z;
    z.name.assign(reinterpret_cast<const char*>(d + p + 46), name_len);
    // Zip64 extended information (id 1): the 0xffffffff fields, in order usize, csize, offset.
    const uint8_t* x = d + p + 46 + name_len;
    for (size_t q = 0; q + 4 <= extra_len;) {
      const uint64_t id = rd(x + q, 2), len = rd(x + q + 2, 2);
      if (q + 4 + len > extra_len) bad("extra field of '" + z.name + "' truncated");
      if (id == 1) {
        size_t r = q + 4;
        auto next = [&](uint64_t& f) {
          if (f != 0xffffffffu) return;
          if (r + 8 > q + 4 + len) bad("zip64 field of '" + z.name + "' truncated");
          f = rd(x + r, 8);
          r += 8;
        };
        next(usize);
        next(csize);
        next(local);
      }
      q += 4 + len;
    }
    if (method != 0) bad("entry '" + z.name + "' is compressed (method " + std::to_string(method) + ")");
    if (csize != usize) bad("entry '" + z.name + "' sizes disagree");
    if (local > n || n - local < 30 || rd(d + local, 4) != 0x04034b50) bad("local header of '" + z.name + "' missing");
    const uint64_t lname = rd(d + local + 26, 2), lextra = rd(d + local + 28, 2);
    z.data_offset = local + 30 + lname + lextra;
    z.size = usize;
    z.crc32 = crc;
    if (z.data_offset > n || z.size > n - z.data_offset) bad("entry '" + z.name + "' reaches past the end (truncated?)");
    if (verify_crc && crc32_zip(d + z.data_offset, static_cast<size_t>(z.size)) != crc)
      bad("entry '" + z.name + "' fails its CRC-32 (corrupt)");
    out.push_back(std::move(z));
    p += 46 + name_len + extra_len + comment_len;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// dtypes
// ---------------------------------------------------------------------------------------------

DType dtype_from_torch_name(const std::string& name, const std::string& where) {
  // torch's dtype names are ours (dtype_name()), under the module "torch".
  if (name.rfind("torch.", 0) == 0) {
    try {
      return dtype_from_name(name.substr(6));
    } catch (const UserError&) {
    }
  }
  user_error(where, ": unsupported tensor dtype ", name);
}

namespace {

DType dtype_from_storage(const std::string& cls, const std::string& where) {
  static const std::map<std::string, DType> m = {
      {"torch.FloatStorage", DType::kFloat32}, {"torch.HalfStorage", DType::kFloat16},
      {"torch.BFloat16Storage", DType::kBFloat16}, {"torch.DoubleStorage", DType::kFloat64},
      {"torch.LongStorage", DType::kInt64},    {"torch.IntStorage", DType::kInt32},
      {"torch.ShortStorage", DType::kInt16},   {"torch.CharStorage", DType::kInt8},
      {"torch.ByteStorage", DType::kUInt8},    {"torch.BoolStorage", DType::kBool}};
  auto it = m.find(cls);
  if (it == m.end()) user_error(where, ": unsupported storage type ", cls);
  return it->second;
}

const char* storage_class(DType t) {
  switch (t) {
    case DType::kFloat32: return "torch.FloatStorage";
    case DType::kFloat16: return "torch.HalfStorage";
    case DType::kBFloat16: return "torch.BFloat16Storage";
    case DType::kFloat64: return "torch.DoubleStorage";
    case DType::kInt64: return "torch.LongStorage";
    case DType::kInt32: return "torch.IntStorage";
    case DType::kInt16: return "torch.ShortStorage";
    case DType::kInt8: return "torch.CharStorage";
    case DType::kUInt8: return "torch.ByteStorage";
    case DType::kBool: return "torch.BoolStorage";
    default: return nullptr;
  }
}

}  // namespace

std::vector<int64_t> int_tuple(const PyValue* v, const std::string& where) {
  if (v->is_object("torch.Size") && v->items.size() == 1) v = v->items[0];
  if (!v->is_seq()) user_error(where, ": expected a tuple of integers, got ", v->type_name());
  std::vector<int64_t> out;
  for (const PyValue* x : v->items) {
    if (!x->is_int()) user_error(where, ": expected a tuple of integers, got an element of type ", x->type_name());
    out.push_back(x->i);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Archive reading
// ---------------------------------------------------------------------------------------------

void read_torch_archive(const uint8_t* data, size_t size, const std::string& what, TorchArchive& out) {
  std::vector<ZipEntry> entries = parse_zip(data, size, what);
  if (entries.empty()) user_error(what, ": empty torch.save archive");
  const std::string& first = entries[0].name;
  const size_t slash = first.find('/');
  if (slash == std::string::npos) user_error(what, ": torch.save archive entry '", first, "' is not in a folder");
  const std::string prefix = first.substr(0, slash + 1);
  std::map<std::string, const ZipEntry*> by_name;
  for (const auto& e : entries) {
    if (e.name.compare(0, prefix.size(), prefix) != 0)
      user_error(what, ": torch.save archive entry '", e.name, "' is outside its folder ", prefix);
    by_name[e.name.substr(prefix.size())] = &e;
  }
  auto pkl = by_name.find("data.pkl");
  if (pkl == by_name.end()) user_error(what, ": torch.save archive has no data.pkl");
  if (auto bo = by_name.find("byteorder"); bo != by_name.end()) {
    std::string b(reinterpret_cast<const char*>(data + bo->second->data_offset), bo->second->size);
    if (b != "little") user_error(what, ": torch.save archive has byte order '", b, "'; only little-endian is supported");
  }
  UnpickleOptions uo;
  uo.what = what;
  try {
    out.root = unpickle(data + pkl->second->data_offset, pkl->second->size, out.doc, uo);
  } catch (const PickleError& e) {
    user_error(e.what());
  }
  // Resolve every _rebuild_tensor_v2 record (walk the value graph once, cycle-safe).
  std::vector<const PyValue*> todo = {out.root};
  std::map<const PyValue*, bool> seen;
  while (!todo.empty()) {
    const PyValue* v = todo.back();
    todo.pop_back();
    if (!seen.emplace(v, true).second) continue;
    for (const PyValue* c : v->items) todo.push_back(c);
    for (const auto& [k, x] : v->dict) {
      todo.push_back(k);
      todo.push_back(x);
    }
    if (v->state) todo.push_back(v->state);
    if (!(v->is_object("torch._utils._rebuild_tensor_v2"))) continue;
    const std::string w = what + " (a tensor in data.pkl)";
    if (v->items.size() < 4) user_error(w, ": _rebuild_tensor_v2 with ", v->items.size(), " arguments");
    const PyValue* pid = v->items[0];
    if (pid->kind != PyValue::Kind::kPersId || !pid->items[0]->is_seq() || pid->items[0]->items.size() < 5)
      user_error(w, ": storage is not a ('storage', type, key, location, numel) persistent id");
    const auto& sid = pid->items[0]->items;
    if (!sid[0]->is_str() || sid[0]->s != "storage" || sid[1]->kind != PyValue::Kind::kGlobal || !sid[2]->is_str() ||
        !sid[4]->is_int())
      user_error(w, ": malformed storage persistent id");
    TorchTensor t;
    t.dtype = dtype_from_storage(sid[1]->s, w);
    auto rec = by_name.find("data/" + sid[2]->s);
    if (rec == by_name.end()) user_error(w, ": storage record data/", sid[2]->s, " is missing");
    const size_t esz = dtype_size(t.dtype);
    const uint64_t numel_storage = static_cast<uint64_t>(sid[4]->i);
    if (sid[4]->i < 0 || rec->second->size / esz < numel_storage)
      user_error(w, ": storage data/", sid[2]->s, " holds ", rec->second->size, " bytes, less than ", sid[4]->i,
                 " elements of ", dtype_name(t.dtype));
    if (!v->items[1]->is_int()) user_error(w, ": storage offset is not an integer");
    const int64_t off = v->items[1]->i;
    t.shape = int_tuple(v->items[2], w + " size");
    const std::vector<int64_t> stride = int_tuple(v->items[3], w + " stride");
    if (stride.size() != t.shape.size()) user_error(w, ": size and stride have different lengths");
    // Extent of the view inside the storage (elements), overflow-checked.
    int64_t lo_e = off, hi_e = off, numel = 1;
    for (size_t k = 0; k < t.shape.size(); ++k) {
      if (t.shape[k] < 0 || stride[k] < 0 || t.shape[k] > (int64_t{1} << 40) || stride[k] > (int64_t{1} << 40))
        user_error(w, ": negative or absurd size/stride");
      if (t.shape[k] == 0) numel = 0;
      else numel *= t.shape[k];
      if (numel > (int64_t{1} << 40)) user_error(w, ": tensor too large");
      if (t.shape[k] > 0) hi_e += (t.shape[k] - 1) * stride[k];
    }
    if (off < 0 || (numel > 0 && static_cast<uint64_t>(hi_e) >= numel_storage))
      user_error(w, ": tensor of size ", shape_str(t.shape), " at offset ", off, " reaches outside its storage of ",
                 numel_storage, " elements");
    (void)lo_e;
    const uint8_t* base = data + rec->second->data_offset;
    // Row-major contiguous copy of the strided view.
    bool contiguous = true;
    for (int64_t k = static_cast<int64_t>(t.shape.size()) - 1, expect = 1; k >= 0; --k) {
      if (t.shape[k] != 1 && stride[k] != expect) contiguous = false;
      expect *= t.shape[k];
    }
    if (numel > 0) {
      if (contiguous) {
        t.data = base + off * esz;
      } else {
        t.owned.resize(static_cast<size_t>(numel) * esz);
        std::vector<int64_t> idx(t.shape.size(), 0);
        for (int64_t e = 0; e < numel; ++e) {
          int64_t src = off;
          for (size_t k = 0; k < idx.size(); ++k) src += idx[k] * stride[k];
          std::memcpy(t.owned.data() + e * esz, base + src * esz, esz);
          for (int64_t k = static_cast<int64_t>(idx.size()) - 1; k >= 0; --k) {
            if (++idx[k] < t.shape[k]) break;
            idx[k] = 0;
          }
        }
        t.data = t.owned.data();
      }
    }
    const_cast<PyValue*>(v)->i = static_cast<int64_t>(out.tensors.size());
    out.tensors.push_back(std::move(t));
  }
}

// ---------------------------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------------------------

std::string write_zip(const std::vector<std::pair<std::string, std::string_view>>& records) {
  std::string out, cd;
  auto w16 = [](std::string& s, uint64_t v) {
    s += static_cast<char>(v & 0xff);
    s += static_cast<char>((v >> 8) & 0xff);
  };
  auto w32 = [](std::string& s, uint64_t v) {
    for (int k = 0; k < 4; ++k) s += static_cast<char>((v >> (8 * k)) & 0xff);
  };
  auto w64 = [](std::string& s, uint64_t v) {
    for (int k = 0; k < 8; ++k) s += static_cast<char>((v >> (8 * k)) & 0xff);
  };
  constexpr uint64_t k32 = 0xffffffffu;
  for (const auto& [name, bytes] : records) {
    const uint64_t local = out.size();
    const uint32_t crc = crc32_zip(bytes.data(), bytes.size());
    const bool big = bytes.size() >= k32 || local >= k32;
    // Local header, zip64 sizes in its extra field when needed, padding so data is 64-aligned.
    std::string lh;
    w32(lh, 0x04034b50);
    w16(lh, big ? 45 : 20);  // version needed
    w16(lh, 0);              // flags
    w16(lh, 0);              // method: stored
    w16(lh, 0);              // time
    w16(lh, 0x21);           // date (1980-01-01)
    w32(lh, crc);
    w32(lh, big ? k32 : bytes.size());
    w32(lh, big ? k32 : bytes.size());
    w16(lh, name.size());
    std::string extra;
    if (big) {
      w16(extra, 1);
      w16(extra, 16);
      w64(extra, bytes.size());
      w64(extra, bytes.size());
    }
    const uint64_t before = local + 30 + name.size() + extra.size();
    uint64_t pad = (64 - (before + 4) % 64) % 64;  // + 4: the padding field's own header
    w16(extra, 0x4246);                            // "FB": torch's padding field
    w16(extra, pad);
    extra.append(pad, 'Z');
    w16(lh, extra.size());
    out += lh;
    out += name;
    out += extra;
    out.append(bytes.data(), bytes.size());
    // Central directory entry.
    const bool cbig = big;
    w32(cd, 0x02014b50);
    w16(cd, cbig ? 45 : 20);  // version made by
    w16(cd, cbig ? 45 : 20);  // version needed
    w16(cd, 0);
    w16(cd, 0);
    w16(cd, 0);
    w16(cd, 0x21);
    w32(cd, crc);
    w32(cd, cbig ? k32 : bytes.size());
    w32(cd, cbig ? k32 : bytes.size());
    w16(cd, name.size());
    w16(cd, cbig ? 28 : 0);  // extra
    w16(cd, 0);              // comment
    w16(cd, 0);              // disk
    w16(cd, 0);              // internal attrs
    w32(cd, 0);              // external attrs
    w32(cd, cbig ? k32 : local);
    cd += name;
    if (cbig) {
      w16(cd, 1);
      w16(cd, 24);
      w64(cd, bytes.size());
      w64(cd, bytes.size());
      w64(cd, local);
    }
  }
  const uint64_t cd_off = out.size();
  out += cd;
  const uint64_t n = records.size();
  if (cd_off >= k32 || cd.size() >= k32 || n >= 0xffff) {
    const uint64_t z = out.size();
    w32(out, 0x06064b50);
    w64(out, 44);
    w16(out, 45);
    w16(out, 45);
    w32(out, 0);
    w32(out, 0);
    w64(out, n);
    w64(out, n);
    w64(out, cd.size());
    w64(out, cd_off);
    w32(out, 0x07064b50);
    w32(out, 0);
    w64(out, z);
    w32(out, 1);
    w32(out, 0x06054b50);
    w16(out, 0);
    w16(out, 0);
    w16(out, 0xffff);
    w16(out, 0xffff);
    w32(out, k32);
    w32(out, k32);
    w16(out, 0);
  } else {
    w32(out, 0x06054b50);
    w16(out, 0);
    w16(out, 0);
    w16(out, n);
    w16(out, n);
    w32(out, cd.size());
    w32(out, cd_off);
    w16(out, 0);
  }
  return out;
}

const PyValue* TorchArchiveWriter::tensor(DType dtype, const Shape& shape, const void* data) {
  const char* sc = storage_class(dtype);
  MEGATRON_CHECK(sc) << "torch.save of dtype " << dtype_name(dtype) << " is not supported";
  const int64_t numel = shape_numel(shape);
  const std::string key = std::to_string(storages_.size());
  storages_.emplace_back(static_cast<const uint8_t*>(data), static_cast<size_t>(numel) * dtype_size(dtype));
  PickleDoc& d = doc_;
  const PyValue* pid = d.persid(d.tuple({d.str("storage"), d.global(sc), d.str(key), d.str("cpu"), d.integer(numel)}));
  std::vector<const PyValue*> size, stride;
  int64_t st = 1;
  std::vector<int64_t> strides(shape.size());
  for (int64_t k = static_cast<int64_t>(shape.size()) - 1; k >= 0; --k) {
    strides[k] = st;
    st *= shape[k];
  }
  for (size_t k = 0; k < shape.size(); ++k) {
    size.push_back(d.integer(shape[k]));
    stride.push_back(d.integer(strides[k]));
  }
  return d.object("torch._utils._rebuild_tensor_v2",
                  {pid, d.integer(0), d.tuple(size), d.tuple(stride), d.boolean(false),
                   d.object("collections.OrderedDict", {})});
}

std::string TorchArchiveWriter::finish(const PyValue* root) {
  const std::string pkl = pickle_dumps(root);
  std::vector<std::pair<std::string, std::string_view>> recs;
  recs.emplace_back(name_ + "/data.pkl", pkl);
  recs.emplace_back(name_ + "/byteorder", "little");
  for (size_t k = 0; k < storages_.size(); ++k)
    recs.emplace_back(name_ + "/data/" + std::to_string(k),
                      std::string_view(reinterpret_cast<const char*>(storages_[k].first), storages_[k].second));
  recs.emplace_back(name_ + "/version", "3\n");
  return write_zip(recs);
}

}  // namespace megatron::dist_checkpointing::torch_dist
