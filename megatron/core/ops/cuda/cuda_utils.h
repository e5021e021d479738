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
}  // namespace megatron::cuda
