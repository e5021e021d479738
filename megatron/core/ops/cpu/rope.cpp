// CPU reference: Megatron's fused-QKV split (rows grouped per query group, docs/megatron-reference.md#distributed-checkpoint)
// and rotary position embedding (Su et al. 2021, "RoFormer"; Megatron's RotaryEmbedding /
// apply_rotary_pos_emb: rotate-half pairs (i, i + rot/2), or interleaved pairs (2i, 2i+1)).
#include <cmath>
#include <vector>

#include "megatron/core/ops/cpu/cpu_ops.h"
#include "megatron/core/ops/cpu/cpu_util.h"

namespace megatron::ops::cpu {

namespace {
/// inv_freq[i] = 1 / base^(2i / rot_dim), i < rot_dim / 2, in float32 as torch computes it, with
/// the Llama-3.1 scaling when rope.scaling.enabled (rope_inv_freq, shared with the CUDA kernels).
std::vector<float> inv_freq(const RopeParams& rope, int64_t d, int64_t* rot_dim) {
  int64_t rd = static_cast<int64_t>(static_cast<float>(d) * rope.percent);
  MEGATRON_CHECK(rd % 2 == 0 && rd <= d && rd > 0) << "rope: rotary dim " << rd << " of head dim " << d;
  *rot_dim = rd;
  std::vector<float> f(static_cast<size_t>(rd / 2));
  for (int64_t i = 0; i < rd / 2; ++i)
    f[i] = rope_inv_freq(rope.base, static_cast<int>(i), static_cast<int>(rd), rope.scaling);
  return f;
}

/// Rotates one head vector x[d] in place by angles rope_angle(pos, pos_scale, inv_freq) (sign -1 =
/// inverse rotation).
void rotate(float* x, int64_t rot_dim, const std::vector<float>& freq, float pos, float pos_scale, bool interleaved,
            float sign) {
  const int64_t half = rot_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float angle = rope_angle(pos, pos_scale, freq[i]);
    const float c = std::cos(angle), s = sign * std::sin(angle);
    const int64_t a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
    const float xa = x[a], xb = x[b];
    x[a] = xa * c - xb * s;
    x[b] = xb * c + xa * s;
  }
}

float position_of(const Tensor* position_ids, int64_t si, int64_t bi, int64_t b) {
  return position_ids ? static_cast<float>(position_ids->data<int64_t>()[si * b + bi]) : static_cast<float>(si);
}

/// Applies (sign +1) or undoes (-1) RoPE on x [s, b, n, d] into y.
void rope_apply(const Tensor& x, const RopeParams& rope, const Tensor* position_ids, Tensor& y, float sign) {
  MEGATRON_CHECK(x.dim() == 4 && y.numel() == x.numel()) << "rope x " << x.str() << " y " << y.str();
  const int64_t s = x.size(0), b = x.size(1), n = x.size(2), d = x.size(3);
  if (position_ids) {
    MEGATRON_CHECK(position_ids->numel() == s * b) << "rope position_ids " << position_ids->str();
  }
  int64_t rd = 0;
  const auto freq = inv_freq(rope, d, &rd);
  FloatIn fx(x);
  std::vector<float> out(fx.data(), fx.data() + x.numel());
#pragma omp parallel for schedule(static) if (s * b * n * d > 16384)
  for (int64_t sb = 0; sb < s * b; ++sb) {
    const float pos = position_of(position_ids, sb / b, sb % b, b);
    for (int64_t h = 0; h < n; ++h) rotate(out.data() + (sb * n + h) * d, rd, freq, pos, rope.position_scale, rope.interleaved, sign);
  }
  cpu_convert_from_float(out.data(), y.data_ptr(), y.dtype(), y.numel());
}
}  // namespace

void rope_forward(const Tensor& x, const RopeParams& rope, const Tensor* position_ids, Tensor& y) {
  rope_apply(x, rope, position_ids, y, 1.0f);
}

void rope_backward(const Tensor& dy, const RopeParams& rope, const Tensor* position_ids, Tensor& dx) {
  rope_apply(dy, rope, position_ids, dx, -1.0f);
}

void qkv_split_rope_forward(const Tensor& qkv, int64_t num_heads, int64_t num_query_groups, const RopeParams& rope,
                            const Tensor* position_ids, Tensor& q, Tensor& k, Tensor& v) {
  const int64_t s = q.size(0), b = q.size(1), d = q.size(3), ng = num_query_groups, npg = num_heads / ng;
  MEGATRON_CHECK(q.dim() == 4 && q.size(2) == num_heads && num_heads % ng == 0 && k.numel() == s * b * ng * d &&
                 v.numel() == k.numel() && qkv.numel() == s * b * ng * (npg + 2) * d)
      << "qkv_split_rope_forward qkv " << qkv.str() << " q " << q.str() << " k " << k.str() << " heads " << num_heads
      << " groups " << ng;
  FloatIn in(qkv);
  FloatOut fq(q), fk(k), fv(v);
  int64_t rd = 0;
  const auto freq = rope.enabled ? inv_freq(rope, d, &rd) : std::vector<float>{};
  const int64_t row = ng * (npg + 2) * d;
#pragma omp parallel for schedule(static) if (s * b * row > 16384)
  for (int64_t sb = 0; sb < s * b; ++sb) {
    const float pos = position_of(position_ids, sb / b, sb % b, b);
    const float* src = in.data() + sb * row;
    for (int64_t g = 0; g < ng; ++g) {
      const float* grp = src + g * (npg + 2) * d;
      for (int64_t j = 0; j < npg; ++j) {
        float* dst = fq.data() + (sb * num_heads + g * npg + j) * d;
        for (int64_t c = 0; c < d; ++c) dst[c] = grp[j * d + c];
        if (rope.enabled) rotate(dst, rd, freq, pos, rope.position_scale, rope.interleaved, 1.0f);
      }
      float* dk = fk.data() + (sb * ng + g) * d;
      float* dv = fv.data() + (sb * ng + g) * d;
      for (int64_t c = 0; c < d; ++c) {
        dk[c] = grp[npg * d + c];
        dv[c] = grp[(npg + 1) * d + c];
      }
      if (rope.enabled) rotate(dk, rd, freq, pos, rope.position_scale, rope.interleaved, 1.0f);
    }
  }
  fq.commit();
  fk.commit();
  fv.commit();
}

void qkv_split_rope_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, int64_t num_heads,
                             int64_t num_query_groups, const RopeParams& rope, const Tensor* position_ids, Tensor& dqkv) {
  const int64_t s = dq.size(0), b = dq.size(1), d = dq.size(3), ng = num_query_groups, npg = num_heads / ng;
  MEGATRON_CHECK(dq.dim() == 4 && dq.size(2) == num_heads && dk.numel() == s * b * ng * d && dv.numel() == dk.numel() &&
                 dqkv.numel() == s * b * ng * (npg + 2) * d)
      << "qkv_split_rope_backward dq " << dq.str() << " dk " << dk.str() << " dqkv " << dqkv.str();
  FloatIn fq(dq), fk(dk), fv(dv);
  FloatOut out(dqkv);
  int64_t rd = 0;
  const auto freq = rope.enabled ? inv_freq(rope, d, &rd) : std::vector<float>{};
  const int64_t row = ng * (npg + 2) * d;
#pragma omp parallel for schedule(static) if (s * b * row > 16384)
  for (int64_t sb = 0; sb < s * b; ++sb) {
    const float pos = position_of(position_ids, sb / b, sb % b, b);
    float* dst = out.data() + sb * row;
    for (int64_t g = 0; g < ng; ++g) {
      float* grp = dst + g * (npg + 2) * d;
      for (int64_t j = 0; j < npg; ++j) {
        const float* src = fq.data() + (sb * num_heads + g * npg + j) * d;
        for (int64_t c = 0; c < d; ++c) grp[j * d + c] = src[c];
        if (rope.enabled) rotate(grp + j * d, rd, freq, pos, rope.position_scale, rope.interleaved, -1.0f);
      }
      const float* sk = fk.data() + (sb * ng + g) * d;
      const float* sv = fv.data() + (sb * ng + g) * d;
      for (int64_t c = 0; c < d; ++c) {
        grp[npg * d + c] = sk[c];
        grp[(npg + 1) * d + c] = sv[c];
      }
      if (rope.enabled) rotate(grp + npg * d, rd, freq, pos, rope.position_scale, rope.interleaved, -1.0f);
    }
  }
  out.commit();
}

}  // namespace megatron::ops::cpu
