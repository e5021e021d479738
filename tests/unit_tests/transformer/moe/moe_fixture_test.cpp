// megatron.cpp's MoE routing math against Megatron-LM's own moe_utils.py, run by
// tests/reference/moe/generate_moe_fixtures.py (float64 torch on fixed logits; see that script for
// the exact calls). Skipped until tests/reference/moe/megatron_routing.json is committed.
// Tolerance 1e-9 absolute on O(1) values: both sides compute in float64; only the order of a few
// sums differs. Routing maps, token orders and dropped sets must be equal exactly.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "megatron/core/transformer/moe/moe_utils.h"

namespace megatron::transformer::moe {
namespace {

using nlohmann::json;

const std::string kFixture = std::string(MEGATRON_SOURCE_DIR) + "/tests/reference/moe/megatron_routing.json";

json load() {
  std::ifstream f(kFixture);
  return json::parse(f);
}

#define SKIP_WITHOUT_FIXTURE()                                                                            \
  if (!std::filesystem::exists(kFixture))                                                                 \
  GTEST_SKIP() << kFixture << " not generated yet: run tests/reference/moe/generate_moe_fixtures.py "     \
                              "--megatron .oracle/Megatron-LM on a machine with torch and commit the file"

void expect_near(const std::vector<double>& got, const std::vector<double>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << what << " [" << i << "]";
}
std::vector<double> as_d(const std::vector<uint8_t>& v) { return std::vector<double>(v.begin(), v.end()); }

TEST(MoEMegatronOracle, TopKRoutingAndGradients) {
  SKIP_WITHOUT_FIXTURE();
  const json j = load();
  const int64_t T = j["T"], E = j["E"];
  const std::vector<double> logits = j["logits"], w = j["w"], bias = j["expert_bias"];
  for (const auto& c : j["topk"]) {
    const json& k = c["case"];
    TopKOptions o;
    o.topk = k["topk"];
    o.use_pre_softmax = k.value("use_pre_softmax", false);
    o.num_groups = k.value("num_groups", 0);
    o.group_topk = k.value("group_topk", 0);
    if (k.contains("scaling_factor")) o.scaling_factor = k["scaling_factor"].get<double>();
    o.score_function = k["score_function"];
    o.expert_bias = k.value("expert_bias", false) ? &bias : nullptr;
    std::vector<double> p;
    std::vector<uint8_t> m;
    TopKState st;
    topk_routing_with_score_function(logits, T, E, o, p, m, st);
    const std::string what = k.dump();
    expect_near(p, c["probs"], 1e-9, what + " probs");
    expect_near(as_d(m), c["routing_map"], 0, what + " map");
    expect_near(topk_routing_backward(w, o, st), c["dlogits"], 1e-9, what + " dlogits");
  }
}

TEST(MoEMegatronOracle, AuxLossesZLossAndGradients) {
  SKIP_WITHOUT_FIXTURE();
  const json j = load();
  const int64_t T = j["T"], E = j["E"];
  const std::vector<double> logits = j["logits"];
  for (const auto& a : j["aux"]) {
    const std::string sf = a["score_function"];
    const int64_t k = a["topk"], s = a["seq_length"], b = a["bsz"];
    const double coeff = a["coeff"];
    std::vector<double> scores;
    std::vector<uint8_t> map;
    compute_routing_scores_for_aux_loss(logits, T, E, k, sf, scores, map);
    expect_near(scores, a["scores"], 1e-12, sf + " scores");
    expect_near(as_d(map), a["routing_map"], 0, sf + " aux map");
    std::vector<double> tpe(E, 0.0), tpe_seq(b * E, 0.0);
    for (int64_t i = 0; i < T * E; ++i) {
      tpe[i % E] += map[i];
      tpe_seq[i % (b * E)] += map[i];
    }
    const std::vector<double> prev = a["global_prev_tokens"];
    std::vector<double> avg(E);
    for (int64_t e = 0; e < E; ++e) avg[e] = (prev[e] + tpe[e]) / 2;
    EXPECT_NEAR(switch_load_balancing_loss(scores, tpe, T, k, E, coeff), a["aux_loss"].get<double>(), 1e-12) << sf;
    EXPECT_NEAR(switch_load_balancing_loss(scores, tpe_seq, s, k, b * E, coeff) / b, a["seq_aux_loss"].get<double>(), 1e-12)
        << sf;
    EXPECT_NEAR(switch_load_balancing_loss(scores, avg, T, k, E, coeff), a["global_aux_loss"].get<double>(), 1e-12) << sf;
    // Gradients as TopKRouter forms them: d aux / d scores[t, e] = counts * E * coeff / (k N^2).
    auto grad = [&](const std::vector<double>& counts, int64_t cols, double n, double div) {
      std::vector<double> ds(T * E);
      for (int64_t i = 0; i < T * E; ++i)
        ds[i] = counts[i % cols] * double(cols) * coeff / (double(k) * n * n) / div;
      return aux_scores_backward(logits, scores, ds, T, E, sf);
    };
    expect_near(grad(tpe, E, T, 1), a["dlogits"]["aux_loss"], 1e-12, sf + " aux grad");
    expect_near(grad(tpe_seq, b * E, s, b), a["dlogits"]["seq_aux_loss"], 1e-12, sf + " seq grad");
    expect_near(grad(avg, E, T, 1), a["dlogits"]["global_aux_loss"], 1e-12, sf + " global grad");
  }
  std::vector<double> dz;
  EXPECT_NEAR(z_loss(logits, T, E, j["z"]["coeff"], &dz), j["z"]["z_loss"].get<double>(), 1e-12);
  expect_near(dz, j["z"]["dlogits"], 1e-12, "z-loss grad");
}

TEST(MoEMegatronOracle, TokenDroppingPermutationAndExpertBias) {
  SKIP_WITHOUT_FIXTURE();
  const json j = load();
  const int64_t T = j["T"], E = j["E"];
  for (const auto& d : j["drop"]) {
    std::vector<double> p = d["probs_in"];
    const std::vector<int> mi = d["map_in"];
    std::vector<uint8_t> m(mi.begin(), mi.end());
    apply_router_token_dropping(p, m, T, E, d["topk"], d["capacity_factor"], d["policy"], d["pad"]);
    const std::string what = d.dump().substr(0, 80);
    expect_near(as_d(m), d["routing_map"], 0, what + " map");
    expect_near(p, d["probs"], 1e-15, what + " probs");
  }
  const std::vector<int> mi = j["permute"]["routing_map"];
  std::vector<uint8_t> m(mi.begin(), mi.end());
  const std::vector<int64_t> idx = permute_indices(m, T, E, 0, E, nullptr);
  EXPECT_EQ(idx, j["permute"]["sorted_indices"].get<std::vector<int64_t>>());
  const json& bu = j["bias_update"];
  expect_near(updated_expert_bias(bu["tokens_per_expert"], std::vector<double>(E, 0.0), bu["rate"]), bu["updated"], 1e-9,
              "expert bias");
}

}  // namespace
}  // namespace megatron::transformer::moe
