#include "megatron/core/comm/mpi/mpi_process_group.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "megatron/core/comm/comm_worker.h"
#include "megatron/core/comm/reduction.h"

namespace megatron::comm {

namespace {

void mpi_check(int rc, const char* call, const std::string& what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  user_error(call, " failed in ", what, ": ", std::string(msg, len));
}

// Process-wide MPI runtime: init once, finalize at exit after every group worker stopped.
struct MpiRuntime {
  std::mutex mu;
  std::vector<std::weak_ptr<CommWorker>> workers;
  static MpiRuntime& get() {
    static MpiRuntime* r = new MpiRuntime();
    return *r;
  }
  void ensure_init() {
    int inited = 0;
    MPI_Initialized(&inited);
    if (inited) return;
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (provided < MPI_THREAD_MULTIPLE)
      user_error("the MPI library does not provide MPI_THREAD_MULTIPLE (got level ", provided,
                 "); use an MPI build with thread support (Debian's openmpi has it)");
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    set_global_rank_for_messages(rank);
    set_job_abort_hook([](int code) {
      int fin = 0, n = 1;
      MPI_Finalized(&fin);
      if (!fin) MPI_Comm_size(MPI_COMM_WORLD, &n);
      if (!fin && n > 1) MPI_Abort(MPI_COMM_WORLD, code);
    });
    std::atexit([] { MpiRuntime::get().finalize(); });
  }
  void add(const std::shared_ptr<CommWorker>& w) {
    std::lock_guard<std::mutex> l(mu);
    workers.push_back(w);
  }
  void finalize() {
    std::vector<std::shared_ptr<CommWorker>> live;
    {
      std::lock_guard<std::mutex> l(mu);
      for (auto& w : workers)
        if (auto p = w.lock()) live.push_back(p);
      workers.clear();
    }
    for (auto& w : live) w->shutdown();
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
  }
};

MPI_Datatype elem_type(size_t bytes) {
  static std::mutex mu;
  static std::map<size_t, MPI_Datatype> cache;
  std::lock_guard<std::mutex> l(mu);
  auto it = cache.find(bytes);
  if (it != cache.end()) return it->second;
  MPI_Datatype t;
  MPI_Type_contiguous(static_cast<int>(bytes), MPI_BYTE, &t);
  MPI_Type_commit(&t);
  cache[bytes] = t;
  return t;
}

MPI_Datatype acc_mpi_type(AccType a) {
  switch (a) {
    case AccType::kF32: return MPI_FLOAT;
    case AccType::kF64: return MPI_DOUBLE;
    case AccType::kI64: return MPI_INT64_T;
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kMin: return MPI_MIN;
    default: return MPI_SUM;
  }
}

// dtypes MPI can reduce directly in their own representation.
bool native(DType t) { return t == DType::kFloat32 || t == DType::kFloat64 || t == DType::kInt64; }

int checked_count(int64_t n, const std::string& what) {
  if (n > INT_MAX) user_error(what, ": ", n, " elements exceed MPI's int count; split the tensor");
  return static_cast<int>(n);
}

void check_cpu(const Tensor& t, const char* op) {
  if (!t.defined()) user_error("MPI ", op, ": undefined tensor");
  if (!t.is_cpu())
    user_error("MPI ", op, ": tensor on ", t.device().str(), "; the MPI backend handles CPU tensors (use nccl for CUDA)");
}

// Work of a point-to-point request: wait() polls under the watchdog timeout.
class RequestWork final : public Work {
 public:
  RequestWork(MPI_Request req, std::string desc, Tensor keep)
      : req_(req), desc_(std::move(desc)), keep_(std::move(keep)), start_(std::chrono::steady_clock::now()) {}
  ~RequestWork() override {
    if (!done_) try { wait(); } catch (...) {}
  }
  void wait() override {
    while (!is_completed()) {
      if (std::chrono::steady_clock::now() - start_ > distributed_timeout())
        abort_job("watchdog: " + desc_ + " did not complete within " +
                  std::to_string(distributed_timeout().count() / 1000.0) +
                  " s (--distributed-timeout-minutes); the peer rank has likely died or hung. Ending the job.");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  bool is_completed() override {
    if (done_) return true;
    int flag = 0;
    mpi_check(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE), "MPI_Test", desc_);
    done_ = flag != 0;
    return done_;
  }

 private:
  MPI_Request req_;
  std::string desc_;
  Tensor keep_;
  std::chrono::steady_clock::time_point start_;
  bool done_ = false;
};

class MpiGroup final : public ProcessGroup {
 public:
  MpiGroup(MPI_Comm comm, std::vector<int> ranks) : comm_(comm), ranks_(std::move(ranks)) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MEGATRON_CHECK(static_cast<int>(ranks_.size()) == size_) << ranks_.size() << " vs " << size_;
    worker_ = std::make_shared<CommWorker>();
    MpiRuntime::get().add(worker_);
  }
  ~MpiGroup() override {
    worker_->shutdown();
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<int>& ranks() const override { return ranks_; }
  const char* backend_name() const override { return "mpi"; }

  std::unique_ptr<Work> all_reduce(Tensor& t, ReduceOp op, bool async) override {
    check_cpu(t, "all_reduce");
    std::string d = describe("all_reduce", t, ranks_, reduce_op_name(op));
    Tensor tt = t;
    return finish(worker_->submit(d, [this, tt, op, d] {
                    const int64_t n = tt.numel();
                    const int cnt = checked_count(n, d);
                    AccType a = acc_type(tt.dtype());
                    if (native(tt.dtype())) {
                      mpi_check(MPI_Allreduce(MPI_IN_PLACE, tt.data_ptr(), cnt, acc_mpi_type(a), mpi_op(op), comm_),
                                "MPI_Allreduce", d);
                      if (op == ReduceOp::kAvg) divide_acc(tt.data_ptr(), a, n, size_);
                      return;
                    }
                    std::vector<char> buf(n * acc_size(a));
                    to_acc(tt.data_ptr(), tt.dtype(), buf.data(), n);
                    mpi_check(MPI_Allreduce(MPI_IN_PLACE, buf.data(), cnt, acc_mpi_type(a), mpi_op(op), comm_),
                              "MPI_Allreduce", d);
                    if (op == ReduceOp::kAvg) divide_acc(buf.data(), a, n, size_);
                    from_acc(buf.data(), tt.dtype(), tt.data_ptr(), n);
                  }),
                  async);
  }

  std::unique_ptr<Work> all_gather(const Tensor& in, Tensor& out, bool async) override {
    check_cpu(in, "all_gather");
    check_cpu(out, "all_gather");
    if (out.numel() != in.numel() * size_ || out.dtype() != in.dtype())
      user_error("all_gather: output ", out.str(), " must hold ", size_, " x input ", in.str());
    std::string d = describe("all_gather", in, ranks_);
    Tensor i = in, o = out;
    return finish(worker_->submit(d, [this, i, o, d] {
                    MPI_Datatype t = elem_type(dtype_size(i.dtype()));
                    int cnt = checked_count(i.numel(), d);
                    // MPI forbids aliasing send and receive buffers unless MPI_IN_PLACE; our
                    // callers often gather from their own shard of `out`.
                    char* ob = static_cast<char*>(o.data_ptr());
                    const char* ib = static_cast<const char*>(i.data_ptr());
                    const size_t nb = i.nbytes();
                    if (ib == ob + rank_ * nb) {
                      mpi_check(MPI_Allgather(MPI_IN_PLACE, 0, t, ob, cnt, t, comm_), "MPI_Allgather", d);
                    } else if (ib + nb > ob && ob + o.nbytes() > ib) {
                      std::vector<char> tmp(ib, ib + nb);
                      mpi_check(MPI_Allgather(tmp.data(), cnt, t, ob, cnt, t, comm_), "MPI_Allgather", d);
                    } else {
                      mpi_check(MPI_Allgather(ib, cnt, t, ob, cnt, t, comm_), "MPI_Allgather", d);
                    }
                  }),
                  async);
  }

  std::unique_ptr<Work> reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, bool async) override {
    check_cpu(in, "reduce_scatter");
    check_cpu(out, "reduce_scatter");
    if (in.numel() != out.numel() * size_ || out.dtype() != in.dtype())
      user_error("reduce_scatter: input ", in.str(), " must hold ", size_, " x output ", out.str());
    std::string d = describe("reduce_scatter", in, ranks_, reduce_op_name(op));
    Tensor i = in, o = out;
    return finish(worker_->submit(d, [this, i, o, op, d] {
                    const int64_t n = o.numel();
                    const int cnt = checked_count(n, d);
                    AccType a = acc_type(i.dtype());
                    std::vector<char> send, recv(n * acc_size(a));
                    const void* sp = i.data_ptr();
                    if (!native(i.dtype())) {
                      send.resize(i.numel() * acc_size(a));
                      to_acc(i.data_ptr(), i.dtype(), send.data(), i.numel());
                      sp = send.data();
                    }
                    mpi_check(MPI_Reduce_scatter_block(sp, recv.data(), cnt, acc_mpi_type(a), mpi_op(op), comm_),
                              "MPI_Reduce_scatter_block", d);
                    if (op == ReduceOp::kAvg) divide_acc(recv.data(), a, n, size_);
                    from_acc(recv.data(), o.dtype(), o.data_ptr(), n);
                  }),
                  async);
  }

  std::unique_ptr<Work> broadcast(Tensor& t, int root, bool async) override {
    check_cpu(t, "broadcast");
    if (root < 0 || root >= size_) user_error("broadcast: root ", root, " outside group of ", size_);
    std::string d = describe("broadcast", t, ranks_);
    Tensor tt = t;
    return finish(worker_->submit(d, [this, tt, root, d] {
                    mpi_check(MPI_Bcast(tt.data_ptr(), checked_count(tt.numel(), d), elem_type(dtype_size(tt.dtype())),
                                        root, comm_),
                              "MPI_Bcast", d);
                  }),
                  async);
  }

  std::unique_ptr<Work> send(const Tensor& t, int peer, bool async) override {
    check_cpu(t, "send");
    if (peer < 0 || peer >= size_ || peer == rank_) user_error("send: bad peer ", peer, " in group of ", size_);
    std::string d = describe("send", t, ranks_) + " to group rank " + std::to_string(peer);
    MPI_Request req;
    mpi_check(MPI_Isend(t.data_ptr(), checked_count(t.numel(), d), elem_type(dtype_size(t.dtype())), peer, 0, comm_, &req),
              "MPI_Isend", d);
    auto w = std::make_unique<RequestWork>(req, d, t);
    if (!async) w->wait();
    return w;
  }

  std::unique_ptr<Work> recv(Tensor& t, int peer, bool async) override {
    check_cpu(t, "recv");
    if (peer < 0 || peer >= size_ || peer == rank_) user_error("recv: bad peer ", peer, " in group of ", size_);
    std::string d = describe("recv", t, ranks_) + " from group rank " + std::to_string(peer);
    MPI_Request req;
    mpi_check(MPI_Irecv(t.data_ptr(), checked_count(t.numel(), d), elem_type(dtype_size(t.dtype())), peer, 0, comm_, &req),
              "MPI_Irecv", d);
    auto w = std::make_unique<RequestWork>(req, d, t);
    if (!async) w->wait();
    return w;
  }

  void barrier() override {
    std::string d = "barrier on group " + ranks_str(ranks_);
    worker_->run_sync(d, [this, d] { mpi_check(MPI_Barrier(comm_), "MPI_Barrier", d); });
  }

  std::shared_ptr<ProcessGroup> split(const std::vector<std::vector<int>>& groups) override {
    const int me = ranks_[rank_];
    int color = MPI_UNDEFINED, key = 0;
    std::vector<int> mine;
    for (size_t g = 0; g < groups.size(); ++g) {
      auto it = std::find(groups[g].begin(), groups[g].end(), me);
      if (it != groups[g].end()) {
        MEGATRON_CHECK(color == MPI_UNDEFINED) << "rank " << me << " in two groups of one split";
        color = static_cast<int>(g);
        key = static_cast<int>(it - groups[g].begin());
        mine = groups[g];
      }
    }
    for (int r : mine)
      MEGATRON_CHECK(std::find(ranks_.begin(), ranks_.end(), r) != ranks_.end()) << "split: rank " << r << " not in parent";
    MPI_Comm nc = MPI_COMM_NULL;
    worker_->run_sync("split of group " + ranks_str(ranks_), [&] { mpi_check(MPI_Comm_split(comm_, color, key, &nc), "MPI_Comm_split", "split"); });
    if (nc == MPI_COMM_NULL) return nullptr;
    return std::make_shared<MpiGroup>(nc, mine);
  }

 private:
  MPI_Comm comm_;
  std::vector<int> ranks_;
  int rank_ = 0, size_ = 1;
  std::shared_ptr<CommWorker> worker_;
};

}  // namespace

bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}

std::shared_ptr<ProcessGroup> make_mpi_world_group() {
  MpiRuntime::get().ensure_init();
  MPI_Comm c;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  int size = 0;
  MPI_Comm_size(c, &size);
  std::vector<int> ranks(size);
  for (int i = 0; i < size; ++i) ranks[i] = i;
  return std::make_shared<MpiGroup>(c, ranks);
}

}  // namespace megatron::comm
