#include "megatron/core/distributed/gather_params.h"

#include <cstring>

namespace megatron::distributed {

Tensor gather_tensor_parallel(const Parameter& p, const Tensor& local, comm::ProcessGroup& tp) {
  if (p.partition_dim < 0 || tp.size() == 1) return local.to(Device::cpu()).clone();
  const int T = tp.size();
  Tensor src = local.to(Device::cpu());
  Tensor all = Tensor::empty({T * src.numel()}, src.dtype());
  tp.all_gather(src.view({src.numel()}), all);
  const Shape& g = p.global_shape;
  const int d = p.partition_dim, s = p.partition_stride;
  MEGATRON_CHECK(d < static_cast<int>(g.size())) << p.name << " partition_dim " << d;
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < d; ++i) outer *= g[i];
  for (size_t i = d + 1; i < g.size(); ++i) inner *= g[i];
  const int64_t G = g[d], piece = G / (s * T), local_d = G / T;
  MEGATRON_CHECK(piece * s * T == G) << p.name << ": " << G << " not divisible by stride " << s << " x TP " << T;
  const size_t es = dtype_size(src.dtype());
  Tensor out = Tensor::empty(g, src.dtype());
  const char* A = static_cast<const char*>(all.data_ptr());
  char* O = static_cast<char*>(out.data_ptr());
  const int64_t local_numel = src.numel();
  for (int r = 0; r < T; ++r)
    for (int64_t o = 0; o < outer; ++o)
      for (int b = 0; b < s; ++b)
        for (int64_t k = 0; k < piece; ++k) {
          const int64_t l = b * piece + k;                     // index along d in the shard
          const int64_t gi = b * (G / s) + r * piece + k;      // index along d globally
          std::memcpy(O + ((o * G + gi) * inner) * es, A + (r * local_numel + (o * local_d + l) * inner) * es, inner * es);
        }
  return out;
}

}  // namespace megatron::distributed
