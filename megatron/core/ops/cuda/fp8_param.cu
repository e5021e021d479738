// FP8 parameter helpers (--fp8-param-gather, megatron/core/fp8/fp8_param.h): the byte transpose
// that makes the dgrad layout of a gathered FP8 weight (TE's Float8Tensor._create_transpose).
#include "megatron/core/ops/cuda/cuda_common.cuh"
#include "megatron/core/ops/cuda/cuda_ops.h"

namespace megatron::ops::cuda {
using namespace detail;

namespace {
constexpr int kTile = 32, kRowsPerPass = 8;

// q [rows, cols] bytes -> q_t [cols, rows]; a 32x32 tile through shared memory, 32x8 threads.
__global__ void transpose_bytes_kernel(const uint8_t* __restrict__ q, int64_t rows, int64_t cols,
                                       uint8_t* __restrict__ q_t) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile, r0 = static_cast<int64_t>(blockIdx.y) * kTile;
  for (int k = threadIdx.y; k < kTile; k += kRowsPerPass) {
    const int64_t r = r0 + k, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[k][threadIdx.x] = q[r * cols + c];
  }
  __syncthreads();
  for (int k = threadIdx.y; k < kTile; k += kRowsPerPass) {
    const int64_t c = c0 + k, r = r0 + threadIdx.x;
    if (c < cols && r < rows) q_t[c * rows + r] = tile[threadIdx.x][k];
  }
}
}  // namespace

void fp8_transpose(const Tensor& q, Tensor& q_t) {
  check_cuda(q, "fp8_transpose");
  check_cuda(q_t, "fp8_transpose");
  MEGATRON_CHECK(q.dim() == 2 && q_t.dim() == 2 && q_t.size(0) == q.size(1) && q_t.size(1) == q.size(0) &&
                 dtype_size(q.dtype()) == 1 && q_t.dtype() == q.dtype())
      << "fp8_transpose: q " << q.str() << " q_t " << q_t.str();
  const int64_t rows = q.size(0), cols = q.size(1);
  if (rows == 0 || cols == 0) return;
  dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile), static_cast<unsigned>((rows + kTile - 1) / kTile));
  MEGATRON_CHECK(grid.y < 65536u) << "fp8_transpose: too many rows " << rows;
  transpose_bytes_kernel<<<grid, dim3(kTile, kRowsPerPass), 0, megatron::cuda::current_stream()>>>(
      static_cast<const uint8_t*>(q.data_ptr()), rows, cols, static_cast<uint8_t*>(q_t.data_ptr()));
  CUDA_CHECK_LAUNCH();
}

}  // namespace megatron::ops::cuda
