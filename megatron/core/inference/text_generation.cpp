#include "megatron/core/inference/text_generation.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <string>

#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/ops/decode_feed.h"
#include "megatron/core/ops/device.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/transformer/inference_context.h"
#include "megatron/core/utils/errors.h"
#include "megatron/core/utils/kernel_profile.h"

namespace megatron::inference {

namespace {

/// Columns [from, to) of the rows as a CPU int64 [b, to - from] tensor.
Tensor columns(const std::vector<std::vector<int64_t>>& rows, int64_t from, int64_t to) {
  const int64_t b = static_cast<int64_t>(rows.size()), n = to - from;
  Tensor t = Tensor::empty({b, n}, DType::kInt64);
  int64_t* p = t.data<int64_t>();
  for (int64_t i = 0; i < b; ++i) std::copy(rows[i].begin() + from, rows[i].begin() + to, p + i * n);
  return t;
}

/// The logits of the last position of `logits` [s, b, V/TP] over the whole padded vocabulary, as
/// host float32 [b * V] (gathered over TP; identical on every rank).
std::vector<float> gather_last_logits(const Tensor& logits, comm::ProcessGroup& tp) {
  const int64_t s = logits.size(0), b = logits.size(1), vl = logits.size(2), n = tp.size();
  Tensor last = logits.narrow0(s - 1, 1);
  if (last.dtype() != DType::kFloat32) last = ops::cast_to(last, DType::kFloat32);
  Tensor all = last;
  if (n > 1) {
    all = Tensor::empty({n, b, vl}, DType::kFloat32, last.device());
    tp.all_gather(last, all);
  }
  std::vector<float> shards = all.to_float_vector();  // [n][b][vl]
  if (n == 1) return shards;
  std::vector<float> out(static_cast<size_t>(b * vl * n));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < b; ++i)
      std::copy_n(shards.begin() + (r * b + i) * vl, vl, out.begin() + i * vl * n + r * vl);
  return out;
}

/// log p(label) for every row of logits [s, b, V/TP] (labels int64 [s * b], sequence-first), the
/// vocab-parallel cross entropy's log-sum-exp (as GPTModel::forward's loss, with the sign
/// flipped): host float32 [s * b]. Collective over TP.
std::vector<float> vocab_parallel_log_probs(const Tensor& logits, const std::vector<int64_t>& labels,
                                            comm::ProcessGroup& tp) {
  const int64_t n = logits.size(0) * logits.size(1), vl = logits.size(2);
  const Device dev = logits.device();
  Tensor l2d = logits.view({n, vl});
  Tensor lab = Tensor::from_vector_i64(labels, {n}).to(dev);
  Tensor row_max = Tensor::empty({n}, DType::kFloat32, dev), sumexp = Tensor::empty({n}, DType::kFloat32, dev);
  Tensor pred = Tensor::empty({n}, DType::kFloat32, dev);
  ops::cross_entropy_stats(l2d, lab, tp.rank() * vl, row_max, sumexp, pred);
  Tensor global_max = row_max;
  if (tp.size() > 1) {
    global_max = row_max.clone();
    tp.all_reduce(global_max, comm::ReduceOp::kMax);
    ops::cross_entropy_rescale_(sumexp, row_max, global_max);
    tp.all_reduce(sumexp, comm::ReduceOp::kSum);
    tp.all_reduce(pred, comm::ReduceOp::kSum);
  }
  Tensor loss = Tensor::empty({n}, DType::kFloat32, dev), lse = Tensor::empty({n}, DType::kFloat32, dev);
  ops::cross_entropy_loss(global_max, sumexp, pred, loss, lse);
  std::vector<float> lp = loss.to_float_vector();
  for (float& v : lp) v = -v;
  return lp;
}

/// True when MEGATRON_GENERATE_PROFILE (comma-separated 1-based call numbers) names `call`.
bool profile_call(int64_t call) {
  const char* e = std::getenv("MEGATRON_GENERATE_PROFILE");
  if (!e || !*e) return false;
  std::stringstream ss(e);
  std::string item;
  while (std::getline(ss, item, ','))
    if (std::strtoll(item.c_str(), nullptr, 10) == call) return true;
  return false;
}

void broadcast_i64(std::vector<int64_t>& v, comm::ProcessGroup& tp, Device dev) {
  if (tp.size() == 1) return;
  Tensor t = Tensor::from_vector_i64(v, {static_cast<int64_t>(v.size())}).to(dev);
  tp.broadcast(t, 0);
  Tensor h = t.to(Device::cpu());
  std::copy_n(h.data<int64_t>(), v.size(), v.begin());
}

/// What a decode step in the fixed buffers outputs (the index of its graph in DecodeStep).
enum StepKind : int {
  kLogits = 0,  // the last logits as float32 (sampling, log-probs)
  kArgmax = 1,  // the greedy argmax ids
  kFed = 2,     // the argmax ids, and the next step's inputs on the device (ops::decode_feed)
};

/// The decode step of one batch size in fixed device memory (DecodeGraphMode::kDeviceInputs and
/// kGraph): its KV cache, the step's inputs and outputs, and the captured graphs (one per
/// StepKind). Nothing here is reallocated while the graphs live, so their baked-in addresses
/// stay valid.
struct DecodeStep {
  int64_t b = 0, capacity = 0;  // batch size, KV cache length
  std::unique_ptr<transformer::InferenceContext> ctx;
  Tensor inputs;         // int64 [2b + 2]: token ids | positions | {offset, offset + 1}
  Tensor ids, pos;       // views [1, b] (sequence-first) of inputs
  Tensor ids_flat;       // view [b] of the token ids (kFed writes them)
  Tensor advance;        // view [b + 2] of inputs: positions | {offset, offset + 1} (kFed adds 1)
  Tensor positions;      // view [2] of inputs (InferenceContext::set_device_positions)
  Tensor logits;         // float32 [b, V]: output of kLogits
  Tensor next_ids;       // int64 [b]: output of kArgmax and kFed
  int64_t fed_max_id = -1;  // the clamp bound baked into graph[kFed]
  ops::HostReadback readback[2];  // kFed: the ids of steps of even / odd position
  void* graph[3] = {nullptr, nullptr, nullptr};
  bool warm[3] = {false, false, false};  // ran once eagerly (cuBLASLt plans cached; capture may follow)
  bool unsupported = false;       // its first device-input step threw: kEager for this entry
  uint64_t last_use = 0;
  ~DecodeStep() {
    for (void* g : graph) ops::graph_destroy(g);
  }
};

/// Uploads the inputs of the decode step at `offset` into st.inputs: tokens[:, offset], the
/// positions and {offset, offset + 1}, with one staged (pinned, stream-ordered) copy. UserError for
/// a token id outside [0, V).
void upload_inputs(DecodeStep& st, const std::vector<std::vector<int64_t>>& tokens, int64_t offset, int64_t V) {
  const int64_t b = st.b;
  std::vector<int64_t> host(static_cast<size_t>(2 * b + 2));
  for (int64_t i = 0; i < b; ++i) {
    const int64_t t = tokens[i][offset];
    if (t < 0 || t >= V)
      user_error("GPTModel.forward: token id value ", t, " at flat index ", i, " is outside [0, ", V,
                 "); check --vocab-size / --max-position-embeddings against the data");
    host[i] = t;
    host[b + i] = offset;
  }
  host[2 * b] = offset;
  host[2 * b + 1] = offset + 1;
  st.inputs.copy_(Tensor::from_vector_i64(host, {2 * b + 2}));  // pinned staging, stream-ordered
}

/// One line on stderr per generator and reason (a capture failure, an unsupported model).
void note(bool& once, const std::string& line) {
  if (once) return;
  once = true;
  std::fprintf(stderr, "text generation: %s\n", line.c_str());
  std::fflush(stderr);
}

/// Restores the calling thread's compute stream at scope exit.
class StreamScope {
 public:
  explicit StreamScope(void* stream) : active_(stream != nullptr) {
    if (active_) prev_ = ops::compute_stream_exchange(stream);
  }
  ~StreamScope() {
    if (active_) ops::compute_stream_exchange(prev_);
  }
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  bool active_;
  void* prev_ = nullptr;
};

constexpr size_t kMaxDecodeSteps = 4;  // batch sizes kept (each holds a KV cache), least recently used evicted
constexpr int64_t kCapacityRound = 128;  // KV cache length granularity of a kept step

}  // namespace

struct TextGenerator::DecodeState {
  void* stream = nullptr;  // the private compute stream of kGraph (created on first use)
  std::vector<std::unique_ptr<DecodeStep>> steps;
  uint64_t uses = 0;
  bool capture_failed = false, noted_capture = false, noted_unsupported = false;
  ~DecodeState() {
    steps.clear();
    ops::compute_stream_destroy(stream);
  }

  /// The kept step of batch size b with a KV cache of at least L tokens (a new one replaces a
  /// shorter one of the same b, or the least recently used when kMaxDecodeSteps are kept).
  DecodeStep& step_for(int64_t b, int64_t L, int64_t vocab, Device dev) {
    std::unique_ptr<DecodeStep>* slot = nullptr;
    for (auto& e : steps)
      if (e->b == b) slot = &e;
    if (!slot && steps.size() >= kMaxDecodeSteps) {
      slot = &steps.front();
      for (auto& e : steps)
        if (e->last_use < (*slot)->last_use) slot = &e;
    }
    if (slot && (*slot)->b == b && (*slot)->capacity >= L) {
      (*slot)->last_use = ++uses;
      return **slot;
    }
    auto e = std::make_unique<DecodeStep>();
    e->b = b;
    e->capacity = (L + kCapacityRound - 1) / kCapacityRound * kCapacityRound;
    e->ctx = std::make_unique<transformer::InferenceContext>(b, e->capacity);
    e->inputs = Tensor::zeros({2 * b + 2}, DType::kInt64, dev);
    e->ids = e->inputs.flat_slice(0, {1, b});
    e->pos = e->inputs.flat_slice(b, {1, b});
    e->ids_flat = e->inputs.flat_slice(0, {b});
    e->advance = e->inputs.flat_slice(b, {b + 2});
    e->positions = e->inputs.flat_slice(2 * b, {2});
    e->logits = Tensor::empty({b, vocab}, DType::kFloat32, dev);
    e->next_ids = Tensor::empty({b}, DType::kInt64, dev);
    e->last_use = ++uses;
    if (slot) {
      slot->reset();  // the old caches and graphs go first
      *slot = std::move(e);
      return **slot;
    }
    steps.push_back(std::move(e));
    return *steps.back();
  }

  /// One decode step (the token of every sequence at position `offset`) in st's fixed buffers:
  /// the outputs land in st.next_ids (kArgmax, kFed) or st.logits (kLogits); kFed also writes
  /// the next step's inputs (the clamped ids, the positions + 1; `max_id` is the clamp bound).
  /// `upload`: the inputs come from tokens[:, offset] (else they are already on the device, from
  /// the previous kFed step). Replays st's graph when captured; else launches the step eagerly
  /// and then (capture) captures it for the next steps. Returns false, with st.unsupported set
  /// and a note, when the first fixed-address step threw (e.g. a model whose attention the
  /// device-count kernel does not take): the caller then runs the step per op, which rewrites
  /// whatever the failed attempt wrote. UserError for a token id outside the vocabulary or a
  /// position beyond --max-position-embeddings (checked here on the host).
  bool run(DecodeStep& st, models::gpt::GPTModel& model, const std::vector<std::vector<int64_t>>& tokens,
           int64_t offset, StepKind kind, bool upload, int64_t max_id, bool capture, int64_t& replays) {
    const int64_t b = st.b, V = model.padded_vocab_size();
    MEGATRON_CHECK(offset + 1 <= st.capacity) << "decode step at " << offset << " past the KV cache " << st.capacity;
    if (model.learned_positions() && offset + 1 > model.max_sequence_length())
      user_error("GPTModel.forward: positions up to ", offset + 1, " exceed --max-position-embeddings ",
                 model.max_sequence_length());
    if (kind == kFed && st.fed_max_id != max_id) {  // another tokenizer size: capture again
      ops::graph_destroy(st.graph[kFed]);
      st.graph[kFed] = nullptr;
      st.fed_max_id = max_id;
    }
    if (upload) upload_inputs(st, tokens, offset, V);
    const int g = kind;
    if (st.graph[g]) {
      ops::graph_launch(st.graph[g]);
      ++replays;
      return true;
    }
    auto body = [&] {
      Tensor lg = model.forward_logits_device(st.ids, st.pos, st.ctx.get());
      Tensor last = lg.view({b, lg.size(2)});
      if (kind != kLogits) ops::argmax_last_dim(last, st.next_ids);
      else if (last.dtype() == DType::kFloat32) st.logits.copy_(last);
      else ops::cast(last, st.logits);
      if (kind == kFed) ops::decode_feed(st.next_ids, max_id, st.ids_flat, st.advance);
    };
    struct HostPositions {  // the prefill of the next call uses sequence_len_offset again
      transformer::InferenceContext& c;
      ~HostPositions() { c.set_device_positions(nullptr); }
    } restore{*st.ctx};
    st.ctx->set_device_positions(&st.positions);
    if (!st.warm[g]) {
      try {
        body();
      } catch (const std::exception& e) {
        st.unsupported = true;
        note(noted_unsupported,
             std::string("decode steps run op by op (the fixed-address step failed: ") + e.what() + ")");
        return false;
      }
      st.warm[g] = true;  // cuBLASLt plans and every lazy initialization done outside a capture
    } else {
      body();
    }
    if (capture && !capture_failed) {
      std::string err;
      st.graph[g] = ops::graph_capture(body, &err);  // records the step for the next positions
      if (!st.graph[g]) {
        capture_failed = true;
        note(noted_capture, "CUDA graph capture of the decode step failed; decode steps run eagerly: " + err);
      }
    }
    return true;
  }
};

TextGenerator::TextGenerator(models::gpt::GPTModel& model, std::shared_ptr<comm::ProcessGroup> tp_group,
                             uint64_t seed)
    : model_(model),
      tp_(tp_group ? std::move(tp_group) : comm::make_single_rank_group()),
      rng_(seed),
      decode_(std::make_unique<DecodeState>()) {
  // MEGATRON_DECODE_CUDA_GRAPH: 0 op by op, 1 graph per step, 2 or unset graph + pipelined loop.
  const char* v = std::getenv("MEGATRON_DECODE_CUDA_GRAPH");
  const std::string env = v ? v : "";
  if (!env.empty() && env != "0" && env != "1" && env != "2")
    user_error("MEGATRON_DECODE_CUDA_GRAPH=", env,
               ": expected 0 (decode steps op by op), 1 (a CUDA graph launched per step) or 2 (the graph with "
               "the pipelined greedy loop); unset it for the default (2)");
  if (model_.device().is_cuda() && env != "0") mode_ = DecodeGraphMode::kGraph;
  pipeline_ = env != "1";
}

TextGenerator::~TextGenerator() = default;

void TextGenerator::set_decode_graph_mode(DecodeGraphMode mode) {
  mode_ = mode;
  decode_ = std::make_unique<DecodeState>();
}

void TextGenerator::set_decode_pipeline(bool on) {
  pipeline_ = on;
  decode_ = std::make_unique<DecodeState>();
}

std::vector<std::vector<int64_t>> pad_prompts(const std::vector<std::vector<int64_t>>& prompts,
                                              int64_t tokens_to_generate, int64_t pad_id,
                                              std::vector<int64_t>* lengths) {
  size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  std::vector<std::vector<int64_t>> rows;
  if (lengths) lengths->clear();
  for (const auto& p : prompts) {
    rows.push_back(p);
    rows.back().resize(longest + static_cast<size_t>(tokens_to_generate), pad_id);
    if (lengths) lengths->push_back(static_cast<int64_t>(p.size()));
  }
  return rows;
}

GenerationOutput TextGenerator::generate(const std::vector<std::vector<int64_t>>& tokens_in,
                                         const std::vector<int64_t>& lengths, const GenerationParams& gp) {
  const int64_t b = static_cast<int64_t>(tokens_in.size());
  if (b == 0 || lengths.size() != tokens_in.size()) user_error("generate: ", b, " prompts but ", lengths.size(), " lengths");
  const int64_t L = static_cast<int64_t>(tokens_in[0].size());
  for (int64_t i = 0; i < b; ++i)
    if (static_cast<int64_t>(tokens_in[i].size()) != L || lengths[i] < 1 || lengths[i] > L)
      user_error("generate: prompt ", i, " has ", tokens_in[i].size(), " tokens and length ", lengths[i],
                 "; every row must be padded to ", L, " with 1 <= length <= ", L);
  comm::ProcessGroup& tp = *tp_;
  const Device dev = model_.device();
  const bool rank0 = tp.rank() == 0;
  const int64_t call = ++calls_;
  GenerationOutput out;
  out.tokens = tokens_in;

  if (gp.tokens_to_generate == 0) {  // score_and_return_on_first_stage: one forward, no cache
    out.lengths = lengths;
    if (L < 2) {
      out.log_probs.assign(static_cast<size_t>(b), {});
      return out;
    }
    Tensor logits = model_.forward_logits(columns(out.tokens, 0, L - 1));
    std::vector<int64_t> labels(static_cast<size_t>((L - 1) * b));
    for (int64_t p = 0; p < L - 1; ++p)
      for (int64_t i = 0; i < b; ++i) labels[p * b + i] = out.tokens[i][p + 1];
    std::vector<float> lp = vocab_parallel_log_probs(logits, labels, tp);
    out.log_probs.assign(static_cast<size_t>(b), std::vector<float>(static_cast<size_t>(L - 1)));
    for (int64_t p = 0; p < L - 1; ++p)
      for (int64_t i = 0; i < b; ++i) out.log_probs[i][p] = lp[p * b + i];
    return out;
  }

  const int64_t min_len = *std::min_element(lengths.begin(), lengths.end());
  // The decode steps in fixed device memory (DecodeGraphMode): one TP rank only (TP > 1 would
  // put the NCCL reductions and the logits gather into the step).
  const bool fixed_step = mode_ != DecodeGraphMode::kEager && tp.size() == 1;
  const bool capture = fixed_step && mode_ == DecodeGraphMode::kGraph;
  if (capture && !decode_->stream && dev.is_cuda()) decode_->stream = ops::compute_stream_create();
  StreamScope stream_scope(capture ? decode_->stream : nullptr);  // the whole call on the capturable stream
  DecodeStep* step = fixed_step ? &decode_->step_for(b, L, model_.padded_vocab_size(), dev) : nullptr;
  std::unique_ptr<transformer::InferenceContext> own_ctx;
  if (!step) own_ctx = std::make_unique<transformer::InferenceContext>(b, L);
  transformer::InferenceContext& ictx = step ? *step->ctx : *own_ctx;
  ictx.set_device_positions(nullptr);
  ictx.reset();
  std::vector<std::vector<float>> log_probs;
  if (gp.return_output_log_probs) log_probs.assign(static_cast<size_t>(b), std::vector<float>(static_cast<size_t>(L - 1)));
  std::vector<int64_t> gen_len(static_cast<size_t>(b), L);
  std::vector<bool> done(static_cast<size_t>(b), false);
  double top_p = gp.top_p;
  // Greedy without log-probs on one rank: the argmax runs where the logits are (see below).
  const bool device_greedy = tp.size() == 1 && gp.top_k == 1 && gp.top_p == 0.0 && !gp.return_output_log_probs &&
                             !gp.prevent_newline_after_colon;
  // The pipelined greedy loop (docs/inference.md "Pipelined decode"): every fixed-address step
  // is kFed (it also writes the next step's inputs on the device) and its ids come back through
  // an asynchronous readback; once every row is past its prompt (ctx >= max_len: the next
  // step's inputs are exactly the clamped samples) step ctx + 1 is launched before the host
  // reads step ctx's ids. A step launched past the end of the generation is discarded: its
  // cache row is beyond the result, and the next call uploads its inputs and resets the cache.
  const bool pipelined = step && device_greedy && pipeline_;
  const StepKind kind = !device_greedy ? kLogits : pipelined ? kFed : kArgmax;
  const int64_t max_len = *std::max_element(lengths.begin(), lengths.end());
  const int64_t padded_vocab = model_.padded_vocab_size();
  const int64_t max_id = clamp_sample(padded_vocab, padded_vocab, gp.vocab_size);
  int64_t ahead = -1;  // the step (its ctx) launched ahead, its ids not read yet
  int64_t prev = 0, ctx = min_len;
  // Kernel profile of the decode steps 2.. (the prefill and the first decode step are not recorded).
  std::unique_ptr<profiling::KernelProfiler> prof = profile_call(call) ? profiling::make_kernel_profiler() : nullptr;
  bool profiling_on = false;
  auto before_launch = [&](int64_t s) {
    if (prof && s == min_len + 2 && !profiling_on) profiling_on = prof->start(2);
  };
  for (; ctx < L; ++ctx) {
    Tensor logits;  // [s, b, V/TP] of the per-op path (the prefill, kEager)
    bool fixed = ahead == ctx;  // launched in the previous iteration
    if (!fixed) {
      before_launch(ctx);
      // A decode step in the fixed buffers (replayed as a graph once captured), else per op.
      fixed = step && prev > 0 && !step->unsupported &&
              decode_->run(*step, model_, out.tokens, prev, kind, true, max_id, capture, graph_replays_);
      if (!fixed) logits = model_.forward_logits(columns(out.tokens, prev, ctx), &ictx);
      if (fixed && pipelined) step->readback[ctx % 2].start(step->next_ids);
    }
    ictx.sequence_len_offset += ctx - prev;
    // Not ahead of a step whose position check throws: the per-step path throws there only if
    // the generation gets that far.
    const bool positions_ok = !model_.learned_positions() || ctx + 1 <= model_.max_sequence_length();
    if (fixed && pipelined && ctx >= max_len && ctx + 1 < L && positions_ok) {
      // Step ctx + 1 (offset ctx) from the inputs step ctx wrote on the device.
      before_launch(ctx + 1);
      MEGATRON_CHECK(decode_->run(*step, model_, out.tokens, ctx, kFed, false, max_id, capture, graph_replays_))
          << "the self-fed decode step failed after its warm-up";
      step->readback[(ctx + 1) % 2].start(step->next_ids);
      ahead = ctx + 1;
      ++pipelined_steps_;
    }
    std::vector<int64_t> sample;
    std::vector<float> last;  // host logits [b, V] (not filled by the device greedy path)
    int64_t V = 0;
    if (device_greedy) {
      // argmax on the device: b token ids come back instead of b x V float logits (the one host
      // round trip of a greedy step, docs/inference.md#performance).
      const int64_t vl = fixed ? step->logits.size(1) : logits.size(2);
      if (fixed && pipelined) {
        const auto* h = static_cast<const int64_t*>(step->readback[ctx % 2].wait());
        sample.assign(h, h + b);
      } else {
        Tensor idx = fixed ? step->next_ids : Tensor::empty({b}, DType::kInt64, dev);
        if (!fixed) ops::argmax_last_dim(logits.narrow0(logits.size(0) - 1, 1).view({b, vl}), idx);
        Tensor h = idx.to(Device::cpu());
        sample.assign(h.data<int64_t>(), h.data<int64_t>() + b);
      }
      for (int64_t i = 0; i < b; ++i) {
        sample[i] = clamp_sample(sample[i], vl, gp.vocab_size);
        (void)rng_.uniform();  // one draw per row, as sample_row's callers (sampling.h)
      }
    } else {
      last = fixed ? step->logits.to_float_vector() : gather_last_logits(logits, tp);
      V = static_cast<int64_t>(last.size()) / b;
      if (gp.prevent_newline_after_colon && gp.colon_id >= 0 && gp.newline_id >= 0 && gp.newline_id < V)
        for (int64_t i = 0; i < b; ++i)
          if (out.tokens[i][ctx - 1] == gp.colon_id) last[i * V + gp.newline_id] = -1e10f;
      // Sample on TP rank 0 (one RNG draw per row, see sampling.h) and share the result. The last
      // element is an abort flag: when sampling throws on rank 0 every rank throws here, so no rank
      // is left waiting in the next step's collectives.
      sample.assign(static_cast<size_t>(b) + 1, 0);
      std::exception_ptr failed;
      if (rank0) {
        try {
          for (int64_t i = 0; i < b; ++i)
            sample[i] = sample_row(last.data() + i * V, V, gp.top_k, top_p, gp.temperature, gp.vocab_size, rng_.uniform());
        } catch (...) {
          failed = std::current_exception();
          sample[b] = 1;
        }
      }
      broadcast_i64(sample, tp, dev);
      if (failed) std::rethrow_exception(failed);
      if (sample[b] != 0) user_error("generate: sampling failed on tensor-parallel rank 0; request abandoned");
      sample.pop_back();
    }
    if (top_p > 0.0 && gp.top_p_decay > 0.0) {
      top_p *= gp.top_p_decay;
      if (gp.top_p_bound > 0.0) top_p = std::max(top_p, gp.top_p_bound);
    }
    std::vector<bool> started(static_cast<size_t>(b));
    for (int64_t i = 0; i < b; ++i) {
      started[i] = lengths[i] <= ctx;
      if (started[i]) out.tokens[i][ctx] = sample[i];
    }
    if (gp.return_output_log_probs) {
      // Positions prev .. ctx-2 of a prefill from the device logits; the last one (ctx-1) from the
      // gathered host row (which carries the prevent_newline_after_colon change, as Megatron's
      // in-place edit of the logits does).
      const int64_t s = ctx - prev;
      if (s > 1) {
        std::vector<int64_t> labels(static_cast<size_t>((s - 1) * b));
        for (int64_t p = 0; p < s - 1; ++p)
          for (int64_t i = 0; i < b; ++i) labels[p * b + i] = out.tokens[i][prev + p + 1];
        std::vector<float> lp = vocab_parallel_log_probs(logits.narrow0(0, s - 1), labels, tp);
        for (int64_t p = 0; p < s - 1; ++p)
          for (int64_t i = 0; i < b; ++i) log_probs[i][prev + p] = lp[p * b + i];
      }
      for (int64_t i = 0; i < b; ++i)
        log_probs[i][ctx - 1] = static_cast<float>(log_prob_of(last.data() + i * V, V, out.tokens[i][ctx]));
    }
    prev = ctx;
    bool all_done = true;
    for (int64_t i = 0; i < b; ++i) {
      const int64_t t = sample[i];
      bool hit;
      if (gp.stop_on_double_eol) hit = t == 628 || (t == 198 && out.tokens[i][ctx - 1] == 198);
      else if (gp.stop_on_eol) hit = t == 628 || t == 198;
      else hit = t == gp.termination_id;
      hit = hit && started[i];
      if (hit && !done[i]) gen_len[i] = ctx + 1;
      done[i] = done[i] || hit;
      all_done = all_done && done[i];
    }
    if (gp.use_eod_token_for_early_termination && all_done) break;
  }
  if (ctx == L) --ctx;  // the loop ran to the end: the last position written is L - 1
  if (profiling_on) {
    const int64_t last_step = std::max(ctx, ahead) - min_len;  // a discarded step launched ahead included
    const std::string text = profiling::format_summary(prof->stop(last_step, tp.rank()));
    std::fprintf(stderr, "generate call %lld: batch %lld, decode steps 2-%lld of a %lld-token cache\n%s",
                 static_cast<long long>(call), static_cast<long long>(b), static_cast<long long>(last_step),
                 static_cast<long long>(L), text.c_str());
    std::fflush(stderr);
  }
  for (auto& row : out.tokens) row.resize(static_cast<size_t>(ctx + 1));
  if (gp.return_output_log_probs)
    for (auto& row : log_probs) row.resize(static_cast<size_t>(ctx));
  out.lengths = gen_len;
  out.log_probs = std::move(log_probs);
  return out;
}

}  // namespace megatron::inference
