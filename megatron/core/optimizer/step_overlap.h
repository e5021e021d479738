// The optimizer step overlapped with the next forward (issue 21; docs/architecture.md
// "Optimizer step overlap"): the update runs on a side stream in chunks, one per forward module
// in the order the next forward needs them (embedding, decoder layer 0, 1, ..., final norm,
// output layer), with one event per chunk; the forward of each module makes the compute stream
// wait on its chunk's event before it reads its parameters. This is the ordering Megatron-LM's
// DistributedDataParallel gives its parameter all-gather with --overlap-param-gather
// (megatron/core/distributed/distributed_data_parallel.py, _make_forward_pre_hook: the forward
// pre-hook of a module waits for the all-gather of its bucket), applied to the optimizer step.
//
// The stream and event operations go through a backend (StepStreamBackend): CUDA streams/events
// in training (cuda_step_stream_backend), a recording fake in the CPU tests of the contract.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace megatron::optimizer {

/// The stream/event operations OptimizerStepOverlap needs. Handles are opaque.
class StepStreamBackend {
 public:
  virtual ~StepStreamBackend() = default;
  /// The side stream the step's work is enqueued on (created once by the backend).
  virtual void* side_stream() = 0;
  /// The calling thread's compute stream.
  virtual void* compute_stream() = 0;
  /// Queues the work of `fn` on the side stream: CUDA calls it at once with the side stream as
  /// the calling thread's compute stream (restoring the previous one, also on an exception), so
  /// the ops it calls are queued there. A backend may also defer the call to any time before a
  /// wait on an event recorded after it (the CPU tests run it as late as the waits allow, which
  /// is what a GPU may do), so `fn` must own what it reads (capture by value).
  virtual void run_on_side(const std::function<void()>& fn) = 0;
  /// A new event (owned by the caller: destroy_event).
  virtual void* create_event() = 0;
  virtual void destroy_event(void* event) = 0;
  /// Records `event` behind the work queued on `stream` so far.
  virtual void record(void* event, void* stream) = 0;
  /// Later work on `stream` waits for `event` (no host synchronization).
  virtual void wait(void* stream, void* event) = 0;
};

/// The CUDA backend: a non-blocking side stream of the device's least priority, CUDA events
/// (ops/device.h). InternalError without the CUDA backend.
std::unique_ptr<StepStreamBackend> cuda_step_stream_backend();

/// Schedules one optimizer step in chunks on the backend's side stream and lets the compute
/// stream wait for each chunk where its parameters are needed.
///
/// A step: begin(), then run_chunk(k, ...) for k = 0, 1, ..., num_chunks-1 in order (each once;
/// a chunk without work still records its event), then end(...). The step is then "in flight"
/// until the compute stream has waited for all of it (wait(k) with k >= num_chunks, or
/// finish()). Every wait is queued on the caller's compute stream at the time of the call; the
/// host never blocks. Because the side stream runs its work in order, waiting for chunk k also
/// covers chunks 0..k-1, so each event is waited on at most once and a wait for a chunk at or
/// below one already waited for queues nothing.
class OptimizerStepOverlap {
 public:
  /// `num_chunks` >= 1; `backend` non-null. Events are created here (num_chunks + 2).
  OptimizerStepOverlap(size_t num_chunks, std::unique_ptr<StepStreamBackend> backend);
  ~OptimizerStepOverlap();
  OptimizerStepOverlap(const OptimizerStepOverlap&) = delete;
  OptimizerStepOverlap& operator=(const OptimizerStepOverlap&) = delete;

  size_t num_chunks() const { return events_.size(); }
  /// Starts a step: a step still in flight is finished first (finish()); then the side stream
  /// waits for everything queued on the compute stream so far (the gradients, their norm).
  void begin();
  /// Queues `enqueue` on the side stream (StepStreamBackend::run_on_side: it may run later, so it
  /// must own what it reads), then records chunk k's event. InternalError unless k is the next
  /// chunk of a begun step.
  void run_chunk(size_t k, const std::function<void()>& enqueue);
  /// After the last chunk: queues `enqueue` on the side stream like run_chunk (work no forward
  /// module waits for: zeroing the gradient buffers, freeing the step's temporaries, which must be
  /// freed on the stream that read them) and records the step's final event. InternalError unless
  /// every chunk has run.
  void end(const std::function<void()>& enqueue);
  /// The compute stream waits for chunk k (and so for chunks 0..k); k >= num_chunks(): for the
  /// whole step including end(). Queues nothing when no step is in flight or chunk k was already
  /// waited for. InternalError for a chunk of the step that has not been enqueued yet, or for the
  /// whole step before end().
  void wait(size_t k);
  /// wait(num_chunks()): the safe default before anything else reads or writes what the step
  /// touches (parameters, optimizer state, gradients).
  void finish() { wait(num_chunks()); }
  /// A step has been begun and the compute stream has not yet waited for all of it.
  bool in_flight() const { return in_flight_; }
  /// Number of compute-stream waits queued since construction (each wait() that queued one).
  int64_t waits_queued() const { return waits_; }

 private:
  std::unique_ptr<StepStreamBackend> backend_;
  std::vector<void*> events_;  // one per chunk
  void* start_ = nullptr;      // recorded on the compute stream by begin()
  void* done_ = nullptr;       // recorded on the side stream by end()
  bool in_flight_ = false;
  bool ended_ = false;
  int64_t next_chunk_ = 0;  // chunks 0..next_chunk_-1 of this step are enqueued
  int64_t waited_ = -1;     // chunks 0..waited_ waited for (num_chunks: the whole step)
  int64_t waits_ = 0;
};

}  // namespace megatron::optimizer
