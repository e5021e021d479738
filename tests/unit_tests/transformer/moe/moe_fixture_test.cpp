// megatron.cpp's MoE routing math against Megatron-LM's own moe_utils.py, run by
// tests/reference/moe/generate_moe_fixtures.py (torch on fixed float64 logits; see that script for
// the exact calls). Skipped until tests/reference/moe/megatron_routing.json is committed.
//
// Tolerances. Megatron computes the routing scores in float32 whatever the logits' dtype
// (torch.softmax(logits, dtype=torch.float32), torch.sigmoid(logits.float()), softplus(
// logits.float()).sqrt()) and casts the result back (probs.type_as(logits)); megatron.cpp computes
// them in float64 and rounds to the model dtype afterwards. So every value that passes through a
// score function carries float32 rounding on Megatron's side; the bound is, with u = 2^-24 (float32
// unit roundoff), X = max |logit| and M = max(1, the largest magnitude of the compared quantity):
//   kF32Bound = (2 X + E + 8) * u * M
// X u: rounding the logits to float32 (|δx| <= X u), amplified at most 2x by the softmax /
// normalisation Jacobian (rows sum to <= 2 in absolute value); E u: the float32 sum over the E
// experts of the normaliser (and of the column sums of the aux loss); 8 u: exp / sigmoid / sqrt /
// log1p (<= 1 ulp = 2 u each, two of them on a path), the division and the final cast.
// For X ~ 3.5, E = 8 that is ~1.4e-6 relative; the observed worst case is printed by each test.
// Values that do not pass through a score function (z-loss: logsumexp of the float64 logits, as
// z_loss_func does not cast) are compared at 1e-12. Routing maps, dropped sets and token orders
// are compared exactly, except where torch.topk breaks an exact tie (see
// TokenDroppingPermutationAndExpertBias).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "megatron/core/transformer/moe/moe_utils.h"

namespace megatron::transformer::moe {
namespace {

using nlohmann::json;

const std::string kFixture = std::string(MEGATRON_SOURCE_DIR) + "/tests/reference/moe/megatron_routing.json";
constexpr double kU = 0x1p-24;  // float32 unit roundoff

json load() {
  std::ifstream f(kFixture);
  return json::parse(f);
}

#define SKIP_WITHOUT_FIXTURE()                                                                            \
  if (!std::filesystem::exists(kFixture))                                                                 \
  GTEST_SKIP() << kFixture << " not generated yet: run tests/reference/moe/generate_moe_fixtures.py "     \
                              "--megatron .oracle/Megatron-LM on a machine with torch and commit the file"

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// The float32 bound above for a quantity whose largest magnitude is max|want|.
double f32_bound(const std::vector<double>& logits, int64_t E, const std::vector<double>& want) {
  return (2.0 * max_abs(logits) + static_cast<double>(E) + 8.0) * kU * std::max(1.0, max_abs(want));
}

// Worst |got - want| / bound seen by a test, printed at its end (how much of the bound is used).
struct Worst {
  double ratio = 0;
  std::string what;
  void see(double diff, double bound, const std::string& w) {
    if (bound > 0 && diff / bound > ratio) {
      ratio = diff / bound;
      what = w;
    }
  }
  ~Worst() { std::cout << "[ worst    ] " << ratio << " of the bound (" << what << ")\n"; }
};

void expect_near(const std::vector<double>& got, const std::vector<double>& want, double tol, const std::string& what,
                 Worst* worst = nullptr) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tol) << what << " [" << i << "]";
    if (worst) worst->see(std::abs(got[i] - want[i]), tol, what);
  }
}
std::vector<double> as_d(const std::vector<uint8_t>& v) { return std::vector<double>(v.begin(), v.end()); }

TEST(MoEMegatronOracle, TopKRoutingAndGradients) {
  SKIP_WITHOUT_FIXTURE();
  const json j = load();
  const int64_t T = j["T"], E = j["E"];
  const std::vector<double> logits = j["logits"], w = j["w"], bias = j["expert_bias"];
  Worst worst;
  ASSERT_EQ(j["topk"].size(), 8u);
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
    const std::vector<double> want_p = c["probs"], want_d = c["dlogits"];
    expect_near(as_d(m), c["routing_map"], 0, what + " map");
    expect_near(p, want_p, f32_bound(logits, E, want_p), what + " probs", &worst);
    expect_near(topk_routing_backward(w, o, st), want_d, f32_bound(logits, E, want_d), what + " dlogits", &worst);
  }
}

TEST(MoEMegatronOracle, AuxLossesZLossAndGradients) {
  SKIP_WITHOUT_FIXTURE();
  const json j = load();
  const int64_t T = j["T"], E = j["E"];
  const std::vector<double> logits = j["logits"];
  Worst worst;
  ASSERT_EQ(j["aux"].size(), 3u);
  for (const auto& a : j["aux"]) {
    const std::string sf = a["score_function"];
    const int64_t k = a["topk"], s = a["seq_length"], b = a["bsz"];
    const double coeff = a["coeff"];
    std::vector<double> scores;
    std::vector<uint8_t> map;
    compute_routing_scores_for_aux_loss(logits, T, E, k, sf, scores, map);
    const std::vector<double> want_scores = a["scores"];
    expect_near(scores, want_scores, f32_bound(logits, E, want_scores), sf + " scores", &worst);
    expect_near(as_d(map), a["routing_map"], 0, sf + " aux map");
    std::vector<double> tpe(E, 0.0), tpe_seq(b * E, 0.0);
    for (int64_t i = 0; i < T * E; ++i) {
      tpe[i % E] += map[i];
      tpe_seq[i % (b * E)] += map[i];
    }
    const std::vector<double> prev = a["global_prev_tokens"];
    std::vector<double> avg(E);
    for (int64_t e = 0; e < E; ++e) avg[e] = (prev[e] + tpe[e]) / 2;
    // The losses are sum(scores * counts) * E * coeff / (k N^2): the scores' float32 bound relative
    // to the loss itself (all terms are positive, so the relative error of the sum is at most that
    // of its terms).
    auto loss_check = [&](double got, double want, const std::string& name) {
      const double tol = f32_bound(logits, E, {1.0}) * std::abs(want);
      EXPECT_NEAR(got, want, tol) << sf << " " << name;
      worst.see(std::abs(got - want), tol, sf + " " + name);
    };
    loss_check(switch_load_balancing_loss(scores, tpe, T, k, E, coeff), a["aux_loss"], "aux_loss");
    // seq_aux_loss: scores as [s, b * E] (column bi * E + e), num_experts = E, divided by b.
    loss_check(switch_load_balancing_loss(scores, tpe_seq, s, k, E, coeff) / b, a["seq_aux_loss"], "seq_aux_loss");
    loss_check(switch_load_balancing_loss(scores, avg, T, k, E, coeff), a["global_aux_loss"], "global_aux_loss");
    // Gradients as TopKRouter forms them: d aux / d scores[t, c] = counts[c] * E * coeff / (k N^2) / div.
    auto grad = [&](const std::vector<double>& counts, double n, double div) {
      const auto cols = static_cast<int64_t>(counts.size());
      std::vector<double> ds(T * E);
      for (int64_t i = 0; i < T * E; ++i)
        ds[i] = counts[i % cols] * double(E) * coeff / (double(k) * n * n) / div;
      return aux_scores_backward(logits, scores, ds, T, E, sf);
    };
    for (const auto& [name, g] : {std::pair{"aux_loss", grad(tpe, T, 1)}, std::pair{"seq_aux_loss", grad(tpe_seq, s, b)},
                                  std::pair{"global_aux_loss", grad(avg, T, 1)}}) {
      const std::vector<double> want = a["dlogits"][name];
      // The gradient is small (~coeff / T); bound it relative to its own scale, not max(1, .).
      const double tol = f32_bound(logits, E, {1.0}) * max_abs(want);
      expect_near(g, want, tol, sf + " " + name + " grad", &worst);
    }
  }
  std::vector<double> dz;
  EXPECT_NEAR(z_loss(logits, T, E, j["z"]["coeff"], &dz), j["z"]["z_loss"].get<double>(), 1e-12);
  expect_near(dz, j["z"]["dlogits"], 1e-12, "z-loss grad");
}

// apply_router_token_dropping keeps, per expert, the `capacity` tokens with the largest key (the
// probability, or the 0/1 routing-map entry for the "position" policy) by torch.topk(dim=0,
// sorted=False). Where the capacity boundary falls inside a run of equal keys (always for
// "position", and for the zero-probability padding of --moe-pad-expert-input-to-capacity), which of
// the tied tokens torch keeps is torch's tie order: CUDA's topk keeps the first seen (lowest token
// index: "choose the first seen set", aten/src/ATen/native/cuda/TensorTopK.cu), which is what
// "position" means (drop the later tokens) and what megatron.cpp does; CPU torch.topk selects with
// std::nth_element and keeps an arbitrary subset of the ties. So against the CPU oracle each entry
// whose fate the keys force (key above / below the capacity-th largest key) must be equal exactly,
// and among the tied entries the same number must be kept; against the CUDA oracle ("drop_cuda",
// written when the generator ran where CUDA is available) every entry must be equal exactly.
void check_drop(const json& d, int64_t T, int64_t E, bool ties_exact) {
  std::vector<double> p = d["probs_in"];
  const std::vector<double> probs_in = d["probs_in"];
  const std::vector<int> mi = d["map_in"], want_map = d["routing_map"];
  const std::vector<double> want_p = d["probs"];
  std::vector<uint8_t> m(mi.begin(), mi.end());
  const std::string policy = d["policy"];
  const bool pad = d["pad"];
  const double cf = d["capacity_factor"];
  apply_router_token_dropping(p, m, T, E, d["topk"], cf, policy, pad);
  const std::string what = policy + (pad ? " pad" : " nopad") + " cf " + std::to_string(cf) + (ties_exact ? " cuda" : " cpu");
  const int64_t cap = get_capacity(T * d["topk"].get<int64_t>(), E, cf);
  int64_t tied_columns = 0;
  for (int64_t e = 0; e < E; ++e) {
    std::vector<double> key(T);
    for (int64_t t = 0; t < T; ++t) key[t] = policy == "probs" ? probs_in[t * E + e] : mi[t * E + e];
    std::vector<double> sorted = key;
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    const double kth = cap > T ? -1.0 : sorted[cap - 1];  // cap > T: everything kept, nothing tied
    // Entries with key == kth are decided by the tie order only if there are more of them than
    // places left (capacity minus the keys above kth); otherwise all of them are kept.
    const auto above = std::count_if(key.begin(), key.end(), [kth](double v) { return v > kth; });
    const auto at_kth = std::count(key.begin(), key.end(), kth);
    const bool tie_decides = !ties_exact && at_kth > cap - above;
    int64_t got_tied = 0, want_tied = 0, n_tied = 0;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t i = t * E + e;
      const std::string at = what + " token " + std::to_string(t) + " expert " + std::to_string(e);
      // Final probs are routing_probs * final_map (Megatron) for every entry.
      EXPECT_EQ(p[i], m[i] ? probs_in[i] : 0.0) << at;
      EXPECT_EQ(want_p[i], want_map[i] ? probs_in[i] : 0.0) << at << " (oracle's own probs)";
      if (!tie_decides || key[t] != kth) {
        EXPECT_EQ(m[i], want_map[i]) << at;
      } else {
        ++n_tied;
        got_tied += m[i];
        want_tied += want_map[i];
      }
    }
    EXPECT_EQ(got_tied, want_tied) << what << " expert " << e << ": tokens kept among " << n_tied << " tied";
    tied_columns += n_tied > 0;
  }
  if (!ties_exact) std::cout << "[ ties     ] " << what << ": " << tied_columns << " experts whose kept set the tie order decides\n";
}

TEST(MoEMegatronOracle, TokenDroppingPermutationAndExpertBias) {
  SKIP_WITHOUT_FIXTURE();
  const json j = load();
  const int64_t T = j["T"], E = j["E"];
  ASSERT_EQ(j["drop"].size(), 12u);
  for (const auto& d : j["drop"]) check_drop(d, T, E, false);
  if (j.contains("drop_cuda")) {
    ASSERT_EQ(j["drop_cuda"].size(), 12u);
    for (const auto& d : j["drop_cuda"]) check_drop(d, T, E, true);
  } else {
    std::cout << "[ note     ] " << kFixture << " has no drop_cuda cases (generated without CUDA): the tie order "
              << "of the token dropping is checked against CPU torch only as far as ties allow\n";
  }
  const std::vector<int> mi = j["permute"]["routing_map"];
  std::vector<uint8_t> m(mi.begin(), mi.end());
  const std::vector<int64_t> idx = permute_indices(m, T, E, 0, E, nullptr);
  EXPECT_EQ(idx, j["permute"]["sorted_indices"].get<std::vector<int64_t>>());
  // permuted_probs: row i (expert-major) carries probs[idx[i], its expert]; the generator permutes
  // the same probs it feeds to the dropping cases (drop[*].probs_in).
  std::vector<int64_t> per_expert;
  permute_indices(m, T, E, 0, E, &per_expert);
  const std::vector<double> probs = j["drop"][0]["probs_in"], want_pp = j["permute"]["permuted_probs"];
  std::vector<double> pp;
  for (int64_t e = 0, row = 0; e < E; ++e)
    for (int64_t r = 0; r < per_expert[e]; ++r, ++row) pp.push_back(probs[idx[row] * E + e]);
  expect_near(pp, want_pp, 0, "permuted probs");
  const json& bu = j["bias_update"];
  // float32 on both sides (Megatron's fp32 expert_bias buffer): exact.
  expect_near(updated_expert_bias(bu["tokens_per_expert"], std::vector<double>(E, 0.0), bu["rate"]), bu["updated"], 0,
              "expert bias");
}

}  // namespace
}  // namespace megatron::transformer::moe
