// The pipelined decode loop's device helpers (decode_feed.h): the CPU reference, and the dispatch
// to ops/cuda/decode_feed.cu for CUDA tensors in CUDA builds.
#include "megatron/core/ops/decode_feed.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "megatron/core/utils/errors.h"

#ifdef MEGATRON_WITH_CUDA
namespace megatron::ops::cuda {  // ops/cuda/decode_feed.cu (kept free of cuda_runtime.h here)
void decode_feed(const Tensor& sampled, int64_t max_id, Tensor& ids, Tensor& positions);
void* pinned_alloc(size_t bytes);
void pinned_free(void* p);
void* readback_event_create();
void readback_event_destroy(void* event);
void readback_copy(void* dst, const void* src, size_t bytes, void* event);
void readback_event_wait(void* event);
}  // namespace megatron::ops::cuda
#endif

namespace megatron::ops {

namespace {
[[noreturn, maybe_unused]] void no_cuda(const char* what) {
  user_error(what, ": a CUDA tensor reached a build without the CUDA backend; rebuild with -DMEGATRON_CUDA=ON");
}
}  // namespace

void decode_feed(const Tensor& sampled, int64_t max_id, Tensor& ids, Tensor& positions) {
  MEGATRON_CHECK(sampled.dtype() == DType::kInt64 && ids.dtype() == DType::kInt64 &&
                 positions.dtype() == DType::kInt64 && sampled.dim() == 1 && ids.dim() == 1 &&
                 positions.dim() == 1 && sampled.numel() == ids.numel() && sampled.device() == ids.device() &&
                 positions.device() == ids.device() && max_id >= 0)
      << "decode_feed: sampled " << sampled.str() << " ids " << ids.str() << " positions " << positions.str()
      << " max_id " << max_id;
  if (ids.is_cuda()) {
#ifdef MEGATRON_WITH_CUDA
    cuda::decode_feed(sampled, max_id, ids, positions);
    return;
#else
    no_cuda("ops::decode_feed");
#endif
  }
  const int64_t* s = sampled.data<int64_t>();
  int64_t* d = ids.data<int64_t>();
  for (int64_t i = 0; i < ids.numel(); ++i) d[i] = std::clamp<int64_t>(s[i], 0, max_id);
  int64_t* p = positions.data<int64_t>();
  for (int64_t j = 0; j < positions.numel(); ++j) ++p[j];
}

HostReadback::~HostReadback() {
#ifdef MEGATRON_WITH_CUDA
  if (pending_ && on_device_) cuda::readback_event_wait(event_);  // the DMA must not outlive the buffer
  if (event_) cuda::readback_event_destroy(event_);
  if (pinned_) cuda::pinned_free(host_);
#endif
  if (!pinned_) std::free(host_);
}

void HostReadback::start(const Tensor& src) {
  if (pending_) (void)wait();
  const size_t bytes = src.nbytes();
  const bool dev = src.is_cuda();
#ifndef MEGATRON_WITH_CUDA
  if (dev) no_cuda("ops::HostReadback");
#endif
  if (capacity_ < bytes || (dev && !pinned_)) {
#ifdef MEGATRON_WITH_CUDA
    if (pinned_) cuda::pinned_free(host_);
#endif
    if (!pinned_) std::free(host_);
    host_ = nullptr;
    capacity_ = std::max<size_t>(bytes, 64);
    pinned_ = dev;
#ifdef MEGATRON_WITH_CUDA
    if (dev) host_ = cuda::pinned_alloc(capacity_);
#endif
    if (!dev) host_ = std::malloc(capacity_);
    MEGATRON_CHECK(host_) << "HostReadback: no host buffer of " << capacity_ << " bytes";
  }
  on_device_ = dev;
  pending_ = true;
  if (!dev) {
    if (bytes) std::memcpy(host_, src.data_ptr(), bytes);
    return;
  }
#ifdef MEGATRON_WITH_CUDA
  if (!event_) event_ = cuda::readback_event_create();
  cuda::readback_copy(host_, src.data_ptr(), bytes, event_);
#endif
}

const void* HostReadback::wait() {
  MEGATRON_CHECK(pending_) << "HostReadback::wait: no copy started";
  pending_ = false;
#ifdef MEGATRON_WITH_CUDA
  if (on_device_) cuda::readback_event_wait(event_);
#endif
  return host_;
}

}  // namespace megatron::ops
