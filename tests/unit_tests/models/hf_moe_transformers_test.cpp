// Hugging Face mixture-of-experts models (MixtralForCausalLM, Qwen3MoeForCausalLM,
// Qwen2MoeForCausalLM) through the
// convert_checkpoint code (megatron/training/hf/): config.json -> Megatron flags and back, the
// refusals of what Megatron cannot represent, and -- against transformers' own numbers
// (tests/reference/hf_moe/, written by generate_hf_moe_fixtures.py on the GPU machine) -- logits,
// loss and every gradient of the imported model, plus a bitwise export -> import round trip.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "megatron/core/dist_checkpointing/file_utils.h"
#include "megatron/core/dist_checkpointing/safetensors.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/utils/errors.h"
#include "megatron/training/hf/hf_args.h"
#include "megatron/training/hf/hf_checkpoint.h"
#include "megatron/training/hf/hf_model.h"
#include "models/hf_reference_util.h"
#include "test_utils/fixture_util.h"

namespace megatron {
namespace {

namespace fs = std::filesystem;
namespace dc = megatron::dist_checkpointing;
using namespace megatron::hf;
using nlohmann::json;

const std::string kDir = std::string(MEGATRON_SOURCE_DIR) + "/tests/reference/hf_moe/";

// fp32 CPU on both sides, the same math (RMSNorm, RoPE, GQA attention, softmax top-k routing,
// SwiGLU experts weighted by their probabilities), only the summation order differs (HF runs
// float32 too, and its experts loop over tokens per expert as ours do). The reductions are over
// n <= 128 values (hidden 64, q/k/v width <= 96, vocab 128, 2-3 layers), each adding at most n*u
// (u = 2^-24, ~8e-6 in the worst case, no cancellation assumed) and typically sqrt(n)*u (~7e-7);
// the norms renormalize between layers and the generator guarantees a router top-k margin of
// 1e-3 >> these errors, so both sides route every token to the same experts. (Qwen2-MoE adds q/k/v
// biases and a shared expert of 32 behind a sigmoid gate: sums of the same lengths.) 1e-5 relative to
// the largest magnitude is the project's CPU-vs-reference bound (as tests/reference/hf/).
constexpr double kTol = 1e-5;
// Where the fixture also holds the float64 run of the same transformers model (logits64 /
// grads64.safetensors), a tensor may miss kTol against transformers' float32 values and still
// pass if our float32 error against the float64 truth is within kNoise times transformers' own
// float32 error (plus kTol): both are float32 implementations of one computation, so their errors
// are of one size; what a wrong formula gives is orders of magnitude more. The first fixtures
// showed why this is needed: Qwen3-MoE's gradients (qk-norm, un-renormalized softmax routing,
// three layers of backward) differ from transformers' float32 ones by up to 4.5e-5.
constexpr double kNoise = 4.0;

std::string tmp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("megatron_hfmoe_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}
void write_json(const std::string& path, const json& j) { std::ofstream(path) << j.dump(2); }
using megatron::testing::expect_user_error;
bool same(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}
bool has(const std::vector<std::string>& v, const std::vector<std::string>& seq) {
  return std::search(v.begin(), v.end(), seq.begin(), seq.end()) != v.end();
}

// config.json as transformers 5 writes them (keys of MixtralConfig / Qwen3MoeConfig).
json mixtral_json() {
  return {{"model_type", "mixtral"}, {"architectures", {"MixtralForCausalLM"}}, {"vocab_size", 128},
          {"hidden_size", 64}, {"intermediate_size", 16}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
          {"num_key_value_heads", 2}, {"head_dim", 16}, {"max_position_embeddings", 64}, {"rms_norm_eps", 1e-6},
          {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1000000.0}}}, {"sliding_window", nullptr},
          {"num_local_experts", 4}, {"num_experts_per_tok", 2}, {"router_aux_loss_coef", 0.02},
          {"output_router_logits", false}, {"router_jitter_noise", 0.0}, {"tie_word_embeddings", false},
          {"hidden_act", "silu"}};
}
json qwen3_moe_json() {
  return {{"model_type", "qwen3_moe"}, {"architectures", {"Qwen3MoeForCausalLM"}}, {"vocab_size", 128},
          {"hidden_size", 64}, {"intermediate_size", 64}, {"moe_intermediate_size", 16}, {"num_hidden_layers", 3},
          {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 24}, {"max_position_embeddings", 64},
          {"rms_norm_eps", 1e-6}, {"rope_theta", 1000000.0}, {"num_experts", 8}, {"num_experts_per_tok", 2},
          {"norm_topk_prob", false}, {"decoder_sparse_step", 1}, {"mlp_only_layers", {1}},
          {"router_aux_loss_coef", 0.001}, {"attention_bias", false}, {"use_sliding_window", false},
          {"tie_word_embeddings", true}, {"hidden_act", "silu"}};
}

// Qwen2MoeConfig's keys (transformers 5; qkv_bias is absent from older versions, whose attention
// always has the q/k/v bias): Qwen1.5-MoE-A2.7B's structure, tiny.
json qwen2_moe_json() {
  return {{"model_type", "qwen2_moe"}, {"architectures", {"Qwen2MoeForCausalLM"}}, {"vocab_size", 128},
          {"hidden_size", 64}, {"intermediate_size", 48}, {"moe_intermediate_size", 16},
          {"shared_expert_intermediate_size", 32}, {"num_hidden_layers", 4}, {"num_attention_heads", 4},
          {"num_key_value_heads", 2}, {"max_position_embeddings", 64}, {"rms_norm_eps", 1e-6},
          {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1000000.0}}}, {"num_experts", 8},
          {"num_experts_per_tok", 4}, {"norm_topk_prob", false}, {"decoder_sparse_step", 2},
          {"mlp_only_layers", json::array()}, {"router_aux_loss_coef", 0.001}, {"output_router_logits", false},
          {"use_sliding_window", false}, {"sliding_window", nullptr}, {"max_window_layers", 28},
          {"layer_types", {"full_attention", "full_attention", "full_attention", "full_attention"}},
          {"qkv_bias", true}, {"attention_dropout", 0.0}, {"tie_word_embeddings", false}, {"hidden_act", "silu"},
          {"initializer_range", 0.02}, {"use_cache", true}};
}

TEST(HFMoEConfig, Qwen2MoeMapsToMegatronFlags) {
  std::string d = tmp_dir("q2cfg");
  write_json(d + "/config.json", qwen2_moe_json());
  HFModelSpec q = read_hf_config(d + "/config.json");
  EXPECT_EQ(q.num_moe_experts, 8);
  EXPECT_EQ(q.moe_router_topk, 4);
  EXPECT_EQ(q.ffn_hidden_size, 48);
  EXPECT_EQ(q.moe_ffn_hidden_size, 16);
  EXPECT_EQ(q.moe_shared_expert_intermediate_size, 32);
  EXPECT_TRUE(q.moe_shared_expert_gate);  // shared_expert_gate is always there
  EXPECT_EQ(q.kv_channels, 16);           // no head_dim: hidden / heads
  EXPECT_EQ(q.moe_layer_pattern, (std::vector<int>{0, 1, 0, 1}));  // (i + 1) % 2 == 0
  EXPECT_TRUE(q.moe_router_pre_softmax);
  EXPECT_FALSE(q.qk_layernorm);
  EXPECT_TRUE(q.add_qkv_bias);
  EXPECT_FALSE(q.add_bias_linear);  // o_proj and the MLPs have no bias
  EXPECT_TRUE(q.untie_embeddings_and_output_weights);
  auto qa = q.megatron_args();
  EXPECT_TRUE(has(qa, {"--moe-shared-expert-intermediate-size", "32", "--moe-shared-expert-gate"}));
  EXPECT_TRUE(has(qa, {"--disable-bias-linear", "--add-qkv-bias"}));
  EXPECT_TRUE(has(qa, {"--moe-layer-freq", "[0,1,0,1]"}));
  EXPECT_TRUE(has(qa, {"--moe-router-pre-softmax"}));
  EXPECT_FALSE(has(qa, {"--qk-layernorm"}));
  auto qc = transformer_config_from_hf(q);
  EXPECT_EQ(qc.moe_shared_expert_intermediate_size, 32);
  EXPECT_TRUE(qc.moe_shared_expert_gate);
  EXPECT_TRUE(qc.add_qkv_bias);
  EXPECT_FALSE(qc.add_bias_linear);
  // qkv_bias false (transformers versions with the field): no q/k/v bias; older configs without
  // the key keep it (their attention always has it).
  auto j = qwen2_moe_json();
  j["qkv_bias"] = false;
  j["num_local_experts"] = 8;  // transformers 5's name for the count (an attribute map of num_experts)
  j.erase("num_experts");
  j["head_dim"] = 24;          // honoured by the attention (getattr(config, "head_dim", hidden / heads))
  j["norm_topk_prob"] = true;
  j["decoder_sparse_step"] = 1;
  write_json(d + "/config.json", j);
  HFModelSpec q2 = read_hf_config(d + "/config.json");
  EXPECT_FALSE(q2.add_qkv_bias);
  EXPECT_EQ(q2.num_moe_experts, 8);
  EXPECT_EQ(q2.kv_channels, 24);
  EXPECT_TRUE(q2.moe_layer_pattern.empty());
  EXPECT_FALSE(q2.moe_router_pre_softmax);
  EXPECT_FALSE(has(q2.megatron_args(), {"--add-qkv-bias"}));
  j = qwen2_moe_json();
  j.erase("qkv_bias");
  write_json(d + "/config.json", j);
  EXPECT_TRUE(read_hf_config(d + "/config.json").add_qkv_bias);
  // export -> import keeps every setting (config.json and the checkpoint args); the export's
  // model type is found from the args without hf_model_type (a gated shared expert).
  for (const auto& s : {q, q2}) {
    const json cfg = hf_config_json(s);
    EXPECT_EQ(cfg["architectures"], json({"Qwen2MoeForCausalLM"}));
    EXPECT_EQ(cfg["shared_expert_intermediate_size"], 32);
    EXPECT_FALSE(cfg.contains("attention_bias"));                     // not a Qwen2MoeConfig field
    EXPECT_EQ(cfg.contains("qkv_bias"), !s.add_qkv_bias);             // written only when false
    EXPECT_EQ(cfg.contains("head_dim"), s.kv_channels != 16);         // written only when not hidden / heads
    write_json(d + "/config.json", cfg);
    EXPECT_EQ(read_hf_config(d + "/config.json").megatron_args(), s.megatron_args());
    json args = spec_to_args(s, 128, 128);
    EXPECT_EQ(spec_from_args(args, "ckpt").megatron_args(), s.megatron_args());
    args.erase("hf_model_type");
    EXPECT_EQ(spec_from_args(args, "ckpt").model_type, "qwen2_moe");
    check_hf_export(args, s, "ckpt", d + "/config.json");
  }
  // --hf-config naming another shared-expert size or qkv_bias than the checkpoint's args.
  json args = spec_to_args(q, 128, 128);
  j = qwen2_moe_json();
  j["shared_expert_intermediate_size"] = 64;
  write_json(d + "/config.json", j);
  expect_user_error([&] { check_hf_export(args, read_hf_config(d + "/config.json"), "ck", d + "/config.json"); },
                    "shared_expert_intermediate_size 64");
  j = qwen2_moe_json();
  j["qkv_bias"] = false;
  write_json(d + "/config.json", j);
  expect_user_error([&] { check_hf_export(args, read_hf_config(d + "/config.json"), "ck", d + "/config.json"); },
                    "qkv_bias false");
  fs::remove_all(d);
}

TEST(HFMoEConfig, MixtralAndQwen3MoeMapToMegatronFlags) {
  std::string d = tmp_dir("cfg");
  write_json(d + "/config.json", mixtral_json());
  HFModelSpec m = read_hf_config(d + "/config.json");
  EXPECT_EQ(m.num_moe_experts, 4);
  EXPECT_EQ(m.moe_ffn_hidden_size, 16);  // Mixtral's intermediate_size is the experts' size
  EXPECT_EQ(m.moe_router_topk, 2);
  EXPECT_TRUE(m.moe_layer_pattern.empty());
  EXPECT_FALSE(m.moe_router_pre_softmax);  // Mixtral renormalizes the top-k softmax
  EXPECT_FALSE(m.qk_layernorm);
  EXPECT_EQ(m.rotary_base, 1.0e6);
  auto ma = m.megatron_args();
  EXPECT_TRUE(has(ma, {"--num-experts", "4", "--moe-ffn-hidden-size", "16", "--moe-router-topk", "2", "--moe-layer-freq", "1"}));
  EXPECT_TRUE(has(ma, {"--moe-aux-loss-coeff", "0.02"}));
  EXPECT_TRUE(has(ma, {"--disable-bias-linear"}));
  EXPECT_FALSE(has(ma, {"--moe-router-pre-softmax"}));
  auto mc = transformer_config_from_hf(m);
  EXPECT_EQ(mc.num_moe_experts.value_or(0), 4);
  EXPECT_FALSE(mc.moe_non_homogeneous_layers);

  write_json(d + "/config.json", qwen3_moe_json());
  HFModelSpec q = read_hf_config(d + "/config.json");
  EXPECT_EQ(q.num_moe_experts, 8);
  EXPECT_EQ(q.ffn_hidden_size, 64);  // the dense layer's intermediate_size
  EXPECT_EQ(q.moe_ffn_hidden_size, 16);
  EXPECT_EQ(q.kv_channels, 24);  // head_dim, not hidden / heads = 16
  EXPECT_EQ(q.moe_layer_pattern, (std::vector<int>{1, 0, 1}));
  EXPECT_TRUE(q.moe_router_pre_softmax);  // norm_topk_prob false: softmax over all experts, no renormalization
  EXPECT_TRUE(q.qk_layernorm);
  EXPECT_FALSE(q.untie_embeddings_and_output_weights);
  auto qa = q.megatron_args();
  EXPECT_TRUE(has(qa, {"--qk-layernorm"}));
  EXPECT_TRUE(has(qa, {"--moe-layer-freq", "[1,0,1]"}));
  EXPECT_TRUE(has(qa, {"--moe-router-pre-softmax"}));
  EXPECT_TRUE(transformer_config_from_hf(q).moe_non_homogeneous_layers);
  // decoder_sparse_step 2: layers 1, 3 (Qwen3MoeDecoderLayer: (i + 1) % step == 0), minus mlp_only_layers.
  auto j = qwen3_moe_json();
  j["num_hidden_layers"] = 4;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = json::array({3});
  j["norm_topk_prob"] = true;
  write_json(d + "/config.json", j);
  HFModelSpec q2 = read_hf_config(d + "/config.json");
  EXPECT_EQ(q2.moe_layer_pattern, (std::vector<int>{0, 1, 0, 0}));
  EXPECT_FALSE(q2.moe_router_pre_softmax);
  // export -> import keeps every setting (config.json and the checkpoint args)
  for (const auto& s : {m, q, q2}) {
    write_json(d + "/config.json", hf_config_json(s));
    EXPECT_EQ(read_hf_config(d + "/config.json").megatron_args(), s.megatron_args()) << s.model_type;
    const json args = spec_to_args(s, 128, 128);
    EXPECT_EQ(spec_from_args(args, "ckpt").megatron_args(), s.megatron_args()) << s.model_type;
    check_hf_export(args, s, "ckpt", d + "/config.json");  // the config agrees with the args
  }
  fs::remove_all(d);
}

TEST(HFMoEConfig, UnrepresentableFieldsNameTheKey) {
  std::string d = tmp_dir("bad");
  auto with = [&](json j, const std::function<void(json&)>& edit) {
    edit(j);
    write_json(d + "/config.json", j);
    return d + "/config.json";
  };
  expect_user_error([&] { read_hf_config(with(qwen2_moe_json(), [](json& j) { j.erase("shared_expert_intermediate_size"); })); },
                    "'shared_expert_intermediate_size'");
  expect_user_error([&] { read_hf_config(with(qwen2_moe_json(), [](json& j) { j["use_sliding_window"] = true; })); },
                    "use_sliding_window");
  expect_user_error([&] { read_hf_config(with(qwen2_moe_json(), [](json& j) { j["layer_types"][1] = "sliding_attention"; })); },
                    "layer_types entry \"sliding_attention\"");
  expect_user_error([&] { read_hf_config(with(qwen2_moe_json(), [](json& j) { j["attention_bias"] = true; })); },
                    "qkv_bias");
  expect_user_error([&] { read_hf_config(with(qwen2_moe_json(), [](json& j) { j["hidden_act"] = "gelu"; })); },
                    "hidden_act 'gelu'");
  expect_user_error([&] { read_hf_config(with(qwen2_moe_json(), [](json& j) { j["model_type"] = "qwen2_moe_vl"; })); },
                    "qwen2_moe)");
  expect_user_error([&] { read_hf_config(with(mixtral_json(), [](json& j) { j["sliding_window"] = 4096; })); },
                    "sliding_window 4096");
  expect_user_error([&] { read_hf_config(with(mixtral_json(), [](json& j) { j["router_jitter_noise"] = 0.1; })); },
                    "router_jitter_noise");
  expect_user_error([&] { read_hf_config(with(mixtral_json(), [](json& j) { j.erase("num_local_experts"); })); },
                    "'num_local_experts'");
  expect_user_error([&] { read_hf_config(with(qwen3_moe_json(), [](json& j) { j["use_sliding_window"] = true; })); },
                    "use_sliding_window");
  expect_user_error([&] { read_hf_config(with(qwen3_moe_json(), [](json& j) { j["attention_bias"] = true; })); },
                    "attention_bias");
  expect_user_error([&] { read_hf_config(with(qwen3_moe_json(), [](json& j) { j["mlp_only_layers"] = {0, 1, 2}; })); },
                    "mlp_only_layers make no layer");
  expect_user_error([&] { read_hf_config(with(qwen3_moe_json(), [](json& j) { j["mlp_only_layers"] = {5}; })); },
                    "mlp_only_layers entry 5");
  expect_user_error([&] { read_hf_config(with(mixtral_json(), [](json& j) { j["num_experts_per_tok"] = 1; })); },
                    "num_experts_per_tok 1");
  expect_user_error([&] { read_hf_config(with(mixtral_json(), [](json& j) { j["num_experts_per_tok"] = 5; })); },
                    "num_experts_per_tok 5 exceeds");
  fs::remove_all(d);
}

TEST(HFMoEConfig, ExportRefusesWhatTheHFModelCannotRepresent) {
  std::string d = tmp_dir("exp");
  write_json(d + "/config.json", mixtral_json());
  const HFModelSpec m = read_hf_config(d + "/config.json");
  const json base = spec_to_args(m, 128, 128);
  auto edited = [&](const std::function<void(json&)>& edit) {
    json a = base;
    edit(a);
    return a;
  };
  expect_user_error([&] { spec_from_args(edited([](json& a) { a["moe_shared_expert_intermediate_size"] = 64; }), "ck"); },
                    "--moe-shared-expert-intermediate-size 64");
  expect_user_error([&] { spec_from_args(edited([](json& a) {
                      a["moe_shared_expert_intermediate_size"] = 64;
                      a["moe_shared_expert_gate"] = true;
                    }), "ck"); },
                    "--moe-shared-expert-gate (export as qwen2_moe)");
  // Qwen2-MoE: its shared expert is always there and always gated; no q/k norm.
  expect_user_error([&] { spec_from_args(edited([](json& a) { a["hf_model_type"] = "qwen2_moe"; }), "ck"); },
                    "no --moe-shared-expert-intermediate-size");
  expect_user_error([&] { spec_from_args(edited([](json& a) {
                      a["hf_model_type"] = "qwen2_moe";
                      a["moe_shared_expert_intermediate_size"] = 64;
                    }), "ck"); },
                    "without --moe-shared-expert-gate");
  expect_user_error([&] { spec_from_args(edited([](json& a) {
                      a["hf_model_type"] = "qwen2_moe";
                      a["moe_shared_expert_intermediate_size"] = 64;
                      a["moe_shared_expert_gate"] = true;
                      a["qk_layernorm"] = true;
                    }), "ck"); },
                    "--qk-layernorm");
  // ... but its q/k/v bias without o_proj's is exactly --add-qkv-bias --disable-bias-linear.
  EXPECT_TRUE(spec_from_args(edited([](json& a) {
                               a["hf_model_type"] = "qwen2_moe";
                               a["moe_shared_expert_intermediate_size"] = 64;
                               a["moe_shared_expert_gate"] = true;
                               a["add_qkv_bias"] = true;
                             }), "ck").add_qkv_bias);
  expect_user_error([&] { spec_from_args(edited([](json& a) { a["add_qkv_bias"] = true; }), "ck"); },
                    "--add-qkv-bias with --disable-bias-linear");
  expect_user_error([&] { spec_from_args(edited([](json& a) { a["moe_router_score_function"] = "sigmoid"; }), "ck"); },
                    "--moe-router-score-function sigmoid");
  expect_user_error([&] { spec_from_args(edited([](json& a) { a["moe_router_topk_scaling_factor"] = 2.5; }), "ck"); },
                    "--moe-router-topk-scaling-factor");
  expect_user_error([&] { spec_from_args(edited([](json& a) { a["moe_router_enable_expert_bias"] = true; }), "ck"); },
                    "--moe-router-enable-expert-bias");
  expect_user_error([&] { spec_from_args(edited([](json& a) { a["moe_router_pre_softmax"] = true; }), "ck"); },
                    "--moe-router-pre-softmax");
  expect_user_error([&] { spec_from_args(edited([](json& a) { a["moe_layer_freq"] = "[1,0]"; }), "ck"); },
                    "Mixtral has no dense layers");
  // Without hf_model_type: an MoE checkpoint with --qk-layernorm exports as Qwen3-MoE.
  EXPECT_EQ(spec_from_args(edited([](json& a) {
                             a.erase("hf_model_type");
                             a["qk_layernorm"] = true;
                           }), "ck").model_type, "qwen3_moe");
  // Experts in a LLaMA export, and a dense checkpoint exported as Mixtral through --hf-config.
  expect_user_error([&] { spec_from_args(edited([](json& a) { a["hf_model_type"] = "llama"; }), "ck"); },
                    "--num-experts 4");
  json dense = base;
  dense.erase("num_experts");
  expect_user_error([&] { check_hf_export(dense, m, "ck", d + "/config.json"); }, "no --num-experts");
  fs::remove_all(d);
}

// ---------------------------------------------------------------------------------------------
// Against transformers (fixtures)
// ---------------------------------------------------------------------------------------------

/// The fixture folder; fails (not skips) when the generator has not been run.
bool fixture_present(const std::string& name) {
  if (fs::exists(kDir + name + "/grads.safetensors")) return true;
  ADD_FAILURE() << kDir << name << " is missing: generate the transformers fixtures on a machine with torch + "
                << "transformers (the GPU machine) with `python3 tests/reference/hf_moe/generate_hf_moe_fixtures.py "
                << "tests/reference/hf_moe/` from the repository root (or tests/reference/hf_moe/run_on_gpu_machine.sh), "
                << "then commit the folders";
  return false;
}

void compare_with_transformers(const std::string& name) {
  if (!fixture_present(name)) return;
  const std::string dir = kDir + name;
  HFModelSpec spec = read_hf_config(dir + "/config.json");
  ASSERT_TRUE(spec.is_moe());
  auto cfg = transformer_config_from_hf(spec);
  cfg.validate();
  models::gpt::GPTModel model(cfg, spec.vocab_size, spec.max_position_embeddings, 1);
  load_into_model(model, hf_to_megatron(HFWeights(dir), spec));
  datasets::GPTBatch batch = testing::read_hf_inputs(dir + "/inputs.json");
  const int64_t b = batch.tokens.size(0), s = batch.tokens.size(1);
  // training=false: no router aux loss, as the fixture's plain cross entropy (output_router_logits=False).
  Tensor loss = model.forward(batch, /*training=*/false);
  Tensor ref_logits = testing::read_safetensors_f32(dir + "/logits.safetensors")["logits"];  // [b, s, V]
  Tensor ours = Tensor::empty(ref_logits.shape(), DType::kFloat32);
  ops::transpose01(model.last_logits(), ours);  // ours [s, b, V]
  const double logits_err = testing::max_rel_error(ours, ref_logits);
  EXPECT_LE(logits_err, kTol) << name << " logits";
  double mean = 0;
  for (float x : loss.to_float_vector()) mean += x;
  mean /= static_cast<double>(b * s);
  const double want = json::parse(dc::read_text_file(dir + "/loss.json"))["loss"].get<double>();
  EXPECT_NEAR(mean, want, kTol * std::abs(want)) << name << " mean loss";
  // The fixture's gradient is of the mean cross entropy: dloss = 1 / (b s) per token.
  Tensor dloss = Tensor::zeros({b, s}, DType::kFloat32);
  dloss.fill_(1.0f / static_cast<float>(b * s));
  model.zero_grad();
  model.backward(dloss);
  // Our gradients in the Hub layout (the export mapping), against transformers' by name.
  std::map<std::string, Tensor> grads;
  for (auto& p : model.parameters()) grads[p.name] = p.main_grad.to(DType::kFloat32);
  auto ref = testing::read_safetensors_f32(dir + "/grads.safetensors");
  const bool has64 = fs::exists(dir + "/grads64.safetensors");
  std::map<std::string, Tensor> ref64;
  if (has64) ref64 = testing::read_safetensors_f32(dir + "/grads64.safetensors");
  auto hf_grads = megatron_to_hf(grads, spec);
  EXPECT_EQ(hf_grads.size(), ref.size()) << name << ": every HF weight has a gradient";
  double worst = 0, worst64 = 0, worst_hf64 = 0;
  for (const auto& [n, g] : hf_grads) {
    ASSERT_TRUE(ref.count(n)) << name << ": no reference gradient for " << n;
    const double e = testing::max_rel_error(g, ref[n]);
    worst = std::max(worst, e);
    if (e <= kTol) continue;
    ASSERT_TRUE(has64) << name << " gradient of " << n << ": " << e << " > " << kTol
                       << " against transformers' float32 and the fixture has no float64 run (regenerate it)";
    ASSERT_TRUE(ref64.count(n)) << name << ": no float64 reference gradient for " << n;
    const double ours64 = testing::max_rel_error(g, ref64[n]), hf64 = testing::max_rel_error(ref[n], ref64[n]);
    worst64 = std::max(worst64, ours64);
    worst_hf64 = std::max(worst_hf64, hf64);
    EXPECT_LE(ours64, kNoise * hf64 + kTol)
        << name << " gradient of " << n << ": ours vs float64 " << ours64 << ", transformers float32 vs float64 " << hf64;
  }
  std::printf("%s vs transformers: logits %.2e, mean loss %.8f vs %.8f, worst gradient %.2e (%zu tensors)",
              name.c_str(), logits_err, mean, want, worst, hf_grads.size());
  if (worst64 > 0)
    std::printf("; over %.0e: ours vs float64 up to %.2e, transformers' float32 vs float64 up to %.2e", kTol, worst64,
                worst_hf64);
  std::printf("\n");
}

TEST(HFMoE, MixtralEqualsMixtralForCausalLM) { compare_with_transformers("mixtral_tiny"); }
TEST(HFMoE, Qwen3MoeEqualsQwen3MoeForCausalLM) { compare_with_transformers("qwen3_moe_tiny"); }
TEST(HFMoE, Qwen2MoeEqualsQwen2MoeForCausalLM) { compare_with_transformers("qwen2_moe_tiny"); }

// Import -> export gives back every tensor of the transformers-side file bit for bit, and
// importing the export gives back the same Megatron tensors.
TEST(HFMoE, ImportExportRoundTripIsBitwise) {
  for (const char* m : {"mixtral_tiny", "qwen3_moe_tiny", "qwen2_moe_tiny"}) {
    if (!fixture_present(m)) continue;
    const std::string dir = kDir + m;
    HFModelSpec spec = read_hf_config(dir + "/config.json");
    HFWeights src(dir);
    auto meg = hf_to_megatron(src, spec, /*padded_vocab_size=*/256);
    std::map<std::string, Tensor> params(meg.begin(), meg.end());
    auto hf = megatron_to_hf(params, spec);
    EXPECT_EQ(hf.size(), src.names().size()) << m;
    for (const auto& [n, t] : hf) EXPECT_TRUE(same(t, src.get(n))) << m << " " << n;
    std::string d = tmp_dir(std::string("rt_") + m);
    save_hf_checkpoint(d, hf, spec, 200000);  // small shards: the index path too
    HFModelSpec back_spec = read_hf_config(d + "/config.json");
    EXPECT_EQ(back_spec.megatron_args(), spec.megatron_args()) << m;
    auto again = hf_to_megatron(HFWeights(d), back_spec, 256);
    ASSERT_EQ(again.size(), meg.size()) << m;
    for (size_t i = 0; i < meg.size(); ++i) {
      EXPECT_EQ(again[i].first, meg[i].first);
      EXPECT_TRUE(same(again[i].second, meg[i].second)) << m << " " << meg[i].first;
    }
    fs::remove_all(d);
  }
}

}  // namespace
}  // namespace megatron
