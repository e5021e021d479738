#include "megatron/training/checkpoint_args.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>

#include "megatron/core/utils/errors.h"
#include "megatron/training/arguments.h"

namespace megatron::training {

using nlohmann::json;

json py_str_to_json(const std::string& s) {
  if (s == "True") return true;
  if (s == "False") return false;
  if (s == "None") return nullptr;
  if (s.empty()) return s;
  const char* b = s.data();
  const char* e = b + s.size();
  int64_t i = 0;
  if (auto r = std::from_chars(b, e, i); r.ec == std::errc() && r.ptr == e) return i;
  double d = 0;
  if (auto r = std::from_chars(b, e, d); r.ec == std::errc() && r.ptr == e && std::isfinite(d)) return d;
  return s;
}

json checkpoint_args(const Arguments& args) {
  json j = json::object();
  for (const auto& [dest, value] : args_items(args)) j[dest] = py_str_to_json(value);
  // Set by the tokenizer after the arguments block is printed (so not in it, as in Megatron), but part
  // of Megatron's saved args.
  if (args.padded_vocab_size > 0) j["padded_vocab_size"] = args.padded_vocab_size;
  return j;
}

std::string mlp_activation(const json& a) {
  auto b = [&](const char* k, bool def) {
    return a.contains(k) && a[k].is_boolean() ? a[k].get<bool>() : def;
  };
  if (b("swiglu", false)) return "swiglu";
  if (b("squared_relu", false)) return "squared_relu";
  // TransformerConfig::gelu_tanh(): the fused bias-GeLU (tanh approximation) needs a bias.
  return b("bias_gelu_fusion", true) && b("add_bias_linear", true) ? "gelu_tanh" : "gelu";
}

namespace {

std::string show(const json& v) {
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_null()) return "None";
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

/// dest -> the flag that sets it (the first declared one), for messages.
const std::map<std::string, std::string>& flag_of_dest() {
  static const auto* m = [] {
    auto* mp = new std::map<std::string, std::string>();
    for (const auto& [flag, dest] : declared_flag_dests()) mp->emplace(dest, flag);
    return mp;
  }();
  return *m;
}

bool get_bool(const json& a, const char* k, bool def) { return a.contains(k) && a[k].is_boolean() ? a[k].get<bool>() : def; }

}  // namespace

void check_checkpoint_args(const json& ck, const json& cur, const std::string& where) {
  if (!ck.is_object() || !cur.is_object()) return;
  auto mismatch = [&](const std::string& dest, const json& cv, const json& kv) {
    auto it = flag_of_dest().find(dest);
    std::string flag = it == flag_of_dest().end() ? "--" + dest : it->second;
    std::replace(flag.begin(), flag.end(), '_', '-');
    user_error(where, ": ", dest, " (", flag, ") is ", show(cv), " in this run but ", show(kv),
               " in the checkpoint; train with the checkpoint's architecture flags (Megatron's check_checkpoint_args)");
  };
  auto cmp = [&](const std::string& dest) {
    if (!ck.contains(dest) || !cur.contains(dest)) return;  // old checkpoints: only a few keys
    const json &kv = ck[dest], &cv = cur[dest];
    if (kv.is_number() && cv.is_number()) {
      if (kv.get<double>() != cv.get<double>()) mismatch(dest, cv, kv);
    } else if (kv != cv) {
      mismatch(dest, cv, kv);
    }
  };
  // The choices first: a derived size (ffn_hidden_size of --swiglu) would otherwise be named.
  for (const char* k : {"num_layers", "hidden_size", "num_attention_heads", "swiglu", "squared_relu",
                        "normalization", "layernorm_epsilon", "position_embedding_type", "add_bias_linear",
                        "qk_layernorm", "untie_embeddings_and_output_weights", "layernorm_zero_centered_gamma",
                        "group_query_attention", "max_position_embeddings"})
    cmp(k);
  // The divisor matters through the padded vocabulary only: with the checkpoint's padded_vocab_size
  // (--use-checkpoint-args takes it, not the divisor, as Megatron's) the model is the same.
  if (!(ck.contains("padded_vocab_size") && cur.contains("padded_vocab_size") &&
        ck["padded_vocab_size"] == cur["padded_vocab_size"]))
    cmp("make_vocab_size_divisible_by");
  for (const char* k : {"ffn_hidden_size", "kv_channels", "mtp_num_layers"}) cmp(k);
  // Effective values: QKV bias is add_bias_linear or --add-qkv-bias; the group count matters
  // only with grouped-query attention; rotary settings only with rope.
  if (ck.contains("add_qkv_bias") && cur.contains("add_qkv_bias")) {
    const bool kq = get_bool(ck, "add_qkv_bias", false) || get_bool(ck, "add_bias_linear", true);
    const bool cq = get_bool(cur, "add_qkv_bias", false) || get_bool(cur, "add_bias_linear", true);
    if (kq != cq) mismatch("add_qkv_bias", cq, kq);
  }
  if (get_bool(ck, "group_query_attention", false) && get_bool(cur, "group_query_attention", false))
    cmp("num_query_groups");
  if (ck.value("position_embedding_type", json()) == "rope" && cur.value("position_embedding_type", json()) == "rope")
    for (const char* k : {"rotary_base", "rotary_percent", "rotary_interleaved", "use_rope_scaling",
                          "rotary_seq_len_interpolation_factor"})
      cmp(k);
  if (get_bool(ck, "use_rope_scaling", false) && get_bool(cur, "use_rope_scaling", false)) cmp("rope_scaling_factor");
}

}  // namespace megatron::training
