#include "megatron/core/datasets/utils.h"

#include <openssl/evp.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "megatron/core/utils/errors.h"

namespace megatron::datasets {

const char* split_name(Split s) {
  switch (s) {
    case Split::train: return "train";
    case Split::valid: return "valid";
    case Split::test: return "test";
  }
  return "?";
}

namespace {
double pairwise_sum(const double* a, int64_t n) {
  if (n < 8) {
    double res = 0.;
    for (int64_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    int64_t i;
    for (i = 8; i < n - (n % 8); i += 8)
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  int64_t n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}
}  // namespace

double numpy_sum(const std::vector<double>& v) { return pairwise_sum(v.data(), static_cast<int64_t>(v.size())); }

std::vector<double> normalize(const std::vector<double>& weights) {
  const double s = numpy_sum(weights);
  std::vector<double> out(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) out[i] = weights[i] / s;
  return out;
}

std::vector<double> parse_and_normalize_split(const std::string& split) {
  std::vector<double> v;
  size_t i = 0;
  while (i < split.size()) {
    if ((split[i] >= '0' && split[i] <= '9') || split[i] == '.') {
      size_t j = i;
      while (j < split.size() && ((split[j] >= '0' && split[j] <= '9') || split[j] == '.')) ++j;
      const std::string tok = split.substr(i, j - i);
      char* end = nullptr;
      const double d = std::strtod(tok.c_str(), &end);
      if (end != tok.c_str() + tok.size() || tok == ".")
        user_error("--split '", split, "': '", tok, "' is not a number; give e.g. --split 969,30,1");
      v.push_back(d);
      i = j;
    } else {
      ++i;
    }
  }
  if (v.size() > 3) user_error("--split '", split, "' has ", v.size(), " numbers; give at most 3 (train,valid,test)");
  while (v.size() < 3) v.push_back(0.0);
  if (numpy_sum(v) <= 0.0) user_error("--split '", split, "' sums to zero; give e.g. --split 969,30,1");
  return normalize(v);
}

SplitMatrix convert_split_vector_to_split_matrix(const std::vector<double>& vec) {
  SplitMatrix m;
  // expansion = [0 (int), a, a+b, a+b+c] (left-to-right float adds starting from integer 0)
  double lo = 0.0;
  bool lo_int = true;
  for (int k = 0; k < 3; ++k) {
    const double hi = lo + vec[k];
    if (!(hi <= lo)) m[k] = SplitBookend{lo, hi, lo_int};
    lo = hi;
    lo_int = false;
  }
  return m;
}

std::pair<int64_t, int64_t> split_range(const SplitBookend& b, int64_t n) {
  // Python round() on a float: ties to even; nearbyint uses the current rounding mode, which
  // is round-to-nearest-even unless someone changed it.
  const int64_t beg = static_cast<int64_t>(std::nearbyint(b.lo * static_cast<double>(n)));
  const int64_t end = static_cast<int64_t>(std::nearbyint(b.hi * static_cast<double>(n)));
  return {beg, end};
}

namespace {
std::string strip(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}
// Python float(str) for the forms a weight takes (strip, then a full strtod parse).
std::optional<double> parse_python_float(const std::string& raw) {
  const std::string s = strip(raw);
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  const double d = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  return d;
}
}  // namespace

Blend get_blend_from_list(const std::vector<std::string>& list, const std::string& flag) {
  if (list.empty()) user_error(flag, " is empty; give one or more dataset prefixes, optionally with weights");
  Blend b;
  bool weighted = false;
  std::vector<double> w;
  if (list.size() % 2 == 0) {
    // Megatron: any(is_none) then assert all(is_none) on the same iterator, i.e. entries after
    // the first non-float must all be non-floats too; any non-float -> all entries are prefixes.
    std::optional<size_t> first_bad;
    for (size_t i = 0; i < list.size(); i += 2) {
      auto d = parse_python_float(list[i]);
      if (d && !first_bad) {
        w.push_back(*d);
      } else if (!d && !first_bad) {
        first_bad = i;
      } else if (d && first_bad) {
        user_error(flag, ": '", list[i], "' looks like a weight but '", list[*first_bad],
                   "' does not; give either 'w1 prefix1 w2 prefix2 ...' or only prefixes");
      }
    }
    weighted = !first_bad;
  }
  if (weighted) {
    for (size_t i = 0; i < list.size(); i += 2) {
      const double wi = w[i / 2];
      if (!(wi > 0.0) || !std::isfinite(wi))
        user_error(flag, ": weight '", list[i], "' of dataset '", strip(list[i + 1]),
                   "' must be a positive number");
      b.prefixes.push_back(strip(list[i + 1]));
    }
    b.weights = w;
  } else {
    for (const auto& p : list) b.prefixes.push_back(strip(p));
  }
  return b;
}

namespace {
std::string read_text(const std::string& path, const char* flag) {
  std::ifstream f(path, std::ios::binary);
  if (!f) user_error(flag, " ", path, ": cannot open (", std::strerror(errno), ")");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
std::vector<std::string> split_ws(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream is(s);
  std::string w;
  while (is >> w) out.push_back(w);
  return out;
}
}  // namespace

std::pair<std::optional<Blend>, std::optional<std::array<std::optional<Blend>, 3>>> get_blend_and_blend_per_split(
    const DataPathArgs& a) {
  const bool use_data_path = a.data_path || a.data_args_path;
  const bool use_per_split = a.train_data_path || a.valid_data_path || a.test_data_path || a.per_split_data_args_path;
  if (use_data_path && use_per_split)
    user_error("--data-path/--data-args-path cannot be combined with --train-data-path/--valid-data-path/"
               "--test-data-path/--per-split-data-args-path");
  if (use_data_path) {
    if (a.data_args_path) {
      if (a.data_path) user_error("give either --data-path or --data-args-path, not both");
      return {get_blend_from_list(split_ws(read_text(*a.data_args_path, "--data-args-path")), "--data-args-path"),
              std::nullopt};
    }
    return {get_blend_from_list(*a.data_path, "--data-path"), std::nullopt};
  }
  if (!use_per_split) return {std::nullopt, std::nullopt};
  std::array<std::optional<Blend>, 3> per;
  if (a.per_split_data_args_path) {
    const std::string& path = *a.per_split_data_args_path;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_text(path, "--per-split-data-args-path"));
    } catch (const nlohmann::json::exception& e) {
      user_error("--per-split-data-args-path ", path, ": not valid JSON (", e.what(), ")");
    }
    const char* keys[3] = {"train", "valid", "test"};
    for (int i = 0; i < 3; ++i) {
      if (!j.contains(keys[i]))
        user_error("--per-split-data-args-path ", path, ": missing key \"", keys[i], "\"");
      const auto& v = j[keys[i]];
      std::vector<std::string> list;
      if (v.is_string()) list = split_ws(v.get<std::string>());
      else if (v.is_array()) for (const auto& e : v) list.push_back(e.is_string() ? e.get<std::string>() : e.dump());
      else user_error("--per-split-data-args-path ", path, ": \"", keys[i], "\" must be a string or a list");
      per[i] = get_blend_from_list(list, std::string("--per-split-data-args-path ") + keys[i]);
    }
  } else {
    const std::optional<std::vector<std::string>>* lists[3] = {&a.train_data_path, &a.valid_data_path, &a.test_data_path};
    const char* flags[3] = {"--train-data-path", "--valid-data-path", "--test-data-path"};
    for (int i = 0; i < 3; ++i)
      if (*lists[i]) per[i] = get_blend_from_list(**lists[i], flags[i]);
  }
  return {std::nullopt, per};
}

std::string python_float_repr(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";  // json.dumps spelling
  if (v == 0.0) return std::signbit(v) ? "-0.0" : "0.0";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  // sci = [-]d[.ddd]e[+-]XX
  bool neg = false;
  size_t p = 0;
  if (sci[0] == '-') {
    neg = true;
    p = 1;
  }
  const size_t e = sci.find('e');
  std::string digits;
  for (size_t k = p; k < e; ++k)
    if (sci[k] != '.') digits += sci[k];
  const int exp10 = std::atoi(sci.c_str() + e + 1);
  const int decpt = exp10 + 1;  // position of the decimal point relative to digits
  std::string out;
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out = "0." + std::string(-decpt, '0') + digits;
    } else if (decpt >= static_cast<int>(digits.size())) {
      out = digits + std::string(decpt - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, decpt) + "." + digits.substr(decpt);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += eb;
  }
  return neg ? "-" + out : out;
}

std::string md5_hex(const std::string& s) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(s.data(), s.size(), md, &len, EVP_md5(), nullptr) != 1)
    throw InternalError("EVP_Digest(md5) failed");
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < len; ++i) {
    out += hex[md[i] >> 4];
    out += hex[md[i] & 15];
  }
  return out;
}

namespace {
void dump_string(const std::string& s, std::string& out) {
  out += '"';
  size_t i = 0;
  auto u16 = [&](uint32_t c) {
    char b[16];
    std::snprintf(b, sizeof(b), "\\u%04x", c);
    out += b;
  };
  while (i < s.size()) {
    unsigned char c = s[i];
    uint32_t cp;
    int n;
    if (c < 0x80) { cp = c; n = 1; }
    else if ((c >> 5) == 6) { cp = c & 0x1f; n = 2; }
    else if ((c >> 4) == 14) { cp = c & 0x0f; n = 3; }
    else { cp = c & 0x07; n = 4; }
    for (int k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    i += n;
    switch (cp) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (cp < 0x20 || cp >= 0x7f) {
      if (cp >= 0x10000) {
        const uint32_t v = cp - 0x10000;
        u16(0xd800 | (v >> 10));
        u16(0xdc00 | (v & 0x3ff));
      } else {
        u16(cp);
      }
    } else {
      out += static_cast<char>(cp);
    }
  }
  out += '"';
}

void dump(const JsonValue& v, int level, std::string& out) {
  using K = JsonValue::Kind;
  const std::string ind(4 * (level + 1), ' ');
  const std::string ind0(4 * level, ' ');
  switch (v.kind) {
    case K::kNull: out += "null"; break;
    case K::kInt: out += std::to_string(v.i); break;
    case K::kFloat: out += python_float_repr(v.f); break;
    case K::kString: dump_string(v.s, out); break;
    case K::kList:
      if (v.list.empty()) { out += "[]"; break; }
      out += "[\n";
      for (size_t k = 0; k < v.list.size(); ++k) {
        out += ind;
        dump(v.list[k], level + 1, out);
        out += k + 1 < v.list.size() ? ",\n" : "\n";
      }
      out += ind0 + "]";
      break;
    case K::kObject:
      if (v.object.empty()) { out += "{}"; break; }
      out += "{\n";
      for (size_t k = 0; k < v.object.size(); ++k) {
        out += ind;
        dump_string(v.object[k].first, out);
        out += ": ";
        dump(v.object[k].second, level + 1, out);
        out += k + 1 < v.object.size() ? ",\n" : "\n";
      }
      out += ind0 + "}";
      break;
  }
}
}  // namespace

std::string json_dumps_indent4(const JsonValue& v) {
  std::string out;
  dump(v, 0, out);
  return out;
}

JsonValue split_matrix_json(const SplitMatrix& m) {
  JsonValue l = JsonValue::make_list();
  for (const auto& b : m) {
    if (!b) {
      l.push(JsonValue::null());
      continue;
    }
    JsonValue p = JsonValue::make_list();
    p.push(b->lo_is_int ? JsonValue::integer(static_cast<int64_t>(b->lo)) : JsonValue::real(b->lo));
    p.push(JsonValue::real(b->hi));
    l.push(std::move(p));
  }
  return l;
}

}  // namespace megatron::datasets
