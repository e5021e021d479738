// CUDA graphs of a step (ops/device.h; the CPU build's stubs are in ops/device.cpp): the compute
// stream to capture on, stream capture, launch; and the streams and events of the overlapped
// optimizer step (optimizer/step_overlap.h).
// Used by text generation's decode step (megatron/core/inference/text_generation.cpp,
// docs/inference.md "CUDA graph of the decode step").
#include <cuda_runtime.h>

#include <exception>
#include <functional>
#include <string>

#include "megatron/core/ops/cuda/cuda_utils.h"
#include "megatron/core/ops/device.h"

namespace megatron::ops {

void* compute_stream_create() {
  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaStreamCreate(&s));  // blocking: ordered with the legacy default stream
  return s;
}

void compute_stream_destroy(void* stream) {
  if (stream) cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

void* compute_stream_exchange(void* stream) {
  cudaStream_t prev = megatron::cuda::current_stream();
  megatron::cuda::set_current_stream(static_cast<cudaStream_t>(stream));
  return prev;
}

void* stream_create(bool blocking, bool high_priority) {
  int least = 0, greatest = 0;  // numerically: least >= greatest (lower = higher priority)
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaStreamCreateWithPriority(&s, blocking ? cudaStreamDefault : cudaStreamNonBlocking,
                                          high_priority ? greatest : least));
  return s;
}

void* compute_stream() { return megatron::cuda::current_stream(); }

void* event_create() {
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void event_destroy(void* event) {
  if (event) cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

void event_record(void* event, void* stream) {
  CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)));
}

void stream_wait_event(void* stream, void* event) {
  CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0));
}

void* graph_capture(const std::function<void()>& fn, std::string* error) {
  auto fail = [&](const std::string& why) -> void* {
    cudaGetLastError();  // clear what the failed capture left behind
    if (error) *error = why;
    return nullptr;
  };
  cudaStream_t st = megatron::cuda::current_stream();
  if (st == nullptr || st == cudaStreamLegacy) return fail("the compute stream is the legacy default stream");
  cudaGetLastError();
  cudaError_t e = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) return fail(std::string("cudaStreamBeginCapture: ") + cudaGetErrorString(e));
  std::string fn_error;
  try {
    fn();
  } catch (const std::exception& ex) {
    fn_error = ex.what();
  } catch (...) {
    fn_error = "unknown exception";
  }
  cudaGraph_t graph = nullptr;
  e = cudaStreamEndCapture(st, &graph);
  if (!fn_error.empty() || e != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    const std::string why = !fn_error.empty() ? "the captured step threw: " + fn_error
                                              : std::string("cudaStreamEndCapture: ") + cudaGetErrorString(e);
    return fail(why);
  }
  cudaGraphExec_t exec = nullptr;
  e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (e != cudaSuccess) return fail(std::string("cudaGraphInstantiate: ") + cudaGetErrorString(e));
  e = cudaGraphUpload(exec, st);  // the first launch does not pay the upload
  if (e != cudaSuccess) {
    cudaGraphExecDestroy(exec);
    return fail(std::string("cudaGraphUpload: ") + cudaGetErrorString(e));
  }
  return exec;
}

void graph_launch(void* graph) {
  MEGATRON_CHECK(graph) << "graph_launch: no graph";
  CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), megatron::cuda::current_stream()));
}

void graph_destroy(void* graph) {
  if (graph) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph));
}

}  // namespace megatron::ops
