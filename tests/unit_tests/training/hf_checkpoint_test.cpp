// HF <-> Megatron layouts on tiny hand-made tensors (expected row orders worked out by hand from
// docs/megatron-reference.md#distributed-checkpoint and the HF module definitions), config.json parsing of the transformers-written
// fixtures (tests/reference/hf/), and import -> export round trips that must reproduce the files
// written by transformers byte for byte.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "megatron/core/dist_checkpointing/file_utils.h"
#include "megatron/core/dist_checkpointing/safetensors.h"
#include "megatron/training/hf/hf_checkpoint.h"
#include "megatron/training/hf/hf_mapping.h"
#include "megatron/training/hf/hf_model.h"
#include "models/hf_reference_util.h"

using namespace megatron;
using namespace megatron::hf;
namespace fs = std::filesystem;
namespace dc = megatron::dist_checkpointing;

namespace {
std::string fixture(const std::string& m) { return std::string(MEGATRON_SOURCE_DIR) + "/tests/reference/hf/" + m; }
std::string tmp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("megatron_hf_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}
std::vector<float> col0(const Tensor& t) {
  auto v = t.to_float_vector();
  std::vector<float> out;
  const int64_t w = t.dim() == 2 ? t.size(1) : 1;
  for (int64_t r = 0; r < t.size(0); ++r) out.push_back(v[r * w]);
  return out;
}
using megatron::testing::expect_user_error;
void write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream(path) << j.dump(2);
}
bool same(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}
}  // namespace

TEST(HFMapping, QkvGroupedPerQueryGroup) {
  // 4 heads, 2 groups, head dim 1, hidden 2: q rows 10..13, k rows 20..21, v rows 30..31.
  Tensor q = Tensor::from_vector({10, 10, 11, 11, 12, 12, 13, 13}, {4, 2});
  Tensor k = Tensor::from_vector({20, 20, 21, 21}, {2, 2});
  Tensor v = Tensor::from_vector({30, 30, 31, 31}, {2, 2});
  Tensor qkv = qkv_to_megatron(q, k, v, 4, 2);
  EXPECT_EQ(col0(qkv), (std::vector<float>{10, 11, 20, 30, 12, 13, 21, 31}));  // q1 q2 k1 v1 | q3 q4 k2 v2
  auto back = qkv_from_megatron(qkv, 4, 2);
  EXPECT_TRUE(same(back[0], q) && same(back[1], k) && same(back[2], v));
  // biases (1-D), MHA: 2 heads, 2 groups, head dim 2
  Tensor qb = Tensor::from_vector({1, 2, 3, 4}, {4}), kb = Tensor::from_vector({5, 6, 7, 8}, {4}),
         vb = Tensor::from_vector({9, 10, 11, 12}, {4});
  EXPECT_EQ(qkv_to_megatron(qb, kb, vb, 2, 2).to_float_vector(),
            (std::vector<float>{1, 2, 5, 6, 9, 10, 3, 4, 7, 8, 11, 12}));
}

TEST(HFMapping, SwigluFc1IsGateThenUp) {
  Tensor gate = Tensor::from_vector({1, 2}, {2, 1}), up = Tensor::from_vector({3, 4}, {2, 1});
  Tensor fc1 = fc1_to_megatron(gate, up);
  EXPECT_EQ(fc1.to_float_vector(), (std::vector<float>{1, 2, 3, 4}));
  auto gu = fc1_from_megatron(fc1);
  EXPECT_TRUE(same(gu[0], gate) && same(gu[1], up));
}

TEST(HFMapping, Gpt2Conv1DTransposeAndCAttnSplit) {
  // Conv1D weight [in=2, out=6], element (i, o) = 10 o + i; columns o: q0 q1 k0 k1 v0 v1.
  std::vector<float> w;
  for (int i = 0; i < 2; ++i)
    for (int o = 0; o < 6; ++o) w.push_back(10.0f * o + i);
  Tensor c_attn = Tensor::from_vector(w, {2, 6});
  Tensor t = transpose2d(c_attn);
  EXPECT_EQ(t.shape(), (Shape{6, 2}));
  EXPECT_EQ(t.to_float_vector()[3], 11.0f);  // row o=1, col i=1
  // 2 heads of dim 1: Megatron rows per head: q_h, k_h, v_h -> outputs 0,2,4,1,3,5
  Tensor qkv = gpt2_c_attn_to_megatron(c_attn, 2);
  EXPECT_EQ(qkv.shape(), (Shape{6, 2}));
  EXPECT_EQ(col0(qkv), (std::vector<float>{0, 20, 40, 10, 30, 50}));
  EXPECT_TRUE(same(gpt2_c_attn_from_megatron(qkv, 2), c_attn));
  Tensor bias = Tensor::from_vector({0, 1, 2, 3, 4, 5}, {6});
  EXPECT_EQ(gpt2_c_attn_to_megatron(bias, 2).to_float_vector(), (std::vector<float>{0, 2, 4, 1, 3, 5}));
  EXPECT_EQ(resize_rows(Tensor::from_vector({1, 2}, {2, 1}), 3).to_float_vector(), (std::vector<float>{1, 2, 0}));
}

TEST(HFConfig, ReadsTransformersConfigs) {
  HFModelSpec l = read_hf_config(fixture("llama_tiny/config.json"));
  EXPECT_EQ(l.model_type, "llama");
  EXPECT_EQ(l.num_layers, 2);
  EXPECT_EQ(l.hidden_size, 64);
  EXPECT_EQ(l.ffn_hidden_size, 176);
  EXPECT_EQ(l.num_attention_heads, 4);
  EXPECT_EQ(l.num_query_groups, 2);
  EXPECT_EQ(l.kv_channels, 16);
  EXPECT_EQ(l.rotary_base, 500000.0);  // transformers 5 writes it under rope_parameters
  EXPECT_EQ(l.norm_epsilon, 1e-5);
  EXPECT_EQ(l.normalization, "RMSNorm");
  EXPECT_TRUE(l.swiglu && l.untie_embeddings_and_output_weights && !l.add_bias_linear);
  auto args = l.megatron_args();
  EXPECT_NE(std::find(args.begin(), args.end(), "--group-query-attention"), args.end());
  {
    // Megatron's --rotary-base is an int: rope_theta 1e6 (Qwen-2, Llama-3 long-context variants) must print as
    // 1000000, which the parser takes (printf %g gave 1e+06, refused); a fractional theta cannot be expressed.
    HFModelSpec big = l;
    big.rotary_base = 1.0e6;
    auto b = big.megatron_args();
    auto it = std::find(b.begin(), b.end(), "--rotary-base");
    ASSERT_NE(it, b.end());
    EXPECT_EQ(*(it + 1), "1000000");
    big.rotary_base = 10000.5;
    EXPECT_THROW(big.megatron_args(), megatron::UserError);
  }
  EXPECT_NE(std::find(args.begin(), args.end(), "--disable-bias-linear"), args.end());
  HFModelSpec g = read_hf_config(fixture("gpt2_tiny/config.json"));
  EXPECT_EQ(g.model_type, "gpt2");
  EXPECT_EQ(g.ffn_hidden_size, 256);
  EXPECT_EQ(g.num_query_groups, 4);
  EXPECT_EQ(g.normalization, "LayerNorm");
  EXPECT_EQ(g.activation, "gelu_tanh");
  EXPECT_EQ(g.position_embedding_type, "learned_absolute");
  EXPECT_FALSE(g.untie_embeddings_and_output_weights);
  // export -> import gives the same settings
  std::string d = tmp_dir("cfg");
  for (const auto& s : {l, g}) {
    write_json(d + "/config.json", hf_config_json(s));
    HFModelSpec r = read_hf_config(d + "/config.json");
    EXPECT_EQ(r.megatron_args(), s.megatron_args());
  }
  fs::remove_all(d);
}

TEST(HFConfig, Llama31RopeScalingMapsToMegatronFlags) {
  // Llama-3.1-8B's config.json rope_scaling (values as Meta publishes them) and the transformers 5
  // form (rope_parameters); both become --use-rope-scaling --rope-scaling-factor 8, and export
  // writes the llama3 object back.
  std::string d = tmp_dir("cfg31");
  auto j = nlohmann::json::parse(dc::read_text_file(fixture("llama_tiny/config.json")));
  j.erase("rope_parameters");
  j["rope_theta"] = 500000.0;
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  write_json(d + "/config.json", j);
  HFModelSpec s = read_hf_config(d + "/config.json");
  EXPECT_TRUE(s.use_rope_scaling);
  EXPECT_EQ(s.rope_scaling_factor, 8.0);
  auto args = s.megatron_args();
  auto it = std::find(args.begin(), args.end(), "--use-rope-scaling");
  ASSERT_NE(it, args.end());
  ASSERT_NE(std::find(args.begin(), args.end(), "--rope-scaling-factor"), args.end());
  EXPECT_EQ(*(std::find(args.begin(), args.end(), "--rope-scaling-factor") + 1), "8");
  auto out = hf_config_json(s);
  EXPECT_EQ(out["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(out["rope_scaling"]["factor"], 8.0);
  EXPECT_EQ(out["rope_scaling"]["low_freq_factor"], 1.0);
  EXPECT_EQ(out["rope_scaling"]["high_freq_factor"], 4.0);
  EXPECT_EQ(out["rope_scaling"]["original_max_position_embeddings"], 8192);
  EXPECT_TRUE(transformer_config_from_hf(s).rope_scaling);
  EXPECT_EQ(transformer_config_from_hf(s).rope_scaling_factor, 8.0f);
  // transformers 5 writes the same under rope_parameters (with rope_theta); factor 32 (Llama-3.2).
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 32.0}, {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  write_json(d + "/config.json", j);
  HFModelSpec s5 = read_hf_config(d + "/config.json");
  EXPECT_TRUE(s5.use_rope_scaling);
  EXPECT_EQ(s5.rope_scaling_factor, 32.0);
  EXPECT_EQ(s5.rotary_base, 500000.0);
  // plain config: no flag, exported as null
  HFModelSpec plain = read_hf_config(fixture("llama_tiny/config.json"));
  EXPECT_FALSE(plain.use_rope_scaling);
  EXPECT_TRUE(hf_config_json(plain)["rope_scaling"].is_null());
  fs::remove_all(d);
}

TEST(HFConfig, UnsupportedOptionsNameTheKey) {
  std::string d = tmp_dir("cfgbad");
  auto base = nlohmann::json::parse(dc::read_text_file(fixture("llama_tiny/config.json")));
  auto with = [&](const std::function<void(nlohmann::json&)>& edit) {
    auto j = base;
    edit(j);
    write_json(d + "/config.json", j);
    return d + "/config.json";
  };
  expect_user_error([&] { read_hf_config(with([](auto& j) { j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}}; })); },
                    "rope_scaling.rope_type 'linear'");
  // llama3 with values Megatron's --use-rope-scaling cannot express (it fixes them).
  expect_user_error([&] { read_hf_config(with([](auto& j) {
                      j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"high_freq_factor", 2.0}}; })); },
                    "rope_scaling.high_freq_factor = 2 is not supported");
  expect_user_error([&] { read_hf_config(with([](auto& j) { j["rope_scaling"] = {{"rope_type", "llama3"}}; })); },
                    "rope_scaling.factor is missing");
  expect_user_error([&] { read_hf_config(with([](auto& j) { j["rope_parameters"]["rope_type"] = "yarn"; })); },
                    "rope_parameters.rope_type 'yarn'");
  expect_user_error([&] { read_hf_config(with([](auto& j) { j["hidden_act"] = "gelu"; })); }, "hidden_act 'gelu'");
  expect_user_error([&] { read_hf_config(with([](auto& j) { j["model_type"] = "mamba"; })); }, "model_type 'mamba'");
  expect_user_error([&] { read_hf_config(with([](auto& j) { j.erase("hidden_size"); })); }, "'hidden_size'");
  expect_user_error([&] { read_hf_config(with([](auto& j) { j["attention_bias"] = true; })); }, "attention_bias");
  expect_user_error([&] { read_hf_config(with([](auto& j) { j["num_key_value_heads"] = 3; })); }, "num_key_value_heads 3");
  fs::remove_all(d);
}

// Import the transformers-written tiny models, check the Megatron layout against the HF tensors
// by row blocks, export again and compare with the original file tensor by tensor (bitwise).
TEST(HFCheckpoint, ImportExportRoundTripIsExact) {
  for (const char* m : {"llama_tiny", "gpt2_tiny"}) {
    HFModelSpec spec = read_hf_config(fixture(std::string(m) + "/config.json"));
    HFWeights hfw(fixture(m));
    auto meg = hf_to_megatron(hfw, spec, /*padded_vocab_size=*/384);
    std::map<std::string, Tensor> params(meg.begin(), meg.end());
    EXPECT_EQ(params.at("embedding.word_embeddings.weight").shape(), (Shape{384, 64})) << m;
    if (std::string(m) == "llama_tiny") {
      EXPECT_EQ(params.size(), 3u + 6u * 2);  // embedding, final norm, output + 6 per layer
      const Tensor& qkv = params.at("decoder.layers.1.self_attention.linear_qkv.weight");
      EXPECT_EQ(qkv.shape(), (Shape{128, 64}));  // (4 + 2*2) heads x 16
      Tensor q = hfw.get("model.layers.1.self_attn.q_proj.weight"), k = hfw.get("model.layers.1.self_attn.k_proj.weight"),
             v = hfw.get("model.layers.1.self_attn.v_proj.weight");
      // group 1 = rows 64..127: q heads 2,3 (q rows 32..63), k head 1 (k rows 16..31), v head 1
      EXPECT_TRUE(same(qkv.narrow0(64, 32).clone(), q.narrow0(32, 32).clone()));
      EXPECT_TRUE(same(qkv.narrow0(96, 16).clone(), k.narrow0(16, 16).clone()));
      EXPECT_TRUE(same(qkv.narrow0(112, 16).clone(), v.narrow0(16, 16).clone()));
      EXPECT_EQ(params.at("decoder.layers.0.mlp.linear_fc1.weight").shape(), (Shape{352, 64}));
      EXPECT_TRUE(params.count("output_layer.weight"));
    } else {
      EXPECT_EQ(params.at("decoder.layers.0.mlp.linear_fc1.weight").shape(), (Shape{256, 64}));
      EXPECT_EQ(params.at("embedding.position_embeddings.weight").shape(), (Shape{64, 64}));
      EXPECT_FALSE(params.count("output_layer.weight"));  // tied
    }
    auto hf = megatron_to_hf(params, spec);
    EXPECT_EQ(hf.size(), hfw.names().size()) << m;
    for (const auto& [name, t] : hf) EXPECT_TRUE(same(t, hfw.get(name))) << m << " " << name;
    // sharded save (small shards) and read back through the index
    std::string d = tmp_dir(std::string("rt_") + m);
    save_hf_checkpoint(d, hf, spec, 100000);
    EXPECT_TRUE(fs::exists(d + "/model.safetensors.index.json"));
    HFWeights back(d);
    for (const auto& [name, t] : hf) EXPECT_TRUE(same(back.get(name), t)) << name;
    EXPECT_EQ(read_hf_config(d + "/config.json").megatron_args(), spec.megatron_args());
    fs::remove_all(d);
  }
}

TEST(HFCheckpoint, BadCheckpointsNameTheTensor) {
  HFModelSpec spec = read_hf_config(fixture("gpt2_tiny/config.json"));
  HFWeights src(fixture("gpt2_tiny"));
  std::vector<std::pair<std::string, Tensor>> all;
  for (const auto& n : src.names()) all.push_back({n, src.get(n)});
  std::string d = tmp_dir("bad");
  auto write = [&](std::vector<std::pair<std::string, Tensor>> ts) {
    fs::remove_all(d);
    fs::create_directories(d);
    dc::save_safetensors(d + "/model.safetensors", ts);
    return d;
  };
  {  // missing tensor
    auto ts = all;
    ts.erase(std::remove_if(ts.begin(), ts.end(), [](auto& p) { return p.first == "transformer.h.1.mlp.c_fc.bias"; }), ts.end());
    HFWeights w(write(ts));
    expect_user_error([&] { hf_to_megatron(w, spec); }, "missing tensor 'transformer.h.1.mlp.c_fc.bias'");
  }
  {  // wrong shape
    auto ts = all;
    for (auto& p : ts)
      if (p.first == "transformer.h.0.mlp.c_fc.weight") p.second = Tensor::zeros({64, 128}, DType::kFloat32);
    HFWeights w(write(ts));
    expect_user_error([&] { hf_to_megatron(w, spec); }, "'transformer.h.0.mlp.c_fc.weight' has shape [64, 128]");
  }
  {  // tied config but a different lm_head
    auto ts = all;
    ts.push_back({"lm_head.weight", Tensor::zeros({256, 64}, DType::kFloat32)});
    HFWeights w(write(ts));
    expect_user_error([&] { hf_to_megatron(w, spec); }, "tie_word_embeddings is true but lm_head.weight differs");
  }
  {  // untied config without lm_head
    HFModelSpec untied = spec;
    untied.untie_embeddings_and_output_weights = true;
    HFWeights w(write(all));
    expect_user_error([&] { hf_to_megatron(w, untied); }, "tie_word_embeddings is false but lm_head.weight is missing");
  }
  {  // a tensor the config does not explain
    auto ts = all;
    ts.push_back({"transformer.h.2.ln_1.weight", Tensor::zeros({64}, DType::kFloat32)});
    HFWeights w(write(ts));
    expect_user_error([&] { hf_to_megatron(w, spec); }, "unexpected tensor 'transformer.h.2.ln_1.weight'");
  }
  {  // index naming a missing shard
    write(all);
    write_json(d + "/model.safetensors.index.json",
               {{"metadata", {{"total_size", 1}}}, {"weight_map", {{"transformer.wte.weight", "model-00002-of-00002.safetensors"}}}});
    expect_user_error([&] { HFWeights w(d); }, "model-00002-of-00002.safetensors");
  }
  fs::remove_all(d);
}

// End to end: the transformers-written tiny models imported into our GPTModel reproduce
// transformers' loss and logits (fixtures from tests/reference/hf/generate_hf_fixtures.py).
// Tolerance 1e-5 relative: fp32 on both sides, only summation order differs (issue 5 item 4).
// Holds for any kernel set: the fixture models reduce over n <= 256 values (hidden 64, ffn 176,
// vocab 256, 2 layers), typically sqrt(n)*u (~1e-6, u = 2^-24) per op, renormalized between layers.
#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/training/hf/hf_model.h"

TEST(HFCheckpoint, ImportedModelsMatchTransformersLogits) {
  for (const char* m : {"llama_tiny", "gpt2_tiny"}) {
    HFModelSpec spec = read_hf_config(fixture(std::string(m) + "/config.json"));
    auto cfg = transformer_config_from_hf(spec);
    models::gpt::GPTModel model(cfg, spec.vocab_size, spec.max_position_embeddings, 1);
    load_into_model(model, hf_to_megatron(HFWeights(fixture(m)), spec));
    datasets::GPTBatch batch = megatron::testing::read_hf_inputs(fixture(std::string(m) + "/inputs.json"));
    const int64_t b = batch.tokens.size(0), s = batch.tokens.size(1);
    auto loss = model.forward(batch, /*training=*/false).to_float_vector();
    double mean = 0;
    for (float x : loss) mean += x;
    mean /= static_cast<double>(loss.size());
    double want = nlohmann::json::parse(dc::read_text_file(fixture(std::string(m) + "/loss.json")))["loss"];
    EXPECT_NEAR(mean, want, 1e-5 * std::abs(want)) << m;
    dc::SafetensorsReader lr(fixture(std::string(m) + "/logits.safetensors"));
    auto ref = lr.tensor("logits").to_float_vector();  // [b, s, V]
    auto got = model.last_logits().to_float_vector();  // [s, b, V]
    const int64_t V = spec.vocab_size;
    double num = 0, den = 0;
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < s; ++j)
        for (int64_t v = 0; v < V; ++v) {
          double r = ref[(i * s + j) * V + v], g = got[(j * b + i) * V + v];
          num += (r - g) * (r - g);
          den += r * r;
        }
    EXPECT_LT(std::sqrt(num / den), 1e-5) << m;
  }
}
