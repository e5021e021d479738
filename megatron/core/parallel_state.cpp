#include "megatron/core/parallel_state.h"

#include <algorithm>
#include <sstream>

#include "megatron/core/utils/errors.h"

namespace megatron::parallel_state {

namespace {
std::vector<std::string> split_tokens(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == '-') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
  }
  out.push_back(cur);
  return out;
}

std::vector<int64_t> prefix_product(const std::vector<int>& a) {
  std::vector<int64_t> r{1};
  for (int v : a) r.push_back(r.back() * v);
  return r;
}
}  // namespace

RankGroups generate_masked_orthogonal_rank_groups(int world_size, const std::vector<int>& parallel_size,
                                                  const std::vector<bool>& mask) {
  MEGATRON_CHECK(parallel_size.size() == mask.size()) << parallel_size.size() << " sizes vs " << mask.size();
  std::vector<int64_t> global_stride = prefix_product(parallel_size);
  MEGATRON_CHECK(global_stride.back() == world_size) << "prod(sizes)=" << global_stride.back() << " world=" << world_size;
  std::vector<int> masked_shape, unmasked_shape;
  std::vector<int64_t> masked_stride, unmasked_stride;
  for (size_t i = 0; i < mask.size(); ++i) {
    if (mask[i]) {
      masked_shape.push_back(parallel_size[i]);
      masked_stride.push_back(global_stride[i]);
    } else {
      unmasked_shape.push_back(parallel_size[i]);
      unmasked_stride.push_back(global_stride[i]);
    }
  }
  // index -> coordinates in `shape` (first fastest), dotted with `stride`.
  auto place = [](int64_t index, const std::vector<int>& shape, const std::vector<int64_t>& stride) {
    int64_t pos = 0;
    for (size_t i = 0; i < shape.size(); ++i) {
      pos += (index % shape[i]) * stride[i];
      index /= shape[i];
    }
    return pos;
  };
  int64_t group_size = prefix_product(masked_shape).back();
  int64_t num_groups = world_size / group_size;
  RankGroups ranks;
  for (int64_t g = 0; g < num_groups; ++g) {
    std::vector<int> grp;
    int64_t base = place(g, unmasked_shape, unmasked_stride);
    for (int64_t r = 0; r < group_size; ++r) grp.push_back(static_cast<int>(base + place(r, masked_shape, masked_stride)));
    ranks.push_back(std::move(grp));
  }
  return ranks;
}

RankGenerator::RankGenerator(int tp, int ep, int dp, int pp, int cp, const std::string& order, int rank_offset)
    : world_size_(tp * ep * dp * pp * cp), rank_offset_(rank_offset) {
  MEGATRON_CHECK(ep == 1 || cp == 1) << "EP and CP > 1 in one rank generator";
  const std::vector<std::pair<std::string, int>> name_to_size = {{"tp", tp}, {"pp", pp}, {"dp", dp}, {"ep", ep}, {"cp", cp}};
  tokens_ = split_tokens(order);
  for (const auto& t : tokens_) {
    bool known = std::any_of(name_to_size.begin(), name_to_size.end(), [&](const auto& p) { return p.first == t; });
    if (!known) user_error("parallel order '", order, "': unknown token '", t, "' (use tp, cp, ep, dp, pp)");
  }
  for (const auto& [name, size] : name_to_size) {
    if (std::find(tokens_.begin(), tokens_.end(), name) == tokens_.end()) {
      if (size != 1) user_error("parallel order '", order, "' lacks '", name, "' whose size is ", size);
      tokens_.push_back(name);
    }
  }
  order_.clear();
  for (const auto& t : tokens_) {
    if (!order_.empty()) order_ += "-";
    order_ += t;
    for (const auto& [name, size] : name_to_size)
      if (name == t) sizes_.push_back(size);
  }
}

RankGroups RankGenerator::get_ranks(const std::string& token) const {
  std::vector<bool> mask(tokens_.size(), false);
  for (const auto& t : split_tokens(token)) {
    auto it = std::find(tokens_.begin(), tokens_.end(), t);
    MEGATRON_CHECK(it != tokens_.end()) << "token " << t << " not in order " << order_;
    mask[it - tokens_.begin()] = true;
  }
  RankGroups g = generate_masked_orthogonal_rank_groups(world_size_, sizes_, mask);
  for (auto& grp : g)
    for (int& r : grp) r += rank_offset_;
  return g;
}

std::optional<int> virtual_pipeline_size(int num_layers, int pp, std::optional<int> layers_per_vp_stage,
                                         std::optional<int> vp_stages_per_rank) {
  if (layers_per_vp_stage && vp_stages_per_rank)
    user_error("--num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-rank are mutually "
               "exclusive; give only one");
  std::optional<int> vp;
  if (layers_per_vp_stage) {
    if (*layers_per_vp_stage <= 0) user_error("--num-layers-per-virtual-pipeline-stage must be positive");
    if (num_layers % pp != 0)
      user_error("--num-layers (", num_layers, ") must be divisible by --pipeline-model-parallel-size (", pp, ")");
    int per_stage = num_layers / pp;
    if (per_stage % *layers_per_vp_stage != 0)
      user_error("number of layers per pipeline stage (", per_stage,
                 ") must be divisible by --num-layers-per-virtual-pipeline-stage (", *layers_per_vp_stage, ")");
    vp = per_stage / *layers_per_vp_stage;
  } else if (vp_stages_per_rank) {
    if (*vp_stages_per_rank <= 0) user_error("--num-virtual-stages-per-pipeline-rank must be positive");
    vp = *vp_stages_per_rank;
  }
  if (vp && *vp == 1) vp.reset();
  if (vp && pp <= 1)
    user_error("--pipeline-model-parallel-size must be greater than 1 with the interleaved schedule "
               "(virtual pipeline stages)");
  return vp;
}

const std::vector<int>* GroupLayout::group_of(const std::string& name, int rank) const {
  auto it = groups.find(name);
  MEGATRON_CHECK(it != groups.end()) << "unknown group kind " << name;
  for (const auto& g : it->second)
    if (std::find(g.begin(), g.end(), rank) != g.end()) return &g;
  return nullptr;
}

GroupLayout compute_group_layout(const ParallelConfig& c, int world_size) {
  const int tp = c.tensor_model_parallel_size, pp = c.pipeline_model_parallel_size, cp = c.context_parallel_size;
  if (tp < 1) user_error("--tensor-model-parallel-size must be >= 1 (got ", tp, ")");
  if (pp < 1) user_error("--pipeline-model-parallel-size must be >= 1 (got ", pp, ")");
  if (cp < 1) user_error("--context-parallel-size must be >= 1 (got ", cp, ")");
  const int model_size = tp * pp * cp;
  if (world_size % model_size != 0)
    user_error("world size (", world_size, ") is not divisible by --tensor-model-parallel-size (", tp,
               ") x --pipeline-model-parallel-size (", pp, ") x --context-parallel-size (", cp, ") = ", model_size);
  if (c.virtual_pipeline_model_parallel_size && pp <= 1)
    user_error("--pipeline-model-parallel-size must be greater than 1 with the interleaved schedule");
  GroupLayout L;
  L.config = c;
  L.world_size = world_size;
  L.data_parallel_size = world_size / model_size;
  L.order = c.use_tp_pp_dp_mapping ? "tp-cp-ep-pp-dp" : "tp-cp-ep-dp-pp";
  RankGenerator gen(tp, 1, L.data_parallel_size, pp, cp, L.order);
  for (const char* tok : {"tp", "cp", "dp", "dp-cp", "pp", "tp-pp", "tp-cp", "tp-dp", "tp-dp-cp"})
    L.groups[tok] = gen.get_ranks(tok);
  RankGroups emb, pos;
  for (const auto& g : L.groups["pp"]) {
    if (g.size() == 1)
      emb.push_back({g[0]});
    else
      emb.push_back({g.front(), g.back()});
    pos.push_back({g.front()});
  }
  L.groups["embedding"] = emb;
  L.groups["position_embedding"] = pos;
  // Megatron's expert_decoder_rank_generator.
  const int ep = c.expert_model_parallel_size, etp = c.expert_tensor_parallel_size > 0 ? c.expert_tensor_parallel_size : tp;
  if (ep < 1 || etp < 1) user_error("--expert-model-parallel-size / --expert-tensor-parallel-size must be >= 1");
  if (world_size % (etp * ep * pp) != 0)
    user_error("world size (", world_size, ") is not divisible by --expert-tensor-parallel-size (", etp,
               ") x --expert-model-parallel-size (", ep, ") x --pipeline-model-parallel-size (", pp, ")");
  RankGenerator egen(etp, ep, world_size / (etp * ep * pp), pp, 1, L.order);
  L.groups["ep"] = egen.get_ranks("ep");
  L.groups["expt-tp"] = egen.get_ranks("tp");
  L.groups["tp-ep"] = egen.get_ranks("tp-ep");
  L.groups["expt-dp"] = egen.get_ranks("dp");
  L.groups["tp-ep-pp"] = egen.get_ranks("tp-ep-pp");
  return L;
}

RankCoordinates rank_coordinates(const GroupLayout& L, int rank) {
  MEGATRON_CHECK(rank >= 0 && rank < L.world_size) << "rank " << rank << " world " << L.world_size;
  auto pos = [&](const char* name) {
    const auto* g = L.group_of(name, rank);
    MEGATRON_CHECK(g) << name;
    return static_cast<int>(std::find(g->begin(), g->end(), rank) - g->begin());
  };
  return {pos("tp"), pos("cp"), pos("dp"), pos("pp")};
}

Seeds compute_seeds(int64_t seed, int tp_rank, int pp_rank, int dp_rank, bool data_parallel_random_init, int ep_rank,
                    int expert_tp_rank) {
  Seeds s;
  s.default_seed = seed + 100 * static_cast<int64_t>(pp_rank);
  if (data_parallel_random_init) s.default_seed += 10 * static_cast<int64_t>(dp_rank);
  s.tensor_model_parallel_seed = s.default_seed + 2718 + tp_rank;
  s.expert_parallel_seed = s.default_seed + 1024 + 100 * static_cast<int64_t>(ep_rank) +
                           (expert_tp_rank < 0 ? tp_rank : expert_tp_rank);
  return s;
}

// ---------------------------------------------------------------------------------------------
namespace {
struct State {
  bool initialized = false;
  GroupLayout layout;
  GroupPtr world;
  std::map<std::string, GroupPtr> groups;
  std::optional<int> vp_rank;
};
State& state() {
  static State s;
  return s;
}
const State& checked() {
  MEGATRON_CHECK(state().initialized) << "parallel_state used before initialize_model_parallel()";
  return state();
}
GroupPtr group(const char* name) {
  const State& s = checked();
  auto it = s.groups.find(name);
  return it == s.groups.end() ? nullptr : it->second;
}
int group_rank(const char* name) {
  auto g = group(name);
  MEGATRON_CHECK(g) << "this rank has no " << name << " group";
  return g->rank();
}
int group_size(const char* name) {
  auto g = group(name);
  MEGATRON_CHECK(g) << "this rank has no " << name << " group";
  return g->size();
}
}  // namespace

void initialize_model_parallel(const GroupPtr& world, const ParallelConfig& config) {
  MEGATRON_CHECK(world) << "null world group";
  State s;
  s.layout = compute_group_layout(config, world->size());
  s.world = world;
  for (const auto& name : group_names()) s.groups[name] = world->split(s.layout.groups.at(name));
  for (const auto& name : expert_group_names()) s.groups[name] = world->split(s.layout.groups.at(name));
  if (config.virtual_pipeline_model_parallel_size) s.vp_rank = 0;
  s.initialized = true;
  state() = std::move(s);
}

void initialize_single_rank() { initialize_model_parallel(comm::make_single_rank_group(0), ParallelConfig{}); }

bool model_parallel_is_initialized() { return state().initialized; }
void destroy_model_parallel() { state() = State{}; }
const GroupLayout& get_group_layout() { return checked().layout; }

GroupPtr get_world_group() { return checked().world; }
GroupPtr get_tensor_model_parallel_group() { return group("tp"); }
GroupPtr get_pipeline_model_parallel_group() { return group("pp"); }
GroupPtr get_data_parallel_group(bool with_cp) { return group(with_cp ? "dp-cp" : "dp"); }
GroupPtr get_context_parallel_group() { return group("cp"); }
GroupPtr get_model_parallel_group() { return group("tp-pp"); }
GroupPtr get_tensor_and_context_parallel_group() { return group("tp-cp"); }
GroupPtr get_tensor_and_data_parallel_group(bool with_cp) { return group(with_cp ? "tp-dp-cp" : "tp-dp"); }
GroupPtr get_embedding_group() { return group("embedding"); }
GroupPtr get_position_embedding_group() { return group("position_embedding"); }
GroupPtr get_expert_model_parallel_group() { return group("ep"); }
GroupPtr get_expert_tensor_parallel_group() { return group("expt-tp"); }
GroupPtr get_expert_tensor_and_model_parallel_group() { return group("tp-ep"); }
GroupPtr get_expert_data_parallel_group() { return group("expt-dp"); }
GroupPtr get_expert_tensor_model_pipeline_parallel_group() { return group("tp-ep-pp"); }
int get_expert_model_parallel_rank() { return group_rank("ep"); }
int get_expert_tensor_parallel_rank() { return group_rank("expt-tp"); }
int get_expert_tensor_parallel_world_size() { return group_size("expt-tp"); }
int get_expert_data_parallel_rank() { return group_rank("expt-dp"); }
int get_expert_data_parallel_world_size() { return group_size("expt-dp"); }

int get_tensor_model_parallel_rank() { return group_rank("tp"); }
int get_tensor_model_parallel_world_size() { return group_size("tp"); }
int get_pipeline_model_parallel_rank() { return group_rank("pp"); }
int get_pipeline_model_parallel_world_size() { return group_size("pp"); }
int get_data_parallel_rank(bool with_cp) { return group_rank(with_cp ? "dp-cp" : "dp"); }
int get_data_parallel_world_size(bool with_cp) { return group_size(with_cp ? "dp-cp" : "dp"); }
int get_context_parallel_rank() { return group_rank("cp"); }
int get_context_parallel_world_size() { return group_size("cp"); }
int get_tensor_model_parallel_src_rank() { return group("tp")->ranks().front(); }
int get_pipeline_model_parallel_next_rank() {
  auto g = group("pp");
  return g->ranks()[(g->rank() + 1) % g->size()];
}
int get_pipeline_model_parallel_prev_rank() {
  auto g = group("pp");
  return g->ranks()[(g->rank() - 1 + g->size()) % g->size()];
}

std::optional<int> get_virtual_pipeline_model_parallel_rank() { return checked().vp_rank; }
void set_virtual_pipeline_model_parallel_rank(std::optional<int> rank) {
  checked();
  state().vp_rank = rank;
}
std::optional<int> get_virtual_pipeline_model_parallel_world_size() {
  return checked().layout.config.virtual_pipeline_model_parallel_size;
}

bool is_pipeline_first_stage(bool ignore_virtual) {
  if (!ignore_virtual) {
    auto vp = get_virtual_pipeline_model_parallel_world_size();
    if (vp && get_virtual_pipeline_model_parallel_rank().value_or(0) != 0) return false;
  }
  return get_pipeline_model_parallel_rank() == 0;
}

bool is_pipeline_last_stage(bool ignore_virtual) {
  if (!ignore_virtual) {
    auto vp = get_virtual_pipeline_model_parallel_world_size();
    if (vp && get_virtual_pipeline_model_parallel_rank().value_or(0) != *vp - 1) return false;
  }
  return get_pipeline_model_parallel_rank() == get_pipeline_model_parallel_world_size() - 1;
}

bool is_rank_in_embedding_group(bool ignore_virtual) {
  auto g = get_embedding_group();
  if (!g) return false;
  if (ignore_virtual) return true;
  // Megatron: the group's first member counts only on its first virtual chunk, the last member
  // only on its last chunk.
  const int me = g->ranks()[g->rank()];
  if (me == g->ranks().front()) return is_pipeline_first_stage(false);
  if (me == g->ranks().back()) return is_pipeline_last_stage(false);
  return true;
}

bool is_rank_in_position_embedding_group() { return get_position_embedding_group() != nullptr; }

}  // namespace megatron::parallel_state
