// Norm forward: the register kernel (automatic for h <= 1024, 16-byte rows, fp32/bf16) against
// norm_fwd_kernel (the fallback for other shapes, forced here at h = 768) on GPT-2's shape
// (65536 x 768 bf16 rows, fp32 gamma), RMSNorm and LayerNorm, both checked against the CPU
// reference (ops/cpu/norm.cpp). Tolerance: y within 1e-2 of max |y| (bf16 output: one rounding,
// 2^-8 relative, plus fp32 summation-order differences); mean/rstd within 1e-5 (fp32 sums).
#include "dev/cuda/common.h"

using namespace megatron;
using namespace megatron::dev;

int main(int argc, char** argv) {
  Args args(argc, argv);
  const int64_t N = 65536, h = 768;
  const DType dt = DType::kBFloat16, gt = DType::kFloat32;
  const float eps = 1e-5f;
  const auto x = randn(N * h, dt), g = randn(h, gt), b = randn(h, gt);
  for (bool ln : {false, true}) {
    const Device C = Device::cpu(), G = Device::cuda();
    Tensor xc = make(x, {N, h}, dt, C), gc = make(g, {h}, gt, C), bc = make(b, {h}, gt, C);
    Tensor yr = Tensor::empty({N, h}, dt, C), mr = Tensor::empty({N}, DType::kFloat32, C),
           rr = Tensor::empty({N}, DType::kFloat32, C);
    if (ln) cpu::layernorm_forward(xc, gc, bc, eps, false, yr, mr, rr);
    else cpu::rmsnorm_forward(xc, gc, eps, false, yr, rr);
    Tensor xg = xc.to(G), gg = gc.to(G), bg = bc.to(G), y = Tensor::empty({N, h}, dt, G),
           m = Tensor::empty({N}, DType::kFloat32, G), r = Tensor::empty({N}, DType::kFloat32, G);
    auto run = [&] {
      if (ln) cu::layernorm_forward(xg, gg, bg, eps, false, y, m, r);
      else cu::rmsnorm_forward(xg, gg, eps, false, y, r);
    };
    for (bool v1 : {false, true}) {
      forced().norm_fwd_v1 = v1;
      const std::string nm = std::string(ln ? "layernorm" : "rmsnorm") + "_forward " + (v1 ? "v1 (forced)" : "shipped");
      run();
      check(nm + " y", y, yr, 1e-2);
      check(nm + " rstd", r, rr, 1e-5);
      if (ln) check(nm + " mean", m, mr, 1e-5);
      time_line(nm, median_ms(run, args.reps));
    }
    forced().norm_fwd_v1 = false;
  }
  return finish();
}
