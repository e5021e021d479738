// Parameter initialization on the GPU equals the host draw (runs where a CUDA device is present,
// e.g. tests/gpu/tp2mem_check.sh; skipped on CPU-only machines). Reference: the host path of
// initialize_parameter (random.h), which the CPU tests check against the closed form.
// Tolerance: CUDA's double log/cos are within 1-2 ulp (CUDA math documentation), glibc's within
// 1 ulp, so the float result can differ by one fp32 ulp when the two round across a float
// boundary (probability ~1e-8 per element); after rounding to bf16 a difference is rarer still.
// Allowed: at most 1 element in 10^5 differing, each by at most one bf16 ulp (relative 2^-7).
#include <gtest/gtest.h>

#include <cmath>

#include "megatron/core/tensor_parallel/random.h"

namespace megatron {
namespace {

Parameter param(const std::string& name, Shape global, int pdim, int stride, int rank, int size,
                             Device dev) {
  Parameter p;
  p.name = name;
  p.global_shape = global;
  p.partition_dim = pdim;
  p.partition_stride = stride;
  p.tp_rank = rank;
  p.tp_size = size;
  p.init = InitKind::kNormal;
  p.init_std = 0.02f;
  Shape local = global;
  if (pdim >= 0) local[pdim] /= size;
  p.data = Tensor::empty(local, DType::kBFloat16, dev);
  return p;
}

TEST(DeviceInit, GpuDrawEqualsHostDraw) {
  if (!backend_available(DeviceType::kCUDA)) GTEST_SKIP() << "needs a CUDA device";
  struct Case {
    const char* name;
    Shape global;
    int pdim, stride, rank, size;
  } cases[] = {{"decoder.layers.0.mlp.linear_fc1.weight", {2 * 1792, 512}, 0, 2, 1, 2},  // SwiGLU fc1, TP rank 1
               {"decoder.layers.0.self_attention.linear_proj.weight", {512, 512}, 1, 1, 1, 2},
               {"embedding.word_embeddings.weight", {1000, 512}, 0, 1, 0, 1}};
  for (const auto& c : cases) {
    auto host = param(c.name, c.global, c.pdim, c.stride, c.rank, c.size, Device::cpu());
    auto dev = param(c.name, c.global, c.pdim, c.stride, c.rank, c.size, Device::cuda(0));
    tensor_parallel::initialize_parameter(host, 1234);
    tensor_parallel::initialize_parameter(dev, 1234);
    const auto a = host.data.to_float_vector(), b = dev.data.to_float_vector();
    ASSERT_EQ(a.size(), b.size());
    size_t differ = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i] == b[i]) continue;
      ++differ;
      EXPECT_LE(std::fabs(a[i] - b[i]), std::ldexp(std::fabs(a[i]), -7)) << c.name << " element " << i;
    }
    EXPECT_LE(differ, a.size() / 100000) << c.name << ": " << differ << " of " << a.size() << " elements differ";
  }
}

}  // namespace
}  // namespace megatron
