// Small CUDA ops of ops.h: transpose01 (dims 0 and 1 swapped, any dtype), bias_add_, and the
// vocab-parallel cross-entropy combine steps (cross_entropy_rescale_, cross_entropy_loss).
#include "megatron/core/ops/cuda/cuda_common.cuh"
#include "megatron/core/ops/cuda/cuda_ops.h"

namespace megatron::ops::cuda {
using namespace detail;

namespace {
constexpr int kThreads = 256;

// y[a, b, :] = x[b, a, :] with rows of `units` elements of type U (x is [d0, d1, row]).
template <class U>
__global__ void transpose01_kernel(const U* __restrict__ x, U* __restrict__ y, int64_t d0, int64_t d1, int64_t units) {
  const int64_t total = d0 * d1 * units;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t u = i % units, yr = i / units, a = yr / d0, b = yr % d0;
    y[i] = x[(b * d1 + a) * units + u];
  }
}

template <class Y, class B>
__global__ void bias_add_kernel(Y* __restrict__ y, const B* __restrict__ bias, int64_t rows, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * n; i += (int64_t)gridDim.x * blockDim.x)
    y[i] = from_f<Y>(to_f(y[i]) + to_f(bias[i % n]));
}

__global__ void ce_rescale_kernel(float* __restrict__ s, const float* __restrict__ m, const float* __restrict__ M,
                                  int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    s[i] = m[i] == -INFINITY ? 0.0f : s[i] * expf(m[i] - M[i]);
}

__global__ void ce_loss_kernel(const float* __restrict__ M, const float* __restrict__ S, const float* __restrict__ P,
                               float* __restrict__ loss, float* __restrict__ lse, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const float l = logf(S[i]) + M[i];
    lse[i] = l;
    loss[i] = l - P[i];
  }
}
}  // namespace

void transpose01(const Tensor& x, Tensor& y) {
  check_cuda(x, "transpose01");
  MEGATRON_CHECK(x.dim() >= 2 && y.dim() == x.dim() && y.size(0) == x.size(1) && y.size(1) == x.size(0) &&
                 y.numel() == x.numel() && y.dtype() == x.dtype())
      << "transpose01: x " << x.str() << " y " << y.str();
  const int64_t d0 = x.size(0), d1 = x.size(1);
  if (x.numel() == 0) return;
  const int64_t row_bytes = static_cast<int64_t>(x.nbytes()) / (d0 * d1);
  cudaStream_t st = megatron::cuda::current_stream();
  const uintptr_t al = reinterpret_cast<uintptr_t>(x.data_ptr()) | reinterpret_cast<uintptr_t>(y.data_ptr());
  auto launch = [&](auto unit) {
    using U = decltype(unit);
    const int64_t units = row_bytes / (int64_t)sizeof(U);
    transpose01_kernel<U><<<grid_for(d0 * d1 * units, kThreads), kThreads, 0, st>>>(
        static_cast<const U*>(x.data_ptr()), static_cast<U*>(y.data_ptr()), d0, d1, units);
  };
  if (row_bytes % 16 == 0 && al % 16 == 0) launch(uint4{});
  else if (row_bytes % 4 == 0 && al % 4 == 0) launch(uint32_t{});
  else if (row_bytes % 2 == 0 && al % 2 == 0) launch(uint16_t{});
  else launch(uint8_t{});
  CUDA_CHECK_LAUNCH();
}

void bias_add_(Tensor& y, const Tensor& bias) {
  check_cuda(y, "bias_add_");
  const int64_t n = bias.numel();
  MEGATRON_CHECK(n > 0 && y.size(-1) == n) << "bias_add_: y " << y.str() << " bias " << bias.str();
  const int64_t rows = y.numel() / n;
  if (rows == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  MCU_FLOAT_SWITCH(y.dtype(), Y,
                   MCU_FLOAT_SWITCH(bias.dtype(), B,
                                       bias_add_kernel<Y, B><<<grid_for(rows * n, kThreads), kThreads, 0, st>>>(
                                           static_cast<Y*>(y.data_ptr()), static_cast<const B*>(bias.data_ptr()),
                                           rows, n)));
  CUDA_CHECK_LAUNCH();
}

void cross_entropy_rescale_(Tensor& row_sumexp, const Tensor& row_max, const Tensor& global_max) {
  check_cuda(row_sumexp, "cross_entropy_rescale_");
  const int64_t n = row_sumexp.numel();
  MEGATRON_CHECK(row_max.numel() == n && global_max.numel() == n && row_sumexp.dtype() == DType::kFloat32 &&
                 row_max.dtype() == DType::kFloat32 && global_max.dtype() == DType::kFloat32)
      << "cross_entropy_rescale_: " << row_sumexp.str() << " " << row_max.str() << " " << global_max.str();
  if (n == 0) return;
  ce_rescale_kernel<<<grid_for(n, kThreads), kThreads, 0, megatron::cuda::current_stream()>>>(
      static_cast<float*>(row_sumexp.data_ptr()), static_cast<const float*>(row_max.data_ptr()),
      static_cast<const float*>(global_max.data_ptr()), n);
  CUDA_CHECK_LAUNCH();
}

void cross_entropy_loss(const Tensor& global_max, const Tensor& global_sumexp, const Tensor& pred, Tensor& loss,
                        Tensor& lse) {
  check_cuda(loss, "cross_entropy_loss");
  const int64_t n = pred.numel();
  for (const Tensor* t : {&global_max, &global_sumexp, &pred, (const Tensor*)&loss, (const Tensor*)&lse})
    MEGATRON_CHECK(t->numel() == n && t->dtype() == DType::kFloat32) << "cross_entropy_loss: " << t->str();
  if (n == 0) return;
  ce_loss_kernel<<<grid_for(n, kThreads), kThreads, 0, megatron::cuda::current_stream()>>>(
      static_cast<const float*>(global_max.data_ptr()), static_cast<const float*>(global_sumexp.data_ptr()),
      static_cast<const float*>(pred.data_ptr()), static_cast<float*>(loss.data_ptr()),
      static_cast<float*>(lse.data_ptr()), n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace megatron::ops::cuda
