#include "megatron/core/tensor_parallel/mappings.h"

#include <cstring>

namespace megatron::tensor_parallel {

namespace {
int64_t first_dim(const Tensor& x) {
  MEGATRON_CHECK(x.dim() >= 1) << "mapping of a scalar " << x.str();
  return x.size(0);
}
}  // namespace

Tensor all_reduce_copy(const Tensor& x, ProcessGroup& g) {
  Tensor y = x.clone();
  if (g.size() > 1) g.all_reduce(y);
  return y;
}

Tensor gather_along_first_dim(const Tensor& x, ProcessGroup& g) {
  if (g.size() == 1) return x.clone();
  Shape s = x.shape();
  s[0] = first_dim(x) * g.size();
  Tensor out = Tensor::empty(s, x.dtype(), x.device());
  g.all_gather(x, out);
  return out;
}

Tensor reduce_scatter_along_first_dim(const Tensor& x, ProcessGroup& g) {
  if (g.size() == 1) return x.clone();
  const int64_t n = first_dim(x);
  if (n % g.size() != 0)
    user_error("sequence parallelism: dim 0 (sequence length ", n, ") is not divisible by the tensor-parallel size ",
               g.size());
  Shape s = x.shape();
  s[0] = n / g.size();
  Tensor out = Tensor::empty(s, x.dtype(), x.device());
  g.reduce_scatter(x, out);
  return out;
}

Tensor split_along_first_dim(const Tensor& x, ProcessGroup& g) {
  if (g.size() == 1) return x.clone();
  const int64_t n = first_dim(x);
  if (n % g.size() != 0)
    user_error("sequence parallelism: dim 0 (sequence length ", n, ") is not divisible by the tensor-parallel size ",
               g.size());
  return x.narrow0(g.rank() * (n / g.size()), n / g.size()).clone();
}

Tensor gather_along_last_dim(const Tensor& x, ProcessGroup& g) {
  if (g.size() == 1) return x.clone();
  const int T = g.size();
  const int64_t h = x.size(-1), rows = x.numel() / h;
  Tensor all = Tensor::empty({T * x.numel()}, x.dtype(), x.device());
  g.all_gather(x.view({x.numel()}), all);
  Tensor src = all.to(Device::cpu());
  Shape s = x.shape();
  s.back() = h * T;
  Tensor out = Tensor::empty(s, x.dtype());
  const size_t es = dtype_size(x.dtype());
  const char* A = static_cast<const char*>(src.data_ptr());
  char* O = static_cast<char*>(out.data_ptr());
  for (int r = 0; r < T; ++r)
    for (int64_t i = 0; i < rows; ++i) std::memcpy(O + (i * h * T + r * h) * es, A + (r * rows * h + i * h) * es, h * es);
  return out.to(x.device());
}

Tensor split_along_last_dim(const Tensor& x, ProcessGroup& g) {
  if (g.size() == 1) return x.clone();
  const int T = g.size();
  const int64_t H = x.size(-1);
  if (H % T != 0) user_error("last dimension ", H, " is not divisible by the tensor-parallel size ", T);
  const int64_t h = H / T, rows = x.numel() / H;
  Tensor src = x.to(Device::cpu());
  Shape s = x.shape();
  s.back() = h;
  Tensor out = Tensor::empty(s, x.dtype());
  const size_t es = dtype_size(x.dtype());
  for (int64_t i = 0; i < rows; ++i)
    std::memcpy(static_cast<char*>(out.data_ptr()) + i * h * es,
                static_cast<const char*>(src.data_ptr()) + (i * H + g.rank() * h) * es, h * es);
  return out.to(x.device());
}

}  // namespace megatron::tensor_parallel
