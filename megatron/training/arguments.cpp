// Megatron's flags -> Arguments (CLI11 tokenizes; conversions and checks are ours so that every
// error names the flag). Facts: megatron/training/arguments.py, docs/megatron-reference.md#optimizer-defaults, #llama-3-8b-fp8-example.
#include "megatron/training/arguments.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <set>
#include <sstream>
#include <string_view>
#include <unordered_map>

#include "megatron/core/fp8/fp8_config.h"
#include "megatron/core/transformer/moe/moe_config.h"
#include "megatron/core/utils/errors.h"
#include "megatron/training/arg_utils.h"

namespace megatron::training {
namespace {

struct MegatronFlag {
  const char* name;
  int arity;            // 0 flag, n values, -1 one or more
  const char* dest;     // argparse dest
  const char* default_str;  // str() of the default
  char kind;            // T store_true, F store_false, B BooleanOptional, i int, f float, e enum, s other
};
// Every flag of Megatron-LM's pretrain_gpt parser (generated; see the .inc header).
const MegatronFlag kMegatronFlags[] = {
#include "megatron/training/megatron_flag_names.inc"
};

const std::unordered_map<std::string_view, const MegatronFlag*>& megatron_flag_map() {
  static const auto* m = [] {
    auto* mp = new std::unordered_map<std::string_view, const MegatronFlag*>();
    for (const auto& f : kMegatronFlags) (*mp)[f.name] = &f;
    return mp;
  }();
  return *m;
}

const MegatronFlag* megatron_flag(const std::string& flag) {
  auto it = megatron_flag_map().find(flag);
  return it == megatron_flag_map().end() ? nullptr : it->second;
}

/// The argparse dest `flag` is printed under: Megatron's, or (flags Megatron lacks) the name with
/// dashes as underscores and a leading "no_" dropped (the store_false convention).
std::string dest_of(const std::string& flag) {
  if (const MegatronFlag* f = megatron_flag(flag)) return f->dest;
  std::string d = flag.substr(2);
  std::replace(d.begin(), d.end(), '-', '_');
  if (d.rfind("no_", 0) == 0) d = d.substr(3);
  return d;
}

/// Python's str() of a value stored in an Arguments field.
std::string py_str(bool v) { return v ? "True" : "False"; }
std::string py_str(int64_t v) { return std::to_string(v); }
std::string py_str(double v) { return py_float_repr(v); }
std::string py_str(const std::string& v) { return v; }
template <class T>
std::string py_str(const std::optional<T>& v) {
  return v ? py_str(*v) : std::string("None");
}
/// str(list): the elements' repr, ", "-joined in brackets.
std::string py_list(const std::vector<std::string>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + py_str_repr(v[i]);
  return out + "]";
}
std::string py_list(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

template <class T>
T parse_number(const std::string& flag, const std::string& s) {
  T v{};
  const char* b = s.data();
  const char* e = s.data() + s.size();
  if constexpr (std::is_integral_v<T>) {
    auto r = std::from_chars(b, e, v);
    if (r.ec != std::errc() || r.ptr != e) {
      // Python's int() also accepts e.g. "1e3"? No: argparse type=int rejects it. Match that.
      user_error(flag, ": expected an integer, got '", s, "'");
    }
  } else {
    char* end = nullptr;
    errno = 0;
    double d = std::strtod(s.c_str(), &end);
    if (s.empty() || end != s.c_str() + s.size() || errno == ERANGE) {
      user_error(flag, ": expected a number, got '", s, "'");
    }
    v = static_cast<T>(d);
  }
  return v;
}

/// An integer flag's value, refused below `min` ("argument --flag: invalid value -1 (must be >= 0)").
int64_t checked_int(const std::string& flag, const std::string& s, int64_t min) {
  const int64_t v = parse_number<int64_t>(flag, s);
  if (v < min) user_error("argument ", flag, ": invalid value ", s, " (must be >= ", min, ")");
  return v;
}

/// The valid interval of a float flag: lo/hi bounds, each closed or open, or absent (unbounded).
/// describe() writes it as the error text does: ">= 0", "> 0", "in [0, 1)", "in (0, 1]".
struct FloatRange {
  std::optional<double> lo, hi;
  bool lo_open = false, hi_open = false;
  bool contains(double v) const {
    if (lo && (lo_open ? !(v > *lo) : !(v >= *lo))) return false;
    if (hi && (hi_open ? !(v < *hi) : !(v <= *hi))) return false;
    return true;
  }
  std::string describe() const {
    auto num = [](double x) {  // bounds are small whole numbers: "0", "1"
      std::ostringstream o;
      o << x;
      return o.str();
    };
    if (lo && !hi) return std::string(lo_open ? "> " : ">= ") + num(*lo);
    if (hi && !lo) return std::string(hi_open ? "< " : "<= ") + num(*hi);
    return std::string("in ") + (lo_open ? "(" : "[") + num(*lo) + ", " + num(*hi) + (hi_open ? ")" : "]");
  }
};
FloatRange at_least(double lo) { return {lo, std::nullopt, false, false}; }  // [lo, inf)
FloatRange above(double lo) { return {lo, std::nullopt, true, false}; }      // (lo, inf)
/// [0, 1) (Adam's betas, a warmup fraction, a dropout probability) and (0, 1] (--rotary-percent).
const FloatRange kUnitHalfOpen{0.0, 1.0, false, true};
const FloatRange kUnitOpenClosed{0.0, 1.0, true, false};

/// A number flag's bound: a minimum for integers, a FloatRange for floats.
template <class T>
using Bound = std::conditional_t<std::is_floating_point_v<T>, FloatRange, std::optional<int64_t>>;

/// Registers our flags on a CLI11 app, each writing into Arguments, and records for each the
/// argparse dest and how to print its value (the arguments block is derived from this one list).
class Binder {
 public:
  /// One declared flag: its dest and str() of its current value (reads the bound Arguments), and
  /// its disposition (FlagDisposition): every registration path records one, so a flag cannot be
  /// added without saying what it does.
  struct Entry {
    std::string flag, dest;
    std::function<std::string()> value;
    std::string type;  // what --help shows for the value: INT, FLOAT, STR, {a,b}, "STR ...", "" (a switch)
    FlagDisposition disposition = FlagDisposition::kImplemented;
    std::vector<std::string> reads;    // kImplemented: the Arguments members the code reads
    std::string note;                  // kNoted: the note printed when the flag is given
    std::vector<std::string> aliases;  // Megatron's other spellings of the same option (same dest)
    std::optional<bool> stores;        // a switch: the value its dest holds when it is given
  };

  Binder(CLI::App& app, Arguments& a) : app_(app), a_(a) {}

  /// A number flag. Integer flags take `min` (a size, count, interval or divisor): a smaller value
  /// is refused when parsed, "argument --flag: invalid value 0 (must be >= 1)", before any code
  /// divides by it or sizes a buffer with it. Float flags take a FloatRange: a value outside it, and
  /// nan/inf always (Python's float() accepts them; Megatron would then train NaN), is refused when
  /// parsed, "argument --adam-beta1: invalid value 1.5 (must be in [0, 1))".
  template <class T>
  void num(const std::string& flag, T& field, const char* field_name, Bound<T> bound = {}) {
    std::function<std::string()> show = [&field] { return py_str(field); };
    if constexpr (std::is_floating_point_v<T>) {
      // argparse converts only string defaults with `type`: Megatron's float flags whose default
      // is a Python int (--initial-loss-scale 2**32, --loss-scale-window 1000) print as ints
      // ("4294967296") unless given on the command line ("1000.0").
      const MegatronFlag* m = megatron_flag(flag);
      std::string_view d = m ? m->default_str : "";
      if (!d.empty() && d.find_first_not_of("-0123456789") == std::string_view::npos) {
        const Arguments& args = a_;
        const double dv = std::strtod(std::string(d).c_str(), nullptr);
        show = [&field, &args, flag, d, dv] {
          const bool given = std::find(args.given_flags.begin(), args.given_flags.end(), flag) != args.given_flags.end();
          return !given && static_cast<double>(field) == dv ? std::string(d) : py_str(field);
        };
      }
    }
    add1(flag, [flag, &field, bound](const std::string& s) { field = checked_number<T>(flag, s, bound); }, std::move(show),
         {member(field_name)}, type_name<T>());
  }
  template <class T>
  void num(const std::string& flag, std::optional<T>& field, const char* field_name, Bound<T> bound = {}) {
    add1(flag, [flag, &field, bound](const std::string& s) { field = checked_number<T>(flag, s, bound); },
         [&field] { return py_str(field); }, {member(field_name)}, type_name<T>());
  }
  /// A string flag; an empty value prints as None where Megatron's default is None.
  void str(const std::string& flag, std::string& field, const char* field_name, std::vector<std::string> choices = {}) {
    const bool none_if_empty = default_is_none(flag);
    add1(flag, [flag, &field, choices](const std::string& s) {
      check_choice(flag, s, choices);
      field = s;
    }, [&field, none_if_empty] { return field.empty() && none_if_empty ? std::string("None") : field; },
         {member(field_name)}, choice_type(choices));
  }
  /// An optional string flag; '' (argparse accepts it) is stored as unset: Megatron tests these
  /// flags for truth (`if args.tensorboard_dir:`), so '' behaves as None (no TensorBoard, ...).
  void str(const std::string& flag, std::optional<std::string>& field, const char* field_name,
           std::vector<std::string> choices = {}) {
    add1(flag, [flag, &field, choices](const std::string& s) {
      if (s.empty()) {
        field.reset();
        return;
      }
      check_choice(flag, s, choices);
      field = s;
    }, [&field] { return py_str(field); }, {member(field_name)}, choice_type(choices));
  }
  /// A list flag (nargs '*'/'+'); an empty list prints as None where Megatron's default is None.
  void strs(const std::string& flag, std::vector<std::string>& field, const char* field_name) {
    const bool none_if_empty = default_is_none(flag);
    record(flag, [&field, none_if_empty] { return field.empty() && none_if_empty ? std::string("None") : py_list(field); },
           "STR ...", FlagDisposition::kImplemented, {member(field_name)});
    app_.add_option_function<std::vector<std::string>>(
            names(flag), [this, flag, &field](const std::vector<std::string>& v) {
              given(flag);
              field = v;
            })
        ->expected(0, CLI::detail::expected_max_vector_size)
        ->allow_extra_args();
  }
  void ints(const std::string& flag, std::vector<int64_t>& field, const char* field_name) {
    record(flag, [&field] { return py_list(field); }, "INT ...", FlagDisposition::kImplemented, {member(field_name)});
    app_.add_option_function<std::vector<std::string>>(
            names(flag), [this, flag, &field](const std::vector<std::string>& v) {
              given(flag);
              field.clear();
              for (const auto& s : v) field.push_back(parse_number<int64_t>(flag, s));
            })
        ->expected(1, CLI::detail::expected_max_vector_size)
        ->allow_extra_args();
  }
  /// A store_true / store_false style flag: sets `field` to `value`. Printed as Megatron's dest
  /// holds it: the value the flag stores when `field` == `value`, the other one otherwise (so
  /// --tokenizer-hf-no-include-special-tokens, stored inverted here, prints as Megatron's).
  void flag(const std::string& flag, bool& field, const char* field_name, bool value) {
    const MegatronFlag* m = megatron_flag(flag);
    const bool stores = m ? m->kind != 'F' : value;  // what Megatron's dest becomes when it is given
    record(flag, [&field, value, stores] { return py_str(field == value ? stores : !stores); }, "",
           FlagDisposition::kImplemented, {member(field_name)});
    entries_.back().stores = stores;
    app_.add_flag_callback(names(flag), [this, flag, &field, value] {
      given(flag);
      field = value;
    });
  }
  /// A flag accepted with a one-time note. arity from Megatron's table.
  void noted(const std::string& flag, std::string note) { noted_with(flag, std::move(note), nullptr); }
  /// Noted flag that also stores its value.
  void noted_str(const std::string& flag, std::string note, std::function<void(const std::string&)> store) {
    noted_with(flag, std::move(note), std::move(store));
  }

  /// A one-value flag handled by `fn` (which validates and stores it); `show` prints its value;
  /// `reads`: the Arguments members the code reads.
  void with(const std::string& flag, std::vector<std::string> reads, std::function<void(const std::string&)> fn,
            std::function<std::string()> show) {
    add1(flag, std::move(fn), std::move(show), std::move(reads));
  }

  /// The last flag registered is implemented through other members (validate_args derives them
  /// from it): `reads` replaces its own field as what the code must read.
  void via(std::vector<std::string> reads) { entries_.back().reads = std::move(reads); }
  /// The last flag registered implements Megatron's default only; validate_args refuses any other
  /// value naming the flag (`refused_value` is one, for flag_registry_test).
  void default_only(std::string refused_value) {
    entries_.back().disposition = FlagDisposition::kDefaultOnly;
    entries_.back().note = std::move(refused_value);
  }

  /// A list flag (nargs '+') handled by `fn` (which validates and stores the values); `show`
  /// prints its value (e.g. a one-element list as the scalar Megatron's validate_args makes of it).
  /// `reads`: the Arguments members the code reads.
  void list_with(const std::string& flag, std::vector<std::string> reads,
                 std::function<void(const std::vector<std::string>&)> fn, std::function<std::string()> show) {
    record(flag, std::move(show), "STR ...", FlagDisposition::kImplemented, std::move(reads));
    app_.add_option_function<std::vector<std::string>>(
            names(flag), [this, flag, fn](const std::vector<std::string>& v) {
              given(flag);
              fn(v);
            })
        ->expected(1, CLI::detail::expected_max_vector_size)
        ->allow_extra_args();
  }

  const std::vector<Entry>& entries() const { return entries_; }

 private:
  void given(const std::string& flag) { a_.given_flags.push_back(flag); }
  static bool default_is_none(const std::string& flag) {
    const MegatronFlag* m = megatron_flag(flag);
    return m && std::string_view(m->default_str) == "None";
  }
  void record(const std::string& flag, std::function<std::string()> show, std::string type, FlagDisposition d,
              std::vector<std::string> reads, std::string note = "") {
    entries_.push_back({flag, dest_of(flag), std::move(show), std::move(type), d, std::move(reads), std::move(note),
                        aliases_of(flag), std::nullopt});
  }
  /// "a.b.member" -> "member" (the ARG() spelling of the bound field).
  static std::string member(const char* expr) {
    const std::string e = expr;
    return e.substr(e.rfind('.') + 1);
  }
  /// Megatron's other option strings of `flag`'s argparse action: the flags with the same dest,
  /// the same kind and the same number of values (e.g. --save-interval / --persistent-save-interval,
  /// --no-fp8-wgrad / --disable-fp8-wgrad). BooleanOptionalAction pairs (--x / --no-x) share a
  /// dest but store opposite values: never aliases.
  static std::vector<std::string> aliases_of(const std::string& flag) {
    std::vector<std::string> out;
    const MegatronFlag* m = megatron_flag(flag);
    if (!m || m->kind == 'B') return out;
    for (const auto& f : kMegatronFlags)
      if (f.name != flag && std::string_view(f.dest) == m->dest && f.kind == m->kind && f.arity == m->arity)
        out.emplace_back(f.name);
    return out;
  }
  /// CLI11's name list for `flag` and its aliases ("--a,--b").
  static std::string names(const std::string& flag) {
    std::string n = flag;
    for (const auto& a : aliases_of(flag)) n += "," + a;
    return n;
  }
  template <class T>
  static std::string type_name() {
    return std::is_integral_v<T> ? "INT" : "FLOAT";
  }
  template <class T>
  static T checked_number(const std::string& flag, const std::string& s, const Bound<T>& bound) {
    const T v = parse_number<T>(flag, s);
    if constexpr (std::is_integral_v<T>) {
      if (bound && v < static_cast<T>(*bound)) user_error("argument ", flag, ": invalid value ", s, " (must be >= ", *bound, ")");
    } else {
      if (!std::isfinite(v)) user_error("argument ", flag, ": invalid value ", s, " (must be a finite number)");
      if (!bound.contains(v)) user_error("argument ", flag, ": invalid value ", s, " (must be ", bound.describe(), ")");
    }
    return v;
  }
  static std::string choice_type(const std::vector<std::string>& choices) {
    if (choices.empty()) return "STR";
    std::string t = "{";
    for (const auto& c : choices) t += (t.size() > 1 ? "," : "") + c;
    return t + "}";
  }
  static void check_choice(const std::string& flag, const std::string& s, const std::vector<std::string>& choices) {
    if (choices.empty() || std::find(choices.begin(), choices.end(), s) != choices.end()) return;
    std::string list;
    for (const auto& c : choices) list += (list.empty() ? "" : ", ") + c;
    user_error(flag, ": invalid choice '", s, "' (choose from ", list, ")");
  }
  void add1(const std::string& flag, std::function<void(const std::string&)> fn, std::function<std::string()> show,
            std::vector<std::string> reads, std::string type = "STR") {
    record(flag, std::move(show), std::move(type), FlagDisposition::kImplemented, std::move(reads));
    app_.add_option_function<std::string>(names(flag), [this, flag, fn](const std::string& s) {
          given(flag);
          fn(s);
        })
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // argparse: the last one wins
  }
  /// str() of a noted flag's value as Megatron's parser would hold it: its default when not
  /// given, else what the action stores (True/False for switches, the typed value otherwise).
  static std::string noted_value(const MegatronFlag& m, const Arguments& a) {
    auto it = a.noted_values.find(m.name);
    if (it == a.noted_values.end()) return m.default_str;
    if (m.kind == 'T' || m.kind == 'F') return py_str(m.kind == 'T');
    auto one = [&m](const std::string& v, bool in_list) -> std::string {
      switch (m.kind) {
        case 'i': return std::to_string(parse_number<int64_t>(m.name, v));
        case 'f': return py_float_repr(parse_number<double>(m.name, v));
        case 'e': {  // str(Enum member): "<Class>.<name>", the class from the default's text
          std::string_view d = m.default_str;
          size_t dot = d.rfind('.');
          return std::string(dot == std::string_view::npos ? std::string_view() : d.substr(0, dot + 1)) + v;
        }
        default: return in_list ? py_str_repr(v) : v;
      }
    };
    if (m.arity == 1) return it->second.empty() ? std::string("None") : one(it->second.back(), false);
    std::string out = "[";
    for (size_t i = 0; i < it->second.size(); ++i) out += (i ? ", " : "") + one(it->second[i], true);
    return out + "]";
  }
  void noted_with(const std::string& flag, std::string note, std::function<void(const std::string&)> store) {
    const MegatronFlag* m = megatron_flag(flag);
    MEGATRON_CHECK(m != nullptr) << flag << " is not a Megatron flag";
    const int arity = m->arity;
    Arguments& args = a_;
    const std::string one = m->kind == 'i' ? "INT" : m->kind == 'f' ? "FLOAT" : "STR";
    record(flag, [m, &args] { return noted_value(*m, args); },
           arity == 0 ? std::string() : arity == 1 ? one : one + " ...", FlagDisposition::kNoted, {}, note);
    if (arity == 0) entries_.back().stores = m->kind != 'F';
    auto note_given = [this, flag, note](std::vector<std::string> values) {
      given(flag);
      a_.notes.emplace_back(flag, note);
      a_.noted_values[flag] = std::move(values);
    };
    if (arity == 0) {
      app_.add_flag_callback(names(flag), [note_given, store] {
        note_given({});
        if (store) store("");
      });
    } else if (arity == 1) {
      const char kind = m->kind;
      app_.add_option_function<std::string>(names(flag), [flag, kind, note_given, store](const std::string& s) {
            // Typed as Megatron types them, so a bad value stops here, not when the block prints.
            if (kind == 'i') parse_number<int64_t>(flag, s);
            if (kind == 'f') checked_number<double>(flag, s, FloatRange{});
            note_given({s});
            if (store) store(s);
          })
          ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    } else {
      app_.add_option_function<std::vector<std::string>>(
              names(flag), [note_given](const std::vector<std::string>& v) { note_given(v); })
          ->expected(arity < 0 ? 1 : arity, arity < 0 ? CLI::detail::expected_max_vector_size : arity)
          ->allow_extra_args();
    }
  }

  CLI::App& app_;
  Arguments& a_;
  std::vector<Entry> entries_;
};

// The bound field and its spelling (the disposition's `reads`: tests/unit_tests/training/
// flag_registry_test.cpp checks that code outside the parser reads it).
#define ARG(field) field, #field

// ---- Mixture of Experts (Megatron's MoE flags: megatron/training/arguments.py _add_moe_args and
// the TransformerConfig MoE fields; docs/moe.md). Megatron's other --moe-* flags are not registered,
// so parse_args refuses them naming the flag.
void bind_moe(Binder& b, Arguments& a) {
  b.num("--num-experts", ARG(a.num_experts), 0);
  b.num("--moe-ffn-hidden-size", ARG(a.moe_ffn_hidden_size), 1);
  // validate_args derives moe_layer_pattern from it
  b.with("--moe-layer-freq", {"moe_layer_pattern"}, [&a](const std::string& s) {
    bool is_int = false;
    transformer::moe::eval_moe_layer_freq(s, &is_int);  // syntax checked here, length in validate_args
    a.moe_layer_freq = s;
  }, [&a] {
    bool is_int = false;
    const std::vector<int64_t> v = transformer::moe::eval_moe_layer_freq(a.moe_layer_freq, &is_int);
    return is_int ? std::to_string(v[0]) : py_list(v);
  });
  b.num("--moe-shared-expert-intermediate-size", ARG(a.moe_shared_expert_intermediate_size), 1);
  // Megatron's TransformerConfig.moe_shared_expert_gate (a store_true flag generated from the
  // dataclass): "only effective when moe-shared-expert-intermediate-size is set", no check.
  b.flag("--moe-shared-expert-gate", ARG(a.moe_shared_expert_gate), true);
  b.noted_str("--moe-shared-expert-overlap",
              "overlaps the shared expert with the token dispatch in Megatron; megatron.cpp runs it after "
              "the routed experts (same math, no overlap)",
              [&a](const std::string&) { a.moe_shared_expert_overlap = true; });
  auto py_list_str = [](const std::vector<std::string>& v) { return v.size() == 1 ? v[0] : py_list(v); };
  b.list_with("--moe-router-load-balancing-type", {"moe_router_load_balancing_type"}, [&a](const std::vector<std::string>& v) {
    for (const auto& t : v)
      if (t != "aux_loss" && t != "seq_aux_loss" && t != "global_aux_loss" && t != "none") {
        if (t == "sinkhorn" || t == "quantile_balancing")
          user_error("--moe-router-load-balancing-type ", t, " is not implemented in megatron.cpp yet "
                     "(use aux_loss, seq_aux_loss, global_aux_loss or none)");
        user_error("--moe-router-load-balancing-type: invalid choice '", t,
                   "' (choose from aux_loss, seq_aux_loss, global_aux_loss, sinkhorn, quantile_balancing, none)");
      }
    a.moe_router_load_balancing_type = v;
  }, [&a, py_list_str] { return py_list_str(a.moe_router_load_balancing_type); });
  b.list_with("--moe-aux-loss-coeff", {"moe_aux_loss_coeff"}, [&a](const std::vector<std::string>& v) {
    a.moe_aux_loss_coeff.clear();
    for (const auto& s : v) {
      const double c = parse_number<double>("--moe-aux-loss-coeff", s);
      if (!std::isfinite(c) || c < 0) user_error("argument --moe-aux-loss-coeff: invalid value ", s, " (must be >= 0)");
      a.moe_aux_loss_coeff.push_back(c);
    }
  }, [&a] {
    if (a.moe_aux_loss_coeff.size() == 1) return py_str(a.moe_aux_loss_coeff[0]);
    std::string out = "[";
    for (size_t i = 0; i < a.moe_aux_loss_coeff.size(); ++i) out += (i ? ", " : "") + py_str(a.moe_aux_loss_coeff[i]);
    return out + "]";
  });
  b.num("--moe-z-loss-coeff", ARG(a.moe_z_loss_coeff), at_least(0));
  b.str("--moe-router-score-function", ARG(a.moe_router_score_function), {"softmax", "sigmoid", "sqrtsoftplus"});
  b.flag("--moe-router-pre-softmax", ARG(a.moe_router_pre_softmax), true);
  b.num("--moe-router-topk", ARG(a.moe_router_topk), 1);
  b.num("--moe-router-topk-scaling-factor", ARG(a.moe_router_topk_scaling_factor), above(0));
  b.flag("--moe-router-enable-expert-bias", ARG(a.moe_router_enable_expert_bias), true);
  b.flag("--moe-per-layer-logging", ARG(a.moe_per_layer_logging), true);
  b.num("--moe-router-bias-update-rate", ARG(a.moe_router_bias_update_rate), at_least(0));
  b.num("--moe-router-num-groups", ARG(a.moe_router_num_groups), 1);
  b.num("--moe-router-group-topk", ARG(a.moe_router_group_topk), 1);
  b.str("--moe-router-dtype", ARG(a.moe_router_dtype), {"fp32", "fp64"});
  b.with("--moe-token-dispatcher-type", {"moe_token_dispatcher_type"}, [&a](const std::string& s) {
    if (s == "flex")
      user_error("--moe-token-dispatcher-type flex (DeepEP / HybridEP) is not implemented in megatron.cpp; use "
                 "alltoall or allgather");
    if (s != "allgather" && s != "alltoall")
      user_error("--moe-token-dispatcher-type: invalid choice '", s, "' (choose from allgather, alltoall, flex)");
    a.moe_token_dispatcher_type = s;
  }, [&a] { return a.moe_token_dispatcher_type; });
  b.num("--moe-expert-capacity-factor", ARG(a.moe_expert_capacity_factor));
  b.flag("--moe-pad-expert-input-to-capacity", ARG(a.moe_pad_expert_input_to_capacity), true);
  b.str("--moe-token-drop-policy", ARG(a.moe_token_drop_policy), {"probs", "position"});
  b.flag("--moe-grouped-gemm", ARG(a.moe_grouped_gemm), true);
  b.noted_str("--moe-permute-fusion",
              "selects Transformer Engine's fused permute kernels in Megatron; megatron.cpp's permutation is "
              "always one gather / scatter-add pass (same math)",
              [&a](const std::string&) { a.moe_permute_fusion = true; });
  b.noted_str("--moe-router-fusion",
              "selects Transformer Engine's fused router kernels in Megatron; megatron.cpp's router is one "
              "implementation (same math)",
              [&a](const std::string&) { a.moe_router_fusion = true; });
  b.num("--moe-input-jitter-eps", ARG(a.moe_input_jitter_eps), kUnitHalfOpen);
  b.num("--expert-tensor-parallel-size", ARG(a.expert_tensor_parallel_size), 1);
}

void bind_all(Binder& b, Arguments& a) {
  // ---- network size ----
  b.num("--num-layers", ARG(a.num_layers), 1);
  b.num("--hidden-size", ARG(a.hidden_size), 1);
  b.num("--ffn-hidden-size", ARG(a.ffn_hidden_size), 1);
  b.num("--num-attention-heads", ARG(a.num_attention_heads), 1);
  b.num("--kv-channels", ARG(a.kv_channels), 1);
  b.flag("--group-query-attention", ARG(a.group_query_attention), true);
  b.num("--num-query-groups", ARG(a.num_query_groups), 1);
  b.num("--max-position-embeddings", ARG(a.max_position_embeddings), 1);
  b.str("--position-embedding-type", ARG(a.position_embedding_type), {"learned_absolute", "rope", "none"});
  b.num("--rotary-base", ARG(a.rotary_base), 1);
  b.num("--rotary-percent", ARG(a.rotary_percent), kUnitOpenClosed);
  b.flag("--rotary-interleaved", ARG(a.rotary_interleaved), true);
  b.num("--rotary-seq-len-interpolation-factor", ARG(a.rotary_seq_len_interpolation_factor), 1);
  b.flag("--use-rope-scaling", ARG(a.use_rope_scaling), true);
  b.num("--rope-scaling-factor", ARG(a.rope_scaling_factor), above(0));
  b.num("--make-vocab-size-divisible-by", ARG(a.make_vocab_size_divisible_by), 1);
  b.str("--normalization", ARG(a.normalization), {"LayerNorm", "RMSNorm"});
  b.num("--norm-epsilon", ARG(a.layernorm_epsilon), above(0));
  b.flag("--apply-layernorm-1p", ARG(a.layernorm_zero_centered_gamma), true);
  b.noted_str("--apply-residual-connection-post-layernorm",
              "Megatron-Core's GPT layers do not read it either (a TransformerConfig field only): pre-norm "
              "residuals as always, no effect",
              [&a](const std::string&) { a.apply_residual_connection_post_layernorm = true; });
  b.noted_str("--openai-gelu",
              "Megatron-Core's MLP does not read it either (GeLU is erf, or the tanh form when fused with the "
              "bias): no effect",
              [&a](const std::string&) { a.openai_gelu = true; });
  b.flag("--squared-relu", ARG(a.squared_relu), true);
  b.num("--mtp-num-layers", ARG(a.mtp_num_layers), 0);
  b.num("--mtp-loss-scaling-factor", ARG(a.mtp_loss_scaling_factor), at_least(0));
  b.flag("--swiglu", ARG(a.swiglu), true);
  b.flag("--untie-embeddings-and-output-weights", ARG(a.untie_embeddings_and_output_weights), true);
  b.flag("--disable-bias-linear", ARG(a.add_bias_linear), false);
  b.flag("--add-qkv-bias", ARG(a.add_qkv_bias), true);
  b.flag("--qk-layernorm", ARG(a.qk_layernorm), true);
  b.num("--init-method-std", ARG(a.init_method_std), above(0));
  b.num("--hidden-dropout", ARG(a.hidden_dropout), kUnitHalfOpen);
  b.num("--attention-dropout", ARG(a.attention_dropout), kUnitHalfOpen);
  b.noted_str("--attention-softmax-in-fp32", "the attention softmax is always computed in fp32 here",
              [&a](const std::string&) { a.attention_softmax_in_fp32 = true; });
  b.noted_str("--apply-query-key-layer-scaling",
              "guards fp16 overflow in Megatron's unfused softmax; attention scores are fp32 here: no effect",
              [&a](const std::string&) { a.apply_query_key_layer_scaling = true; });
  b.noted_str("--fp32-residual-connection",
              "the residual stream stays in the training dtype (bf16/fp16) here, not fp32: losses differ from "
              "Megatron's at the bf16/fp16 rounding level",
              [&a](const std::string&) { a.fp32_residual_connection = true; });
  b.noted_str("--attention-backend",
              "attention uses megatron.cpp's own kernels (CPU reference, CUDA flash-style); the backend choice "
              "has no effect",
              [&a](const std::string& s) {
                static const std::vector<std::string> ok = {"flash", "fused", "unfused", "local", "auto"};
                if (std::find(ok.begin(), ok.end(), s) == ok.end())
                  user_error("--attention-backend: invalid choice '", s,
                             "' (choose from flash, fused, unfused, local, auto)");
                a.attention_backend = s;
              });
  b.noted_str("--transformer-impl",
              "megatron.cpp has one native transformer implementation (same math as Transformer Engine's); "
              "the choice has no effect",
              [&a](const std::string& s) {
                if (s != "local" && s != "transformer_engine" && s != "inference_optimized")
                  user_error("--transformer-impl: invalid choice '", s,
                             "' (choose from local, transformer_engine, inference_optimized)");
                a.transformer_impl = s;
              });
  b.noted("--use-mcore-models", "deprecated no-op in Megatron; megatron.cpp only has the Megatron-Core model");

  // ---- training ----
  b.num("--micro-batch-size", ARG(a.micro_batch_size), 1);
  b.num("--global-batch-size", ARG(a.global_batch_size), 1);
  b.num("--train-iters", ARG(a.train_iters), 1);
  b.num("--train-samples", ARG(a.train_samples), 1);
  b.num("--exit-interval", ARG(a.exit_interval), 1);
  b.num("--exit-duration-in-mins", ARG(a.exit_duration_in_mins), 0);
  b.flag("--exit-signal-handler", ARG(a.exit_signal_handler), true);
  b.num("--seed", ARG(a.seed), 0);
  b.flag("--calculate-per-token-loss", ARG(a.calculate_per_token_loss), true);
  b.noted_str("--empty-unused-memory-level",
              "empties PyTorch's caching allocator in Megatron; megatron.cpp's memory pool is managed by the "
              "runtime, so this has no effect",
              [&a](const std::string& s) {
                a.empty_unused_memory_level = parse_number<int64_t>("--empty-unused-memory-level", s);
                if (a.empty_unused_memory_level < 0 || a.empty_unused_memory_level > 2)
                  user_error("--empty-unused-memory-level: invalid choice '", s, "' (choose from 0, 1, 2)");
              });
  b.flag("--skip-train", ARG(a.skip_train), true);
  // Activation recomputation (Megatron's _add_training_args; validate_args checks the combination).
  // Selective recomputation re-runs core attention in Megatron; our attention kernels never keep
  // the score matrix (only the log-sum-exp), so "selective" is what they always do.
  static const char* kSelectiveNote =
      "selective recomputation re-runs core attention in Megatron; megatron.cpp's attention never stores the "
      "score matrix (only the log-sum-exp), so this is what it always does (no change)";
  b.with("--recompute-granularity", {"recompute_granularity"}, [&a](const std::string& s) {
    if (s != "full" && s != "selective")
      user_error("--recompute-granularity: invalid choice '", s, "' (choose from full, selective)");
    a.recompute_granularity = s;
    if (s == "selective") a.notes.emplace_back("--recompute-granularity", kSelectiveNote);
  }, [&a] { return py_str(a.recompute_granularity); });
  b.str("--recompute-method", ARG(a.recompute_method), {"uniform", "block"});
  b.num("--recompute-num-layers", ARG(a.recompute_num_layers), 1);
  b.noted_str("--recompute-activations", kSelectiveNote, [&a](const std::string&) { a.recompute_activations = true; });
  b.strs("--recompute-modules", ARG(a.recompute_modules));
  b.flag("--moe-layer-recompute", ARG(a.moe_layer_recompute), true);
  b.flag("--no-check-for-nan-in-loss-and-grad", ARG(a.check_for_nan_in_loss_and_grad), false);
  b.flag("--check-for-nan-in-loss-and-grad", ARG(a.check_for_nan_in_loss_and_grad), true);
  // On CUDA: reductions in a fixed order (initialize_megatron calls ops::set_deterministic_mode,
  // megatron/core/ops/deterministic.h); the CPU kernels are deterministic anyway.
  b.flag("--deterministic-mode", ARG(a.deterministic_mode), true);
  b.noted("--manual-gc", "controls Python's garbage collector in Megatron; there is none here (no effect)");
  b.noted_str("--manual-gc-interval", "controls Python's garbage collector in Megatron; there is none here",
              [](const std::string& s) { checked_int("--manual-gc-interval", s, 0); });
  b.noted("--no-manual-gc-eval", "controls Python's garbage collector in Megatron; there is none here");
  b.noted("--cross-entropy-loss-fusion",
          "megatron.cpp's cross entropy is always one fused pass (same math); no effect");
  b.noted("--cross-entropy-fusion-impl", "megatron.cpp's cross entropy is always one fused pass; no effect");
  b.flag("--no-bias-gelu-fusion", ARG(a.bias_gelu_fusion), false);
  b.flag("--no-bias-swiglu-fusion", ARG(a.bias_swiglu_fusion), false);
  for (const char* f : {"--no-masked-softmax-fusion", "--no-bias-dropout-fusion", "--no-rope-fusion", "--no-gradient-accumulation-fusion",
                        "--no-persist-layer-norm"}) {
    b.noted(f, "selects a PyTorch/Apex fused kernel in Megatron; megatron.cpp's kernels are fixed (same math)");
  }
  b.noted("--use-cpu-initialization",
          "weights are drawn on the host and copied (bit-identical to a CPU run) instead of on the GPU; "
          "megatron.cpp's draw is the same function of (seed, name, index) on both");

  // ---- optimizer / learning rate ----
  b.str("--optimizer", ARG(a.optimizer), {"adam", "sgd"});
  b.num("--lr", ARG(a.lr), at_least(0));
  b.num("--min-lr", ARG(a.min_lr), at_least(0));
  b.str("--lr-decay-style", ARG(a.lr_decay_style), {"constant", "linear", "cosine", "inverse-square-root", "WSD"});
  b.str("--lr-wsd-decay-style", ARG(a.lr_wsd_decay_style), {"exponential", "linear", "cosine", "minus_sqrt"});
  b.num("--lr-decay-iters", ARG(a.lr_decay_iters), 1);
  b.num("--lr-decay-samples", ARG(a.lr_decay_samples), 1);
  b.num("--lr-wsd-decay-iters", ARG(a.lr_wsd_decay_iters), 1);
  b.num("--lr-wsd-decay-samples", ARG(a.lr_wsd_decay_samples), 1);
  b.num("--lr-warmup-fraction", ARG(a.lr_warmup_fraction), kUnitHalfOpen);
  b.num("--lr-warmup-iters", ARG(a.lr_warmup_iters), 0);
  b.num("--lr-warmup-samples", ARG(a.lr_warmup_samples), 0);
  b.num("--lr-warmup-init", ARG(a.lr_warmup_init), at_least(0));
  b.num("--decoupled-lr", ARG(a.decoupled_lr), at_least(0));
  b.num("--decoupled-min-lr", ARG(a.decoupled_min_lr), at_least(0));
  b.flag("--override-opt_param-scheduler", ARG(a.override_opt_param_scheduler), true);
  b.flag("--use-checkpoint-opt_param-scheduler", ARG(a.use_checkpoint_opt_param_scheduler), true);
  b.num("--weight-decay", ARG(a.weight_decay), at_least(0));
  b.num("--start-weight-decay", ARG(a.start_weight_decay), at_least(0));
  b.num("--end-weight-decay", ARG(a.end_weight_decay), at_least(0));
  b.str("--weight-decay-incr-style", ARG(a.weight_decay_incr_style), {"constant", "linear", "cosine"});
  b.num("--clip-grad", ARG(a.clip_grad), at_least(0));
  b.num("--adam-beta1", ARG(a.adam_beta1), kUnitHalfOpen);
  b.num("--adam-beta2", ARG(a.adam_beta2), kUnitHalfOpen);
  b.num("--adam-eps", ARG(a.adam_eps), above(0));
  b.num("--sgd-momentum", ARG(a.sgd_momentum), at_least(0));
  b.flag("--no-decoupled-weight-decay", ARG(a.decoupled_weight_decay), false);
  b.flag("--decoupled-weight-decay", ARG(a.decoupled_weight_decay), true);

  // ---- mixed precision ----
  b.flag("--fp16", ARG(a.fp16), true);
  b.flag("--bf16", ARG(a.bf16), true);
  b.num("--loss-scale", ARG(a.loss_scale), above(0));
  b.num("--initial-loss-scale", ARG(a.initial_loss_scale), above(0));
  b.num("--min-loss-scale", ARG(a.min_loss_scale), above(0));
  b.num("--loss-scale-window", ARG(a.loss_scale_window), at_least(1));
  b.num("--hysteresis", ARG(a.hysteresis), 1);
  b.flag("--grad-reduce-in-bf16", ARG(a.grad_reduce_in_bf16), true);
  b.via({"accumulate_allreduce_grads_in_fp32"});  // validate_args: the bf16 grad buffer
  b.flag("--accumulate-allreduce-grads-in-fp32", ARG(a.accumulate_allreduce_grads_in_fp32), true);
  b.noted_str("--fp16-lm-cross-entropy",
              "Megatron-Core's GPTModel stores it but does not read it either: the cross entropy runs on the "
              "logits in fp32 (validate_args still requires --fp16 with it); no effect",
              [&a](const std::string&) { a.fp16_lm_cross_entropy = true; });

  // ---- FP8 (docs/megatron-reference.md#fp8-delayed-scaling; megatron/core/fp8) ----
  b.str("--fp8-format", ARG(a.fp8), {"e4m3", "hybrid"});
  b.str("--fp8-recipe", ARG(a.fp8_recipe), {"tensorwise", "delayed", "mxfp8", "blockwise", "custom"});
  b.num("--fp8-margin", ARG(a.fp8_margin), 0);
  b.noted_str("--fp8-interval", "deprecated in Megatron-LM and ignored (the scales update every step)",
              [&a](const std::string& s) { a.fp8_interval = checked_int("--fp8-interval", s, 1); });
  b.num("--fp8-amax-history-len", ARG(a.fp8_amax_history_len), 1);
  b.str("--fp8-amax-compute-algo", ARG(a.fp8_amax_compute_algo), {"most_recent", "max"});
  b.flag("--fp8-param-gather", ARG(a.fp8_param_gather), true);
  b.flag("--no-fp8-wgrad", ARG(a.fp8_wgrad), false);
  b.flag("--fp8-output-proj", ARG(a.fp8_output_proj), true);

  // ---- parallelism ----
  b.num("--tensor-model-parallel-size", ARG(a.tensor_model_parallel_size), 1);
  b.num("--pipeline-model-parallel-size", ARG(a.pipeline_model_parallel_size), 1);
  b.num("--context-parallel-size", ARG(a.context_parallel_size), 1);
  b.strs("--cp-comm-type", ARG(a.cp_comm_type));
  b.num("--expert-model-parallel-size", ARG(a.expert_model_parallel_size), 1);
  bind_moe(b, a);
  b.num("--num-layers-per-virtual-pipeline-stage", ARG(a.num_layers_per_virtual_pipeline_stage), 1);
  b.via({"virtual_pipeline_model_parallel_size"});  // validate_args derives it
  b.num("--decoder-first-pipeline-num-layers", ARG(a.decoder_first_pipeline_num_layers), 0);
  b.num("--decoder-last-pipeline-num-layers", ARG(a.decoder_last_pipeline_num_layers), 0);
  b.num("--num-virtual-stages-per-pipeline-rank", ARG(a.num_virtual_stages_per_pipeline_rank), 1);
  b.via({"virtual_pipeline_model_parallel_size"});  // validate_args derives it
  b.num("--microbatch-group-size-per-virtual-pipeline-stage", ARG(a.microbatch_group_size_per_vp_stage), 1);
  b.noted("--no-overlap-p2p-communication",
          "the pipeline's send/receive of each schedule step is always one batch posted together here "
          "(Megatron's behaviour under this flag); PP = 2 with virtual stages is allowed (docs/distributed.md)");
  b.noted("--overlap-p2p-communication-warmup-flush",
          "the pipeline's send/receive is not overlapped with compute here (one batch per step); no effect");
  b.noted("--no-align-param-gather",
          "every chunk's parameter all-gather is launched right after the optimizer step on every pipeline "
          "stage here; no effect");
  b.flag("--sequence-parallel", ARG(a.sequence_parallel), true);
  b.flag("--use-distributed-optimizer", ARG(a.use_distributed_optimizer), true);
  b.flag("--overlap-grad-reduce", ARG(a.overlap_grad_reduce), true);
  b.flag("--overlap-param-gather", ARG(a.overlap_param_gather), true);
  b.num("--ddp-bucket-size", ARG(a.ddp_bucket_size), 1);
  b.str("--distributed-backend", ARG(a.distributed_backend), {"nccl", "gloo"});
  b.num("--distributed-timeout-minutes", ARG(a.distributed_timeout_minutes), 1);

  // ---- data and tokenizer ----
  b.strs("--data-path", ARG(a.data_path));
  b.str("--split", ARG(a.split));
  b.strs("--train-data-path", ARG(a.train_data_path));
  b.strs("--valid-data-path", ARG(a.valid_data_path));
  b.strs("--test-data-path", ARG(a.test_data_path));
  b.str("--data-cache-path", ARG(a.data_cache_path));
  b.flag("--mock-data", ARG(a.mock_data), true);
  b.flag("--no-mmap-bin-files", ARG(a.mmap_bin_files), false);
  b.noted_str("--num-workers",
              "Megatron's DataLoader worker processes; megatron.cpp prefetches with one background thread",
              [&a](const std::string& s) { a.num_workers = checked_int("--num-workers", s, 0); });
  b.flag("--reset-position-ids", ARG(a.reset_position_ids), true);
  b.flag("--reset-attention-mask", ARG(a.reset_attention_mask), true);
  b.flag("--eod-mask-loss", ARG(a.eod_mask_loss), true);
  b.flag("--no-create-attention-mask-in-dataloader", ARG(a.create_attention_mask_in_dataloader), false);
  b.noted_str("--num-dataset-builder-threads",
              "Megatron builds the per-prefix dataset indices with this many threads; megatron.cpp builds them "
              "one after the other (the same datasets and index files)",
              [&a](const std::string& s) { a.num_dataset_builder_threads = checked_int("--num-dataset-builder-threads", s, 1); });
  b.num("--mid-level-dataset-surplus", ARG(a.mid_level_dataset_surplus), at_least(0));
  b.str("--dataloader-type", ARG(a.dataloader_type), {"single", "cyclic", "external"});
  b.default_only("cyclic");  // validate_args refuses all but single (Megatron's sequential sampler)
  b.num("--seq-length", ARG(a.seq_length), 1);
  auto& t = a.tokenizer;
  b.str("--tokenizer-type", ARG(t.tokenizer_type),
        {"BertWordPieceLowerCase", "BertWordPieceCase", "GPT2BPETokenizer", "SentencePieceTokenizer",
         "GPTSentencePieceTokenizer", "HuggingFaceTokenizer", "Llama2Tokenizer", "TikTokenizer",
         "MultimodalTokenizer", "NullTokenizer", "NullMultimodalTokenizer", "SFTTokenizer"});
  b.str("--tokenizer-model", ARG(t.tokenizer_model));
  b.str("--vocab-file", ARG(t.vocab_file));
  b.str("--merge-file", ARG(t.merge_file));
  b.num("--vocab-size", ARG(t.vocab_size), 1);
  b.noted_str("--vocab-extra-ids",
              "Megatron-LM's current tokenizers do not read it either (it only declares it): no extra tokens "
              "are added",
              [&t](const std::string& s) { t.vocab_extra_ids = checked_int("--vocab-extra-ids", s, 0); });
  b.str("--tiktoken-pattern", ARG(t.tiktoken_pattern), {"v1", "v2"});
  b.num("--tiktoken-num-special-tokens", ARG(t.tiktoken_num_special_tokens), 0);
  b.strs("--tokenizer-special-tokens", ARG(t.tokenizer_special_tokens));
  b.flag("--tokenizer-hf-no-include-special-tokens", ARG(t.tokenizer_hf_include_special_tokens), false);
  b.flag("--tokenizer-sentencepiece-legacy", ARG(t.tokenizer_sentencepiece_legacy), true);
  b.num("--null-tokenizer-eod-id", ARG(t.null_tokenizer_eod_id));
  b.num("--null-tokenizer-pad-id", ARG(t.null_tokenizer_pad_id));

  // ---- evaluation ----
  b.num("--eval-iters", ARG(a.eval_iters), 0);
  b.num("--eval-interval", ARG(a.eval_interval), 1);

  // ---- logging ----
  b.num("--log-interval", ARG(a.log_interval), 1);
  b.flag("--log-params-norm", ARG(a.log_params_norm), true);
  b.flag("--log-num-zeros-in-grad", ARG(a.log_num_zeros_in_grad), true);
  b.flag("--log-throughput", ARG(a.log_throughput), true);
  b.flag("--log-progress", ARG(a.log_progress), true);
  b.noted("--log-energy", "no energy counters are read here; the energy/power fields are not printed");
  b.with("--timing-log-level", {"timing_log_level"}, [&a](const std::string& s) {
    a.timing_log_level = parse_number<int64_t>("--timing-log-level", s);
    if (a.timing_log_level < 0 || a.timing_log_level > 2)
      user_error("--timing-log-level: invalid choice '", s, "' (choose from 0, 1, 2)");
  }, [&a] { return py_str(a.timing_log_level); });
  b.str("--timing-log-option", ARG(a.timing_log_option), {"max", "minmax", "all"});
  b.flag("--no-barrier-with-level-1-timing", ARG(a.barrier_with_L1_time), false);
  b.str("--tensorboard-dir", ARG(a.tensorboard_dir));
  b.num("--tensorboard-log-interval", ARG(a.tensorboard_log_interval), 1);
  b.num("--tensorboard-queue-size", ARG(a.tensorboard_queue_size), 1);
  b.flag("--log-timers-to-tensorboard", ARG(a.log_timers_to_tensorboard), true);
  b.flag("--no-log-loss-scale-to-tensorboard", ARG(a.log_loss_scale_to_tensorboard), false);
  b.flag("--no-log-learning-rate-to-tensorboard", ARG(a.log_learning_rate_to_tensorboard), false);
  b.flag("--log-validation-ppl-to-tensorboard", ARG(a.log_validation_ppl_to_tensorboard), true);
  b.flag("--log-memory-to-tensorboard", ARG(a.log_memory_to_tensorboard), true);
  b.flag("--log-world-size-to-tensorboard", ARG(a.log_world_size_to_tensorboard), true);
  b.flag("--no-log-batch-size-to-tensorboard", ARG(a.log_batch_size_to_tensorboard), false);
  for (const char* f : {"--wandb-project", "--wandb-exp-name", "--wandb-save-dir", "--wandb-entity"}) {
    if (megatron_flag_map().count(f)) b.noted(f, "there is no Weights & Biases writer; use --tensorboard-dir");
  }

  // ---- checkpointing ----
  b.str("--save", ARG(a.save));
  b.str("--load", ARG(a.load));
  b.num("--save-interval", ARG(a.save_interval), 1);
  b.flag("--no-save-optim", ARG(a.no_save_optim), true);
  b.flag("--no-save-rng", ARG(a.no_save_rng), true);
  b.flag("--no-load-optim", ARG(a.no_load_optim), true);
  b.flag("--no-load-rng", ARG(a.no_load_rng), true);
  b.flag("--finetune", ARG(a.finetune), true);
  b.str("--ckpt-format", ARG(a.ckpt_format), {"torch", "torch_dist", "torch_dcp", "fsdp_dtensor"});
  b.num("--ckpt-step", ARG(a.ckpt_step), 0);
  b.flag("--exit-on-missing-checkpoint", ARG(a.exit_on_missing_checkpoint), true);
  b.flag("--async-save", ARG(a.async_save), true);
  // Megatron's load_args_from_checkpoint (checkpointing.h): the checkpoint's model arguments
  // replace these flags' before validate_args.
  b.flag("--use-checkpoint-args", ARG(a.use_checkpoint_args), true);
  b.flag("--use-mp-args-from-checkpoint-args", ARG(a.use_mp_args_from_checkpoint_args), true);
  b.flag("--no-use-tokenizer-model-from-checkpoint-args", ARG(a.use_tokenizer_model_from_checkpoint_args), false);

  // ---- profiling ----
  b.flag("--profile", ARG(a.profile), true);
  b.num("--profile-step-start", ARG(a.profile_step_start), 0);
  b.num("--profile-step-end", ARG(a.profile_step_end), 0);
  b.ints("--profile-ranks", ARG(a.profile_ranks));
  b.noted("--use-pytorch-profiler",
          "there is no PyTorch profiler; --profile writes a Chrome/Perfetto trace of megatron.cpp's timers");
}

#undef ARG

}  // namespace

std::string closest_flag(const std::string& flag) {
  std::vector<std::string> names;
  for (const auto& f : kMegatronFlags) names.emplace_back(f.name);
  if (std::string p = prefix_flag(flag, names); !p.empty()) return p;
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& f : kMegatronFlags) {
    size_t d = edit_distance(flag, f.name);
    if (d < best_d) {
      best_d = d;
      best = f.name;
    }
  }
  return best;
}

namespace {
/// argparse's reading of the command line (arg_utils.h argparse_normalize) against pretrain_gpt's
/// flags in `app`: a value never starts like an option, the last occurrence of a flag wins,
/// lists included. An unknown or unimplemented flag is a UserError naming it.
std::vector<std::string> normalize_args(const CLI::App& app, const std::vector<std::string>& in) {
  auto resolve = [&app](const std::string& name) -> std::string {
    if (name == "-h" || app.get_option_no_throw(name) != nullptr) return name;
    if (megatron_flag_map().count(name)) {
      user_error(name, " is a Megatron-LM flag that megatron.cpp does not implement yet; remove it "
                       "(see docs/training.md for the supported flags)");
    }
    user_error("unknown flag ", name, "; did you mean ", closest_flag(name), "?");
  };
  auto stray = [](const std::string& tok) {
    user_error("unrecognized arguments: ", tok, " (pretrain_gpt takes only --flags; each value follows its flag)");
  };
  return argparse_normalize(app, in, resolve, stray);
}
}  // namespace

Arguments parse_args(const std::vector<std::string>& in) {
  Arguments a;
  CLI::App app{"pretrain_gpt: GPT/LLaMA pretraining with Megatron-LM's flags (megatron.cpp)"};
  app.allow_extras(true);
  app.set_help_flag("-h,--help", "show this help message and exit");
  Binder b(app, a);
  bind_all(b, a);
  // --help: each flag with its value kind and its default (str() as the arguments block prints it).
  for (const auto& e : b.entries()) {
    CLI::Option* o = app.get_option_no_throw(e.flag);
    if (o == nullptr) continue;
    if (!e.type.empty()) o->type_name(e.type.substr(0, e.type.find(' ')));  // CLI11 adds " ..." to a list
    if (o->get_description().empty()) o->description("default: " + e.value());
  }

  std::vector<std::string> args = normalize_args(app, in);
  std::vector<std::string> rev(args.rbegin(), args.rend());
  try {
    app.parse(rev);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    std::exit(0);
  } catch (const CLI::ArgumentMismatch& e) {
    // CLI11 says "--flag: 1 required TEXT missing"; say it as argparse does, naming the flag.
    std::string msg = e.what();
    std::string flag = msg.substr(0, msg.find(':'));
    if (flag.rfind("--", 0) == 0 && msg.find("required") != std::string::npos)
      user_error("argument ", flag, ": expected one argument");
    user_error("command line: ", msg);
  } catch (const CLI::ParseError& e) {
    user_error("command line: ", e.what());
  }
  for (const auto& r : app.remaining()) {
    std::string name = r.substr(0, r.find('='));
    if (name.rfind("-", 0) != 0) {
      user_error("unrecognized arguments: ", r, " (pretrain_gpt takes only --flags; each value follows its flag)");
    }
    if (megatron_flag_map().count(name)) {
      user_error(name, " is a Megatron-LM flag that megatron.cpp does not implement yet; remove it "
                       "(see docs/training.md for the supported flags)");
    }
    user_error("unknown flag ", name, "; did you mean ", closest_flag(name), "?");
  }
  return a;
}

Arguments parse_args(int argc, const char* const* argv) {
  std::vector<std::string> v;
  for (int i = 1; i < argc; ++i) v.emplace_back(argv[i]);
  return parse_args(v);
}

Arguments parse_args_with_overrides(const std::vector<std::string>& in,
                                    const std::vector<std::pair<std::string, std::vector<std::string>>>& overrides) {
  Arguments scratch;
  CLI::App app;
  Binder b(app, scratch);
  bind_all(b, scratch);
  std::map<std::string, std::string> dest_of_name;  // every spelling of a declared flag -> its dest
  for (const auto& e : b.entries()) {
    dest_of_name[e.flag] = e.dest;
    for (const auto& al : e.aliases) dest_of_name[al] = e.dest;
  }
  std::set<std::string> replaced;
  for (const auto& [dest, values] : overrides) replaced.insert(dest);
  // `flag` and its value as argparse reads them back: two tokens, or "--flag=value" when the value
  // looks like an option (argparse takes such a value only after "=").
  std::vector<std::string> out;
  auto give = [&out](const std::string& flag, const std::string& v) {
    if (looks_like_option(v)) {
      out.push_back(flag + "=" + v);
    } else {
      out.push_back(flag);
      out.push_back(v);
    }
  };
  // The command line without the replaced flags. Normalized (argparse_normalize), each occurrence
  // is "--name", "--name=value" per value (a list option: one token per value) or "--name"
  // followed by "" (an empty value); written back in argparse's form, a list option's values
  // after one "--name" (each "--name=v" would be an occurrence of its own: the last would win).
  bool dropping = false;
  std::string list_flag;  // the list option whose values are being written
  for (const auto& tok : normalize_args(app, in)) {
    if (tok.empty()) {  // the "" after "--name" (every other normalized token is a flag)
      if (!dropping) out.push_back(tok);
      continue;
    }
    const size_t eq = tok.find('=');
    const std::string name = tok.substr(0, eq);
    auto it = dest_of_name.find(name);
    dropping = it != dest_of_name.end() && replaced.count(it->second);
    if (dropping) {
      list_flag.clear();
      continue;
    }
    const CLI::Option* o = app.get_option_no_throw(name);
    const bool is_list = o != nullptr && o->get_items_expected_max() > 1;
    const bool same_list = is_list && name == list_flag;
    if (eq == std::string::npos) {
      if (!same_list) out.push_back(name);  // a switch, a list without values, or before ""
    } else if (same_list && !looks_like_option(tok.substr(eq + 1))) {
      out.push_back(tok.substr(eq + 1));
    } else {
      give(name, tok.substr(eq + 1));
    }
    list_flag = is_list ? name : std::string();
  }
  for (const auto& [dest, values] : overrides) {
    const Binder::Entry* one = nullptr;  // the first declared flag of this dest
    const Binder::Entry* sw = nullptr;   // a switch of this dest that stores the value
    for (const auto& e : b.entries()) {
      if (e.dest != dest) continue;
      if (!one) one = &e;
      if (e.stores && values.size() == 1 && py_str(*e.stores) == values[0]) sw = &e;
    }
    MEGATRON_CHECK(one != nullptr) << "no declared flag has the dest " << dest;
    if (values.empty()) continue;  // None: the flag left out (its default)
    if (one->type.empty()) {  // a switch (all flags of a dest are switches, or none)
      if (values.size() != 1 || (values[0] != "True" && values[0] != "False"))
        user_error(dest, " (", one->flag, ") is a switch: True or False, got ",
                   values.size() == 1 ? values[0] : std::to_string(values.size()) + " values");
      if (sw) out.push_back(sw->flag);  // no flag stores it: the default, i.e. leave the flag out
    } else if (one->type.find(' ') != std::string::npos) {  // a list flag: its elements
      out.push_back(one->flag);
      for (const auto& v : values) {
        if (looks_like_option(v))
          user_error(dest, " (", one->flag, "): the list element '", v, "' looks like a flag");
        out.push_back(v);
      }
    } else {
      std::string v = values.size() == 1 ? values[0] : "[";
      if (values.size() != 1) {
        for (size_t i = 0; i < values.size(); ++i) v += (i ? ", " : "") + values[i];
        v += "]";
      }
      give(one->flag, v);
    }
  }
  return parse_args(out);
}

namespace {
[[noreturn]] void fail(const std::string& msg) { throw UserError(msg); }
}  // namespace

/// Megatron's MoE checks of validate_args (and the TransformerConfig ones that need only flags):
/// derived defaults first, then one clear line per bad combination. The MoE math checks
/// (topk vs experts, group-limited routing, ...) run again in TransformerConfig::validate_moe.
void validate_moe_args(Arguments& a) {
  if (a.num_experts && *a.num_experts == 0) a.num_experts.reset();  // Megatron: 0 means no MoE
  if (!a.expert_tensor_parallel_size) a.expert_tensor_parallel_size = a.tensor_model_parallel_size;
  if (!a.num_experts) {
    if (a.expert_model_parallel_size > 1)
      user_error("--expert-model-parallel-size ", a.expert_model_parallel_size, " needs --num-experts");
    return;
  }
  if (!a.moe_ffn_hidden_size) a.moe_ffn_hidden_size = a.ffn_hidden_size;
  a.moe_layer_pattern = transformer::moe::parse_moe_layer_freq(a.moe_layer_freq, *a.num_layers);
  // Megatron fails only at its first training log (no MoE layer to average the aux losses over).
  if (std::find(a.moe_layer_pattern.begin(), a.moe_layer_pattern.end(), 1) == a.moe_layer_pattern.end())
    user_error("--moe-layer-freq ", a.moe_layer_freq, " makes no layer a mixture-of-experts layer while --num-experts is ",
               *a.num_experts, ": mark at least one layer 1, or drop --num-experts for a dense model");
  if (a.moe_router_load_balancing_type.size() > 1 &&
      a.moe_aux_loss_coeff.size() != a.moe_router_load_balancing_type.size())
    user_error("--moe-aux-loss-coeff must give one coefficient per --moe-router-load-balancing-type (",
               a.moe_router_load_balancing_type.size(), " types, ", a.moe_aux_loss_coeff.size(), " coefficients)");
  // Megatron's grouped-GEMM experts refuse biases too ("bias not supported in Grouped GEMM yet");
  // our routed experts (grouped or per-expert loop) have none.
  if (a.add_bias_linear)
    user_error("--num-experts: the routed experts have no bias linear layers; add --disable-bias-linear");
  if (a.moe_router_topk > *a.num_experts)
    user_error("--moe-router-topk (", a.moe_router_topk, ") must not exceed --num-experts (", *a.num_experts, ")");
  const int64_t ep = a.expert_model_parallel_size, etp = *a.expert_tensor_parallel_size;
  if (*a.num_experts % ep != 0)
    user_error("--num-experts (", *a.num_experts, ") must be a multiple of --expert-model-parallel-size (", ep, ")");
  // Megatron's expert rank generator: world = expert-TP x EP x expert-DP x PP.
  if (a.world_size % (etp * ep * a.pipeline_model_parallel_size) != 0)
    user_error("world size (", a.world_size, ") is not divisible by --expert-tensor-parallel-size (", etp,
               ") x --expert-model-parallel-size (", ep, ") x --pipeline-model-parallel-size (",
               a.pipeline_model_parallel_size, ")");
  if (a.moe_expert_capacity_factor) {
    if (*a.moe_expert_capacity_factor < 0) {
      a.moe_expert_capacity_factor.reset();  // Megatron: negative = dropless
    } else if (*a.moe_expert_capacity_factor == 0) {
      user_error("--moe-expert-capacity-factor must be > 0 (or negative for dropless training), got 0");
    }
  }
  if (a.moe_pad_expert_input_to_capacity && !a.moe_expert_capacity_factor)
    fail("--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor");
  if (a.moe_shared_expert_overlap && a.moe_token_dispatcher_type != "alltoall")
    fail("--moe-shared-expert-overlap only works with --moe-token-dispatcher-type alltoall (or flex)");
  if (a.moe_router_enable_expert_bias && a.moe_router_score_function == "softmax")
    fail("--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid or sqrtsoftplus");
  if (a.fp8 && a.fp8_param_gather)
    fail("--fp8-param-gather with --num-experts is not implemented in megatron.cpp yet (FP8 expert weights are cast "
         "from the model dtype every step); drop --fp8-param-gather");
  if (a.fp8 && a.fp8_recipe == "tensorwise" && etp > 1)
    fail("--fp8-recipe tensorwise with --num-experts needs --expert-tensor-parallel-size 1 (Transformer Engine's "
         "GroupedLinear has no current scaling under expert tensor parallelism)");
  if (a.tensor_model_parallel_size > 1 && !a.sequence_parallel)
    fail("--num-experts with --tensor-model-parallel-size > 1 needs --sequence-parallel (Megatron's MoELayer rule)");
}

void validate_args(Arguments& a) {
  // Parallel sizes -> data-parallel size.
  for (auto [flag, v] : {std::pair{"--tensor-model-parallel-size", a.tensor_model_parallel_size},
                         {"--pipeline-model-parallel-size", a.pipeline_model_parallel_size},
                         {"--context-parallel-size", a.context_parallel_size},
                         {"--expert-model-parallel-size", a.expert_model_parallel_size}}) {
    if (v < 1) user_error(flag, " must be >= 1 (got ", v, ")");
  }
  const int64_t model_size = a.tensor_model_parallel_size * a.pipeline_model_parallel_size * a.context_parallel_size;
  if (a.world_size % model_size != 0) {
    user_error("world size (", a.world_size, ") is not divisible by --tensor-model-parallel-size (",
               a.tensor_model_parallel_size, ") x --pipeline-model-parallel-size (", a.pipeline_model_parallel_size,
               ") x --context-parallel-size (", a.context_parallel_size, ")");
  }
  a.data_parallel_size = a.world_size / model_size;

  // Batch sizes.
  if (!a.micro_batch_size) fail("--micro-batch-size is required");
  if (*a.micro_batch_size <= 0) user_error("--micro-batch-size must be > 0 (got ", *a.micro_batch_size, ")");
  if (!a.global_batch_size) a.global_batch_size = *a.micro_batch_size * a.data_parallel_size;
  if (*a.global_batch_size <= 0) user_error("--global-batch-size must be > 0 (got ", *a.global_batch_size, ")");
  if (*a.global_batch_size % (*a.micro_batch_size * a.data_parallel_size) != 0) {
    user_error("--global-batch-size (", *a.global_batch_size, ") is not divisible by --micro-batch-size (",
               *a.micro_batch_size, ") x data-parallel size (", a.data_parallel_size, ")");
  }
  if (!a.dataloader_type) a.dataloader_type = "single";
  // Megatron's cyclic loader (MegatronPretrainingRandomSampler: a new random order each epoch) and
  // external loaders are not implemented; the flag was parsed and the single order used silently.
  if (*a.dataloader_type != "single")
    user_error("--dataloader-type ", *a.dataloader_type,
               " is not implemented in megatron.cpp yet (only single: Megatron's sequential sampler); remove it");
  if (a.num_dataset_builder_threads <= 0) fail("--num-dataset-builder-threads must be > 0");

  // Iteration- vs sample-based training (exactly one of them unless --skip-train).
  if (!a.skip_train) {
    if (a.train_iters && a.train_samples) fail("use either --train-iters or --train-samples, not both");
    if (!a.train_iters && !a.train_samples) fail("one of --train-iters or --train-samples is required");
  }
  if (a.train_iters && !a.skip_train) {
    if (a.lr_decay_samples) fail("--lr-decay-samples cannot be used with --train-iters (use --lr-decay-iters)");
    if (a.lr_warmup_samples != 0) fail("--lr-warmup-samples cannot be used with --train-iters (use --lr-warmup-iters)");
    if (a.lr_warmup_fraction && a.lr_warmup_iters != 0)
      fail("use either --lr-warmup-fraction or --lr-warmup-iters, not both");
  }
  if (a.train_samples && !a.skip_train) {
    if (a.lr_decay_iters) fail("--lr-decay-iters cannot be used with --train-samples (use --lr-decay-samples)");
    if (a.lr_warmup_iters != 0) fail("--lr-warmup-iters cannot be used with --train-samples (use --lr-warmup-samples)");
    if (a.lr_warmup_fraction && a.lr_warmup_samples != 0)
      fail("use either --lr-warmup-fraction or --lr-warmup-samples, not both");
  }

  // Required model arguments.
  if (!a.num_layers) fail("--num-layers is required");
  if (!a.hidden_size) fail("--hidden-size is required");
  if (!a.num_attention_heads) fail("--num-attention-heads is required");
  if (!a.max_position_embeddings) fail("--max-position-embeddings is required");
  if (*a.num_layers <= 0 || *a.hidden_size <= 0 || *a.num_attention_heads <= 0)
    fail("--num-layers, --hidden-size and --num-attention-heads must be > 0");
  if (!a.ffn_hidden_size) {
    a.ffn_hidden_size = a.swiglu ? static_cast<int64_t>((4.0 * static_cast<double>(*a.hidden_size) * 2.0 / 3.0) / 64.0) * 64
                                 : 4 * *a.hidden_size;
  }
  if (!a.kv_channels) {
    if (*a.hidden_size % *a.num_attention_heads != 0) {
      user_error("--hidden-size (", *a.hidden_size, ") must be divisible by --num-attention-heads (",
                 *a.num_attention_heads, ") (or give --kv-channels)");
    }
    a.kv_channels = *a.hidden_size / *a.num_attention_heads;
  }
  if (a.group_query_attention) {
    if (a.num_query_groups <= 0 || *a.num_attention_heads % a.num_query_groups != 0) {
      user_error("--num-attention-heads (", *a.num_attention_heads, ") must be divisible by --num-query-groups (",
                 a.num_query_groups, ")");
    }
  } else {
    a.num_query_groups = *a.num_attention_heads;  // Megatron: no GQA -> one group per head
  }
  if (*a.num_attention_heads % a.tensor_model_parallel_size != 0) {
    user_error("--num-attention-heads (", *a.num_attention_heads, ") must be divisible by --tensor-model-parallel-size (",
               a.tensor_model_parallel_size, ")");
  }
  if (a.num_query_groups % a.tensor_model_parallel_size != 0) {
    user_error("--num-query-groups (", a.num_query_groups, ") must be divisible by --tensor-model-parallel-size (",
               a.tensor_model_parallel_size, ")");
  }
  if (!a.seq_length) fail("--seq-length is required");
  if (a.context_parallel_size > 1 && *a.seq_length % (2 * a.context_parallel_size) != 0) {
    user_error("--seq-length (", *a.seq_length, ") must be a multiple of 2 x --context-parallel-size (",
               a.context_parallel_size, ")");
  }
  // --cp-comm-type: Megatron's choices; one value for all layers or one per layer.
  if (a.cp_comm_type.empty()) fail("--cp-comm-type: expected at least one argument");
  for (const auto& t : a.cp_comm_type) {
    if (t != "p2p" && t != "a2a" && t != "allgather" && t != "a2a+p2p")
      user_error("--cp-comm-type: invalid choice '", t, "' (choose from p2p, a2a, allgather, a2a+p2p)");
  }
  if (a.cp_comm_type.size() != 1 && static_cast<int64_t>(a.cp_comm_type.size()) != *a.num_layers)
    user_error("--cp-comm-type: give one value or one per layer (", *a.num_layers, "), got ", a.cp_comm_type.size());
  if (*a.max_position_embeddings < *a.seq_length) {
    user_error("--max-position-embeddings (", *a.max_position_embeddings,
               ") must be greater than or equal to --seq-length (", *a.seq_length, ")");
  }
  // Uneven splits (--decoder-first/last-pipeline-num-layers) are checked where the layers are
  // assigned (megatron/training/gpt_pipeline.h).
  const bool uneven_pipeline = a.decoder_first_pipeline_num_layers || a.decoder_last_pipeline_num_layers;
  if (!uneven_pipeline && *a.num_layers % a.pipeline_model_parallel_size != 0) {
    user_error("--num-layers (", *a.num_layers, ") must be divisible by --pipeline-model-parallel-size (",
               a.pipeline_model_parallel_size, ")");
  }
  // Megatron: the two virtual-pipeline flags exclude each other, and the interleaved schedule
  // needs PP > 1. (Megatron also wants PP > 2 under --no-overlap-p2p-communication, because its
  // single batch per step would then pair messages of the two directions between the same two
  // ranks; our schedule keeps the two directions on separate subgroups, so PP = 2 is fine.)
  if (a.num_layers_per_virtual_pipeline_stage && a.num_virtual_stages_per_pipeline_rank)
    fail("--num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-rank cannot be set at the same time");
  if ((a.num_layers_per_virtual_pipeline_stage || a.num_virtual_stages_per_pipeline_rank) &&
      a.pipeline_model_parallel_size <= 1)
    fail("the interleaved schedule (--num-layers-per-virtual-pipeline-stage / --num-virtual-stages-per-pipeline-rank) "
         "needs --pipeline-model-parallel-size > 1");
  if (a.num_layers_per_virtual_pipeline_stage) {
    const int64_t per_stage = *a.num_layers / a.pipeline_model_parallel_size;
    if (per_stage % *a.num_layers_per_virtual_pipeline_stage != 0)
      user_error("layers per pipeline stage (", per_stage, ") must be divisible by --num-layers-per-virtual-pipeline-stage (",
                 *a.num_layers_per_virtual_pipeline_stage, ")");
    a.virtual_pipeline_model_parallel_size = per_stage / *a.num_layers_per_virtual_pipeline_stage;
  } else if (a.num_virtual_stages_per_pipeline_rank) {
    a.virtual_pipeline_model_parallel_size = *a.num_virtual_stages_per_pipeline_rank;
  }
  // Megatron's validate_args: without the interleaved schedule overlap_p2p_comm and
  // align_param_gather become False (args_items prints them so), with this line when PP > 1.
  if (!a.virtual_pipeline_model_parallel_size && a.pipeline_model_parallel_size > 1)
    a.messages.push_back("WARNING: Setting args.overlap_p2p_comm and args.align_param_gather to False since "
                         "non-interleaved schedule does not support overlapping p2p communication and aligned param AG");
  if (a.microbatch_group_size_per_vp_stage && *a.microbatch_group_size_per_vp_stage < 1)
    fail("--microbatch-group-size-per-virtual-pipeline-stage must be >= 1");

  // Bias flags (arguments.py): no bias -> no bias-gelu fusion; add_bias_linear implies a QKV bias.
  if (!a.add_bias_linear) a.bias_gelu_fusion = false;
  if (a.add_bias_linear) a.add_qkv_bias = true;
  // --squared-relu (core_transformer_config_from_args: assert not swiglu; MLP.forward raises "Only
  // support fusion of gelu and swiglu" when the bias-activation fusion is on).
  // RoPE variants: --rope-scaling-factor > 0 and --rotary-seq-len-interpolation-factor >= 1 are
  // checked where parsed (Megatron does not check them; a zero factor would divide by zero there).
  if (a.squared_relu && a.swiglu) fail("--squared-relu and --swiglu cannot be used together");
  if (a.squared_relu && a.bias_gelu_fusion)
    fail("--squared-relu needs --no-bias-gelu-fusion (or --disable-bias-linear): Megatron fuses only GeLU and "
         "SwiGLU with the bias ('Only support fusion of gelu and swiglu')");

  // Multi-token prediction (Megatron's validate_args and MultiTokenPredictionLayer asserts).
  if (a.mtp_num_layers.value_or(0) > 0) {
    if (a.position_embedding_type != "rope" && a.position_embedding_type != "none")
      fail("Multi-Token Prediction (MTP) is not supported with " + a.position_embedding_type +
           " position embedding type (--mtp-num-layers needs --position-embedding-type rope or none)");
    if (a.recompute_granularity == "full" && a.recompute_method == "uniform" && a.recompute_num_layers != 1)
      fail("--mtp-num-layers with --recompute-method uniform needs --recompute-num-layers 1 (Megatron: "
           "recompute_num_layers must be 1 for MTP recompute)");
    if (a.recompute_granularity == "full" && a.recompute_method == "block")
      a.messages.push_back("WARNING: recompute_method == 'block' is not supported for MTP yet. Skipping recompute.");
    // The MTP layer's eh_proj (ColumnParallelLinear 2h -> h) splits --hidden-size by TP; the
    // decoder alone never does (its projections split heads and --ffn-hidden-size).
    if (*a.hidden_size % a.tensor_model_parallel_size != 0)
      user_error("--mtp-num-layers needs --hidden-size (", *a.hidden_size, ") divisible by --tensor-model-parallel-size (",
                 a.tensor_model_parallel_size, "): the MTP eh_proj splits its hidden-size output by TP");
  }

  // Learning rate and weight decay.
  // --skip-train evaluates only (no optimizer is built), so it needs no learning rate.
  if (!a.lr && !a.skip_train) fail("--lr is required");
  if (a.lr && a.min_lr > *a.lr) user_error("--min-lr (", a.min_lr, ") must be <= --lr (", *a.lr, ")");
  if (a.weight_decay_incr_style == "constant") {
    if (a.start_weight_decay || a.end_weight_decay)
      fail("--start-weight-decay/--end-weight-decay need --weight-decay-incr-style linear or cosine");
    a.start_weight_decay = a.weight_decay;
    a.end_weight_decay = a.weight_decay;
  } else if (!a.start_weight_decay || !a.end_weight_decay) {
    user_error("--weight-decay-incr-style ", a.weight_decay_incr_style,
               " needs both --start-weight-decay and --end-weight-decay");
  }
  if (a.lr_decay_style == "WSD" && !a.lr_wsd_decay_iters && !a.lr_wsd_decay_samples) {
    fail("--lr-decay-style WSD needs --lr-wsd-decay-iters (or --lr-wsd-decay-samples)");
  }

  // Precision.
  if (a.fp16 && a.bf16) fail("--fp16 and --bf16 cannot be used together");
  if (a.fp16_lm_cross_entropy && !a.fp16) fail("--fp16-lm-cross-entropy needs --fp16");
  if (a.fp32_residual_connection && !(a.fp16 || a.bf16))
    fail("--fp32-residual-connection only makes sense with --fp16 or --bf16");
  if (a.bf16) {
    if (a.grad_reduce_in_bf16) a.accumulate_allreduce_grads_in_fp32 = false;
    else a.accumulate_allreduce_grads_in_fp32 = true;
  }
  // Loss scales > 0 and finite, --loss-scale-window >= 1: checked where parsed (bind_all).
  if (!(a.loss_scale_window >= 1 && a.loss_scale_window <= 2147483647.0) ||
      a.loss_scale_window != std::floor(a.loss_scale_window))
    user_error("--loss-scale-window must be a whole number of iterations in 1..2147483647 (got ", a.loss_scale_window, ")");
  if (a.hysteresis < 1 || a.hysteresis > 2147483647)
    user_error("--hysteresis must be in 1..2147483647 (got ", a.hysteresis, ")");
  // Dynamic loss scaling expects inf/NaN grads: Megatron turns the NaN check off then.
  if (a.fp16 && !a.loss_scale) a.check_for_nan_in_loss_and_grad = false;

  // FP8 (Megatron's validate_args and TE's recipe constraints).
  if (a.fp8) {
    fp8::parse_fp8_recipe(a.fp8_recipe);  // UserError for mxfp8/custom (not Hopper recipes here)
    if (a.fp8_amax_history_len < 1)
      user_error("--fp8-amax-history-len must be >= 1 (got ", a.fp8_amax_history_len, ")");
    if (a.fp8_param_gather && !a.use_distributed_optimizer)
      fail("--fp8-param-gather needs --use-distributed-optimizer");
    if (a.fp8_param_gather && fp8::parse_fp8_recipe(a.fp8_recipe) != fp8::Fp8Recipe::kDelayed)
      fail("--fp8-param-gather supports --fp8-recipe delayed only here (FP8 primary weights with the tensorwise "
           "and blockwise recipes are not implemented); drop one of the two");
  } else if (a.fp8_param_gather) {
    fail("--fp8-param-gather needs --fp8-format");
  }
  // --fp8-output-proj: Megatron runs it under --fp8-recipe mxfp8 only; here with delayed /
  // tensorwise / blockwise (docs/fp8.md "FP8 output layer"). Without --fp8-format it would be a no-op.
  if (a.fp8_output_proj && !a.fp8)
    fail("--fp8-output-proj needs --fp8-format (it runs the output layer's GEMMs with the FP8 recipe)");

  // Activation recomputation (Megatron's validate_args + TransformerConfig.__post_init__).
  if (a.recompute_activations) a.recompute_granularity = "selective";
  if (a.recompute_granularity == "selective") {
    if (a.recompute_method) fail("recompute method is not yet supported for selective recomputing granularity "
                                 "(drop --recompute-method, or use --recompute-granularity full)");
    if (a.recompute_num_layers)
      fail("--recompute-num-layers must not be given with --recompute-granularity selective");
  } else if (a.recompute_granularity == "full") {
    if (!a.recompute_method)
      fail("--recompute-granularity full needs --recompute-method uniform or block");
    if (!a.recompute_num_layers)
      fail("--recompute-granularity full needs --recompute-num-layers (1 to the number of layers per pipeline stage)");
    if (*a.recompute_num_layers <= 0)
      user_error("--recompute-num-layers must be positive with --recompute-granularity full (got ",
                 *a.recompute_num_layers, ")");
  }
  // Without --recompute-granularity, --recompute-method / --recompute-num-layers are ignored
  // (as in Megatron, whose TransformerBlock only checkpoints with granularity 'full').
  // --recompute-modules (Megatron's TransformerConfig.recompute_modules, read only with selective
  // granularity; its choices and its moe_act, shared_experts and FP8 rules). core_attn is what our
  // attention always does (kSelectiveNote), moe checkpoints each MoE layer, moe_act the grouped
  // experts' activation, shared_experts the shared expert; the others are not implemented.
  static const std::vector<std::string> kRecomputeModules = {"core_attn", "moe_act", "layernorm", "mla_up_proj",
                                                             "mlp", "moe", "shared_experts", "gdn_norm_out",
                                                             "gdp_in_proj", "gdp_qkv", "mhc"};
  for (const auto& m : a.recompute_modules)
    if (std::find(kRecomputeModules.begin(), kRecomputeModules.end(), m) == kRecomputeModules.end())
      fail("Invalid choices for recompute_modules: " + m + " (--recompute-modules; allowed: " +
           py_list(kRecomputeModules) + ")");
  if (a.recompute_granularity == "selective" || a.moe_layer_recompute) {  // the latter: selective (below)
    for (const auto& m : a.recompute_modules) {
      if (m == "moe_act" && !a.moe_grouped_gemm)
        fail("moe_act in recompute_modules is only supported with moe_grouped_gemm (--recompute-modules moe_act "
             "needs --moe-grouped-gemm)");
      if (m == "shared_experts" && a.moe_shared_expert_intermediate_size && a.moe_shared_expert_overlap)
        fail("shared_experts recompute cannot work with --moe-shared-expert-overlap.");
      if (a.fp8 && m == "moe_act" && a.fp8_recipe == "delayed")
        fail("Delayed scaling does not support moe_act and layernorm recompute for fp8 (--recompute-modules moe_act "
             "with --fp8-recipe delayed)");
      if (a.fp8 && m == "moe_act")  // Megatron: fc2 then saves its bf16 input (set_save_original_input)
        fail("--recompute-modules moe_act with --fp8-format is not implemented in megatron.cpp yet; drop one");
      if (m != "core_attn" && m != "moe" && m != "moe_act" && m != "shared_experts")
        fail("--recompute-modules " + m + " is not implemented in megatron.cpp yet (selective recomputation of "
             "core_attn, moe, moe_act and shared_experts only); use --recompute-granularity full, or drop " + m);
    }
  } else if (!a.recompute_modules.empty()) {
    a.notes.emplace_back("--recompute-modules", "Megatron reads it only with --recompute-granularity selective; no "
                                                "effect here");
  }
  if (a.moe_layer_recompute) {  // Megatron's TransformerConfig.__post_init__ (config_from_args applies it)
    if (a.recompute_granularity == "full")
      fail("Do not set --moe-layer-recompute with full recompute granularity.");
    a.messages.push_back("WARNING: --moe-layer-recompute is deprecated. Use --recompute-granularity selective "
                         "--recompute-modules moe_layer instead.");
  }

  // Parallel feature combinations.
  if (a.tensor_model_parallel_size == 1) a.sequence_parallel = false;  // Megatron disables it silently
  if (a.overlap_param_gather && !a.use_distributed_optimizer)
    fail("--overlap-param-gather needs --use-distributed-optimizer");

  // Data.
  if (!a.mock_data && a.data_path.empty() && a.train_data_path.empty() && !a.skip_train)
    fail("give --data-path (or --train-data-path/--valid-data-path/--test-data-path) or --mock-data");
  // Megatron's validate_args: "A single data source must be provided in training mode".
  const bool per_split_paths = !a.train_data_path.empty() || !a.valid_data_path.empty() || !a.test_data_path.empty();
  if (int(a.mock_data) + int(!a.data_path.empty()) + int(per_split_paths) > 1)
    fail("give one data source: --mock-data, --data-path, or --train-data-path/--valid-data-path/--test-data-path");
  if (!a.mock_data && !a.data_path.empty() && !a.split) {
    // Megatron's validate_args (warn_rank_0, a Python UserWarning on stderr).
    a.split = "969, 30, 1";
    a.warnings.push_back("Please specify --split when using --data-path. Using legacy default value of \"969, 30, 1\"");
  }
  if (a.apply_query_key_layer_scaling) a.attention_softmax_in_fp32 = true;  // Megatron's validate_args
  if (a.tokenizer.tokenizer_type.empty()) fail("--tokenizer-type is required");
  if (a.tokenizer.tokenizer_type == "NullTokenizer" && !a.tokenizer.vocab_size)
    fail("--tokenizer-type NullTokenizer needs --vocab-size");

  // Logging, checkpointing, profiling, exit.
  if (a.log_interval <= 0) user_error("--log-interval must be > 0 (got ", a.log_interval, ")");
  if (a.eval_interval && *a.eval_interval <= 0) user_error("--eval-interval must be > 0 (got ", *a.eval_interval, ")");
  if (a.eval_iters < 0) user_error("--eval-iters must be >= 0 (got ", a.eval_iters, ")");
  if (a.save && (!a.save_interval || *a.save_interval <= 0)) fail("--save needs --save-interval > 0");
  if (a.profile && a.profile_step_end < a.profile_step_start)
    user_error("--profile-step-end (", a.profile_step_end, ") must be >= --profile-step-start (",
               a.profile_step_start, ")");
  if (a.exit_interval && *a.exit_interval <= 0) fail("--exit-interval must be > 0");
  if (a.tensorboard_log_interval <= 0) fail("--tensorboard-log-interval must be > 0");
  validate_moe_args(a);
}

// flag-registry: consumers begin (code here acts on Arguments; flag_registry_test counts its reads)
std::string set_padded_vocab_size(Arguments& a, int64_t vocab_size) {
  if (a.padded_vocab_size > 0) {  // from the checkpoint (--use-checkpoint-args): kept, as Megatron's
    if (a.padded_vocab_size < vocab_size)
      user_error("--use-checkpoint-args: the checkpoint's padded_vocab_size (", a.padded_vocab_size,
                 ") is smaller than the tokenizer's vocabulary (", vocab_size, "): use the checkpoint's tokenizer");
    if (a.padded_vocab_size % a.tensor_model_parallel_size != 0)
      user_error("--use-checkpoint-args: the checkpoint's padded_vocab_size (", a.padded_vocab_size,
                 ") is not divisible by --tensor-model-parallel-size (", a.tensor_model_parallel_size,
                 "): the embedding rows cannot be split; choose a tensor-parallel size that divides it");
    return "";
  }
  const int64_t multiple = a.make_vocab_size_divisible_by * a.tensor_model_parallel_size;
  if (multiple <= 0) user_error("--make-vocab-size-divisible-by must be > 0");
  a.padded_vocab_size = (vocab_size + multiple - 1) / multiple * multiple;
  std::ostringstream os;
  os << " > padded vocab (size: " << vocab_size << ") with " << (a.padded_vocab_size - vocab_size)
     << " dummy tokens (new size: " << a.padded_vocab_size << ")";
  return os.str();
}

int64_t num_microbatches(const Arguments& a) {
  MEGATRON_CHECK(a.global_batch_size && a.micro_batch_size) << "validate_args not run";
  return *a.global_batch_size / (*a.micro_batch_size * a.data_parallel_size);
}

// flag-registry: consumers end

std::string py_float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  // Shortest round-trip digits (as Python's repr: David Gay's shortest mode) from to_chars.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), std::fabs(v), std::chars_format::scientific);
  const std::string sci(buf, r.ptr);  // "d[.ddd]e[+-]XX"
  const size_t e = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e)) if (c != '.') digits += c;
  const int exp10 = std::stoi(sci.substr(e + 1));
  const int decpt = exp10 + 1;  // position of the decimal point after the first digit
  std::string out = std::signbit(v) ? "-" : "";
  if (decpt > -4 && decpt <= 16) {  // Python's repr: positional for 1e-4 <= |v| < 1e16
    const int n = static_cast<int>(digits.size());
    if (decpt <= 0) out += "0." + std::string(-decpt, '0') + digits;
    else if (decpt >= n) out += digits + std::string(decpt - n, '0') + ".0";
    else out += digits.substr(0, decpt) + "." + digits.substr(decpt);
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += eb;
  }
  return out;
}

std::string py_str_repr(const std::string& s) {
  const char q = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\' || c == static_cast<unsigned char>(q)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      char eb[8];
      std::snprintf(eb, sizeof(eb), "\\x%02x", c);
      out += eb;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + q;
}

std::string format_args_block(const std::string& title, const std::vector<std::pair<std::string, std::string>>& items) {
  std::vector<std::pair<std::string, std::string>> lines;  // (lower-cased key, line)
  for (const auto& [name, value] : items) {
    const std::string dots(static_cast<size_t>(std::max<int64_t>(0, 48 - static_cast<int64_t>(name.size()))), '.');
    std::string line = "  " + name + " " + dots + " " + value;
    std::string key = line;
    for (char& c : key) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    lines.emplace_back(std::move(key), std::move(line));
  }
  std::stable_sort(lines.begin(), lines.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  std::string out = "------------------------ " + title + " ------------------------\n";
  for (const auto& l : lines) out += l.second + "\n";
  return out + "-------------------- end of " + title + " ---------------------";
}

namespace {
/// The declared flags' entries, bound to `a` (a throwaway CLI11 app; nothing is parsed).
std::vector<Binder::Entry> declared_entries(Arguments& a) {
  CLI::App app;
  Binder b(app, a);
  bind_all(b, a);
  return b.entries();
}
}  // namespace

std::vector<FlagInfo> flag_registry() {
  Arguments a;
  CLI::App app;
  Binder b(app, a);
  bind_all(b, a);
  std::vector<FlagInfo> out;
  std::set<std::string> covered;
  for (const auto& e : b.entries()) {
    const MegatronFlag* m = megatron_flag(e.flag);
    const CLI::Option* o = app.get_option_no_throw(e.flag);
    FlagInfo f{e.flag, e.aliases, e.dest, e.disposition, e.reads, e.note, 0};
    f.arity = m ? m->arity : (o && o->get_items_expected_max() == 0 ? 0 : o && o->get_items_expected_max() == 1 ? 1 : -1);
    out.push_back(std::move(f));
    covered.insert(e.flag);
    for (const auto& al : e.aliases) covered.insert(al);
  }
  for (const CLI::Option* o : app.get_options())
    for (const auto& n : o->get_lnames())
      if (n != "help" && !covered.count("--" + n)) out.push_back(FlagInfo{"--" + n, {}, "", FlagDisposition::kImplemented, {}, "", 0});
  return out;
}

std::vector<MegatronFlagInfo> megatron_flag_table() {
  std::vector<MegatronFlagInfo> out;
  for (const auto& f : kMegatronFlags) out.push_back({f.name, f.dest, f.default_str, f.arity, f.kind});
  return out;
}

std::vector<std::pair<std::string, std::string>> declared_flag_dests() {
  Arguments a;
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& e : declared_entries(a)) out.emplace_back(e.flag, e.dest);
  return out;
}

bool declares_dest(const std::string& dest) {
  Arguments a;
  for (const auto& e : declared_entries(a))
    if (e.dest == dest) return true;
  return false;
}

static std::vector<std::string> declared_flags_of_type(const std::string& type) {
  Arguments a;
  std::vector<std::string> out;
  for (const auto& e : declared_entries(a))
    if (e.type == type) out.push_back(e.flag);
  return out;
}
std::vector<std::string> declared_int_flags() { return declared_flags_of_type("INT"); }
std::vector<std::string> declared_float_flags() { return declared_flags_of_type("FLOAT"); }

std::vector<std::pair<std::string, std::string>> args_items(const Arguments& args) {
  Arguments a = args;  // the entries' printers read this copy
  std::vector<std::pair<std::string, std::string>> items;
  std::set<std::string> seen;
  auto put = [&](const std::string& dest, std::string value) {
    if (seen.insert(dest).second) items.emplace_back(dest, std::move(value));
  };
  // Fields Megatron's parse_args/validate_args/build_tokenizer set on args that we have. They go
  // first so that they win over a flag with the same dest.
  put("world_size", py_str(a.world_size));
  put("rank", py_str(a.rank));
  put("data_parallel_size", py_str(a.data_parallel_size));
  put("params_dtype", a.bf16 ? "torch.bfloat16" : a.fp16 ? "torch.float16" : "torch.float32");
  // padded_vocab_size is not in the block: Megatron's build_tokenizer sets it after _print_args.
  // Megatron stores None for a virtual pipeline size of 1.
  put("virtual_pipeline_model_parallel_size",
      a.virtual_pipeline_model_parallel_size.value_or(1) == 1 ? std::string("None")
                                                              : py_str(*a.virtual_pipeline_model_parallel_size));
  // validate_args: without virtual pipeline stages, overlap_p2p_comm and align_param_gather are
  // set to False (whatever the flags said) before the block is printed.
  if (!a.virtual_pipeline_model_parallel_size || *a.virtual_pipeline_model_parallel_size == 1) {
    put("overlap_p2p_comm", "False");
    put("align_param_gather", "False");
  }
  // validate_args: --apply-query-key-layer-scaling also sets attention_softmax_in_fp32.
  if (a.apply_query_key_layer_scaling) put("attention_softmax_in_fp32", "True");
  // validate_args starts the sample counters at 0, and the block is printed before a checkpoint
  // is loaded (in Megatron and here), so they always print as 0.
  for (const char* counter : {"consumed_train_samples", "skipped_train_samples", "consumed_valid_samples"})
    put(counter, "0");
  for (const auto& e : declared_entries(a)) put(e.dest, e.value());
  return items;
}

std::string format_args(const Arguments& a) { return format_args_block("arguments", args_items(a)); }

}  // namespace megatron::training
