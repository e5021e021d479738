// --overlap-grad-reduce timeline (data parallel, CPU backends): run under mpirun with 2 ranks,
//   mpirun -np 2 build/bin/overlap_grad_reduce_bench [--layers 8] [--hidden 256] [--seq 256]
// A GPT (fp32, no dropout) trains one micro-batch per step under DistributedDataParallel with
// --overlap-grad-reduce and buckets of about one layer (--ddp-bucket-size). Backward reports each
// finished layer (GPTModel's grad-ready hook -> register_grad_ready); a bucket's all-reduce starts
// on the group's communication thread as soon as the bucket is complete. Rank 0 prints, for the
// last of 3 steps, when each layer's backward ended and when each bucket's reduction started and
// finished (ms from the start of backward), then the part of the reduction time that ran while
// backward was still computing. The same step without overlap (one bucket after backward) is
// timed for comparison. Prints figures only; asserts nothing.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "megatron/core/distributed/distributed_data_parallel.h"
#include "megatron/core/comm/init_process_group.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/training/arguments.h"
#include "megatron/training/config_from_args.h"

using namespace megatron;
using Clock = std::chrono::steady_clock;

namespace {

Clock::time_point g_t0;
double ms_since_t0(Clock::time_point t) { return std::chrono::duration<double, std::milli>(t - g_t0).count(); }

struct Interval {
  double start, end;
};

// Work whose completion time is recorded by an observer thread.
class TimedWork final : public comm::Work {
 public:
  TimedWork(std::unique_ptr<comm::Work> inner, Interval* slot)
      : inner_(std::move(inner)), observer_([this, slot] {
          inner_->wait();
          slot->end = ms_since_t0(Clock::now());
        }) {}
  ~TimedWork() override {
    if (observer_.joinable()) observer_.join();
  }
  void wait() override {
    if (observer_.joinable()) observer_.join();
  }
  bool is_completed() override { return !observer_.joinable() || inner_->is_completed(); }

 private:
  std::unique_ptr<comm::Work> inner_;
  std::thread observer_;
};

// Decorates the data-parallel group: records when each async all-reduce / reduce-scatter was
// launched and when it completed.
class TimelineGroup final : public comm::ProcessGroup {
 public:
  explicit TimelineGroup(std::shared_ptr<comm::ProcessGroup> inner) : inner_(std::move(inner)) {}
  std::vector<Interval> reduces;  // in launch order
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::vector<int>& ranks() const override { return inner_->ranks(); }
  std::unique_ptr<comm::Work> all_reduce(Tensor& t, comm::ReduceOp op, bool async) override {
    if (!async) return inner_->all_reduce(t, op, false);
    Interval* slot = record();
    return std::make_unique<TimedWork>(inner_->all_reduce(t, op, true), slot);
  }
  std::unique_ptr<comm::Work> all_gather(const Tensor& in, Tensor& out, bool async) override {
    return inner_->all_gather(in, out, async);
  }
  std::unique_ptr<comm::Work> reduce_scatter(const Tensor& in, Tensor& out, comm::ReduceOp op,
                                                    bool async) override {
    if (!async) return inner_->reduce_scatter(in, out, op, false);
    Interval* slot = record();
    return std::make_unique<TimedWork>(inner_->reduce_scatter(in, out, op, true), slot);
  }
  std::unique_ptr<comm::Work> broadcast(Tensor& t, int root, bool async) override {
    return inner_->broadcast(t, root, async);
  }
  std::unique_ptr<comm::Work> send(const Tensor& t, int peer, bool async) override {
    return inner_->send(t, peer, async);
  }
  std::unique_ptr<comm::Work> recv(Tensor& t, int peer, bool async) override {
    return inner_->recv(t, peer, async);
  }
  void barrier() override { inner_->barrier(); }
  const char* backend_name() const override { return inner_->backend_name(); }

 private:
  Interval* record() {
    reduces.reserve(1024);  // stable addresses for the observer threads
    reduces.push_back({ms_since_t0(Clock::now()), -1.0});
    return &reduces.back();
  }
  std::shared_ptr<comm::ProcessGroup> inner_;
};

int64_t flag(int argc, char** argv, const std::string& name, int64_t dflt) {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == name) return std::atoll(argv[i + 1]);
  return dflt;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t layers = flag(argc, argv, "--layers", 8), hidden = flag(argc, argv, "--hidden", 256),
                seq = flag(argc, argv, "--seq", 256), mbs = 2, vocab = 512;
  auto world = comm::init_process_group();
  training::Arguments a = training::parse_args(std::vector<std::string>{
      "--num-layers", std::to_string(layers), "--hidden-size", std::to_string(hidden), "--num-attention-heads", "8",
      "--seq-length", std::to_string(seq), "--max-position-embeddings", std::to_string(seq), "--attention-dropout",
      "0", "--hidden-dropout", "0", "--micro-batch-size", std::to_string(mbs), "--train-iters", "1", "--lr", "1e-4",
      "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", std::to_string(vocab)});
  a.world_size = world->size();
  training::validate_args(a);
  training::set_padded_vocab_size(a, vocab);
  models::gpt::GPTModel model(training::core_transformer_config_from_args(a), a.padded_vocab_size, seq, 1234);

  // About one decoder layer per bucket: 12 h^2 + 13 h elements per GPT layer.
  const int64_t bucket = 12 * hidden * hidden + 13 * hidden;
  datasets::GPTBatch batch;
  std::vector<int64_t> tok(static_cast<size_t>(mbs * seq));
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = static_cast<int64_t>((i * 7919 + world->rank() * 31) % vocab);
  batch.tokens = Tensor::from_vector_i64(tok, {mbs, seq});
  batch.labels = batch.tokens.clone();
  Tensor dloss = Tensor::from_vector(std::vector<float>(static_cast<size_t>(mbs * seq), 1.0f / static_cast<float>(mbs * seq)), {mbs, seq});

  for (bool overlap : {true, false}) {
    auto group = std::make_shared<TimelineGroup>(world);
    distributed::DistributedDataParallelConfig dc;
    dc.overlap_grad_reduce = overlap;
    if (overlap) dc.bucket_size = bucket;
    distributed::DistributedDataParallel ddp(dc, model.buffers(), model.parameters(), group);
    std::vector<std::pair<double, size_t>> layer_done;  // (ms, #params reported)
    if (overlap)
      model.set_grad_ready_hook([&](const std::vector<size_t>& ready) {
        layer_done.push_back({ms_since_t0(Clock::now()), ready.size()});
        for (size_t i : ready) ddp.register_grad_ready(i);
      });
    double backward_ms = 0, total_ms = 0;
    for (int step = 0; step < 3; ++step) {
      ddp.zero_grad_buffer();
      group->reduces.clear();
      layer_done.clear();
      model.forward(batch, true);
      world->barrier();
      g_t0 = Clock::now();
      model.backward(dloss);
      backward_ms = ms_since_t0(Clock::now());
      ddp.finish_grad_sync();
      total_ms = ms_since_t0(Clock::now());
    }
    model.set_grad_ready_hook(nullptr);
    if (world->rank() != 0) continue;
    std::printf("\n== DP%d, %s: GPT %lld layers, hidden %lld, seq %lld, micro-batch %lld, fp32, %zu bucket(s) ==\n",
                world->size(), overlap ? "--overlap-grad-reduce" : "no overlap", static_cast<long long>(layers),
                static_cast<long long>(hidden), static_cast<long long>(seq), static_cast<long long>(mbs),
                ddp.buckets().size());
    struct Ev {
      double t;
      std::string what;
    };
    std::vector<Ev> ev;
    for (size_t k = 0; k < layer_done.size(); ++k)
      ev.push_back({layer_done[k].first, "backward finished a stage (" + std::to_string(layer_done[k].second) +
                                             " params ready)"});
    double reduce_total = 0, reduce_hidden = 0;
    for (size_t k = 0; k < group->reduces.size(); ++k) {
      const Interval& r = group->reduces[k];
      ev.push_back({r.start, "  bucket " + std::to_string(k) + " reduce START"});
      ev.push_back({r.end, "  bucket " + std::to_string(k) + " reduce END (" +
                               std::to_string(r.end - r.start).substr(0, 6) + " ms)"});
      reduce_total += r.end - r.start;
      reduce_hidden += std::max(0.0, std::min(r.end, backward_ms) - std::min(r.start, backward_ms));
    }
    ev.push_back({backward_ms, "backward END"});
    ev.push_back({total_ms, "finish_grad_sync returned (grads ready for the optimizer)"});
    std::stable_sort(ev.begin(), ev.end(), [](const Ev& x, const Ev& y) { return x.t < y.t; });
    for (const auto& e : ev) std::printf("%9.2f ms  %s\n", e.t, e.what.c_str());
    std::printf("backward %.2f ms, backward + grad sync %.2f ms; reduction time %.2f ms, of which %.2f ms (%.0f%%) "
                "ran during backward\n",
                backward_ms, total_ms, reduce_total, reduce_hidden,
                reduce_total > 0 ? 100.0 * reduce_hidden / reduce_total : 0.0);
    std::fflush(stdout);
  }
  world->barrier();
  comm::destroy_process_group();
  return 0;
}
