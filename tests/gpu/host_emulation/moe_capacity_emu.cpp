// Host emulation of the device capacity dropping of megatron/core/ops/cuda/moe_router.cu (the
// dropless permutation kernels and the capacity kernels, cut out of the .cu by CMake into
// kernels.inc; tests/CMakeLists.txt, ctest host_emulation.moe_capacity): each block's threads run
// as fibers (ucontext) on one thread, switched at every __syncthreads and at every warp ballot /
// shuffle, where the warp's 32 lanes meet (the CUDA keywords from cuda_host_shim.h). Blocks of 64
// and 96 threads instead of the GPU's 1024 (the kernels stride by blockDim.x, so several chunks
// and several warps per chunk are exercised). The launch sequence is
// the one of moe_permute_capacity. Checked exactly (no tolerance) against the host router's
// apply_router_token_dropping and permute_indices (moe_utils.cpp, Megatron's
// apply_router_token_dropping / permute) on the same top-k choice and probs: rows, their order,
// probs, counts and the row of every choice (-1: dropped). The choice is the host float64 router's
// on logits with uneven loads and ties (repeated tokens, all-equal rows, bf16 probs, top-1 probs of
// 1), plus choices whose prob is set to 0 (they rank with the tokens that did not choose the
// expert, by token index). The GPU is checked by gpu_ops_test --only router.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <functional>
#include <ucontext.h>
#include <vector>

#include "megatron/core/transformer/moe/moe_utils.h"
#include "cuda_host_shim.h"  // CUDA keywords, threadIdx / blockIdx, __float_as_uint

Dim3 blockDim, gridDim;
// A block's threads are fibers (ucontext) on this thread, switched at every barrier: the
// scheduler runs each unfinished fiber in turn; a fiber waiting at a barrier yields until the
// barrier's last thread arrives.
struct FBarrier {
  int count = 0, arrived = 0;
  uint64_t gen = 0;
};
struct Fiber {
  ucontext_t ctx;
  std::vector<char> stack;
  unsigned tid = 0;
  bool done = false;
};
ucontext_t g_sched;
Fiber* g_cur = nullptr;
const std::function<void()>* g_kern = nullptr;
void fiber_yield() { swapcontext(&g_cur->ctx, &g_sched); }
void fiber_wait(FBarrier& b) {
  const uint64_t g = b.gen;
  if (++b.arrived == b.count) {
    b.arrived = 0;
    ++b.gen;
    return;
  }
  while (b.gen == g) fiber_yield();
}
void fiber_main() {
  (*g_kern)();
  g_cur->done = true;
}
struct WarpCtx {
  FBarrier bar;
  uint64_t slots[32];
};
WarpCtx* g_w;
int g_lane;
FBarrier g_block_bar;
int64_t* g_offs;  // permute_scatter_kernel's dynamic shared memory
template <class T>
T __shfl_xor_sync(unsigned, T v, int m) {
  static_assert(sizeof(T) <= 8);
  uint64_t u = 0;
  std::memcpy(&u, &v, sizeof(T));
  WarpCtx* w = g_w;
  const int lane = g_lane;
  w->slots[lane] = u;
  fiber_wait(w->bar);
  const uint64_t r = w->slots[lane ^ m];
  fiber_wait(w->bar);
  T out;
  std::memcpy(&out, &r, sizeof(T));
  return out;
}
unsigned __ballot_sync(unsigned, bool p) {
  WarpCtx* w = g_w;
  w->slots[g_lane] = p ? 1 : 0;
  fiber_wait(w->bar);
  unsigned b = 0;
  for (int l = 0; l < 32; ++l) b |= (unsigned)w->slots[l] << l;
  fiber_wait(w->bar);
  return b;
}
int __popc(unsigned x) { return __builtin_popcount(x); }

namespace emu {
void __syncthreads() { fiber_wait(g_block_bar); }  // found before the shim's (std::barrier) one
#include "kernels.inc"
}  // namespace emu
using namespace emu;

// kern<<<grid, block>>>: blocks one after the other, the threads of a block as fibers.
void launch(unsigned grid, unsigned block, int64_t offs_n, const std::function<void()>& kern) {
  gridDim.x = grid;
  blockDim.x = block;
  std::vector<int64_t> offs(static_cast<size_t>(std::max<int64_t>(offs_n, 1)));
  std::vector<Fiber> fib(block);
  std::vector<WarpCtx> w(block / 32);
  g_kern = &kern;
  g_offs = offs.data();
  for (unsigned b = 0; b < grid; ++b) {
    g_block_bar = FBarrier{static_cast<int>(block), 0, 0};
    for (auto& c : w) c.bar = FBarrier{32, 0, 0};
    for (unsigned t = 0; t < block; ++t) {
      Fiber& f = fib[t];
      f.stack.resize(1 << 16);
      f.tid = t;
      f.done = false;
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = f.stack.data();
      f.ctx.uc_stack.ss_size = f.stack.size();
      f.ctx.uc_link = &g_sched;
      makecontext(&f.ctx, fiber_main, 0);
    }
    blockIdx.x = b;
    for (unsigned left = block; left > 0;) {
      left = 0;
      for (Fiber& f : fib) {
        if (f.done) continue;
        threadIdx.x = f.tid;
        g_w = &w[f.tid / 32];
        g_lane = static_cast<int>(f.tid % 32);
        g_cur = &f;
        swapcontext(&g_sched, &f.ctx);
        if (!f.done) ++left;
      }
    }
  }
}

int fails = 0, checks = 0;

// moe_permute_capacity's launches on host vectors.
void permute_capacity(const std::vector<int64_t>& tidx, const std::vector<float>& tprob, int T, int k, int E,
                      int64_t capacity, bool by_position, bool pad, unsigned block, std::vector<int64_t>& row_token,
                      std::vector<int64_t>& row_of, std::vector<float>& pprobs, std::vector<int64_t>& counts) {
  const int64_t n = (int64_t)T * k, cap = std::min<int64_t>(capacity, T);
  std::vector<int64_t> row_token0(n), counts0(E), np(E);
  std::vector<float> pprobs0(n);
  std::vector<unsigned long long> thr(E);
  row_of.assign(n, -7);
  counts.assign(E, -7);
  const int64_t R = pad ? E * cap : n;
  row_token.assign(R, -7);
  pprobs.assign(R, -7.f);
  launch(E, block, 0, [&] { permute_rank_kernel(tidx.data(), T, k, row_of.data(), counts0.data()); });
  launch(1, block, E, [&] {
    permute_scatter_kernel(tidx.data(), tprob.data(), counts0.data(), E, k, n, row_token0.data(), row_of.data(),
                           pprobs0.data());
  });
  launch(E, block, 0, [&] {
    capacity_select_kernel(row_token0.data(), pprobs0.data(), counts0.data(), cap, by_position, pad, thr.data(),
                           np.data(), counts.data());
  });
  launch(E, block, 0, [&] {
    capacity_scatter_kernel(tidx.data(), tprob.data(), row_token0.data(), pprobs0.data(), counts0.data(), T, k, cap,
                            by_position, pad, thr.data(), np.data(), counts.data(), row_token.data(), pprobs.data(),
                            row_of.data());
  });
}

float round_bf16(float x) {
  uint32_t u = __float_as_uint(x);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  return __uint_as_float(u);
}

int main() {
  using namespace megatron::transformer::moe;
  std::mt19937 rng(1234);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int T = 150;  // not a multiple of the block: partial chunks
  int cfg = 0;
  for (int E : {8, 64, 128})
    for (int k : {1, 2, 8})
      for (double cf : {0.5, 1.0, 1.5})
        for (const char* policy : {"probs", "position"})
          for (bool pad : {false, true}) {
            // E 64 / 128: top-2 and top-8 at factors 0.5 and 1.5 (the emulation's time)
            if (E > 8 && (k == 1 || cf == 1.0)) continue;
            const bool bf16 = cfg % 2, pre = k == 1 && cfg % 4 < 2, zeros = cfg % 3 == 0;
            const unsigned block = cfg % 5 < 3 ? 64 : 96;
            ++cfg;
            std::vector<double> lg(T * E);
            for (int t = 0; t < T; ++t)
              for (int e = 0; e < E; ++e) {
                double v = nd(rng) + (e < E / 4 ? 1.5 : 0.0);  // uneven load
                if (t % 7 == 3) v = 0.5;                     // all experts tied
                if (t % 5 == 1) v = lg[(t - 1) * E + e];     // the previous token's probs
                lg[t * E + e] = bf16 ? round_bf16((float)v) : (float)v;
              }
            TopKOptions o;
            o.topk = k;
            o.use_pre_softmax = pre;
            std::vector<double> hp;
            std::vector<uint8_t> hmap;
            TopKState hs;
            topk_routing_with_score_function(lg, T, E, o, hp, hmap, hs);
            std::vector<int64_t> tidx(hs.top_indices.begin(), hs.top_indices.end());
            std::vector<float> tprob(T * k);
            for (int i = 0; i < T * k; ++i) {
              const float p = (float)hp[(i / k) * E + tidx[i]];
              tprob[i] = bf16 ? round_bf16(p) : p;
              if (zeros && i % 11 == 4) tprob[i] = 0.f;  // routed with prob 0
            }
            std::vector<double> probs(T * E, 0.0);
            std::vector<uint8_t> map(T * E, 0);
            for (int i = 0; i < T * k; ++i) probs[(i / k) * E + tidx[i]] = tprob[i], map[(i / k) * E + tidx[i]] = 1;
            apply_router_token_dropping(probs, map, T, E, k, cf, policy, pad);
            std::vector<int64_t> rtpe;
            const std::vector<int64_t> ridx = permute_indices(map, T, E, 0, E, &rtpe);
            const int64_t cap = get_capacity((int64_t)T * k, E, cf);
            std::vector<int64_t> row_token, row_of, counts;
            std::vector<float> pprobs;
            permute_capacity(tidx, tprob, T, k, E, cap, std::string(policy) == "position", pad, block, row_token, row_of,
                             pprobs, counts);
            const int64_t N = (int64_t)ridx.size();
            bool ok = counts == rtpe && std::equal(ridx.begin(), ridx.end(), row_token.begin());
            std::vector<int64_t> row_expert;
            for (int e = 0; e < E; ++e) row_expert.insert(row_expert.end(), rtpe[e], e);
            for (int64_t r = 0; r < N && ok; ++r) ok = pprobs[r] == (float)probs[ridx[r] * E + row_expert[r]];
            int64_t dropped = 0;
            for (int64_t i = 0; i < (int64_t)T * k && ok; ++i) {
              const int64_t t = i / k, e = tidx[i];
              ok = map[t * E + e] ? row_of[i] >= 0 && row_of[i] < N && row_token[row_of[i]] == t && row_expert[row_of[i]] == e
                                  : row_of[i] == -1;
              dropped += row_of[i] < 0;
            }
            ++checks;
            if (!ok) ++fails;
            std::printf("%s capacity E=%d k=%d cf=%.1f %s%s%s%s%s block %u: capacity %ld, %ld rows, %ld dropped\n",
                        ok ? "PASS" : "FAIL", E, k, cf, policy, pad ? " pad" : "", pre ? " pre-softmax" : "",
                        bf16 ? " bf16" : "", zeros ? " zero-probs" : "", block, (long)cap, (long)N, (long)dropped);
          }
  std::printf("%d checks, %d failed\n", checks, fails);
  return fails ? 1 : 0;
}
