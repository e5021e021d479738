#include "megatron/core/datasets/preprocess/json_record.h"

#include <simdjson.h>

#include <cstring>

namespace megatron::datasets::preprocess {

namespace {

// ---------------------------------------------------------------------------------------------
// Python-compatible parser (json.loads with its defaults: strict=True, NaN/Infinity allowed,
// duplicate keys -> last wins). Only the requested top-level keys are materialised.
// ---------------------------------------------------------------------------------------------
class PyJson {
 public:
  PyJson(std::string_view s, const std::vector<std::string>& keys, std::vector<KeyValue>& out)
      : s_(s), keys_(keys), out_(out) {}

  std::string run() {
    out_.assign(keys_.size(), KeyValue{});
    if (s_.size() >= 3 && std::memcmp(s_.data(), "\xEF\xBB\xBF", 3) == 0)
      return "Unexpected UTF-8 BOM at column 1";
    ws();
    if (p_ >= s_.size()) return "Expecting value at column " + col() + " (blank line)";
    if (s_[p_] != '{') {
      std::string type;
      if (!value(nullptr, 0, &type)) return err_;
      ws();
      if (p_ < s_.size()) return "Extra data at column " + col();
      return "the record is a JSON " + type + ", not an object";
    }
    if (!object_top()) return err_;
    ws();
    if (p_ < s_.size()) return "Extra data at column " + col();
    return {};
  }

 private:
  std::string col() const { return std::to_string(p_ + 1); }
  bool fail(const std::string& what) {
    if (err_.empty()) err_ = what + " at column " + col();
    return false;
  }
  void ws() {
    while (p_ < s_.size() && (s_[p_] == ' ' || s_[p_] == '\t' || s_[p_] == '\n' || s_[p_] == '\r')) ++p_;
  }
  static void put_utf8(std::string& o, uint32_t c) {
    if (c < 0x80) {
      o += static_cast<char>(c);
    } else if (c < 0x800) {
      o += static_cast<char>(0xC0 | (c >> 6));
      o += static_cast<char>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      o += static_cast<char>(0xE0 | (c >> 12));
      o += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      o += static_cast<char>(0x80 | (c & 0x3F));
    } else {
      o += static_cast<char>(0xF0 | (c >> 18));
      o += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
      o += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      o += static_cast<char>(0x80 | (c & 0x3F));
    }
  }
  bool hex4(uint32_t& v) {
    if (p_ + 4 > s_.size()) return fail("Invalid \\uXXXX escape");
    v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = s_[p_ + i];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= c - '0';
      else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
      else return fail("Invalid \\uXXXX escape");
    }
    p_ += 4;
    return true;
  }
  // At the opening quote. Appends the decoded string to *o if o != nullptr.
  bool string(std::string* o, bool* lone) {
    ++p_;
    for (;;) {
      if (p_ >= s_.size()) return fail("Unterminated string starting");
      unsigned char c = static_cast<unsigned char>(s_[p_]);
      if (c == '"') { ++p_; return true; }
      if (c < 0x20) return fail("Invalid control character");
      if (c != '\\') {
        size_t q = p_ + 1;
        while (q < s_.size() && s_[q] != '"' && s_[q] != '\\' && static_cast<unsigned char>(s_[q]) >= 0x20) ++q;
        if (o) o->append(s_.data() + p_, q - p_);
        p_ = q;
        continue;
      }
      ++p_;
      if (p_ >= s_.size()) return fail("Unterminated string starting");
      char e = s_[p_++];
      char lit = 0;
      switch (e) {
        case '"': lit = '"'; break;
        case '\\': lit = '\\'; break;
        case '/': lit = '/'; break;
        case 'b': lit = '\b'; break;
        case 'f': lit = '\f'; break;
        case 'n': lit = '\n'; break;
        case 'r': lit = '\r'; break;
        case 't': lit = '\t'; break;
        case 'u': {
          uint32_t u = 0;
          if (!hex4(u)) return false;
          if (u >= 0xD800 && u <= 0xDBFF && p_ + 6 <= s_.size() && s_[p_] == '\\' && s_[p_ + 1] == 'u') {
            size_t save = p_;
            p_ += 2;
            uint32_t lo = 0;
            if (!hex4(lo)) return false;
            if (lo >= 0xDC00 && lo <= 0xDFFF) {
              u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
            } else {
              p_ = save;  // lone high surrogate; the next escape is decoded on its own
            }
          }
          if (u >= 0xD800 && u <= 0xDFFF && lone) *lone = true;
          if (o) put_utf8(*o, u);
          continue;
        }
        default: --p_; return fail("Invalid \\escape");
      }
      if (o) *o += lit;
    }
  }
  bool literal(const char* w) {
    size_t n = std::strlen(w);
    if (s_.compare(p_, n, w) == 0) {
      p_ += n;
      return true;
    }
    return false;
  }
  bool number() {
    size_t st = p_;
    if (p_ < s_.size() && s_[p_] == '-') ++p_;
    if (p_ >= s_.size() || !(s_[p_] >= '0' && s_[p_] <= '9')) {
      p_ = st;
      return fail("Expecting value");
    }
    if (s_[p_] == '0') ++p_;
    else while (p_ < s_.size() && s_[p_] >= '0' && s_[p_] <= '9') ++p_;
    if (p_ + 1 < s_.size() && s_[p_] == '.' && s_[p_ + 1] >= '0' && s_[p_ + 1] <= '9') {
      p_ += 2;
      while (p_ < s_.size() && s_[p_] >= '0' && s_[p_] <= '9') ++p_;
    }
    if (p_ < s_.size() && (s_[p_] == 'e' || s_[p_] == 'E')) {
      size_t q = p_ + 1;
      if (q < s_.size() && (s_[q] == '+' || s_[q] == '-')) ++q;
      if (q < s_.size() && s_[q] >= '0' && s_[q] <= '9') {
        while (q < s_.size() && s_[q] >= '0' && s_[q] <= '9') ++q;
        p_ = q;
      }
    }
    return true;
  }
  // Parses any value. If kv != nullptr the value is stored there (top-level requested key).
  bool value(KeyValue* kv, int depth, std::string* type) {
    if (depth > 990) return fail("nesting too deep (Python's recursion limit)");
    ws();
    if (p_ >= s_.size()) return fail("Expecting value");
    char c = s_[p_];
    auto set_other = [&](const char* t) {
      if (type) *type = t;
      if (kv) {
        *kv = KeyValue{};
        kv->kind = KeyValue::Kind::kOther;
        kv->type_name = t;
      }
    };
    if (c == '"') {
      if (type) *type = "string";
      if (kv) {
        *kv = KeyValue{};
        kv->kind = KeyValue::Kind::kString;
        kv->strings.emplace_back();
        return string(&kv->strings.back(), &kv->lone_surrogate);
      }
      return string(nullptr, nullptr);
    }
    if (c == '{') {
      set_other("object");
      ++p_;
      ws();
      if (p_ < s_.size() && s_[p_] == '}') { ++p_; return true; }
      for (;;) {
        ws();
        if (p_ >= s_.size() || s_[p_] != '"') return fail("Expecting property name enclosed in double quotes");
        if (!string(nullptr, nullptr)) return false;
        ws();
        if (p_ >= s_.size() || s_[p_] != ':') return fail("Expecting ':' delimiter");
        ++p_;
        if (!value(nullptr, depth + 1, nullptr)) return false;
        ws();
        if (p_ < s_.size() && s_[p_] == ',') { ++p_; continue; }
        if (p_ < s_.size() && s_[p_] == '}') { ++p_; return true; }
        return fail("Expecting ',' delimiter");
      }
    }
    if (c == '[') {
      if (type) *type = "array";
      KeyValue list;
      list.kind = KeyValue::Kind::kStringList;
      ++p_;
      ws();
      if (p_ < s_.size() && s_[p_] == ']') {
        ++p_;
        if (kv) *kv = std::move(list);
        return true;
      }
      for (;;) {
        ws();
        if (kv && p_ < s_.size() && s_[p_] == '"') {
          list.strings.emplace_back();
          if (!string(&list.strings.back(), &list.lone_surrogate)) return false;
        } else {
          std::string t;
          if (!value(nullptr, depth + 1, &t)) return false;
          if (list.kind == KeyValue::Kind::kStringList) {
            list.kind = KeyValue::Kind::kOther;
            list.type_name = "array containing a " + t;
          }
        }
        ws();
        if (p_ < s_.size() && s_[p_] == ',') { ++p_; continue; }
        if (p_ < s_.size() && s_[p_] == ']') { ++p_; break; }
        return fail("Expecting ',' delimiter");
      }
      if (kv) *kv = std::move(list);
      return true;
    }
    if (literal("true") || literal("false")) { set_other("boolean"); return true; }
    if (literal("null")) { set_other("null"); return true; }
    if (literal("NaN") || literal("Infinity") || literal("-Infinity")) { set_other("number"); return true; }
    if (c == '-' || (c >= '0' && c <= '9')) {
      if (!number()) return false;
      set_other("number");
      return true;
    }
    return fail("Expecting value");
  }
  bool object_top() {
    ++p_;
    ws();
    if (p_ < s_.size() && s_[p_] == '}') { ++p_; return true; }
    std::string key;
    for (;;) {
      ws();
      if (p_ >= s_.size() || s_[p_] != '"') return fail("Expecting property name enclosed in double quotes");
      key.clear();
      bool lone = false;
      if (!string(&key, &lone)) return false;
      ws();
      if (p_ >= s_.size() || s_[p_] != ':') return fail("Expecting ':' delimiter");
      ++p_;
      KeyValue* target = nullptr;
      if (!lone)
        for (size_t i = 0; i < keys_.size(); ++i)
          if (keys_[i] == key) target = &out_[i];  // a later duplicate overwrites: last wins
      if (!value(target, 1, nullptr)) return false;
      if (target != nullptr)  // a key requested twice gets the value at every position (as simdjson's path)
        for (size_t i = 0; i < keys_.size(); ++i)
          if (keys_[i] == key && &out_[i] != target) out_[i] = *target;
      ws();
      if (p_ < s_.size() && s_[p_] == ',') { ++p_; continue; }
      if (p_ < s_.size() && s_[p_] == '}') { ++p_; return true; }
      return fail("Expecting ',' delimiter");
    }
  }

  std::string_view s_;
  const std::vector<std::string>& keys_;
  std::vector<KeyValue>& out_;
  size_t p_ = 0;
  std::string err_;
};

const char* dom_type_name(simdjson::dom::element_type t) {
  using T = simdjson::dom::element_type;
  switch (t) {
    case T::ARRAY: return "array";
    case T::OBJECT: return "object";
    case T::INT64:
    case T::UINT64:
    case T::DOUBLE: return "number";
    case T::STRING: return "string";
    case T::BOOL: return "boolean";
    case T::NULL_VALUE: return "null";
  }
  return "value";
}

}  // namespace

std::string parse_record_python_compatible(std::string_view line, const std::vector<std::string>& keys,
                                           std::vector<KeyValue>& out) {
  if (!simdjson::validate_utf8(line.data(), line.size()))
    return "invalid UTF-8 (Python cannot decode the line)";
  return PyJson(line, keys, out).run();
}

struct JsonRecordParser::Impl {
  std::vector<std::string> keys;
  simdjson::dom::parser parser;
};

JsonRecordParser::JsonRecordParser(std::vector<std::string> keys) : impl_(std::make_unique<Impl>()) {
  impl_->keys = std::move(keys);
}
JsonRecordParser::~JsonRecordParser() = default;

std::string JsonRecordParser::parse(std::string_view line, std::vector<KeyValue>& out) {
  const auto& keys = impl_->keys;
  // simdjson does not reject raw control characters inside strings, Python does: lines holding
  // any byte < 0x20 (TAB included: legal between tokens, illegal inside a string) take the
  // exact path.
  bool ctrl = false;
  for (char c : line)
    if (static_cast<unsigned char>(c) < 0x20) { ctrl = true; break; }
  simdjson::dom::element root;
  if (ctrl || impl_->parser.parse(line.data(), line.size(), false).get(root) != simdjson::SUCCESS ||
      !root.is_object())
    return parse_record_python_compatible(line, keys, out);
  out.assign(keys.size(), KeyValue{});
  simdjson::dom::object obj = root.get_object().value_unsafe();
  for (auto field : obj) {
    for (size_t i = 0; i < keys.size(); ++i) {
      if (field.key != keys[i]) continue;
      KeyValue& kv = out[i];  // a later duplicate overwrites: last wins
      kv = KeyValue{};
      simdjson::dom::element v = field.value;
      if (v.is_string()) {
        kv.kind = KeyValue::Kind::kString;
        kv.strings.emplace_back(v.get_string().value_unsafe());
      } else if (v.is_array()) {
        kv.kind = KeyValue::Kind::kStringList;
        simdjson::dom::array arr = v.get_array().value_unsafe();
        for (auto e : arr) {
          if (!e.is_string()) {
            kv.kind = KeyValue::Kind::kOther;
            kv.type_name = std::string("array containing a ") + dom_type_name(e.type());
            kv.strings.clear();
            break;
          }
          kv.strings.emplace_back(e.get_string().value_unsafe());
        }
      } else {
        kv.kind = KeyValue::Kind::kOther;
        kv.type_name = dom_type_name(v.type());
      }
    }
  }
  return {};
}

}  // namespace megatron::datasets::preprocess
