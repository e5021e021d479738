// HuggingFaceTokenizer and GPT2BPETokenizer: byte-level BPE from tokenizer.json or
// vocab.json + merges.txt.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <simdjson.h>
#include <sstream>
#include <unordered_map>

#include "megatron/core/tokenizers/text_tokenizers.h"
#include "megatron/core/utils/errors.h"

namespace megatron::tokenizers {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string python_list_repr(const std::vector<std::string>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    const bool dq = v[i].find('\'') != std::string::npos && v[i].find('"') == std::string::npos;
    const char q = dq ? '"' : '\'';
    s += q;
    for (char c : v[i]) {
      if (c == '\\') s += "\\\\";
      else if (c == q) s += std::string("\\") + q;
      else if (c == '\n') s += "\\n";
      else if (c == '\t') s += "\\t";
      else if (c == '\r') s += "\\r";
      else s += c;
    }
    s += q;
  }
  return s + "]";
}

std::string python_str(const std::optional<std::string>& v) { return v ? *v : "None"; }

namespace {

json load_json(const fs::path& p, const char* what) {
  std::ifstream f(p, std::ios::binary);
  if (!f) user_error(what, ": cannot open ", p.string());
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    user_error(what, ": ", p.string(), " is not valid JSON: ", e.what());
  }
}

// Token string of a tokenizer_config.json entry: "tok" or {"content": "tok", ...}.
std::optional<std::string> config_token(const json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content")) return (*it)["content"].get<std::string>();
  return std::nullopt;
}

struct Loader {
  std::string where;  // file named in errors
  BpePipelineSpec spec;
  BytesMap vocab;  // vocab key (byte-level form) -> id
  bool byte_level = false;

  void load_vocab(const json& v) {
    if (!v.is_object()) user_error(where, ": model.vocab must be an object {token: id}");
    spec.model = std::make_unique<BytePairModel>();
    std::string bytes;
    for (auto it = v.begin(); it != v.end(); ++it) {
      int32_t id = it.value().get<int32_t>();
      vocab.insert(it.key(), id);
      if (byte_level_decode(it.key(), bytes)) spec.model->add_token(bytes, id);
    }
  }
  // Same, straight from simdjson's DOM (tokenizer.json's big arrays; nlohmann took ~1 s for
  // LLaMA-3's 9 MB file).
  void load_vocab(simdjson::dom::element v) {
    simdjson::dom::object obj;
    if (v.get_object().get(obj)) user_error(where, ": model.vocab must be an object {token: id}");
    spec.model = std::make_unique<BytePairModel>();
    spec.model->reserve(obj.size(), 0);
    vocab.reserve(obj.size());
    std::string bytes;
    for (auto field : obj) {
      int64_t id;
      if (field.value.get_int64().get(id) || id < INT32_MIN || id > INT32_MAX)
        user_error(where, ": model.vocab['", std::string(field.key), "'] must be an integer id");
      vocab.insert(field.key, static_cast<int32_t>(id));
      if (byte_level_decode(field.key, bytes)) spec.model->add_token(bytes, static_cast<int32_t>(id));
    }
  }
  void load_merges(simdjson::dom::element m) {
    simdjson::dom::array arr;
    if (m.get_array().get(arr)) user_error(where, ": model.merges must be a list");
    spec.model->reserve(0, arr.size());
    size_t rank = 0;
    for (auto e : arr) {
      std::string_view s, a, b;
      simdjson::dom::array pair;
      if (!e.get_string().get(s)) {
        size_t sp = s.find(' ');
        if (sp == std::string::npos) user_error(where, ": merge ", rank, " '", std::string(s), "' is not 'a b'");
        add_merge(s.substr(0, sp), s.substr(sp + 1), rank);
      } else if (!e.get_array().get(pair) && pair.size() == 2 && !pair.at(0).get_string().get(a) &&
                 !pair.at(1).get_string().get(b)) {
        add_merge(a, b, rank);
      } else {
        user_error(where, ": merge ", rank, " must be \"a b\" or [a, b]");
      }
      ++rank;
    }
  }
  int32_t vocab_id(std::string_view tok, size_t merge_line) const {
    int32_t id = vocab.find(tok);
    if (id < 0) user_error(where, ": merge ", merge_line, " uses '", std::string(tok), "', which is not in the vocabulary");
    return id;
  }
  void add_merge(std::string_view a, std::string_view b, size_t rank) {
    ab.assign(a);
    ab.append(b);
    spec.model->add_merge(vocab_id(a, rank), vocab_id(b, rank), static_cast<uint32_t>(rank), vocab_id(ab, rank));
  }
  std::string ab;  // scratch for a + b
  void load_merges(const json& m) {
    if (!m.is_array()) user_error(where, ": model.merges must be a list");
    size_t rank = 0;
    for (const auto& e : m) {
      if (e.is_string()) {
        std::string_view s = e.get_ref<const std::string&>();
        size_t sp = s.find(' ');
        if (sp == std::string::npos) user_error(where, ": merge ", rank, " '", std::string(s), "' is not 'a b'");
        add_merge(s.substr(0, sp), s.substr(sp + 1), rank);
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        add_merge(e[0].get_ref<const std::string&>(), e[1].get_ref<const std::string&>(), rank);
      } else {
        user_error(where, ": merge ", rank, " must be \"a b\" or [a, b]");
      }
      ++rank;
    }
  }
  void normalizer(const json& n) {
    if (n.is_null()) return;
    std::string t = n.value("type", "");
    if (t == "NFC") {
      spec.nfc = true;
    } else if (t == "Sequence") {
      for (const auto& x : n["normalizers"]) normalizer(x);
    } else {
      user_error(where, ": normalizer type '", t, "' is not supported (supported: NFC, Sequence)");
    }
  }
  void pre_tokenizer(const json& p) {
    if (p.is_null()) user_error(where, ": a byte-level BPE needs a pre_tokenizer (got null)");
    std::string t = p.value("type", "");
    if (t == "Sequence") {
      for (const auto& x : p["pretokenizers"]) pre_tokenizer(x);
    } else if (t == "ByteLevel") {
      byte_level = true;
      if (p.value("add_prefix_space", false)) spec.add_prefix_space = true;
      if (p.value("use_regex", true)) spec.stages.push_back(PreTokenizerPattern::kGpt2);
    } else if (t == "Split") {
      const json& pat = p["pattern"];
      if (!pat.contains("Regex"))
        user_error(where, ": Split pre-tokenizer with a String pattern is not supported");
      std::string re = pat["Regex"].get<std::string>();
      std::string behavior = p.value("behavior", "");
      bool invert = p.value("invert", false);
      if (!((behavior == "Isolated" && !invert) || (behavior == "Removed" && invert)))
        user_error(where, ": Split behavior '", behavior, "' invert=", invert,
                   " is not supported (Isolated, or Removed with invert=true)");
      auto pp = pattern_from_regex(re);
      if (!pp)
        user_error(where, ": Split regex is not one of the known pre-tokenizer patterns (GPT-2, cl100k/LLaMA-3, ",
                   "Qwen2, o200k, tiktoken v1/v2): ", re);
      spec.stages.push_back(*pp);
    } else {
      user_error(where, ": pre_tokenizer type '", t, "' is not supported (supported: ByteLevel, Split, Sequence)");
    }
  }
  int64_t special_id(const json& special_tokens, const std::string& name) {
    if (!special_tokens.contains(name)) user_error(where, ": post_processor names unknown special token ", name);
    const json& ids = special_tokens[name]["ids"];
    if (ids.size() != 1) user_error(where, ": post_processor special token ", name, " must map to one id");
    return ids[0].get<int64_t>();
  }
  void post_processor(const json& p) {
    if (p.is_null()) return;
    std::string t = p.value("type", "");
    if (t == "Sequence") {
      for (const auto& x : p["processors"]) post_processor(x);
    } else if (t == "ByteLevel") {
      // offsets only
    } else if (t == "TemplateProcessing") {
      bool after = false;
      for (const auto& item : p["single"]) {
        if (item.contains("Sequence")) {
          after = true;
        } else if (item.contains("SpecialToken")) {
          int64_t id = special_id(p["special_tokens"], item["SpecialToken"]["id"].get<std::string>());
          (after ? spec.suffix_ids : spec.prefix_ids).push_back(id);
        }
      }
    } else if (t == "RobertaProcessing" || t == "BertProcessing") {
      spec.prefix_ids.push_back(p["cls"][1].get<int64_t>());
      spec.suffix_ids.push_back(p["sep"][1].get<int64_t>());
    } else {
      user_error(where, ": post_processor type '", t, "' is not supported");
    }
  }
  int64_t token_to_id(const std::string& tok) const {
    for (const auto& a : spec.added_tokens)
      if (a.content == tok) return a.id;
    return vocab.find(tok);
  }
};

void check_bpe_options(const Loader& l, const json& m) {
  auto nonempty = [&](const char* k) { return m.contains(k) && m[k].is_string() && !m[k].get<std::string>().empty(); };
  if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() != 0.0)
    user_error(l.where, ": BPE dropout must be null for deterministic preprocessing");
  if (nonempty("continuing_subword_prefix") || nonempty("end_of_word_suffix"))
    user_error(l.where, ": BPE continuing_subword_prefix/end_of_word_suffix are not supported");
}

// Info common to the HF-library types (eod, pad, vocab size, Megatron identifiers).
BpeTokenizer::Info hf_info(const Loader& l, const json& tcfg, int64_t vocab_size) {
  BpeTokenizer::Info info;
  info.vocab_size = vocab_size;
  auto eos = config_token(tcfg, "eos_token");
  if (!eos) eos = config_token(tcfg, "sep_token");
  info.eod = eos ? l.token_to_id(*eos) : -1;
  if (auto pad = config_token(tcfg, "pad_token")) {
    int64_t id = l.token_to_id(*pad);
    if (id >= 0) info.pad = id;
  }
  return info;
}

int64_t count_vocab(const Loader& l) {
  int64_t n = static_cast<int64_t>(l.vocab.size());
  for (const auto& a : l.spec.added_tokens)
    if (l.vocab.find(a.content) < 0) ++n;
  return n;
}

// vocab.json + merges.txt (GPT-2 layout) into a loader with the GPT-2 byte-level pre-tokenizer.
void load_vocab_merges(Loader& l, const fs::path& vocab_file, const fs::path& merge_file) {
  l.where = vocab_file.string();
  simdjson::dom::parser sj_parser;
  simdjson::padded_string sj_buf;
  simdjson::dom::element sj_root;
  if (!simdjson::padded_string::load(vocab_file.string()).get(sj_buf) && !sj_parser.parse(sj_buf).get(sj_root)) {
    l.load_vocab(sj_root);
  } else {
    json v = load_json(vocab_file, "--vocab-file");
    l.load_vocab(v);
  }
  std::ifstream f(merge_file, std::ios::binary);
  if (!f) user_error("--merge-file: cannot open ", merge_file.string());
  l.where = merge_file.string();
  std::string line;
  size_t rank = 0, lineno = 0;
  while (std::getline(f, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (lineno == 1 && line.rfind("#version", 0) == 0) continue;
    if (line.empty()) continue;
    size_t sp = line.find(' ');
    if (sp == std::string::npos) user_error(merge_file.string(), ":", lineno, ": merge line is not 'a b'");
    std::string_view lv = line;
    l.add_merge(lv.substr(0, sp), lv.substr(sp + 1), rank++);
  }
  l.byte_level = true;
  l.spec.stages = {PreTokenizerPattern::kGpt2};
}

std::unique_ptr<MegatronTokenizer> load_huggingface_tokenizer(const TokenizerConfig& cfg) {
  fs::path p = *cfg.tokenizer_model;
  if (!fs::exists(p)) user_error("--tokenizer-model ", p.string(), " does not exist");
  fs::path dir = fs::is_directory(p) ? p : p.parent_path();
  fs::path tj = fs::is_directory(p) ? p / "tokenizer.json" : p;
  json tcfg = json::object();
  if (fs::exists(dir / "tokenizer_config.json")) tcfg = load_json(dir / "tokenizer_config.json", "tokenizer_config.json");

  Loader l;
  if (fs::exists(tj)) {
    l.where = tj.string();
    // simdjson for the whole file; the small parts (everything but model.vocab / model.merges)
    // are handed to nlohmann::json. Files simdjson rejects (e.g. integers beyond 64 bits) take
    // the nlohmann path for all of it.
    simdjson::dom::parser sj_parser;
    simdjson::padded_string sj_buf;
    simdjson::dom::element sj_root, sj_vocab, sj_merges;
    bool fast = false;
    json j;
    simdjson::dom::object root_obj, model_obj;
    if (!simdjson::padded_string::load(tj.string()).get(sj_buf) && !sj_parser.parse(sj_buf).get(sj_root) &&
        !sj_root.get_object().get(root_obj)) {
      fast = true;
      j = json::object();
      for (auto field : root_obj) {
        const std::string key(field.key);
        if (key == "model" && !field.value.get_object().get(model_obj)) {
          json mj = json::object();
          for (auto mf : model_obj) {
            if (mf.key == "vocab") sj_vocab = mf.value;
            else if (mf.key == "merges") sj_merges = mf.value;
            else mj[std::string(mf.key)] = json::parse(simdjson::to_string(mf.value));
          }
          j[key] = std::move(mj);
        } else {
          j[key] = json::parse(simdjson::to_string(field.value));
        }
      }
    } else {
      j = load_json(tj, "tokenizer.json");
    }
    const json& m = j["model"];
    if (m.value("type", "") != "BPE")
      user_error(l.where, ": model type '", m.value("type", ""), "' is not supported (only byte-level BPE)");
    check_bpe_options(l, m);
    l.normalizer(j["normalizer"]);
    l.pre_tokenizer(j["pre_tokenizer"]);
    if (!l.byte_level)
      user_error(l.where, ": only byte-level BPE tokenizers (a ByteLevel pre-tokenizer) are supported; ",
                 "use --tokenizer-type SentencePieceTokenizer for SentencePiece models");
    if (l.spec.stages.empty()) user_error(l.where, ": the pre-tokenizer has no splitting regex");
    if (fast) {
      l.load_vocab(sj_vocab);
      l.load_merges(sj_merges);
    } else {
      l.load_vocab(m["vocab"]);
      l.load_merges(m["merges"]);
    }
    l.spec.model->set_ignore_merges(m.value("ignore_merges", false));
    for (const auto& a : j["added_tokens"]) {
      AddedToken t;
      t.content = a["content"].get<std::string>();
      t.id = a["id"].get<int64_t>();
      t.special = a.value("special", false);
      t.single_word = a.value("single_word", false);
      t.lstrip = a.value("lstrip", false);
      t.rstrip = a.value("rstrip", false);
      l.spec.added_tokens.push_back(t);
    }
    l.post_processor(j["post_processor"]);
  } else if (fs::exists(dir / "vocab.json") && fs::exists(dir / "merges.txt")) {
    load_vocab_merges(l, dir / "vocab.json", dir / "merges.txt");
    // transformers' GPT2TokenizerFast registers the config's special tokens as added tokens.
    for (const char* k : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
      auto tok = config_token(tcfg, k);
      if (!tok) continue;
      bool have = false;
      for (const auto& a : l.spec.added_tokens) have |= a.content == *tok;
      int32_t id = l.vocab.find(*tok);
      if (!have && id >= 0) l.spec.added_tokens.push_back({*tok, id, true, false, false, false});
    }
  } else {
    user_error("--tokenizer-model ", p.string(), ": no tokenizer.json (nor vocab.json + merges.txt) found");
  }
  // --tokenizer-special-tokens: added as special tokens when new (transformers add_special_tokens).
  for (const auto& s : cfg.tokenizer_special_tokens) {
    if (l.token_to_id(s) >= 0) continue;
    l.spec.added_tokens.push_back({s, count_vocab(l), true, false, false, false});
  }
  l.spec.add_special_tokens = cfg.tokenizer_hf_include_special_tokens;
  auto info = hf_info(l, tcfg, count_vocab(l));
  info.identifiers = {
      {"class", "megatron.core.tokenizers.text.text_tokenizer.MegatronTokenizerText"},
      {"tokenizer_path", *cfg.tokenizer_model},
      {"chat_template", "None"},
      {"vocab_file", python_str(cfg.vocab_file)},
      {"merges_file", python_str(cfg.merge_file)},
      {"additional_special_tokens", python_list_repr(cfg.tokenizer_special_tokens)},
      {"use_fast", "True"},
      {"trust_remote_code", "False"},
      {"include_special_tokens", cfg.tokenizer_hf_include_special_tokens ? "True" : "False"},
      {"use_gigatoken", "False"}};
  return std::make_unique<BpeTokenizer>(std::move(l.spec), std::move(info));
}

}  // namespace

std::unique_ptr<MegatronTokenizer> make_huggingface_tokenizer(const TokenizerConfig& cfg) {
  if (!cfg.tokenizer_model) user_error("--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model (folder or tokenizer.json)");
  // A field of tokenizer.json / tokenizer_config.json that is missing or of the wrong type makes
  // nlohmann::json throw (e.g. "cannot use value() with null" for a file without "model"); that
  // is bad input, not a bug, so it becomes one user error line naming the folder.
  try {
    return load_huggingface_tokenizer(cfg);
  } catch (const json::exception& e) {
    user_error("--tokenizer-model ", *cfg.tokenizer_model, ": a field of tokenizer.json or tokenizer_config.json is "
               "missing or of the wrong type (", e.what(), "); give a Hugging Face byte-level BPE tokenizer");
  }
}

std::unique_ptr<MegatronTokenizer> make_gpt2_bpe_tokenizer(const TokenizerConfig& cfg) {
  if (!cfg.vocab_file || !cfg.merge_file)
    user_error("--tokenizer-type GPT2BPETokenizer needs --vocab-file (vocab.json/encoder.json) and --merge-file ",
               "(merges.txt/vocab.bpe); files are not downloaded");
  Loader l;
  load_vocab_merges(l, *cfg.vocab_file, *cfg.merge_file);
  const std::string eot = "<|endoftext|>";
  const int32_t eot_id = l.vocab.find(eot);
  if (eot_id < 0) user_error(*cfg.vocab_file, ": GPT-2 vocabulary has no <|endoftext|> token");
  l.spec.added_tokens.push_back({eot, eot_id, true, false, false, false});
  for (const auto& s : cfg.tokenizer_special_tokens) {
    if (l.token_to_id(s) >= 0) continue;
    l.spec.added_tokens.push_back({s, count_vocab(l), true, false, false, false});
  }
  l.spec.add_special_tokens = cfg.tokenizer_hf_include_special_tokens;
  BpeTokenizer::Info info;
  info.vocab_size = count_vocab(l);
  info.eod = eot_id;
  info.identifiers = {
      {"class", "megatron.core.tokenizers.text.text_tokenizer.MegatronTokenizerText"},
      {"tokenizer_path", "GPT2BPETokenizer"},
      {"additional_special_tokens", python_list_repr(cfg.tokenizer_special_tokens)},
      {"vocab_file", *cfg.vocab_file},
      {"merges_file", *cfg.merge_file},
      {"use_fast", "True"},
      {"trust_remote_code", "False"},
      {"include_special_tokens", cfg.tokenizer_hf_include_special_tokens ? "True" : "False"},
      {"use_gigatoken", "False"}};
  return std::make_unique<BpeTokenizer>(std::move(l.spec), std::move(info));
}

}  // namespace megatron::tokenizers
