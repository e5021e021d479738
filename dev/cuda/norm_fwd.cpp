// Norm forward on GPT-2's shape (65536 x 768 bf16 rows, bf16 gamma/beta as --bf16 trains them,
// and fp32 gamma), RMSNorm and LayerNorm, three kernels: the shipped one (the register kernel
// with the cp.async row pipeline, automatic for h <= 1024, 16-byte rows, fp32/bf16), the register
// kernel without the pipeline (norm_fwd_no_pipe, Session 4) and norm_fwd_kernel (norm_fwd_v1: the
// fallback for other shapes), each checked against the CPU reference (ops/cpu/norm.cpp), and the
// pipelined kernel's y/mean/rstd bitwise against the unpipelined one (same operations in the same
// order per row). Tolerance vs the CPU: y within 1e-2 of max |y| (bf16 output: one rounding,
// 2^-8 relative, plus fp32 summation-order differences); mean/rstd within 1e-5 (fp32 sums).
// Time lines carry GB/s of the x read + y write (the statistics are 0.5 MB).
//
// Then LLaMA-3-8B's shape (8192 x 4096 bf16, bf16 gamma; Session 12, normrow), RMSNorm and
// LayerNorm: the shipped forward there (norm_fwd_kernel, warp per row, x read two or three times)
// against the block-per-row register kernel of decode (norm_fwd_row_kernel) forced for many rows
// (variants.h norm_fwd_row_many; not shipped: it would change the training forward's last bits),
// both against the CPU reference with the tolerances above: whether that simple change is worth
// >= 20 %.
#include "dev/cuda/common.h"

using namespace megatron;
using namespace megatron::dev;

namespace {
void llama_shape(const Args& args) {
  const int64_t N = 8192, h = 4096;
  const DType dt = DType::kBFloat16, gt = DType::kBFloat16;
  const float eps = 1e-5f;
  const auto x = randn(N * h, dt), g = randn(h, gt), b = randn(h, gt);
  const Device C = Device::cpu(), G = Device::cuda();
  const double bytes = 2.0 * N * h * dtype_size(dt);
  for (bool ln : {false, true}) {
    Tensor xc = make(x, {N, h}, dt, C), gc = make(g, {h}, gt, C), bc = make(b, {h}, gt, C);
    Tensor yr = Tensor::empty({N, h}, dt, C), mr = Tensor::empty({N}, DType::kFloat32, C),
           rr = Tensor::empty({N}, DType::kFloat32, C);
    if (ln) cpu::layernorm_forward(xc, gc, bc, eps, false, yr, mr, rr);
    else cpu::rmsnorm_forward(xc, gc, eps, false, yr, rr);
    Tensor xg = xc.to(G), gg = gc.to(G), bg = bc.to(G);
    double ms[2];
    for (int v = 0; v < 2; ++v) {
      forced().norm_fwd_row_many = v == 1;
      Tensor y = Tensor::empty({N, h}, dt, G), m = Tensor::empty({N}, DType::kFloat32, G),
             r = Tensor::empty({N}, DType::kFloat32, G);
      auto run = [&] {
        if (ln) cu::layernorm_forward(xg, gg, bg, eps, false, y, m, r);
        else cu::rmsnorm_forward(xg, gg, eps, false, y, r);
      };
      const std::string nm = std::string(ln ? "layernorm" : "rmsnorm") + "_forward 8192x4096 " +
                             (v ? "block per row (forced)" : "shipped (warp per row)");
      run();
      check(nm + " y", y, yr, 1e-2);
      check(nm + " rstd", r, rr, 1e-5);
      if (ln) check(nm + " mean", m, mr, 1e-5);
      ms[v] = median_ms(run, args.reps);
      time_bw_line(nm, ms[v], bytes);
    }
    forced().norm_fwd_row_many = false;
    std::printf("SPEEDUP %-44s %.2fx (warp per row %.1f us, block per row %.1f us)\n",
                (std::string(ln ? "layernorm" : "rmsnorm") + "_forward 8192x4096").c_str(), ms[0] / ms[1], ms[0] * 1e3,
                ms[1] * 1e3);
  }
}
}  // namespace

int main(int argc, char** argv) {
  Args args(argc, argv);
  const int64_t N = 65536, h = 768;
  const DType dt = DType::kBFloat16;
  const float eps = 1e-5f;
  const auto x = randn(N * h, dt), g = randn(h, DType::kBFloat16), b = randn(h, DType::kBFloat16);
  const Device C = Device::cpu(), G = Device::cuda();
  const double bytes = 2.0 * N * h * dtype_size(dt);
  for (DType gt : {DType::kBFloat16, DType::kFloat32})
    for (bool ln : {false, true}) {
      Tensor xc = make(x, {N, h}, dt, C), gc = make(g, {h}, gt, C), bc = make(b, {h}, gt, C);
      Tensor yr = Tensor::empty({N, h}, dt, C), mr = Tensor::empty({N}, DType::kFloat32, C),
             rr = Tensor::empty({N}, DType::kFloat32, C);
      if (ln) cpu::layernorm_forward(xc, gc, bc, eps, false, yr, mr, rr);
      else cpu::rmsnorm_forward(xc, gc, eps, false, yr, rr);
      Tensor xg = xc.to(G), gg = gc.to(G), bg = bc.to(G);
      auto out = [&] {
        return std::vector<Tensor>{Tensor::empty({N, h}, dt, G), Tensor::empty({N}, DType::kFloat32, G),
                                   Tensor::empty({N}, DType::kFloat32, G)};
      };
      std::vector<Tensor> o[3] = {out(), out(), out()};  // shipped, no pipe, v1
      const char* names[3] = {"shipped (pipelined)", "no pipe (forced)", "v1 (forced)"};
      for (int v = 0; v < 3; ++v) {
        forced().norm_fwd_no_pipe = v == 1;
        forced().norm_fwd_v1 = v == 2;
        Tensor &y = o[v][0], &m = o[v][1], &r = o[v][2];
        auto run = [&] {
          if (ln) cu::layernorm_forward(xg, gg, bg, eps, false, y, m, r);
          else cu::rmsnorm_forward(xg, gg, eps, false, y, r);
        };
        const std::string nm = std::string(ln ? "layernorm" : "rmsnorm") + "_forward gamma " + dtype_name(gt) + " " +
                               names[v];
        run();
        check(nm + " y", y, yr, 1e-2);
        check(nm + " rstd", r, rr, 1e-5);
        if (ln) check(nm + " mean", m, mr, 1e-5);
        time_bw_line(nm, median_ms(run, args.reps), bytes);
      }
      forced().norm_fwd_no_pipe = forced().norm_fwd_v1 = false;
      const std::string nm = std::string(ln ? "layernorm" : "rmsnorm") + "_forward gamma " + dtype_name(gt);
      same_bits(nm + " y pipelined vs no pipe", o[0][0], o[1][0]);
      same_bits(nm + " rstd pipelined vs no pipe", o[0][2], o[1][2]);
      if (ln) same_bits(nm + " mean pipelined vs no pipe", o[0][1], o[1][1]);
    }
  llama_shape(args);
  return finish();
}
