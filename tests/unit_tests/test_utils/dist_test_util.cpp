#include "test_utils/dist_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

#include "megatron/core/comm/init_process_group.h"
#include "megatron/core/comm/mpi/mpi_process_group.h"

namespace megatron::testing {

std::shared_ptr<comm::ProcessGroup> dist_world() {
  static std::shared_ptr<comm::ProcessGroup> w = [] {
    comm::InitOptions o;
    const char* t = std::getenv("MEGATRON_TEST_DIST_TIMEOUT_S");
    o.timeout = std::chrono::milliseconds(static_cast<int64_t>((t ? std::atof(t) : 120.0) * 1000));
    const char* b = std::getenv("MEGATRON_TEST_DIST_BACKEND");
    if (b) o.backend = b;
    return comm::init_process_group(o);
  }();
  return w;
}

datasets::GPTBatch random_gpt_batch(uint32_t seed, int64_t b, int64_t s, int64_t vocab) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int64_t> tok(0, vocab - 1);
  std::vector<int64_t> t(b * s), l(b * s), pos(b * s);
  for (int64_t i = 0; i < b * s; ++i) t[i] = tok(gen), l[i] = tok(gen), pos[i] = i % s;
  datasets::GPTBatch x;
  x.tokens = Tensor::from_vector_i64(t, {b, s});
  x.labels = Tensor::from_vector_i64(l, {b, s});
  x.position_ids = Tensor::from_vector_i64(pos, {b, s});
  x.loss_mask = Tensor::from_vector(std::vector<float>(b * s, 1.f), {b, s});
  return x;
}

void sgd_step(Tensor& p, const Tensor& g) {
  float* P = p.data<float>();
  const float* G = g.data<float>();
  for (int64_t i = 0; i < p.numel(); ++i) P[i] -= 0.1f * G[i];
}

double max_rel_err(const Tensor& a, const Tensor& ref) {
  auto x = a.to_float_vector(), y = ref.to_float_vector();
  double e = 0, m = 0;
  for (size_t i = 0; i < y.size(); ++i)
    e = std::max(e, double(std::fabs(x[i] - y[i]))), m = std::max(m, double(std::fabs(y[i])));
  return m > 0 ? e / m : e;
}

}  // namespace megatron::testing
