// GeLU (tanh) backward fused with the bias-gradient column sums (cuda_ops.h gelu_backward_bgrad),
// and the same column-sum pass alone for linear layers' bias gradients (bias_grad_colsum).
//
// Grid (column tiles of 256, row chunks); block 32 x 8 threads: thread (tx, ty) owns the 8
// columns 256·bx + 8·tx .. +8 and the rows ty, ty + 8, ... of its block's row chunk, so its 8
// column sums stay in registers; dy/pre are read and dpre written with 16-byte accesses (a warp
// covers 512 contiguous bytes of a row). Per block the 8 row slices are summed in order into a
// [chunks, f] fp32 partial, then a second kernel sums the chunks in order (deterministic).
#include "megatron/core/ops/cuda/cuda_common.cuh"
#include "megatron/core/ops/cuda/cuda_ops.h"

namespace megatron::ops::cuda {
using namespace detail;

namespace {

// Same formula as elementwise.cu's gelu_grad (tanh branch): d/dx of 0.5 x (1 + tanh(k0 (x + k1 x^3))).
__device__ __forceinline__ float gelu_tanh_grad(float x) {
  const float k0 = 0.7978845608028654f, k1 = 0.044715f;
  const float u = k0 * (x + k1 * x * x * x);
  const float t = tanhf(u);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k0 * (1.0f + 3.0f * k1 * x * x);
}

template <class T>
struct alignas(16) Pack8 {
  T v[8];
};

// kGelu: dpre = dy * gelu'(pre) written and summed; else the column sums of dy alone
// (bias_grad_colsum: pre and dpre unused).
template <class T, bool kGelu>
__global__ void __launch_bounds__(256) gelu_bwd_bgrad_kernel(const T* __restrict__ dy, const T* __restrict__ pre,
                                                             T* __restrict__ dpre, float* __restrict__ part,
                                                             int64_t rows, int64_t f, int64_t chunk) {
  __shared__ float red[8][256 + 8];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = blockIdx.x * 256 + tx * 8;
  const int64_t r0 = blockIdx.y * chunk, r1 = min(rows, r0 + chunk);
  float s[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  if (c < f) {
#pragma unroll 4
    for (int64_t r = r0 + ty; r < r1; r += 8) {
      const Pack8<T> g = *reinterpret_cast<const Pack8<T>*>(dy + r * f + c);
      if constexpr (kGelu) {
        const Pack8<T> x = *reinterpret_cast<const Pack8<T>*>(pre + r * f + c);
        Pack8<T> o;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          o.v[j] = from_f<T>(to_f(g.v[j]) * gelu_tanh_grad(to_f(x.v[j])));
          s[j] += to_f(o.v[j]);  // the bias gradient sums dpre as stored
        }
        *reinterpret_cast<Pack8<T>*>(dpre + r * f + c) = o;
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) s[j] += to_f(g.v[j]);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) red[ty][tx * 8 + j] = s[j];
  __syncthreads();
  const int t = ty * 32 + tx;  // 256 threads, one column each
  const int64_t cc = blockIdx.x * 256 + t;
  if (cc < f) {
    float v = 0.0f;
#pragma unroll
    for (int y = 0; y < 8; ++y) v += red[y][t];
    part[blockIdx.y * f + cc] = v;
  }
}

template <class T, class B>
__global__ void bgrad_final_kernel(const float* __restrict__ part, int chunks, int64_t f, B* __restrict__ out,
                                   bool accumulate, bool round16) {
  __shared__ float red[8][33];
  const int64_t c = blockIdx.x * 32 + threadIdx.x;
  float s = 0.0f;
  if (c < f)
    for (int i = threadIdx.y; i < chunks; i += 8) s += part[(int64_t)i * f + c];
  red[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || c >= f) return;
  float t = 0.0f;
#pragma unroll
  for (int y = 0; y < 8; ++y) t += red[y][threadIdx.x];
  if (round16) t = to_f(from_f<T>(t));  // rounded once to dpre's dtype (the bf16 bias .grad)
  if (accumulate) t += to_f(out[c]);
  out[c] = from_f<B>(t);
}

}  // namespace

namespace {
// Shared launcher: gelu (dpre from dy and pre, bias gradient rounded to dpre's dtype) or the plain
// column sums of dy (fp32, not rounded). Preconditions checked by the callers.
void launch_colsum(bool gelu, const Tensor& dy, const Tensor* pre, Tensor* dpre, Tensor* dbias, bool accumulate) {
  const int64_t f = dy.size(-1), rows = f ? dy.numel() / f : 0;
  if (rows == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  const int64_t tiles = (f + 255) / 256;
  // About 8 blocks of 256 threads per SM in all; each block a contiguous chunk of rows.
  const int64_t want = std::max<int64_t>(1, (int64_t)sm_count() * 8 / tiles);
  const int64_t chunks = std::min<int64_t>(want, (rows + 7) / 8);
  const int64_t chunk = (rows + chunks - 1) / chunks;
  const int64_t nchunks = (rows + chunk - 1) / chunk;
  float* part = nullptr;
  CUDA_CHECK(cudaMallocAsync(&part, sizeof(float) * nchunks * f, st));
  dim3 grid((unsigned)tiles, (unsigned)nchunks), block(32, 8);
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    if (gelu)
      gelu_bwd_bgrad_kernel<T, true><<<grid, block, 0, st>>>(static_cast<const T*>(dy.data_ptr()),
                                                             static_cast<const T*>(pre->data_ptr()),
                                                             static_cast<T*>(dpre->data_ptr()), part, rows, f, chunk);
    else
      gelu_bwd_bgrad_kernel<T, false><<<grid, block, 0, st>>>(static_cast<const T*>(dy.data_ptr()), nullptr, nullptr,
                                                              part, rows, f, chunk);
    CUDA_CHECK_LAUNCH();
    if (!dbias) return;
    dim3 g2((unsigned)((f + 31) / 32));
    if (dbias->dtype() == DType::kFloat32)
      bgrad_final_kernel<T, float><<<g2, dim3(32, 8), 0, st>>>(
          part, (int)nchunks, f, static_cast<float*>(dbias->data_ptr()), accumulate, gelu);
    else
      bgrad_final_kernel<T, T><<<g2, dim3(32, 8), 0, st>>>(part, (int)nchunks, f, static_cast<T*>(dbias->data_ptr()),
                                                           accumulate, gelu);
    CUDA_CHECK_LAUNCH();
  };
  if (dy.dtype() == DType::kBFloat16) launch(bf16_t{});
  else launch(fp16_t{});
  CUDA_CHECK(cudaFreeAsync(part, st));
}
}  // namespace

bool gelu_backward_bgrad(const Tensor& dy, const Tensor& pre, Tensor& dpre, Tensor* dbias, bool accumulate) {
  check_cuda(dy, "gelu_backward_bgrad");
  const int64_t f = pre.dim() ? pre.size(-1) : 0;
  MEGATRON_CHECK(dy.numel() == pre.numel() && dpre.numel() == pre.numel() && (!dbias || dbias->numel() == f))
      << "gelu_backward_bgrad: dy " << dy.str() << " pre " << pre.str() << " dpre " << dpre.str();
  const DType dt = pre.dtype();
  if (!gemm_epilogues_enabled() || (dt != DType::kBFloat16 && dt != DType::kFloat16) || dy.dtype() != dt ||
      dpre.dtype() != dt || f % 8 != 0 ||
      !aligned16(dy.data_ptr()) || !aligned16(pre.data_ptr()) || !aligned16(dpre.data_ptr()) ||
      (dbias && dbias->dtype() != DType::kFloat32 && dbias->dtype() != dt))
    return false;
  launch_colsum(true, dy, &pre, &dpre, dbias, accumulate);
  return true;
}

bool bias_grad_colsum(const Tensor& dy, Tensor& dbias, bool accumulate) {
  check_cuda(dy, "bias_grad_colsum");
  const int64_t f = dy.dim() ? dy.size(-1) : 0;
  MEGATRON_CHECK(dbias.numel() == f) << "bias_grad_colsum: dy " << dy.str() << " dbias " << dbias.str();
  const DType dt = dy.dtype();
  if ((dt != DType::kBFloat16 && dt != DType::kFloat16) || f % 8 != 0 || !aligned16(dy.data_ptr()) ||
      (dbias.dtype() != DType::kFloat32 && dbias.dtype() != dt))
    return false;
  launch_colsum(false, dy, nullptr, nullptr, &dbias, accumulate);
  return true;
}

}  // namespace megatron::ops::cuda
