// A small, safe subset of Python's pickle format: what PyTorch Distributed Checkpoint (DCP)
// `.metadata` files and `torch.save` archives (`data.pkl`) contain.
//
// Reading never runs code. Pickle opcodes build data only (None, bools, ints, floats, str,
// bytes, lists, tuples, dicts, sets as lists, memo references, persistent ids). The opcodes that
// would import and call Python objects (GLOBAL / STACK_GLOBAL, then REDUCE / NEWOBJ / BUILD) are
// accepted only for the classes and functions on an explicit allowlist (kAllowedGlobals in
// pickle.cpp: the DCP metadata dataclasses, torch._utils._rebuild_tensor_v2, torch storage
// classes and dtypes, torch.Size, collections.OrderedDict, argparse.Namespace, numpy arrays /
// dtypes, Megatron's enums); they become inert `kObject` records (class name, constructor
// arguments, BUILD state) that the caller interprets. Any other global is refused by name:
// `pickle global os.system is not allowed`. Malformed, truncated or oversized input throws
// PickleError (never crashes, never allocates more than a small multiple of the input size).
//
// Writing emits protocol 2 (what torch.save uses by default and every Python 3 unpickler reads).
//
// Format reference: Python's Lib/pickletools.py (opcode table) and PEP 307 / 3154.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace megatron::dist_checkpointing::torch_dist {

/// Thrown for malformed or refused pickle input (message says what and where).
class PickleError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// One unpickled value. Objects are owned by a PickleDoc arena; references are raw pointers so
/// cyclic or very deep structures (possible in hostile input) are freed without recursion.
struct PyValue {
  enum class Kind { kNone, kBool, kInt, kFloat, kStr, kBytes, kList, kTuple, kDict, kGlobal, kObject, kPersId };
  Kind kind = Kind::kNone;
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  /// kStr / kBytes: the data; kGlobal / kObject: "module.name" of the class or function.
  std::string s;
  /// kList / kTuple items; kObject: constructor / function arguments; kPersId: [the id value].
  std::vector<const PyValue*> items;
  /// kDict entries in insertion order.
  std::vector<std::pair<const PyValue*, const PyValue*>> dict;
  /// kObject: the BUILD state (nullptr if none).
  const PyValue* state = nullptr;
  /// kObject made with NEWOBJ (cls.__new__(cls, *args)) rather than REDUCE (callable(*args)).
  bool newobj = false;

  bool is_none() const { return kind == Kind::kNone; }
  bool is_str() const { return kind == Kind::kStr; }
  bool is_int() const { return kind == Kind::kInt; }
  bool is_seq() const { return kind == Kind::kList || kind == Kind::kTuple; }
  bool is_dict() const { return kind == Kind::kDict; }
  bool is_object(const char* cls) const { return kind == Kind::kObject && s == cls; }
  /// Dict lookup by string key (nullptr if absent or not a dict).
  const PyValue* get(const std::string& key) const;
  /// For an object: attribute `name` of its BUILD state dict (dataclasses, Namespace), or nullptr.
  const PyValue* attr(const std::string& name) const;
  /// Human-readable kind name ("dict", "str", "object torch.Size", ...) for error messages.
  std::string type_name() const;
};

/// Owns every PyValue of one unpickled (or to-be-pickled) document.
class PickleDoc {
 public:
  PyValue* make(PyValue::Kind k);
  PyValue* none() { return make(PyValue::Kind::kNone); }
  PyValue* boolean(bool v);
  PyValue* integer(int64_t v);
  PyValue* real(double v);
  PyValue* str(std::string v);
  PyValue* bytes(std::string v);
  PyValue* list(std::vector<const PyValue*> items = {});
  PyValue* tuple(std::vector<const PyValue*> items = {});
  PyValue* dict();
  /// An allowlisted class/function "module.name" called with `args` (REDUCE) or, with newobj,
  /// created by cls.__new__(cls, *args); `state` is applied with BUILD when non-null.
  PyValue* object(std::string cls, std::vector<const PyValue*> args, const PyValue* state = nullptr,
                  bool newobj = false);
  /// A bare reference to a global (e.g. a torch dtype `torch.float32`).
  PyValue* global(std::string name);
  PyValue* persid(const PyValue* id);
  size_t size() const { return values_.size(); }

 private:
  std::vector<std::unique_ptr<PyValue>> values_;
};

/// Options for unpickle().
struct UnpickleOptions {
  /// Name used in error messages ("refusing to load <what>: ...").
  std::string what = "pickle";
  /// Upper bound on values created (guards hostile input); 0: 64 + 16 per input byte.
  size_t max_values = 0;
};

/// Parses one pickle (protocol 0-5 data opcodes; up to and including STOP) from `data`.
/// Returns the top value, owned by `doc`. Throws PickleError naming `opts.what`, the byte offset
/// and the problem (truncated input, unknown opcode, refused global, stack underflow, ...).
const PyValue* unpickle(const uint8_t* data, size_t size, PickleDoc& doc, const UnpickleOptions& opts = {});

/// True if `module.name` may be loaded by unpickle() (see the allowlist in pickle.cpp).
bool pickle_global_allowed(const std::string& dotted_name);

/// Serializes `v` as a protocol-2 pickle (PROTO 2 ... STOP). Objects are written as
/// GLOBAL cls + args + REDUCE (or NEWOBJ), then BUILD with their state. Throws PickleError for
/// cycles or nesting deeper than 200.
std::string pickle_dumps(const PyValue* v);

}  // namespace megatron::dist_checkpointing::torch_dist
