#include "megatron/core/dist_checkpointing/torch_dist/pickle.h"

#include <cmath>
#include <cstring>
#include <set>
#include <unordered_map>

namespace megatron::dist_checkpointing::torch_dist {

namespace {

// Globals a checkpoint may reference. Each becomes inert data (a kGlobal or kObject record);
// nothing is imported or called.
const std::set<std::string>& allowed_globals() {
  static const std::set<std::string> s = {
      // torch.distributed.checkpoint metadata (.metadata)
      "torch.distributed.checkpoint.metadata.Metadata",
      "torch.distributed.checkpoint.metadata.TensorStorageMetadata",
      "torch.distributed.checkpoint.metadata.BytesStorageMetadata",
      "torch.distributed.checkpoint.metadata.ChunkStorageMetadata",
      "torch.distributed.checkpoint.metadata.TensorProperties",
      "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING",
      "torch.distributed.checkpoint.metadata.MetadataIndex",
      "torch.distributed.checkpoint.metadata.StorageMeta",
      "torch.distributed.checkpoint.filesystem._StorageInfo",
      "torch.distributed._shard.sharded_tensor.metadata.TensorProperties",
      "torch.distributed._shard.sharded_tensor.metadata.MEM_FORMAT_ENCODING",
      "torch.distributed.checkpoint.planner.WriteItemType",
      // Megatron's stand-ins for old metadata classes (strategies/torch.py)
      "megatron.core.dist_checkpointing.strategies.torch.MCoreMetadata",
      "megatron.core.dist_checkpointing.strategies.torch.MCoreSavePlan",
      // torch.save
      "torch._utils._rebuild_tensor_v2",
      "torch._utils._rebuild_parameter",
      "torch.Size",
      "torch.serialization._get_layout",
      "torch.strided",
      "torch.contiguous_format",
      "torch.device",
      "torch.FloatStorage", "torch.DoubleStorage", "torch.HalfStorage", "torch.BFloat16Storage",
      "torch.LongStorage", "torch.IntStorage", "torch.ShortStorage", "torch.CharStorage",
      "torch.ByteStorage", "torch.BoolStorage", "torch.UntypedStorage",
      "torch.float32", "torch.float64", "torch.float16", "torch.bfloat16", "torch.int64",
      "torch.int32", "torch.int16", "torch.int8", "torch.uint8", "torch.bool",
      "torch.float8_e4m3fn", "torch.float8_e5m2",
      // Python containers / Megatron's saved args
      "collections.OrderedDict",
      "argparse.Namespace",
      "builtins.set",
      "builtins.frozenset",
      "builtins.slice",
      "builtins.complex",
      // Enums in Megatron's common state: args.exit_signal
      "signal.Signals",
      // numpy (RNG state, scalars)
      "numpy.core.multiarray._reconstruct",
      "numpy._core.multiarray._reconstruct",
      "numpy.core.multiarray.scalar",
      "numpy._core.multiarray.scalar",
      "numpy.ndarray",
      "numpy.dtype",
  };
  return s;
}

// Megatron's enums in saved args (e.g. AttnBackend) and common state (the rerun state machine's
// RerunMode / RerunState): any class of these modules, constructed from its value only.
bool allowed_enum_module(const std::string& name) {
  for (const char* m : {"megatron.core.transformer.enums.", "megatron.core.enums.", "megatron.core.fp8_utils.",
                        "megatron.core.transformer.transformer_config.", "megatron.core.rerun_state_machine."}) {
    const size_t n = std::strlen(m);
    if (name.size() > n && name.compare(0, n, m) == 0 && name.find('.', n) == std::string::npos &&
        std::isupper(static_cast<unsigned char>(name[n])))
      return true;
  }
  return false;
}

}  // namespace

bool pickle_global_allowed(const std::string& n) { return allowed_globals().count(n) > 0 || allowed_enum_module(n); }

// ---------------------------------------------------------------------------------------------
// PyValue / PickleDoc
// ---------------------------------------------------------------------------------------------

const PyValue* PyValue::get(const std::string& key) const {
  if (kind != Kind::kDict) return nullptr;
  for (const auto& [k, v] : dict)
    if (k->kind == Kind::kStr && k->s == key) return v;
  return nullptr;
}

const PyValue* PyValue::attr(const std::string& name) const {
  if (kind != Kind::kObject || !state) return nullptr;
  if (state->kind == Kind::kDict) return state->get(name);
  // (None, slotstate) pairs of objects with __slots__ / dict state: look into both halves.
  if (state->kind == Kind::kTuple && state->items.size() == 2) {
    for (const PyValue* h : state->items)
      if (h->kind == Kind::kDict)
        if (const PyValue* v = h->get(name)) return v;
  }
  return nullptr;
}

std::string PyValue::type_name() const {
  switch (kind) {
    case Kind::kNone: return "None";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kStr: return "str";
    case Kind::kBytes: return "bytes";
    case Kind::kList: return "list";
    case Kind::kTuple: return "tuple";
    case Kind::kDict: return "dict";
    case Kind::kGlobal: return "global " + s;
    case Kind::kObject: return "object " + s;
    case Kind::kPersId: return "persistent id";
  }
  return "?";
}

PyValue* PickleDoc::make(PyValue::Kind k) {
  values_.push_back(std::make_unique<PyValue>());
  values_.back()->kind = k;
  return values_.back().get();
}
PyValue* PickleDoc::boolean(bool v) {
  auto* p = make(PyValue::Kind::kBool);
  p->b = v;
  return p;
}
PyValue* PickleDoc::integer(int64_t v) {
  auto* p = make(PyValue::Kind::kInt);
  p->i = v;
  return p;
}
PyValue* PickleDoc::real(double v) {
  auto* p = make(PyValue::Kind::kFloat);
  p->f = v;
  return p;
}
PyValue* PickleDoc::str(std::string v) {
  auto* p = make(PyValue::Kind::kStr);
  p->s = std::move(v);
  return p;
}
PyValue* PickleDoc::bytes(std::string v) {
  auto* p = make(PyValue::Kind::kBytes);
  p->s = std::move(v);
  return p;
}
PyValue* PickleDoc::list(std::vector<const PyValue*> items) {
  auto* p = make(PyValue::Kind::kList);
  p->items = std::move(items);
  return p;
}
PyValue* PickleDoc::tuple(std::vector<const PyValue*> items) {
  auto* p = make(PyValue::Kind::kTuple);
  p->items = std::move(items);
  return p;
}
PyValue* PickleDoc::dict() { return make(PyValue::Kind::kDict); }
PyValue* PickleDoc::object(std::string cls, std::vector<const PyValue*> args, const PyValue* state, bool newobj) {
  auto* p = make(PyValue::Kind::kObject);
  p->s = std::move(cls);
  p->items = std::move(args);
  p->state = state;
  p->newobj = newobj;
  return p;
}
PyValue* PickleDoc::global(std::string name) {
  auto* p = make(PyValue::Kind::kGlobal);
  p->s = std::move(name);
  return p;
}
PyValue* PickleDoc::persid(const PyValue* id) {
  auto* p = make(PyValue::Kind::kPersId);
  p->items = {id};
  return p;
}

// ---------------------------------------------------------------------------------------------
// Reader
// ---------------------------------------------------------------------------------------------

namespace {

class Unpickler {
 public:
  Unpickler(const uint8_t* d, size_t n, PickleDoc& doc, const UnpickleOptions& o)
      : d_(d), n_(n), doc_(doc), what_(o.what), max_values_(o.max_values ? o.max_values : 64 + 16 * n) {}

  const PyValue* run() {
    while (true) {
      if (pos_ >= n_) fail("truncated (no STOP opcode)");
      const size_t at = pos_;
      const uint8_t op = d_[pos_++];
      if (doc_.size() > start_values_ + max_values_) fail("too many objects for the input size");
      switch (op) {
        case 0x80: {  // PROTO
          const uint8_t v = u8();
          if (v > 5) fail("unsupported pickle protocol " + std::to_string(v));
          break;
        }
        case 0x95: (void)u64(); break;  // FRAME (length hint; data follows inline)
        case '.': {  // STOP
          if (stack_.size() != 1 || !marks_.empty()) fail("STOP with " + std::to_string(stack_.size()) + " values on the stack");
          return stack_.back();
        }
        case '(': marks_.push_back(stack_.size()); break;  // MARK
        case '0': pop(); break;                          // POP
        case '1': pop_mark(); break;                     // POP_MARK
        case '2': push(top()); break;                    // DUP
        case 'N': push(doc_.none()); break;
        case 0x88: push(doc_.boolean(true)); break;
        case 0x89: push(doc_.boolean(false)); break;
        case 'J': push(doc_.integer(static_cast<int32_t>(le(4)))); break;  // BININT
        case 'K': push(doc_.integer(u8())); break;                         // BININT1
        case 'M': push(doc_.integer(static_cast<int64_t>(le(2)))); break;  // BININT2
        case 'I': {  // INT (text): "01"/"00" are True/False in protocol 0
          std::string t = line();
          if (t == "01") push(doc_.boolean(true));
          else if (t == "00") push(doc_.boolean(false));
          else push(doc_.integer(parse_int(t)));
          break;
        }
        case 'L': {  // LONG (text, trailing 'L')
          std::string t = line();
          if (!t.empty() && t.back() == 'L') t.pop_back();
          push(doc_.integer(parse_int(t)));
          break;
        }
        case 0x8a: push(doc_.integer(long_bytes(u8()))); break;                   // LONG1
        case 0x8b: push(doc_.integer(long_bytes(static_cast<size_t>(le(4))))); break;  // LONG4
        case 'G': {  // BINFLOAT (big-endian double)
          uint64_t b = 0;
          const uint8_t* p = take(8);
          for (int k = 0; k < 8; ++k) b = (b << 8) | p[k];
          double v;
          std::memcpy(&v, &b, 8);
          push(doc_.real(v));
          break;
        }
        case 'F': {  // FLOAT (text)
          std::string t = line();
          char* end = nullptr;
          double v = std::strtod(t.c_str(), &end);
          if (t.empty() || end != t.c_str() + t.size()) fail("bad FLOAT '" + t + "'");
          push(doc_.real(v));
          break;
        }
        case 'X': push(doc_.str(chars(le(4)))); break;      // BINUNICODE
        case 0x8c: push(doc_.str(chars(u8()))); break;      // SHORT_BINUNICODE
        case 0x8d: push(doc_.str(chars(u64()))); break;     // BINUNICODE8
        case 'T': push(doc_.str(chars(le(4)))); break;      // BINSTRING (py2 str)
        case 'U': push(doc_.str(chars(u8()))); break;       // SHORT_BINSTRING
        case 'B': push(doc_.bytes(chars(le(4)))); break;    // BINBYTES
        case 'C': push(doc_.bytes(chars(u8()))); break;     // SHORT_BINBYTES
        case 0x8e: push(doc_.bytes(chars(u64()))); break;   // BINBYTES8
        case 0x96: push(doc_.bytes(chars(u64()))); break;   // BYTEARRAY8
        case 'V': push(doc_.str(line())); break;            // UNICODE (raw-unicode-escape; ASCII subset)
        case 'S': {                                         // STRING (quoted repr)
          std::string t = line();
          if (t.size() < 2 || (t.front() != '\'' && t.front() != '"') || t.back() != t.front()) fail("bad STRING");
          push(doc_.str(t.substr(1, t.size() - 2)));
          break;
        }
        case ']': push(doc_.list()); break;   // EMPTY_LIST
        case ')': push(doc_.tuple()); break;  // EMPTY_TUPLE
        case '}': push(doc_.dict()); break;   // EMPTY_DICT
        case 0x8f: push(doc_.list()); break;  // EMPTY_SET (a list of its items)
        case 'l': push(doc_.list(pop_mark())); break;   // LIST
        case 't': push(doc_.tuple(pop_mark())); break;  // TUPLE
        case 0x85: {                                     // TUPLE1
          auto a = pop();
          push(doc_.tuple({a}));
          break;
        }
        case 0x86: {  // TUPLE2
          auto b = pop(), a = pop();
          push(doc_.tuple({a, b}));
          break;
        }
        case 0x87: {  // TUPLE3
          auto c = pop(), b = pop(), a = pop();
          push(doc_.tuple({a, b, c}));
          break;
        }
        case 0x91: push(doc_.list(pop_mark())); break;  // FROZENSET
        case 'd': {                                     // DICT
          auto items = pop_mark();
          if (items.size() % 2) fail("DICT with an odd number of items");
          PyValue* m = doc_.dict();
          for (size_t k = 0; k < items.size(); k += 2) set_item(m, items[k], items[k + 1]);
          push(m);
          break;
        }
        case 'a': {  // APPEND
          auto v = pop();
          mutable_container(top(), PyValue::Kind::kList, "APPEND")->items.push_back(v);
          break;
        }
        case 'e': {  // APPENDS
          auto vs = pop_mark();
          auto* l = mutable_container(top(), PyValue::Kind::kList, "APPENDS");
          l->items.insert(l->items.end(), vs.begin(), vs.end());
          break;
        }
        case 0x90: {  // ADDITEMS (set)
          auto vs = pop_mark();
          auto* l = mutable_container(top(), PyValue::Kind::kList, "ADDITEMS");
          l->items.insert(l->items.end(), vs.begin(), vs.end());
          break;
        }
        case 's': {  // SETITEM
          auto v = pop(), k = pop();
          set_item(mutable_container(top(), PyValue::Kind::kDict, "SETITEM"), k, v);
          break;
        }
        case 'u': {  // SETITEMS
          auto items = pop_mark();
          if (items.size() % 2) fail("SETITEMS with an odd number of items");
          auto* m = mutable_container(top(), PyValue::Kind::kDict, "SETITEMS");
          for (size_t k = 0; k < items.size(); k += 2) set_item(m, items[k], items[k + 1]);
          break;
        }
        case 'g': memo_get(parse_index(line())); break;  // GET
        case 'h': memo_get(u8()); break;                 // BINGET
        case 'j': memo_get(le(4)); break;                // LONG_BINGET
        case 'p': memo_put(parse_index(line())); break;  // PUT
        case 'q': memo_put(u8()); break;                 // BINPUT
        case 'r': memo_put(le(4)); break;                // LONG_BINPUT
        case 0x94: memo_put(memo_next_); break;          // MEMOIZE
        case 'c': {                                      // GLOBAL "module\nname\n"
          std::string mod = line();
          std::string name = line();
          push_global(mod, name, at);
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          auto name = pop(), mod = pop();
          if (!mod->is_str() || !name->is_str()) fail("STACK_GLOBAL needs two strings");
          push_global(mod->s, name->s, at);
          break;
        }
        case 'R': {  // REDUCE callable(*args)
          auto args = pop(), fn = pop();
          push(call(fn, args, false));
          break;
        }
        case 0x81: {  // NEWOBJ cls.__new__(cls, *args)
          auto args = pop(), cls = pop();
          push(call(cls, args, true));
          break;
        }
        case 0x92: {  // NEWOBJ_EX cls.__new__(cls, *args, **kwargs)
          auto kwargs = pop(), args = pop(), cls = pop();
          if (!kwargs->is_dict() || !kwargs->dict.empty()) fail("NEWOBJ_EX with keyword arguments is not supported");
          push(call(cls, args, true));
          break;
        }
        case 'b': {  // BUILD obj.__setstate__(state) / obj.__dict__.update(state)
          auto st = pop();
          const PyValue* obj = top();
          if (obj->kind != PyValue::Kind::kObject) fail("BUILD on a " + obj->type_name());
          PyValue* o = const_cast<PyValue*>(obj);
          if (o->state) {
            // A second BUILD merges dict states (rare); keep the latest otherwise.
            if (o->state->kind == PyValue::Kind::kDict && st->kind == PyValue::Kind::kDict) {
              PyValue* merged = doc_.dict();
              merged->dict = o->state->dict;
              for (const auto& [k, v] : st->dict) set_item(merged, k, v);
              o->state = merged;
              break;
            }
          }
          o->state = st;
          break;
        }
        case 'Q': {  // BINPERSID
          auto id = pop();
          push(doc_.persid(id));
          break;
        }
        case 'P': push(doc_.persid(doc_.str(line()))); break;  // PERSID (text)
        default: {
          char b[8];
          std::snprintf(b, sizeof b, "0x%02x", op);
          fail(std::string("unsupported pickle opcode ") + b +
               (op == 'i' || op == 'o' ? " (INST/OBJ would instantiate a class)"
                : (op == 0x97 || op == 0x98) ? " (out-of-band buffers)"
                : (op >= 0x82 && op <= 0x84) ? " (extension registry)"
                                             : ""),
               at);
        }
      }
    }
  }

 private:
  [[noreturn]] void fail(const std::string& msg, size_t at = SIZE_MAX) const {
    throw PickleError("refusing to load " + what_ + ": " + msg + " (at byte " +
                      std::to_string(at == SIZE_MAX ? pos_ : at) + ")");
  }
  const uint8_t* take(size_t k) {
    if (k > n_ - pos_) fail("truncated (needs " + std::to_string(k) + " more bytes)");
    const uint8_t* p = d_ + pos_;
    pos_ += k;
    return p;
  }
  uint8_t u8() { return *take(1); }
  uint64_t le(size_t k) {
    const uint8_t* p = take(k);
    uint64_t v = 0;
    for (size_t j = 0; j < k; ++j) v |= static_cast<uint64_t>(p[j]) << (8 * j);
    return v;
  }
  uint64_t u64() { return le(8); }
  std::string chars(uint64_t k) {
    if (k > n_ - pos_) fail("truncated (a string of " + std::to_string(k) + " bytes)");
    const uint8_t* p = take(static_cast<size_t>(k));
    return std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(k));
  }
  std::string line() {
    const void* nl = std::memchr(d_ + pos_, '\n', n_ - pos_);
    if (!nl) fail("truncated (no end of line)");
    const size_t len = static_cast<const uint8_t*>(nl) - (d_ + pos_);
    std::string s(reinterpret_cast<const char*>(d_ + pos_), len);
    pos_ += len + 1;
    return s;
  }
  int64_t parse_int(const std::string& t) {
    if (t.empty() || t.size() > 20) fail("bad integer '" + t.substr(0, 24) + "'");
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(t.c_str(), &end, 10);
    if (errno || end != t.c_str() + t.size()) fail("bad integer '" + t + "'");
    return v;
  }
  uint64_t parse_index(const std::string& t) {
    const int64_t v = parse_int(t);
    if (v < 0) fail("negative memo index");
    return static_cast<uint64_t>(v);
  }
  int64_t long_bytes(size_t k) {
    if (k > 8) fail("integer of " + std::to_string(k) + " bytes does not fit in 64 bits");
    const uint8_t* p = take(k);
    if (k == 0) return 0;
    uint64_t v = 0;
    for (size_t j = 0; j < k; ++j) v |= static_cast<uint64_t>(p[j]) << (8 * j);
    if (k < 8 && (p[k - 1] & 0x80)) v |= ~uint64_t{0} << (8 * k);  // sign-extend
    return static_cast<int64_t>(v);
  }
  void push(const PyValue* v) {
    if (stack_.size() > (1u << 24)) fail("stack too deep");
    stack_.push_back(v);
  }
  const PyValue* pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) fail("stack underflow");
    const PyValue* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  const PyValue* top() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) fail("stack underflow");
    return stack_.back();
  }
  std::vector<const PyValue*> pop_mark() {
    if (marks_.empty()) fail("no MARK on the stack");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<const PyValue*> out(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return out;
  }
  PyValue* mutable_container(const PyValue* v, PyValue::Kind k, const char* op) {
    if (v->kind != k) {
      // OrderedDict() and set() calls produce objects whose items are added like a dict/list.
      fail(std::string(op) + " on a " + v->type_name());
    }
    return const_cast<PyValue*>(v);
  }
  void set_item(PyValue* m, const PyValue* k, const PyValue* v) {
    // Python dict semantics: a repeated key (compared for str/int keys) replaces the value.
    if (k->kind == PyValue::Kind::kStr || k->kind == PyValue::Kind::kInt) {
      for (auto& e : m->dict)
        if (e.first->kind == k->kind && (k->kind == PyValue::Kind::kStr ? e.first->s == k->s : e.first->i == k->i)) {
          e.second = v;
          return;
        }
    }
    m->dict.emplace_back(k, v);
  }
  void memo_get(uint64_t idx) {
    auto it = memo_.find(idx);
    if (it == memo_.end()) fail("memo key " + std::to_string(idx) + " not defined");
    push(it->second);
  }
  void memo_put(uint64_t idx) {
    if (memo_.size() > (1u << 24)) fail("memo too large");
    memo_[idx] = top();
    if (idx >= memo_next_) memo_next_ = idx + 1;
  }
  void push_global(const std::string& mod, const std::string& name, size_t at) {
    std::string full = mod + "." + name;
    // Python 2 names that pickle maps to Python 3 (fix_imports): __builtin__ -> builtins.
    if (mod == "__builtin__") full = "builtins." + name;
    if (!pickle_global_allowed(full)) fail("pickle global " + full + " is not allowed", at);
    push(doc_.global(full));
  }
  const PyValue* call(const PyValue* fn, const PyValue* args, bool newobj) {
    if (fn->kind != PyValue::Kind::kGlobal) fail(std::string(newobj ? "NEWOBJ" : "REDUCE") + " on a " + fn->type_name());
    if (args->kind != PyValue::Kind::kTuple) fail("call arguments must be a tuple, got " + args->type_name());
    const std::string& f = fn->s;
    // Containers: OrderedDict() / set(items) become plain dicts / lists.
    if (f == "collections.OrderedDict") {
      PyValue* m = doc_.dict();
      if (!args->items.empty()) {
        const PyValue* a = args->items[0];
        if (!a->is_seq()) fail("OrderedDict argument must be a sequence of pairs");
        for (const PyValue* kv : a->items) {
          if (!kv->is_seq() || kv->items.size() != 2) fail("OrderedDict argument must be a sequence of pairs");
          set_item(m, kv->items[0], kv->items[1]);
        }
      }
      return m;
    }
    if (f == "builtins.set" || f == "builtins.frozenset") {
      PyValue* l = doc_.list();
      if (!args->items.empty()) {
        if (!args->items[0]->is_seq()) fail("set argument must be a list");
        l->items = args->items[0]->items;
      }
      return l;
    }
    if (f == "torch.serialization._get_layout") {
      if (args->items.size() != 1 || !args->items[0]->is_str()) fail("_get_layout takes one string");
      return doc_.global(args->items[0]->s);  // "torch.strided"
    }
    return doc_.object(f, args->items, nullptr, newobj);
  }

  const uint8_t* d_;
  size_t n_;
  size_t pos_ = 0;
  PickleDoc& doc_;
  std::string what_;
  size_t max_values_;
  size_t start_values_ = doc_.size();
  std::vector<const PyValue*> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, const PyValue*> memo_;
  uint64_t memo_next_ = 0;
};

}  // namespace

const PyValue* unpickle(const uint8_t* data, size_t size, PickleDoc& doc, const UnpickleOptions& opts) {
  Unpickler u(data, size, doc, opts);
  return u.run();
}

// ---------------------------------------------------------------------------------------------
// Writer (protocol 2)
// ---------------------------------------------------------------------------------------------

namespace {

class Pickler {
 public:
  std::string out;

  void dump(const PyValue* v, int depth) {
    if (depth > 200) throw PickleError("pickle_dumps: nesting deeper than 200 (a cycle?)");
    using K = PyValue::Kind;
    switch (v->kind) {
      case K::kNone: out += 'N'; break;
      case K::kBool: out += static_cast<char>(v->b ? 0x88 : 0x89); break;
      case K::kInt: integer(v->i); break;
      case K::kFloat: {
        uint64_t b;
        std::memcpy(&b, &v->f, 8);
        out += 'G';
        for (int k = 7; k >= 0; --k) out += static_cast<char>((b >> (8 * k)) & 0xff);
        break;
      }
      case K::kStr:
        out += 'X';
        le32(v->s.size());
        out += v->s;
        break;
      case K::kBytes:
        // Protocol 2 has no bytes opcode: Python 3 writes _codecs.encode(latin1 str, 'latin1').
        // Only used for small blobs; torch.save tensors go through persistent ids.
        out += "c_codecs\nencode\n";
        out += 'X';
        {
          std::string u;  // latin-1 -> UTF-8
          for (unsigned char ch : v->s) {
            if (ch < 0x80) u += static_cast<char>(ch);
            else {
              u += static_cast<char>(0xc0 | (ch >> 6));
              u += static_cast<char>(0x80 | (ch & 0x3f));
            }
          }
          le32(u.size());
          out += u;
        }
        out += "X";
        le32(6);
        out += "latin1";
        out += static_cast<char>(0x86);  // TUPLE2
        out += 'R';
        break;
      case K::kList:
        out += ']';
        if (!v->items.empty()) {
          out += '(';
          for (auto* it : v->items) dump(it, depth + 1);
          out += 'e';
        }
        break;
      case K::kTuple:
        if (v->items.empty()) {
          out += ')';
        } else if (v->items.size() <= 3) {
          for (auto* it : v->items) dump(it, depth + 1);
          out += static_cast<char>(0x84 + v->items.size());  // TUPLE1..3
        } else {
          out += '(';
          for (auto* it : v->items) dump(it, depth + 1);
          out += 't';
        }
        break;
      case K::kDict:
        out += '}';
        if (!v->dict.empty()) {
          out += '(';
          for (const auto& [k, val] : v->dict) {
            dump(k, depth + 1);
            dump(val, depth + 1);
          }
          out += 'u';
        }
        break;
      case K::kGlobal: global(v->s); break;
      case K::kObject: {
        global(v->s);
        out += '(';
        for (auto* it : v->items) dump(it, depth + 1);
        out += 't';
        out += v->newobj ? static_cast<char>(0x81) : 'R';
        if (v->state) {
          dump(v->state, depth + 1);
          out += 'b';
        }
        break;
      }
      case K::kPersId:
        if (v->items.size() != 1) throw PickleError("pickle_dumps: persistent id without a value");
        dump(v->items[0], depth + 1);
        out += 'Q';
        break;
    }
  }

 private:
  void le32(uint64_t n) {
    if (n > 0xffffffffu) throw PickleError("pickle_dumps: string longer than 4 GiB");
    for (int k = 0; k < 4; ++k) out += static_cast<char>((n >> (8 * k)) & 0xff);
  }
  void integer(int64_t i) {
    if (i >= 0 && i < 256) {
      out += 'K';
      out += static_cast<char>(i);
    } else if (i >= 0 && i < 65536) {
      out += 'M';
      out += static_cast<char>(i & 0xff);
      out += static_cast<char>(i >> 8);
    } else if (i >= INT32_MIN && i <= INT32_MAX) {
      out += 'J';
      le32(static_cast<uint32_t>(static_cast<int32_t>(i)));
    } else {
      // LONG1: minimal two's-complement little-endian bytes.
      std::string b;
      uint64_t u = static_cast<uint64_t>(i);
      for (int k = 0; k < 8; ++k) b += static_cast<char>((u >> (8 * k)) & 0xff);
      while (b.size() > 1) {
        const unsigned char last = b.back(), prev = b[b.size() - 2];
        if ((last == 0 && !(prev & 0x80)) || (last == 0xff && (prev & 0x80))) b.pop_back();
        else break;
      }
      out += static_cast<char>(0x8a);
      out += static_cast<char>(b.size());
      out += b;
    }
  }
  void global(const std::string& dotted) {
    const size_t dot = dotted.rfind('.');
    if (dot == std::string::npos) throw PickleError("pickle_dumps: global '" + dotted + "' has no module");
    out += 'c';
    out += dotted.substr(0, dot);
    out += '\n';
    out += dotted.substr(dot + 1);
    out += '\n';
  }
};

}  // namespace

std::string pickle_dumps(const PyValue* v) {
  Pickler p;
  p.out = "\x80\x02";
  p.dump(v, 0);
  p.out += '.';
  return p.out;
}

}  // namespace megatron::dist_checkpointing::torch_dist
