#include "megatron/training/torch_dist_checkpoint.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <regex>
#include <set>

#include "megatron/core/utils/errors.h"

namespace megatron::training {

namespace td = dist_checkpointing::torch_dist;
using nlohmann::json;

namespace {

// Tensor keys of Megatron's GPTModel (local or Transformer Engine spec): decoder layers stacked
// ("decoder.layers.<rest>") or per layer ("decoder.layers.<i>.<rest>", a --moe-layer-freq list or
// > 1), the MTP modules ("mtp.layers.<k>.…", their transformer layer's keys as a decoder layer's),
// dense and MoE MLPs (router, routed experts as SequentialMLP / TEGroupedMLP save them, shared
// experts and their --moe-shared-expert-gate weight), and the optimizer states of them.
const std::regex& model_key_re() {
  static const std::string layer =
      "((input_layernorm|pre_mlp_layernorm)\\.(weight|bias)"
      "|self_attention\\.(linear_qkv|linear_proj|q_layernorm|k_layernorm)\\.(weight|bias)"
      "|self_attention\\.linear_qkv\\.layer_norm_(weight|bias)"
      "|mlp\\.(linear_fc1|linear_fc2)\\.(weight|bias)"
      "|mlp\\.linear_fc1\\.layer_norm_(weight|bias)"
      "|mlp\\.router\\.(weight|expert_bias)"
      "|mlp\\.experts\\.experts\\.(linear_fc1|linear_fc2)\\.weight"
      "|mlp\\.shared_experts\\.(linear_fc1|linear_fc2)\\.weight"
      "|mlp\\.shared_experts\\.gate_weight)";
  static const std::regex re(
      "(embedding\\.(word_embeddings|position_embeddings)\\.weight"
      "|decoder\\.final_layernorm\\.(weight|bias)"
      "|output_layer\\.weight"
      "|decoder\\.layers\\.([0-9]+\\.)?" + layer +
      "|mtp\\.layers\\.[0-9]+\\.((enorm|hnorm|final_layernorm)\\.(weight|bias)|eh_proj\\.weight"
      "|transformer_layer\\." + layer + "))");
  return re;
}
const std::regex& optim_key_re() {
  static const std::regex re("optimizer\\.state\\.(param|fp32_param|exp_avg|exp_avg_sq|momentum_buffer)\\.(.*)");
  return re;
}

// Our FP8 state (fp8_state.h checkpoint_tensors: `<linear>._extra_state.fp8.amax_history|scale|
// scale_inv`), kept in a torch_dist checkpoint under kOwnObjectPrefix + that key: megatron.cpp's
// own tensors, not Transformer Engine's `_extra_state` objects (Megatron's loader ignores them as
// unexpected keys, and its TE layers start with fresh FP8 state, as from a bf16 checkpoint).
bool is_fp8_state(const std::string& k) {
  static const std::regex re(".+\\._extra_state\\.fp8\\.(amax_history|scale|scale_inv)");
  return std::regex_match(k, re);
}
std::string fp8_state_key(const std::string& k) { return is_fp8_state(k) ? td::kOwnObjectPrefix + k : ""; }

// Transformer Engine's fused spec stores the layer norms inside the following linear layer, and
// Megatron's local spec saves them under the same names (TransformerLayer's
// sharded_state_dict_keys_map): "<layer>.input_layernorm.X" -> "<layer>.self_attention.linear_qkv.layer_norm_X",
// "<layer>.pre_mlp_layernorm.X" -> "<layer>.mlp.linear_fc1.layer_norm_X", for every transformer
// layer (decoder layers stacked or not, MTP modules' transformer_layer). "" for other keys.
std::string te_name(const std::string& k) {
  static const std::regex re("^(.*\\.)(input_layernorm|pre_mlp_layernorm)\\.(weight|bias)$");
  std::smatch m;
  if (!std::regex_match(k, m, re)) return "";
  return m[1].str() + (m[2] == "input_layernorm" ? "self_attention.linear_qkv.layer_norm_" : "mlp.linear_fc1.layer_norm_") +
         m[3].str();
}

}  // namespace

TorchDistReadPlan plan_torch_dist_read(const std::string& dir, bool with_optim) {
  auto md = std::make_shared<td::DcpMetadata>(td::read_dcp_metadata(dir));
  const std::string file = dir + "/.metadata";
  TorchDistReadPlan plan;
  for (const auto& [k, t] : md->tensors) {
    // (Unprefixed: as written before the prefix was introduced; resolve finds them as they are.)
    if (is_fp8_state(k) || (k.rfind(td::kOwnObjectPrefix, 0) == 0 && is_fp8_state(k.substr(std::strlen(td::kOwnObjectPrefix))))) {
      plan.fp8_state = true;
      continue;
    }
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
                 "(another architecture or layer type); it cannot be loaded");
  }
  for (const auto& [k, b] : md->bytes) {
    if (with_optim && k.rfind("optimizer.distributed.", 0) == 0)
      user_error(file, ": '", k, "' is distributed-optimizer state in Megatron's DP-specific layout "
                 "(dp_zero_gather_scatter / dp_reshardable); re-save it with Megatron's "
                 "--dist-ckpt-optim-fully-reshardable, or load the weights only with --no-load-optim");
  }
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
    } else {
      cand = {fp8_state_key(k)};
    }
    for (const auto& c : cand)
      if (!c.empty() && md->tensors.count(c)) return c;
    return k;
  };
  for (const auto& [k, t] : md->tensors) plan.tensor_keys.push_back(k);
  std::sort(plan.tensor_keys.begin(), plan.tensor_keys.end());
  plan.key_map = resolve;
  plan.has = [md, resolve](const std::string& k) { return md->tensors.count(resolve(k)) > 0; };
  return plan;
}

std::vector<std::string> unused_torch_dist_keys(const TorchDistReadPlan& plan, const std::vector<std::string>& requested,
                                                bool with_optim) {
  std::set<std::string> used;
  for (const auto& k : requested)
    if (plan.has(k)) used.insert(plan.key_map(k));
  std::vector<std::string> unused;
  for (const auto& k : plan.tensor_keys) {
    if (used.count(k) || k.rfind(td::kOwnObjectPrefix, 0) == 0 || is_fp8_state(k)) continue;
    if (!with_optim && k.rfind("optimizer.", 0) == 0) continue;
    unused.push_back(k);
  }
  return unused;
}

void check_torch_dist_keys_present(const TorchDistReadPlan& plan, const std::vector<std::string>& requested,
                                   const std::string& dir) {
  std::set<std::string> seen;
  std::string missing;
  for (const auto& k : requested) {
    if (plan.has(k) || !seen.insert(k).second) continue;
    const std::string ck = plan.key_map(k);
    missing += (seen.size() > 1 ? ", '" : "'") + k + "'" + (ck != k ? " (looked for as '" + ck + "')" : "");
  }
  if (!seen.empty())
    user_error(dir, "/.metadata: ", seen.size(), " tensor(s) of this model are not in the checkpoint: ", missing,
               " (a checkpoint of another model, or a key naming megatron.cpp does not know: docs/checkpointing.md)");
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

namespace {

// Megatron's optimizer param groups (optimizer/__init__.py _get_param_groups: the default group
// and the no-weight-decay group of biases and 1-D params, matched on load by their
// identifier keys max_lr, min_lr, wd_mult, lr_mult, is_expert_parallel, is_decoupled_lr), as
// torch.optim.AdamW's state_dict() holds them, without "params" (Megatron restores those
// locally). "lr" and "weight_decay" are rewritten by Megatron's scheduler from its num_steps on
// load. `step`: appended to each group (the distributed optimizer's layout) when >= 0.
// `expert`: the groups of MoE models' second optimizer (Megatron's ChainedOptimizer of the dense
// and the expert-parallel params, optimizer/__init__.py): one group, is_expert_parallel, with
// weight decay (the routed experts' weights; expert biases are not built here).
td::PyValue* megatron_param_groups(td::PickleDoc& d, const json& args, double step, bool expert) {
  const double lr = args.value("lr", 0.0), min_lr = args.value("min_lr", 0.0), wd = args.value("weight_decay", 0.0);
  td::PyValue* groups = d.list();
  for (const double wd_mult : expert ? std::vector<double>{1.0} : std::vector<double>{1.0, 0.0}) {
    td::PyValue* g = d.dict();
    auto put = [&](const char* k, const td::PyValue* v) { g->dict.emplace_back(d.str(k), v); };
    put("lr", d.real(lr));
    put("betas", d.tuple({d.real(args.value("adam_beta1", 0.9)), d.real(args.value("adam_beta2", 0.999))}));
    put("eps", d.real(args.value("adam_eps", 1e-8)));
    put("weight_decay", d.real(wd * wd_mult));
    put("amsgrad", d.boolean(false));
    put("foreach", d.none());
    put("maximize", d.boolean(false));
    put("capturable", d.boolean(false));
    put("differentiable", d.boolean(false));
    put("fused", d.none());
    put("decoupled_weight_decay", d.boolean(true));
    put("is_expert_parallel", d.boolean(expert));
    put("default_config", d.boolean(true));
    put("wd_mult", d.real(wd_mult));
    put("lr_mult", d.real(1.0));
    put("is_decoupled_lr", d.boolean(false));
    put("max_lr", d.real(lr));
    put("min_lr", d.real(min_lr));
    if (step >= 0) put("step", d.real(step));
    groups->items.push_back(g);
  }
  return groups;
}

// Whether Megatron builds a second optimizer for the routed experts (optimizer/__init__.py
// get_megatron_optimizer: the params with allreduce False). tensor_parallel/layers.py marks the
// experts' weights so only when they use the expert process groups: --num-experts with
// --expert-model-parallel-size > 1 or --expert-tensor-parallel-size != --tensor-model-parallel-size
// (as pretrain.cpp's expert buffers). Otherwise the experts are in the dense optimizer's groups
// (is_expert_parallel false) and the ChainedOptimizer of one optimizer saves that optimizer's
// state_dict() alone (optimizer.py ChainedOptimizer.state_dict / load_state_dict).
bool megatron_expert_optimizer(const json& args) {
  auto num = [&](const char* k, int64_t dflt) {
    return args.contains(k) && args[k].is_number() ? args[k].get<int64_t>() : dflt;
  };
  if (num("num_experts", 0) <= 0) return false;
  const int64_t tp = num("tensor_model_parallel_size", 1);
  return num("expert_model_parallel_size", 1) > 1 || num("expert_tensor_parallel_size", tp) != tp;
}

}  // namespace

std::string torch_dist_model_key(const std::string& key) {
  const std::string te = te_name(key);
  return te.empty() ? key : te;
}

std::string model_key_from_torch_dist(const std::string& key) {
  static const std::regex re("^(.*\\.)(self_attention\\.linear_qkv|mlp\\.linear_fc1)\\.layer_norm_(weight|bias)$");
  std::smatch m;
  if (!std::regex_match(key, m, re)) return key;
  return m[1].str() + (m[2] == "mlp.linear_fc1" ? "pre_mlp_layernorm." : "input_layernorm.") + m[3].str();
}

std::vector<std::string> torch_dist_extra_state_keys(const std::vector<dist_checkpointing::ShardedTensor>& tensors) {
  static const std::regex lin("(.*\\.(linear_qkv|linear_proj|linear_fc1|linear_fc2|eh_proj))\\.weight");
  std::set<std::string> keys;
  for (const auto& t : tensors) {
    std::smatch m;
    if (t.replica_id != 0 || t.key.starts_with("optimizer.") || !std::regex_match(t.key, m, lin) ||
        m[1].str().starts_with("output_layer"))
      continue;
    // The axes before the weight's own two (layer, expert) are the object's; one TP fragment
    // (the first along the weight's axes) writes it.
    const size_t n = t.global_shape.size() - 2;
    bool first = true;
    for (size_t i = n; i < t.global_offset.size(); ++i) first &= t.global_offset[i] == 0;
    if (!first) continue;
    std::string off, shape;
    for (size_t i = 0; i < n; ++i) {
      off += (i ? "." : "") + std::to_string(t.global_offset[i]);
      shape += (i ? "." : "") + std::to_string(t.global_shape[i]);
    }
    if (n == 0) off = "0", shape = "1";  // Megatron's _get_extra_state_offsets without offsets
    keys.insert(m[1].str() + "._extra_state/shard_" + off + "_" + shape);
  }
  return {keys.begin(), keys.end()};
}

void save_torch_dist_checkpoint(const dist_checkpointing::ShardedStateDict& sd, const std::string& dir,
                                comm::ProcessGroup* world, bool distributed_optimizer, int tp_rank, int dp_rank,
                                bool last_stage) {
  (void)last_stage;
  td::SaveOptions o;
  // Model params kept in fp32: Megatron's FP32Optimizer has no main-param copy to save (a load
  // takes them from the model weights, plan_torch_dist_read).
  std::set<std::string> fp32_model;
  for (const auto& t : sd.tensors)
    if (t.key.rfind("optimizer.", 0) != 0 && t.data.dtype() == DType::kFloat32) fp32_model.insert(t.key);
  o.key_map = [distributed_optimizer, fp32_model](const std::string& k) -> std::string {
    static const std::string p = "optimizer.state.fp32_param.";
    if (is_fp8_state(k)) return fp8_state_key(k);
    std::string out = k;
    if (k.rfind(p, 0) == 0) {
      if (distributed_optimizer) out = "optimizer.state.param." + k.substr(p.size());
      else if (fp32_model.count(k.substr(p.size()))) return "";
    }
    // Megatron's layer (local and Transformer Engine specs alike) stores its layer norms under the
    // fused names (transformer_layer.py sharded_state_dict_keys_map).
    return torch_dist_model_key(out);
  };
  // Megatron's linear layers (local spec) carry an empty `_extra_state`, saved as a ShardedObject;
  // its loader requests them.
  o.none_objects = torch_dist_extra_state_keys(sd.tensors);
  const json args = sd.common.contains("args") ? sd.common["args"] : json::object();
  const bool half = args.value("fp16", false) || args.value("bf16", false);
  // Storage of the common_step and loss-scale tensors: TorchArchiveWriter copies them at finish(),
  // inside td::save.
  auto step_value = std::make_shared<std::array<float, 2>>();
  o.common = [&sd, &args, distributed_optimizer, half, step_value](td::TorchArchiveWriter& w) -> const td::PyValue* {
    td::PickleDoc& d = w.doc();
    td::PyValue* root = d.dict();
    for (auto it = sd.common.begin(); it != sd.common.end(); ++it) {
      const std::string& k = it.key();
      if (k == "args") {
        // Megatron reads the saved args as an argparse.Namespace (getattr).
        root->dict.emplace_back(d.str("args"), d.object("argparse.Namespace", {}, td::json_to_py(it.value(), d), true));
      } else if (k == "optimizer") {
        // Ours (read back by common_from_torch_dist), and Megatron's own layout of its optimizer's
        // common state (optimizer.py / distrib_optimizer.py state_dict()): param groups, the step
        // shared by all params, the grad scaler.
        root->dict.emplace_back(d.str("megatron_cpp_optimizer"), td::json_to_py(it.value(), d));
        const json& oc = it.value();
        const double step = oc.value("step", 0);
        (*step_value)[0] = static_cast<float>(step);
        // One optimizer's state_dict(); MoE models whose routed experts are on the expert process
        // groups have two (ChainedOptimizer.state_dict: dense, expert-parallel), saved as
        // {0: dense, 1: experts} (its sharded_state_dict's int keys).
        auto one = [&](bool expert) -> const td::PyValue* {
          td::PyValue* torch_sd = d.dict();
          if (distributed_optimizer) {
            torch_sd->dict.emplace_back(d.str("param_groups"), megatron_param_groups(d, args, step, expert));
          } else {
            torch_sd->dict.emplace_back(d.str("param_groups"), megatron_param_groups(d, args, -1, expert));
            td::PyValue* state = d.dict();
            state->dict.emplace_back(d.str("common_step"), w.tensor(DType::kFloat32, {}, &(*step_value)[0]));
            torch_sd->dict.emplace_back(d.str("state"), state);
          }
          const td::PyValue* mopt = torch_sd;
          if (distributed_optimizer || half) {
            td::PyValue* outer = d.dict();
            outer->dict.emplace_back(d.str("optimizer"), torch_sd);
            if (oc.contains("grad_scaler") && oc["grad_scaler"].is_object()) {
              const json& gs = oc["grad_scaler"];
              td::PyValue* g = d.dict();
              (*step_value)[1] = static_cast<float>(gs.value("scale", 1.0));  // a 1-element tensor in Megatron
              g->dict.emplace_back(d.str("scale"), w.tensor(DType::kFloat32, {1}, &(*step_value)[1]));
              g->dict.emplace_back(d.str("growth_tracker"), d.integer(gs.value("growth_tracker", 0)));
              g->dict.emplace_back(d.str("hysteresis_tracker"), d.integer(gs.value("hysteresis_tracker", 0)));
              outer->dict.emplace_back(d.str("grad_scaler"), g);
            }
            if (distributed_optimizer) outer->dict.emplace_back(d.str("param_state_sharding_type"), d.str("fully_reshardable"));
            mopt = outer;
          }
          return mopt;
        };
        if (megatron_expert_optimizer(args)) {
          td::PyValue* chained = d.dict();
          chained->dict.emplace_back(d.integer(0), one(false));
          chained->dict.emplace_back(d.integer(1), one(true));
          root->dict.emplace_back(d.str("optimizer"), chained);
        } else {
          root->dict.emplace_back(d.str("optimizer"), one(false));
        }
      } else if (k == "content_metadata" && it.value().is_object()) {
        // Megatron records the distributed optimizer's sharding type only when it has one, and
        // with fully_reshardable its distrib_optim_fully_reshardable_mem_efficient flag
        // (checkpointing.py _build_sharded_state_dict_metadata; megatron.cpp has no such mode).
        json cm = it.value();
        if (!distributed_optimizer) cm.erase("distrib_optim_sharding_type");
        else if (cm.value("distrib_optim_sharding_type", "") == "fully_reshardable")
          cm["distrib_optim_fully_reshardable_mem_efficient"] = false;
        root->dict.emplace_back(d.str(k), td::json_to_py(cm, d));
      } else {
        root->dict.emplace_back(d.str(k), td::json_to_py(it.value(), d));
      }
    }
    return root;
  };
  td::save(sd, dir, world, o);
}

}  // namespace megatron::training
