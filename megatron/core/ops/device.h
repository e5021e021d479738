#pragma once
// Device capabilities that are not ops: the one place besides the op table (op_table.h) where
// code above ops/ learns about the accelerator, so no file outside megatron/core/ops/ needs
// `#ifdef MEGATRON_WITH_CUDA`. Every function is callable in every build; without the CUDA
// backend each answers "no device" (documented per function).

#include <cstdint>
#include <functional>
#include <string>

namespace megatron::ops {

/// True when this build has the CUDA backend (MEGATRON_WITH_CUDA); says nothing about whether a
/// GPU is present.
bool cuda_available();

/// Number of times the CUDA backend has made the host wait for the GPU in this process
/// (stream synchronizations of device-to-host copies and host-returning reductions; the
/// MEGATRON_LOG_HOST_SYNCS diagnostics line). 0 without the CUDA backend.
unsigned long long host_sync_count();

/// Free memory of the current CUDA device in bytes (cudaMemGetInfo): what new allocations can
/// still get beyond the memory pool's reservation (the FP8 weight cache's budget, fp8_state.h).
/// Throws InternalError without the CUDA backend (callers ask only for device tensors).
int64_t device_free_bytes();

/// Opens a named range for a GPU profiler (an NVTX start/end range; Nsight Systems shows it on
/// the timeline) and returns its handle; 0 without the CUDA backend. Ranges need not nest.
uint64_t profiler_range_start(const char* name);
/// Closes a range opened by profiler_range_start (0 is ignored).
void profiler_range_end(uint64_t handle);

// ---- CUDA graphs of a step (text generation's decode step, docs/inference.md "CUDA graph of
// the decode step"). Handles are opaque (cudaStream_t / cudaGraphExec_t in CUDA builds).

/// A new CUDA stream that synchronizes with the legacy default stream (cudaStreamCreate), to be
/// the compute stream of a captured step (the legacy stream cannot be captured). nullptr without
/// the CUDA backend.
void* compute_stream_create();
/// Destroys a stream of compute_stream_create (its queued work still completes); nullptr ignored.
void compute_stream_destroy(void* stream);
/// Makes `stream` (nullptr: the legacy default stream) the calling thread's compute stream and
/// returns the previous one. No-op returning nullptr without the CUDA backend.
void* compute_stream_exchange(void* stream);

// ---- Streams and events of the overlapped optimizer step (optimizer/step_overlap.h). Handles
// are opaque (cudaStream_t / cudaEvent_t in CUDA builds); a nullptr stream is the legacy default
// stream.

/// A new CUDA stream with the device's greatest priority (`high_priority`: its pending blocks are
/// scheduled before those of lower-priority streams) or its least; `blocking` = ordered with the
/// legacy default stream (cudaStreamDefault), else cudaStreamNonBlocking. Destroy it with
/// compute_stream_destroy. nullptr without the CUDA backend.
void* stream_create(bool blocking, bool high_priority);
/// The calling thread's compute stream (nullptr: the legacy default stream; always nullptr
/// without the CUDA backend).
void* compute_stream();
/// A new event without timing (cudaEventDisableTiming); nullptr without the CUDA backend.
void* event_create();
/// Destroys an event of event_create (nullptr ignored; pending work still completes).
void event_destroy(void* event);
/// Records `event` at the current end of `stream` (cudaEventRecord). InternalError on a CUDA
/// error or without the CUDA backend.
void event_record(void* event, void* stream);
/// Makes later work on `stream` wait until `event` has completed (cudaStreamWaitEvent; no host
/// synchronization). InternalError on a CUDA error or without the CUDA backend.
void stream_wait_event(void* stream, void* event);

/// Leaves `sms` streaming multiprocessors to concurrent work on other streams in the GEMMs
/// issued after the call (all dtypes of ops/cuda/gemm.cu): cuBLASLt plans them for the device's
/// SM count minus `sms` (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, what Transformer Engine's
/// `sm_margin` sets for its communication overlap), so a persistent GEMM kernel launches that
/// many fewer CTAs and the overlapped optimizer step's Adam blocks find SMs beside it (issue 21,
/// docs/performance.md "Session 13: GEMM SM margin"). 0 (the default) = every SM. Process-wide,
/// not per stream: the plan cache keys on it, so each margin in use costs one plan per shape.
/// `sms` outside 0..(SM count - 1) throws InternalError on the first GEMM. No-op without the
/// CUDA backend.
void set_gemm_sm_margin(int sms);
/// The margin set by set_gemm_sm_margin (0 without the CUDA backend).
int gemm_sm_margin();
/// MEGATRON_GEMM_AUTOTUNE=0|1 (read once, default 0; any other value throws UserError naming it):
/// whether ops/cuda/gemm.cu times cuBLASLt's candidates at each plan's first call (docs/environment.md).
/// Read in every build, so a CPU run refuses a bad value too; only CUDA GEMMs act on it.
bool gemm_autotune_switch();

/// Captures the work `fn` issues on the calling thread's compute stream (which must not be the
/// legacy stream) into a CUDA graph (cudaStreamCaptureModeThreadLocal: this thread's unsafe calls,
/// e.g. a synchronization, fail the capture) and instantiates it. Nothing runs during the
/// capture. Returns the executable graph, or nullptr with `error` set to one line (fn's
/// exception, cudaStreamEndCapture's or cudaGraphInstantiate's error, or "no CUDA backend"):
/// then nothing is kept and the stream is usable again. fn must free inside the capture what
/// it allocates inside it (stream-ordered allocations become graph memory nodes).
void* graph_capture(const std::function<void()>& fn, std::string* error);
/// Launches a graph of graph_capture on the calling thread's compute stream (InternalError on a
/// CUDA error or without the CUDA backend).
void graph_launch(void* graph);
/// Frees a graph of graph_capture (nullptr ignored).
void graph_destroy(void* graph);

}  // namespace megatron::ops
