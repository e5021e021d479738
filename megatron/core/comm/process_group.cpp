#include "megatron/core/comm/process_group.h"

namespace megatron::comm {

namespace {
class DoneWork final : public Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};

class SingleRankGroup final : public ProcessGroup {
 public:
  explicit SingleRankGroup(int global_rank) : ranks_{global_rank} {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::vector<int>& ranks() const override { return ranks_; }
  std::unique_ptr<Work> all_reduce(Tensor&, ReduceOp, bool) override { return std::make_unique<DoneWork>(); }
  std::unique_ptr<Work> all_gather(const Tensor& in, Tensor& out, bool) override {
    if (!in.shares_storage(out) || in.data_ptr() != out.data_ptr()) out.copy_(in);
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<Work> reduce_scatter(const Tensor& in, Tensor& out, ReduceOp, bool) override {
    if (in.data_ptr() != out.data_ptr()) out.copy_(in);
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<Work> broadcast(Tensor&, int, bool) override { return std::make_unique<DoneWork>(); }
  std::unique_ptr<Work> send(const Tensor&, int, bool) override {
    MEGATRON_CHECK(false) << "send on a single-rank group";
    return nullptr;
  }
  std::unique_ptr<Work> recv(Tensor&, int, bool) override {
    MEGATRON_CHECK(false) << "recv on a single-rank group";
    return nullptr;
  }
  void barrier() override {}
  std::shared_ptr<ProcessGroup> split(const std::vector<std::vector<int>>& groups) override {
    for (const auto& g : groups)
      for (int r : g)
        if (r == ranks_[0]) {
          MEGATRON_CHECK(g.size() == 1) << "split of a single-rank group into a group of " << g.size();
          return std::make_shared<SingleRankGroup>(ranks_[0]);
        }
    return nullptr;
  }
  const char* backend_name() const override { return "single"; }

 private:
  std::vector<int> ranks_;
};
}  // namespace

namespace {
class MultiWork final : public Work {
 public:
  explicit MultiWork(std::vector<std::unique_ptr<Work>> w) : w_(std::move(w)) {}
  void wait() override {
    for (auto& w : w_) w->wait();
  }
  bool is_completed() override {
    for (auto& w : w_)
      if (!w->is_completed()) return false;
    return true;
  }

 private:
  std::vector<std::unique_ptr<Work>> w_;
};
}  // namespace

std::unique_ptr<Work> ProcessGroup::batch_isend_irecv(const std::vector<P2POp>& ops) {
  std::vector<std::unique_ptr<Work>> works;
  for (const auto& op : ops) {
    MEGATRON_CHECK(op.tensor) << "null tensor in batch_isend_irecv";
    works.push_back(op.kind == P2POp::kSend ? send(*op.tensor, op.peer, true) : recv(*op.tensor, op.peer, true));
  }
  return std::make_unique<MultiWork>(std::move(works));
}

std::shared_ptr<ProcessGroup> ProcessGroup::split(const std::vector<std::vector<int>>&) {
  user_error("process group backend '", backend_name(), "' cannot create subgroups");
}

std::shared_ptr<ProcessGroup> make_single_rank_group(int global_rank) {
  return std::make_shared<SingleRankGroup>(global_rank);
}

}  // namespace megatron::comm
