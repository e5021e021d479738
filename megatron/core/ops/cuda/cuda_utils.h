// Error checking and stream helpers for the CUDA backend.
#pragma once

#include <cuda_runtime.h>

#include "megatron/core/utils/errors.h"

#define CUDA_CHECK(expr)                                                                     \
  do {                                                                                       \
    cudaError_t _e = (expr);                                                                 \
    MEGATRON_CHECK(_e == cudaSuccess) << #expr << ": " << cudaGetErrorString(_e);            \
  } while (0)

/// Checks the last kernel launch.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

namespace megatron::cuda {
/// The compute stream of the calling thread (default: the legacy stream 0).
cudaStream_t current_stream();
void set_current_stream(cudaStream_t s);
/// cudaStreamSynchronize(s), counted in host_sync_count(): every place where the CUDA backend
/// makes the host wait for the GPU (device-to-host copies, host-returning reductions).
void sync_stream(cudaStream_t s);
/// Number of sync_stream calls in this process so far (MEGATRON_LOG_HOST_SYNCS=1 makes the
/// training log print it per iteration).
unsigned long long host_sync_count();
}  // namespace megatron::cuda
