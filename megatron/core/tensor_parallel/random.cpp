#include "megatron/core/tensor_parallel/random.h"

#include <algorithm>
#include <cstdlib>
#include <thread>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <cmath>
#include <vector>

#include "megatron/core/ops/ops.h"

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

namespace {
// global_index_of without heap allocation (hot loop of the host initialization; up to 8 dims).
inline int64_t global_index_fast(const Parameter& p, const Shape& ls, int64_t local_index) {
  const auto& g = p.global_shape;
  const int64_t nd = static_cast<int64_t>(g.size());
  int64_t idx[8];
  int64_t rem = local_index;
  for (int64_t d = nd - 1; d >= 0; --d) {
    idx[d] = rem % ls[d];
    rem /= ls[d];
  }
  if (p.partition_dim >= 0) {
    const int64_t pd = p.partition_dim, stride = p.partition_stride;
    const int64_t block = ls[pd] / stride;
    const int64_t blk = idx[pd] / block, within = idx[pd] % block;
    idx[pd] = blk * (g[pd] / stride) + p.tp_rank * block + within;
  }
  int64_t flat = 0;
  for (int64_t d = 0; d < nd; ++d) flat = flat * g[d] + idx[d];
  return flat;
}
bool g_use_cpu_init = false;
}  // namespace

void set_use_cpu_initialization(bool on) { g_use_cpu_init = on; }

int64_t global_index_of(const Parameter& p, const Shape& local_shape, int64_t local_index) {
  MEGATRON_CHECK(p.global_shape.size() == local_shape.size() && local_shape.size() <= 8)
      << "global_index_of: shapes " << shape_str(p.global_shape) << " / " << shape_str(local_shape);
  return global_index_fast(p, local_shape, local_index);
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

void initialize_parameter(Parameter& p, uint64_t seed) {
  const int64_t n = p.data.numel();
  const Shape& ls = p.data.shape();
  if (p.init == InitKind::kNormal) {
    const uint64_t key = splitmix64(seed ^ hash_name(p.init_key.empty() ? p.name : p.init_key));
    // Unpartitioned (or TP = 1): the global index is the local one.
    const bool identity = ls == p.global_shape && (p.partition_dim < 0 || p.tp_rank == 0);
    // Drawn by the tensor's backend where it can (ops::normal_init: CUDA), else on the host below.
    if (!g_use_cpu_init && ls.size() <= NormalInitSpec::kMaxDims &&
        p.global_shape.size() == ls.size()) {
      NormalInitSpec s;
      s.key = key;
      s.std = p.init_std;
      s.nd = static_cast<int>(ls.size());
      for (int d = 0; d < s.nd; ++d) s.local[d] = ls[d], s.global[d] = p.global_shape[d];
      s.partition_dim = identity ? -1 : p.partition_dim;
      s.stride = p.partition_stride;
      s.tp_rank = p.tp_rank;
      if (ops::normal_init(p.data, s)) return;
    }
    MEGATRON_CHECK(p.global_shape.size() == ls.size() && ls.size() <= 8)
        << p.name << ": shapes " << shape_str(p.global_shape) << " / " << shape_str(ls);
    // Host: every element is a pure function of (key, global index), so the threads give the
    // same values as one thread; each thread also rounds its elements to the dtype, straight
    // into the parameter (CPU) or into a host staging tensor (device, then one copy).
    Tensor host = p.data.is_cpu() ? p.data : Tensor::empty(ls, p.data.dtype());
    char* out = static_cast<char*>(host.data_ptr());
    const DType dt = host.dtype();
    const size_t es = dtype_size(dt);
    const float std_ = p.init_std;
    constexpr int64_t kChunk = 4096;
    const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) num_threads(init_threads()) if (n > 65536)
    for (int64_t c = 0; c < chunks; ++c) {
      float buf[kChunk];
      const int64_t lo = c * kChunk, len = std::min(kChunk, n - lo);
      for (int64_t j = 0; j < len; ++j) {
        const int64_t i = lo + j;
        buf[j] = std_ * normal_at(key, static_cast<uint64_t>(identity ? i : global_index_fast(p, ls, i)));
      }
      cpu_convert_from_float(buf, out + static_cast<size_t>(lo) * es, dt, len);
    }
    if (!p.data.is_cpu()) p.data.copy_(host);
    return;
  }
  // Zeros / ones (biases, norm weights: small).
  if (p.init == InitKind::kZeros) {
    p.data.zero_();
    return;
  }
  std::vector<float> v(static_cast<size_t>(n), 1.0f);
  Tensor host = Tensor::empty(ls, p.data.dtype());
  cpu_convert_from_float(v.data(), host.data_ptr(), host.dtype(), n);
  p.data.copy_(host);
}

}  // namespace megatron::tensor_parallel
