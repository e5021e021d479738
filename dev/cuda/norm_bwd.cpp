// Norm backward on GPT-2's shape (65536 x 768 bf16, bf16 gamma as --bf16 trains it, fp32
// dgamma/dbeta), RMSNorm and LayerNorm, plain and with the residual gradient added in the same
// pass (*_backward_residual: 24 of GPT-2 124M's 25 calls per step), three kernels: the shipped one
// (the register kernel with the cp.async row pipeline, automatic for h <= 1024, 16-byte rows,
// fp32/bf16), the register kernel without it (norm_bwd_no_pipe, Session 4) and the
// shared-memory-atomics kernel (norm_bwd_v1: the fallback for other shapes), each checked
// against the CPU reference (ops/cpu/norm.cpp; + dres on the host for the residual form), and
// the pipelined kernel's dx/dgamma/dbeta bitwise against the unpipelined one (same rows per
// warp, same operations and summation order). Tolerances vs the CPU: dx within 1e-2 of max |dx|
// (bf16 output); dgamma/dbeta within 1e-4 (fp32 sums over 65536 rows in another order: relative
// error ~ sqrt(N) * 2^-24 per partial). Time lines carry GB/s of x, dy (, dres) read + dx written.
//
// Then LLaMA-3-8B's shape (8192 x 4096 bf16, bf16 gamma; Session 12, normrow): the shipped
// row-block backward (norm_bwd_rowblk_kernel, automatic for 1024 < h <= 8192 bf16 rows) against
// the general kernel it replaced there (variants.h norm_bwd_no_row: norm_bwd_kernel, shared-memory
// atomics), RMSNorm and LayerNorm, with and without the residual gradient: both against the CPU
// reference (same tolerances), new vs old within them (not bitwise: the row and column sums are
// added in another order), and two calls of the new kernel bitwise equal (no atomics).
#include "dev/cuda/common.h"

using namespace megatron;
using namespace megatron::dev;

namespace {
// One norm-backward problem of N x h bf16 rows (bf16 gamma, fp32 dgamma/dbeta): the inputs on the
// GPU and the CPU references (ops/cpu/norm.cpp; dx + dres formed on the host in fp32 for the
// residual form, so within one more bf16 rounding of the fused kernel's dx).
struct NormCase {
  int64_t N, h;
  bool ln;
  Tensor xg, dyg, gg, mg, rg, drg;  // GPU inputs: x, dy, gamma, mean, rstd, dres
  Tensor dxr, dxr_res, dgr, dbr;    // CPU references: dx, dx + dres, dgamma, dbeta

  NormCase(int64_t n, int64_t width, bool layernorm) : N(n), h(width), ln(layernorm) {
    const DType dt = DType::kBFloat16, gt = DType::kBFloat16, f32 = DType::kFloat32;
    const auto x = randn(N * h, dt), dy = randn(N * h, dt), dr = randn(N * h, dt), g = randn(h, gt), b = randn(h, gt);
    const Device C = Device::cpu(), G = Device::cuda();
    Tensor xc = make(x, {N, h}, dt, C), dyc = make(dy, {N, h}, dt, C), gc = make(g, {h}, gt, C),
           bc = make(b, {h}, gt, C);
    Tensor y = Tensor::empty({N, h}, dt, C), mc = Tensor::empty({N}, f32, C), rc = Tensor::empty({N}, f32, C);
    if (ln) cpu::layernorm_forward(xc, gc, bc, 1e-5f, false, y, mc, rc);
    else cpu::rmsnorm_forward(xc, gc, 1e-5f, false, y, rc);
    dxr = Tensor::empty({N, h}, dt, C);
    dgr = Tensor::empty({h}, f32, C);
    dbr = Tensor::empty({h}, f32, C);
    if (ln) cpu::layernorm_backward(dyc, xc, gc, mc, rc, false, dxr, dgr, dbr, false);
    else cpu::rmsnorm_backward(dyc, xc, gc, rc, false, dxr, dgr, false);
    std::vector<float> dxrv = dxr.to_float_vector();
    for (int64_t i = 0; i < N * h; ++i) dxrv[i] += dr[i];
    dxr_res = make(dxrv, {N, h}, f32, C);
    xg = xc.to(G);
    dyg = dyc.to(G);
    gg = gc.to(G);
    mg = mc.to(G);
    rg = rc.to(G);
    drg = make(dr, {N, h}, dt, G);
  }
  /// The CUDA backward (with the residual gradient when `res`) into dx [N, h] bf16, dg/db [h] fp32.
  void run(bool res, Tensor& dx, Tensor& dg, Tensor& db) const {
    if (res) {
      if (ln) cu::layernorm_backward_residual(dyg, xg, gg, mg, rg, false, drg, dx, dg, db, false);
      else cu::rmsnorm_backward_residual(dyg, xg, gg, rg, false, drg, dx, dg, false);
    } else {
      if (ln) cu::layernorm_backward(dyg, xg, gg, mg, rg, false, dx, dg, db, false);
      else cu::rmsnorm_backward(dyg, xg, gg, rg, false, dx, dg, false);
    }
  }
  /// Bytes of x, dy (, dres) read and dx written per call.
  double bytes(bool res) const { return (res ? 4.0 : 3.0) * N * h * 2; }
};

// 8192 x 4096 bf16: row-block (shipped) vs norm_bwd_kernel (forced), see the header.
void llama_shape(const Args& args) {
  const int64_t N = 8192, h = 4096;
  const DType dt = DType::kBFloat16, f32 = DType::kFloat32;
  const Device G = Device::cuda();
  for (bool ln : {false, true}) {
    const NormCase k(N, h, ln);
    for (bool res : {false, true}) {
      const double bytes = k.bytes(res);
      const std::string base = std::string(ln ? "layernorm" : "rmsnorm") + "_backward" + (res ? "_residual" : "") +
                               " 8192x4096";
      std::vector<Tensor> o[3];
      double ms[2];
      for (int v = 0; v < 3; ++v) {  // 0 row-block, 1 row-block again (bits), 2 old
        forced().norm_bwd_no_row = v == 2;
        Tensor dx = Tensor::empty({N, h}, dt, G), dg = Tensor::empty({h}, f32, G), db = Tensor::empty({h}, f32, G);
        auto run = [&] { k.run(res, dx, dg, db); };
        run();
        o[v] = {dx.clone(), dg.clone(), db.clone()};
        if (v == 1) continue;
        const std::string nm = base + (v == 0 ? " row-block (shipped)" : " old (forced)");
        check(nm + " dx", o[v][0], res ? k.dxr_res : k.dxr, 1e-2);
        check(nm + " dgamma", o[v][1], k.dgr, 1e-4);
        if (ln) check(nm + " dbeta", o[v][2], k.dbr, 1e-4);
        ms[v / 2] = median_ms(run, args.reps);
        time_bw_line(nm, ms[v / 2], bytes);
      }
      forced().norm_bwd_no_row = false;
      same_bits(base + " row-block dx twice", o[0][0], o[1][0]);
      same_bits(base + " row-block dgamma twice", o[0][1], o[1][1]);
      if (ln) same_bits(base + " row-block dbeta twice", o[0][2], o[1][2]);
      check(base + " dx row-block vs old", o[0][0], o[2][0], 1e-2);
      check(base + " dgamma row-block vs old", o[0][1], o[2][1], 1e-4);
      if (ln) check(base + " dbeta row-block vs old", o[0][2], o[2][2], 1e-4);
      std::printf("SPEEDUP %-44s %.2fx (old %.1f us, row-block %.1f us)\n", base.c_str(), ms[1] / ms[0], ms[1] * 1e3,
                  ms[0] * 1e3);
    }
  }
}
}  // namespace

int main(int argc, char** argv) {
  Args args(argc, argv);
  const int64_t N = 65536, h = 768;
  const DType dt = DType::kBFloat16, f32 = DType::kFloat32;
  const Device G = Device::cuda();
  for (bool ln : {false, true}) {
    const NormCase k(N, h, ln);
    for (bool res : {false, true}) {
      const double bytes = k.bytes(res);
      std::vector<Tensor> o[3];
      const char* names[3] = {"shipped (pipelined)", "no pipe (forced)", "v1 (forced)"};
      for (int v = 0; v < 3; ++v) {
        forced().norm_bwd_no_pipe = v == 1;
        forced().norm_bwd_v1 = v == 2;
        Tensor dx = Tensor::empty({N, h}, dt, G), dg = Tensor::empty({h}, f32, G), db = Tensor::empty({h}, f32, G);
        auto run = [&] { k.run(res, dx, dg, db); };
        const std::string nm = std::string(ln ? "layernorm" : "rmsnorm") + "_backward" + (res ? "_residual " : " ") +
                               names[v];
        run();
        check(nm + " dx", dx, res ? k.dxr_res : k.dxr, 1e-2);
        check(nm + " dgamma", dg, k.dgr, 1e-4);
        if (ln) check(nm + " dbeta", db, k.dbr, 1e-4);
        time_bw_line(nm, median_ms(run, args.reps), bytes);
        o[v] = {dx, dg, db};
      }
      forced().norm_bwd_no_pipe = forced().norm_bwd_v1 = false;
      const std::string nm = std::string(ln ? "layernorm" : "rmsnorm") + "_backward" + (res ? "_residual" : "");
      same_bits(nm + " dx pipelined vs no pipe", o[0][0], o[1][0]);
      same_bits(nm + " dgamma pipelined vs no pipe", o[0][1], o[1][1]);
      if (ln) same_bits(nm + " dbeta pipelined vs no pipe", o[0][2], o[1][2]);
    }
  }
  llama_shape(args);
  return finish();
}
