#include "megatron/training/pretrain.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>

#include "megatron/core/comm/init_process_group.h"
#include "megatron/core/distributed/finalize_model_grads.h"
#include "megatron/core/ops/fp8_env.h"
#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/ops/device.h"
#include "megatron/core/ops/grouped_gemm.h"
#include "megatron/core/optimizer/distributed_optimizer.h"
#include "megatron/core/parallel_state.h"
#include "megatron/core/tensor_parallel/random.h"
#include "megatron/core/transformer/moe/experts.h"
#include "megatron/core/transformer/moe/router.h"
#include "megatron/core/utils/env.h"
#include "megatron/core/utils/errors.h"
#include "megatron/core/utils/kernel_profile.h"
#include "megatron/training/checkpoint_args.h"
#include "megatron/training/config_from_args.h"
#include "megatron/training/gpt_trainable.h"
#include "megatron/training/param_dump.h"
#include "megatron/training/tensorboard/summary_writer.h"
#include "megatron/training/training_log.h"

namespace megatron::training {

namespace ps = parallel_state;

namespace {

// Megatron's timers.log(names, barrier=True) for the setup timers: "(min, max) time across ranks
// (ms):" then one line per timer, "    <name + ' ' padded with '.' to 48>: (min, max)", min and
// max over all ranks (megatron/core/timers.py _get_global_min_max_time_string; timers that are 0
// on every rank are left out). Collective over `world`.
std::string setup_timers_string(const std::vector<std::pair<std::string, double>>& ms, comm::ProcessGroup& world) {
  const int64_t n = static_cast<int64_t>(ms.size());
  Tensor lo = Tensor::empty({n}, DType::kFloat64), hi = Tensor::empty({n}, DType::kFloat64);
  for (int64_t i = 0; i < n; ++i) lo.data<double>()[i] = hi.data<double>()[i] = ms[i].second;
  if (world.size() > 1) {
    world.all_reduce(lo, comm::ReduceOp::kMin);
    world.all_reduce(hi, comm::ReduceOp::kMax);
  }
  std::string out = "(min, max) time across ranks (ms):";
  bool any = false;
  for (int64_t i = 0; i < n; ++i) {
    if (hi.data<double>()[i] <= 0.0) continue;
    std::string label = ms[i].first + " ";
    if (label.size() < 48) label.resize(48, '.');
    char buf[160];
    std::snprintf(buf, sizeof(buf), "\n    %s: (%.2f, %.2f)", label.c_str(), lo.data<double>()[i], hi.data<double>()[i]);
    out += buf;
    any = true;
  }
  return any ? out : std::string();
}

// MEGATRON_OPTIM_OVERLAP=0|1 (default 0 until tests/gpu/optoverlap_check.sh has passed on a GPU:
// session 9 had none; other values: UserError): the optimizer step overlapped
// with the next forward (optimizer/step_overlap.h, docs/architecture.md "Optimizer step
// overlap"). Returns why it does not apply to this run ("" when it does): it covers Adam with
// the non-distributed optimizer on one CUDA device per rank and one model chunk (no pipeline
// parallelism), without --fp8-param-gather; every other run keeps the serial step.
bool optim_overlap_switch() { return env_switch("MEGATRON_OPTIM_OVERLAP", false); }
bool optim_overlap_priority_switch() { return env_switch("MEGATRON_OPTIM_OVERLAP_PRIORITY", true); }
// MEGATRON_OPTIM_OVERLAP_FULL_WAIT=1 (diagnostic, default 0): with the overlap on, every forward
// stage waits for the whole step instead of its own chunk (the step still runs on the side stream,
// the forward overlaps none of it): tells a forward that reads before its stage's wait from any
// other difference of the overlapped path (tests/gpu/optoverlap_check.sh).
bool optim_overlap_full_wait_switch() { return env_switch("MEGATRON_OPTIM_OVERLAP_FULL_WAIT", false); }
// MEGATRON_OPTIM_OVERLAP_GEMM_SM_MARGIN=N (0..64, default 0; A/B): with the overlap on, the
// forward's GEMMs that run while Adam chunks are still pending on the side stream leave N SMs to
// them (ops::set_gemm_sm_margin: cuBLASLt's SM count target); from the last forward stage's wait
// on, GEMMs use every SM again. Session 9 measured that without a margin the Adam blocks find no
// SM beside cuBLASLt's persistent GEMMs (docs/performance.md "Session 13: GEMM SM margin").
int optim_overlap_gemm_sm_margin() { return env_int_in("MEGATRON_OPTIM_OVERLAP_GEMM_SM_MARGIN", 0, 64, 0); }

std::string optim_overlap_unsupported(const Arguments& args, const ModelAndOptimizer& mo, const Device& device) {
  if (!optim_overlap_switch()) return "MEGATRON_OPTIM_OVERLAP=0";
  if (!device.is_cuda()) return "not on a CUDA device";
  if (args.skip_train || !mo.optimizer) return "no training";
  if (args.optimizer != "adam") return "--optimizer " + args.optimizer;
  if (args.use_distributed_optimizer) return "--use-distributed-optimizer";
  if (mo.model.size() != 1 || args.pipeline_model_parallel_size > 1) return "pipeline parallelism";
  if (args.fp8_param_gather) return "--fp8-param-gather";
  for (const auto& p : mo.optimizer->params())
    if (!p.param.is_cuda()) return "a parameter off the GPU";
  return "";
}

// While alive (and `on`): the calling thread's compute stream is a new high-priority stream that
// is ordered with the legacy default stream, so the forward's pending blocks are scheduled before
// the overlapped optimizer step's (whose side stream has the least priority); the previous
// compute stream is restored and the stream destroyed at the end. MEGATRON_OPTIM_OVERLAP_PRIORITY=0
// keeps the legacy stream (the A/B measurement of the priority).
class HighPriorityComputeStream {
 public:
  explicit HighPriorityComputeStream(bool on) {
    if (!on) return;
    stream_ = ops::stream_create(/*blocking=*/true, /*high_priority=*/true);
    prev_ = ops::compute_stream_exchange(stream_);
  }
  ~HighPriorityComputeStream() {
    if (!stream_) return;
    ops::compute_stream_exchange(prev_);
    ops::compute_stream_destroy(stream_);
  }
  HighPriorityComputeStream(const HighPriorityComputeStream&) = delete;
  HighPriorityComputeStream& operator=(const HighPriorityComputeStream&) = delete;

 private:
  void* stream_ = nullptr;
  void* prev_ = nullptr;
};

// The A/B and tuning switches that only some runs read (a CUDA kernel, a recipe, MoE layers, the
// overlapped step), read once at start so a bad value stops every run with the one-line UserError
// naming the variable, not only the runs that reach the code (docs/environment.md); a removed
// switch that is still set (MEGATRON_FP8_BLOCK_QUANT) is refused the same way.
void check_env_switches() {
  (void)optim_overlap_switch();
  (void)optim_overlap_priority_switch();
  (void)optim_overlap_full_wait_switch();
  (void)optim_overlap_gemm_sm_margin();
  (void)ops::gemm_autotune_switch();
  (void)transformer::moe::moe_device_router_enabled();
  (void)transformer::moe::moe_fp8_fuse_enabled();
  (void)ops::parse_grouped_gemm_mode(std::getenv("MEGATRON_MOE_GROUPED_GEMM"));
  (void)ops::parse_moe_gemm_streams(std::getenv("MEGATRON_MOE_GEMM_STREAMS"));
  (void)ops::block_fused_from_env();
  ops::refuse_removed_block_quant_env();
  (void)ops::block_wgrad_algo_from_env();
  (void)ops::block_gemm_ours_from_env();
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// GPU kernel profiler for the --profile window (docs/performance.md): per-rank table on stdout
// and JSON in $MEGATRON_KERNEL_PROFILE_OUT (a folder), else --tensorboard-dir, else ".".
void install_kernel_profiler(const Arguments& args, const Device& device, TrainingHooks& hooks) {
  if (!args.profile) return;
  if (!device.is_cuda()) {
    if (std::getenv("MEGATRON_KERNEL_PROFILE") && args.rank == 0)
      std::fprintf(stderr, "warning: MEGATRON_KERNEL_PROFILE: the kernel profiler needs a CUDA device (this run is on "
                           "the CPU); only --profile's timer trace is written\n");
    return;
  }
  if (std::find(args.profile_ranks.begin(), args.profile_ranks.end(), args.rank) == args.profile_ranks.end()) return;
  if (const char* v = std::getenv("MEGATRON_KERNEL_PROFILE"); v && (std::string(v) == "off" || std::string(v) == "0"))
    return;
  // Under nsys / ncu (they attach through CUDA_INJECTION64_PATH) CUPTI belongs to them: --profile
  // then only marks the window with NVTX ranges, as before.
  if (const char* inj = std::getenv("CUDA_INJECTION64_PATH"); inj && *inj) {
    std::fprintf(stderr, "note: [Rank %lld] kernel profile off: another CUDA profiler is attached (CUDA_INJECTION64_PATH "
                         "is set); --profile marks its window with NVTX ranges\n", static_cast<long long>(args.rank));
    return;
  }
  std::shared_ptr<profiling::KernelProfiler> prof = profiling::make_kernel_profiler();
  if (!prof) return;
  auto on = std::make_shared<bool>(false);
  hooks.profile_start = [prof, on](int64_t first) { *on = prof->start(first); };
  const int rank = static_cast<int>(args.rank);
  std::string dir = args.tensorboard_dir.value_or(".");
  if (const char* o = std::getenv("MEGATRON_KERNEL_PROFILE_OUT"); o && *o) dir = o;
  hooks.profile_stop = [prof, on, rank, dir](int64_t last) {
    if (!*on) return;
    *on = false;
    const profiling::ProfileSummary s = prof->stop(last, rank);
    const std::string text = profiling::format_summary(s);
    std::fputs(text.c_str(), stdout);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    const std::string path = dir + "/kernel_profile_rank" + std::to_string(rank) + ".json";
    profiling::write_summary_json(s, path);
    std::printf("[Rank %d] kernel profile | wrote %s\n", rank, path.c_str());
    std::fflush(stdout);
  };
}

// One line per rank with the bytes this rank allocated for the model's parameters, its gradient
// buffer and the optimizer state (fp32 main params separate from the model's + Adam moments or SGD momentum):
// shows what --skip-train saves (no Megatron counterpart).
void print_allocated_bytes(const Arguments& args, const std::vector<std::unique_ptr<models::gpt::GPTModel>>& chunks,
                           const optimizer::MegatronOptimizer& opt) {
  int64_t params = 0, grads = 0, state = 0;
  auto bytes = [](const Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(dtype_size(t.dtype())) : 0; };
  for (const auto& m : chunks) {
    params += m->buffers().param_bytes_held();  // FP8 weights: FP8 bytes (+ model-dtype copy until released)
    grads += bytes(m->grad_buffer());
    if (auto* e = m->expert_parallel_buffers()) {
      params += e->param_bytes_held();
      grads += bytes(e->grad_data());
    }
  }
  for (size_t j = 0; j < opt.params().size(); ++j) {
    if (!opt.main_param(j).shares_storage(opt.params()[j].param)) state += bytes(opt.main_param(j));
    state += bytes(opt.exp_avg(j)) + bytes(opt.exp_avg_sq(j)) + bytes(opt.momentum_buffer(j));  // undefined: 0
  }
  std::printf("[Rank %lld] allocated bytes: parameters %lld | main grads %lld | optimizer state %lld\n",
              static_cast<long long>(args.rank), static_cast<long long>(params), static_cast<long long>(grads),
              static_cast<long long>(state));
  std::fflush(stdout);
}

// The loader's micro-batches as the model sees them (get_batch).
BatchIterator iterator_of(GPTDataLoader* loader, const GetBatch& get_batch) {
  if (!loader) return nullptr;
  return [loader, get_batch]() -> std::optional<datasets::GPTBatch> {
    datasets::GPTBatch b;
    if (!loader->next(b)) return std::nullopt;
    return get_batch(b);
  };
}

}  // namespace

std::vector<distributed::DistributedDataParallel*> ModelAndOptimizer::chunk_ddps(size_t c) const {
  std::vector<distributed::DistributedDataParallel*> out{ddp.at(c).get()};
  if (c < expert_ddp.size() && expert_ddp[c]) out.push_back(expert_ddp[c].get());
  return out;
}

std::vector<distributed::DistributedDataParallel*> ModelAndOptimizer::ddp_ptrs() const {
  std::vector<distributed::DistributedDataParallel*> out;
  for (size_t c = 0; c < ddp.size(); ++c)
    for (auto* d : chunk_ddps(c)) out.push_back(d);
  return out;
}

TrainingObjects ModelAndOptimizer::training_objects() const {
  TrainingObjects t;
  for (const auto& m : model) t.model.push_back(m.get());
  t.optimizer = optimizer.get();
  t.opt_param_scheduler = opt_param_scheduler.get();
  t.num_layers = model.front()->config().num_layers;
  t.distributed_optimizer = ddp_config.use_distributed_optimizer;
  t.seed = seed;
  return t;
}

std::vector<std::unique_ptr<models::gpt::GPTModel>> get_model(const MegatronRuntime& rt,
                                                              const ModelProvider& model_provider) {
  const Arguments& args = rt.args;
  auto say = [&](const std::string& s) { print_rank_0(args, s); };
  tensor_parallel::set_use_cpu_initialization(
      std::any_of(args.notes.begin(), args.notes.end(), [](const auto& n) { return n.first == "--use-cpu-initialization"; }));
  say("building GPT model ...");
  if (rt.device.is_cuda())
    say("> training on cuda:" + std::to_string(rt.device.index) + " (MEGATRON_DEVICE=cpu forces the CPU)");
  // --skip-train (evaluation only): the model's parameters and nothing else -- no gradient
  // buffer, DDP, fp32 main params or optimizer state. (Megatron's setup_model_and_optimizer builds
  // them anyway; LLaMA-3 8B in bf16 is then 16 GB instead of ~144 GB, so one GPU evaluates it.)
  if (args.skip_train) say("> evaluation only (--skip-train): no gradient buffers, DDP or optimizer state are allocated");
  // This pipeline rank's model chunks: one, or one per virtual stage (interleaved schedule);
  // layers split evenly as Megatron's (megatron/training/gpt_pipeline.h).
  const int pp_size = static_cast<int>(args.pipeline_model_parallel_size);
  const int vp_size = static_cast<int>(args.virtual_pipeline_model_parallel_size.value_or(1));
  const int tp_rank = ps::get_tensor_model_parallel_rank(), pp_rank = ps::get_pipeline_model_parallel_rank();
  std::vector<std::unique_ptr<models::gpt::GPTModel>> chunks;
  int vp_stage = 0;
  for (const PipelineChunk& c : pipeline_chunks(*args.num_layers, pp_size, pp_rank, vp_size,
                                                args.decoder_first_pipeline_num_layers,
                                                args.decoder_last_pipeline_num_layers)) {
    ModelChunkSpec spec;
    spec.chunk = c;
    spec.vp_stage = vp_stage++;
    spec.allocate_main_grads = !args.skip_train;
    chunks.push_back(model_provider(rt, spec));
  }
  int64_t nparams = 0;
  for (auto& m : chunks)
    for (auto& p : m->parameters()) nparams += p.data.numel();
  // Megatron prints this on data-parallel rank 0 of every model-parallel rank.
  if (ps::get_data_parallel_rank(true) == 0) {
    std::printf(" > number of parameters on (tensor, pipeline) model parallel rank (%d, %d): %lld\n", tp_rank,
                pp_rank, static_cast<long long>(nparams));
    std::fflush(stdout);
  }
  rt.world->barrier();
  return chunks;
}

ModelAndOptimizer setup_model_and_optimizer(const MegatronRuntime& rt, const ModelProvider& model_provider) {
  const Arguments& args = rt.args;
  const bool eval_only = args.skip_train;
  ModelAndOptimizer mo;
  mo.model = get_model(rt, model_provider);
  auto& chunks = mo.model;
  // DDP over the dp-cp group (Megatron's DistributedDataParallel wrapper): grads pre-scaled by
  // 1/(DP x CP) and summed (none with --calculate-per-token-loss), reduce-scattered with
  // --use-distributed-optimizer.
  auto dp_group = ps::get_data_parallel_group(/*with_context_parallel=*/true);
  mo.ddp_config = ddp_config_from_args(args);
  mo.seed = args.seed;
  // One DDP per model chunk; with virtual stages only the first chunk is bucketed (Megatron).
  // The routed experts on the expert process groups (EP > 1 or expert-TP != TP) have buffers of
  // their own, reduced over expt-dp with Megatron's expert gradient scaling (1/(DP x CP)).
  const bool expert_pgs = args.num_experts && (args.expert_model_parallel_size > 1 ||
                                               args.expert_tensor_parallel_size.value_or(args.tensor_model_parallel_size) !=
                                                   args.tensor_model_parallel_size);
  std::vector<optimizer::OptimizerParam> opt_params, expert_opt_params;
  for (size_t c = 0; c < (eval_only ? 0 : chunks.size()); ++c) {
    distributed::DistributedDataParallelConfig cc = mo.ddp_config;
    if (c > 0) cc.bucket_size = std::numeric_limits<int64_t>::max();  // one bucket
    mo.ddp.push_back(std::make_unique<distributed::DistributedDataParallel>(cc, chunks[c]->buffers(),
                                                                            chunks[c]->parameters(), dp_group));
    distributed::ParamAndGradBuffer* eb = chunks[c]->expert_parallel_buffers();
    mo.expert_ddp.push_back(eb ? std::make_unique<distributed::DistributedDataParallel>(
                                     cc, *eb, chunks[c]->parameters(), ps::get_expert_data_parallel_group(),
                                     dp_group->size())
                               : nullptr);
    if (!args.use_distributed_optimizer) {
      auto op = optimizer::optimizer_params(chunks[c]->parameters());
      opt_params.insert(opt_params.end(), op.begin(), op.end());
      continue;
    }
    auto op = optimizer::distributed_optimizer_params(*mo.ddp.back());
    opt_params.insert(opt_params.end(), op.begin(), op.end());
    if (eb) {
      auto eop = optimizer::distributed_optimizer_params(*mo.expert_ddp.back());
      expert_opt_params.insert(expert_opt_params.end(), eop.begin(), eop.end());
    }
  }
  // ChainedOptimizer order: the dense optimizer's params, then the expert optimizer's.
  opt_params.insert(opt_params.end(), expert_opt_params.begin(), expert_opt_params.end());
  // Grad norm / zero counts: over the model-parallel group (grads are equal across DP), or with
  // the distributed optimizer over DP x model-parallel (each rank holds disjoint slices);
  // TP-duplicated parameters count on TP rank 0 only, the tied embedding's copy not at all.
  // Expert-parallel params (ChainedOptimizer's expert optimizer): over tp-ep-pp (equal across
  // expt-dp), or with the distributed optimizer the world as well (one shared group: one norm).
  std::shared_ptr<comm::ProcessGroup> stats_group =
      args.use_distributed_optimizer ? ps::get_world_group() : ps::get_model_parallel_group();
  mo.optimizer = std::make_unique<optimizer::MegatronOptimizer>(
      eval_only ? eval_only_optimizer_config(args) : optimizer_config_from_args(args), std::move(opt_params),
      stats_group, ps::get_tensor_model_parallel_rank());
  if (expert_pgs && !eval_only)
    mo.optimizer->set_expert_grad_stats(
        args.use_distributed_optimizer ? stats_group : ps::get_expert_tensor_model_pipeline_parallel_group(),
        ps::get_expert_tensor_parallel_rank());
  mo.opt_param_scheduler = std::make_unique<OptimizerParamScheduler>(
      eval_only ? eval_only_scheduler_options() : scheduler_options_from_args(args));

  // Checkpoint (Megatron's load_checkpoint in setup_model_and_optimizer, before the data loaders
  // so they resume at consumed_train_samples).
  // The checkpoint's args: every argument (Megatron saves its whole args namespace), so that a
  // --load with other architecture flags is refused and converters read the architecture.
  // vocab_size: --vocab-size, else the tokenizer's (the unpadded size an HF export needs).
  nlohmann::json run_args = checkpoint_args(args);
  if (run_args.value("vocab_size", nlohmann::json()).is_null()) run_args["vocab_size"] = rt.tokenizer->vocab_size();
  mo.checkpoint = checkpoint_config_from_args(args, rt.ckpt_format_given);
  mo.checkpoint.expected_args = run_args;
  mo.ranks = checkpoint_ranks();
  if (!mo.checkpoint.load.empty()) {
    const TrainingObjects objects = mo.training_objects();
    TrainingState st = generate_state_dict(objects, mo.counters, run_args, mo.ranks,
                                           /*with_optimizer=*/!eval_only && !args.no_load_optim && !args.finetune);
    const LoadResult loaded = load_checkpoint(st, mo.checkpoint, mo.ranks, rt.world.get());
    // Eval only: no optimizer, no schedule.
    load_state_dict(objects, mo.counters, st, loaded, args.finetune, /*restore_optimizer=*/!eval_only,
                    [&](const std::string& s) { print_rank_0(args, s); });
  }

  // --fp8-param-gather: the first cast of the FP8 primary weights (Megatron casts them at model
  // initialization, TE's fp8_model_init; here after a checkpoint load too, with the restored
  // scales), and their first all-gather. Records the weights' amax for the first step, as the
  // first forward would without the flag.
  // Then the FP8 weights' model-dtype copy is freed: as in Megatron/TE the FP8 weight is the model
  // parameter; its full-precision values are the optimizer's fp32 main shards, from which a
  // checkpoint save or a parameter dump rebuilds the model-dtype values temporarily.
  if (args.fp8_param_gather && args.use_distributed_optimizer) {
    for (auto& d : mo.ddp) d->start_param_sync();
    for (auto& d : mo.ddp) d->finish_param_sync();
    for (auto& d : mo.ddp) d->release_model_dtype_fp8_params();
  }
  print_allocated_bytes(args, chunks, *mo.optimizer);
  return mo;
}

DataIterators build_train_valid_test_data_iterators(const MegatronRuntime& rt, const DatasetsProvider& provider,
                                                    const GetBatch& get_batch, const TrainCounters& counters) {
  const Arguments& args = rt.args;
  datasets::NumSamplesArgs ns;
  const int64_t train_iters =
      args.train_iters ? *args.train_iters : (args.train_samples ? *args.train_samples / *args.global_batch_size : 0);
  ns.train_iters = train_iters;
  ns.train_samples = args.train_samples;
  ns.global_batch_size = *args.global_batch_size;
  ns.eval_interval = args.eval_interval.value_or(train_iters + 1);  // None: only the final evaluation
  ns.eval_iters = args.eval_iters;
  ns.skip_train = args.skip_train;
  auto ds = provider(rt, datasets::get_train_valid_test_num_samples(ns));

  DataLoaderOptions lo;
  lo.micro_batch_size = *args.micro_batch_size;
  lo.data_parallel_size = args.data_parallel_size;
  lo.data_parallel_rank = ps::get_data_parallel_rank();
  lo.num_workers = static_cast<int>(args.num_workers);
  lo.attention_mask = args.reset_attention_mask && args.create_attention_mask_in_dataloader;
  lo.consumed_samples = counters.consumed_train_samples;
  DataIterators it;
  it.train_loader = build_pretraining_data_loader(ds[0], lo);
  lo.cyclic = true;  // Megatron iterates valid/test cyclically
  lo.consumed_samples = args.skip_train ? 0 : counters.consumed_valid_samples;
  it.valid_loader = build_pretraining_data_loader(ds[1], lo);
  lo.consumed_samples = 0;
  it.test_loader = build_pretraining_data_loader(ds[2], lo);
  it.train = iterator_of(it.train_loader.get(), get_batch);
  it.valid = iterator_of(it.valid_loader.get(), get_batch);
  it.test = iterator_of(it.test_loader.get(), get_batch);
  if (!it.train && !args.skip_train) user_error("no training data (check --data-path/--split)");
  return it;
}

int pretrain(int argc, char** argv, const DatasetsProvider& train_valid_test_datasets_provider,
             const ModelProvider& model_provider, const GetBatch& get_batch) {
  const MegatronRuntime rt = initialize_megatron(argc, argv);
  check_env_switches();
  const Arguments& args = rt.args;
  const Device device = rt.device;
  const std::shared_ptr<comm::ProcessGroup>& world = rt.world;
  auto say = [&](const std::string& s) { print_rank_0(args, s); };

  // Model, optimizer, scheduler (Megatron's 'model-and-optimizer-setup' timer, started after a
  // barrier, covers setup_model_and_optimizer including the checkpoint load).
  world->barrier();
  const auto model_setup_start = std::chrono::steady_clock::now();
  ModelAndOptimizer mo = setup_model_and_optimizer(rt, model_provider);
  auto& chunks = mo.model;
  models::gpt::GPTModel& model = *chunks.front();
  optimizer::MegatronOptimizer& opt = *mo.optimizer;
  const std::vector<distributed::DistributedDataParallel*> ddp_ptrs = mo.ddp_ptrs();
  // Megatron's timers synchronize the device at stop: a one-element copy to the host waits for
  // the stream (initialization kernels and copies belong to the setup time).
  if (device.is_cuda()) (void)Tensor::zeros({1}, DType::kFloat32, device).to(Device::cpu());
  const double model_setup_ms = ms_since(model_setup_start);
  say("[after model, optimizer, and learning rate scheduler are built] datetime: " +
      format_log_timestamp(std::chrono::system_clock::now()) + " ");

  // Data (pretrain_gpt.py train_valid_test_datasets_provider); Megatron's
  // 'train/valid/test-data-iterators-setup' timer, started after a barrier.
  world->barrier();
  const auto data_setup_start = std::chrono::steady_clock::now();
  DataIterators data = build_train_valid_test_data_iterators(rt, train_valid_test_datasets_provider, get_batch,
                                                             mo.counters);
  const double data_setup_ms = ms_since(data_setup_start);
  say("[after dataloaders are built] datetime: " + format_log_timestamp(std::chrono::system_clock::now()) + " ");
  say("done with setup ...");
  {
    world->barrier();
    const std::string t = setup_timers_string(
        {{"model-and-optimizer-setup", model_setup_ms}, {"train/valid/test-data-iterators-setup", data_setup_ms}}, *world);
    if (args.rank == args.world_size - 1 && !t.empty()) {  // Megatron's timers.log prints on the last rank
      std::fputs((t + "\n").c_str(), stdout);
      std::fflush(stdout);
    }
  }

  std::function<void(const std::string&)> printer;  // default: stdout (print_rank_last)
  if (args.rank != args.world_size - 1) printer = [](const std::string&) {};
  // TensorBoard: written by the last rank, as Megatron's get_tensorboard_writer.
  std::unique_ptr<SummaryWriter> writer;
  TrainingHooks hooks;
  if (args.tensorboard_dir && args.rank == args.world_size - 1) {
    say("> setting tensorboard ...");
    writer = std::make_unique<SummaryWriter>(*args.tensorboard_dir, 120.0, args.tensorboard_queue_size);
    hooks.add_scalar = [&writer](const std::string& tag, double v, int64_t step) { writer->add_scalar(tag, v, step); };
    hooks.flush = [&writer] { writer->flush(); };
  }
  GPTTrainable trainable(model);
  // MTP sits on the last chunk of the last stage; its metrics are averaged over DP x CP.
  trainable.set_mtp(chunks.back().get(), ps::get_data_parallel_group(/*with_context_parallel=*/true));
  hooks.zero_grad = [&ddp_ptrs, &trainable, &opt] {
    // The overlapped optimizer step has queued the zeroing of every grad buffer on its stream.
    const bool zeroed = opt.take_zeroed_grads();
    for (auto* d : ddp_ptrs) d->zero_grad_buffer(/*zero_data=*/!zeroed);
    trainable.begin_step();
  };
  // The optimizer step overlapped with the next forward: Adam per forward stage on a side
  // stream, each stage's forward waits for its update (GPTModel's param-wait hook), the grad
  // buffers are zeroed on that stream after the update.
  const std::string no_overlap = optim_overlap_unsupported(args, mo, device);
  const int sm_margin = optim_overlap_gemm_sm_margin();
  if (no_overlap.empty()) {
    std::vector<Tensor> grad_buffers;
    for (auto* d : ddp_ptrs)
      if (d->grad_buffer().defined()) grad_buffers.push_back(d->grad_buffer());
    // optimizer_params(model.parameters()): the optimizer's params are the model's, in order.
    std::vector<size_t> stage = model.forward_stage_of_params();
    MEGATRON_CHECK(stage.size() == opt.params().size()) << stage.size() << " stages, " << opt.params().size() << " params";
    opt.enable_step_overlap(std::move(stage), model.num_forward_stages(), std::move(grad_buffers));
    const bool full_wait = optim_overlap_full_wait_switch();
    const size_t whole_step = std::numeric_limits<size_t>::max();  // wait_for_params: >= chunks = the whole step
    const size_t last_stage = model.num_forward_stages() - 1;
    model.set_param_wait_hook([&opt, full_wait, whole_step, sm_margin, last_stage](size_t s) {
      opt.wait_for_params(full_wait ? whole_step : s);
      // Chunks after s still pending: leave their Adam blocks SMs beside this stage's GEMMs.
      if (sm_margin > 0) ops::set_gemm_sm_margin(s < last_stage && opt.step_in_flight() ? sm_margin : 0);
    });
    say(" > optimizer step overlapped with the next forward (MEGATRON_OPTIM_OVERLAP=1): " +
        std::to_string(model.num_forward_stages()) + " chunks on a side stream" +
        (full_wait ? " (MEGATRON_OPTIM_OVERLAP_FULL_WAIT=1: every forward stage waits for the whole step)" : "") +
        (sm_margin > 0 ? "; GEMMs beside pending chunks leave " + std::to_string(sm_margin) +
                             " SMs to them (MEGATRON_OPTIM_OVERLAP_GEMM_SM_MARGIN)"
                       : ""));
  } else if (device.is_cuda() || optim_overlap_switch()) {
    // Also on the CPU when asked for: the switch does not apply there, and the run says so.
    say(" > optimizer step not overlapped with the next forward (" + no_overlap + ")");
  }
  // The two GEMM switches say when they do not apply, instead of being read and ignored.
  if (!no_overlap.empty() && sm_margin > 0)
    say(" > MEGATRON_OPTIM_OVERLAP_GEMM_SM_MARGIN=" + std::to_string(sm_margin) +
        " has no effect: the optimizer step is not overlapped (" + no_overlap + ")");
  if (ops::gemm_autotune_switch()) {
    if (!device.is_cuda())
      say(" > MEGATRON_GEMM_AUTOTUNE=1 has no effect: it tunes cuBLASLt GEMMs, and this run is not on a CUDA device");
    else if (args.deterministic_mode)
      say(" > MEGATRON_GEMM_AUTOTUNE=1 has no effect with --deterministic-mode (the tuned pick could differ between runs)");
    else
      say(" > MEGATRON_GEMM_AUTOTUNE=1: each GEMM plan's cuBLASLt candidates are timed at its first call");
  }
  if (ops::block_gemm_ours_from_env()) {
    if (!device.is_cuda() || !args.fp8 || args.fp8_recipe != "blockwise")
      say(" > MEGATRON_FP8_BLOCK_GEMM=ours has no effect: it selects the GEMM of --fp8-recipe blockwise on a CUDA device");
    else
      say(" > MEGATRON_FP8_BLOCK_GEMM=ours: the block-scaled FP8 GEMMs run on our kernel (ops/cuda/fp8_block_gemm.cu), "
          "not cuBLASLt's");
  }
  HighPriorityComputeStream compute_stream(no_overlap.empty() && optim_overlap_priority_switch());
  // Megatron's finalize_model_grads reads the model's config: the norms marked their
  // sequence-parallel parameters, the tying comes from the TransformerConfig.
  distributed::FinalizeGroups fg;
  fg.tp_group = ps::get_tensor_model_parallel_group();
  fg.pp_group = ps::get_pipeline_model_parallel_group();
  auto dp_group = ps::get_data_parallel_group(/*with_context_parallel=*/true);
  fg.dp_group = dp_group;
  fg.embedding_group = ps::get_embedding_group();
  // The embedding group sums the word-embedding copies' grads when tied, and with MTP (whose stage
  // holds a copy of the embedding) also when untied (Megatron's _get_shared_word_embedding_weight).
  fg.share_embeddings_and_output_weights =
      model.config().share_embeddings_and_output_weights || model.config().mtp_num_layers > 0;
  const bool per_token_loss = mo.ddp_config.calculate_per_token_loss;
  // FP8: after the step's last backward, the amaxes are reduced (MAX) over TP x DP x CP (Megatron's
  // amax reduction group) and every scale is updated for the next step.
  auto amax_group = ps::get_tensor_and_data_parallel_group(/*with_context_parallel=*/true);
  const char* fp8_dump = std::getenv("MEGATRON_DUMP_FP8_STATE");  // FP8 amax-reduction test
  const std::string fp8_dump_dir = fp8_dump ? fp8_dump : "";
  const int global_rank = static_cast<int>(args.rank);
  // The routers of every chunk (decoder and MTP layers), for Megatron's end of
  // finalize_model_grads: the model does not change during training, so collected once.
  std::vector<transformer::moe::TopKRouter*> routers;
  for (auto& m : chunks)
    for (auto* r : m->moe_routers()) routers.push_back(r);
  hooks.finalize_model_grads = [&ddp_ptrs, fg, per_token_loss, &chunks, amax_group, fp8_dump_dir, global_rank,
                                routers](double num_tokens) {
    if (per_token_loss) {
      Tensor n = Tensor::from_vector({static_cast<float>(num_tokens)}, {1});
      distributed::finalize_model_grads(ddp_ptrs, fg, &n);
    } else {
      distributed::finalize_model_grads(ddp_ptrs, fg);
    }
    // Megatron's finalize_model_grads ends with the routers: expert-bias update, counters reset.
    transformer::moe::finalize_router_state(routers);
    for (auto& m : chunks)
      if (auto* f8 = m->fp8_state()) f8->reduce_and_update(amax_group.get());
    if (!fp8_dump_dir.empty()) {
      std::vector<models::gpt::GPTModel*> raw;
      for (auto& m : chunks) raw.push_back(m.get());
      dump_fp8_state(fp8_dump_dir, global_rank, raw);
    }
  };
  if (args.use_distributed_optimizer) {
    hooks.after_optimizer_step = [&ddp_ptrs] {
      for (auto* d : ddp_ptrs) d->start_param_sync();
      for (auto* d : ddp_ptrs) d->finish_param_sync();
    };
  }
  // --overlap-grad-reduce: backward reports finished parameters to DDP, which launches a
  // bucket's reduction as soon as the bucket is complete.
  auto grad_ready_of = [&mo](size_t chunk) {
    return [ds = mo.chunk_ddps(chunk)](const std::vector<size_t>& ready) {
      for (auto* d : ds)
        for (size_t i : ready) d->register_grad_ready(i);  // each DDP takes the params it holds
    };
  };
  if (mo.ddp_config.overlap_grad_reduce && !args.skip_train)
    trainable.set_grad_ready(grad_ready_of(0), num_microbatches(args));
  // Pipeline parallelism: the schedule runs the micro-batches (Megatron's forward_backward_func).
  const int cp_size = ps::get_context_parallel_world_size();
  std::unique_ptr<GPTPipeline> pipeline;
  if (ps::get_pipeline_model_parallel_world_size() > 1) {
    std::vector<models::gpt::GPTModel*> raw;
    for (auto& m : chunks) raw.push_back(m.get());
    // Activations between stages (Megatron's get_tensor_shapes from the model config): this
    // rank's sequence share, [s/(CP*TP if sequence_parallel), mbs, hidden_size].
    const transformer::TransformerConfig& config = model.config();
    const int64_t s_cp = *args.seq_length / cp_size;
    const int64_t s_local = config.sequence_parallel ? s_cp / config.tensor_model_parallel_size : s_cp;
    pipeline = std::make_unique<GPTPipeline>(raw, ps::get_pipeline_model_parallel_group(),
                                             Shape{s_local, *args.micro_batch_size, config.hidden_size},
                                             config.params_dtype, device, num_microbatches(args), per_token_loss,
                                             args.microbatch_group_size_per_vp_stage.value_or(0));
    if (mo.ddp_config.overlap_grad_reduce)
      for (size_t c = 0; c < mo.ddp.size(); ++c) pipeline->set_grad_ready(c, grad_ready_of(c));
    hooks.forward_backward = [&pipeline](BatchIterator& d, bool forward_only, double loss_scale) {
      return pipeline->forward_backward(d, forward_only, loss_scale);
    };
  }
  if (cp_size > 1) {
    // Loss normalisation over the whole sequence: its tokens are spread over the CP ranks.
    auto cp_group = ps::get_context_parallel_group();
    hooks.microbatch_loss_tokens = [cp_group, cp_size](double local_tokens) {
      Tensor t = Tensor::empty({1}, DType::kFloat64);
      t.data<double>()[0] = local_tokens;
      cp_group->all_reduce(t, comm::ReduceOp::kSum);
      return std::max(t.data<double>()[0], 1.0) / static_cast<double>(cp_size);
    };
    if (pipeline) pipeline->set_microbatch_loss_tokens(hooks.microbatch_loss_tokens);
  }
  if (dp_group->size() > 1) {
    hooks.reduce_loss = [dp_group](LossReport& r) {
      Tensor t = Tensor::empty({2}, DType::kFloat64);
      double* p = t.data<double>();
      p[0] = r.loss_sum;
      p[1] = r.num_tokens;
      dp_group->all_reduce(t, comm::ReduceOp::kSum);
      r.loss_sum = p[0];
      r.num_tokens = p[1];
    };
  }
  Trainer* trainer_ptr = nullptr;
  if (args.save) {
    hooks.save_checkpoint = [&](int64_t iteration) {
      // --fp8-param-gather: the FP8 weights' model-dtype values are current on this rank's shard
      // only; gather them so the checkpoint's model weights are what a run without the flag saves.
      if (args.fp8_param_gather)
        for (auto* d : ddp_ptrs) d->gather_model_dtype_params();
      TrainCounters counters = trainer_ptr->state();
      counters.iteration = iteration;
      nlohmann::json saved_args = mo.checkpoint.expected_args;
      saved_args.update(nlohmann::json{{"num_layers", args.num_layers.value_or(0)}, {"hidden_size", args.hidden_size.value_or(0)},
                 {"num_attention_heads", args.num_attention_heads.value_or(0)}, {"seq_length", *args.seq_length},
                 {"padded_vocab_size", args.padded_vocab_size}, {"micro_batch_size", *args.micro_batch_size},
                 {"global_batch_size", *args.global_batch_size}, {"seed", args.seed},
                 {"tensor_model_parallel_size", args.tensor_model_parallel_size},
                 {"pipeline_model_parallel_size", args.pipeline_model_parallel_size},
                 {"data_parallel_size", mo.ranks.dp_size},
                 {"use_distributed_optimizer", args.use_distributed_optimizer}});
      const TrainingState st = generate_state_dict(mo.training_objects(), counters, saved_args, mo.ranks,
                                                   /*with_optimizer=*/!args.no_save_optim);
      // --async-save: returns after the snapshot; the write overlaps the next iterations.
      // Megatron's save_checkpoint_and_time: the time training was blocked, on the last rank.
      Timers& timers = trainer_ptr->timers();
      timers("save-checkpoint", 0).start();
      save_checkpoint(st, mo.checkpoint, mo.ranks, world.get());  // an async save has copied the tensors
      if (args.fp8_param_gather)
        for (auto* d : ddp_ptrs) d->release_model_dtype_fp8_params();
      timers("save-checkpoint", 0).stop();
      const std::string line = timers.log_string({"save-checkpoint"});
      if (args.rank == args.world_size - 1 && !line.empty()) {
        std::fputs((line + "\n").c_str(), stdout);
        std::fflush(stdout);
      }
    };
    if (args.async_save) {
      // Publish a finished background save at the start of the next iteration (all ranks agree
      // that every write is done; Megatron's maybe_finalize_async_save(blocking=False)).
      hooks.zero_grad = [zero = hooks.zero_grad, w = world.get()] {
        maybe_finalize_async_save(w, /*blocking=*/false);
        zero();
      };
    }
  }
  if (world->size() > 1) {
    hooks.any_rank = [w = world.get()](bool flag) {
      Tensor t = Tensor::from_vector({flag ? 1.0f : 0.0f}, {1});
      w->all_reduce(t, comm::ReduceOp::kMax)->wait();
      return t.to_float_vector()[0] > 0.5f;
    };
    hooks.barrier = [w = world.get()] { w->barrier(); };
    hooks.all_gather_times = [w = world.get()](const std::vector<double>& local) {
      const int64_t n = static_cast<int64_t>(local.size());
      Tensor in = Tensor::empty({n}, DType::kFloat64), out = Tensor::empty({n * w->size()}, DType::kFloat64);
      std::copy(local.begin(), local.end(), in.data<double>());
      w->all_gather(in, out)->wait();
      return std::vector<double>(out.data<double>(), out.data<double>() + n * w->size());
    };
  }
  hooks.memory_stats = [device] { return memory_stats(device.type, device.is_cuda() ? device.index : 0); };
  // Megatron's report_memory: every data-parallel rank 0 prints "[Rank r] ... memory (MB) | ...";
  // on a GPU the allocator/pool fields, on the CPU the resident set.
  hooks.report_memory = [&args, device, dp0 = ps::get_data_parallel_rank() == 0](const std::string& name) {
    if (!dp0) return;
    const std::string line =
        memory_report(name, static_cast<int>(args.rank), device.is_cuda() ? device.index : -1) + "\n";
    std::fputs(line.c_str(), stdout);
    std::fflush(stdout);
  };
  install_kernel_profiler(args, device, hooks);
  Trainer trainer(args, trainable, opt, *mo.opt_param_scheduler, hooks, printer);
  trainer_ptr = &trainer;
  trainer.state() = mo.counters;
  trainer.pretrain(data.train, data.valid ? &data.valid : nullptr, data.test ? &data.test : nullptr);
  if (const char* dump = std::getenv("MEGATRON_DUMP_PARAMS")) {  // parallel-equivalence tests
    if (args.fp8_param_gather)  // the FP8 weights' model-dtype values: whole and current
      for (auto* d : ddp_ptrs) d->gather_model_dtype_params();
    std::vector<models::gpt::GPTModel*> raw;
    for (auto& m : chunks) raw.push_back(m.get());
    dump_parameters(dump, ps::get_pipeline_model_parallel_rank(), raw, *ps::get_tensor_model_parallel_group(),
                    ps::get_tensor_model_parallel_rank() == 0 && ps::get_data_parallel_rank(true) == 0);
    if (args.fp8_param_gather)
      for (auto* d : ddp_ptrs) d->release_model_dtype_fp8_params();
  }
  maybe_finalize_async_save(world.get(), /*blocking=*/true);  // a pending --async-save completes before exit
  world->barrier();
  ps::destroy_model_parallel();
  comm::destroy_process_group();
  return 0;
}

}  // namespace megatron::training
