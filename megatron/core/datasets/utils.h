// Dataset utilities of megatron/core/datasets/utils.py and blended_megatron_dataset_config.py:
// the Split enum, weight normalization, --split parsing into a split matrix, --data-path blend
// parsing, and the pieces of Python behaviour the cache names depend on (float repr, json.dumps
// with indent=4 and ensure_ascii, MD5).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace megatron::datasets {

/// Megatron's Split enum (utils.py): train=0, valid=1, test=2.
enum class Split : int { train = 0, valid = 1, test = 2 };
/// "train" / "valid" / "test".
const char* split_name(Split s);

/// numpy.sum over float64 (numpy's pairwise summation, so blends of >= 8 weights match too).
double numpy_sum(const std::vector<double>& v);
/// Megatron's normalize(): w / numpy.sum(w) in float64.
std::vector<double> normalize(const std::vector<double>& weights);

/// One split's book-ends [lo, hi) as fractions of the low-level dataset. `lo_is_int` records
/// that Python holds the bound as the integer 0 (first split of a --split string), which the
/// cache description prints as "0" rather than "0.0".
struct SplitBookend {
  double lo = 0.0;
  double hi = 0.0;
  bool lo_is_int = false;
};
/// Per split: the book-ends, or nullopt for an empty split (Python None).
using SplitMatrix = std::array<std::optional<SplitBookend>, 3>;

/// parse_and_normalize_split: every "[.0-9]+" run of `split` as a float, right-padded with 0 to 3
/// entries, normalized. Throws UserError naming --split for more than 3 numbers, a zero sum or an
/// unparsable number.
std::vector<double> parse_and_normalize_split(const std::string& split);
/// convert_split_vector_to_split_matrix (single vector): cumulative book-ends from integer 0;
/// a split whose hi <= lo is nullopt. [0.99, 0.01, 0] -> [(0, 0.99), (0.99, 1.0), None].
SplitMatrix convert_split_vector_to_split_matrix(const std::vector<double>& vec);
/// The element range [int(round(lo*N)), int(round(hi*N))) of a split over N elements (round half
/// to even, as Python's round()).
std::pair<int64_t, int64_t> split_range(const SplitBookend& b, int64_t num_elements);

/// A blend: dataset prefixes and optional (unnormalized) weights (Megatron's Tuple[List[str],
/// Optional[List[float]]]).
struct Blend {
  std::vector<std::string> prefixes;
  std::optional<std::vector<double>> weights;
};
/// get_blend_from_list: an even-length list whose even entries all parse as floats is
/// "w1 p1 w2 p2 ..."; otherwise every entry is a prefix. Prefixes are strip()ped. `flag` names the
/// flag for errors (e.g. "--data-path"); throws UserError for an empty list, a negative or zero
/// weight, or weights where some but not all entries parse.
Blend get_blend_from_list(const std::vector<std::string>& list, const std::string& flag = "--data-path");

/// Megatron's --split default when --data-path is given without --split (arguments.py); the raw
/// string, spaces included, enters the cache hash.
inline constexpr const char* kLegacyDefaultSplit = "969, 30, 1";

/// The data-path flags of pretrain_gpt (megatron/training/utils: get_blend_and_blend_per_split).
struct DataPathArgs {
  std::optional<std::vector<std::string>> data_path;        ///< --data-path
  std::optional<std::string> data_args_path;                ///< --data-args-path (file, whitespace-split)
  std::optional<std::vector<std::string>> train_data_path;  ///< --train-data-path
  std::optional<std::vector<std::string>> valid_data_path;  ///< --valid-data-path
  std::optional<std::vector<std::string>> test_data_path;   ///< --test-data-path
  std::optional<std::string> per_split_data_args_path;      ///< --per-split-data-args-path (JSON)
};
/// (blend, blend_per_split) as Megatron derives them: --data-path/--data-args-path give `blend`;
/// otherwise any per-split flag gives `blend_per_split` (missing splits nullopt); neither -> mock.
/// Throws UserError naming the flag or file on an unreadable file, bad JSON, or both kinds given.
std::pair<std::optional<Blend>, std::optional<std::array<std::optional<Blend>, 3>>> get_blend_and_blend_per_split(
    const DataPathArgs& args);

/// Python repr() of a float (shortest round-trip digits; exponent form below 1e-4 and from 1e16).
std::string python_float_repr(double v);
/// Lower-case hex MD5 of `s`.
std::string md5_hex(const std::string& s);

/// A minimal ordered JSON value, enough to reproduce Python's json.dumps(obj, indent=4) byte for
/// byte (keys keep insertion order; floats print as Python repr; strings are ensure_ascii).
struct JsonValue {
  enum class Kind { kNull, kInt, kFloat, kString, kList, kObject } kind = Kind::kNull;
  int64_t i = 0;
  double f = 0.0;
  std::string s;
  std::vector<JsonValue> list;
  std::vector<std::pair<std::string, JsonValue>> object;

  static JsonValue null() { return {}; }
  static JsonValue integer(int64_t v) { JsonValue j; j.kind = Kind::kInt; j.i = v; return j; }
  static JsonValue real(double v) { JsonValue j; j.kind = Kind::kFloat; j.f = v; return j; }
  static JsonValue string(std::string v) { JsonValue j; j.kind = Kind::kString; j.s = std::move(v); return j; }
  static JsonValue make_list() { JsonValue j; j.kind = Kind::kList; return j; }
  static JsonValue make_object() { JsonValue j; j.kind = Kind::kObject; return j; }
  JsonValue& add(std::string key, JsonValue v) { object.emplace_back(std::move(key), std::move(v)); return *this; }
  JsonValue& push(JsonValue v) { list.push_back(std::move(v)); return *this; }
};
/// json.dumps(v, indent=4) (separators ", " -> "," at line ends and ": ", ensure_ascii=True).
std::string json_dumps_indent4(const JsonValue& v);
/// The split matrix as Megatron's description prints it.
JsonValue split_matrix_json(const SplitMatrix& m);

}  // namespace megatron::datasets
