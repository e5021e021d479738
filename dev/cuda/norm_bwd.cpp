// Norm backward: the register kernel (automatic for h <= 1024, 16-byte rows, fp32/bf16) against
// the shared-memory-atomics kernel (the fallback for other shapes and for deterministic mode,
// forced here at h = 768) on GPT-2's shape (65536 x 768 bf16, fp32 gamma), RMSNorm and
// LayerNorm, checked against the CPU reference (ops/cpu/norm.cpp). Tolerances: dx within 1e-2
// of max |dx| (bf16 output); dgamma/dbeta within 1e-4 (fp32 sums over 65536 rows in another
// order: relative error ~ sqrt(N) * 2^-24 per partial).
#include "dev/cuda/common.h"

using namespace megatron;
using namespace megatron::dev;

int main(int argc, char** argv) {
  Args args(argc, argv);
  const int64_t N = 65536, h = 768;
  const DType dt = DType::kBFloat16, gt = DType::kFloat32, f32 = DType::kFloat32;
  const auto x = randn(N * h, dt), dy = randn(N * h, dt), g = randn(h, gt), b = randn(h, gt);
  const Device C = Device::cpu(), G = Device::cuda();
  for (bool ln : {false, true}) {
    Tensor xc = make(x, {N, h}, dt, C), dyc = make(dy, {N, h}, dt, C), gc = make(g, {h}, gt, C),
           bc = make(b, {h}, gt, C);
    Tensor y = Tensor::empty({N, h}, dt, C), mc = Tensor::empty({N}, f32, C), rc = Tensor::empty({N}, f32, C);
    if (ln) cpu::layernorm_forward(xc, gc, bc, 1e-5f, false, y, mc, rc);
    else cpu::rmsnorm_forward(xc, gc, 1e-5f, false, y, rc);
    Tensor dxr = Tensor::empty({N, h}, dt, C), dgr = Tensor::empty({h}, f32, C), dbr = Tensor::empty({h}, f32, C);
    if (ln) cpu::layernorm_backward(dyc, xc, gc, mc, rc, false, dxr, dgr, dbr, false);
    else cpu::rmsnorm_backward(dyc, xc, gc, rc, false, dxr, dgr, false);
    Tensor xg = xc.to(G), dyg = dyc.to(G), gg = gc.to(G), mg = mc.to(G), rg = rc.to(G);
    Tensor dx = Tensor::empty({N, h}, dt, G), dg = Tensor::empty({h}, f32, G), db = Tensor::empty({h}, f32, G);
    auto run = [&] {
      if (ln) cu::layernorm_backward(dyg, xg, gg, mg, rg, false, dx, dg, db, false);
      else cu::rmsnorm_backward(dyg, xg, gg, rg, false, dx, dg, false);
    };
    for (bool v1 : {false, true}) {
      forced().norm_bwd_v1 = v1;
      const std::string nm =
          std::string(ln ? "layernorm" : "rmsnorm") + "_backward " + (v1 ? "v1 (forced)" : "shipped");
      run();
      check(nm + " dx", dx, dxr, 1e-2);
      check(nm + " dgamma", dg, dgr, 1e-4);
      if (ln) check(nm + " dbeta", db, dbr, 1e-4);
      time_line(nm, median_ms(run, args.reps));
    }
    forced().norm_bwd_v1 = false;
  }
  return finish();
}
