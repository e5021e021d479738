// qkv_split_rope forward/backward on CUDA (ops.h): splits Megatron's per-group fused QKV rows
// into q, k, v and applies rotary embedding (rotate-half or interleaved; partial rotary via
// rope.percent) with fp32 angles pos * base^(-2i/rot_dim). One thread per output element.
#include "megatron/core/ops/cuda/cuda_common.cuh"
#include "megatron/core/ops/cuda/cuda_ops.h"

namespace megatron::ops::cuda {
using namespace detail;

namespace {
constexpr int kThreads = 256;

struct RopeArgs {
  int64_t s, b, np, ng, d;
  int rot;  // rotated channels (0 = no rope)
  bool interleaved;
  float base;
};

// Returns the sign and partner channel for channel c (< rot), and the frequency index.
__device__ __forceinline__ void rope_partner(int c, int rot, bool inter, int& partner, float& sign, int& fi) {
  if (inter) {
    partner = c ^ 1;
    sign = (c & 1) ? 1.0f : -1.0f;
    fi = c >> 1;
  } else {
    int half = rot / 2;
    if (c < half) {
      partner = c + half;
      sign = -1.0f;
      fi = c;
    } else {
      partner = c - half;
      sign = 1.0f;
      fi = c - half;
    }
  }
}

// kBwd=false: out (q/k/v) from qkv. kBwd=true: dqkv from dq/dk/dv (inverse rotation).
template <class T, bool kBwd>
__global__ void rope_kernel(const T* __restrict__ qkv_in, T* __restrict__ qkv_out, T* __restrict__ q,
                            T* __restrict__ k, T* __restrict__ v, const int64_t* __restrict__ pos_ids, RopeArgs a) {
  const int64_t npg = a.np / a.ng, slots = a.ng * (npg + 2);
  const int64_t total = a.s * a.b * slots * a.d;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int c = static_cast<int>(i % a.d);
    const int64_t slot = (i / a.d) % slots, tok = i / (a.d * slots);  // tok = si * b + bi
    const int64_t grp = slot / (npg + 2), within = slot % (npg + 2);
    T* other;
    int64_t oidx;
    bool rotated = a.rot > 0 && within <= npg && c < a.rot;
    if (within < npg) {
      other = q;
      oidx = (tok * a.np + grp * npg + within) * a.d;
    } else if (within == npg) {
      other = k;
      oidx = (tok * a.ng + grp) * a.d;
    } else {
      other = v;
      oidx = (tok * a.ng + grp) * a.d;
    }
    const int64_t qidx = (tok * slots + slot) * a.d;
    const T* src = kBwd ? other + oidx : qkv_in + qidx;
    float val = to_f(src[c]);
    if (rotated) {
      int partner, fi;
      float sign;
      rope_partner(c, a.rot, a.interleaved, partner, sign, fi);
      const int64_t si = tok / a.b;
      const float pos = pos_ids ? static_cast<float>(pos_ids[tok]) : static_cast<float>(si);
      const float inv_freq = 1.0f / powf(a.base, static_cast<float>(2 * fi) / static_cast<float>(a.rot));
      float sn, cs;
      sincosf(pos * inv_freq, &sn, &cs);
      const float pv = to_f(src[partner]);
      // forward: out[c] = x[c] cos + sign * x[partner] sin; backward: the transpose.
      val = kBwd ? val * cs - sign * pv * sn : val * cs + sign * pv * sn;
    }
    if (kBwd) qkv_out[qidx + c] = from_f<T>(val);
    else other[oidx + c] = from_f<T>(val);
  }
}

RopeArgs make_args(const Shape& qkv, int64_t np, int64_t ng, const RopeParams& rope, int64_t d) {
  RopeArgs a{};
  a.s = qkv[0];
  a.b = qkv[1];
  a.np = np;
  a.ng = ng;
  a.d = d;
  a.rot = rope.enabled ? static_cast<int>(static_cast<float>(d) * rope.percent) : 0;
  a.rot -= a.rot % 2;
  a.interleaved = rope.interleaved;
  a.base = rope.base;
  return a;
}
}  // namespace

void qkv_split_rope_forward(const Tensor& qkv, int64_t num_heads, int64_t num_query_groups, const RopeParams& rope,
                            const Tensor* position_ids, Tensor& q, Tensor& k, Tensor& v) {
  check_cuda(qkv, "qkv_split_rope_forward");
  MEGATRON_CHECK(qkv.dim() == 3 && num_query_groups > 0 && num_heads % num_query_groups == 0 && q.dim() == 4 &&
                 q.size(2) == num_heads && k.size(2) == num_query_groups && v.size(2) == num_query_groups &&
                 qkv.size(2) == num_query_groups * (num_heads / num_query_groups + 2) * q.size(3) &&
                 q.dtype() == qkv.dtype() && k.dtype() == qkv.dtype() && v.dtype() == qkv.dtype())
      << "qkv_split_rope_forward: qkv " << qkv.str() << " q " << q.str() << " k " << k.str() << " v " << v.str();
  RopeArgs a = make_args(qkv.shape(), num_heads, num_query_groups, rope, q.size(3));
  const int64_t total = qkv.numel();
  if (total == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  const int64_t* pos = position_ids ? static_cast<const int64_t*>(position_ids->data_ptr()) : nullptr;
  MCU_FLOAT_SWITCH(qkv.dtype(), T,
                   rope_kernel<T, false><<<grid_for(total, kThreads), kThreads, 0, st>>>(
                       static_cast<const T*>(qkv.data_ptr()), nullptr, static_cast<T*>(q.data_ptr()),
                       static_cast<T*>(k.data_ptr()), static_cast<T*>(v.data_ptr()), pos, a));
  CUDA_CHECK_LAUNCH();
}

void qkv_split_rope_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, int64_t num_heads,
                             int64_t num_query_groups, const RopeParams& rope, const Tensor* position_ids,
                             Tensor& dqkv) {
  check_cuda(dqkv, "qkv_split_rope_backward");
  MEGATRON_CHECK(dqkv.dim() == 3 && num_query_groups > 0 && num_heads % num_query_groups == 0 && dq.dim() == 4 &&
                 dq.size(2) == num_heads && dk.size(2) == num_query_groups && dv.size(2) == num_query_groups &&
                 dqkv.size(2) == num_query_groups * (num_heads / num_query_groups + 2) * dq.size(3) &&
                 dq.dtype() == dqkv.dtype() && dk.dtype() == dqkv.dtype() && dv.dtype() == dqkv.dtype())
      << "qkv_split_rope_backward: dqkv " << dqkv.str() << " dq " << dq.str();
  RopeArgs a = make_args(dqkv.shape(), num_heads, num_query_groups, rope, dq.size(3));
  const int64_t total = dqkv.numel();
  if (total == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  const int64_t* pos = position_ids ? static_cast<const int64_t*>(position_ids->data_ptr()) : nullptr;
  MCU_FLOAT_SWITCH(dqkv.dtype(), T,
                   rope_kernel<T, true><<<grid_for(total, kThreads), kThreads, 0, st>>>(
                       nullptr, static_cast<T*>(dqkv.data_ptr()), const_cast<T*>(static_cast<const T*>(dq.data_ptr())),
                       const_cast<T*>(static_cast<const T*>(dk.data_ptr())),
                       const_cast<T*>(static_cast<const T*>(dv.data_ptr())), pos, a));
  CUDA_CHECK_LAUNCH();
}

}  // namespace megatron::ops::cuda
