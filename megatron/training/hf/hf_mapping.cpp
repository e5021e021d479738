#include "megatron/training/hf/hf_mapping.h"

#include <cstring>

#include "megatron/core/utils/errors.h"

namespace megatron::hf {

namespace {
Shape with_rows(const Tensor& t, int64_t rows) {
  Shape s = t.shape();
  s[0] = rows;
  return s;
}
size_t row_bytes(const Tensor& t) { return t.size(0) == 0 ? 0 : t.nbytes() / static_cast<size_t>(t.size(0)); }
}  // namespace

Tensor cat_rows(const std::vector<Tensor>& parts) {
  MEGATRON_CHECK(!parts.empty()) << "cat_rows of nothing";
  int64_t rows = 0;
  for (const auto& p : parts) {
    MEGATRON_CHECK(p.dim() >= 1 && p.dtype() == parts[0].dtype() && p.dim() == parts[0].dim())
        << "cat_rows: " << p.str() << " vs " << parts[0].str();
    for (int64_t d = 1; d < p.dim(); ++d) MEGATRON_CHECK(p.size(d) == parts[0].size(d)) << "cat_rows: " << p.str() << " vs " << parts[0].str();
    rows += p.size(0);
  }
  Tensor out = Tensor::empty(with_rows(parts[0], rows), parts[0].dtype());
  auto* dst = static_cast<char*>(out.data_ptr());
  for (const auto& p : parts) {
    Tensor c = p.to(Device::cpu());
    if (c.nbytes()) std::memcpy(dst, c.data_ptr(), c.nbytes());
    dst += c.nbytes();
  }
  return out;
}

std::vector<Tensor> split_rows(const Tensor& t, const std::vector<int64_t>& rows) {
  int64_t total = 0;
  for (auto r : rows) total += r;
  MEGATRON_CHECK(t.dim() >= 1 && total == t.size(0)) << "split_rows " << t.str() << " into " << total << " rows";
  std::vector<Tensor> out;
  int64_t start = 0;
  for (auto r : rows) {
    out.push_back(t.narrow0(start, r).clone());
    start += r;
  }
  return out;
}

Tensor transpose2d(const Tensor& t) {
  MEGATRON_CHECK(t.dim() == 2) << "transpose2d of " << t.str();
  const int64_t a = t.size(0), b = t.size(1);
  const size_t es = dtype_size(t.dtype());
  Tensor c = t.to(Device::cpu());
  Tensor out = Tensor::empty({b, a}, t.dtype());
  const auto* src = static_cast<const char*>(c.data_ptr());
  auto* dst = static_cast<char*>(out.data_ptr());
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < b; ++j) std::memcpy(dst + (j * a + i) * es, src + (i * b + j) * es, es);
  return out;
}

Tensor qkv_to_megatron(const Tensor& q, const Tensor& k, const Tensor& v, int64_t nh, int64_t ng) {
  MEGATRON_CHECK(nh > 0 && ng > 0 && nh % ng == 0) << "heads " << nh << " groups " << ng;
  const int64_t d = q.size(0) / nh;
  MEGATRON_CHECK(q.size(0) == nh * d && k.size(0) == ng * d && v.size(0) == ng * d)
      << "q " << q.str() << " k " << k.str() << " v " << v.str() << " heads " << nh << " groups " << ng;
  const int64_t per = nh / ng;
  std::vector<Tensor> parts;
  for (int64_t g = 0; g < ng; ++g) {
    parts.push_back(q.narrow0(g * per * d, per * d));
    parts.push_back(k.narrow0(g * d, d));
    parts.push_back(v.narrow0(g * d, d));
  }
  return cat_rows(parts);
}

std::array<Tensor, 3> qkv_from_megatron(const Tensor& qkv, int64_t nh, int64_t ng) {
  MEGATRON_CHECK(nh > 0 && ng > 0 && nh % ng == 0) << "heads " << nh << " groups " << ng;
  const int64_t d = qkv.size(0) / (nh + 2 * ng);
  MEGATRON_CHECK(qkv.size(0) == (nh + 2 * ng) * d) << "qkv " << qkv.str() << " heads " << nh << " groups " << ng;
  const int64_t per = nh / ng;
  std::vector<Tensor> qs, ks, vs;
  for (int64_t g = 0; g < ng; ++g) {
    const int64_t base = g * (per + 2) * d;
    qs.push_back(qkv.narrow0(base, per * d));
    ks.push_back(qkv.narrow0(base + per * d, d));
    vs.push_back(qkv.narrow0(base + (per + 1) * d, d));
  }
  return {cat_rows(qs), cat_rows(ks), cat_rows(vs)};
}

Tensor fc1_to_megatron(const Tensor& gate, const Tensor& up) { return cat_rows({gate, up}); }

std::array<Tensor, 2> fc1_from_megatron(const Tensor& fc1) {
  MEGATRON_CHECK(fc1.size(0) % 2 == 0) << "fc1 " << fc1.str();
  auto p = split_rows(fc1, {fc1.size(0) / 2, fc1.size(0) / 2});
  return {p[0], p[1]};
}

Tensor gpt2_c_attn_to_megatron(const Tensor& c_attn, int64_t nh) {
  Tensor rows = c_attn.dim() == 2 ? transpose2d(c_attn) : c_attn;  // [3h, h] or [3h]
  MEGATRON_CHECK(rows.size(0) % 3 == 0) << "c_attn " << c_attn.str();
  const int64_t h = rows.size(0) / 3;
  auto qkv = split_rows(rows, {h, h, h});
  return qkv_to_megatron(qkv[0], qkv[1], qkv[2], nh, nh);
}

Tensor gpt2_c_attn_from_megatron(const Tensor& qkv, int64_t nh) {
  auto p = qkv_from_megatron(qkv, nh, nh);
  Tensor rows = cat_rows({p[0], p[1], p[2]});
  return rows.dim() == 2 ? transpose2d(rows) : rows;
}

Tensor resize_rows(const Tensor& t, int64_t rows) {
  Tensor out = Tensor::zeros(with_rows(t, rows), t.dtype());
  const int64_t n = std::min(rows, t.size(0));
  Tensor c = t.to(Device::cpu());
  if (n > 0) std::memcpy(out.data_ptr(), c.data_ptr(), static_cast<size_t>(n) * row_bytes(c));
  return out;
}

}  // namespace megatron::hf
