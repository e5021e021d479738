// NCCL backend of ProcessGroup for CUDA tensors (compiled into megatron_cuda only).
//
// * Bootstrap without MPI: rank 0 creates the ncclUniqueId and publishes it in the TCPStore at
//   MASTER_ADDR:MASTER_PORT; every rank calls ncclCommInitRank on device LOCAL_RANK % #devices.
// * Subgroups: ncclCommSplit (collective over the parent communicator).
// * Streams: each group owns a non-blocking communication stream. An operation first makes that
//   stream wait for an event recorded on the caller's compute stream (megatron::cuda::
//   current_stream()), then enqueues the NCCL call and records a completion event. Work::wait()
//   makes the caller's current stream wait for that event (host does not block), exactly like
//   torch's ProcessGroupNCCL; is_completed() queries the event.
// * Lifetimes of the tensors an operation reads/writes (torch's record_stream problem): every
//   rank thread allocates and frees (cudaMallocAsync/cudaFreeAsync) on its current stream. Once
//   Work::wait() has made the current stream wait for the completion event -- at once for a
//   synchronous operation -- every later free on that stream is ordered after the collective, so
//   the Work drops its references right there and the caller's own release frees the memory in
//   stream order. Only a Work destroyed without wait() hands its tensors to the watchdog, which
//   drops them once the event fired. (Until 2026-11-30 every operation's tensors went to the
//   watchdog, polled once a second: under TP + sequence parallelism all gathered activations and
//   pre-reduce-scatter outputs of the last second stayed alive -- LLaMA-3-8B TP2 ran out of memory
//   on an H200 in the first iteration; docs/memory.md.)
// * CPU tensors (the training loop's host scalars: loss sums, token counts, grad-norm partial
//   sums, found-inf flags) are staged through this rank's GPU: copied in, reduced on the
//   communicator, copied back, synchronously (the returned Work is already complete). Megatron
//   keeps those scalars on the GPU; the effect is the same. Large data must be CUDA tensors.
// * Subgroups whose every member group has one rank need no communicator (identity collectives).
// * Watchdog: a thread polls in-flight operations; an asynchronous NCCL error or an operation
//   older than the distributed timeout aborts the communicators and ends the job with a message.
#if defined(MEGATRON_WITH_NCCL)

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

#include "megatron/core/comm/comm_worker.h"
#include "megatron/core/comm/init_process_group.h"
#include "megatron/core/comm/reduction.h"
#include "megatron/core/ops/cuda/cuda_utils.h"

namespace megatron::comm {

namespace {

#define NCCL_CHECK(expr, what)                                                                   \
  do {                                                                                           \
    ncclResult_t _r = (expr);                                                                    \
    if (_r != ncclSuccess)                                                                       \
      user_error(#expr, " failed in ", what, ": ", ncclGetErrorString(_r), " (", ncclGetLastError(nullptr), ")"); \
  } while (0)

ncclDataType_t nccl_type(DType t, bool for_reduction) {
  switch (t) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat16: return ncclFloat16;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kFloat64: return ncclFloat64;
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
    case DType::kInt8: return ncclInt8;
    case DType::kUInt8: return ncclUint8;
    default:
      if (for_reduction) user_error("NCCL cannot reduce dtype ", dtype_name(t));
      return ncclUint8;  // byte-wise movement (fp8, bool, ...): caller passes nbytes
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kAvg: return ncclAvg;
  }
  return ncclSum;
}

// One in-flight operation.
struct NcclOp {
  cudaEvent_t done = nullptr;
  std::vector<Tensor> keep;  // only for a Work dropped before wait() (NcclWork::~NcclWork)
  std::string desc;
  std::chrono::steady_clock::time_point start;
  int device = 0;
  bool completed = false;
  bool query() {
    if (completed) return true;
    cudaError_t e = cudaEventQuery(done);
    if (e == cudaSuccess) completed = true;
    else if (e != cudaErrorNotReady) abort_job("CUDA error while waiting for " + desc + ": " + cudaGetErrorString(e));
    return completed;
  }
  ~NcclOp() {
    if (done) cudaEventDestroy(done);
  }
};

// Process-wide watchdog over every NCCL communicator and in-flight op.
class NcclWatchdog {
 public:
  static NcclWatchdog& get() {
    static NcclWatchdog* w = new NcclWatchdog();
    return *w;
  }
  void add_comm(ncclComm_t c) {
    std::lock_guard<std::mutex> l(mu_);
    comms_.push_back(c);
    start();
  }
  void remove_comm(ncclComm_t c) {
    std::lock_guard<std::mutex> l(mu_);
    comms_.erase(std::remove(comms_.begin(), comms_.end(), c), comms_.end());
    // Without communicators nothing is in flight: release the kept tensors now (on the caller's
    // thread), so the watchdog makes no CUDA call while the process exits.
    if (comms_.empty()) {
      ops_.clear();
      retired_.clear();
    }
  }
  void add_op(std::shared_ptr<NcclOp> op) {
    std::lock_guard<std::mutex> l(mu_);
    ops_.push_back(std::move(op));
  }
  /// Keeps `tensors` alive until `op` completed (a Work dropped without wait()).
  void keep_until_done(const std::shared_ptr<NcclOp>& op, std::vector<Tensor> tensors) {
    std::lock_guard<std::mutex> l(mu_);
    if (comms_.empty() || op->query()) return;  // done (or shutting down): release now
    op->keep = std::move(tensors);
  }

 private:
  void start() {
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    if (!reaper_.joinable()) reaper_ = std::thread([this] { reap(); });
  }
  // Destroys the operations the watchdog retired (cudaEventDestroy, the kept tensors' frees): CUDA
  // calls that can block on the driver's lock, so they run here and not on the watchdog thread.
  void reap() {
    for (;;) {
      std::vector<std::shared_ptr<NcclOp>> release;
      {
        std::unique_lock<std::mutex> l(mu_);
        reap_cv_.wait(l, [this] { return !retired_.empty(); });
        release.swap(retired_);
      }
      release.clear();
    }
  }
  void loop() {
    for (;;) {
      const auto timeout = distributed_timeout();
      std::this_thread::sleep_for(std::chrono::milliseconds(std::clamp<int64_t>(timeout.count() / 20, 20, 1000)));
      std::string fatal;
      {
        std::lock_guard<std::mutex> l(mu_);
        for (ncclComm_t c : comms_) {
          ncclResult_t async_err = ncclSuccess;
          if (ncclCommGetAsyncError(c, &async_err) == ncclSuccess && async_err != ncclSuccess &&
              async_err != ncclInProgress) {
            fatal = std::string("NCCL asynchronous error: ") + ncclGetErrorString(async_err) +
                    " (a peer rank has likely died). Ending the job.";
            break;
          }
        }
        auto now = std::chrono::steady_clock::now();
        // The watchdog thread makes no CUDA call that can block (only cudaEventQuery): a completed
        // operation is moved to retired_ and destroyed by reap() on its own thread.
        // Destroying it here (cudaEventDestroy) took the driver's lock, which a caller blocked in a
        // synchronous copy behind a hung collective holds: the watchdog then hung too and never
        // ended the job (seen on two H200 with cuda-gdb, 2026-11-30).
        if (comms_.empty()) {
          for (auto& op : ops_) retired_.push_back(std::move(op));
          ops_.clear();
          reap_cv_.notify_one();
        }
        for (auto it = ops_.begin(); fatal.empty() && it != ops_.end();) {
          auto& op = *it;
          cudaSetDevice(op->device);
          if (op->query()) {
            retired_.push_back(std::move(op));  // destroyed (event, kept tensors) by reap()
            it = ops_.erase(it);
            reap_cv_.notify_one();
            continue;
          }
          if (now - op->start > timeout)
            fatal = "watchdog: " + op->desc + " did not complete within " + std::to_string(timeout.count() / 1000.0) +
                    " s (--distributed-timeout-minutes); a peer rank has likely died, hung or skipped this "
                    "collective. Ending the job.";
          ++it;
        }
      }
      // Ends the job at once: the message first, then exit. No ncclCommAbort: it woke this rank's
      // stuck collective, so the caller ran on with a result that never arrived before the exit
      // (seen on two H200), and it can itself block on the driver. The driver tears down the
      // kernels of an exiting process; the peers' NCCL sees the connections close.
      if (!fatal.empty()) abort_job(fatal, 1);
    }
  }
  std::mutex mu_;
  std::vector<ncclComm_t> comms_;
  std::list<std::shared_ptr<NcclOp>> ops_;
  std::vector<std::shared_ptr<NcclOp>> retired_;  // completed; destroyed by reap() / remove_comm
  std::condition_variable reap_cv_;
  std::thread thread_, reaper_;
};

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclOp> op, std::vector<Tensor> keep) : op_(std::move(op)), keep_(std::move(keep)) {}
  /// Never waited for: the watchdog keeps the tensors until the operation completed.
  ~NcclWork() override {
    if (!keep_.empty()) NcclWatchdog::get().keep_until_done(op_, std::move(keep_));
  }
  /// Makes the caller's current stream wait for the operation (host does not block); from then
  /// on frees on that stream are ordered after the operation, so the references are dropped.
  void wait() override {
    CUDA_CHECK(cudaStreamWaitEvent(megatron::cuda::current_stream(), op_->done, 0));
    keep_.clear();
  }
  bool is_completed() override { return op_->query(); }

 private:
  std::shared_ptr<NcclOp> op_;
  std::vector<Tensor> keep_;
};

// The Work of an operation that already finished on the host (staged CPU tensors).
class DoneWork final : public Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};

class NcclGroup final : public ProcessGroup {
 public:
  NcclGroup(ncclComm_t comm, std::vector<int> ranks, int device) : comm_(comm), ranks_(std::move(ranks)), device_(device) {
    NCCL_CHECK(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    NCCL_CHECK(ncclCommCount(comm_, &size_), "ncclCommCount");
    MEGATRON_CHECK(static_cast<int>(ranks_.size()) == size_) << ranks_.size() << " vs " << size_;
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    NcclWatchdog::get().add_comm(comm_);
  }
  ~NcclGroup() override {
    cudaStreamSynchronize(stream_);
    NcclWatchdog::get().remove_comm(comm_);
    // ncclCommAbort, not ncclCommDestroy: destroy finalizes collectively and must then run in the
    // same order on every rank, which the order of the last references dropping (data-loader
    // threads, hooks) does not guarantee; a rank then hung at exit on two H200 (2026-11-29). Our
    // operations on this communicator are complete (stream synchronized), so abort only frees.
    ncclCommAbort(comm_);
    cudaEventDestroy(ready_);
    cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<int>& ranks() const override { return ranks_; }
  const char* backend_name() const override { return "nccl"; }

  std::unique_ptr<Work> all_reduce(Tensor& t, ReduceOp op, bool async) override {
    if (on_host(t)) {
      Tensor d = to_device(t);
      all_reduce(d, op, false);
      t.copy_(d);  // synchronizes the current stream, which waited for the reduction
      return std::make_unique<DoneWork>();
    }
    check(t, "all_reduce");
    return launch(describe("all_reduce", t, ranks_, reduce_op_name(op)), {t}, async, [&] {
      NCCL_CHECK(ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t.dtype(), true), nccl_op(op), comm_, stream_),
                 "all_reduce");
    });
  }
  std::unique_ptr<Work> all_gather(const Tensor& in, Tensor& out, bool async) override {
    if (on_host(in) && on_host(out)) {
      Tensor din = to_device(in), dout = to_device(out);
      all_gather(din, dout, false);
      out.copy_(dout);
      return std::make_unique<DoneWork>();
    }
    check(in, "all_gather");
    check(out, "all_gather");
    if (out.numel() != in.numel() * size_ || out.dtype() != in.dtype())
      user_error("all_gather: output ", out.str(), " must hold ", size_, " x input ", in.str());
    return launch(describe("all_gather", in, ranks_), {in, out}, async, [&] {
      NCCL_CHECK(ncclAllGather(in.data_ptr(), out.data_ptr(), in.nbytes(), ncclUint8, comm_, stream_), "all_gather");
    });
  }
  std::unique_ptr<Work> reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, bool async) override {
    if (on_host(in) && on_host(out)) {
      Tensor din = to_device(in), dout = to_device(out);
      reduce_scatter(din, dout, op, false);
      out.copy_(dout);
      return std::make_unique<DoneWork>();
    }
    check(in, "reduce_scatter");
    check(out, "reduce_scatter");
    if (in.numel() != out.numel() * size_ || out.dtype() != in.dtype())
      user_error("reduce_scatter: input ", in.str(), " must hold ", size_, " x output ", out.str());
    return launch(describe("reduce_scatter", in, ranks_, reduce_op_name(op)), {in, out}, async, [&] {
      NCCL_CHECK(ncclReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), nccl_type(in.dtype(), true), nccl_op(op),
                                   comm_, stream_),
                 "reduce_scatter");
    });
  }
  std::unique_ptr<Work> broadcast(Tensor& t, int root, bool async) override {
    if (on_host(t)) {
      Tensor d = to_device(t);
      broadcast(d, root, false);
      t.copy_(d);
      return std::make_unique<DoneWork>();
    }
    check(t, "broadcast");
    if (root < 0 || root >= size_) user_error("broadcast: root ", root, " outside group of ", size_);
    return launch(describe("broadcast", t, ranks_), {t}, async, [&] {
      NCCL_CHECK(ncclBroadcast(t.data_ptr(), t.data_ptr(), t.nbytes(), ncclUint8, root, comm_, stream_), "broadcast");
    });
  }
  std::unique_ptr<Work> send(const Tensor& t, int peer, bool async) override {
    if (on_host(t)) {
      Tensor d = to_device(t);
      send(d, peer, false);
      CUDA_CHECK(cudaStreamSynchronize(megatron::cuda::current_stream()));
      return std::make_unique<DoneWork>();
    }
    check(t, "send");
    check_peer(peer);
    return launch(describe("send", t, ranks_) + " to group rank " + std::to_string(peer), {t}, async, [&] {
      NCCL_CHECK(ncclSend(t.data_ptr(), t.nbytes(), ncclUint8, peer, comm_, stream_), "send");
    });
  }
  std::unique_ptr<Work> recv(Tensor& t, int peer, bool async) override {
    if (on_host(t)) {
      Tensor d = to_device(t);
      recv(d, peer, false);
      t.copy_(d);
      return std::make_unique<DoneWork>();
    }
    check(t, "recv");
    check_peer(peer);
    return launch(describe("recv", t, ranks_) + " from group rank " + std::to_string(peer), {t}, async, [&] {
      NCCL_CHECK(ncclRecv(t.data_ptr(), t.nbytes(), ncclUint8, peer, comm_, stream_), "recv");
    });
  }
  std::unique_ptr<Work> batch_isend_irecv(const std::vector<P2POp>& ops) override {
    std::vector<Tensor> keep;
    for (const auto& op : ops) {
      MEGATRON_CHECK(op.tensor) << "null tensor";
      check(*op.tensor, "batch_isend_irecv");
      check_peer(op.peer);
      keep.push_back(*op.tensor);
    }
    return launch("batch_isend_irecv(" + std::to_string(ops.size()) + " ops) on group " + ranks_str(ranks_), keep, true,
                  [&] {
                    NCCL_CHECK(ncclGroupStart(), "batch_isend_irecv");
                    for (const auto& op : ops) {
                      if (op.kind == P2POp::kSend)
                        NCCL_CHECK(ncclSend(op.tensor->data_ptr(), op.tensor->nbytes(), ncclUint8, op.peer, comm_, stream_),
                                   "batch send");
                      else
                        NCCL_CHECK(ncclRecv(op.tensor->data_ptr(), op.tensor->nbytes(), ncclUint8, op.peer, comm_, stream_),
                                   "batch recv");
                    }
                    NCCL_CHECK(ncclGroupEnd(), "batch_isend_irecv");
                  });
  }
  void barrier() override {
    Tensor t = Tensor::zeros({1}, DType::kFloat32, Device::cuda(device_));
    all_reduce(t, ReduceOp::kSum, false);
    CUDA_CHECK(cudaStreamSynchronize(megatron::cuda::current_stream()));
  }
  std::shared_ptr<ProcessGroup> split(const std::vector<std::vector<int>>& groups) override {
    const int me = ranks_[rank_];
    // Every member passes the same list, so every rank takes this branch or none does.
    if (std::all_of(groups.begin(), groups.end(), [](const std::vector<int>& g) { return g.size() == 1; })) {
      for (const auto& g : groups)
        if (g[0] == me) return make_single_rank_group(me);
      return nullptr;
    }
    int color = NCCL_SPLIT_NOCOLOR, key = 0;
    std::vector<int> mine;
    for (size_t g = 0; g < groups.size(); ++g) {
      auto it = std::find(groups[g].begin(), groups[g].end(), me);
      if (it == groups[g].end()) continue;
      color = static_cast<int>(g);
      key = static_cast<int>(it - groups[g].begin());
      mine = groups[g];
    }
    ncclComm_t nc = nullptr;
    CUDA_CHECK(cudaSetDevice(device_));
    NCCL_CHECK(ncclCommSplit(comm_, color, key, &nc, nullptr), "split of group " + ranks_str(ranks_));
    if (color == NCCL_SPLIT_NOCOLOR || nc == nullptr) return nullptr;
    return std::make_shared<NcclGroup>(nc, mine, device_);
  }

 private:
  static bool on_host(const Tensor& t) { return t.defined() && t.is_cpu(); }
  Tensor to_device(const Tensor& t) const { return t.to(Device::cuda(device_)); }
  void check(const Tensor& t, const char* op) const {
    if (!t.defined()) user_error("nccl ", op, ": undefined tensor");
    if (!t.is_cuda() || t.device().index != device_)
      user_error("nccl ", op, ": tensor on ", t.device().str(), "; this rank's NCCL communicator uses cuda:", device_,
                 " (use the mpi/tcp backend for CPU tensors)");
  }
  void check_peer(int peer) const {
    if (peer < 0 || peer >= size_ || peer == rank_) user_error("nccl p2p: bad peer ", peer, " in group of ", size_);
  }
  template <class F>
  std::unique_ptr<Work> launch(std::string desc, std::vector<Tensor> keep, bool async, F&& enqueue) {
    std::lock_guard<std::mutex> l(mu_);
    CUDA_CHECK(cudaSetDevice(device_));
    cudaStream_t compute = megatron::cuda::current_stream();
    CUDA_CHECK(cudaEventRecord(ready_, compute));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
    enqueue();
    auto op = std::make_shared<NcclOp>();
    CUDA_CHECK(cudaEventCreateWithFlags(&op->done, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(op->done, stream_));
    op->desc = std::move(desc);
    op->start = std::chrono::steady_clock::now();
    op->device = device_;
    NcclWatchdog::get().add_op(op);
    auto w = std::make_unique<NcclWork>(op, std::move(keep));
    if (!async) w->wait();  // also drops the references: later frees are stream-ordered after it
    return w;
  }

  ncclComm_t comm_;
  std::vector<int> ranks_;
  int device_;
  int rank_ = 0, size_ = 1;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  std::mutex mu_;
};

std::shared_ptr<ProcessGroup> make_nccl_world(const LaunchEnv& e, const InitOptions&) {
  int count = 0;
  CUDA_CHECK(cudaGetDeviceCount(&count));
  if (count == 0) user_error("--distributed-backend nccl: no CUDA device visible");
  const int device = e.local_rank % count;
  CUDA_CHECK(cudaSetDevice(device));
  auto store = get_store();
  ncclUniqueId id;
  if (e.rank == 0) {
    NCCL_CHECK(ncclGetUniqueId(&id), "ncclGetUniqueId");
    store->set("nccl/world/unique_id", std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
  } else {
    std::string v = store->get("nccl/world/unique_id");
    MEGATRON_CHECK(v.size() == sizeof(id)) << "bad ncclUniqueId size " << v.size();
    std::memcpy(&id, v.data(), sizeof(id));
  }
  ncclComm_t comm;
  NCCL_CHECK(ncclCommInitRank(&comm, e.world_size, id, e.rank), "ncclCommInitRank (world)");
  std::vector<int> ranks(e.world_size);
  for (int i = 0; i < e.world_size; ++i) ranks[i] = i;
  return std::make_shared<NcclGroup>(comm, ranks, device);
}

[[maybe_unused]] const bool registered = [] {
  register_process_group_backend("nccl", make_nccl_world);
  return true;
}();

}  // namespace
}  // namespace megatron::comm

#endif  // MEGATRON_WITH_NCCL
