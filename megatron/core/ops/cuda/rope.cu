// qkv_split_rope forward/backward on CUDA (ops.h): splits Megatron's per-group fused QKV rows
// into q, k, v and applies rotary embedding (rotate-half or interleaved; partial rotary via
// rope.percent) with fp32 angles pos * base^(-2i/rot_dim) (rope_freq.h: also Llama-3.1 frequency
// scaling and position interpolation, the same inline functions the CPU reference calls). One thread per 8 channels of a row
// (rope_vec_kernel) when the shapes allow and fill a GPU wave (the backward: whenever they
// allow), else one thread per output element (rope_kernel: a decode step's few tokens). The vector
// kernel reads each token's (cos, sin) from a per-call table (rope_table_kernel) by default.
#include <initializer_list>

#include "megatron/core/ops/cuda/cuda_common.cuh"
#include "megatron/core/ops/cuda/cuda_ops.h"
#include "megatron/core/ops/cuda/variants.h"
#include "megatron/core/utils/env.h"
#include "megatron/core/ops/rope_freq.h"

namespace megatron::ops::cuda {
using namespace detail;

namespace {
constexpr int kThreads = 256;

struct RopeArgs {
  int64_t s, b, np, ng, d;
  int rot;  // rotated channels (0 = no rope)
  bool interleaved;
  float base;
  RopeScaling scaling;  // Llama-3.1 frequency scaling (rope_freq.h)
  float pos_scale;      // 1 / --rotary-seq-len-interpolation-factor, else 1
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

// The rotation of one channel, with its roundings written out so that every kernel below rounds
// the same way whatever nvcc would contract in its context (it fuses `a * b + c` per
// instantiation): forward x cs + sign pv sn as one fma over the rounded product sn (sign pv),
// backward x cs - sign pv sn with three rounded products and a rounded difference. These are the
// roundings nvcc chose for rope_vec_kernel before they were written out (its fp32 PTX was compared
// by hand when they were, Session 12: the same instructions, `mul.f32` spelled `mul.rn.f32`); the
// GPU test gpu_ops_test --only rope_table holds the table path to the per-channel path bitwise.
template <bool kBwd>
__device__ __forceinline__ float rope_rotate(float x, float pv, float cs, float sn, float sign) {
  const float t = __fmul_rn(sn, __fmul_rn(sign, pv));
  return kBwd ? __fsub_rn(__fmul_rn(x, cs), t) : __fmaf_rn(x, cs, t);
}

// (cos, sin) of rotary pair fi at position pos (rope_freq.h: Megatron's float32 inverse frequency,
// the Llama-3.1 scaling, the interpolated position): the one angle computation every kernel
// below and the angle table use, so all of them hold the same values.
__device__ __forceinline__ void rope_cos_sin(float pos, int fi, int rot, float base, const RopeScaling& sc,
                                             float pos_scale, float& cs, float& sn) {
  sincosf(rope_angle(pos, pos_scale, rope_inv_freq(base, fi, rot, sc)), &sn, &cs);
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
      float sn, cs;
      rope_cos_sin(pos, fi, a.rot, a.base, a.scaling, a.pos_scale, cs, sn);
      const float pv = to_f(src[partner]);
      // forward: out[c] = x[c] cos + sign * x[partner] sin; backward: the transpose.
      val = rope_rotate<kBwd>(val, pv, cs, sn, sign);
    }
    if (kBwd) qkv_out[qidx + c] = from_f<T>(val);
    else other[oidx + c] = from_f<T>(val);
  }
}

// Vectorized form of rope_kernel: one thread per 8 consecutive channels of one row of qkv
// (16-byte loads/stores for 16-bit types), 64-bit index arithmetic once per thread instead of
// per element. Needs d % 8 == 0, rot % 16 == 0 (a chunk never straddles the rotary boundary and
// the rotate-half partner of a chunk is the chunk rot/2 away) and 16-byte aligned pointers.
// Same per-element formulas as rope_kernel, so results are identical.
// Measured on the H200 (LLaMA-3-8B shape, qkv 8192 x 6144 bf16): rope_kernel took 0.78 ms
// forward and 0.73 ms backward (docs/performance.md); this moves 2 x 100 MB.
// kTable: (cos, sin) of each (position row, pair) come from `tab` (rope_table_kernel: the same
// rope_inv_freq / rope_angle / sincosf calls, so the same values) instead of being computed per
// channel: the 8 powf + 8 sincosf per thread made this kernel compute-bound, ~0.32 ms forward and
// ~0.38 ms backward per LLaMA-3-8B-shaped call (8192 x 6144 bf16, 200 MB moved: ~0.6 TB/s; device
// call 17's kernel profile, docs/performance.md "Session 12: RoPE angle table"), while the table row of a token
// is read by all of its heads. tab rows: the token (tok = si * b + bi) with position ids, else si.
template <class T, bool kBwd, bool kTable = false>
__global__ void rope_vec_kernel(const T* __restrict__ qkv_in, T* __restrict__ qkv_out, T* __restrict__ q,
                                T* __restrict__ k, T* __restrict__ v, const int64_t* __restrict__ pos_ids, RopeArgs a,
                                int64_t rows, const float2* __restrict__ tab = nullptr) {
  const int tpr = static_cast<int>(a.d / 8);
  const int npg = static_cast<int>(a.np / a.ng), per_group = npg + 2, slots = static_cast<int>(a.ng) * per_group;
  const int64_t total = rows * tpr;
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
    const int c0 = static_cast<int>(t % tpr) * 8;
    const int64_t row = t / tpr;
    const int slot = static_cast<int>(row % slots);
    const int64_t tok = row / slots;  // tok = si * b + bi
    const int grp = slot / per_group, within = slot % per_group;
    T* other;
    int64_t oidx;
    if (within < npg) {
      other = q;
      oidx = (tok * a.np + grp * npg + within) * a.d;
    } else {
      other = within == npg ? k : v;
      oidx = (tok * a.ng + grp) * a.d;
    }
    const int64_t qidx = row * a.d;
    const T* src = kBwd ? other + oidx : qkv_in + qidx;
    T* dst = kBwd ? qkv_out + qidx : other + oidx;
    float x[8], y[8];
    ld8(src, c0, a.d, true, x);
    if (a.rot > 0 && within <= npg && c0 < a.rot) {
      float pv[8];
      if (a.interleaved) {
#pragma unroll
        for (int j = 0; j < 8; ++j) pv[j] = x[j ^ 1];
      } else {
        const int half = a.rot / 2;
        ld8(src, c0 < half ? c0 + half : c0 - half, a.d, true, pv);
      }
      if constexpr (kTable) {
        // The chunk's pairs: 8 consecutive (rotate-half: both halves map onto fi = c mod rot/2,
        // rot % 16 == 0 keeps a chunk in one half) or 4 (interleaved: fi = c / 2); rot/2 % 8 == 0
        // keeps the row's 8-pair groups 64-byte aligned.
        const int half = a.rot / 2;
        const float2* tr = tab + (pos_ids ? tok : tok / a.b) * half +
                           (a.interleaved ? (c0 >> 1) : (c0 < half ? c0 : c0 - half));
        float2 e[8];
        const float4* t4 = reinterpret_cast<const float4*>(tr);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if (a.interleaved && j >= 2) break;
          const float4 w = t4[j];
          e[2 * j] = make_float2(w.x, w.y);
          e[2 * j + 1] = make_float2(w.z, w.w);
        }
        // Two loops so that every e[] index is a compile-time constant (a runtime index put e in
        // local memory: 64 bytes of stack per thread).
        if (a.interleaved) {
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            int partner, fi;
            float sign;
            rope_partner(c0 + j, a.rot, true, partner, sign, fi);
            y[j] = rope_rotate<kBwd>(x[j], pv[j], e[j >> 1].x, e[j >> 1].y, sign);
          }
        } else {
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            int partner, fi;
            float sign;
            rope_partner(c0 + j, a.rot, false, partner, sign, fi);
            y[j] = rope_rotate<kBwd>(x[j], pv[j], e[j].x, e[j].y, sign);
          }
        }
      } else {
        const float pos = pos_ids ? static_cast<float>(pos_ids[tok]) : static_cast<float>(tok / a.b);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          int partner, fi;
          float sign;
          rope_partner(c0 + j, a.rot, a.interleaved, partner, sign, fi);
          float sn, cs;
          rope_cos_sin(pos, fi, a.rot, a.base, a.scaling, a.pos_scale, cs, sn);
          y[j] = rope_rotate<kBwd>(x[j], pv[j], cs, sn, sign);
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) y[j] = x[j];
    }
    st8(dst, c0, a.d, true, y);
  }
}

// tab[r * rot/2 + fi] = (cos, sin) of pair fi at the position of row r: pos_ids[r] (r over the
// s * b tokens) or r (= si, r < s) without position ids; the same calls as rope_vec_kernel's
// per-channel path, so the same float values.
__global__ void rope_table_kernel(float2* __restrict__ tab, const int64_t* __restrict__ pos_ids, RopeArgs a,
                                  int64_t nrows) {
  const int half = a.rot / 2;
  const int64_t total = nrows * half;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int fi = static_cast<int>(i % half);
    const int64_t r = i / half;
    const float pos = pos_ids ? static_cast<float>(pos_ids[r]) : static_cast<float>(r);
    float sn, cs;
    rope_cos_sin(pos, fi, a.rot, a.base, a.scaling, a.pos_scale, cs, sn);
    tab[i] = make_float2(cs, sn);
  }
}

// MEGATRON_ROPE_TABLE=0 (A/B runs, docs/environment.md) or variants::forced().rope_no_table: the
// vector kernel computes every channel's angle itself (same bits, slower).
bool rope_table_on() {
  static const bool on = env_switch("MEGATRON_ROPE_TABLE", true);
  return on && !variants::forced().rope_no_table;
}

// Launches rope_vec_kernel over `rows` rows of qkv, through the angle table when rope_table_on()
// and the rotation covers at least one 8-pair group (the table is allocated stream-ordered and
// freed behind the kernel).
template <class T, bool kBwd>
void launch_rope_vec(const T* qkv_in, T* qkv_out, T* q, T* k, T* v, const int64_t* pos, const RopeArgs& a,
                     int64_t rows, cudaStream_t st) {
  const unsigned grid = grid_for(rows * (a.d / 8), kThreads);
  if (!rope_table_on() || a.rot < 16) {
    rope_vec_kernel<T, kBwd, false><<<grid, kThreads, 0, st>>>(qkv_in, qkv_out, q, k, v, pos, a, rows);
    CUDA_CHECK_LAUNCH();
    return;
  }
  const int64_t ntok = a.s * a.b, trows = pos ? ntok : a.s, tn = trows * (a.rot / 2);
  float2* tab = nullptr;
  CUDA_CHECK(cudaMallocAsync(&tab, sizeof(float2) * tn, st));
  rope_table_kernel<<<grid_for(tn, kThreads), kThreads, 0, st>>>(tab, pos, a, trows);
  CUDA_CHECK_LAUNCH();
  rope_vec_kernel<T, kBwd, true><<<grid, kThreads, 0, st>>>(qkv_in, qkv_out, q, k, v, pos, a, rows, tab);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaFreeAsync(tab, st));
}

bool rope_vec_ok(const RopeArgs& a, std::initializer_list<const void*> ptrs) {
  if (a.d % 8 != 0 || a.rot % 16 != 0) return false;
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  return true;
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
  a.scaling = rope.scaling;
  a.pos_scale = rope.position_scale;
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
  // Fewer vector threads than one wave of the GPU (decode: a few tokens): the vector kernel's
  // 8 serial sincosf per thread are the latency (~5 us per call at batch 1 on the H200), so the
  // element kernel (the same per-element formulas, identical results) spreads them 8x wider.
  if (rope_vec_ok(a, {qkv.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr()}) &&
      total / 8 >= (int64_t)sm_count() * kThreads) {
    const int64_t rows = total / a.d;
    MCU_FLOAT_SWITCH(qkv.dtype(), T,
                     launch_rope_vec<T, false>(static_cast<const T*>(qkv.data_ptr()), nullptr,
                                               static_cast<T*>(q.data_ptr()), static_cast<T*>(k.data_ptr()),
                                               static_cast<T*>(v.data_ptr()), pos, a, rows, st));
    return;
  }
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
  if (rope_vec_ok(a, {dqkv.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr()})) {
    const int64_t rows = total / a.d;
    MCU_FLOAT_SWITCH(dqkv.dtype(), T,
                     launch_rope_vec<T, true>(nullptr, static_cast<T*>(dqkv.data_ptr()),
                                              const_cast<T*>(static_cast<const T*>(dq.data_ptr())),
                                              const_cast<T*>(static_cast<const T*>(dk.data_ptr())),
                                              const_cast<T*>(static_cast<const T*>(dv.data_ptr())), pos, a, rows, st));
    return;
  }
  MCU_FLOAT_SWITCH(dqkv.dtype(), T,
                   rope_kernel<T, true><<<grid_for(total, kThreads), kThreads, 0, st>>>(
                       nullptr, static_cast<T*>(dqkv.data_ptr()), const_cast<T*>(static_cast<const T*>(dq.data_ptr())),
                       const_cast<T*>(static_cast<const T*>(dk.data_ptr())),
                       const_cast<T*>(static_cast<const T*>(dv.data_ptr())), pos, a));
  CUDA_CHECK_LAUNCH();
}

namespace {
// RoPE on x [s, b, n, d] in place-safe form: one thread per rotated pair (reads both, writes
// both) or per pass-through channel. kInverse applies the inverse rotation (backward).
template <class T, bool kInverse>
__global__ void rope_pairs_kernel(const T* x, T* y, const int64_t* __restrict__ pos_ids, int64_t s, int64_t b,
                                  int64_t n, int d, int rot, bool inter, float base,
                                  RopeScaling sc, float pos_scale) {
  const int per_head = rot / 2 + (d - rot);
  const int64_t total = s * b * n * per_head;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int w = static_cast<int>(i % per_head);
    const int64_t head = i / per_head, tok = head / n;  // tok = si * b + bi
    const int64_t off = head * d;
    if (w >= rot / 2) {  // channel beyond the rotary dims: copied
      const int c = rot + (w - rot / 2);
      y[off + c] = x[off + c];
      continue;
    }
    const int ca = inter ? 2 * w : w, cb = inter ? 2 * w + 1 : w + rot / 2;
    const float pos = pos_ids ? static_cast<float>(pos_ids[tok]) : static_cast<float>(tok / b);
    float sn, cs;
    rope_cos_sin(pos, w, rot, base, sc, pos_scale, cs, sn);
    if (kInverse) sn = -sn;
    const float xa = to_f(x[off + ca]), xb = to_f(x[off + cb]);
    y[off + ca] = from_f<T>(xa * cs - xb * sn);
    y[off + cb] = from_f<T>(xb * cs + xa * sn);
  }
}

template <bool kInverse>
void rope_apply(const char* name, const Tensor& x, const RopeParams& rope, const Tensor* position_ids, Tensor& y) {
  check_cuda(x, name);
  MEGATRON_CHECK(x.dim() == 4 && y.shape() == x.shape() && y.dtype() == x.dtype() &&
                 (!position_ids || position_ids->numel() == x.size(0) * x.size(1)))
      << name << ": x " << x.str() << " y " << y.str();
  const int d = static_cast<int>(x.size(3));
  int rot = static_cast<int>(static_cast<float>(d) * rope.percent);
  MEGATRON_CHECK(rot % 2 == 0 && rot > 0 && rot <= d) << name << ": rotary dim " << rot << " of head dim " << d;
  const int64_t total = x.size(0) * x.size(1) * x.size(2) * (rot / 2 + (d - rot));
  if (total == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  const int64_t* pos = position_ids ? static_cast<const int64_t*>(position_ids->data_ptr()) : nullptr;
  MCU_FLOAT_SWITCH(x.dtype(), T,
                   rope_pairs_kernel<T, kInverse><<<grid_for(total, kThreads), kThreads, 0, st>>>(
                       static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()), pos, x.size(0), x.size(1),
                       x.size(2), d, rot, rope.interleaved, rope.base, rope.scaling, rope.position_scale));
  CUDA_CHECK_LAUNCH();
}
}  // namespace

void rope_forward(const Tensor& x, const RopeParams& rope, const Tensor* position_ids, Tensor& y) {
  rope_apply<false>("rope_forward", x, rope, position_ids, y);
}
void rope_backward(const Tensor& dy, const RopeParams& rope, const Tensor* position_ids, Tensor& dx) {
  rope_apply<true>("rope_backward", dy, rope, position_ids, dx);
}

}  // namespace megatron::ops::cuda
