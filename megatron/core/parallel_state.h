// parallel_state: rank -> (tp, cp, dp, pp) coordinates, the process groups Megatron creates, the
// virtual-pipeline settings and Megatron's per-rank seeds.
//
// Matches megatron/core/parallel_state.py (RankGenerator, generate_masked_orthogonal_rank_groups,
// initialize_model_parallel), megatron/training/initialize.py (_set_random_seed) and
// megatron/core/tensor_parallel/random.py (model_parallel_cuda_manual_seed).
//
// Two layers:
//  * pure functions (RankGenerator, compute_group_layout, compute_seeds) that compute every group
//    of a layout for all ranks without any communication -- unit-testable;
//  * the process-wide state (initialize_model_parallel + get_*_group / get_*_rank), which splits a
//    world ProcessGroup into the groups that contain this rank.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "megatron/core/comm/process_group.h"

namespace megatron::parallel_state {

using RankGroups = std::vector<std::vector<int>>;

/// All groups of `world_size` ranks that vary only in the masked dimensions. `parallel_size` lists
/// the sizes in mapping order (first = fastest varying); a group's members are listed in the order
/// of their masked coordinates (first masked dim fastest). Same result as Megatron's
/// generate_masked_orthogonal_rank_groups. Throws InternalError if prod(sizes) != world_size.
RankGroups generate_masked_orthogonal_rank_groups(int world_size, const std::vector<int>& parallel_size,
                                                  const std::vector<bool>& mask);

/// Megatron's RankGenerator: sizes of tp/ep/dp/pp/cp and an order string like "tp-cp-ep-dp-pp"
/// (leftmost fastest). Tokens of size 1 missing from the order are appended; a token of size > 1
/// missing from the order is a UserError.
class RankGenerator {
 public:
  RankGenerator(int tp, int ep, int dp, int pp, int cp, const std::string& order, int rank_offset = 0);
  /// Groups for a token set such as "tp", "dp-cp", "tp-pp" (tokens separated by '-').
  RankGroups get_ranks(const std::string& token) const;
  int world_size() const { return world_size_; }
  const std::string& order() const { return order_; }

 private:
  std::vector<std::string> tokens_;
  std::vector<int> sizes_;
  std::string order_;
  int world_size_;
  int rank_offset_;
};

/// The dense-model parallel layout (Megatron's initialize_model_parallel arguments).
struct ParallelConfig {
  int tensor_model_parallel_size = 1;    // --tensor-model-parallel-size
  int pipeline_model_parallel_size = 1;  // --pipeline-model-parallel-size
  int context_parallel_size = 1;         // --context-parallel-size
  /// Virtual pipeline stages per rank (None = no interleaving); see virtual_pipeline_size().
  std::optional<int> virtual_pipeline_model_parallel_size;
  bool use_tp_pp_dp_mapping = false;     // --use-tp-pp-dp-mapping: order "tp-cp-ep-pp-dp"
  int expert_model_parallel_size = 1;    // --expert-model-parallel-size
  int expert_tensor_parallel_size = 0;   // --expert-tensor-parallel-size (0 = tensor_model_parallel_size)
};

/// Megatron's derivation of virtual_pipeline_model_parallel_size (megatron/training/arguments.py):
/// from --num-layers-per-virtual-pipeline-stage (num_layers/pp/that) or
/// --num-virtual-stages-per-pipeline-rank; a result of 1 becomes nullopt. Throws UserError when
/// both are given, when the layers do not divide, or when pp == 1 with a VP size > 1.
std::optional<int> virtual_pipeline_size(int num_layers, int pipeline_model_parallel_size,
                                         std::optional<int> num_layers_per_virtual_pipeline_stage,
                                         std::optional<int> num_virtual_stages_per_pipeline_rank);

/// Names of the groups in a GroupLayout (Megatron's group descriptions in brackets):
///   "tp" (TENSOR_MODEL_PARALLEL), "cp", "dp" (without CP), "dp-cp" (DATA_PARALLEL with CP),
///   "pp", "tp-pp" (MODEL_PARALLEL), "tp-cp", "tp-dp", "tp-dp-cp" (FP8 amax reduction),
///   "embedding" (first and last stage of each pp group), "position_embedding" (first stage).
inline const std::vector<std::string>& group_names() {
  static const std::vector<std::string> names = {"tp",    "cp",    "dp",       "dp-cp",     "pp",
                                                 "tp-pp", "tp-cp", "tp-dp",    "tp-dp-cp",  "embedding",
                                                 "position_embedding"};
  return names;
}

/// The MoE groups, from Megatron's second RankGenerator (tp = expert-TP, ep, dp = expert-DP, pp,
/// cp = 1, same order string): "ep" (EXPERT_MODEL_PARALLEL), "expt-tp" (EXPERT_TENSOR_PARALLEL),
/// "tp-ep" (EXPERT_TENSOR_AND_MODEL_PARALLEL, the dispatchers' group), "expt-dp"
/// (EXPERT_DATA_PARALLEL, expert gradient reduction), "tp-ep-pp"
/// (EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL, the expert params' grad-norm group).
inline const std::vector<std::string>& expert_group_names() {
  static const std::vector<std::string> names = {"ep", "expt-tp", "tp-ep", "expt-dp", "tp-ep-pp"};
  return names;
}

/// Every group of every kind for a world, computed without communication.
struct GroupLayout {
  ParallelConfig config;
  int world_size = 1;
  int data_parallel_size = 1;
  std::string order;  // "tp-cp-ep-dp-pp" or "tp-cp-ep-pp-dp"
  std::map<std::string, RankGroups> groups;
  /// The group of kind `name` containing global rank `rank`; nullptr if the rank is in none
  /// (e.g. a middle pipeline stage and the embedding group).
  const std::vector<int>* group_of(const std::string& name, int rank) const;
};

/// Computes the layout. Throws UserError (naming the flags) when world_size is not divisible by
/// tp*pp*cp, or when a virtual pipeline size is set with pp == 1.
GroupLayout compute_group_layout(const ParallelConfig& config, int world_size);

/// A rank's coordinates in the layout.
struct RankCoordinates {
  int tp = 0, cp = 0, dp = 0, pp = 0;
};
RankCoordinates rank_coordinates(const GroupLayout& layout, int rank);

/// Megatron's seeds for one rank.
struct Seeds {
  /// python/numpy/torch and the CUDA default generator: seed + 100*pp (+10*dp with
  /// --data-parallel-random-init).
  int64_t default_seed = 0;
  /// "model-parallel-rng" tracker (dropout inside TP regions, TP-sharded init): default + 2718 + tp.
  int64_t tensor_model_parallel_seed = 0;
  /// "expert-parallel-rng": default + 1024 + 100*ep + expert_tp.
  int64_t expert_parallel_seed = 0;
};
Seeds compute_seeds(int64_t seed, int tp_rank, int pp_rank, int dp_rank, bool data_parallel_random_init,
                    int ep_rank = 0, int expert_tp_rank = -1);

// ---------------------------------------------------------------------------------------------
// Process-wide state (Megatron's module globals). Not thread-safe to initialize; read freely.
// ---------------------------------------------------------------------------------------------
using comm::ProcessGroup;
using GroupPtr = std::shared_ptr<ProcessGroup>;

/// Creates every group of compute_group_layout(config, world->size()) by splitting `world`
/// (collective: every rank of `world` must call it). Replaces any previous state.
void initialize_model_parallel(const GroupPtr& world, const ParallelConfig& config);
/// Sets up the trivial state of one process (all groups of size 1).
void initialize_single_rank();
bool model_parallel_is_initialized();
void destroy_model_parallel();
const GroupLayout& get_group_layout();

GroupPtr get_world_group();
GroupPtr get_tensor_model_parallel_group();
GroupPtr get_pipeline_model_parallel_group();
/// with_context_parallel: the "dp-cp" group (what DDP reduces grads over).
GroupPtr get_data_parallel_group(bool with_context_parallel = false);
GroupPtr get_context_parallel_group();
/// tp-pp
GroupPtr get_model_parallel_group();
GroupPtr get_tensor_and_context_parallel_group();
GroupPtr get_tensor_and_data_parallel_group(bool with_context_parallel = false);
/// nullptr on ranks outside it (middle pipeline stages).
GroupPtr get_embedding_group();
GroupPtr get_position_embedding_group();
/// MoE groups (expert_group_names()).
GroupPtr get_expert_model_parallel_group();
GroupPtr get_expert_tensor_parallel_group();
GroupPtr get_expert_tensor_and_model_parallel_group();
GroupPtr get_expert_data_parallel_group();
/// tp-ep-pp of the expert rank generator (Megatron's get_expert_tensor_model_pipeline_parallel_group).
GroupPtr get_expert_tensor_model_pipeline_parallel_group();
int get_expert_model_parallel_rank();
int get_expert_tensor_parallel_rank();
int get_expert_tensor_parallel_world_size();
int get_expert_data_parallel_rank();
int get_expert_data_parallel_world_size();

int get_tensor_model_parallel_rank();
int get_tensor_model_parallel_world_size();
int get_pipeline_model_parallel_rank();
int get_pipeline_model_parallel_world_size();
int get_data_parallel_rank(bool with_context_parallel = false);
int get_data_parallel_world_size(bool with_context_parallel = false);
int get_context_parallel_rank();
int get_context_parallel_world_size();
/// Global rank of tp-rank 0 of this rank's TP group.
int get_tensor_model_parallel_src_rank();
/// Global ranks of the next/previous pipeline stage (wrapping around, as Megatron).
int get_pipeline_model_parallel_next_rank();
int get_pipeline_model_parallel_prev_rank();

/// Virtual pipeline: the chunk currently running on this rank (nullopt without VP).
std::optional<int> get_virtual_pipeline_model_parallel_rank();
void set_virtual_pipeline_model_parallel_rank(std::optional<int> rank);
std::optional<int> get_virtual_pipeline_model_parallel_world_size();

/// First/last stage; unless ignore_virtual, with VP also requires the first/last virtual chunk.
bool is_pipeline_first_stage(bool ignore_virtual = false);
bool is_pipeline_last_stage(bool ignore_virtual = false);
/// True on ranks holding a word-embedding copy (first or last stage). Unless ignore_virtual (the
/// default, as in Megatron), the first stage must be on chunk 0 and the last on its last chunk.
bool is_rank_in_embedding_group(bool ignore_virtual = true);
bool is_rank_in_position_embedding_group();

}  // namespace megatron::parallel_state
