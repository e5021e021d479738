// The 1F1B pipeline schedule with PP = world size (2-4 ranks under mpirun / megatron_launch) on a
// toy model: stage s computes out = tanh(in · W_s), the last stage's loss is Σ(out ⊙ target)/M.
// Reference: the same stages run one after another in one process for every micro-batch
// (hand-written forward/backward of the formula above). The schedule only reorders micro-batches
// and moves tensors, so losses and the accumulated dW must match to fp32 rounding (tolerance
// 1e-6 relative to the largest magnitude; they are in fact bit-identical).
// The same checks run (a) as DistPipeline.* with one process per stage under mpirun /
// megatron_launch -- on CUDA tensors when MEGATRON_TEST_DIST_BACKEND=nccl (tests/gpu/ppnccl_check.sh)
// -- and (b) as PipelineSchedule.*UnderNcclPointToPointSemantics with threads as ranks on a group
// that follows NCCL's point-to-point rules (see RendezvousHub), where a schedule that would
// deadlock on NCCL fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>

#include "test_utils/dist_test_util.h"
#include "megatron/core/pipeline_parallel/schedules.h"

namespace megatron {
namespace {

constexpr int kRows = 3, kH = 8;

std::vector<float> weight(int s) {
  std::vector<float> w(kH * kH);
  for (int i = 0; i < kH; ++i)
    for (int j = 0; j < kH; ++j) w[i * kH + j] = 0.3f * std::sin(1.0f + 31.0f * s + 7.0f * i + j);
  return w;
}
std::vector<float> data_in(int m) {
  std::vector<float> x(kRows * kH);
  for (int k = 0; k < kRows * kH; ++k) x[k] = std::cos(13.0f * m + k);
  return x;
}
std::vector<float> target(int m) {
  std::vector<float> t(kRows * kH);
  for (int k = 0; k < kRows * kH; ++k) t[k] = std::sin(5.0f * m + 0.1f * k);
  return t;
}

// One stage of the toy model with per-micro-batch saved activations.
struct ToyStage : pipeline_parallel::PipelineStage {
  int s, S, M;
  Device dev = Device::cpu();  // where the tensors it hands to the schedule live (CUDA on NCCL)
  std::vector<float> w, dw;
  std::map<int, std::pair<std::vector<float>, std::vector<float>>> saved;  // mb -> (in, out)
  std::vector<int> order;  // forward/backward trace: +mb forward, -(mb+1) backward
  ToyStage(int stage, int stages, int m) : s(stage), S(stages), M(m), w(weight(stage)), dw(kH * kH, 0.f) {}
  Tensor forward_step(int mb, const Tensor& input) override {
    order.push_back(mb);
    std::vector<float> in = s == 0 ? data_in(mb) : input.to_float_vector();
    std::vector<float> out(kRows * kH, 0.f);
    for (int r = 0; r < kRows; ++r)
      for (int j = 0; j < kH; ++j) {
        float z = 0;
        for (int i = 0; i < kH; ++i) z += in[r * kH + i] * w[i * kH + j];
        out[r * kH + j] = std::tanh(z);
      }
    saved[mb] = {in, out};
    if (s == S - 1) {
      auto t = target(mb);
      float loss = 0;
      for (int k = 0; k < kRows * kH; ++k) loss += out[k] * t[k];
      return Tensor::from_vector({loss / M}, {1});
    }
    return Tensor::from_vector(out, {kRows, kH}).to(dev);
  }
  Tensor backward_step(int mb, const Tensor& out_grad) override {
    order.push_back(-(mb + 1));
    auto [in, out] = saved.at(mb);
    saved.erase(mb);
    std::vector<float> dout(kRows * kH);
    if (s == S - 1) {
      auto t = target(mb);
      for (int k = 0; k < kRows * kH; ++k) dout[k] = t[k] / M;
    } else {
      dout = out_grad.to_float_vector();
    }
    std::vector<float> dz(kRows * kH), din(kRows * kH, 0.f);
    for (int k = 0; k < kRows * kH; ++k) dz[k] = dout[k] * (1 - out[k] * out[k]);
    for (int r = 0; r < kRows; ++r)
      for (int i = 0; i < kH; ++i)
        for (int j = 0; j < kH; ++j) {
          dw[i * kH + j] += in[r * kH + i] * dz[r * kH + j];
          din[r * kH + i] += dz[r * kH + j] * w[i * kH + j];
        }
    if (s == 0) return {};
    return Tensor::from_vector(din, {kRows, kH}).to(dev);
  }
};

// The device of the schedule's tensors: CUDA (this rank's GPU, LOCAL_RANK as the NCCL backend
// picks it) on the NCCL backend, else the CPU.
Device pipeline_device(const comm::ProcessGroup& g) {
  if (std::string(g.backend_name()) != "nccl") return Device::cpu();
  const char* lr = std::getenv("LOCAL_RANK");
  return Device::cuda(lr ? std::atoi(lr) : 0);
}

// 1F1B on `world` (stage = group rank) vs the sequential run, for several micro-batch counts.
void check_one_f_one_b(const std::shared_ptr<comm::ProcessGroup>& world) {
  const int S = world->size(), r = world->rank();
  for (int M : {1, 2, S, 2 * S + 1}) {
    // Reference: all stages in this process, micro-batch by micro-batch.
    std::vector<std::unique_ptr<ToyStage>> ref;
    for (int s = 0; s < S; ++s) ref.push_back(std::make_unique<ToyStage>(s, S, M));
    std::vector<float> ref_losses;
    for (int mb = 0; mb < M; ++mb) {
      Tensor x;
      for (int s = 0; s < S; ++s) x = ref[s]->forward_step(mb, x);
      ref_losses.push_back(float(x.item()));
      Tensor g;
      for (int s = S - 1; s >= 0; --s) g = ref[s]->backward_step(mb, g);
    }
    ToyStage mine(r, S, M);
    mine.dev = pipeline_device(*world);
    pipeline_parallel::P2PCommunicator p2p(world, {kRows, kH}, DType::kFloat32, mine.dev);
    auto losses = pipeline_parallel::forward_backward_pipelining_without_interleaving(mine, M, p2p);
    if (r == S - 1) {
      ASSERT_EQ(int(losses.size()), M);
      for (int mb = 0; mb < M; ++mb) EXPECT_NEAR(losses[mb].item(), ref_losses[mb], 1e-6 * std::fabs(ref_losses[mb]) + 1e-7);
    } else {
      EXPECT_TRUE(losses.empty());
    }
    float mx = 0, err = 0;
    for (int k = 0; k < kH * kH; ++k) {
      mx = std::max(mx, std::fabs(ref[r]->dw[k]));
      err = std::max(err, std::fabs(mine.dw[k] - ref[r]->dw[k]));
    }
    EXPECT_LE(err, 1e-6 * mx) << "dW of stage " << r << ", M=" << M;
    // Schedule shape (docs/megatron-reference.md#pipeline-schedules): min(S - r - 1, M) warm-up forwards come first.
    const int warmup = std::min(S - r - 1, M);
    for (int i = 0; i < warmup; ++i) EXPECT_EQ(mine.order[i], i) << "warm-up forward " << i;
    if (warmup < M) EXPECT_EQ(mine.order[warmup], warmup) << "first steady-state forward";
    if (warmup < M) EXPECT_EQ(mine.order[warmup + 1], -1) << "then the backward of micro-batch 0";
    EXPECT_EQ(int(mine.order.size()), 2 * M);
  }
}

// The backend MEGATRON_TEST_DIST_BACKEND asked for is the one in use (a GPU check must not pass
// on a silent fallback to the CPU backends).
void expect_requested_backend(const comm::ProcessGroup& g) {
  if (const char* b = std::getenv("MEGATRON_TEST_DIST_BACKEND")) EXPECT_STREQ(g.backend_name(), b);
}

TEST(DistPipeline, OneFOneBMatchesSequentialRun) {
  SKIP_UNLESS_MULTI_RANK();
  expect_requested_backend(*testing::dist_world());
  check_one_f_one_b(testing::dist_world());
}

struct VirtualToy : pipeline_parallel::VirtualPipelineStage {
  std::vector<std::unique_ptr<ToyStage>> chunks;
  std::vector<std::pair<char, int>> trace;  // ('F'|'B', chunk)
  VirtualToy(int rank, int P, int V, int M, Device dev) {
    for (int c = 0; c < V; ++c) {
      chunks.push_back(std::make_unique<ToyStage>(c * P + rank, P * V, M));
      chunks.back()->dev = dev;
    }
  }
  Tensor forward_step(int c, int mb, const Tensor& in) override {
    trace.push_back({'F', c});
    return chunks[c]->forward_step(mb, in);
  }
  Tensor backward_step(int c, int mb, const Tensor& g) override {
    trace.push_back({'B', c});
    return chunks[c]->backward_step(mb, g);
  }
};

// The interleaved schedule on `world` vs the sequential run of the P*V model stages: VP 2 and 3,
// one and two micro-batch groups, a group size above PP with a remainder group, forward only.
void check_interleaved(const std::shared_ptr<comm::ProcessGroup>& world) {
  const int P = world->size(), r = world->rank();
  const Device dev = pipeline_device(*world);
  pipeline_parallel::InterleavedPipeline pipe(world, {kRows, kH}, DType::kFloat32, dev);
  struct Case { int V, M, G; bool forward_only; };
  for (Case cs : {Case{2, P, 0, false}, Case{2, 2 * P, 0, false}, Case{3, 2 * P, 0, false},
                  Case{2, 2 * P + P, 2 * P, false}, Case{2, 2 * P, 0, true}}) {
    const int V = cs.V, M = cs.M, S = P * V;
    std::vector<std::unique_ptr<ToyStage>> ref;
    for (int s = 0; s < S; ++s) ref.push_back(std::make_unique<ToyStage>(s, S, M));
    std::vector<float> ref_losses;
    for (int mb = 0; mb < M; ++mb) {
      Tensor x;
      for (int s = 0; s < S; ++s) x = ref[s]->forward_step(mb, x);
      ref_losses.push_back(float(x.item()));
      Tensor g;
      if (!cs.forward_only)
        for (int s = S - 1; s >= 0; --s) g = ref[s]->backward_step(mb, g);
    }
    VirtualToy mine(r, P, V, M, dev);
    auto losses = pipe.run(mine, M, V, cs.G, cs.forward_only);
    const int G = cs.G ? cs.G : P;
    const std::string where = "V=" + std::to_string(V) + " M=" + std::to_string(M) + " G=" + std::to_string(G) +
                              (cs.forward_only ? " forward only" : "");
    if (r == P - 1) {
      // Losses arrive in schedule-table order of the last chunk = micro-batch order.
      ASSERT_EQ(int(losses.size()), M) << where;
      for (int mb = 0; mb < M; ++mb)
        EXPECT_NEAR(losses[mb].item(), ref_losses[mb], 1e-6 * std::fabs(ref_losses[mb]) + 1e-7) << where;
    } else {
      EXPECT_TRUE(losses.empty()) << where;
    }
    if (cs.forward_only) {
      EXPECT_EQ(int(mine.trace.size()), M * V) << where;
      for (const auto& t : mine.trace) EXPECT_EQ(t.first, 'F') << where;
      continue;
    }
    for (int c = 0; c < V; ++c) {
      const auto& got = mine.chunks[c]->dw;
      const auto& want = ref[c * P + r]->dw;
      float mx = 0, err = 0;
      for (int k = 0; k < kH * kH; ++k) mx = std::max(mx, std::fabs(want[k])), err = std::max(err, std::fabs(got[k] - want[k]));
      EXPECT_LE(err, 1e-6 * mx) << "dW of chunk " << c << " (model stage " << c * P + r << "), " << where;
    }
    // Megatron's warm-up: (P - r - 1)*2 + (V - 1)*G forwards (capped at M*V) before the first backward.
    const int warmup = std::min((P - r - 1) * 2 + (V - 1) * G, M * V);
    for (int i = 0; i < warmup; ++i) EXPECT_EQ(mine.trace[i].first, 'F') << i << " " << where;
    if (warmup < M * V) EXPECT_EQ(mine.trace[warmup + 1].first, 'B') << where;
    EXPECT_EQ(int(mine.trace.size()), 2 * M * V) << where;
  }
}

TEST(DistPipeline, InterleavedMatchesSequentialRun) {
  SKIP_UNLESS_MULTI_RANK();
  expect_requested_backend(*testing::dist_world());
  check_interleaved(testing::dist_world());
}

// ---------------------------------------------------------------------------------------------
// NCCL's point-to-point semantics on the CPU: ranks are threads of this process; a send completes
// only once the peer has posted the matching receive (no buffering); messages between two ranks
// on one communicator match in posting order; a rank's batches on one communicator run one after
// another (NCCL serializes them on the communicator's stream), and only the batch at the head
// takes part in matching. A schedule that would deadlock on NCCL hangs here; after 10 s the
// waits give up and the test fails naming the rank. (The MPI and TCP backends buffer sends, so
// they cannot catch this: the old interleaved schedule passed on them and was refused on NCCL.)
class RendezvousHub {
 public:
  explicit RendezvousHub(int n) : n_(n), next_channel_(static_cast<size_t>(n), 0) {}
  int size() const { return n_; }
  struct Op {
    comm::P2POp::Kind kind;
    Tensor* tensor;
    int me, peer, channel;
    int64_t seq = 0;
    bool done = false;
  };
  struct Batch {
    std::vector<Op> ops;
    bool done = false;
  };
  std::shared_ptr<Batch> post(int me, int channel, const std::vector<comm::P2POp>& ops) {
    std::lock_guard<std::mutex> l(mu_);
    auto b = std::make_shared<Batch>();
    for (const auto& o : ops) {
      Op op{o.kind, o.tensor, me, o.peer, channel};
      op.seq = count_[{channel, o.kind == comm::P2POp::kSend ? me : o.peer,
                       o.kind == comm::P2POp::kSend ? o.peer : me, int(o.kind)}]++;
      b->ops.push_back(op);
    }
    queue_[{me, channel}].push_back(b);
    progress();
    return b;
  }
  void wait(const std::shared_ptr<Batch>& b, int me) {
    std::unique_lock<std::mutex> l(mu_);
    if (!cv_.wait_for(l, std::chrono::seconds(10), [&] { return b->done || failed_; }) || failed_) {
      failed_ = true;
      cv_.notify_all();
      throw UserError("rendezvous p2p: rank " + std::to_string(me) +
                      " waits for a batch no peer can complete (a deadlock under NCCL's semantics)");
    }
  }
  int new_channel(int me) { return ++next_channel_[static_cast<size_t>(me)]; }

 private:
  // Matches the active ops (those of each queue's head batch) until nothing changes.
  void progress() {
    for (bool changed = true; changed;) {
      changed = false;
      std::map<std::tuple<int, int, int, int64_t>, Op*> sends, recvs;  // (channel, src, dst, seq)
      for (auto& [key, q] : queue_) {
        if (q.empty()) continue;
        for (auto& op : q.front()->ops) {
          if (op.done) continue;
          if (op.kind == comm::P2POp::kSend) sends[{op.channel, op.me, op.peer, op.seq}] = &op;
          else recvs[{op.channel, op.peer, op.me, op.seq}] = &op;
        }
      }
      for (auto& [k, s] : sends) {
        auto it = recvs.find(k);
        if (it == recvs.end()) continue;
        MEGATRON_CHECK(it->second->tensor->shape() == s->tensor->shape()) << "p2p shape mismatch";
        it->second->tensor->copy_(*s->tensor);
        s->done = it->second->done = true;
        changed = true;
      }
      for (auto& [key, q] : queue_) {
        while (!q.empty() && std::all_of(q.front()->ops.begin(), q.front()->ops.end(), [](const Op& o) { return o.done; })) {
          q.front()->done = true;
          q.pop_front();
          changed = true;
        }
      }
    }
    cv_.notify_all();
  }
  int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool failed_ = false;
  std::vector<int> next_channel_;
  std::map<std::tuple<int, int, int, int>, int64_t> count_;  // (channel, src, dst, kind) -> ops posted
  std::map<std::pair<int, int>, std::deque<std::shared_ptr<Batch>>> queue_;  // (rank, channel)
};

class RendezvousGroup final : public comm::ProcessGroup {
 public:
  RendezvousGroup(std::shared_ptr<RendezvousHub> hub, int rank, int channel)
      : hub_(std::move(hub)), rank_(rank), channel_(channel) {
    for (int i = 0; i < hub_->size(); ++i) ranks_.push_back(i);
  }
  int rank() const override { return rank_; }
  int size() const override { return hub_->size(); }
  const std::vector<int>& ranks() const override { return ranks_; }
  const char* backend_name() const override { return "rendezvous"; }
  std::unique_ptr<comm::Work> batch_isend_irecv(const std::vector<comm::P2POp>& ops) override {
    return std::make_unique<W>(hub_, hub_->post(rank_, channel_, ops), rank_);
  }
  std::unique_ptr<comm::Work> send(const Tensor& t, int peer, bool async) override {
    auto held = std::make_shared<Tensor>(t);  // the op refers to it until the Work is gone
    auto w = std::make_unique<W>(hub_, hub_->post(rank_, channel_, {{comm::P2POp::kSend, held.get(), peer}}), rank_);
    w->held = held;
    if (!async) w->wait();
    return w;
  }
  std::unique_ptr<comm::Work> recv(Tensor& t, int peer, bool async) override {
    auto w = batch_isend_irecv({{comm::P2POp::kRecv, &t, peer}});
    if (!async) w->wait();
    return w;
  }
  std::shared_ptr<comm::ProcessGroup> split(const std::vector<std::vector<int>>& groups) override {
    MEGATRON_CHECK(groups.size() == 1 && groups[0] == ranks_) << "only the whole group";
    return std::make_shared<RendezvousGroup>(hub_, rank_, hub_->new_channel(rank_));
  }
  std::unique_ptr<comm::Work> all_reduce(Tensor&, comm::ReduceOp, bool) override { return unsupported(); }
  std::unique_ptr<comm::Work> all_gather(const Tensor&, Tensor&, bool) override { return unsupported(); }
  std::unique_ptr<comm::Work> reduce_scatter(const Tensor&, Tensor&, comm::ReduceOp, bool) override {
    return unsupported();
  }
  std::unique_ptr<comm::Work> broadcast(Tensor&, int, bool) override { return unsupported(); }
  void barrier() override { unsupported(); }

 private:
  struct W final : comm::Work {
    W(std::shared_ptr<RendezvousHub> h, std::shared_ptr<RendezvousHub::Batch> b, int me)
        : hub(std::move(h)), batch(std::move(b)), me(me) {}
    void wait() override { hub->wait(batch, me); }
    bool is_completed() override { return batch->done; }
    std::shared_ptr<RendezvousHub> hub;
    std::shared_ptr<RendezvousHub::Batch> batch;
    int me;
    std::shared_ptr<Tensor> held;
  };
  static std::unique_ptr<comm::Work> unsupported() {
    MEGATRON_CHECK(false) << "only point-to-point on the rendezvous group";
    return nullptr;
  }
  std::shared_ptr<RendezvousHub> hub_;
  int rank_, channel_;
  std::vector<int> ranks_;
};

// Runs fn(group) on P threads; returns the first error message ("" if none).
std::string run_ranks(int P, const std::function<void(std::shared_ptr<comm::ProcessGroup>)>& fn) {
  auto hub = std::make_shared<RendezvousHub>(P);
  std::vector<std::string> errors(static_cast<size_t>(P));
  std::vector<std::thread> threads;
  for (int r = 0; r < P; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(std::make_shared<RendezvousGroup>(hub, r, 0));
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& e : errors)
    if (!e.empty()) return e;
  return "";
}

TEST(PipelineSchedule, OneFOneBUnderNcclPointToPointSemantics) {
  for (int P : {2, 3, 4}) EXPECT_EQ(run_ranks(P, check_one_f_one_b), "") << "PP=" << P;
}

TEST(PipelineSchedule, InterleavedUnderNcclPointToPointSemantics) {
  for (int P : {2, 3, 4}) EXPECT_EQ(run_ranks(P, check_interleaved), "") << "PP=" << P;
}

TEST(PipelineSchedule, ScheduleTableFollowsMegatron) {
  // get_schedule_table(M=5, V=2, G=2) written out from Megatron's definition: groups of G
  // starting at 0, 2, 4; the group whose end reaches M ([4]) takes what is left; each group goes
  // through chunk 0 then chunk 1.
  using P = std::pair<int, int>;
  EXPECT_EQ(pipeline_parallel::get_schedule_table(5, 2, 2),
            (std::vector<P>{{0, 0}, {1, 0}, {0, 1}, {1, 1}, {2, 0}, {3, 0}, {2, 1}, {3, 1}, {4, 0}, {4, 1}}));
  EXPECT_EQ(pipeline_parallel::get_schedule_table(4, 2, 4),
            (std::vector<P>{{0, 0}, {1, 0}, {2, 0}, {3, 0}, {0, 1}, {1, 1}, {2, 1}, {3, 1}}));
}

}  // namespace
}  // namespace megatron
