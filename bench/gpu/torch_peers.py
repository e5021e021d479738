"""PyTorch peers for bench/gpu/gpu_bench.cpp, same shapes and FLOP conventions.

Attention: F.scaled_dot_product_attention (cuDNN backend, and FlashAttention backend) forward
and backward, causal, GQA via enable_gqa; GEMMs: torch.matmul / addmm on the same shapes.
Timing: CUDA events, 3 warm-ups, median of 10.
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def time_ms(fn, warm=3, reps=10):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def rep(name, ms, flops):
    print(f"{name:<62} {ms:9.3f} ms {flops / (ms * 1e-3) / 1e12:8.1f} TFLOP/s", flush=True)


def attention(tag, S, B, NP, NG, D):
    dev = "cuda"
    q = torch.randn(B, NP, S, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, NG, S, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, NG, S, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn(B, NP, S, D, device=dev, dtype=torch.bfloat16)
    fwd = 4.0 * S * S * D * NP * B / 2
    for be_name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        try:
            with sdpa_kernel([be]):
                def f():
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=NP != NG)
                tf = time_ms(lambda: f())
                out = f()
                tb = time_ms(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True))
            base = f"torch-sdpa-{be_name} {tag} s={S} b={B} np={NP} ng={NG} d={D} causal"
            rep(base + " fwd", tf, fwd)
            rep(base + " bwd", tb, 2.5 * fwd)
            rep(base + " fwd+bwd", tf + tb, 3.5 * fwd)
        except Exception as e:  # a backend may refuse a shape
            print(f"torch-sdpa-{be_name} {tag}: unavailable ({str(e).splitlines()[0][:80]})", flush=True)


def gemm(name, m, n, k, ta, tb, out_fp32=False, beta=0.0):
    a = torch.randn(*((k, m) if ta else (m, k)), device="cuda", dtype=torch.bfloat16) * 0.1
    b = torch.randn(*((n, k) if tb else (k, n)), device="cuda", dtype=torch.bfloat16) * 0.1
    A = a.t() if ta else a
    Bm = b.t() if tb else b
    if out_fp32:
        c = torch.zeros(m, n, device="cuda", dtype=torch.float32)
        # fp32 main-grad accumulation the way Megatron does it without fused wgrad: c += (A@B).float()
        fn = lambda: c.add_(torch.matmul(A, Bm).float())
    else:
        fn = lambda: torch.matmul(A, Bm)
    ms = time_ms(fn)
    rep(f"torch gemm {name} {m}x{n}x{k} {'T' if ta else 'N'}{'T' if tb else 'N'} ->{'float32' if out_fp32 else 'bfloat16'}",
        ms, 2.0 * m * n * k)


def main():
    only = sys.argv[1] if len(sys.argv) > 1 else ""
    print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version(), torch.cuda.get_device_name(0))
    if only in ("", "attention"):
        attention("llama3-8b", 8192, 1, 32, 8, 128)
        attention("gpt2-124m", 1024, 64, 12, 12, 64)
        attention("llama3-8b s=4096", 4096, 1, 32, 8, 128)
        attention("gpt2-124m b=8", 1024, 8, 12, 12, 64)
    if only in ("", "gemm"):
        T, H, QKV, FF = 8192, 4096, 6144, 14336
        gemm("qkv fwd", T, QKV, H, False, True)
        gemm("proj fwd", T, H, H, False, True)
        gemm("fc1 fwd", T, 2 * FF, H, False, True)
        gemm("fc2 fwd", T, H, FF, False, True)
        gemm("fc1 dgrad", T, H, 2 * FF, False, False)
        gemm("fc2 dgrad", T, FF, H, False, False)
        gemm("fc1 wgrad fp32+=", 2 * FF, H, T, True, False, out_fp32=True)
        gemm("fc2 wgrad fp32+=", H, FF, T, True, False, out_fp32=True)
        gemm("lm-head fwd", T, 128256, H, False, True)
        gemm("square 8192", 8192, 8192, 8192, False, True)


if __name__ == "__main__":
    main()
