// parallel_state: group layouts computed without processes.
// References: the explicit groups of docs/megatron-reference.md#parallel-groups (16 GPUs, TP2 CP2 DP2 PP2, written out by
// hand), and a brute-force enumeration from the mapping formula
//   global_rank = tp + TP*(cp + CP*(dp + DP*pp))            (order tp-cp-ep-dp-pp)
//   global_rank = tp + TP*(cp + CP*(pp + PP*dp))            (--use-tp-pp-dp-mapping)
// which is independent of the masked-orthogonal algorithm under test. Exact integer comparisons.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "megatron/core/parallel_state.h"

namespace ps = megatron::parallel_state;
using ps::RankGroups;

namespace {
int rank_of(int tp, int cp, int dp, int pp, int TP, int CP, int DP, int PP, bool tp_pp_dp) {
  return tp_pp_dp ? tp + TP * (cp + CP * (pp + PP * dp)) : tp + TP * (cp + CP * (dp + DP * pp));
}

// Brute force: the group of kind `dims` (subset of "tp","cp","dp","pp") containing each rank,
// members ordered by their varying coordinates in mapping order (first fastest).
std::set<std::vector<int>> brute_groups(const std::string& kind, int TP, int CP, int DP, int PP, bool tp_pp_dp) {
  auto has = [&](const char* d) {
    std::string k = "-" + kind + "-";
    return k.find(std::string("-") + d + "-") != std::string::npos;
  };
  std::set<std::vector<int>> out;
  for (int tp = 0; tp < TP; ++tp)
    for (int cp = 0; cp < CP; ++cp)
      for (int dp = 0; dp < DP; ++dp)
        for (int pp = 0; pp < PP; ++pp) {
          // Enumerate members: all combinations of varying coords; sort by global rank, which
          // equals mapping order since a group's members differ only in the varying coords and
          // the mapping is monotone in each (first varying dim fastest).
          std::vector<int> g;
          for (int a = 0; a < (has("tp") ? TP : 1); ++a)
            for (int b = 0; b < (has("cp") ? CP : 1); ++b)
              for (int c = 0; c < (has("dp") ? DP : 1); ++c)
                for (int d = 0; d < (has("pp") ? PP : 1); ++d)
                  g.push_back(rank_of(has("tp") ? a : tp, has("cp") ? b : cp, has("dp") ? c : dp, has("pp") ? d : pp,
                                      TP, CP, DP, PP, tp_pp_dp));
          std::sort(g.begin(), g.end());
          out.insert(g);
        }
  return out;
}

std::set<std::vector<int>> as_set(const RankGroups& g) { return {g.begin(), g.end()}; }
}  // namespace

TEST(ParallelStateLayout, Megatron16GpuExample) {
  ps::ParallelConfig c;
  c.tensor_model_parallel_size = 2;
  c.context_parallel_size = 2;
  c.pipeline_model_parallel_size = 2;
  auto L = ps::compute_group_layout(c, 16);
  EXPECT_EQ(L.data_parallel_size, 2);
  EXPECT_EQ(L.order, "tp-cp-ep-dp-pp");
  // docs/megatron-reference.md#parallel-groups, written out by hand.
  EXPECT_EQ(L.groups["tp"], (RankGroups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(L.groups["cp"], (RankGroups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(L.groups["dp"], (RankGroups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(L.groups["pp"], (RankGroups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  EXPECT_EQ(L.groups["dp-cp"], (RankGroups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(L.groups["tp-pp"], (RankGroups{{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}}));
  EXPECT_EQ(L.groups["tp-cp"], (RankGroups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}));
  EXPECT_EQ(L.groups["tp-dp"], (RankGroups{{0, 1, 4, 5}, {2, 3, 6, 7}, {8, 9, 12, 13}, {10, 11, 14, 15}}));
  EXPECT_EQ(L.groups["tp-dp-cp"], (RankGroups{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}}));
  // PP=2: first and last stage of every pp group; position embedding on the first stage.
  EXPECT_EQ(L.groups["embedding"], L.groups["pp"]);
  EXPECT_EQ(L.groups["position_embedding"], (RankGroups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  auto co = ps::rank_coordinates(L, 13);  // 13 = 1 + 2*(0 + 2*(1 + 2*1))
  EXPECT_EQ(co.tp, 1);
  EXPECT_EQ(co.cp, 0);
  EXPECT_EQ(co.dp, 1);
  EXPECT_EQ(co.pp, 1);
}

// The expert groups (Megatron's expert_decoder_rank_generator: tp = expert-TP, ep, dp = expert-DP,
// pp; same order string). 8 ranks, TP2 PP2 and EP2 with expert-TP1: expert rank =
// etp + 1*(ep + 2*(edp + 2*pp)), i.e. ep = rank % 2, edp = rank / 2 % 2, pp = rank / 4, written
// out by hand from that formula. The two TP ranks of a dense TP group ({0,1}) are the two EP ranks.
TEST(ParallelStateLayout, ExpertGroupsEtp1Ep2) {
  ps::ParallelConfig c;
  c.tensor_model_parallel_size = 2;
  c.pipeline_model_parallel_size = 2;
  c.expert_model_parallel_size = 2;
  c.expert_tensor_parallel_size = 1;
  auto L = ps::compute_group_layout(c, 8);
  EXPECT_EQ(L.groups["ep"], (RankGroups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(L.groups["expt-tp"], (RankGroups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(L.groups["tp-ep"], (RankGroups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(L.groups["expt-dp"], (RankGroups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(L.groups["tp-ep-pp"], (RankGroups{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  // The dense model-parallel group for comparison (tp-pp): {0,1,4,5} too here, but with EP4 on
  // 8 ranks (TP1 PP1) tp-ep-pp spans the EP group while tp-pp is one rank.
  ps::ParallelConfig e;
  e.expert_model_parallel_size = 4;
  auto L4 = ps::compute_group_layout(e, 8);
  EXPECT_EQ(L4.groups["tp-ep-pp"], (RankGroups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(L4.groups["expt-dp"], (RankGroups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(L4.groups["tp-pp"].size(), 8u);
}

// MoE parallel folding with context parallelism (Megatron's initialize_model_parallel: the expert
// rank generator has cp = 1 and expert-DP = world / (expert-TP x EP x PP), so the EP ranks are
// taken from the dense CP x DP ranks). 8 ranks, CP2 DP4 (dense rank = cp + 2*dp), EP4 expert-TP1:
// expert rank = ep + 4*edp, i.e. ep = rank % 4, edp = rank / 4, written out by hand. The EP group
// {0,1,2,3} spans two CP groups ({0,1}, {2,3}) and two DP replicas; expt-dp pairs rank r with r + 4.
TEST(ParallelStateLayout, ExpertGroupsFoldContextParallel) {
  ps::ParallelConfig c;
  c.context_parallel_size = 2;
  c.expert_model_parallel_size = 4;
  c.expert_tensor_parallel_size = 1;
  auto L = ps::compute_group_layout(c, 8);
  EXPECT_EQ(L.data_parallel_size, 4);
  EXPECT_EQ(L.groups["cp"], (RankGroups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(L.groups["dp-cp"], (RankGroups{{0, 1, 2, 3, 4, 5, 6, 7}}));
  EXPECT_EQ(L.groups["ep"], (RankGroups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(L.groups["tp-ep"], L.groups["ep"]);
  EXPECT_EQ(L.groups["expt-dp"], (RankGroups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(L.groups["tp-ep-pp"], L.groups["ep"]);
  // EP2 x CP2 on 2 ranks: the EP group is the CP group, expert-DP 1.
  c.expert_model_parallel_size = 2;
  auto L2 = ps::compute_group_layout(c, 2);
  EXPECT_EQ(L2.groups["ep"], L2.groups["cp"]);
  EXPECT_EQ(L2.groups["expt-dp"], (RankGroups{{0}, {1}}));
}

TEST(ParallelStateLayout, MatchesMappingFormulaForManyLayouts) {
  const std::vector<std::string> kinds = {"tp", "cp", "dp", "dp-cp", "pp", "tp-pp", "tp-cp", "tp-dp", "tp-dp-cp"};
  for (bool tp_pp_dp : {false, true})
    for (int TP : {1, 2, 4})
      for (int CP : {1, 2})
        for (int PP : {1, 2, 3})
          for (int DP : {1, 2, 3}) {
            ps::ParallelConfig c;
            c.tensor_model_parallel_size = TP;
            c.context_parallel_size = CP;
            c.pipeline_model_parallel_size = PP;
            c.use_tp_pp_dp_mapping = tp_pp_dp;
            const int world = TP * CP * PP * DP;
            auto L = ps::compute_group_layout(c, world);
            ASSERT_EQ(L.data_parallel_size, DP);
            for (const auto& k : kinds) {
              // Megatron's groups list members in mapping order; with tp-pp-dp mapping and both
              // dp and pp varying (not in these kinds) sorting by rank is still mapping order.
              EXPECT_EQ(as_set(L.groups[k]), brute_groups(k, TP, CP, DP, PP, tp_pp_dp))
                  << k << " TP" << TP << " CP" << CP << " PP" << PP << " DP" << DP << " tppdp=" << tp_pp_dp;
              for (const auto& g : L.groups[k]) EXPECT_TRUE(std::is_sorted(g.begin(), g.end())) << k;
            }
            for (int r = 0; r < world; ++r) {
              auto co = ps::rank_coordinates(L, r);
              EXPECT_EQ(rank_of(co.tp, co.cp, co.dp, co.pp, TP, CP, DP, PP, tp_pp_dp), r);
            }
          }
}

TEST(ParallelStateLayout, TpPpDpMappingOrder) {
  // 8 ranks TP2 PP2 DP2 with --use-tp-pp-dp-mapping: rank = tp + 2*(pp + 2*dp).
  ps::ParallelConfig c;
  c.tensor_model_parallel_size = 2;
  c.pipeline_model_parallel_size = 2;
  c.use_tp_pp_dp_mapping = true;
  auto L = ps::compute_group_layout(c, 8);
  EXPECT_EQ(L.order, "tp-cp-ep-pp-dp");
  EXPECT_EQ(L.groups["pp"], (RankGroups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(L.groups["dp"], (RankGroups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

TEST(ParallelStateLayout, EmbeddingGroupsWithFourStages) {
  ps::ParallelConfig c;
  c.pipeline_model_parallel_size = 4;
  auto L = ps::compute_group_layout(c, 8);  // DP 2: pp groups {0,2,4,6}, {1,3,5,7}
  EXPECT_EQ(L.groups["pp"], (RankGroups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(L.groups["embedding"], (RankGroups{{0, 6}, {1, 7}}));
  EXPECT_EQ(L.groups["position_embedding"], (RankGroups{{0}, {1}}));
  EXPECT_EQ(L.group_of("embedding", 2), nullptr);
  ASSERT_NE(L.group_of("embedding", 7), nullptr);
  EXPECT_EQ(*L.group_of("embedding", 7), (std::vector<int>{1, 7}));
}

TEST(ParallelStateLayout, BadSizesAreUserErrors) {
  ps::ParallelConfig c;
  c.tensor_model_parallel_size = 3;
  EXPECT_THROW(ps::compute_group_layout(c, 8), megatron::UserError);
  ps::ParallelConfig v;
  v.virtual_pipeline_model_parallel_size = 2;
  EXPECT_THROW(ps::compute_group_layout(v, 2), megatron::UserError);
  EXPECT_THROW(ps::RankGenerator(2, 1, 1, 1, 1, "dp-pp"), megatron::UserError);
}

TEST(ParallelStateLayout, VirtualPipelineSize) {
  // Megatron arguments.py: vp = (num_layers / pp) / layers_per_vp_stage; 1 -> None.
  EXPECT_EQ(ps::virtual_pipeline_size(8, 2, 2, std::nullopt), 2);
  EXPECT_EQ(ps::virtual_pipeline_size(8, 2, 4, std::nullopt), std::nullopt);
  EXPECT_EQ(ps::virtual_pipeline_size(8, 2, std::nullopt, 4), 4);
  EXPECT_EQ(ps::virtual_pipeline_size(8, 2, std::nullopt, std::nullopt), std::nullopt);
  EXPECT_THROW(ps::virtual_pipeline_size(8, 2, 3, std::nullopt), megatron::UserError);
  EXPECT_THROW(ps::virtual_pipeline_size(8, 2, 2, 2), megatron::UserError);
  EXPECT_THROW(ps::virtual_pipeline_size(8, 1, 2, std::nullopt), megatron::UserError);
}

TEST(ParallelStateSeeds, MegatronFormulas) {
  // _set_random_seed: seed + 100*pp (+10*dp); model_parallel_cuda_manual_seed: +2718+tp,
  // expert: +1024 + 100*ep + etp. Hand-computed for seed 1234, tp 1, pp 3, dp 2.
  auto s = ps::compute_seeds(1234, 1, 3, 2, false);
  EXPECT_EQ(s.default_seed, 1534);
  EXPECT_EQ(s.tensor_model_parallel_seed, 1534 + 2718 + 1);
  EXPECT_EQ(s.expert_parallel_seed, 1534 + 1024 + 1);
  auto d = ps::compute_seeds(1234, 1, 3, 2, true);
  EXPECT_EQ(d.default_seed, 1554);
  EXPECT_EQ(d.tensor_model_parallel_seed, 4273);
}

TEST(ParallelStateGlobal, SingleRank) {
  ps::initialize_single_rank();
  EXPECT_TRUE(ps::model_parallel_is_initialized());
  EXPECT_EQ(ps::get_tensor_model_parallel_world_size(), 1);
  EXPECT_EQ(ps::get_data_parallel_world_size(true), 1);
  EXPECT_TRUE(ps::is_pipeline_first_stage());
  EXPECT_TRUE(ps::is_pipeline_last_stage());
  EXPECT_TRUE(ps::is_rank_in_embedding_group());
  EXPECT_TRUE(ps::is_rank_in_position_embedding_group());
  EXPECT_EQ(ps::get_pipeline_model_parallel_next_rank(), 0);
  ps::destroy_model_parallel();
  EXPECT_FALSE(ps::model_parallel_is_initialized());
}
