// Multi-tensor Adam(W) (op_table.h adam_step_multi): one launch updates every parameter
// tensor. Each tensor is cut into chunks of kChunk elements; block b finds its tensor in the
// table (binary search over the tensors' first block) and runs elementwise.cu adam_kernel's
// per-element arithmetic on its chunk (8 elements per thread per step, 16-byte accesses when the
// tensor's pointers are 16-byte aligned).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "megatron/core/ops/cuda/adam_update.cuh"
#include "megatron/core/ops/cuda/cuda_common.cuh"
#include "megatron/core/ops/cuda/cuda_ops.h"
#include "megatron/core/ops/cuda/variants.h"

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
      blocks += (n + kChunk - 1) / kChunk;
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
        adam_multi_kernel<float><<<(unsigned)blocks, kThreads, 0, st>>>(dt, nt, p.beta1, p.beta2, p.eps, bc1, bc2,
                                                                        p.decoupled, grad_scale);
        break;
      case 2:
        adam_multi_kernel<bf16_t><<<(unsigned)blocks, kThreads, 0, st>>>(dt, nt, p.beta1, p.beta2, p.eps, bc1, bc2,
                                                                         p.decoupled, grad_scale);
        break;
      default:
        adam_multi_kernel<fp16_t><<<(unsigned)blocks, kThreads, 0, st>>>(dt, nt, p.beta1, p.beta2, p.eps, bc1, bc2,
                                                                         p.decoupled, grad_scale);
    }
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace megatron::ops::cuda
