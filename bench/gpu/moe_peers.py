"""PyTorch peer of bench/gpu/gpu_bench.cpp's `moe` group (bench/gpu/moe_bench.sh), same shapes,
labels and FLOP convention: the routed experts' six GEMMs (fc1 / fc2 forward, dgrad, wgrad into
float32 gradients) over a balanced split of T*k rows, as ONE torch._grouped_mm per GEMM kind
("grouped", when this torch has it and accepts the layouts) and as a per-expert loop of
torch.matmul ("loop"), and the same FLOPs as one dense GEMM set of T*k rows.
Timing: CUDA events, 3 warm-ups, median of 10. Lines: "<label>  <t> ms  <r> TFLOP/s".
"""
import torch

from torch_peers import time_ms


def report(label, ms, flops):
    print(f"{label:<62} {ms:9.3f} ms {flops / (ms * 1e-3) / 1e12:8.1f} TFLOP/s", flush=True)


def bench(tag, T, H, F, E, K):
    R = T * K
    n = R // E
    counts = [n] * E
    counts[0] += R - n * E
    flops = 2.0 * R * H * (2 * F) * 3 + 2.0 * R * F * H * 3
    dev, bf = "cuda", torch.bfloat16
    x = torch.randn(R, H, device=dev, dtype=bf)
    a = torch.randn(R, F, device=dev, dtype=bf)
    dy2 = torch.randn(R, H, device=dev, dtype=bf) * 0.1
    df1 = torch.randn(R, 2 * F, device=dev, dtype=bf) * 0.1
    w1 = torch.randn(E, 2 * F, H, device=dev, dtype=bf) * 0.02
    w2 = torch.randn(E, H, F, device=dev, dtype=bf) * 0.02
    g1 = torch.zeros(E, 2 * F, H, device=dev, dtype=torch.float32)
    g2 = torch.zeros(E, H, F, device=dev, dtype=torch.float32)
    offs = torch.tensor(counts, device=dev, dtype=torch.int32).cumsum(0).to(torch.int32)
    starts = [sum(counts[:e]) for e in range(E)]

    def loop():
        for e in range(E):
            s, c = starts[e], counts[e]
            xe, ae = x[s:s + c], a[s:s + c]
            torch.matmul(xe, w1[e].t())                      # fc1 fwd
            torch.matmul(ae, w2[e].t())                      # fc2 fwd
            torch.matmul(dy2[s:s + c], w2[e])                # fc2 dgrad
            g2[e].add_(torch.matmul(dy2[s:s + c].t(), ae))   # fc2 wgrad (+= fp32)
            torch.matmul(df1[s:s + c], w1[e])                # fc1 dgrad
            g1[e].add_(torch.matmul(df1[s:s + c].t(), xe))   # fc1 wgrad (+= fp32)

    gm = getattr(torch, "_grouped_mm", None)
    if gm is not None:
        # Layouts torch._grouped_mm takes: mat_a row-major, mat_b column-major.
        w1t, w2t = w1.transpose(-2, -1), w2.transpose(-2, -1)          # [E, H, 2F], [E, F, H] col-major
        w1c = w1.transpose(-2, -1).contiguous().transpose(-2, -1)      # [E, 2F, H] col-major
        w2c = w2.transpose(-2, -1).contiguous().transpose(-2, -1)      # [E, H, F] col-major
        dy2t, df1t = dy2.t().contiguous(), df1.t().contiguous()        # [H, R], [2F, R] row-major
        xc, ac = x.t().contiguous().t(), a.t().contiguous().t()         # [R, H], [R, F] col-major

        f32_out = [True]  # torch._grouped_mm with out_dtype=float32 (else bf16, then added)

        def wgrad(a_, b_):
            if f32_out[0]:
                try:
                    return gm(a_, b_, offs=offs, out_dtype=torch.float32)
                except (RuntimeError, TypeError):
                    f32_out[0] = False
            return gm(a_, b_, offs=offs)

        def grouped():
            gm(x, w1t, offs=offs)                                       # fc1 fwd [R, 2F]
            gm(a, w2t, offs=offs)                                       # fc2 fwd [R, H]
            gm(dy2, w2c, offs=offs)                                     # fc2 dgrad [R, F]
            g2.add_(wgrad(dy2t, ac))                 # fc2 wgrad [E, H, F]
            gm(df1, w1c, offs=offs)                                     # fc1 dgrad [R, H]
            g1.add_(wgrad(df1t, xc))                 # fc1 wgrad [E, 2F, H]

        try:
            t = time_ms(grouped)
            report(f"torch moe {tag} expert gemms grouped E={E} rows={n} fwd+bwd", t, flops)
            if not f32_out[0]:
                print(f"torch moe {tag}: torch._grouped_mm wgrad without out_dtype=float32 (bf16 out, then added)")
        except Exception as e:  # noqa: BLE001 - a torch without the layouts: the loop stands alone
            print(f"torch moe {tag} expert gemms grouped: not available ({str(e).splitlines()[0][:100]})")
    else:
        print(f"torch moe {tag} expert gemms grouped: torch._grouped_mm absent in torch {torch.__version__}")
    report(f"torch moe {tag} expert gemms loop E={E} rows={n} fwd+bwd", time_ms(loop), flops)
    w1d, w2d, g1d, g2d = w1[0], w2[0], g1[0], g2[0]

    def dense():
        torch.matmul(x, w1d.t())
        torch.matmul(a, w2d.t())
        torch.matmul(dy2, w2d)
        g2d.add_(torch.matmul(dy2.t(), a))
        torch.matmul(df1, w1d)
        g1d.add_(torch.matmul(df1.t(), x))
    report(f"torch moe {tag} dense gemms same flops rows={R} fwd+bwd", time_ms(dense), flops)


if __name__ == "__main__":
    print(f"torch {torch.__version__} device {torch.cuda.get_device_name()}")
    bench("mixtral-8x7b", 4096, 4096, 14336, 8, 2)
    bench("qwen3-30b-a3b", 4096, 2048, 768, 128, 8)
