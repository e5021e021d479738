// Execution machinery shared by the CPU backends (MPI, TCP): a per-group worker thread that runs
// collectives in submission order (so async collectives overlap the caller's compute), the Work
// handle, and the process-wide watchdog that ends the job when a collective outlasts
// --distributed-timeout-minutes (torch's NCCL watchdog / TORCH_NCCL_ASYNC_ERROR_HANDLING).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "megatron/core/comm/process_group.h"

namespace megatron::comm {

/// Collective timeout (default 10 minutes = Megatron's --distributed-timeout-minutes default).
/// Applies to every collective started afterwards and to store/connection bootstrap waits.
void set_distributed_timeout(std::chrono::milliseconds timeout);
std::chrono::milliseconds distributed_timeout();

/// The global rank used to prefix fatal messages ("[rank 3] ...").
void set_global_rank_for_messages(int rank);
int global_rank_for_messages();

/// Registers how to end the whole job (MPI registers MPI_Abort). Default: std::_Exit(code).
void set_job_abort_hook(std::function<void(int code)> hook);
/// Prints "[rank R] <message>" to stderr and ends the whole job with exit code `code`. Never returns.
[[noreturn]] void abort_job(const std::string& message, int code = 1);

/// Runs the job-abort hook, if a backend installed one (the MPI backend: MPI_Abort of every rank
/// when the world has more than one), and returns if there is none. For an error that reached
/// main() on some ranks only: without it those ranks would wait in MPI_Finalize for peers that
/// wait in a collective for them, until --distributed-timeout-minutes (seen under mpirun).
void run_job_abort_hook(int code);

/// Shared state of one submitted operation.
struct WorkState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  std::string description;  // "all_reduce(sum, 1024 x float32) on group [0, 1]"
  std::chrono::steady_clock::time_point start;
  bool started = false;
};

/// Work handle over a WorkState; wait() rethrows the operation's exception.
class QueuedWork final : public Work {
 public:
  explicit QueuedWork(std::shared_ptr<WorkState> s) : s_(std::move(s)) {}
  void wait() override;
  bool is_completed() override;

 private:
  std::shared_ptr<WorkState> s_;
};

/// One thread executing submitted functions in FIFO order. Thread-safe submit().
class CommWorker {
 public:
  CommWorker();
  ~CommWorker();
  CommWorker(const CommWorker&) = delete;
  CommWorker& operator=(const CommWorker&) = delete;
  /// Queues fn; the returned state completes when fn returns (or throws).
  std::shared_ptr<WorkState> submit(std::string description, std::function<void()> fn);
  /// Runs fn on the worker and waits for it (rethrowing); what synchronous collectives use.
  void run_sync(std::string description, std::function<void()> fn);
  /// Stops the thread after the queue drains (idempotent).
  void shutdown();

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::shared_ptr<WorkState>, std::function<void()>>> q_;
  bool stop_ = false;
  std::thread thread_;
};

/// Returns a Work for `st`, waiting first when !async.
std::unique_ptr<Work> finish(std::shared_ptr<WorkState> st, bool async);

}  // namespace megatron::comm
