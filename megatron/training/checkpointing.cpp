#include "megatron/training/checkpointing.h"

#include <sys/time.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>
#include <regex>

#include "megatron/core/dist_checkpointing/file_utils.h"
#include "megatron/core/dist_checkpointing/serialization.h"
#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/optimizer/grad_scaler.h"
#include "megatron/core/optimizer/optimizer.h"
#include "megatron/core/optimizer_param_scheduler.h"
#include "megatron/core/parallel_state.h"
#include "megatron/core/tensor/parameter.h"
#include "megatron/core/transformer/moe/router.h"
#include "megatron/core/utils/errors.h"
#include "megatron/core/utils/param_version.h"
#include "megatron/training/arguments.h"
#include "megatron/training/checkpoint_args.h"
#include "megatron/training/torch_dist_checkpoint.h"
#include "megatron/training/training.h"

namespace megatron::training {

namespace fs = std::filesystem;
namespace dc = dist_checkpointing;
using nlohmann::json;

namespace {

constexpr double kCheckpointVersion = 3.0;

std::string timestamp() {
  timeval tv{};
  gettimeofday(&tv, nullptr);
  tm t{};
  localtime_r(&tv.tv_sec, &t);
  char b[64];
  std::snprintf(b, sizeof b, "%04d-%02d-%02d %02d:%02d:%02d.%06ld", t.tm_year + 1900, t.tm_mon + 1, t.tm_mday,
                t.tm_hour, t.tm_min, t.tm_sec, static_cast<long>(tv.tv_usec));
  return b;
}

int group_rank(comm::ProcessGroup* g) { return g ? g->rank() : 0; }

void print0(comm::ProcessGroup* g, const std::string& line) {
  if (group_rank(g) != 0) return;
  std::fputs(line.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

std::string fmt_it(int64_t it) {
  char b[32];
  std::snprintf(b, sizeof b, "%7" PRId64, it);
  return b;
}

std::string prefixed(const std::string& what, const std::string& key) { return "optimizer.state." + what + "." + key; }

struct Pending {
  std::unique_ptr<dc::AsyncSaveRequest> req;
};
Pending& pending() {
  static Pending p;
  return p;
}

}  // namespace

ParallelRanks checkpoint_ranks() {
  namespace ps = parallel_state;
  ParallelRanks r;
  r.tp_rank = ps::get_tensor_model_parallel_rank();
  r.tp_size = ps::get_tensor_model_parallel_world_size();
  r.pp_rank = ps::get_pipeline_model_parallel_rank();
  r.pp_size = ps::get_pipeline_model_parallel_world_size();
  r.dp_rank = ps::get_data_parallel_rank(/*with_context_parallel=*/true);
  r.dp_size = ps::get_data_parallel_world_size(/*with_context_parallel=*/true);
  r.edp_rank = ps::get_expert_data_parallel_rank();
  r.etp_rank = ps::get_expert_tensor_parallel_rank();
  return r;
}

std::string checkpoint_dir_name(const std::string& root, int64_t iteration, bool release) {
  if (release) return root + "/release";
  char b[32];
  std::snprintf(b, sizeof b, "iter_%07" PRId64, iteration);
  return root + "/" + b;
}

std::string tracker_filename(const std::string& root) { return root + "/latest_checkpointed_iteration.txt"; }

std::optional<std::pair<int64_t, bool>> read_tracker(const std::string& root) {
  const std::string path = tracker_filename(root);
  std::error_code ec;
  const fs::file_status fst = fs::status(path, ec);
  if (fst.type() == fs::file_type::not_found) return std::nullopt;
  if (ec || fst.type() != fs::file_type::regular)
    user_error(path, ": not a regular file (", ec ? ec.message() : "a directory, FIFO or device",
               "); it must hold the iteration number of the latest checkpoint or 'release'");
  std::string s = dc::read_text_file(path);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t b = 0;
  while (b < s.size() && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  s = s.substr(b);
  if (s == "release") return std::make_pair(int64_t(0), true);
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos)
    user_error(path, ": expected an iteration number or 'release', found '", s, "'");
  int64_t it = 0;
  const auto [end, err] = std::from_chars(s.data(), s.data() + s.size(), it);
  if (err != std::errc() || end != s.data() + s.size())
    user_error(path, ": iteration number '", s, "' is out of range (at most ", INT64_MAX, ")");
  return std::make_pair(it, false);
}

std::pair<std::string, int64_t> stacked_layer_key(const std::string& name) {
  static const std::regex re(R"(^((?:.*\.)?decoder\.layers\.)(\d+)\.(.+)$)");
  std::smatch m;
  if (std::regex_match(name, m, re)) return {m[1].str() + m[3].str(), std::stoll(m[2].str())};
  return {name, -1};
}

std::string expert_checkpoint_key(const std::string& name) {
  static const std::regex seq(R"(^(.*\.mlp\.experts\.)local_experts\.\d+\.(.+)$)");
  static const std::regex grouped(R"(^(.*\.mlp\.experts\.)(linear_fc[12]\.weight)\d+$)");
  std::smatch m;
  if (std::regex_match(name, m, seq) || std::regex_match(name, m, grouped)) return m[1].str() + "experts." + m[2].str();
  MEGATRON_CHECK(false) << name << ": not a routed expert's weight name";
  return name;
}

std::vector<ShardedTensor> model_sharded_tensors(const std::string& name, const Tensor& data, const ParamSharding& sh,
                                                 int64_t num_layers, const ParallelRanks& ranks) {
  auto [key, layer] = sh.stack_layers ? stacked_layer_key(name) : std::make_pair(name, int64_t{-1});
  std::vector<std::pair<int64_t, int64_t>> prepend;
  if (layer >= 0) {
    MEGATRON_CHECK(layer < num_layers) << name << ": layer index " << layer << " >= num_layers " << num_layers
                            << " (pass global layer numbers)";
    prepend.push_back({layer, num_layers});
  }
  if (sh.expert_index >= 0) {
    key = expert_checkpoint_key(key);
    MEGATRON_CHECK(sh.expert_index < sh.num_experts) << name << ": expert " << sh.expert_index << " of " << sh.num_experts;
    prepend.push_back({sh.expert_index, sh.num_experts});
  }
  const int replica = (sh.tp_axis < 0 ? ranks.tp_rank : 0) + ranks.dp_rank * ranks.tp_size;
  std::vector<dc::AxisFragment> frags;
  if (sh.tp_axis >= 0 && ranks.tp_size > 1) frags.push_back({sh.tp_axis, ranks.tp_rank, ranks.tp_size});
  if (!sh.swiglu_fc1) return {ShardedTensor::from_rank_offsets(key, data, frags, replica, prepend)};
  // SwiGLU fc1: local rows = [gate shard (f/tp rows); up shard (f/tp rows)]; global = [gate(f); up(f)].
  MEGATRON_CHECK(data.dim() == 2 || data.dim() == 1) << name << ": fc1 must be 1-D or 2-D, got " << data.str();
  const int64_t half = data.size(0) / 2;
  MEGATRON_CHECK(half * 2 == data.size(0)) << name << ": fc1 rows must be even, got " << data.str();
  std::vector<ShardedTensor> out;
  for (int part = 0; part < 2; ++part) {
    Tensor piece = data.narrow0(part * half, half);
    // Global rows: part * f + tp_rank * half, with f = half * tp_size: a fragment of 2*tp parts.
    out.push_back(ShardedTensor::from_rank_offsets(
        key, piece, {{0, part * ranks.tp_size + ranks.tp_rank, 2 * static_cast<int64_t>(ranks.tp_size)}}, replica, prepend));
  }
  return out;
}

std::vector<ShardedTensor> parameter_sharded_tensors(const Parameter& p, int64_t num_layers,
                                                     const ParallelRanks& ranks) {
  if (p.shared) {
    // The last stage's copy of the tied word embedding: load-only replica of the embedding.
    MEGATRON_CHECK(!p.init_key.empty()) << p.name << ": shared parameter without init_key";
    Parameter q = p;
    q.shared = false;
    q.name = p.init_key;
    auto out = parameter_sharded_tensors(q, num_layers, ranks);
    for (auto& t : out) t.replica_id += 1;
    return out;
  }
  ParallelRanks r = ranks;
  if (p.partition_dim >= 0 || !p.allreduce) {
    // TP-split: the parameter's own (expert-)TP rank. An expert-parallel parameter is replicated
    // over expt-dp only (its global expert index is in its name, so EP ranks write distinct keys).
    r.tp_rank = p.tp_rank;
    r.tp_size = p.tp_size;
  }
  if (!p.allreduce) r.dp_rank = ranks.edp_rank;
  ParamSharding sh;
  sh.tp_axis = p.partition_dim;
  sh.swiglu_fc1 = p.partition_stride == 2;
  sh.stack_layers = p.stack_layers;
  sh.expert_index = p.expert_index;
  sh.num_experts = p.num_experts;
  MEGATRON_CHECK(p.partition_stride == 1 || p.partition_stride == 2) << p.name << ": partition_stride " << p.partition_stride;
  auto out = model_sharded_tensors(p.name, p.data, sh, num_layers, r);
  // global_shape from the model is authoritative: check the sharding reproduces it
  Shape want = p.global_shape;
  if (p.expert_index >= 0) want.insert(want.begin(), p.num_experts);
  if (p.stack_layers && stacked_layer_key(p.name).second >= 0) want.insert(want.begin(), num_layers);
  for (const auto& t : out)
    MEGATRON_CHECK(t.global_shape == want) << p.name << ": sharded global shape " << shape_str(t.global_shape)
                                          << " != model global shape " << shape_str(want);
  return out;
}

TrainingState model_and_optimizer_state(const std::vector<Parameter>& params,
                                        const optimizer::MegatronOptimizer& opt, int64_t num_layers,
                                        const ParallelRanks& ranks, bool distributed_optimizer, bool with_optimizer) {
  TrainingState st;
  // Model pieces, each remembered with its element range inside its parameter.
  struct Piece {
    size_t model_index;  // into st.model
    int64_t begin, end;  // element range of the piece inside the parameter's local data
  };
  std::vector<std::vector<Piece>> pieces(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    const auto* base = static_cast<const char*>(p.data.data_ptr());
    const int64_t esz = static_cast<int64_t>(dtype_size(p.data.dtype()));
    for (auto& t : parameter_sharded_tensors(p, num_layers, ranks)) {
      const int64_t off = (static_cast<const char*>(t.data.data_ptr()) - base) / esz;
      MEGATRON_CHECK(off >= 0 && off + t.data.numel() <= p.data.numel()) << p.name << ": piece outside the parameter";
      pieces[i].push_back({st.model.size(), off, off + t.data.numel()});
      st.model.push_back(std::move(t));
    }
  }
  if (!with_optimizer) return st;
  // Optimizer parameter j → the model parameter whose storage holds it (same buffer, by address).
  std::vector<std::pair<const char*, size_t>> starts;
  for (size_t i = 0; i < params.size(); ++i) starts.push_back({static_cast<const char*>(params[i].data.data_ptr()), i});
  std::sort(starts.begin(), starts.end());
  const auto& ops = opt.params();
  for (size_t j = 0; j < ops.size(); ++j) {
    const char* at = static_cast<const char*>(ops[j].param.data_ptr());
    auto it = std::upper_bound(starts.begin(), starts.end(), std::make_pair(at, params.size()));
    MEGATRON_CHECK(it != starts.begin()) << ops[j].name << ": optimizer parameter outside every model parameter";
    const size_t i = std::prev(it)->second;
    const auto& p = params[i];
    const int64_t esz = static_cast<int64_t>(dtype_size(p.data.dtype()));
    MEGATRON_CHECK(ops[j].param.dtype() == p.data.dtype()) << ops[j].name << ": dtype differs from " << p.name;
    const int64_t ob = (at - static_cast<const char*>(p.data.data_ptr())) / esz;
    const int64_t oe = ob + ops[j].param.numel();
    MEGATRON_CHECK(oe <= p.data.numel()) << ops[j].name << ": optimizer range [" << ob << ", " << oe << ") outside "
                                        << p.name << " (" << p.data.numel() << " elements)";
    const Tensor& mp = opt.main_param(j);
    const Tensor& m = opt.exp_avg(j);
    const Tensor& v = opt.exp_avg_sq(j);
    // SGD's momentum buffer (torch state "momentum_buffer"): state once a step was taken, so
    // saved and required on load then; before the first step only loaded when present.
    const Tensor& buf = opt.momentum_buffer(j);
    auto& buf_list = opt.step_count() > 0 ? st.optimizer : st.optimizer_if_present;
    auto slice = [](const Tensor& t, int64_t off, const Shape& shape) { return t.defined() ? t.flat_slice(off, shape) : Tensor(); };
    for (const Piece& pc : pieces[i]) {
      const int64_t lo = std::max(ob, pc.begin), hi = std::min(oe, pc.end);
      if (lo >= hi) continue;
      const ShardedTensor& piece = st.model[pc.model_index];
      if (!distributed_optimizer) {
        MEGATRON_CHECK(lo == pc.begin && hi == pc.end) << ops[j].name << ": without the distributed optimizer an "
                                                       << "optimizer parameter must cover whole parameter pieces";
        const Shape shape = piece.data.shape();
        add_optimizer_state(st, piece, slice(mp, lo - ob, shape), slice(m, lo - ob, shape), slice(v, lo - ob, shape));
        if (buf.defined()) buf_list.push_back(optimizer_piece("momentum_buffer", piece, slice(buf, lo - ob, shape)));
      } else {
        // Flat range of the piece's box this rank owns; only DP owners write (TP/PP copies and
        // the tied output-layer copy are replicas).
        const Shape shape{hi - lo};
        const int replica = p.shared ? 1 : (p.partition_dim < 0 ? (p.allreduce ? ranks.tp_rank : p.tp_rank) : 0);
        add_optimizer_state(st, piece, slice(mp, lo - ob, shape), slice(m, lo - ob, shape), slice(v, lo - ob, shape),
                            std::make_pair(lo - pc.begin, hi - pc.begin), replica);
        if (buf.defined())
          buf_list.push_back(optimizer_piece("momentum_buffer", piece, slice(buf, lo - ob, shape),
                                             std::make_pair(lo - pc.begin, hi - pc.begin), replica));
      }
    }
  }
  return st;
}

ShardedTensor optimizer_piece(const std::string& what, const ShardedTensor& piece, const Tensor& t,
                              std::optional<std::pair<int64_t, int64_t>> flattened_range, int replica_id) {
  ShardedTensor s;
  s.key = prefixed(what, piece.key);
  s.data = t;
  s.global_shape = piece.global_shape;
  s.global_offset = piece.global_offset;
  s.local_shape = piece.local_shape;
  s.flattened_range = flattened_range;
  s.replica_id = flattened_range ? replica_id : piece.replica_id;
  s.validate();
  return s;
}

void add_optimizer_state(TrainingState& st, const ShardedTensor& piece, const Tensor& main_param, const Tensor& exp_avg,
                         const Tensor& exp_avg_sq, std::optional<std::pair<int64_t, int64_t>> flattened_range,
                         int replica_id) {
  const std::pair<const char*, const Tensor*> parts[] = {
      {"fp32_param", &main_param}, {"exp_avg", &exp_avg}, {"exp_avg_sq", &exp_avg_sq}};
  for (const auto& [what, t] : parts) {
    if (!t->defined()) continue;
    st.optimizer.push_back(optimizer_piece(what, piece, *t, flattened_range, replica_id));
  }
}

bool maybe_finalize_async_save(comm::ProcessGroup* world, bool blocking) {
  auto& p = pending();
  if (!p.req) return true;
  if (!blocking) {
    Tensor done = Tensor::from_vector({p.req->write_done() ? 1.0f : 0.0f}, {1});
    if (world) world->all_reduce(done, comm::ReduceOp::kMin)->wait();
    if (done.to_float_vector()[0] < 0.5f) return false;
  }
  auto req = std::move(p.req);
  req->finalize();
  return true;
}

void save_checkpoint(const TrainingState& st, const CheckpointConfig& cfg, const ParallelRanks& ranks,
                     comm::ProcessGroup* world) {
  if (cfg.save.empty()) user_error("save_checkpoint: --save is not set");
  maybe_finalize_async_save(world, /*blocking=*/true);
  const int64_t it = st.iteration;
  const std::string dir = checkpoint_dir_name(cfg.save, it);
  // Megatron's line names the format written: say what this writes. torch_dist is written only
  // when --ckpt-format torch_dist is given; otherwise (also for the default torch_dist) the layout
  // is megatron.cpp's own (docs/checkpointing.md).
  const std::string written =
      cfg.write_torch_dist ? std::string("torch_dist")
                           : "megatron.cpp's distributed (per-rank safetensors + metadata" +
                                 (cfg.ckpt_format == "torch_dist" ? std::string("; --ckpt-format torch_dist writes torch_dist")
                                                                  : ", not " + cfg.ckpt_format) + ")";
  print0(world, "[" + timestamp() + "] saving checkpoint at iteration " + fmt_it(it) + " to " + cfg.save + " in " +
                    written + " format");
  std::error_code ec;
  fs::create_directories(cfg.save, ec);
  if (ec) user_error("--save ", cfg.save, ": cannot create directory (", ec.message(), ")");

  dc::ShardedStateDict sd;
  sd.tensors = st.model;
  json args = st.args;
  args["iteration"] = it;
  args["consumed_train_samples"] = st.consumed_train_samples;
  args["consumed_valid_samples"] = st.consumed_valid_samples;
  args["tensor_model_parallel_size"] = ranks.tp_size;
  args["pipeline_model_parallel_size"] = ranks.pp_size;
  args["data_parallel_size"] = ranks.dp_size;
  sd.common = {{"args", args},
               {"checkpoint_version", kCheckpointVersion},
               {"iteration", it},
               {"num_floating_point_operations_so_far", st.num_floating_point_operations_so_far},
               {"opt_param_scheduler", st.opt_param_scheduler},
               {"content_metadata", {{"distrib_optim_sharding_type", "fully_reshardable"},
                                     {"singleton_local_shards", false},
                                     {"chained_optim_avoid_prefix", true}}}};
  sd.tensors.insert(sd.tensors.end(), st.extra.begin(), st.extra.end());
  if (!st.extra_common.empty()) sd.common["extra"] = st.extra_common;
  if (!cfg.no_save_optim) {
    sd.tensors.insert(sd.tensors.end(), st.optimizer.begin(), st.optimizer.end());
    sd.common["optimizer"] = st.optimizer_common;
  }
  if (!cfg.no_save_rng)
    sd.objects.push_back({"rng_state", st.rng_state, {ranks.pp_size, ranks.tp_size}, {ranks.pp_rank, ranks.tp_rank},
                          ranks.dp_rank});

  const std::string root = cfg.save;
  const std::string done_line = "  [" + std::string("%s") + "] successfully saved checkpoint from iteration " + fmt_it(it) +
                                " to " + root + " [ t " + std::to_string(ranks.tp_rank + 1) + "/" +
                                std::to_string(ranks.tp_size) + ", gtp_remat 1/1, p " + std::to_string(ranks.pp_rank + 1) +
                                "/" + std::to_string(ranks.pp_size) + " ]";
  auto finalize_fn = [root, it, dir, done_line, world] {
    // Megatron raises here too (the save fails, training stops): the checkpoint itself is
    // complete, only the tracker still names the previous one (written atomically: never empty).
    try {
      dc::write_file_atomic(tracker_filename(root), std::to_string(it));
    } catch (const UserError& e) {
      user_error("checkpoint ", dir, " is complete but the tracker could not be updated (", e.what(),
                 "); it still names the previous checkpoint: free space, then resume with --load ", root,
                 " --ckpt-step ", it, " (or write ", it, " into ", tracker_filename(root), ")");
    }
    std::string line = done_line;
    line.replace(line.find("%s"), 2, timestamp());
    print0(world, line);
  };
  if (cfg.write_torch_dist) {  // Megatron's own format (synchronous, also with --async-save)
    save_torch_dist_checkpoint(sd, dir, world, st.args.value("use_distributed_optimizer", false), ranks.tp_rank,
                               ranks.dp_rank, ranks.pp_rank == ranks.pp_size - 1);
    if (group_rank(world) == 0) finalize_fn();
    if (world) world->barrier();
  } else if (cfg.async_save) {
    auto req = dc::save_async(sd, dir, world);
    req->add_finalize_fn(finalize_fn);
    pending().req = std::move(req);
  } else {
    dc::save(sd, dir, world, {finalize_fn});  // rank 0 runs it; a failure stops every rank
  }
}

namespace {
/// The iteration (and release flag) --load reads: --ckpt-step when >= 0, else the tracker's;
/// nullopt when there is no tracker. With none and `exit_on_missing`, Megatron's
/// --exit-on-missing-checkpoint stop (UserError).
std::optional<std::pair<int64_t, bool>> iteration_to_load(const std::string& load, int64_t ckpt_step,
                                                          bool exit_on_missing) {
  if (ckpt_step >= 0) return std::make_pair(ckpt_step, false);
  auto tr = read_tracker(load);
  if (!tr && exit_on_missing)
    user_error("--load ", load, ": no checkpoint found (", tracker_filename(load),
               " is missing) and --exit-on-missing-checkpoint is set");
  return tr;
}
}  // namespace

json load_checkpoint_common(const std::string& dir) {
  return dc::torch_dist::is_torch_dist_checkpoint(dir) ? common_from_torch_dist(dc::torch_dist::load_common(dir))
                                                       : dc::load_common_state(dir);
}

namespace {
/// Runs `read` (which reads a checkpoint's common state) with JSON type errors turned into one user
/// line naming --load: a checkpoint without checksums whose common.json was edited (a field of the
/// wrong type) fails deep in the field reads, and it is the user's file (found by
/// tools/dev/flag_sweep.sh). Used by load_checkpoint and load_args_from_checkpoint.
template <class F>
auto with_common_state_errors(const std::string& load, F&& read) -> decltype(read()) {
  try {
    return read();
  } catch (const json::exception& e) {
    user_error("--load ", load, ": a field of the checkpoint's common state (common.json) is missing or of the "
               "wrong type (", e.what(), "): the file was edited or damaged after the save; restore it from a copy "
               "or re-save the checkpoint");
  }
}
}  // namespace

namespace {
LoadResult load_checkpoint_impl(TrainingState& st, const CheckpointConfig& cfg, const ParallelRanks& ranks,
                                comm::ProcessGroup* world) {
  LoadResult res;
  if (cfg.load.empty()) return res;
  int64_t it = 0;
  bool release = false;
  {
    auto tr = iteration_to_load(cfg.load, cfg.ckpt_step, cfg.exit_on_missing_checkpoint);
    if (!tr) {
      print0(world, "WARNING: could not find the metadata file " + tracker_filename(cfg.load));
      print0(world, "    will not load any checkpoints and will start from random");
      return res;
    }
    std::tie(it, release) = *tr;
  }
  // All ranks must agree on the iteration (Megatron: all-reduce MAX of the tracker's value).
  if (world) {
    Tensor t = Tensor::from_vector_i64({it}, {1});
    world->all_reduce(t, comm::ReduceOp::kMax)->wait();
    if (t.data<int64_t>()[0] != it)
      user_error("--load ", cfg.load, ": ranks read different iterations from ", tracker_filename(cfg.load),
                 " (", it, " vs ", t.data<int64_t>()[0], "): is the directory shared by all ranks?");
  }
  const std::string dir = checkpoint_dir_name(cfg.load, it, release);
  print0(world, " loading distributed checkpoint from " + cfg.load + " at iteration " + std::to_string(it));
  const bool want_optim = !cfg.no_load_optim && !cfg.finetune && !release;
  // Megatron's --auto-detect-ckpt-format: a torch_dist (PyTorch DCP) checkpoint is read as such.
  const bool torch_dist = dc::torch_dist::is_torch_dist_checkpoint(dir);
  TorchDistReadPlan td_plan;
  if (torch_dist) td_plan = plan_torch_dist_read(dir, want_optim);
  json common = load_checkpoint_common(dir);
  bool want_rng = !cfg.no_load_rng && !cfg.finetune && !release;
  if (torch_dist && !td_plan.ours && want_rng) {
    print0(world, "RNG state of a Megatron-LM torch_dist checkpoint (torch generators) is not used: the RNG starts "
                  "from --seed");
    want_rng = false;
  }
  const json args = common.value("args", json::object());
  if (cfg.expected_args.is_object() && !cfg.finetune) check_checkpoint_args(args, cfg.expected_args, dir);
  int ck_tp = args.value("tensor_model_parallel_size", ranks.tp_size);
  int ck_pp = args.value("pipeline_model_parallel_size", ranks.pp_size);
  if (want_rng && (ck_tp != ranks.tp_size || ck_pp != ranks.pp_size)) {
    print0(world, "(TP, PP) mismatch after resume ((" + std::to_string(ranks.tp_size) + ", " +
                      std::to_string(ranks.pp_size) + ") vs (" + std::to_string(ck_tp) + ", " + std::to_string(ck_pp) +
                      ") from checkpoint): RNG state will be ignored");
    want_rng = false;
  }
  dc::ShardedStateDict sd;
  sd.tensors = st.model;
  const size_t n_model = sd.tensors.size();
  if (want_optim) {
    if (!common.contains("optimizer"))
      user_error(dir, ": the checkpoint has no optimizer state (saved with --no-save-optim?); "
                 "use --no-load-optim or --finetune to load only the weights");
    sd.tensors.insert(sd.tensors.end(), st.optimizer.begin(), st.optimizer.end());
    if (!st.optimizer_if_present.empty()) {
      const dc::CheckpointIndex idx = torch_dist ? dc::CheckpointIndex{} : dc::load_index(dir);
      for (const auto& t : st.optimizer_if_present) {
        if (torch_dist ? td_plan.has(t.key) : idx.tensors.count(t.key) > 0) sd.tensors.push_back(t);
        else if (std::find(res.missing_optimizer.begin(), res.missing_optimizer.end(), t.key) == res.missing_optimizer.end())
          res.missing_optimizer.push_back(t.key);
      }
    }
  }
  if (want_rng) sd.objects.push_back({"rng_state", nullptr, {ranks.pp_size, ranks.tp_size}, {ranks.pp_rank, ranks.tp_rank}});
  // A checkpoint with FP8 state loaded by a run without FP8 (either format): the state is dropped, said once.
  if (st.extra.empty()) {
    bool ckpt_fp8 = torch_dist && td_plan.fp8_state;
    if (!torch_dist)
      for (const auto& [key, stored] : dc::load_index(dir).tensors)
        if (key.find("._extra_state.fp8.") != std::string::npos) { ckpt_fp8 = true; break; }
    if (ckpt_fp8)
      print0(world, "FP8 state (amax histories, scales) of the checkpoint is not used: this run does not train in FP8");
  }
  if (!cfg.finetune && !st.extra.empty()) {
    const dc::CheckpointIndex idx = torch_dist ? dc::CheckpointIndex{} : dc::load_index(dir);
    for (const auto& t : st.extra) {
      if (torch_dist ? td_plan.has(t.key) : idx.tensors.count(t.key) > 0) sd.tensors.push_back(t);
      else if (std::find(res.missing_extra.begin(), res.missing_extra.end(), t.key) == res.missing_extra.end())
        res.missing_extra.push_back(t.key);
    }
  }
  if (torch_dist) {
    // Every key of this model must be found; a checkpoint tensor this model does not take is
    // named (Megatron's assume_ok_unexpected; with PP each stage requests only its own tensors).
    std::vector<std::string> requested;
    for (const auto& t : sd.tensors) requested.push_back(t.key);
    if (ranks.pp_size == 1)
      for (const auto& k : unused_torch_dist_keys(td_plan, requested, want_optim))
        print0(world, "note: tensor '" + k + "' of " + dir + " is not part of this model: not loaded");
    check_torch_dist_keys_present(td_plan, requested, dir);
    dc::torch_dist::LoadOptions lo;
    lo.key_map = td_plan.key_map;
    dc::torch_dist::load(sd, dir, lo);
  } else {
    dc::load(sd, dir);
  }
  (void)n_model;  // tensors share storage with st's views: loaded in place
  bump_param_version();  // the model weights were overwritten (FP8 weight caches rebuild)

  res.loaded = true;
  res.checkpoint_dir = dir;
  res.args = args;
  if (!cfg.finetune && !release) {
    res.iteration = common.value("iteration", it);
    res.consumed_train_samples = args.value("consumed_train_samples", int64_t(0));
    res.consumed_valid_samples = args.value("consumed_valid_samples", int64_t(0));
    res.num_floating_point_operations_so_far = common.value("num_floating_point_operations_so_far", 0.0);
  }
  if (want_optim) {
    res.optimizer_loaded = true;
    res.optimizer_common = common["optimizer"];
    res.opt_param_scheduler = common.value("opt_param_scheduler", json::object());
  }
  if (!cfg.finetune && common.contains("extra")) res.extra_common = common["extra"];
  if (want_rng && !sd.objects.empty() && sd.objects[0].loaded) {
    res.rng_loaded = true;
    res.rng_state = sd.objects[0].value;
  }
  print0(world, "  successfully loaded checkpoint from " + cfg.load + " [ t " + std::to_string(ranks.tp_rank + 1) + "/" +
                    std::to_string(ranks.tp_size) + ", p " + std::to_string(ranks.pp_rank + 1) + "/" +
                    std::to_string(ranks.pp_size) + " ] at iteration " + std::to_string(res.iteration));
  return res;
}
}  // namespace

LoadResult load_checkpoint(TrainingState& st, const CheckpointConfig& cfg, const ParallelRanks& ranks,
                           comm::ProcessGroup* world) {
  return with_common_state_errors(cfg.load, [&] { return load_checkpoint_impl(st, cfg, ranks, world); });
}

// ---- generate_state_dict / load_state_dict ----
namespace {

// FP8 amax histories and scales of every model chunk as named extra tensors: identical on all
// ranks of the amax group (TP x DP x CP: amaxes are max-reduced every step), so only TP rank 0 of
// DP rank 0 writes them (one copy per pipeline stage). A routed expert's state (keyed by its global
// expert index) is written by expert-TP rank 0 of expert-DP rank 0 among the ranks holding it.
std::vector<ShardedTensor> fp8_state_tensors(const std::vector<models::gpt::GPTModel*>& chunks,
                                             const ParallelRanks& ranks) {
  std::vector<ShardedTensor> out;
  const int replica = (ranks.tp_rank != 0 || ranks.dp_rank != 0) ? 1 : 0;
  const int expert_replica = (ranks.etp_rank != 0 || ranks.edp_rank != 0) ? 1 : 0;
  for (const auto* m : chunks)
    if (auto* f8 = m->fp8_state())
      for (auto& t : f8->checkpoint_tensors(replica, expert_replica)) out.push_back(std::move(t));
  return out;
}

}  // namespace

std::vector<ShardedTensor> router_state_tensors(const std::vector<models::gpt::GPTModel*>& chunks, int64_t num_layers,
                                                const ParallelRanks& ranks) {
  std::vector<ShardedTensor> out;
  for (const auto* m : chunks) {
    ParamSharding sh;  // per-layer keys like the parameters' with a mixed --moe-layer-freq
    sh.stack_layers = !m->config().moe_non_homogeneous_layers;
    for (transformer::moe::TopKRouter* r : m->moe_routers())
      if (r->enable_expert_bias())
        for (auto& t : model_sharded_tensors(r->prefix() + ".expert_bias", r->expert_bias(), sh, num_layers, ranks))
          out.push_back(std::move(t));
  }
  return out;
}

namespace {

// The optimizer's non-tensor state (Megatron's optimizer.state_dict() "step" and "grad_scaler").
nlohmann::json optimizer_common_state(optimizer::MegatronOptimizer& opt) {
  nlohmann::json c = {{"step", opt.step_count()}};
  if (auto* d = dynamic_cast<optimizer::DynamicGradScaler*>(opt.grad_scaler())) {
    c["grad_scaler"] = {{"scale", d->scale()},
                        {"growth_tracker", d->growth_tracker()},
                        {"hysteresis_tracker", d->hysteresis_tracker()}};
  }
  return c;
}
void load_optimizer_common_state(optimizer::MegatronOptimizer& opt, const nlohmann::json& c) {
  if (c.contains("step")) opt.set_step_count(c.at("step").get<int64_t>());
  if (auto* d = dynamic_cast<optimizer::DynamicGradScaler*>(opt.grad_scaler()); d && c.contains("grad_scaler")) {
    const auto& g = c.at("grad_scaler");
    d->load_state(g.at("scale").get<double>(), g.at("growth_tracker").get<int>(), g.at("hysteresis_tracker").get<int>());
  }
}

// Megatron's optimizer.reload_model_params(): after loading weights without optimizer state,
// separate fp32 main params (bf16/fp16 models) start from the loaded weights.
void reload_model_params(optimizer::MegatronOptimizer& opt) {
  const auto& op = opt.params();
  for (size_t j = 0; j < op.size(); ++j) {
    Tensor mp = opt.main_param(j);
    if (mp.data_ptr() != op[j].param.data_ptr()) ops::cast(op[j].param, mp);  // on the params' device (CPU or GPU)
  }
}

}  // namespace

TrainingState generate_state_dict(const TrainingObjects& t, const TrainCounters& counters, const nlohmann::json& args,
                                  const ParallelRanks& ranks, bool with_optimizer) {
  std::vector<Parameter> params;  // views; every chunk's parameters
  for (auto* m : t.model) params.insert(params.end(), m->parameters().begin(), m->parameters().end());
  TrainingState st =
      model_and_optimizer_state(params, *t.optimizer, t.num_layers, ranks, t.distributed_optimizer, with_optimizer);
  // Model buffers after the parameters (the optimizer pieces index the parameters' entries).
  for (auto& b : router_state_tensors(t.model, t.num_layers, ranks)) st.model.push_back(std::move(b));
  st.extra = fp8_state_tensors(t.model, ranks);
  st.optimizer_common = optimizer_common_state(*t.optimizer);
  st.opt_param_scheduler = t.opt_param_scheduler->state_dict();
  nlohmann::json offsets = nlohmann::json::array();
  for (const auto* m : t.model) offsets.push_back(m->rng_offset());
  st.rng_state = {{"seed", t.seed}, {"dropout_rng_offset", t.model.front()->rng_offset()}, {"dropout_rng_offsets", offsets}};
  st.iteration = counters.iteration;
  st.consumed_train_samples = counters.consumed_train_samples;
  st.consumed_valid_samples = counters.consumed_valid_samples;
  st.num_floating_point_operations_so_far = counters.floating_point_operations_so_far;
  st.args = args;
  return st;
}

void load_state_dict(const TrainingObjects& t, TrainCounters& counters, const TrainingState& st,
                     const LoadResult& loaded, bool finetune, bool restore_optimizer,
                     const std::function<void(const std::string&)>& log) {
  if (!loaded.loaded) return;
  optimizer::MegatronOptimizer& opt = *t.optimizer;
  if (!finetune && !st.extra.empty()) {
    // FP8 state present in the checkpoint replaces the fresh one (a bf16 checkpoint has none).
    std::vector<std::string> got;
    for (const auto& x : st.extra)
      if (std::find(loaded.missing_extra.begin(), loaded.missing_extra.end(), x.key) == loaded.missing_extra.end())
        got.push_back(x.key);
    for (auto* m : t.model)
      if (auto* f8 = m->fp8_state()) f8->restore_checkpoint_tensors(st.extra, got);
  }
  if (loaded.optimizer_loaded && restore_optimizer) {
    load_optimizer_common_state(opt, loaded.optimizer_common);
    OptimizerParamScheduler& sched = *t.opt_param_scheduler;
    const OptimizerParamScheduler::Options flags = sched.options();
    sched.load_state_dict(loaded.opt_param_scheduler, log);
    for (auto& g : opt.mutable_param_groups()) {  // groups that follow --lr/--min-lr (not --decoupled-lr)
      if (g.is_decoupled_lr) continue;
      if (g.max_lr == flags.max_lr) g.max_lr = sched.options().max_lr;
      if (g.min_lr == flags.min_lr) g.min_lr = sched.options().min_lr;
    }
    opt.apply_schedule(sched);
  }
  if (!loaded.optimizer_loaded) reload_model_params(opt);
  if (loaded.rng_loaded) {
    // Dropout stream position of every model chunk (virtual stages: one stream per chunk).
    const auto& r = loaded.rng_state;
    if (r.contains("dropout_rng_offsets") && r["dropout_rng_offsets"].size() == t.model.size()) {
      for (size_t c = 0; c < t.model.size(); ++c) t.model[c]->set_rng_offset(r["dropout_rng_offsets"][c].get<uint64_t>());
    } else if (r.contains("dropout_rng_offset")) {
      t.model.front()->set_rng_offset(r.at("dropout_rng_offset").get<uint64_t>());
    }
  }
  counters.iteration = loaded.iteration;
  counters.consumed_train_samples = loaded.consumed_train_samples;
  counters.consumed_valid_samples = loaded.consumed_valid_samples;
  counters.floating_point_operations_so_far = loaded.num_floating_point_operations_so_far;
}


// ---- Megatron's load_args_from_checkpoint (--use-checkpoint-args) ----

namespace {

/// Python's str() of a checkpoint argument (as Megatron's "Setting ... from checkpoint" prints it).
std::string py_str_of(const json& v) {
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_null()) return "None";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) return py_float_repr(v.get<double>());
  if (v.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i)
      out += (i ? ", " : "") + (v[i].is_string() ? py_str_repr(v[i].get<std::string>()) : py_str_of(v[i]));
    return out + "]";
  }
  return v.dump();
}

/// The override values of parse_args_with_overrides for a checkpoint value: a list's elements,
/// else the one value.
std::vector<std::string> override_values(const json& v) {
  std::vector<std::string> out;
  if (v.is_array()) {
    for (const auto& e : v) out.push_back(e.is_string() ? e.get<std::string>() : py_str_of(e));
  } else {
    out.push_back(py_str_of(v));
  }
  return out;
}

}  // namespace

namespace {
Arguments load_args_from_checkpoint_impl(const std::vector<std::string>& argv, const Arguments& args,
                                         std::vector<std::string>& log) {
  const std::string& load = *args.load;
  const auto tr = iteration_to_load(load, args.ckpt_step.value_or(-1), args.exit_on_missing_checkpoint);
  if (!tr) {
    log.push_back("Checkpoint not found to provide arguments, using provided arguments.");
    return args;
  }
  const std::string dir = checkpoint_dir_name(load, tr->first, tr->second);
  const json common = load_checkpoint_common(dir);
  if (!common.contains("args") || !common["args"].is_object() || common["args"].empty()) {
    log.push_back("Checkpoint provided does not have arguments saved, using provided arguments.");
    return args;
  }
  json ck = common["args"];
  const double checkpoint_version = common.value("checkpoint_version", 0.0);
  // Megatron's one-off conversion for foundation models, and its old hybrid-pattern name.
  if (ck.contains("disable_bias_linear") && ck["disable_bias_linear"].is_boolean())
    ck["add_bias_linear"] = !ck["disable_bias_linear"].get<bool>();
  if (!ck.value("hybrid_override_pattern", json()).is_null() && ck.value("hybrid_layer_pattern", json()).is_null()) {
    ck["hybrid_layer_pattern"] = ck["hybrid_override_pattern"];
    if (ck.contains("num_layers")) ck["num_layers"] = nullptr;
  }

  // This run's values (str() as the arguments block prints them); dests pretrain_gpt does not
  // declare hold Megatron's default.
  std::map<std::string, std::string> current;
  for (const auto& [dest, value] : args_items(args)) current.emplace(dest, value);
  std::map<std::string, MegatronFlagInfo> megatron_dest;  // dest -> Megatron's first flag of it
  for (const auto& m : megatron_flag_table()) megatron_dest.emplace(m.dest, m);
  auto current_is_none = [&](const std::string& dest) {
    if (dest == "padded_vocab_size") return args.padded_vocab_size <= 0;
    if (auto it = current.find(dest); it != current.end()) return it->second == "None";
    auto m = megatron_dest.find(dest);
    return m == megatron_dest.end() || m->second.default_str == "None";
  };

  std::vector<std::pair<std::string, std::vector<std::string>>> overrides;
  auto put = [&](const std::string& dest, std::vector<std::string> values) {
    for (auto& o : overrides)
      if (o.first == dest) {
        o.second = std::move(values);
        return;
      }
    overrides.emplace_back(dest, std::move(values));
  };
  int64_t padded_vocab_size = args.padded_vocab_size;
  bool no_position_embedding = false;
  // Megatron's setattr(args, name, value), for a value that is not None.
  auto apply = [&](const std::string& name, const json& v) {
    if (name == "padded_vocab_size") {
      if (!v.is_number_integer() || v.get<int64_t>() <= 0)
        user_error("--use-checkpoint-args: ", dir, ": padded_vocab_size is ", py_str_of(v), ", not a positive integer");
      padded_vocab_size = v.get<int64_t>();
    } else if (declares_dest(name)) {
      put(name, override_values(v));
    } else if (name == "virtual_pipeline_model_parallel_size") {
      // No flag: validate_args derives it again from the virtual-stage flags, as Megatron's does.
    } else if (name == "use_rotary_position_embeddings" && v == json(true)) {
      put("position_embedding_type", {"rope"});  // Megatron's validate_args: legacy RoPE flag
    } else if (name == "add_position_embedding" && v == json(false)) {
      no_position_embedding = true;  // checked below against the position embedding type
    } else {
      auto m = megatron_dest.find(name);
      const json dflt = m == megatron_dest.end() ? json() : py_str_to_json(m->second.default_str);
      if (v != dflt)
        user_error("--use-checkpoint-args: ", dir, " sets ", name,
                   m == megatron_dest.end() ? std::string() : " (" + m->second.name + ")", " to ", py_str_of(v),
                   ", which megatron.cpp does not implement; this checkpoint cannot be trained here");
    }
  };
  // Megatron's _set_arg: without `force` only an argument that is None here is set; a None
  // checkpoint value never is.
  auto set_arg = [&](const std::string& name, const std::string& old_name = "", bool force = false) {
    if (!force && !current_is_none(name)) return;
    const json v = ck.value(old_name.empty() ? name : old_name, json());
    if (v.is_null()) {
      log.push_back("Checkpoint did not provide arguments " + name);
      return;
    }
    log.push_back("Setting " + name + " to " + py_str_of(v) + " from checkpoint");
    apply(name, v);
  };
  const bool F = true;  // force

  // Model args (Megatron's list and order).
  for (const char* n : {"num_layers", "hidden_size", "ffn_hidden_size", "seq_length", "num_attention_heads"}) set_arg(n);
  set_arg("num_query_groups", "", F);
  set_arg("group_query_attention", "", F);
  set_arg("kv_channels");
  set_arg("max_position_embeddings");
  for (const char* n : {"position_embedding_type", "add_position_embedding", "use_rotary_position_embeddings",
                        "rotary_base", "rotary_percent", "rotary_interleaved", "add_bias_linear", "add_qkv_bias",
                        "squared_relu", "swiglu", "untie_embeddings_and_output_weights", "apply_layernorm_1p",
                        "normalization", "apply_query_key_layer_scaling", "attention_dropout", "hidden_dropout",
                        "mtp_hybrid_override_pattern", "mtp_num_layers", "mtp_use_repeated_layer", "spec",
                        "num_experts", "mtp_num_layers", "moe_layer_freq"})
    set_arg(n, "", F);
  if (!ck.value("num_experts", json()).is_null()) {
    set_arg("moe_ffn_hidden_size", "", F);
  } else {
    put("moe_ffn_hidden_size", {});  // Megatron: setattr(args, 'moe_ffn_hidden_size', None)
  }
  set_arg("moe_router_topk", "", F);
  set_arg("moe_token_dispatcher_type");
  for (const char* n : {"moe_router_pre_softmax", "moe_grouped_gemm", "moe_single_grouped_weight",
                        "moe_single_grouped_bias", "moe_shared_expert_intermediate_size", "moe_router_score_function",
                        "moe_router_enable_expert_bias", "moe_router_topk_scaling_factor", "mamba_state_dim",
                        "mamba_head_dim", "mamba_num_groups", "mamba_num_heads"})
    set_arg(n, "", F);
  // Checkpoints from before this argument existed used three reflections (Megatron).
  if (!ck.contains("gdp_num_householder")) ck["gdp_num_householder"] = 3;
  set_arg("gdp_num_householder", "", F);
  set_arg("hybrid_layer_pattern");
  for (const char* n : {"heterogeneous_layers_config_path", "heterogeneous_layers_config_encoded_json", "moe_latent_size"})
    set_arg(n, "", F);
  // Tokenizer args.
  if (args.use_tokenizer_model_from_checkpoint_args) {
    set_arg("tokenizer_model", "", F);
    set_arg("tokenizer_type", "", F);
  }
  set_arg("tiktoken_pattern", "", F);
  set_arg("padded_vocab_size");
  // Checkpoint args.
  set_arg("ckpt_format");
  // Model parallelism args.
  if (args.use_mp_args_from_checkpoint_args) {
    if (checkpoint_version < 3.0) {
      set_arg("tensor_model_parallel_size", "model_parallel_size");
    } else {
      set_arg("tensor_model_parallel_size", "", F);
      set_arg("pipeline_model_parallel_size", "", F);
      set_arg("virtual_pipeline_model_parallel_size", "", F);
      set_arg("num_layers_per_virtual_pipeline_stage");
      set_arg("expert_model_parallel_size", "", F);
    }
  }

  Arguments out;
  try {
    out = parse_args_with_overrides(argv, overrides);
  } catch (const UserError& e) {  // the command line itself parsed: the checkpoint's value is refused
    user_error("--use-checkpoint-args: ", dir, ": the checkpoint's arguments: ", e.what());
  }
  out.padded_vocab_size = padded_vocab_size;
  // Megatron's validate_args for the deprecated --no-position-embedding.
  if (no_position_embedding && out.position_embedding_type != "rope")
    user_error("--use-checkpoint-args: ", dir, " has add_position_embedding False (--no-position-embedding) with "
               "position_embedding_type ", out.position_embedding_type,
               ": --no-position-embedding is deprecated, use --position-embedding-type");
  return out;
}
}  // namespace

Arguments load_args_from_checkpoint(const std::vector<std::string>& argv, const Arguments& args,
                                    std::vector<std::string>& log) {
  if (!args.load) user_error("--use-checkpoint-args requires --load (the checkpoint directory whose arguments to use)");
  return with_common_state_errors(*args.load, [&] { return load_args_from_checkpoint_impl(argv, args, log); });
}

}  // namespace megatron::training
