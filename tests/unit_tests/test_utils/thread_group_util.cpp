#include "test_utils/thread_group_util.h"

#include <barrier>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

namespace megatron::testing {

namespace {

struct Shared {
  explicit Shared(int n) : n(n), bar(n), slots(n) {}
  int n;
  std::barrier<> bar;
  std::vector<const Tensor*> slots;
};

class DoneWork final : public comm::Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};

class ThreadGroup final : public comm::ProcessGroup {
 public:
  ThreadGroup(std::shared_ptr<Shared> s, int rank) : s_(std::move(s)), rank_(rank) {
    for (int i = 0; i < s_->n; ++i) ranks_.push_back(i);
  }
  int rank() const override { return rank_; }
  int size() const override { return s_->n; }
  const std::vector<int>& ranks() const override { return ranks_; }

  std::unique_ptr<comm::Work> all_reduce(Tensor& t, comm::ReduceOp op, bool) override {
    s_->slots[rank_] = &t;
    s_->bar.arrive_and_wait();
    std::vector<double> acc(t.numel());
    for (int64_t i = 0; i < t.numel(); ++i) {
      double v = s_->slots[0]->item_at(i);
      for (int r = 1; r < s_->n; ++r) {
        double x = s_->slots[r]->item_at(i);
        switch (op) {
          case comm::ReduceOp::kMax: v = std::max(v, x); break;
          case comm::ReduceOp::kMin: v = std::min(v, x); break;
          default: v += x;
        }
      }
      if (op == comm::ReduceOp::kAvg) v /= s_->n;
      acc[i] = v;
    }
    s_->bar.arrive_and_wait();
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (t.dtype() == DType::kFloat32) t.data<float>()[i] = static_cast<float>(acc[i]);
      else if (t.dtype() == DType::kInt64) t.data<int64_t>()[i] = static_cast<int64_t>(acc[i]);
      else if (t.dtype() == DType::kFloat64) t.data<double>()[i] = acc[i];
      else if (t.dtype() == DType::kInt32) t.data<int32_t>()[i] = static_cast<int32_t>(acc[i]);
    }
    s_->bar.arrive_and_wait();
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<comm::Work> all_gather(const Tensor& in, Tensor& out, bool) override {
    s_->slots[rank_] = &in;
    s_->bar.arrive_and_wait();
    for (int r = 0; r < s_->n; ++r)
      std::memcpy(static_cast<char*>(out.data_ptr()) + r * in.nbytes(), s_->slots[r]->data_ptr(), in.nbytes());
    s_->bar.arrive_and_wait();
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<comm::Work> reduce_scatter(const Tensor&, Tensor&, comm::ReduceOp, bool) override {
    MEGATRON_CHECK(false) << "reduce_scatter not implemented in the test thread group";
    return nullptr;
  }
  std::unique_ptr<comm::Work> broadcast(Tensor& t, int root, bool) override {
    s_->slots[rank_] = &t;
    s_->bar.arrive_and_wait();
    if (rank_ != root) std::memcpy(t.data_ptr(), s_->slots[root]->data_ptr(), t.nbytes());
    s_->bar.arrive_and_wait();
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<comm::Work> send(const Tensor&, int, bool) override {
    MEGATRON_CHECK(false) << "send not implemented in the test thread group";
    return nullptr;
  }
  std::unique_ptr<comm::Work> recv(Tensor&, int, bool) override {
    MEGATRON_CHECK(false) << "recv not implemented in the test thread group";
    return nullptr;
  }
  void barrier() override { s_->bar.arrive_and_wait(); }

 private:
  std::shared_ptr<Shared> s_;
  int rank_;
  std::vector<int> ranks_;
};

}  // namespace

std::vector<std::shared_ptr<comm::ProcessGroup>> make_thread_groups(int n) {
  auto s = std::make_shared<Shared>(n);
  std::vector<std::shared_ptr<comm::ProcessGroup>> g;
  for (int i = 0; i < n; ++i) g.push_back(std::make_shared<ThreadGroup>(s, i));
  return g;
}

void run_ranks(int n, const std::function<void(int, comm::ProcessGroup&)>& fn) {
  auto groups = make_thread_groups(n);
  std::vector<std::exception_ptr> errs(n);
  std::vector<std::thread> th;
  for (int r = 0; r < n; ++r)
    th.emplace_back([&, r] {
      try {
        fn(r, *groups[r]);
      } catch (...) {
        errs[r] = std::current_exception();
      }
    });
  for (auto& t : th) t.join();
  for (auto& e : errs)
    if (e) std::rethrow_exception(e);
}

}  // namespace megatron::testing
