#pragma once
// Device capabilities that are not ops: the one place besides the op table (op_table.h) where
// code above ops/ learns about the accelerator, so no file outside megatron/core/ops/ needs
// `#ifdef MEGATRON_WITH_CUDA`. Every function is callable in every build; without the CUDA
// backend each answers "no device" (documented per function).

#include <cstdint>

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

}  // namespace megatron::ops
