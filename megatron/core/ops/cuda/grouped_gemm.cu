// Grouped GEMM of the routed experts on CUDA (op_table.h grouped_linear_forward / _backward;
// docs/moe.md "Kernels"): all local experts' GEMMs of one kind (fc forward, dgrad or wgrad) either
// in ONE cublasGemmGroupedBatchedEx_64 call (bf16/fp16 in and out, fp32 compute; one group per
// expert with tokens, since every expert has its own row count) or as the per-expert loop of
// linear_forward / linear_backward on cuBLASLt. The path is chosen per call by
// choose_grouped_gemm_path (grouped_gemm.h, where the measurements behind the rule are): grouped
// when the mean per-expert GEMM is small (below 10 GFLOP: many small experts, where the loop's
// per-GEMM cost dominates), the loop for large experts (each cuBLASLt GEMM fills the GPU and runs
// at twice the grouped kernel's rate), for the wgrad into fp32 main grads (cuBLAS's grouped GEMM
// has no bf16 -> fp32 entry), for float32 and for a single expert with tokens.
// MEGATRON_MOE_GROUPED_GEMM=1 / 0 forces either path (A/B runs, bench/gpu/gpu_bench moe); a type
// pair cuBLAS still refuses falls back to the loop with a one-time stderr line. Row-major products
// are issued as their column-major transposes (as gemm.cu does). Everything runs on current_stream(),
// except that the loop spreads its experts over MEGATRON_MOE_GEMM_STREAMS streams (unset: 4 for
// small per-expert GEMMs, 1 for large ones, ops/grouped_gemm.h moe_gemm_streams_for): lane 0 is the current stream, lanes 1.. are side
// streams forked from it with an event before the first GEMM and joined back with one event each
// after the last, so the caller sees one stream-ordered op. Experts write disjoint rows of dx / y
// and their own dw, so the results are bitwise those of the serial loop (same cuBLASLt plan per
// shape, whichever stream). Each side stream has its own cuBLASLt workspace
// (cublaslt_common.h add_stream_workspace). No memory is allocated or freed on a side stream by
// the plain GEMMs the loop issues; any that were (a kernel's temporary) would be stream-ordered on
// it by the allocator (cudaMallocAsync on current_stream()) and freed there before the join, and
// memory the caller frees afterwards on the compute stream is ordered behind the join.
#include <cublas_v2.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>
#include <vector>

#include "megatron/core/ops/cuda/cublaslt_common.h"
#include "megatron/core/ops/cuda/cuda_common.cuh"
#include "megatron/core/ops/cuda/cuda_ops.h"
#include "megatron/core/ops/cuda/expert_lanes.h"
#include "megatron/core/ops/grouped_gemm.h"

#define CUBLAS_CHECK MEGATRON_CUBLAS_CHECK

namespace megatron::ops::cuda {
namespace {

cublasHandle_t blas_handle() {
  static std::mutex mu;
  static std::map<int, cublasHandle_t> handles;
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> g(mu);
  auto it = handles.find(dev);
  if (it != handles.end()) return it->second;
  cublasHandle_t h = nullptr;
  CUBLAS_CHECK(cublasCreate(&h));  // lives for the process, like gemm.cu's cuBLASLt handle
  handles[dev] = h;
  return h;
}

// One column-major problem C[m, n] = op(A) op(B) + beta C (lda/ldb/ldc in elements).
struct Problem {
  bool ta, tb;
  int64_t m, n, k;
  const void* a;
  int64_t lda;
  const void* b;
  int64_t ldb;
  void* c;
  int64_t ldc;
};

// Calls per GEMM kind (0 forward, 1 dgrad, 2 wgrad) and path, for grouped_gemm_path_counts.
std::atomic<int64_t> g_grouped_calls[3], g_loop_calls[3];

std::mutex g_unsupported_mu;
std::set<std::tuple<int, int>> g_unsupported;  // (input dtype, output dtype) cuBLAS refused

// One cublasGemmGroupedBatchedEx_64 call of `ps` (alpha 1, the given beta; at least 2 problems,
// bf16/fp16 inputs). Returns false, launching nothing, when cuBLAS refuses the type pair (then
// remembered: later calls of that pair loop without asking).
bool run_grouped_cublas(const std::vector<Problem>& ps, DType ab, DType ct, float beta) {
  const std::tuple<int, int> combo{(int)ab, (int)ct};
  {
    std::lock_guard<std::mutex> g(g_unsupported_mu);
    if (g_unsupported.count(combo)) return false;
  }
  const size_t G = ps.size();
  std::vector<cublasOperation_t> ta(G), tb(G);
  std::vector<int64_t> m(G), n(G), k(G), lda(G), ldb(G), ldc(G), group_size(G, 1);
  std::vector<float> alpha(G, 1.0f), betas(G, beta);
  std::vector<int64_t> ptrs(3 * G);  // device addresses
  for (size_t i = 0; i < G; ++i) {
    const Problem& p = ps[i];
    ta[i] = p.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    tb[i] = p.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    m[i] = p.m, n[i] = p.n, k[i] = p.k, lda[i] = p.lda, ldb[i] = p.ldb, ldc[i] = p.ldc;
    ptrs[i] = reinterpret_cast<int64_t>(p.a), ptrs[G + i] = reinterpret_cast<int64_t>(p.b),
    ptrs[2 * G + i] = reinterpret_cast<int64_t>(p.c);
  }
  // The pointer arrays live in device memory (cuBLAS reads them in the kernel): one host-to-device
  // copy through the allocator's pinned staging block, ordered on the stream, no host sync.
  cudaStream_t st = megatron::cuda::current_stream();
  Tensor dptrs = Tensor::from_vector_i64(ptrs, {static_cast<int64_t>(3 * G)}).to(Device::cuda());
  auto* dp = static_cast<void**>(dptrs.data_ptr());
  cublasHandle_t h = blas_handle();
  CUBLAS_CHECK(cublasSetStream(h, st));
  const cublasStatus_t s = cublasGemmGroupedBatchedEx_64(
      h, ta.data(), tb.data(), m.data(), n.data(), k.data(), alpha.data(), const_cast<const void* const*>(dp),
      lt::cuda_type(ab), lda.data(), const_cast<const void* const*>(dp + G), lt::cuda_type(ab), ldb.data(), betas.data(),
      dp + 2 * G, lt::cuda_type(ct), ldc.data(), static_cast<int64_t>(G), group_size.data(), CUBLAS_COMPUTE_32F);
  if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE) {
    std::lock_guard<std::mutex> g(g_unsupported_mu);
    if (g_unsupported.insert(combo).second)  // once per type pair: say which path runs
      std::fprintf(stderr, "grouped_linear: cublasGemmGroupedBatchedEx refused %s -> %s (status %d); "
                   "the per-expert cuBLASLt loop runs instead\n", dtype_name(ab), dtype_name(ct), (int)s);
    return false;
  }
  CUBLAS_CHECK(s);
  return true;
}

// Runs `ps` (GEMM kind `kind`, 0 forward, 1 dgrad, 2 wgrad) as one cublasGemmGroupedBatchedEx_64
// call (alpha 1, the given beta) when choose_grouped_gemm_path picks the grouped path and cuBLAS
// takes the types. Returns false (nothing launched) otherwise; the caller then loops.
// 2 m n k summed over the problems of one grouped call (the FLOPs both path rules read).
double total_flops(const std::vector<Problem>& ps) {
  double flops = 0;
  for (const Problem& p : ps) flops += 2.0 * static_cast<double>(p.m) * static_cast<double>(p.n) * static_cast<double>(p.k);
  return flops;
}

bool run_grouped(int kind, const std::vector<Problem>& ps, DType ab, DType ct, float beta) {
  const double flops = total_flops(ps);
  // MEGATRON_MOE_GROUPED_GEMM is read at every call so that one process (gpu_bench moe) can time both paths.
  const GroupedGemmPath path = choose_grouped_gemm_path(parse_grouped_gemm_mode(std::getenv("MEGATRON_MOE_GROUPED_GEMM")),
                                                        ab, ct, static_cast<int64_t>(ps.size()), flops);
  const bool ran = path == GroupedGemmPath::kGrouped && run_grouped_cublas(ps, ab, ct, beta);
  (ran ? g_grouped_calls : g_loop_calls)[kind].fetch_add(1, std::memory_order_relaxed);
  return ran;
}

// The side streams of the per-expert loop of one thread on one device for compute streams of one
// priority: non-blocking (they never wait for the legacy default stream's other work, nor it for
// theirs: the fork / join events are the only ordering), of the compute stream's priority (the
// overlapped optimizer step's low-priority stream must not get ahead of the experts' GEMMs), each
// with its own cuBLASLt workspace. Created on first use, grown on demand, kept for the process.
struct Lanes {
  std::vector<cudaStream_t> side;    // lanes 1..
  std::vector<cudaEvent_t> joined;   // one per side stream, recorded behind its last GEMM
  cudaEvent_t forked = nullptr;      // recorded on the compute stream before the first GEMM
};

Lanes& lanes_for(int dev, int priority, int n_side) {
  static std::mutex mu;
  static std::map<std::tuple<std::thread::id, int, int>, Lanes*> all;
  std::lock_guard<std::mutex> g(mu);
  Lanes*& l = all[{std::this_thread::get_id(), dev, priority}];
  if (!l) {
    l = new Lanes();  // lives for the process, like the cuBLASLt handle
    CUDA_CHECK(cudaEventCreateWithFlags(&l->forked, cudaEventDisableTiming));
  }
  while (static_cast<int>(l->side.size()) < n_side) {
    cudaStream_t s = nullptr;
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority));
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    lt::add_stream_workspace(dev, s);
    l->side.push_back(s);
    l->joined.push_back(e);
  }
  return *l;
}

std::mutex g_lane_mu;
ExpertLaneCounts g_lane_counts;

// for_each_expert_rows(counts, fn) with expert e's work issued on lane assign_expert_lanes(counts,
// S)[e] (ops/grouped_gemm.h; S = moe_gemm_streams_for(MEGATRON_MOE_GEMM_STREAMS, the call's FLOPs), at most the number of experts with
// rows): fn runs with current_stream() set to its lane's stream; the side lanes wait for the
// compute stream's work so far before their first GEMM, and the compute stream waits for every
// side lane after the last (also when fn throws). The variable is read at every call, so that one
// process (gpu_bench moe, gpu_ops_test) can compare stream counts.
template <class Fn>
void for_each_expert_on_lanes(const std::vector<int64_t>& counts, const std::vector<Problem>& ps, Fn&& fn) {
  int busy = 0;
  for (int64_t c : counts) busy += c > 0;
  const int lanes = std::min(
      moe_gemm_streams_for(std::getenv("MEGATRON_MOE_GEMM_STREAMS"), total_flops(ps), static_cast<int64_t>(ps.size())),
      busy);
  {
    std::lock_guard<std::mutex> g(g_lane_mu);
    if (lanes > 1) {
      ++g_lane_counts.forked;
      g_lane_counts.max_lanes = std::max(g_lane_counts.max_lanes, lanes);
    } else {
      ++g_lane_counts.serial;
    }
  }
  if (lanes <= 1) {
    for_each_expert_rows(counts, fn);
    return;
  }
  const cudaStream_t main = megatron::cuda::current_stream();
  int dev = 0, priority = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  if (main) CUDA_CHECK(cudaStreamGetPriority(main, &priority));  // the legacy stream: priority 0
  Lanes& l = lanes_for(dev, priority, lanes - 1);
  const std::vector<int> lane = assign_expert_lanes(counts, lanes);
  CUDA_CHECK(cudaEventRecord(l.forked, main));
  for (int i = 0; i + 1 < lanes; ++i) CUDA_CHECK(cudaStreamWaitEvent(l.side[i], l.forked, 0));
  struct Join {  // back on the compute stream, behind every side lane (no throw: also on unwinding)
    const cudaStream_t main;
    Lanes& l;
    int n_side;
    ~Join() {
      megatron::cuda::set_current_stream(main);
      for (int i = 0; i < n_side; ++i) {
        cudaEventRecord(l.joined[i], l.side[i]);
        cudaStreamWaitEvent(main, l.joined[i], 0);
      }
    }
  } join{main, l, lanes - 1};
  for_each_expert_rows(counts, [&](size_t e, int64_t off, int64_t n) {
    megatron::cuda::set_current_stream(lane[e] == 0 ? main : l.side[lane[e] - 1]);
    fn(e, off, n);
  });
}

const char* at(const Tensor& t, int64_t row) {
  return static_cast<const char*>(t.data_ptr()) + row * t.size(1) * static_cast<int64_t>(dtype_size(t.dtype()));
}
char* at(Tensor& t, int64_t row) { return const_cast<char*>(at(static_cast<const Tensor&>(t), row)); }

}  // namespace

void grouped_linear_forward(const Tensor& x, const std::vector<Tensor>& ws, const std::vector<int64_t>& counts,
                            Tensor& y) {
  check_grouped_forward(x, ws, counts, y);
  const int64_t in = ws.front().size(1), out = ws.front().size(0);
  // y_e^T [out, n_e] = w_e [out, in] (column-major [in, out], transposed) x_e^T [in, n_e].
  std::vector<Problem> ps;
  for_each_expert_rows(counts, [&](size_t e, int64_t off, int64_t n) {
    ps.push_back({true, false, out, n, in, ws[e].data_ptr(), in, at(x, off), in, at(y, off), out});
  });
  if (in > 0 && out > 0 && y.dtype() == x.dtype() && run_grouped(0, ps, x.dtype(), y.dtype(), 0.0f)) return;
  for_each_expert_on_lanes(counts, ps, [&](size_t e, int64_t off, int64_t n) {
    Tensor ye = y.narrow0(off, n);
    linear_forward(x.narrow0(off, n), ws[e], nullptr, ye);
  });
}

void grouped_linear_backward(const Tensor& dy, const Tensor& x, const std::vector<Tensor>& ws,
                             const std::vector<int64_t>& counts, Tensor* dx, std::vector<Tensor>* dws, bool accumulate) {
  check_grouped_linear("grouped_linear_backward", x, ws, counts);
  const int64_t in = ws.front().size(1), out = ws.front().size(0);
  MEGATRON_CHECK(dy.dim() == 2 && dy.size(0) == x.size(0) && dy.size(1) == out && dy.dtype() == x.dtype() &&
                 (!dx || (dx->dim() == 2 && dx->shape() == x.shape())) && (!dws || dws->size() == ws.size()))
      << "grouped_linear_backward: dy " << dy.str() << " x " << x.str() << (dx ? " dx " + dx->str() : "");
  const bool nonempty = in > 0 && out > 0;
  if (dx) {
    // dx_e^T [in, n_e] = w_e (column-major [in, out]) dy_e^T [out, n_e].
    std::vector<Problem> ps;
    for_each_expert_rows(counts, [&](size_t e, int64_t off, int64_t n) {
      ps.push_back({false, false, in, n, out, ws[e].data_ptr(), in, at(dy, off), out, at(*dx, off), in});
    });
    if (!(nonempty && dx->dtype() == dy.dtype() && run_grouped(1, ps, dy.dtype(), dx->dtype(), 0.0f)))
      for_each_expert_on_lanes(counts, ps, [&](size_t e, int64_t off, int64_t n) {
        Tensor dxe = dx->narrow0(off, n);
        linear_backward(dy.narrow0(off, n), x.narrow0(off, n), ws[e], &dxe, nullptr, nullptr, accumulate);
      });
  }
  if (!dws) return;
  // dw_e^T [in, out] = x_e^T [in, n_e] (dy_e^T [out, n_e])^T; beta 1 when accumulating.
  bool same_type = true;
  for (size_t e = 0; e < ws.size(); ++e) {
    const Tensor& g = (*dws)[e];
    MEGATRON_CHECK(g.numel() == ws.front().numel()) << "grouped_linear_backward: dw " << g.str();
    same_type = same_type && g.dtype() == dws->front().dtype();
    if (counts[e] == 0 && !accumulate) fill((*dws)[e], 0.0f);
  }
  std::vector<Problem> ps;
  for_each_expert_rows(counts, [&](size_t e, int64_t off, int64_t n) {
    ps.push_back({false, true, in, out, n, at(x, off), in, at(dy, off), out, (*dws)[e].data_ptr(), in});
  });
  if (nonempty && same_type && run_grouped(2, ps, dy.dtype(), dws->front().dtype(), accumulate ? 1.0f : 0.0f)) return;
  for_each_expert_on_lanes(counts, ps, [&](size_t e, int64_t off, int64_t n) {
    linear_backward(dy.narrow0(off, n), x.narrow0(off, n), ws[e], nullptr, &(*dws)[e], nullptr, accumulate);
  });
}

GroupedGemmPathCounts grouped_gemm_path_counts(bool reset) {
  GroupedGemmPathCounts c;
  for (int k = 0; k < 3; ++k) {
    c.grouped[k] = reset ? g_grouped_calls[k].exchange(0) : g_grouped_calls[k].load();
    c.loop[k] = reset ? g_loop_calls[k].exchange(0) : g_loop_calls[k].load();
  }
  return c;
}

ExpertLaneCounts expert_lane_counts(bool reset) {
  std::lock_guard<std::mutex> g(g_lane_mu);
  const ExpertLaneCounts c = g_lane_counts;
  if (reset) g_lane_counts = ExpertLaneCounts{};
  return c;
}

}  // namespace megatron::ops::cuda
