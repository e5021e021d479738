// convert_checkpoint: Hugging Face LLaMA / GPT-2 / Mixtral / Qwen3-MoE / Qwen2-MoE checkpoints <-> our
// distributed checkpoints
// (the role of Megatron-LM's tools/checkpoint/convert.py with the llama_mistral / mcore plugins).
//
//   convert_checkpoint --loader hf --saver mcore --load-dir HF_DIR --save-dir CKPT_DIR
//                      [--make-vocab-size-divisible-by 128] [--target-tensor-parallel-size 1]
//       reads config.json + model.safetensors (or the sharded index), writes CKPT_DIR/release/
//       and latest_checkpointed_iteration.txt = "release", and prints the Megatron model flags
//       to train/evaluate it with (the checkpoint reshards to any TP/PP on load).
//   convert_checkpoint --loader mcore --saver hf --load-dir CKPT_DIR --save-dir HF_DIR
//                      [--hf-config config.json] [--max-shard-size-mb 5120]
//       reads the tracker's checkpoint (model tensors only) and writes config.json +
//       model.safetensors (sharded with model.safetensors.index.json when larger than the shard
//       size). Without --hf-config the model settings come from the checkpoint's args; with it,
//       config.json must agree with the args the checkpoint was trained with (activation, sizes,
//       norm, ...). An architecture the HF model cannot represent (e.g. --qk-layernorm, squared
//       ReLU in LLaMA, a shared expert without --moe-shared-expert-gate) is refused; squared ReLU
//       in GPT-2 exports as activation_function "relu2"; an MoE checkpoint exports as Mixtral
//       (Qwen3-MoE with --qk-layernorm, Qwen2-MoE with a gated shared expert) unless its args
//       name the HF model type (docs/models.md).
//   convert_checkpoint --loader torch_dist --saver hf ...   the same from a Megatron-LM
//       `--ckpt-format torch_dist` checkpoint (--loader mcore detects that format too). To turn
//       one into our own layout, pretrain_gpt --load reads it directly.
// Errors (unsupported config options, missing tensors, wrong shapes, unreadable dtypes) are one
// line naming the key/tensor/file; exit status 1.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>

#include "megatron/core/dist_checkpointing/file_utils.h"
#include "megatron/core/dist_checkpointing/serialization.h"
#include "megatron/training/checkpointing.h"
#include "megatron/training/hf/hf_args.h"
#include "megatron/training/hf/hf_checkpoint.h"
#include "megatron/training/torch_dist_checkpoint.h"
#include "megatron/core/utils/signals.h"

using namespace megatron;
namespace dc = megatron::dist_checkpointing;
namespace tr = megatron::training;
using nlohmann::json;

namespace {

struct Args {
  std::string loader, saver, load_dir, save_dir, hf_config;
  int64_t divisible_by = 128;
  int64_t tp = 1;
  uint64_t max_shard_mb = 5120;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "-h" || k == "--help") {
      std::puts("usage: convert_checkpoint --loader hf|mcore|torch_dist --saver mcore|hf --load-dir DIR --save-dir DIR "
                "[--make-vocab-size-divisible-by N] [--target-tensor-parallel-size N] [--hf-config FILE] "
                "[--max-shard-size-mb N]");
      std::exit(0);
    }
    if (i + 1 >= argc) user_error("convert_checkpoint: flag ", k, " needs a value");
    std::string v = argv[++i];
    if (k == "--loader") a.loader = v;
    else if (k == "--saver") a.saver = v;
    else if (k == "--load-dir") a.load_dir = v;
    else if (k == "--save-dir") a.save_dir = v;
    else if (k == "--hf-config") a.hf_config = v;
    else if (k == "--make-vocab-size-divisible-by") a.divisible_by = std::stoll(v);
    else if (k == "--target-tensor-parallel-size") a.tp = std::stoll(v);
    else if (k == "--max-shard-size-mb") a.max_shard_mb = std::stoull(v);
    else user_error("convert_checkpoint: unknown flag ", k, " (see --help)");
  }
  if (a.load_dir.empty() || a.save_dir.empty()) user_error("convert_checkpoint: --load-dir and --save-dir are required");
  return a;
}

int hf_to_mcore(const Args& a) {
  hf::HFModelSpec spec = hf::read_hf_config(a.load_dir + "/config.json");
  const int64_t mult = a.divisible_by * a.tp;
  const int64_t padded = (spec.vocab_size + mult - 1) / mult * mult;
  hf::HFWeights w(a.load_dir);
  auto tensors = hf::hf_to_megatron(w, spec, padded);
  dc::ShardedStateDict sd;
  const std::string experts = ".mlp.experts.local_experts.";
  for (const auto& [name, t] : tensors) {
    // Keys as pretrain_gpt writes them: a --moe-layer-freq list keys every layer on its own
    // (Megatron's non_homogeneous_layers); a routed expert's weight goes to its layer's
    // "...mlp.experts.experts.linear_fc{1,2}.weight" [E, rows, cols] at its expert index.
    tr::ParamSharding sh;
    sh.stack_layers = spec.moe_layer_pattern.empty();
    if (const size_t at = name.find(experts); at != std::string::npos) {
      sh.expert_index = std::stoll(name.substr(at + experts.size()));
      sh.num_experts = spec.num_moe_experts;
    }
    auto v = tr::model_sharded_tensors(name, t, sh, spec.num_layers, {});
    sd.tensors.insert(sd.tensors.end(), v.begin(), v.end());
  }
  sd.common = {{"args", hf::spec_to_args(spec, padded, a.divisible_by)}, {"checkpoint_version", 3.0}, {"iteration", 0}};
  const std::string dir = tr::checkpoint_dir_name(a.save_dir, 0, /*release=*/true);
  std::error_code ec;
  std::filesystem::create_directories(a.save_dir, ec);
  if (ec) user_error("--save-dir ", a.save_dir, ": cannot create directory (", ec.message(), ")");
  dc::save(sd, dir);
  dc::write_file_atomic(tr::tracker_filename(a.save_dir), "release");
  std::printf("converted %s (%s, %zu tensors, vocab %lld padded to %lld) to %s\n", a.load_dir.c_str(),
              spec.model_type.c_str(), tensors.size(), static_cast<long long>(spec.vocab_size),
              static_cast<long long>(padded), dir.c_str());
  std::printf("model flags:");
  for (const auto& f : spec.megatron_args()) std::printf(" %s", f.c_str());
  std::printf(" --make-vocab-size-divisible-by %lld\n", static_cast<long long>(a.divisible_by));
  return 0;
}

int mcore_to_hf(const Args& a) {
  auto tracker = tr::read_tracker(a.load_dir);
  if (!tracker) user_error(a.load_dir, ": no latest_checkpointed_iteration.txt");
  const std::string dir = tr::checkpoint_dir_name(a.load_dir, tracker->first, tracker->second);
  // --loader torch_dist: Megatron-LM's own format (docs/checkpointing.md, "Megatron-LM torch_dist
  // checkpoints"); --loader mcore reads either (detected from metadata.json).
  const bool torch_dist = dc::torch_dist::is_torch_dist_checkpoint(dir);
  if (a.loader == "torch_dist" && !torch_dist) user_error("--loader torch_dist: ", dir, " is not a torch_dist checkpoint");
  tr::TorchDistReadPlan plan;
  if (torch_dist) plan = tr::plan_torch_dist_read(dir, /*with_optim=*/false);
  json common = torch_dist ? tr::common_from_torch_dist(dc::torch_dist::load_common(dir)) : dc::load_common_state(dir);
  // The architecture the checkpoint was trained with comes from its args; a --hf-config must
  // agree with them, and what the HF architecture cannot represent is refused.
  const json ck_args = common.value("args", json::object());
  hf::HFModelSpec spec;
  if (a.hf_config.empty()) {
    spec = hf::spec_from_args(ck_args, dir);
  } else {
    spec = hf::read_hf_config(a.hf_config);
    hf::check_hf_export(ck_args, spec, dir, a.hf_config);
  }
  dc::ShardedStateDict sd;
  if (torch_dist) {
    // Our key names (Transformer Engine's fused layer-norm names map back to the local spec's).
    for (const auto& [key, st] : dc::torch_dist::read_dcp_metadata(dir).tensors) {
      if (key.rfind("optimizer.", 0) == 0) continue;
      const std::string ours = tr::model_key_from_torch_dist(key);
      sd.tensors.push_back(dc::ShardedTensor::from_tensor(ours, Tensor::empty(st.size, st.dtype)));
    }
    dc::torch_dist::LoadOptions lo;
    lo.key_map = plan.key_map;
    dc::torch_dist::load(sd, dir, lo);
  } else {
    dc::CheckpointIndex idx = dc::load_index(dir);
    for (const auto& [key, st] : idx.tensors) {
      if (key.rfind("optimizer.", 0) == 0) continue;
      sd.tensors.push_back(dc::ShardedTensor::from_tensor(key, Tensor::empty(st.global_shape, st.dtype)));
    }
    dc::load(sd, dir);
  }
  std::map<std::string, Tensor> params;
  for (const auto& t : sd.tensors) {
    const std::string pre = "decoder.layers.";
    // Mixture-of-experts layers (routers, experts) have no place in the HF LLaMA / GPT-2 layout
    // (check_hf_export refuses MoE args; this catches checkpoints whose args do not say).
    if (!spec.is_moe() && (t.key.find(".mlp.router.") != std::string::npos || t.key.find(".mlp.experts.") != std::string::npos))
      user_error(dir, ": '", t.key, "' belongs to a mixture-of-experts layer; the ", spec.model_type,
                 " Hugging Face layout has no experts (export it as mixtral, qwen3_moe or qwen2_moe)");
    const bool per_layer = t.key.rfind(pre, 0) == 0 && t.key.size() > pre.size() && std::isdigit(static_cast<unsigned char>(t.key[pre.size()]));
    if (per_layer) {  // Megatron's per-layer key (non_homogeneous_layers): already one layer's tensor
      params[t.key] = t.data;
    } else if (t.key.rfind(pre, 0) == 0) {  // stacked: split the leading layer axis
      for (int64_t i = 0; i < t.data.size(0); ++i) {
        Shape s(t.data.shape().begin() + 1, t.data.shape().end());
        params[pre + std::to_string(i) + "." + t.key.substr(pre.size())] = t.data.narrow0(i, 1).view(s).clone();
      }
    } else {
      params[t.key] = t.data;
    }
  }
  // A layer's routed experts are one checkpoint tensor [E, rows, cols]: back to the per-expert
  // parameter names megatron_to_hf reads.
  for (auto it = params.begin(); it != params.end();) {
    const size_t at = it->first.find(".mlp.experts.experts.");
    if (at == std::string::npos || it->first.rfind("decoder.layers.", 0) != 0) {
      ++it;
      continue;
    }
    const Tensor all = it->second;
    const std::string head = it->first.substr(0, at) + ".mlp.experts.local_experts.",
                      tail = it->first.substr(at + std::strlen(".mlp.experts.experts."));
    Shape es(all.shape().begin() + 1, all.shape().end());
    for (int64_t e = 0; e < all.size(0); ++e) params[head + std::to_string(e) + "." + tail] = all.narrow0(e, 1).view(es).clone();
    it = params.erase(it);
  }
  // Multi-token prediction modules (--mtp-num-layers) have no place in the HF LLaMA / GPT-2 layout.
  const auto mtp = std::count_if(params.begin(), params.end(), [](const auto& kv) { return kv.first.rfind("mtp.", 0) == 0; });
  if (mtp > 0)
    std::printf("note: the checkpoint's %lld multi-token-prediction tensors (mtp.layers.*) are not exported: the %s "
                "Hugging Face layout has no MTP modules\n", static_cast<long long>(mtp), spec.model_type.c_str());
  // FP8 training state (amax histories, scales of each FP8 linear: --fp8-format, FP8 experts,
  // --fp8-output-proj) is not a weight: Hugging Face checkpoints hold the weights only.
  size_t fp8_state = 0;
  for (auto it = params.begin(); it != params.end();) {
    if (it->first.find("._extra_state.fp8.") == std::string::npos) {
      ++it;
      continue;
    }
    ++fp8_state;
    it = params.erase(it);
  }
  if (fp8_state > 0)
    std::printf("note: the checkpoint's %zu FP8 state tensors (<linear>._extra_state.fp8.*: amax histories, scales) "
                "are not exported: a Hugging Face checkpoint holds the weights only (an FP8 run loading the "
                "converted model starts with fresh FP8 state)\n", fp8_state);
  auto hf_tensors = hf::megatron_to_hf(params, spec);
  hf::save_hf_checkpoint(a.save_dir, hf_tensors, spec, a.max_shard_mb << 20);
  std::printf("converted %s (%s, %zu tensors) to %s\n", dir.c_str(), spec.model_type.c_str(), hf_tensors.size(),
              a.save_dir.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  megatron::ignore_file_size_signal();  // writes past `ulimit -f` fail with EFBIG, not a signal
  try {
    Args a = parse(argc, argv);
    if (a.loader == "hf" && a.saver == "mcore") return hf_to_mcore(a);
    if ((a.loader == "mcore" || a.loader == "torch_dist") && a.saver == "hf") return mcore_to_hf(a);
    user_error("convert_checkpoint: --loader hf --saver mcore, or --loader mcore|torch_dist --saver hf (got --loader '", a.loader,
               "' --saver '", a.saver, "')");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
