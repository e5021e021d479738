#include "megatron/core/tensor_parallel/random.h"

#include <algorithm>
#include <cstdlib>
#include <thread>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <cmath>
#include <vector>

namespace megatron::tensor_parallel {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t hash_name(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

float normal_at(uint64_t key, uint64_t index) {
  const uint64_t a = splitmix64(key ^ splitmix64(2 * index));
  const uint64_t b = splitmix64(key ^ splitmix64(2 * index + 1));
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;          // [0, 1)
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

int64_t global_index_of(const transformer::Parameter& p, const Shape& local_shape, int64_t local_index) {
  const auto& g = p.global_shape;
  const int64_t nd = static_cast<int64_t>(g.size());
  // Decompose the local flat index (row-major), map the partitioned coordinate, recompose.
  std::vector<int64_t> idx(static_cast<size_t>(nd));
  int64_t rem = local_index;
  for (int64_t d = nd - 1; d >= 0; --d) {
    idx[d] = rem % local_shape[d];
    rem /= local_shape[d];
  }
  if (p.partition_dim >= 0) {
    const int64_t pd = p.partition_dim, stride = p.partition_stride;
    const int64_t block = local_shape[pd] / stride;
    const int64_t blk = idx[pd] / block, within = idx[pd] % block;
    idx[pd] = blk * (g[pd] / stride) + p.tp_rank * block + within;
  }
  int64_t flat = 0;
  for (int64_t d = 0; d < nd; ++d) flat = flat * g[d] + idx[d];
  return flat;
}

namespace {
// Threads for the one-time host-side initialization: at least the cores this process would get
// if the node's cores were split evenly over its local ranks. Launchers (torchrun,
// megatron_launch) set OMP_NUM_THREADS=1, which is right for training on CPU with one rank per
// core but made a GPU rank initialize LLaMA-3-8B's weights on a single thread (minutes); with two
// ranks on 32 cores each now uses 16. Values do not depend on the thread count.
int init_threads() {
  int local = 1;
  for (const char* n : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"}) {
    if (const char* v = std::getenv(n)) {
      local = std::max(1, std::atoi(v));
      break;
    }
  }
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
#ifdef _OPENMP
  return std::max(omp_get_max_threads(), std::max(1, cores / local));
#else
  return std::max(1, cores / local);
#endif
}
}  // namespace

void initialize_parameter(transformer::Parameter& p, uint64_t seed) {
  const int64_t n = p.data.numel();
  std::vector<float> v(static_cast<size_t>(n));
  switch (p.init) {
    case transformer::InitKind::kZeros: std::fill(v.begin(), v.end(), 0.0f); break;
    case transformer::InitKind::kOnes: std::fill(v.begin(), v.end(), 1.0f); break;
    case transformer::InitKind::kNormal: {
      const uint64_t key = splitmix64(seed ^ hash_name(p.init_key.empty() ? p.name : p.init_key));
      const Shape& ls = p.data.shape();
      // Unpartitioned (or TP = 1): the global index is the local one, no per-element index
      // arithmetic. Every element is a pure function of (key, index), so the threads give the
      // same values as one thread (LLaMA-3-8B-sized layers: minutes -> seconds).
      const bool identity = ls == p.global_shape && (p.partition_dim < 0 || p.tp_rank == 0);
      const float std_ = p.init_std;
#pragma omp parallel for schedule(static) num_threads(init_threads()) if (n > 65536)
      for (int64_t i = 0; i < n; ++i)
        v[i] = std_ * normal_at(key, static_cast<uint64_t>(identity ? i : global_index_of(p, ls, i)));
      break;
    }
  }
  Tensor host = Tensor::empty(p.data.shape(), p.data.dtype());
  cpu_convert_from_float(v.data(), host.data_ptr(), host.dtype(), n);
  p.data.copy_(host);
}

}  // namespace megatron::tensor_parallel
