#include "megatron/core/comm/tcp/tcp_process_group.h"

#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <thread>

#include "megatron/core/comm/comm_worker.h"
#include "megatron/core/comm/reduction.h"

namespace megatron::comm {

namespace {

// Per-process connection manager: one listener, an acceptor thread, and the handshake
// (channel name, source global rank) that routes each incoming socket to the group that wants it.
class Mesh {
 public:
  Mesh(std::shared_ptr<TCPStore> store, int rank, int world)
      : store_(std::move(store)), rank_(rank), world_(world), listener_(net::listen_on(0)) {
    store_->set("tcp/addr/" + std::to_string(rank_),
                store_->local_address() + " " + std::to_string(net::bound_port(listener_)));
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~Mesh() {
    stop_ = true;
    ::shutdown(listener_.fd(), SHUT_RDWR);
    if (acceptor_.joinable()) acceptor_.join();
  }
  int rank() const { return rank_; }

  /// Sockets to every other member of `ranks` (indexed by group rank; self invalid).
  std::vector<std::shared_ptr<net::Socket>> connect_group(const std::string& channel, const std::vector<int>& ranks) {
    std::vector<std::shared_ptr<net::Socket>> out(ranks.size());
    auto timeout = distributed_timeout();
    for (size_t i = 0; i < ranks.size(); ++i) {
      const int p = ranks[i];
      if (p == rank_) continue;
      if (rank_ > p) {
        auto [host, port] = address_of(p);
        auto s = std::make_shared<net::Socket>(net::connect_to(host, port, timeout, "rank " + std::to_string(p)));
        net::send_str(s->fd(), channel, "rank " + std::to_string(p));
        int64_t me = rank_;
        net::send_all(s->fd(), &me, 8, "rank " + std::to_string(p));
        out[i] = s;
      } else {
        std::unique_lock<std::mutex> l(mu_);
        auto key = std::make_pair(channel, p);
        if (!cv_.wait_for(l, timeout, [&] { return pending_.count(key) > 0; }))
          user_error("timed out after ", timeout.count() / 1000.0, " s waiting for rank ", p, " to connect (group ",
                     ranks_str(ranks), "); did it die or skip the group creation?");
        out[i] = pending_[key];
        pending_.erase(key);
      }
    }
    return out;
  }

 private:
  std::pair<std::string, int> address_of(int r) {
    std::string v = store_->get("tcp/addr/" + std::to_string(r));
    auto sp = v.rfind(' ');
    return {v.substr(0, sp), std::stoi(v.substr(sp + 1))};
  }
  void accept_loop() {
    while (!stop_) {
      net::Socket s;
      try {
        s = net::accept_one(listener_, std::chrono::milliseconds(200), "peer connections");
        std::string channel = net::recv_str(s.fd(), "a connecting peer");
        int64_t src = 0;
        net::recv_all(s.fd(), &src, 8, "a connecting peer");
        std::lock_guard<std::mutex> l(mu_);
        pending_[{channel, static_cast<int>(src)}] = std::make_shared<net::Socket>(std::move(s));
        cv_.notify_all();
      } catch (const UserError&) {
        continue;
      }
    }
  }
  std::shared_ptr<TCPStore> store_;
  int rank_, world_;
  net::Socket listener_;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<std::string, int>, std::shared_ptr<net::Socket>> pending_;
};

class TcpGroup final : public ProcessGroup, public std::enable_shared_from_this<TcpGroup> {
 public:
  TcpGroup(std::shared_ptr<Mesh> mesh, std::string channel, std::vector<int> ranks)
      : mesh_(std::move(mesh)), channel_(std::move(channel)), ranks_(std::move(ranks)) {
    auto it = std::find(ranks_.begin(), ranks_.end(), mesh_->rank());
    MEGATRON_CHECK(it != ranks_.end()) << "rank " << mesh_->rank() << " not in " << ranks_str(ranks_);
    rank_ = static_cast<int>(it - ranks_.begin());
    size_ = static_cast<int>(ranks_.size());
    coll_ = mesh_->connect_group(channel_, ranks_);
    p2p_ = mesh_->connect_group(channel_ + "#p2p", ranks_);
    send_workers_.resize(size_);
    recv_workers_.resize(size_);
  }
  ~TcpGroup() override {
    worker_.shutdown();
    for (auto& w : send_workers_)
      if (w) w->shutdown();
    for (auto& w : recv_workers_)
      if (w) w->shutdown();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<int>& ranks() const override { return ranks_; }
  const char* backend_name() const override { return "tcp"; }

  std::unique_ptr<Work> all_reduce(Tensor& t, ReduceOp op, bool async) override {
    check(t, "all_reduce");
    std::string d = describe("all_reduce", t, ranks_, reduce_op_name(op));
    Tensor tt = t;
    return finish(worker_.submit(d, [this, tt, op] {
                    const int64_t n = tt.numel();
                    AccType a = acc_type(tt.dtype());
                    std::vector<char> acc(n * acc_size(a));
                    to_acc(tt.data_ptr(), tt.dtype(), acc.data(), n);
                    std::vector<int64_t> bounds(size_ + 1);
                    for (int c = 0; c <= size_; ++c) bounds[c] = n * c / size_;
                    ring_reduce_scatter(acc.data(), a, bounds, op);
                    ring_all_gather(acc.data(), acc_size(a), bounds);
                    if (op == ReduceOp::kAvg) divide_acc(acc.data(), a, n, size_);
                    from_acc(acc.data(), tt.dtype(), tt.data_ptr(), n);
                  }),
                  async);
  }

  std::unique_ptr<Work> all_gather(const Tensor& in, Tensor& out, bool async) override {
    check(in, "all_gather");
    check(out, "all_gather");
    if (out.numel() != in.numel() * size_ || out.dtype() != in.dtype())
      user_error("all_gather: output ", out.str(), " must hold ", size_, " x input ", in.str());
    std::string d = describe("all_gather", in, ranks_);
    Tensor i = in, o = out;
    return finish(worker_.submit(d, [this, i, o] {
                    const int64_t m = i.numel();
                    char* ob = static_cast<char*>(o.data_ptr());
                    std::memmove(ob + rank_ * i.nbytes(), i.data_ptr(), i.nbytes());
                    std::vector<int64_t> bounds(size_ + 1);
                    for (int c = 0; c <= size_; ++c) bounds[c] = m * c;
                    ring_all_gather(ob, dtype_size(i.dtype()), bounds, /*own_chunk_is_rank=*/true);
                  }),
                  async);
  }

  std::unique_ptr<Work> reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, bool async) override {
    check(in, "reduce_scatter");
    check(out, "reduce_scatter");
    if (in.numel() != out.numel() * size_ || out.dtype() != in.dtype())
      user_error("reduce_scatter: input ", in.str(), " must hold ", size_, " x output ", out.str());
    std::string d = describe("reduce_scatter", in, ranks_, reduce_op_name(op));
    Tensor i = in, o = out;
    return finish(worker_.submit(d, [this, i, o, op] {
                    const int64_t m = o.numel();
                    AccType a = acc_type(i.dtype());
                    std::vector<char> acc(i.numel() * acc_size(a));
                    to_acc(i.data_ptr(), i.dtype(), acc.data(), i.numel());
                    std::vector<int64_t> bounds(size_ + 1);
                    for (int c = 0; c <= size_; ++c) bounds[c] = m * c;
                    ring_reduce_scatter(acc.data(), a, bounds, op, /*end_with_own=*/true);
                    char* mine = acc.data() + rank_ * m * acc_size(a);
                    if (op == ReduceOp::kAvg) divide_acc(mine, a, m, size_);
                    from_acc(mine, o.dtype(), o.data_ptr(), m);
                  }),
                  async);
  }

  std::unique_ptr<Work> broadcast(Tensor& t, int root, bool async) override {
    check(t, "broadcast");
    if (root < 0 || root >= size_) user_error("broadcast: root ", root, " outside group of ", size_);
    std::string d = describe("broadcast", t, ranks_);
    Tensor tt = t;
    return finish(worker_.submit(d, [this, tt, root] {
                    if (rank_ == root) {
                      for (int p = 0; p < size_; ++p)
                        if (p != root) net::send_all(coll_[p]->fd(), tt.data_ptr(), tt.nbytes(), peer_name(p));
                    } else {
                      net::recv_all(coll_[root]->fd(), tt.data_ptr(), tt.nbytes(), peer_name(root));
                    }
                  }),
                  async);
  }

  std::unique_ptr<Work> send(const Tensor& t, int peer, bool async) override {
    check(t, "send");
    if (peer < 0 || peer >= size_ || peer == rank_) user_error("send: bad peer ", peer, " in group of ", size_);
    std::string d = describe("send", t, ranks_) + " to group rank " + std::to_string(peer);
    Tensor tt = t;
    return finish(p2p_worker(send_workers_, peer).submit(d, [this, tt, peer] {
                    net::send_all(p2p_[peer]->fd(), tt.data_ptr(), tt.nbytes(), peer_name(peer));
                  }),
                  async);
  }

  std::unique_ptr<Work> recv(Tensor& t, int peer, bool async) override {
    check(t, "recv");
    if (peer < 0 || peer >= size_ || peer == rank_) user_error("recv: bad peer ", peer, " in group of ", size_);
    std::string d = describe("recv", t, ranks_) + " from group rank " + std::to_string(peer);
    Tensor tt = t;
    return finish(p2p_worker(recv_workers_, peer).submit(d, [this, tt, peer] {
                    net::recv_all(p2p_[peer]->fd(), tt.data_ptr(), tt.nbytes(), peer_name(peer));
                  }),
                  async);
  }

  void barrier() override {
    Tensor t = Tensor::zeros({1}, DType::kInt64);
    all_reduce(t, ReduceOp::kSum, false);
  }

  std::shared_ptr<ProcessGroup> split(const std::vector<std::vector<int>>& groups) override {
    const int me = ranks_[rank_];
    const int split_no = splits_++;
    for (size_t g = 0; g < groups.size(); ++g) {
      if (std::find(groups[g].begin(), groups[g].end(), me) == groups[g].end()) continue;
      for (int r : groups[g])
        MEGATRON_CHECK(std::find(ranks_.begin(), ranks_.end(), r) != ranks_.end()) << "split: rank " << r << " not in parent";
      return std::make_shared<TcpGroup>(mesh_, channel_ + "/" + std::to_string(split_no) + "." + std::to_string(g),
                                        groups[g]);
    }
    return nullptr;
  }

 private:
  static void check(const Tensor& t, const char* op) {
    if (!t.defined()) user_error("tcp ", op, ": undefined tensor");
    if (!t.is_cpu())
      user_error("tcp ", op, ": tensor on ", t.device().str(), "; the tcp backend handles CPU tensors (use nccl for CUDA)");
  }
  std::string peer_name(int p) const { return "rank " + std::to_string(ranks_[p]); }
  CommWorker& p2p_worker(std::vector<std::unique_ptr<CommWorker>>& v, int peer) {
    std::lock_guard<std::mutex> l(p2p_mu_);
    if (!v[peer]) v[peer] = std::make_unique<CommWorker>();
    return *v[peer];
  }

  // Ring reduce-scatter over chunks [bounds[c], bounds[c+1]) of acc. Afterwards this rank holds
  // the fully reduced chunk (rank+1)%n, or chunk `rank` when end_with_own.
  void ring_reduce_scatter(char* acc, AccType a, const std::vector<int64_t>& b, ReduceOp op, bool end_with_own = false) {
    const int n = size_;
    if (n == 1) return;
    const size_t es = acc_size(a);
    const int next = (rank_ + 1) % n, prev = (rank_ - 1 + n) % n;
    const int shift = end_with_own ? 1 : 0;
    int64_t maxc = 0;
    for (int c = 0; c < n; ++c) maxc = std::max(maxc, b[c + 1] - b[c]);
    std::vector<char> tmp(maxc * es);
    for (int s = 0; s < n - 1; ++s) {
      const int sc = ((rank_ - s - shift) % n + n) % n;
      const int rc = ((rank_ - s - 1 - shift) % n + n) % n;
      net::send_recv(coll_[next]->fd(), acc + b[sc] * es, (b[sc + 1] - b[sc]) * es, coll_[prev]->fd(), tmp.data(),
                     (b[rc + 1] - b[rc]) * es, "ring neighbours " + peer_name(next) + "/" + peer_name(prev));
      reduce_acc(acc + b[rc] * es, tmp.data(), a, b[rc + 1] - b[rc], op);
    }
  }
  // Ring all-gather: this rank starts holding chunk (rank+1)%n (after ring_reduce_scatter) or
  // chunk `rank` when own_chunk_is_rank.
  void ring_all_gather(char* buf, size_t es, const std::vector<int64_t>& b, bool own_chunk_is_rank = false) {
    const int n = size_;
    if (n == 1) return;
    const int next = (rank_ + 1) % n, prev = (rank_ - 1 + n) % n;
    const int start = own_chunk_is_rank ? 0 : 1;
    for (int s = 0; s < n - 1; ++s) {
      const int sc = ((rank_ + start - s) % n + n) % n;
      const int rc = ((rank_ + start - s - 1) % n + n) % n;
      net::send_recv(coll_[next]->fd(), buf + b[sc] * es, (b[sc + 1] - b[sc]) * es, coll_[prev]->fd(), buf + b[rc] * es,
                     (b[rc + 1] - b[rc]) * es, "ring neighbours " + peer_name(next) + "/" + peer_name(prev));
    }
  }

  std::shared_ptr<Mesh> mesh_;
  std::string channel_;
  std::vector<int> ranks_;
  int rank_ = 0, size_ = 1;
  std::vector<std::shared_ptr<net::Socket>> coll_, p2p_;
  CommWorker worker_;
  std::mutex p2p_mu_;
  std::vector<std::unique_ptr<CommWorker>> send_workers_, recv_workers_;
  int splits_ = 0;
};

}  // namespace

std::shared_ptr<ProcessGroup> make_tcp_world_group(std::shared_ptr<TCPStore> store, int rank, int world_size) {
  auto mesh = std::make_shared<Mesh>(std::move(store), rank, world_size);
  std::vector<int> ranks(world_size);
  for (int i = 0; i < world_size; ++i) ranks[i] = i;
  return std::make_shared<TcpGroup>(mesh, "world", ranks);
}

}  // namespace megatron::comm
