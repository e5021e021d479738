#include "megatron/training/torch_dist_checkpoint.h"

#include <cstring>
#include <regex>
#include <set>

#include "megatron/core/utils/errors.h"

namespace megatron::training {

namespace td = dist_checkpointing::torch_dist;
using nlohmann::json;

namespace {

// Tensor keys of Megatron's GPTModel (local or Transformer Engine spec, layers stacked), and the
// optimizer states of them.
const std::regex& model_key_re() {
  static const std::regex re(
      "(embedding\\.(word_embeddings|position_embeddings)\\.weight"
      "|decoder\\.final_layernorm\\.(weight|bias)"
      "|output_layer\\.weight"
      "|decoder\\.layers\\.(input_layernorm|pre_mlp_layernorm)\\.(weight|bias)"
      "|decoder\\.layers\\.self_attention\\.(linear_qkv|linear_proj|q_layernorm|k_layernorm)\\.(weight|bias)"
      "|decoder\\.layers\\.self_attention\\.linear_qkv\\.layer_norm_(weight|bias)"
      "|decoder\\.layers\\.mlp\\.(linear_fc1|linear_fc2)\\.(weight|bias)"
      "|decoder\\.layers\\.mlp\\.linear_fc1\\.layer_norm_(weight|bias))");
  return re;
}
const std::regex& optim_key_re() {
  static const std::regex re("optimizer\\.state\\.(param|fp32_param|exp_avg|exp_avg_sq|momentum_buffer)\\.(.*)");
  return re;
}

bool is_moe(const std::string& k) {
  return k.find(".experts.") != std::string::npos || k.find(".router.") != std::string::npos ||
         k.find("shared_experts") != std::string::npos;
}

// Transformer Engine's fused spec stores the layer norms inside the following linear layer.
std::string te_name(const std::string& k) {
  static const std::pair<const char*, const char*> m[] = {
      {"decoder.layers.input_layernorm.", "decoder.layers.self_attention.linear_qkv.layer_norm_"},
      {"decoder.layers.pre_mlp_layernorm.", "decoder.layers.mlp.linear_fc1.layer_norm_"}};
  for (const auto& [ours, te] : m) {
    const size_t p = k.find(ours);
    if (p != std::string::npos) return k.substr(0, p) + te + k.substr(p + std::strlen(ours));
  }
  return "";
}

}  // namespace

TorchDistReadPlan plan_torch_dist_read(const std::string& dir, bool with_optim) {
  auto md = std::make_shared<td::DcpMetadata>(td::read_dcp_metadata(dir));
  const std::string file = dir + "/.metadata";
  for (const auto& [k, t] : md->tensors) {
    if (is_moe(k))
      user_error(file, ": '", k, "' belongs to a mixture-of-experts layer, which megatron.cpp does not load");
    if (k.rfind("optimizer.distributed.", 0) == 0) {
      if (with_optim)
        user_error(file, ": '", k, "' is distributed-optimizer state in Megatron's DP-specific layout "
                   "(dp_reshardable); re-save it with Megatron's --dist-ckpt-optim-fully-reshardable, or load the "
                   "weights only with --no-load-optim");
      continue;
    }
    std::smatch m;
    std::string model = k;
    if (std::regex_match(k, m, optim_key_re())) model = m[2];
    else if (k.rfind("optimizer.", 0) == 0) {
      if (with_optim) user_error(file, ": optimizer tensor '", k, "' has no counterpart in megatron.cpp's optimizer");
      continue;
    }
    if (!std::regex_match(model, model_key_re()))
      user_error(file, ": tensor '", k, "' is not part of a GPT/LLaMA model megatron.cpp builds "
                 "(another architecture, or layers stored one by one); it cannot be loaded");
  }
  for (const auto& [k, b] : md->bytes) {
    if (is_moe(k)) user_error(file, ": '", k, "' belongs to a mixture-of-experts layer, which megatron.cpp does not load");
    if (with_optim && k.rfind("optimizer.distributed.", 0) == 0)
      user_error(file, ": '", k, "' is distributed-optimizer state in Megatron's DP-specific layout "
                 "(dp_zero_gather_scatter / dp_reshardable); re-save it with Megatron's "
                 "--dist-ckpt-optim-fully-reshardable, or load the weights only with --no-load-optim");
  }
  TorchDistReadPlan plan;
  for (const auto& [k, b] : md->bytes)
    if (k.rfind(td::kOwnObjectPrefix, 0) == 0) plan.ours = true;
  auto resolve = [md](const std::string& k) -> std::string {
    if (md->tensors.count(k)) return k;
    std::vector<std::string> cand;
    std::smatch m;
    static const std::regex fp32("optimizer\\.state\\.fp32_param\\.(.*)");
    if (std::regex_match(k, m, fp32)) {
      const std::string model = m[1];
      cand = {"optimizer.state.param." + model};
      if (!te_name(model).empty()) cand.push_back("optimizer.state.param." + te_name(model));
      cand.push_back("optimizer.state.fp32_param." + te_name(model));
      cand.push_back(model);  // fp32 training: the model weights are the main params
      cand.push_back(te_name(model));
    } else if (!te_name(k).empty()) {
      cand = {te_name(k)};
    }
    for (const auto& c : cand)
      if (!c.empty() && md->tensors.count(c)) return c;
    return k;
  };
  plan.key_map = resolve;
  plan.has = [md, resolve](const std::string& k) { return md->tensors.count(resolve(k)) > 0; };
  return plan;
}

namespace {
// First value of `key` anywhere under `j` (depth-first), or null.
json find_key(const json& j, const std::string& key, int depth = 0) {
  if (depth > 8) return nullptr;
  if (j.is_object()) {
    if (j.contains(key)) return j[key];
    for (const auto& [k, v] : j.items()) {
      json r = find_key(v, key, depth + 1);
      if (!r.is_null()) return r;
    }
  } else if (j.is_array()) {
    for (const auto& v : j) {
      json r = find_key(v, key, depth + 1);
      if (!r.is_null()) return r;
    }
  }
  return nullptr;
}
}  // namespace

json common_from_torch_dist(const json& mc) {
  json c = json::object();
  for (const char* k : {"args", "iteration", "checkpoint_version", "num_floating_point_operations_so_far",
                        "opt_param_scheduler", "content_metadata", "extra"})
    if (mc.contains(k)) c[k] = mc[k];
  if (!c.contains("args") || !c["args"].is_object()) c["args"] = json::object();
  if (mc.contains("megatron_cpp_optimizer")) {
    c["optimizer"] = mc["megatron_cpp_optimizer"];
  } else if (mc.contains("optimizer")) {
    // Megatron: the step shared by all params ("common_step", non-distributed optimizers) or the
    // param groups' "step" (distributed optimizer), and the grad scaler's state.
    json opt = json::object();
    json step = find_key(mc["optimizer"], "common_step");
    if (step.is_null()) step = find_key(mc["optimizer"], "step");
    if (step.is_number()) opt["step"] = step.get<int64_t>();
    json gs = find_key(mc["optimizer"], "grad_scaler");
    if (gs.is_object() && gs.contains("scale") && gs["scale"].is_number())
      opt["grad_scaler"] = {{"scale", gs["scale"]},
                            {"growth_tracker", gs.value("growth_tracker", 0)},
                            {"hysteresis_tracker", gs.value("hysteresis_tracker", 0)}};
    c["optimizer"] = opt;
  }
  return c;
}

void save_torch_dist_checkpoint(const dist_checkpointing::ShardedStateDict& sd, const std::string& dir,
                                comm::ProcessGroup* world, bool distributed_optimizer, int tp_rank, int dp_rank,
                                bool last_stage) {
  td::SaveOptions o;
  o.key_map = [distributed_optimizer](const std::string& k) {
    static const std::string p = "optimizer.state.fp32_param.";
    if (distributed_optimizer && k.rfind(p, 0) == 0) return "optimizer.state.param." + k.substr(p.size());
    return k;
  };
  // Megatron's linear layers (local spec) carry an empty `_extra_state`, saved as a ShardedObject
  // per layer by TP rank 0 / DP rank 0; its loader requests them.
  if (tp_rank == 0 && dp_rank == 0) {
    std::set<std::string> keys;
    static const std::regex lin("decoder\\.layers\\.(self_attention\\.linear_qkv|self_attention\\.linear_proj|"
                                "mlp\\.linear_fc1|mlp\\.linear_fc2)\\.weight");
    for (const auto& t : sd.tensors) {
      std::smatch m;
      if (!std::regex_match(t.key, m, lin) || t.global_offset.empty()) continue;
      keys.insert("decoder.layers." + std::string(m[1]) + "._extra_state/shard_" + std::to_string(t.global_offset[0]) + "_" +
                  std::to_string(t.global_shape[0]));
    }
    if (last_stage) keys.insert("output_layer._extra_state/shard_0_1");
    o.none_objects.assign(keys.begin(), keys.end());
  }
  o.common = [&sd](td::PickleDoc& d) -> const td::PyValue* {
    td::PyValue* root = d.dict();
    for (auto it = sd.common.begin(); it != sd.common.end(); ++it) {
      const std::string& k = it.key();
      if (k == "args") {
        // Megatron reads the saved args as an argparse.Namespace (getattr).
        root->dict.emplace_back(d.str("args"), d.object("argparse.Namespace", {}, td::json_to_py(it.value(), d), true));
      } else if (k == "optimizer") {
        // Our optimizer's common state; Megatron's own "optimizer" entry has another structure.
        root->dict.emplace_back(d.str("megatron_cpp_optimizer"), td::json_to_py(it.value(), d));
      } else {
        root->dict.emplace_back(d.str(k), td::json_to_py(it.value(), d));
      }
    }
    return root;
  };
  td::save(sd, dir, world, o);
}

}  // namespace megatron::training
