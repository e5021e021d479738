// Device capabilities (device.h): the CUDA backend's answers in CUDA builds, "no device" otherwise.
#include "megatron/core/ops/device.h"

#include "megatron/core/utils/env.h"
#include "megatron/core/utils/errors.h"

#ifdef MEGATRON_WITH_CUDA
#include <nvtx3/nvToolsExt.h>  // header-only NVTX v3 (CUDA toolkit); a no-op without a profiler

namespace megatron::cuda {
unsigned long long host_sync_count();  // ops/cuda/cuda_utils.h (kept free of cuda_runtime.h here)
}  // namespace megatron::cuda
namespace megatron::ops::cuda {
int64_t device_free_bytes();  // ops/cuda/cuda_ops.h
}  // namespace megatron::ops::cuda
#endif

namespace megatron::ops {

bool gemm_autotune_switch() {
  static const bool on = env_switch("MEGATRON_GEMM_AUTOTUNE", false);
  return on;
}

#ifdef MEGATRON_WITH_CUDA
bool cuda_available() { return true; }
unsigned long long host_sync_count() { return megatron::cuda::host_sync_count(); }
int64_t device_free_bytes() { return cuda::device_free_bytes(); }
uint64_t profiler_range_start(const char* name) { return nvtxRangeStartA(name); }
void profiler_range_end(uint64_t handle) {
  if (handle) nvtxRangeEnd(handle);
}
// compute_stream_*, stream_create, event_* and graph_*: defined in ops/cuda/step_graph.cpp;
// set_gemm_sm_margin / gemm_sm_margin in ops/cuda/gemm.cu.
#else
bool cuda_available() { return false; }
unsigned long long host_sync_count() { return 0; }
int64_t device_free_bytes() {
  MEGATRON_CHECK(false) << "ops::device_free_bytes: this build has no CUDA backend";
  return 0;
}
uint64_t profiler_range_start(const char*) { return 0; }
void profiler_range_end(uint64_t) {}
void* compute_stream_create() { return nullptr; }
void compute_stream_destroy(void*) {}
void* compute_stream_exchange(void*) { return nullptr; }
void* stream_create(bool, bool) { return nullptr; }
void* compute_stream() { return nullptr; }
void* event_create() { return nullptr; }
void event_destroy(void*) {}
void event_record(void*, void*) { MEGATRON_CHECK(false) << "ops::event_record: this build has no CUDA backend"; }
void stream_wait_event(void*, void*) {
  MEGATRON_CHECK(false) << "ops::stream_wait_event: this build has no CUDA backend";
}
void* graph_capture(const std::function<void()>&, std::string* error) {
  if (error) *error = "this build has no CUDA backend";
  return nullptr;
}
void graph_launch(void*) { MEGATRON_CHECK(false) << "ops::graph_launch: this build has no CUDA backend"; }
void graph_destroy(void*) {}
void set_gemm_sm_margin(int) {}
int gemm_sm_margin() { return 0; }
#endif

}  // namespace megatron::ops
