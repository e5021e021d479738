// CPU reference: scaled dot-product attention with grouped-query K/V, causal or explicit mask,
// attention dropout, fp32 softmax (Vaswani et al. 2017; GQA: Ainslie et al. 2023). Megatron's
// DotProductAttention computes softmax(scale * Q K^T + mask) V with dropout on the
// probabilities; this kernel does the same per (batch, head) with OpenBLAS GEMMs and keeps
// only the log-sum-exp for backward (the probabilities are recomputed, the dropout mask is
// regenerated from its counter-based stream).
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "megatron/core/ops/cpu/cpu_ops.h"
#include "megatron/core/ops/cpu/cpu_util.h"

namespace megatron::ops::cpu {

namespace {
struct Dims {
  int64_t s, sk, b, np, ng, d;
};

Dims check_dims(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p) {
  MEGATRON_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.shape() == v.shape() && q.size(1) == k.size(1) &&
                 q.size(3) == k.size(3) && q.size(2) % k.size(2) == 0)
      << "attention q " << q.str() << " k " << k.str() << " v " << v.str();
  Dims d{q.size(0), k.size(0), q.size(1), q.size(2), k.size(2), q.size(3)};
  if (p.attention_mask) {
    MEGATRON_CHECK(p.attention_mask->numel() == d.b * d.s * d.sk && dtype_size(p.attention_mask->dtype()) == 1)
        << "attention mask " << p.attention_mask->str() << " for q " << q.str();
  } else if (p.causal) {
    MEGATRON_CHECK(d.s == d.sk) << "causal attention needs s == sk, got " << d.s << " and " << d.sk;
  }
  return d;
}

bool masked(const AttentionParams& p, const Dims& d, int64_t bi, int64_t i, int64_t j) {
  if (p.attention_mask) return p.attention_mask->data<uint8_t>()[(bi * d.s + i) * d.sk + j] != 0;
  return p.causal && j > i;
}

/// Gathers head `h` of x [s, b, n, d] for batch bi into dst [s, d].
void gather_head(const float* x, const Dims& dm, int64_t n, int64_t rows, int64_t bi, int64_t h, float* dst) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < dm.d; ++c) dst[i * dm.d + c] = x[((i * dm.b + bi) * n + h) * dm.d + c];
}
void scatter_head(const float* src, const Dims& dm, int64_t n, int64_t rows, int64_t bi, int64_t h, float* x, bool add) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < dm.d; ++c) {
      float& o = x[((i * dm.b + bi) * n + h) * dm.d + c];
      o = add ? o + src[i * dm.d + c] : src[i * dm.d + c];
    }
}

void gemm_rm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, const float* b, float beta, float* c) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k,
              1.0f, a, (int)(ta ? m : k), b, (int)(tb ? k : n), beta, c, (int)n);
}

/// Rows are processed in blocks of kRowBlock queries; with the plain causal mask a block
/// only needs keys [0, last row + 1), which skips about half of the work for long sequences.
constexpr int64_t kRowBlock = 64;

/// Keys a row block [i0, i1) can attend to: [0, key_end).
int64_t key_end(const AttentionParams& p, const Dims& dm, int64_t i1) {
  return (!p.attention_mask && p.causal) ? i1 : dm.sk;
}

/// Probabilities P [i1 - i0, kend] (leading dim kend) of query rows [i0, i1) against keys
/// [0, kend): softmax of the scaled, masked scores. Q is [s, d] (all rows), K [sk, d]. Writes
/// lse for the block rows when lse_out != nullptr, else normalizes with lse_in.
void probabilities(const float* Q, const float* K, const AttentionParams& p, const Dims& dm, int64_t bi, int64_t i0,
                   int64_t i1, int64_t kend, float* P, float* lse_out, const float* lse_in) {
  gemm_rm(false, true, i1 - i0, kend, dm.d, Q + i0 * dm.d, K, 0.0f, P);
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t i = i0; i < i1; ++i) {
    float* row = P + (i - i0) * kend;
    float mx = ninf;
    for (int64_t j = 0; j < kend; ++j) {
      row[j] = masked(p, dm, bi, i, j) ? ninf : row[j] * p.softmax_scale;
      mx = std::max(mx, row[j]);
    }
    float lse;
    if (lse_in) {
      lse = lse_in[i];
    } else if (mx == ninf) {
      lse = ninf;  // fully masked row: zero output
    } else {
      double sum = 0.0;
      for (int64_t j = 0; j < kend; ++j) sum += std::exp(row[j] - mx);
      lse = mx + static_cast<float>(std::log(sum));
    }
    if (lse_out) lse_out[i] = lse;
    for (int64_t j = 0; j < kend; ++j) row[j] = (lse == ninf || row[j] == ninf) ? 0.0f : std::exp(row[j] - lse);
  }
}

/// Makes OpenBLAS single-threaded while alive: the attention kernels call sgemm from inside
/// their own OpenMP loop over heads, and a multi-threaded BLAS there would oversubscribe the
/// cores (threads inside threads).
class SingleThreadedBlas {
 public:
  SingleThreadedBlas() : saved_(openblas_get_num_threads()) { openblas_set_num_threads(1); }
  ~SingleThreadedBlas() { openblas_set_num_threads(saved_); }

 private:
  int saved_;
};

/// Dropout keep-scale for element (bi, h, i, j): mask / (1 - p), from the counter-based stream.
/// Element (bi, h, i, j) of [b, np, s, sk] is number ((bi*np + h)*s + i)*sk + j of the stream.
/// Writes the keep-scale (mask / (1 - p)) of head (bi, h), rows [i0, i1), keys [0, kend) into
/// F [i1 - i0, kend]; element (i, j) is number ((bi*np + h)*s + i)*sk + j of the stream.
void dropout_factors(const AttentionParams& p, const Dims& dm, int64_t bi, int64_t h, int64_t i0, int64_t i1,
                     int64_t kend, float* F) {
  const uint64_t stream = dropout_stream(p.seed, p.offset);
  const float scale = 1.0f / (1.0f - p.dropout_p);
  for (int64_t i = i0; i < i1; ++i) {
    const uint64_t base = static_cast<uint64_t>(((bi * dm.np + h) * dm.s + i) * dm.sk);
    for (int64_t j = 0; j < kend; ++j)
      F[(i - i0) * kend + j] = dropout_uniform(stream, base + static_cast<uint64_t>(j)) >= p.dropout_p ? scale : 0.0f;
  }
}
}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, Tensor& out,
                       Tensor& lse) {
  if (p.kv_len) {  // keys [0, *kv_len) of the caches (ops.h): the same call on those rows
    MEGATRON_CHECK(p.kv_len->is_cpu() && p.kv_len->dtype() == DType::kInt64 && p.kv_len->numel() >= 1 &&
                   q.dim() == 4 && q.size(0) == 1 && !p.attention_mask && !p.causal && p.dropout_p == 0.0f)
        << "attention_forward: kv_len " << p.kv_len->str() << " needs s == 1, no mask, not causal, no dropout; q "
        << q.str();
    const int64_t n = p.kv_len->data<int64_t>()[0];
    MEGATRON_CHECK(n >= 1 && n <= k.size(0)) << "attention_forward: kv_len " << n << " outside [1, " << k.size(0) << "]";
    AttentionParams rows = p;
    rows.kv_len = nullptr;
    return cpu::attention_forward(q, k.narrow0(0, n), v.narrow0(0, n), rows, out, lse);
  }
  const Dims dm = check_dims(q, k, v, p);
  MEGATRON_CHECK(out.numel() == q.numel() && lse.numel() == dm.b * dm.np * dm.s && lse.dtype() == DType::kFloat32)
      << "attention_forward out " << out.str() << " lse " << lse.str();
  FloatIn fq(q), fk(k), fv(v);
  FloatOut fo(out);
  float* L = lse.data<float>();
  const int64_t heads_per_group = dm.np / dm.ng;
  SingleThreadedBlas single_threaded_blas;
  const bool parallel = dm.b * dm.np * dm.s * dm.sk * dm.d > (1 << 16);  // tiny problems: no thread wake-ups
#pragma omp parallel for schedule(dynamic) if (parallel)
  for (int64_t bh = 0; bh < dm.b * dm.np; ++bh) {
    const int64_t bi = bh / dm.np, h = bh % dm.np, g = h / heads_per_group;
    std::vector<float> Q(dm.s * dm.d), K(dm.sk * dm.d), V(dm.sk * dm.d), P(kRowBlock * dm.sk), F(kRowBlock * dm.sk),
        O(dm.s * dm.d);
    gather_head(fq.data(), dm, dm.np, dm.s, bi, h, Q.data());
    gather_head(fk.data(), dm, dm.ng, dm.sk, bi, g, K.data());
    gather_head(fv.data(), dm, dm.ng, dm.sk, bi, g, V.data());
    for (int64_t i0 = 0; i0 < dm.s; i0 += kRowBlock) {
      const int64_t i1 = std::min(dm.s, i0 + kRowBlock), kend = key_end(p, dm, i1), rows = i1 - i0;
      probabilities(Q.data(), K.data(), p, dm, bi, i0, i1, kend, P.data(), L + (bi * dm.np + h) * dm.s, nullptr);
      if (p.dropout_p > 0.0f) {
        dropout_factors(p, dm, bi, h, i0, i1, kend, F.data());
        for (int64_t e = 0; e < rows * kend; ++e) P[e] *= F[e];
      }
      gemm_rm(false, false, rows, dm.d, kend, P.data(), V.data(), 0.0f, O.data() + i0 * dm.d);
    }
    scatter_head(O.data(), dm, dm.np, dm.s, bi, h, fo.data(), false);
  }
  fo.commit();
}

void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const AttentionParams& p, Tensor& dq, Tensor& dk, Tensor& dv) {
  const Dims dm = check_dims(q, k, v, p);
  MEGATRON_CHECK(dout.numel() == q.numel() && dq.numel() == q.numel() && dk.numel() == k.numel() &&
                 dv.numel() == v.numel())
      << "attention_backward dout " << dout.str() << " dq " << dq.str() << " dk " << dk.str();
  FloatIn fq(q), fk(k), fv(v), fdo(dout), fo(out);
  FloatOut fdq(dq), fdk(dk), fdv(dv);
  for (int64_t i = 0; i < dk.numel(); ++i) fdk[i] = fdv[i] = 0.0f;
  const float* L = lse.data<float>();
  const int64_t heads_per_group = dm.np / dm.ng;
  // One task per (batch, K/V group): the heads of a group accumulate into the same dK/dV.
  SingleThreadedBlas single_threaded_blas;
  const bool parallel = dm.b * dm.np * dm.s * dm.sk * dm.d > (1 << 16);
#pragma omp parallel for schedule(dynamic) if (parallel)
  for (int64_t bg = 0; bg < dm.b * dm.ng; ++bg) {
    const int64_t bi = bg / dm.ng, g = bg % dm.ng;
    const int64_t blk = kRowBlock * dm.sk;
    std::vector<float> Q(dm.s * dm.d), K(dm.sk * dm.d), V(dm.sk * dm.d), dO(dm.s * dm.d), P(blk), Pd(blk), dP(blk),
        F(blk, 1.0f), dQ(dm.s * dm.d), dK(dm.sk * dm.d, 0.0f), dV(dm.sk * dm.d, 0.0f), O(dm.s * dm.d), D(dm.s);
    gather_head(fk.data(), dm, dm.ng, dm.sk, bi, g, K.data());
    gather_head(fv.data(), dm, dm.ng, dm.sk, bi, g, V.data());
    for (int64_t h = g * heads_per_group; h < (g + 1) * heads_per_group; ++h) {
      gather_head(fq.data(), dm, dm.np, dm.s, bi, h, Q.data());
      gather_head(fdo.data(), dm, dm.np, dm.s, bi, h, dO.data());
      // D_i = dO_i . O_i = sum_j P_ij dP_ij over ALL keys (also with dropout, since O = (P*F) V):
      // taken from `out` so that a call on a subset of the keys stays exact (ring attention).
      gather_head(fo.data(), dm, dm.np, dm.s, bi, h, O.data());
      for (int64_t i = 0; i < dm.s; ++i) {
        double acc = 0.0;
        for (int64_t c = 0; c < dm.d; ++c) acc += static_cast<double>(dO[i * dm.d + c]) * O[i * dm.d + c];
        D[i] = static_cast<float>(acc);
      }
      for (int64_t i0 = 0; i0 < dm.s; i0 += kRowBlock) {
        const int64_t i1 = std::min(dm.s, i0 + kRowBlock), kend = key_end(p, dm, i1), rows = i1 - i0;
        probabilities(Q.data(), K.data(), p, dm, bi, i0, i1, kend, P.data(), nullptr, L + (bi * dm.np + h) * dm.s);
        // Pd = dropout(P); dV += Pd^T dO; dPd = dO V^T; dP = dPd * dropout factor.
        if (p.dropout_p > 0.0f) dropout_factors(p, dm, bi, h, i0, i1, kend, F.data());
        for (int64_t e = 0; e < rows * kend; ++e) Pd[e] = P[e] * F[e];
        gemm_rm(true, false, kend, dm.d, rows, Pd.data(), dO.data() + i0 * dm.d, 1.0f, dV.data());
        gemm_rm(false, true, rows, kend, dm.d, dO.data() + i0 * dm.d, V.data(), 0.0f, dP.data());
        // dS = P * (dP - D), scaled by softmax_scale for the score -> Q/K chain.
        for (int64_t r = 0; r < rows; ++r) {
          float* dpr = dP.data() + r * kend;
          const float* pr = P.data() + r * kend;
          const float* fr = F.data() + r * kend;
          const float dsum = D[i0 + r];
          for (int64_t j = 0; j < kend; ++j) dpr[j] = pr[j] * (dpr[j] * fr[j] - dsum) * p.softmax_scale;
        }
        gemm_rm(false, false, rows, dm.d, kend, dP.data(), K.data(), 0.0f, dQ.data() + i0 * dm.d);
        gemm_rm(true, false, kend, dm.d, rows, dP.data(), Q.data() + i0 * dm.d, 1.0f, dK.data());
      }
      scatter_head(dQ.data(), dm, dm.np, dm.s, bi, h, fdq.data(), false);
    }
    scatter_head(dK.data(), dm, dm.ng, dm.sk, bi, g, fdk.data(), false);
    scatter_head(dV.data(), dm, dm.ng, dm.sk, bi, g, fdv.data(), false);
  }
  fdq.commit();
  fdk.commit();
  fdv.commit();
}

void kv_cache_write(const Tensor& k, const Tensor& v, const Tensor& offset, Tensor& k_cache, Tensor& v_cache) {
  MEGATRON_CHECK(k.dim() == 4 && k.size(0) == 1 && v.shape() == k.shape() && k_cache.dim() == 4 &&
                 v_cache.shape() == k_cache.shape() && k_cache.size(1) == k.size(1) && k_cache.size(2) == k.size(2) &&
                 k_cache.size(3) == k.size(3) && k.dtype() == v.dtype() && k_cache.dtype() == k.dtype() &&
                 v_cache.dtype() == k.dtype() && offset.is_cpu() && offset.dtype() == DType::kInt64 &&
                 offset.numel() >= 1)
      << "kv_cache_write: k " << k.str() << " v " << v.str() << " caches " << k_cache.str() << " offset "
      << offset.str();
  const int64_t pos = offset.data<int64_t>()[0];
  if (pos < 0 || pos >= k_cache.size(0)) return;
  Tensor ks = k_cache.narrow0(pos, 1), vs = v_cache.narrow0(pos, 1);
  ks.copy_(k);
  vs.copy_(v);
}

}  // namespace megatron::ops::cpu
