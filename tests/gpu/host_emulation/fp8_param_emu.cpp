// Host emulation of transpose_bytes_kernel (megatron/core/ops/cuda/fp8_param.cu, the dgrad layout of
// a gathered --fp8-param-gather weight; see fp8_param_run.sh): the kernel source compiled as C++,
// each block's 32 x 8 threads run as std::threads meeting at a std::barrier at __syncthreads, and
// checked against a plain loop q_t[c][r] = q[r][c] on odd, tile-multiple and thin shapes. A
// development check of the tiling and bounds where no GPU is available; the GPU itself is checked by
// fp8_gpu_test --groups param_gather.
#include <barrier>
#include <cstdint>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "cuda_host_shim.h"

namespace emu {
#include "kernels.inc"
}

int main() {
  int fail = 0;
  std::mt19937 rng(7);
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {31, 33}, {32, 32}, {64, 96}, {65, 7}, {7, 129}, {100, 257}};
  for (auto [R, C] : shapes) {
    std::vector<uint8_t> q(R * C), qt(R * C, 0xAA);
    for (auto& b : q) b = static_cast<uint8_t>(rng());
    const unsigned gx = (C + emu::kTile - 1) / emu::kTile, gy = (R + emu::kTile - 1) / emu::kTile;
    for (unsigned by = 0; by < gy; ++by)
      for (unsigned bx = 0; bx < gx; ++bx) {
        std::barrier<> bar(emu::kTile * emu::kRowsPerPass);
        std::vector<std::thread> th;
        for (unsigned ty = 0; ty < emu::kRowsPerPass; ++ty)
          for (unsigned tx = 0; tx < emu::kTile; ++tx)
            th.emplace_back([&, tx, ty] {
              threadIdx = {tx, ty, 1};
              blockIdx = {bx, by, 1};
              g_bar = &bar;
              emu::transpose_bytes_kernel(q.data(), R, C, qt.data());
            });
        for (auto& t : th) t.join();
      }
    int64_t bad = 0;
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) bad += qt[c * R + r] != q[r * C + c];
    std::printf("%s transpose_bytes_kernel %lldx%lld: %lld mismatches\n", bad ? "FAIL" : "ok  ", (long long)R,
                (long long)C, (long long)bad);
    fail += bad != 0;
  }
  std::printf("fp8_param_emu: %s\n", fail ? "FAILED" : "all passed");
  return fail ? 1 : 0;
}
