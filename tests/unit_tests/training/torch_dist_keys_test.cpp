// The torch_dist keys of a model mixing dense and MoE layers, with an MoE MTP module, against
// Megatron-LM's naming written out by hand from its sharded_state_dict code (local spec):
//  * TransformerBlock.sharded_state_dict: a --moe-layer-freq list (or int > 1) sets
//    non_homogeneous_layers, so every decoder layer is keyed "decoder.layers.<i>.…" without a
//    layer axis; MultiTokenPredictionBlock keys "mtp.layers.<k>.…" the same way, its layer under
//    "transformer_layer" (MultiTokenPredictionLayer's backward-compatible prefix mapping);
//  * TransformerLayer's sharded_state_dict_keys_map (local spec): input_layernorm. ->
//    self_attention.linear_qkv.layer_norm_, pre_mlp_layernorm. -> mlp.linear_fc1.layer_norm_ (MoE
//    layers too);
//  * SequentialMLP: the routed experts of a layer are one tensor "mlp.experts.experts.linear_fc{1,2}.weight"
//    with the expert axis first; TopKRouter "mlp.router.weight"; SharedExpertMLP "mlp.shared_experts.…";
//  * the None _extra_state ShardedObjects of the local linear layers, unique key
//    "<module>._extra_state/shard_<offsets>_<shape>" with the sharded offsets of their weights
//    (Megatron's _get_extra_state_offsets: shard_0_1 without any; the expert axis for experts);
//    none for output_layer (GPTModel.sharded_state_dict pops it).
#include <gtest/gtest.h>

#include <set>

#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/training/checkpointing.h"
#include "megatron/core/utils/errors.h"
#include "megatron/training/torch_dist_checkpoint.h"
#include "test_utils/tiny_model.h"

namespace megatron {
namespace {

transformer::TransformerConfig mixed_config() {
  transformer::TransformerConfig c = testing::tiny_llama_config(32, 2, 64);
  c.num_moe_experts = 4;
  c.moe_ffn_hidden_size = 16;
  c.moe_router_topk = 2;
  c.moe_layer_pattern = {0, 1};
  c.moe_non_homogeneous_layers = true;  // --moe-layer-freq '([0]+[1])' (a list)
  c.moe_shared_expert_intermediate_size = 8;
  c.mtp_num_layers = 1;
  c.validate();
  return c;
}

// The two-layer MoE model of the stacked-layer and gate tests: 2 experts of 16, top-1 (pre-softmax).
transformer::TransformerConfig tiny_moe_config() {
  transformer::TransformerConfig c = testing::tiny_llama_config(32, 2, 64);
  c.num_moe_experts = 2;
  c.moe_ffn_hidden_size = 16;
  c.moe_router_topk = 1;
  c.moe_router_pre_softmax = true;
  return c;
}

// The model's sharded tensors (`model`) and their global shapes by torch_dist key (`shapes`).
void sharded_tensors(models::gpt::GPTModel& m, const transformer::TransformerConfig& c,
                     std::vector<dist_checkpointing::ShardedTensor>& model, std::map<std::string, Shape>& shapes) {
  for (auto& p : m.parameters())
    for (auto& t : training::parameter_sharded_tensors(p, c.num_layers)) {
      shapes[training::torch_dist_model_key(t.key)] = t.global_shape;
      model.push_back(t);
    }
}

TEST(TorchDistKeys, MixedDenseMoEWithMtpIsMegatronsNaming) {
  const auto c = mixed_config();
  models::gpt::GPTModel m(c, 128, 16, 1);
  std::vector<dist_checkpointing::ShardedTensor> model;
  std::map<std::string, Shape> shapes;
  sharded_tensors(m, c, model, shapes);
  auto layer = [](const std::string& pre, bool moe) {
    std::vector<std::string> k = {pre + "self_attention.linear_qkv.layer_norm_weight", pre + "self_attention.linear_qkv.weight",
                                  pre + "self_attention.linear_proj.weight", pre + "mlp.linear_fc1.layer_norm_weight"};
    for (const char* s : moe ? std::vector<const char*>{"mlp.router.weight", "mlp.experts.experts.linear_fc1.weight",
                                                        "mlp.experts.experts.linear_fc2.weight",
                                                        "mlp.shared_experts.linear_fc1.weight",
                                                        "mlp.shared_experts.linear_fc2.weight"}
                             : std::vector<const char*>{"mlp.linear_fc1.weight", "mlp.linear_fc2.weight"})
      k.push_back(pre + s);
    return k;
  };
  std::set<std::string> want = {"embedding.word_embeddings.weight", "decoder.final_layernorm.weight", "output_layer.weight",
                                "mtp.layers.0.enorm.weight",        "mtp.layers.0.hnorm.weight",
                                "mtp.layers.0.eh_proj.weight",      "mtp.layers.0.final_layernorm.weight"};
  for (const auto& v : {layer("decoder.layers.0.", false), layer("decoder.layers.1.", true),
                        layer("mtp.layers.0.transformer_layer.", true)})
    want.insert(v.begin(), v.end());
  std::set<std::string> got;
  for (const auto& [k, s] : shapes) got.insert(k);
  EXPECT_EQ(got, want);
  // Global shapes: no layer axis; experts [E, rows, cols] (SwiGLU fc1: 2 x 16 rows).
  EXPECT_EQ(shapes["decoder.layers.1.mlp.experts.experts.linear_fc1.weight"], (Shape{4, 32, 32}));
  EXPECT_EQ(shapes["mtp.layers.0.transformer_layer.mlp.experts.experts.linear_fc2.weight"], (Shape{4, 32, 16}));
  EXPECT_EQ(shapes["decoder.layers.0.self_attention.linear_qkv.weight"], (Shape{64, 32}));
  EXPECT_EQ(shapes["mtp.layers.0.transformer_layer.mlp.router.weight"], (Shape{4, 32}));

  std::set<std::string> want_obj;
  for (const char* pre : {"decoder.layers.0.", "decoder.layers.1.", "mtp.layers.0.transformer_layer."}) {
    for (const char* lin : {"self_attention.linear_qkv", "self_attention.linear_proj"})
      want_obj.insert(std::string(pre) + lin + "._extra_state/shard_0_1");
    const bool moe = std::string(pre) != "decoder.layers.0.";
    for (const char* lin : {"linear_fc1", "linear_fc2"}) {
      if (!moe) {
        want_obj.insert(std::string(pre) + "mlp." + lin + "._extra_state/shard_0_1");
        continue;
      }
      want_obj.insert(std::string(pre) + "mlp.shared_experts." + lin + "._extra_state/shard_0_1");
      for (int e = 0; e < 4; ++e)
        want_obj.insert(std::string(pre) + "mlp.experts.experts." + lin + "._extra_state/shard_" + std::to_string(e) + "_4");
    }
  }
  want_obj.insert("mtp.layers.0.eh_proj._extra_state/shard_0_1");
  // Optimizer states of the same pieces carry no objects.
  auto with_optim = model;
  for (const auto& t : model) with_optim.push_back(training::optimizer_piece("exp_avg", t, t.data));
  const auto obj = training::torch_dist_extra_state_keys(with_optim);
  EXPECT_EQ(std::set<std::string>(obj.begin(), obj.end()), want_obj);
  EXPECT_EQ(obj.size(), want_obj.size()) << "duplicate objects";
}

// Stacked layers (a homogeneous model): Megatron's "decoder.layers.X" keys with the layer axis,
// the objects at shard_<layer>_<L> (and shard_<layer>.<expert>_<L>.<E> for experts).
TEST(TorchDistKeys, StackedLayersKeepTheLayerAxisInObjects) {
  transformer::TransformerConfig c = tiny_moe_config();
  c.validate();
  models::gpt::GPTModel m(c, 128, 16, 1);
  std::vector<dist_checkpointing::ShardedTensor> model;
  for (auto& p : m.parameters())
    for (auto& t : training::parameter_sharded_tensors(p, c.num_layers)) model.push_back(t);
  const auto obj = training::torch_dist_extra_state_keys(model);
  const std::set<std::string> got(obj.begin(), obj.end());
  for (const char* k : {"decoder.layers.self_attention.linear_qkv._extra_state/shard_1_2",
                        "decoder.layers.mlp.experts.experts.linear_fc1._extra_state/shard_0.1_2.2",
                        "decoder.layers.mlp.experts.experts.linear_fc2._extra_state/shard_1.0_2.2"})
    EXPECT_TRUE(got.count(k)) << k;
  EXPECT_EQ(got.size(), 2u * 2u + 2u * 2u * 2u);  // (qkv, proj) x 2 layers + (fc1, fc2) x 2 layers x 2 experts
  EXPECT_EQ(training::torch_dist_model_key("decoder.layers.pre_mlp_layernorm.weight"), "decoder.layers.mlp.linear_fc1.layer_norm_weight");
  EXPECT_EQ(training::model_key_from_torch_dist("decoder.layers.3.self_attention.linear_qkv.layer_norm_bias"),
            "decoder.layers.3.input_layernorm.bias");
}

// --moe-shared-expert-gate: SharedExpertMLP.sharded_state_dict adds "<prefix>gate_weight" (a
// make_sharded_tensor_for_checkpoint of the [1, h] parameter with the layer's sharded offsets:
// stacked [layers, 1, h], per layer [1, h]); it is no linear module, so no _extra_state object.
TEST(TorchDistKeys, SharedExpertGateKeys) {
  for (bool stacked : {true, false}) {
    transformer::TransformerConfig c = tiny_moe_config();
    c.moe_shared_expert_intermediate_size = 8;
    c.moe_shared_expert_gate = true;
    if (!stacked) {
      c.moe_layer_pattern = {0, 1};
      c.moe_non_homogeneous_layers = true;
    }
    c.validate();
    models::gpt::GPTModel m(c, 128, 16, 1);
    std::vector<dist_checkpointing::ShardedTensor> model;
    std::map<std::string, Shape> shapes;
    sharded_tensors(m, c, model, shapes);
    const std::string key = stacked ? "decoder.layers.mlp.shared_experts.gate_weight" : "decoder.layers.1.mlp.shared_experts.gate_weight";
    ASSERT_TRUE(shapes.count(key)) << key;
    EXPECT_EQ(shapes[key], stacked ? (Shape{2, 1, 32}) : (Shape{1, 32}));
    if (!stacked) {
      EXPECT_FALSE(shapes.count("decoder.layers.0.mlp.shared_experts.gate_weight"));  // the dense layer
    }
    for (const auto& k : training::torch_dist_extra_state_keys(model)) EXPECT_EQ(k.find("gate"), std::string::npos) << k;
  }
}

// The key checks before a torch_dist load (docs/checkpointing.md, "What is read"): every missing key
// is named once in one error, with the checkpoint key it was looked for under; the unused tensors
// leave out what was loaded, the optimizer when it is not loaded and megatron.cpp's own tensors.
TEST(TorchDistKeys, KeyChecksNameEveryMissingAndUnusedTensor) {
  training::TorchDistReadPlan plan;
  plan.tensor_keys = {"decoder.layers.mlp.experts.experts.linear_fc1.weight", "embedding.word_embeddings.weight",
                      "megatron_cpp.decoder.layers.self_attention.linear_qkv._extra_state.fp8.scale",
                      "optimizer.state.exp_avg.embedding.word_embeddings.weight", "output_layer.weight"};
  const std::set<std::string> keys(plan.tensor_keys.begin(), plan.tensor_keys.end());
  plan.key_map = [](const std::string& k) { return k == "decoder.layers.mlp.linear_fc1.weight" ? "decoder.layers.mlp.fc1" : k; };
  plan.has = [keys, &plan](const std::string& k) { return keys.count(plan.key_map(k)) > 0; };
  const std::vector<std::string> requested = {"embedding.word_embeddings.weight", "decoder.layers.mlp.linear_fc1.weight",
                                              "decoder.layers.mlp.linear_fc1.weight", "decoder.layers.mlp.linear_fc2.weight"};
  try {
    training::check_torch_dist_keys_present(plan, requested, "ck");
    FAIL() << "missing keys accepted";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()),
              "ck/.metadata: 2 tensor(s) of this model are not in the checkpoint: 'decoder.layers.mlp.linear_fc1.weight' "
              "(looked for as 'decoder.layers.mlp.fc1'), 'decoder.layers.mlp.linear_fc2.weight' (a checkpoint of another "
              "model, or a key naming megatron.cpp does not know: docs/checkpointing.md)");
  }
  EXPECT_EQ(training::unused_torch_dist_keys(plan, requested, false),
            (std::vector<std::string>{"decoder.layers.mlp.experts.experts.linear_fc1.weight", "output_layer.weight"}));
  EXPECT_EQ(training::unused_torch_dist_keys(plan, requested, true),
            (std::vector<std::string>{"decoder.layers.mlp.experts.experts.linear_fc1.weight",
                                      "optimizer.state.exp_avg.embedding.word_embeddings.weight", "output_layer.weight"}));
  EXPECT_NO_THROW(training::check_torch_dist_keys_present(plan, {"output_layer.weight"}, "ck"));
}

}  // namespace
}  // namespace megatron
