// CPU reference: scaled dot-product attention with grouped-query K/V, causal or explicit mask,
// attention dropout, fp32 softmax (Vaswani et al. 2017; GQA: Ainslie et al. 2023). Megatron's
// DotProductAttention computes softmax(scale * Q K^T + mask) V with dropout on the
// probabilities; this kernel does the same per (batch, head) with OpenBLAS GEMMs and keeps
// only the log-sum-exp for backward (the probabilities are recomputed, the dropout mask is
// regenerated from its counter-based stream).
#include <cblas.h>

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

/// Probabilities P [s, sk] (softmax of the scaled, masked scores) from Q [s, d], K [sk, d];
/// writes lse[s] when lse_out != nullptr, else uses lse_in to normalize.
void probabilities(const float* Q, const float* K, const AttentionParams& p, const Dims& dm, int64_t bi, float* P,
                   float* lse_out, const float* lse_in) {
  gemm_rm(false, true, dm.s, dm.sk, dm.d, Q, K, 0.0f, P);
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < dm.s; ++i) {
    float* row = P + i * dm.sk;
    float mx = ninf;
    for (int64_t j = 0; j < dm.sk; ++j) {
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
      for (int64_t j = 0; j < dm.sk; ++j) sum += std::exp(row[j] - mx);
      lse = mx + static_cast<float>(std::log(sum));
    }
    if (lse_out) lse_out[i] = lse;
    for (int64_t j = 0; j < dm.sk; ++j) row[j] = (lse == ninf || row[j] == ninf) ? 0.0f : std::exp(row[j] - lse);
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
/// Writes the keep-scale (mask / (1 - p)) of head (bi, h) into F [s, sk].
void dropout_factors(const AttentionParams& p, const Dims& dm, int64_t bi, int64_t h, float* F) {
  const uint64_t stream = dropout_stream(p.seed, p.offset);
  const float scale = 1.0f / (1.0f - p.dropout_p);
  const uint64_t base = static_cast<uint64_t>((bi * dm.np + h) * dm.s * dm.sk);
  for (int64_t e = 0; e < dm.s * dm.sk; ++e)
    F[e] = dropout_uniform(stream, base + static_cast<uint64_t>(e)) >= p.dropout_p ? scale : 0.0f;
}
}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, Tensor& out,
                       Tensor& lse) {
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
    std::vector<float> Q(dm.s * dm.d), K(dm.sk * dm.d), V(dm.sk * dm.d), P(dm.s * dm.sk), O(dm.s * dm.d);
    gather_head(fq.data(), dm, dm.np, dm.s, bi, h, Q.data());
    gather_head(fk.data(), dm, dm.ng, dm.sk, bi, g, K.data());
    gather_head(fv.data(), dm, dm.ng, dm.sk, bi, g, V.data());
    probabilities(Q.data(), K.data(), p, dm, bi, P.data(), L + (bi * dm.np + h) * dm.s, nullptr);
    if (p.dropout_p > 0.0f) {
      std::vector<float> F(dm.s * dm.sk);
      dropout_factors(p, dm, bi, h, F.data());
      for (int64_t e = 0; e < dm.s * dm.sk; ++e) P[e] *= F[e];
    }
    gemm_rm(false, false, dm.s, dm.d, dm.sk, P.data(), V.data(), 0.0f, O.data());
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
  FloatIn fq(q), fk(k), fv(v), fdo(dout);
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
    std::vector<float> Q(dm.s * dm.d), K(dm.sk * dm.d), V(dm.sk * dm.d), dO(dm.s * dm.d), P(dm.s * dm.sk),
        Pd(dm.s * dm.sk), dP(dm.s * dm.sk), F(dm.s * dm.sk, 1.0f), dQ(dm.s * dm.d), dK(dm.sk * dm.d, 0.0f), dV(dm.sk * dm.d, 0.0f);
    gather_head(fk.data(), dm, dm.ng, dm.sk, bi, g, K.data());
    gather_head(fv.data(), dm, dm.ng, dm.sk, bi, g, V.data());
    for (int64_t h = g * heads_per_group; h < (g + 1) * heads_per_group; ++h) {
      gather_head(fq.data(), dm, dm.np, dm.s, bi, h, Q.data());
      gather_head(fdo.data(), dm, dm.np, dm.s, bi, h, dO.data());
      probabilities(Q.data(), K.data(), p, dm, bi, P.data(), nullptr, L + (bi * dm.np + h) * dm.s);
      // Pd = dropout(P); dV += Pd^T dO; dPd = dO V^T; dP = dPd * dropout factor.
      if (p.dropout_p > 0.0f) dropout_factors(p, dm, bi, h, F.data());
      for (int64_t e = 0; e < dm.s * dm.sk; ++e) Pd[e] = P[e] * F[e];
      gemm_rm(true, false, dm.sk, dm.d, dm.s, Pd.data(), dO.data(), 1.0f, dV.data());
      gemm_rm(false, true, dm.s, dm.sk, dm.d, dO.data(), V.data(), 0.0f, dP.data());
      // dS = P * (dP - rowsum(P * dP)), scaled by softmax_scale for the score -> Q/K chain.
      for (int64_t i = 0; i < dm.s; ++i) {
        float* dpr = dP.data() + i * dm.sk;
        const float* pr = P.data() + i * dm.sk;
        double dsum = 0.0;
        for (int64_t j = 0; j < dm.sk; ++j) {
          dpr[j] *= F[i * dm.sk + j];
          dsum += static_cast<double>(pr[j]) * dpr[j];
        }
        for (int64_t j = 0; j < dm.sk; ++j) dpr[j] = pr[j] * (dpr[j] - static_cast<float>(dsum)) * p.softmax_scale;
      }
      gemm_rm(false, false, dm.s, dm.d, dm.sk, dP.data(), K.data(), 0.0f, dQ.data());
      gemm_rm(true, false, dm.sk, dm.d, dm.s, dP.data(), Q.data(), 1.0f, dK.data());
      scatter_head(dQ.data(), dm, dm.np, dm.s, bi, h, fdq.data(), false);
    }
    scatter_head(dK.data(), dm, dm.ng, dm.sk, bi, g, fdk.data(), false);
    scatter_head(dV.data(), dm, dm.ng, dm.sk, bi, g, fdv.data(), false);
  }
  fdq.commit();
  fdk.commit();
  fdv.commit();
}

}  // namespace megatron::ops::cpu
