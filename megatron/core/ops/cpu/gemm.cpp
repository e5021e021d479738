// CPU reference: GEMM through OpenBLAS sgemm (fp32; reduced-precision operands are widened to
// fp32 first and the result rounded to C's dtype), and the linear layer built on it.
#include <cblas.h>

#include <vector>

#include "megatron/core/ops/cpu/cpu_ops.h"
#include "megatron/core/ops/cpu/cpu_util.h"
#include "megatron/core/ops/grouped_gemm.h"

namespace megatron::ops::cpu {

namespace {
/// Row-major sgemm: C[m,n] = alpha op(A) op(B) + beta C with leading dims from the shapes.
void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, const float* b, float beta,
           float* c) {
  if (m == 0 || n == 0) return;
  const int64_t lda = ta ? m : k, ldb = tb ? k : n;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta, c,
              static_cast<int>(n));
}
/// 2-D shape of t with leading dims folded: [numel / last, last].
std::pair<int64_t, int64_t> as2d(const Tensor& t) { return {rows_of(t), t.dim() == 0 ? 1 : t.size(-1)}; }
}  // namespace

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha, float beta) {
  auto [ar, ac] = as2d(a);
  auto [br, bc] = as2d(b);
  auto [cr, cc] = as2d(c);
  const int64_t m = trans_a ? ac : ar, k = trans_a ? ar : ac;
  const int64_t kb = trans_b ? bc : br, n = trans_b ? br : bc;
  MEGATRON_CHECK(k == kb && cr == m && cc == n && a.dtype() == b.dtype())
      << "gemm " << a.str() << (trans_a ? "^T" : "") << " @ " << b.str() << (trans_b ? "^T" : "") << " -> " << c.str();
  FloatIn fa(a), fb(b);
  FloatOut fc(c, /*load=*/beta != 0.0f);
  if (k == 0) {
    for (int64_t i = 0; i < m * n; ++i) fc[i] *= beta;
  } else {
    sgemm(trans_a, trans_b, m, n, k, alpha, fa.data(), fb.data(), beta, fc.data());
  }
  fc.commit();
}

void linear_forward(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  MEGATRON_CHECK(w.dim() == 2 && x.size(-1) == w.size(1) && y.size(-1) == w.size(0) && rows_of(x) == rows_of(y))
      << "linear_forward x " << x.str() << " w " << w.str() << " y " << y.str();
  const int64_t n = rows_of(x), in = w.size(1), out = w.size(0);
  FloatIn fx(x), fw(w);
  FloatOut fy(y);
  if (bias) {
    MEGATRON_CHECK(bias->numel() == out) << "linear_forward bias " << bias->str() << " for w " << w.str();
    FloatIn fb(*bias);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < out; ++j) fy[r * out + j] = fb[j];
  }
  if (in == 0) {
    if (!bias) for (int64_t i = 0; i < n * out; ++i) fy[i] = 0.0f;
  } else {
    sgemm(false, true, n, out, in, 1.0f, fx.data(), fw.data(), bias ? 1.0f : 0.0f, fy.data());
  }
  fy.commit();
}

void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx, Tensor* dw, Tensor* dbias,
                     bool accumulate) {
  const int64_t n = rows_of(x), in = w.size(1), out = w.size(0);
  MEGATRON_CHECK(w.dim() == 2 && x.size(-1) == in && dy.size(-1) == out && rows_of(dy) == n)
      << "linear_backward dy " << dy.str() << " x " << x.str() << " w " << w.str();
  FloatIn fdy(dy);
  if (dx) {
    MEGATRON_CHECK(dx->numel() == x.numel()) << "linear_backward dx " << dx->str() << " for x " << x.str();
    FloatIn fw(w);
    FloatOut fdx(*dx);
    sgemm(false, false, n, in, out, 1.0f, fdy.data(), fw.data(), 0.0f, fdx.data());
    fdx.commit();
  }
  if (dw) {
    MEGATRON_CHECK(dw->numel() == w.numel()) << "linear_backward dw " << dw->str() << " for w " << w.str();
    FloatIn fx(x);
    FloatOut fdw(*dw, accumulate);
    sgemm(true, false, out, in, n, 1.0f, fdy.data(), fx.data(), accumulate ? 1.0f : 0.0f, fdw.data());
    fdw.commit();
  }
  if (dbias) {
    MEGATRON_CHECK(dbias->numel() == out) << "linear_backward dbias " << dbias->str();
    FloatOut fdb(*dbias, accumulate);
    std::vector<double> s(static_cast<size_t>(out), 0.0);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < out; ++j) s[j] += fdy[r * out + j];
    for (int64_t j = 0; j < out; ++j) fdb[j] = static_cast<float>((accumulate ? fdb[j] : 0.0f) + s[j]);
    fdb.commit();
  }
}

void grouped_linear_forward(const Tensor& x, const std::vector<Tensor>& ws, const std::vector<int64_t>& counts,
                            Tensor& y) {
  check_grouped_forward(x, ws, counts, y);
  per_expert_forward(x, ws, counts, y, linear_forward);
}

void grouped_linear_backward(const Tensor& dy, const Tensor& x, const std::vector<Tensor>& ws,
                             const std::vector<int64_t>& counts, Tensor* dx, std::vector<Tensor>* dws, bool accumulate) {
  check_grouped_linear("grouped_linear_backward", x, ws, counts);
  MEGATRON_CHECK(!dws || dws->size() == ws.size()) << "grouped_linear_backward: " << dws->size() << " weight grads";
  for (size_t e = 0; dws && !accumulate && e < ws.size(); ++e)
    if (counts[e] == 0) fill((*dws)[e], 0.0f);
  for_each_expert_rows(counts, [&](size_t e, int64_t off, int64_t n) {
    Tensor dxe = dx ? dx->narrow0(off, n) : Tensor();
    linear_backward(dy.narrow0(off, n), x.narrow0(off, n), ws[e], dx ? &dxe : nullptr, dws ? &(*dws)[e] : nullptr,
                    nullptr, accumulate);
  });
}

}  // namespace megatron::ops::cpu

namespace megatron::ops::cpu {

void row_dot_f64(const Tensor& a, const Tensor& b, Tensor& out) {
  const int64_t h = a.dim() ? a.size(-1) : 1, n = h ? a.numel() / h : 0;
  MEGATRON_CHECK(a.shape() == b.shape() && a.dtype() == b.dtype() && out.dtype() == DType::kFloat64 &&
                 out.numel() == n)
      << "row_dot_f64 " << a.str() << " vs " << b.str() << " -> " << out.str();
  FloatIn x(a), y(b);
  double* o = out.data<double>();
#pragma omp parallel for schedule(static) if (n * h > 16384)
  for (int64_t r = 0; r < n; ++r) {
    double s = 0.0;
    for (int64_t j = 0; j < h; ++j) s += static_cast<double>(x[r * h + j]) * static_cast<double>(y[r * h + j]);
    o[r] = s;
  }
}

}  // namespace megatron::ops::cpu
