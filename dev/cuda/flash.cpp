// Our flash attention (MEGATRON_ATTENTION_BACKEND=flash, bf16): the pipelined kernels with 8 and
// 4 warps per block (the automatic choice takes 4 at head dim <= 64, else 8) and the first
// simple kernels (the fallback when s % 4 != 0 or lse is unaligned), forward and backward,
// causal, on GPT-2's shape (s 1024, b 8, 12 heads of 64) and a LLaMA-3-8B-like shape (s 1024,
// b 1, 32 query / 8 key-value heads of 128), checked against the CPU reference
// (ops/cpu/attention.cpp). Tolerance 2e-2 of the max: bf16 P and outputs (2^-8 relative) with
// fp32 accumulation in another order, as gpu_ops_test's attention checks. The two-pass rows time the
// backward of --deterministic-mode (dK/dV without dQ atomics, then the query-block dQ kernel)
// outside deterministic mode, against the atomics dQ of the rows above.
#include "dev/cuda/common.h"

using namespace megatron;
using namespace megatron::dev;

int main(int argc, char** argv) {
  Args args(argc, argv);
  setenv("MEGATRON_ATTENTION_BACKEND", "flash", 1);  // our kernels, not cuDNN
  struct Shape4 { const char* name; int64_t S, B, NP, NG, D; };
  const DType bf = DType::kBFloat16, f32 = DType::kFloat32;
  const Device C = Device::cpu(), G = Device::cuda();
  const Shape4 shapes[] = {{"gpt2 s1024 b8 h12x64", 1024, 8, 12, 12, 64},
                          {"llama3 s1024 b1 h32/8x128", 1024, 1, 32, 8, 128}};
  for (Shape4 s : shapes) {
    const Shape qs = {s.S, s.B, s.NP, s.D}, ks = {s.S, s.B, s.NG, s.D};
    const int64_t nq = s.S * s.B * s.NP * s.D, nk = s.S * s.B * s.NG * s.D;
    Tensor q = make(randn(nq, bf), qs, bf, C), k = make(randn(nk, bf), ks, bf, C), v = make(randn(nk, bf), ks, bf, C),
           dout = make(randn(nq, bf), qs, bf, C);
    ops::AttentionParams p;
    p.softmax_scale = 1.0f / std::sqrt((float)s.D);
    Tensor o_r = Tensor::empty(qs, bf, C), lse_r = Tensor::empty({s.B, s.NP, s.S}, f32, C);
    cpu::attention_forward(q, k, v, p, o_r, lse_r);
    Tensor dq_r = Tensor::empty(qs, bf, C), dk_r = Tensor::empty(ks, bf, C), dv_r = Tensor::empty(ks, bf, C);
    cpu::attention_backward(dout, q, k, v, o_r, lse_r, p, dq_r, dk_r, dv_r);
    Tensor qg = q.to(G), kg = k.to(G), vg = v.to(G), dg = dout.to(G), o = Tensor::empty(qs, bf, G),
           lse = Tensor::empty({s.B, s.NP, s.S}, f32, G), dq = Tensor::empty(qs, bf, G), dk = Tensor::empty(ks, bf, G),
           dv = Tensor::empty(ks, bf, G);
    auto fwd = [&] { cu::attention_forward(qg, kg, vg, p, o, lse); };
    auto bwd = [&] { cu::attention_backward(dg, qg, kg, vg, o, lse, p, dq, dk, dv); };
    struct Var { const char* name; bool v1; int small; bool two_pass; };
    for (Var var : {Var{"shipped (automatic)", false, -1, false}, Var{"pipelined 8 warps", false, 0, false},
                    Var{"pipelined 4 warps", false, 1, false}, Var{"v1 simple (forced)", true, -1, false},
                    Var{"two-pass dQ (deterministic)", false, -1, true},
                    Var{"two-pass dQ 8 warps", false, 0, true}, Var{"two-pass dQ 4 warps", false, 1, true}}) {
      forced().flash_v1 = var.v1;
      forced().flash_small = var.small;
      forced().flash_dq_two_pass = var.two_pass;
      const std::string nm = std::string(s.name) + " " + var.name;
      fwd();
      bwd();
      check(nm + " out", o, o_r, 2e-2);
      check(nm + " lse", lse, lse_r, 1e-3);
      check(nm + " dq", dq, dq_r, 2e-2);
      check(nm + " dk", dk, dk_r, 2e-2);
      check(nm + " dv", dv, dv_r, 2e-2);
      time_line(nm + " fwd", median_ms(fwd, args.reps));
      time_line(nm + " bwd", median_ms(bwd, args.reps));
    }
    forced().flash_v1 = false;
    forced().flash_small = -1;
    forced().flash_dq_two_pass = false;
  }
  return finish();
}
