#include "megatron/core/optimizer/step_overlap.h"

#include "megatron/core/ops/device.h"
#include "megatron/core/utils/errors.h"

namespace megatron::optimizer {

namespace {
// `stream` is the calling thread's compute stream while alive; the previous one is restored when
// the enqueue function returns or throws.
class SideStreamScope {
 public:
  explicit SideStreamScope(void* stream) : prev_(ops::compute_stream_exchange(stream)) {}
  ~SideStreamScope() { ops::compute_stream_exchange(prev_); }
  SideStreamScope(const SideStreamScope&) = delete;
  SideStreamScope& operator=(const SideStreamScope&) = delete;

 private:
  void* prev_;
};

class CudaStepStreamBackend final : public StepStreamBackend {
 public:
  CudaStepStreamBackend() {
    MEGATRON_CHECK(ops::cuda_available()) << "the overlapped optimizer step needs the CUDA backend";
    // Non-blocking: not ordered with the legacy default stream (which is the compute stream when
    // no other is set), so the step really runs beside the forward; least priority, so the
    // forward's pending blocks are scheduled first.
    side_ = ops::stream_create(/*blocking=*/false, /*high_priority=*/false);
  }
  ~CudaStepStreamBackend() override { ops::compute_stream_destroy(side_); }
  void* side_stream() override { return side_; }
  void* compute_stream() override { return ops::compute_stream(); }
  void run_on_side(const std::function<void()>& fn) override {
    SideStreamScope scope(side_);
    if (fn) fn();
  }
  void* create_event() override { return ops::event_create(); }
  void destroy_event(void* event) override { ops::event_destroy(event); }
  void record(void* event, void* stream) override { ops::event_record(event, stream); }
  void wait(void* stream, void* event) override { ops::stream_wait_event(stream, event); }

 private:
  void* side_ = nullptr;
};

}  // namespace

std::unique_ptr<StepStreamBackend> cuda_step_stream_backend() { return std::make_unique<CudaStepStreamBackend>(); }

OptimizerStepOverlap::OptimizerStepOverlap(size_t num_chunks, std::unique_ptr<StepStreamBackend> backend)
    : backend_(std::move(backend)) {
  MEGATRON_CHECK(backend_ && num_chunks >= 1) << "OptimizerStepOverlap: " << num_chunks << " chunks";
  for (size_t k = 0; k < num_chunks; ++k) events_.push_back(backend_->create_event());
  start_ = backend_->create_event();
  done_ = backend_->create_event();
}

OptimizerStepOverlap::~OptimizerStepOverlap() {
  for (void* e : events_) backend_->destroy_event(e);
  backend_->destroy_event(start_);
  backend_->destroy_event(done_);
}

void OptimizerStepOverlap::begin() {
  finish();
  backend_->record(start_, backend_->compute_stream());
  backend_->wait(backend_->side_stream(), start_);
  in_flight_ = true;
  ended_ = false;
  next_chunk_ = 0;
  waited_ = -1;
}

void OptimizerStepOverlap::run_chunk(size_t k, const std::function<void()>& enqueue) {
  MEGATRON_CHECK(in_flight_ && !ended_ && k < events_.size() && static_cast<int64_t>(k) == next_chunk_)
      << "OptimizerStepOverlap::run_chunk(" << k << "): expected chunk " << next_chunk_ << " of a begun step";
  backend_->run_on_side(enqueue);
  backend_->record(events_[k], backend_->side_stream());
  ++next_chunk_;
}

void OptimizerStepOverlap::end(const std::function<void()>& enqueue) {
  MEGATRON_CHECK(in_flight_ && !ended_ && next_chunk_ == static_cast<int64_t>(events_.size()))
      << "OptimizerStepOverlap::end: " << next_chunk_ << " of " << events_.size() << " chunks enqueued";
  backend_->run_on_side(enqueue);
  backend_->record(done_, backend_->side_stream());
  ended_ = true;
}

void OptimizerStepOverlap::wait(size_t k) {
  if (!in_flight_) return;
  const int64_t n = static_cast<int64_t>(events_.size());
  const int64_t target = static_cast<int64_t>(k) >= n ? n : static_cast<int64_t>(k);
  if (target <= waited_) return;
  if (target == n) {
    MEGATRON_CHECK(ended_) << "OptimizerStepOverlap: waiting for the whole step before end()";
  } else {
    MEGATRON_CHECK(target < next_chunk_) << "OptimizerStepOverlap: waiting for chunk " << target
                                         << " before it was enqueued (" << next_chunk_ << " enqueued)";
  }
  backend_->wait(backend_->compute_stream(), target == n ? done_ : events_[static_cast<size_t>(target)]);
  ++waits_;
  waited_ = target;
  if (target == n) in_flight_ = false;
}

}  // namespace megatron::optimizer
