// Multi-tensor Adam(W) (op_table.h adam_step_multi): one launch updates every parameter
// tensor, with elementwise.cu adam_kernel's per-element arithmetic (adam_update.cuh), so every
// kernel here computes the same bits; they differ only in which thread touches which element and
// how (docs/cuda.md "Kernel variants", docs/performance.md "Session 11: optimizer bandwidth"):
//  - v1 (the kernel before Session 11): each tensor cut into chunks of kChunk elements, one block
//    per chunk (found by a binary search over the tensors' first block, by thread 0, then a
//    barrier), 8 consecutive elements per thread per step (two 16-byte accesses 16 bytes apart,
//    so each warp instruction touches every 32-byte sector half).
//  - u2 / u4 (+ plain, + chunk): tiles of 256 threads x 4 x U elements; thread x owns the float4s
//    x, x + 256, ... of its tile (each warp instruction one contiguous 512 bytes), all 4U loads of
//    the four fp32 streams issued before the arithmetic; a persistent grid (SMs x resident
//    blocks) strides over the tiles and walks the tensor table forward (no barrier, no search
//    after the first tile); evict-first accesses (streaming.cuh). "plain": without the
//    evict-first hints; "chunk": one block per tile (no grid stride).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "megatron/core/ops/cuda/adam_update.cuh"
#include "megatron/core/ops/cuda/cuda_common.cuh"
#include "megatron/core/ops/cuda/cuda_ops.h"
#include "megatron/core/ops/cuda/streaming.cuh"
#include "megatron/core/ops/cuda/variants.h"
#include "megatron/core/utils/env.h"

namespace megatron::ops::cuda {
using namespace detail;

namespace {
constexpr int kThreads = 256;
constexpr int64_t kChunk = kThreads * 8 * 4;  // elements per block

struct Desc {
  float* p;
  const float* g;
  float* m;
  float* v;
  void* mp;
  int64_t n;
  int64_t first_block;
  float lr, wd;
  int vec;
  int pad;
};
static_assert(sizeof(Desc) <= kAdamTableBytesPerTensor, "AdamParams::table_workspace sizing (ops.h)");

template <class M>
__global__ void __launch_bounds__(kThreads) adam_multi_kernel(const Desc* __restrict__ ds, int nt, float b1, float b2,
                                                             float eps, float bc1, float bc2, bool decoupled,
                                                             float gscale) {
  __shared__ int s_t;
  if (threadIdx.x == 0) {
    int lo = 0, hi = nt - 1;  // last tensor whose first_block <= blockIdx.x
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (ds[mid].first_block <= (int64_t)blockIdx.x) lo = mid;
      else hi = mid - 1;
    }
    s_t = lo;
  }
  __syncthreads();
  const Desc d = ds[s_t];
  const int64_t base = ((int64_t)blockIdx.x - d.first_block) * kChunk, end = min(d.n, base + kChunk);
  M* mp = static_cast<M*>(d.mp);
  const bool vec = d.vec != 0;
  const float lr = d.lr, wd = d.wd;
  for (int64_t i = base + threadIdx.x * 8; i < end; i += kThreads * 8) {
    float pp[8], gg[8], mm[8], vv[8];
    ld8(d.p, i, d.n, vec, pp);
    ld8(d.g, i, d.n, vec, gg);
    ld8(d.m, i, d.n, vec, mm);
    ld8(d.v, i, d.n, vec, vv);
    adam_update8(pp, gg, mm, vv, gscale, lr, b1, b2, eps, wd, bc1, bc2, decoupled);  // as adam_kernel
    st8(d.p, i, d.n, vec, pp);
    st8(d.m, i, d.n, vec, mm);
    st8(d.v, i, d.n, vec, vv);
    if (mp) st8(mp, i, d.n, vec, pp);
  }
}

constexpr int kT2 = 256;  // threads of the u2/u4 kernels

// One thread's part of a u2/u4 tile: the float4s at elements e0 + u * 256 * 4 (u < U) of p, g, m,
// v (4U independent 16-byte loads, issued before any arithmetic), updated with adam_update8 (pairs
// of float4s: the per-element arithmetic of v1), then p, m, v and the model param stored. kFull:
// the caller checked that all of them are inside n and aligned.
template <class M, int U, bool kCs, bool kFull>
__device__ __forceinline__ void adam_tile(float* p, const float* g, float* m, float* v, M* mp, int64_t e0, int64_t n,
                                          bool vec, float lr, float wd, float b1, float b2, float eps, float bc1,
                                          float bc2, bool decoupled, float gscale) {
  float pp[U / 2][8], gg[U / 2][8], mm[U / 2][8], vv[U / 2][8];
#pragma unroll
  for (int u = 0; u < U; ++u) ld4<kCs, kFull>(p, e0 + u * kT2 * 4, n, vec, &pp[u / 2][(u % 2) * 4]);
#pragma unroll
  for (int u = 0; u < U; ++u) ld4<kCs, kFull>(g, e0 + u * kT2 * 4, n, vec, &gg[u / 2][(u % 2) * 4]);
#pragma unroll
  for (int u = 0; u < U; ++u) ld4<kCs, kFull>(m, e0 + u * kT2 * 4, n, vec, &mm[u / 2][(u % 2) * 4]);
#pragma unroll
  for (int u = 0; u < U; ++u) ld4<kCs, kFull>(v, e0 + u * kT2 * 4, n, vec, &vv[u / 2][(u % 2) * 4]);
#pragma unroll
  for (int k = 0; k < U / 2; ++k)
    adam_update8(pp[k], gg[k], mm[k], vv[k], gscale, lr, b1, b2, eps, wd, bc1, bc2, decoupled);  // as adam_kernel
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t i = e0 + u * kT2 * 4;
    st4<kCs, kFull>(p, i, n, vec, &pp[u / 2][(u % 2) * 4]);
    st4<kCs, kFull>(m, i, n, vec, &mm[u / 2][(u % 2) * 4]);
    st4<kCs, kFull>(v, i, n, vec, &vv[u / 2][(u % 2) * 4]);
    if (mp) st4<kCs, kFull>(mp, i, n, vec, &pp[u / 2][(u % 2) * 4]);
  }
}

// u2 / u4: tile `tile` of the launch is tile (tile - first_block) of tensor t (first_block here
// counts tiles of kTile = 256 x 4 x U elements); thread x takes the float4s at (tile base) +
// (u * 256 + x) * 4, u < U (adam_tile). Grid: any size; block b takes tiles b, b + gridDim.x, ...
// and moves t forward through the table as its tiles pass tensor ends.
template <class M, int U, bool kCs>
__global__ void __launch_bounds__(kT2, U == 2 ? 4 : 2)
    adam_multi_v2_kernel(const Desc* __restrict__ ds, int nt, int64_t tiles, float b1, float b2, float eps, float bc1,
                         float bc2, bool decoupled, float gscale) {
  static_assert(U % 2 == 0, "adam_update8 takes pairs of float4s");
  constexpr int64_t kTile = int64_t{kT2} * 4 * U;
  int64_t tile = blockIdx.x;
  if (tile >= tiles) return;
  int t = 0, hi = nt - 1;  // the last tensor whose first tile <= this block's first tile
  while (t < hi) {
    const int mid = (t + hi + 1) / 2;
    if (ds[mid].first_block <= tile) t = mid;
    else hi = mid - 1;
  }
  int64_t next = t + 1 < nt ? ds[t + 1].first_block : tiles;
  for (; tile < tiles; tile += gridDim.x) {
    while (tile >= next) {
      ++t;
      next = t + 1 < nt ? ds[t + 1].first_block : tiles;
    }
    const Desc& d = ds[t];
    float* const p = d.p;
    const float* const g = d.g;
    float* const m = d.m;
    float* const v = d.v;
    M* const mp = static_cast<M*>(d.mp);
    const int64_t n = d.n;
    const bool vec = d.vec != 0;
    const float lr = d.lr, wd = d.wd;
    const int64_t e0 = (tile - d.first_block) * kTile + threadIdx.x * 4;
    // Every float4 of this thread inside the tensor and aligned: straight-line 16-byte accesses.
    if (vec && e0 + int64_t{U - 1} * kT2 * 4 + 4 <= n)
      adam_tile<M, U, kCs, true>(p, g, m, v, mp, e0, n, vec, lr, wd, b1, b2, eps, bc1, bc2, decoupled, gscale);
    else
      adam_tile<M, U, kCs, false>(p, g, m, v, mp, e0, n, vec, lr, wd, b1, b2, eps, bc1, bc2, decoupled, gscale);
  }
}

// The kernels by index (variants.h adam_kernel_name order): U (float4s per stream per thread;
// 0 = v1), evict-first hints, persistent grid.
struct KernelSpec {
  const char* name;
  int u;
  bool cs, persistent;
};
constexpr KernelSpec kKernels[] = {{"v1", 0, false, false},     {"u2", 2, true, true},
                                   {"u4", 4, true, true},       {"u2plain", 2, false, true},
                                   {"u2chunk", 2, true, false}, {"u4chunk", 4, true, false}};
constexpr int kNumKernels = static_cast<int>(sizeof(kKernels) / sizeof(kKernels[0]));
// v1: on an H200 (device call 20, LLaMA-8B-shaped 4 layers, 1.92e9 params) u2 took 16.49 ms per
// step against v1's 16.11 ms (docs/performance.md "Session 11: optimizer bandwidth"), so the
// prediction (u2 fastest) failed and v1 stays the default; MEGATRON_ADAM_KERNEL selects the others.
constexpr int kDefaultKernel = 0;

// The kernel index: forced by a dev/cuda driver, else MEGATRON_ADAM_KERNEL (read once), else the default.
int kernel_choice() {
  const int f = variants::forced().adam_kernel;
  if (f >= 0 && f < kNumKernels) return f;
  static const int env = [] {
    const std::string c =
        env_choice("MEGATRON_ADAM_KERNEL", {"auto", "v1", "u2", "u4", "u2plain", "u2chunk", "u4chunk"}, "auto");
    for (int k = 0; k < kNumKernels; ++k)
      if (c == kKernels[k].name) return k;
    return kDefaultKernel;
  }();
  return env;
}

// Blocks of a persistent launch of adam_multi_v2_kernel<M, U, kCs>: SMs x resident blocks per SM
// (at least 1), computed once per instantiation.
template <class M, int U, bool kCs>
void launch_v2(const Desc* dt, int nt, int64_t tiles, bool persistent, cudaStream_t st, float b1, float b2, float eps,
               float bc1, float bc2, bool decoupled, float gscale) {
  auto* k = adam_multi_v2_kernel<M, U, kCs>;
  static const int64_t resident = [k] {
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kT2, 0));
    return static_cast<int64_t>(sm_count()) * std::max(per_sm, 1);
  }();
  const int64_t grid = persistent ? std::min(tiles, resident) : tiles;
  k<<<(unsigned)grid, kT2, 0, st>>>(dt, nt, tiles, b1, b2, eps, bc1, bc2, decoupled, gscale);
}

template <class M>
void launch(int kernel, const Desc* dt, int nt, int64_t blocks, cudaStream_t st, float b1, float b2, float eps,
            float bc1, float bc2, bool decoupled, float gscale) {
  const KernelSpec& s = kKernels[kernel];
  if (s.u == 0) {
    adam_multi_kernel<M><<<(unsigned)blocks, kThreads, 0, st>>>(dt, nt, b1, b2, eps, bc1, bc2, decoupled, gscale);
  } else if (s.u == 2) {
    if (s.cs) launch_v2<M, 2, true>(dt, nt, blocks, s.persistent, st, b1, b2, eps, bc1, bc2, decoupled, gscale);
    else launch_v2<M, 2, false>(dt, nt, blocks, s.persistent, st, b1, b2, eps, bc1, bc2, decoupled, gscale);
  } else {
    launch_v2<M, 4, true>(dt, nt, blocks, s.persistent, st, b1, b2, eps, bc1, bc2, decoupled, gscale);
  }
}

// One launch per tensor when a dev/cuda driver forces it (variants.h).
bool multi_enabled() { return !variants::forced().adam_per_tensor; }

// Whether every tensor fits the multi-tensor kernel (float32 CUDA tensors of matching sizes).
bool multi_fits(const std::vector<AdamTensor>& ts) {
  for (const auto& t : ts) {
    if (!t.param || !t.grad || !t.exp_avg || !t.exp_avg_sq || !t.param->is_cuda()) return false;
    const int64_t n = t.param->numel();
    for (const Tensor* x : {static_cast<const Tensor*>(t.param), t.grad, static_cast<const Tensor*>(t.exp_avg),
                            static_cast<const Tensor*>(t.exp_avg_sq)})
      if (!x->is_cuda() || x->dtype() != DType::kFloat32 || x->numel() != n) return false;
    if (t.model_param) {
      const DType md = t.model_param->dtype();
      if (!t.model_param->is_cuda() || t.model_param->numel() != n ||
          (md != DType::kFloat32 && md != DType::kBFloat16 && md != DType::kFloat16))
        return false;
    }
  }
  return true;
}
}  // namespace

void adam_step_multi(const std::vector<AdamTensor>& ts, const AdamParams& p) {
  if (!multi_enabled() || !multi_fits(ts)) {
    // One adam_step launch per tensor, in list order.
    for (const auto& t : ts) cuda::adam_step(*t.param, *t.grad, *t.exp_avg, *t.exp_avg_sq, t.params(p), t.model_param);
    return;
  }
  const float grad_scale = p.grad_scale;
  cudaStream_t st = megatron::cuda::current_stream();
  const float bc1 = static_cast<float>(1.0 - std::pow((double)p.beta1, (double)p.step));
  const float bc2 = static_cast<float>(1.0 - std::pow((double)p.beta2, (double)p.step));
  const int kernel = kernel_choice();
  // Elements per block (v1) or per tile (u2/u4): the unit of the table's first_block.
  const int64_t chunk = kKernels[kernel].u == 0 ? kChunk : int64_t{kT2} * 4 * kKernels[kernel].u;
  // One launch per model-param dtype (none / fp32 / bf16 / fp16).
  for (int kind = 0; kind < 4; ++kind) {
    std::vector<Desc> ds;
    int64_t blocks = 0;
    Device dev = Device::cpu();
    for (const auto& t : ts) {
      const int k = !t.model_param ? 0
                    : t.model_param->dtype() == DType::kFloat32 ? 1
                    : t.model_param->dtype() == DType::kBFloat16 ? 2
                                                                  : 3;
      const int64_t n = t.param->numel();
      if (k != kind || n == 0) continue;
      dev = t.param->device();
      Desc d{};
      d.p = static_cast<float*>(t.param->data_ptr());
      d.g = static_cast<const float*>(t.grad->data_ptr());
      d.m = static_cast<float*>(t.exp_avg->data_ptr());
      d.v = static_cast<float*>(t.exp_avg_sq->data_ptr());
      d.mp = t.model_param ? t.model_param->data_ptr() : nullptr;
      d.n = n;
      d.first_block = blocks;
      d.lr = t.lr;
      d.wd = t.weight_decay;
      d.vec = aligned16(d.p) && aligned16(d.g) && aligned16(d.m) && aligned16(d.v) && (!d.mp || aligned16(d.mp));
      ds.push_back(d);
      blocks += (n + chunk - 1) / chunk;
    }
    if (ds.empty()) continue;
    MEGATRON_CHECK(blocks < (int64_t{1} << 31)) << "adam_step_multi: " << blocks << " blocks";
    // The table: a host tensor copied with the staged (asynchronous) H2D path, into the caller's
    // workspace (reused by every launch: the copy for the next launch is queued behind this
    // kernel on the same stream) or into a device copy freed stream-ordered after the kernel.
    const int64_t bytes = static_cast<int64_t>(ds.size() * sizeof(Desc));
    Tensor host = Tensor::empty({bytes}, DType::kUInt8);
    std::memcpy(host.data_ptr(), ds.data(), ds.size() * sizeof(Desc));
    Tensor table;
    if (p.table_workspace) {
      const Tensor& w = *p.table_workspace;
      MEGATRON_CHECK(w.is_cuda() && w.device() == dev && w.dtype() == DType::kUInt8 &&
                     w.numel() >= static_cast<int64_t>(ts.size()) * kAdamTableBytesPerTensor)
          << "adam_step_multi: table workspace " << w.str() << " for " << ts.size() << " tensors on " << dev.str();
      table = w.flat_slice(0, {bytes});
      table.copy_(host);
    } else {
      table = host.to(dev);
    }
    const Desc* dt = static_cast<const Desc*>(table.data_ptr());
    const int nt = static_cast<int>(ds.size());
    switch (kind) {
      case 0:
      case 1:
        launch<float>(kernel, dt, nt, blocks, st, p.beta1, p.beta2, p.eps, bc1, bc2, p.decoupled, grad_scale);
        break;
      case 2:
        launch<bf16_t>(kernel, dt, nt, blocks, st, p.beta1, p.beta2, p.eps, bc1, bc2, p.decoupled, grad_scale);
        break;
      default:
        launch<fp16_t>(kernel, dt, nt, blocks, st, p.beta1, p.beta2, p.eps, bc1, bc2, p.decoupled, grad_scale);
    }
    CUDA_CHECK_LAUNCH();
  }
}

namespace variants {
const char* adam_kernel_name(int index) { return index >= 0 && index < kNumKernels ? kKernels[index].name : nullptr; }
}  // namespace variants

}  // namespace megatron::ops::cuda
