// ProcessGroup: the one communication interface (docs/architecture.md#communication). Backends: a trivial
// single-rank group (here), MPI for CPU tensors and NCCL for CUDA tensors (comm/mpi,
// comm/nccl). Semantics follow torch.distributed's collectives as Megatron uses them.
#pragma once

#include <memory>
#include <vector>

#include "megatron/core/tensor/tensor.h"

namespace megatron::comm {

enum class ReduceOp { kSum, kMax, kMin, kAvg };

/// Handle of an asynchronous collective. wait() blocks until it completed (and rethrows a
/// failure, e.g. a timeout, as UserError naming the collective).
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool is_completed() = 0;
};

/// One point-to-point operation of batch_isend_irecv (peer is a group rank). The tensor is
/// held by reference: it must stay alive until the returned Work completed.
struct P2POp {
  enum Kind { kSend, kRecv } kind;
  Tensor* tensor;
  int peer;
};

/// A group of ranks. Collectives must be called by every member in the same order.
/// All tensors are contiguous; sizes are in elements.
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  /// This process's rank within the group and the group size.
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Global ranks of the members, in group-rank order.
  virtual const std::vector<int>& ranks() const = 0;

  /// In-place all-reduce of t.
  virtual std::unique_ptr<Work> all_reduce(Tensor& t, ReduceOp op = ReduceOp::kSum, bool async = false) = 0;
  /// out (numel = size()*in.numel()) = concatenation of every rank's `in` in rank order.
  virtual std::unique_ptr<Work> all_gather(const Tensor& in, Tensor& out, bool async = false) = 0;
  /// `in` (numel = size()*out.numel()) is reduced elementwise; rank r receives chunk r in out.
  virtual std::unique_ptr<Work> reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op = ReduceOp::kSum,
                                               bool async = false) = 0;
  /// t is overwritten with root's t (root is a group rank).
  virtual std::unique_ptr<Work> broadcast(Tensor& t, int root, bool async = false) = 0;
  /// Point-to-point (peer is a group rank).
  virtual std::unique_ptr<Work> send(const Tensor& t, int peer, bool async = false) = 0;
  virtual std::unique_ptr<Work> recv(Tensor& t, int peer, bool async = false) = 0;
  virtual void barrier() = 0;

  /// Posts all sends and receives at once (torch.distributed.batch_isend_irecv); the Work
  /// completes when all did. Use this when a rank both sends and receives in one step (pipeline
  /// p2p): NCCL requires such exchanges to be grouped to avoid deadlock. The default posts each
  /// op asynchronously (fine for MPI/TCP whose sends never wait for the matching receive).
  virtual std::unique_ptr<Work> batch_isend_irecv(const std::vector<P2POp>& ops);

  /// Creates subgroups (like MPI_Comm_split / ncclCommSplit / torch new_group). Collective over
  /// this group: every member passes the same list of disjoint groups of *global* ranks; returns
  /// the group containing this process (group ranks in the listed order), or nullptr if this
  /// process is in none of them. The default throws UserError (backend without subgroups).
  virtual std::shared_ptr<ProcessGroup> split(const std::vector<std::vector<int>>& groups);
  /// Short backend name ("single", "mpi", "tcp", "nccl").
  virtual const char* backend_name() const { return "unknown"; }
};

/// The group of one process (every collective is the identity). Used when a parallel
/// dimension has size 1.
std::shared_ptr<ProcessGroup> make_single_rank_group(int global_rank = 0);

}  // namespace megatron::comm
