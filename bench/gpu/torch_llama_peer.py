#!/usr/bin/env python3
"""PyTorch peer of the LLaMA-3-8B-shaped pretrain_gpt benchmark (run_bench.sh `LL` flags).

A plain LLaMA decoder written for this benchmark: token embedding; L layers of
  x = x + Wo . SDPA_causal(RoPE(Wq . n1(x)), RoPE(Wk . n1(x)), Wv . n1(x))   (GQA)
  x = x + W2 . (silu(W1 . n2(x)) * W3 . n2(x))                              (SwiGLU)
with n1, n2 RMSNorm (eps 1e-5, fp32 math); final RMSNorm; untied output layer; cross-entropy.
Shapes (defaults = LLaMA-3 8B): hidden 4096, 32 heads of 128, 8 KV groups, ffn 14336, vocab
128256, RoPE base 500000 (rotate-half, non-interleaved, as Megatron's default rope), no biases.

Precision, as Megatron `--bf16` with its fp32 optimizer: fp32 parameters (Megatron's fp32 main
params), bf16 compute through torch.autocast (GEMMs and attention in bf16 with fp32 accumulation,
the residual stream bf16, norms and the loss in fp32), fp32 gradients (Megatron's fp32 main_grad),
torch.optim.AdamW(fused=True) over fp32 state. Optimizer settings follow the `LL` flags of
bench/gpu/run_bench.sh and Megatron's defaults for flags it does not set
(docs/megatron-reference.md#optimizer-defaults): lr 3e-4 (constant here; the schedule costs
nothing), betas (0.9, 0.999), eps 1e-8, weight decay 0.01 on matrices only (Megatron exempts
norms and biases), clip_grad_norm_ 1.0 every step. Gradient accumulation over G = --gbs
micro-batches of one sequence (loss / G), as --micro-batch-size 1 --global-batch-size G.

Data: seeded random tokens in [0, vocab), G sequences of S+1 tokens made once (as --mock-data
costs nothing per step). Timing: CUDA events around each optimizer step (all G micro-batches,
clip, AdamW, zero_grad), synchronised, after --warmup steps (torch.compile compiles in the first).

Output: per-step lines "PEER-STEP ..." and one summary line
  PEER torch_llama compile=1 L=4 S=8192 GBS=8: ms/iter X tokens/s Y TFLOP/s Z peak_mem_GiB W steps N
or "PEER torch_llama compile=1 L=4 S=8192 GBS=8 FAILED <reason>" and exit status 1.

  python3 bench/gpu/torch_llama_peer.py --layers 4 --seq 8192 --gbs 8 --iters 5 --warmup 2 --compile
"""
import argparse
import math
import signal
import sys
import time


def megatron_flops(batch, seq, layers, hidden, ffn, heads, groups, kv_channels, vocab, swiglu=True,
                   divisible_by=128):
    """FLOPs of one iteration of `batch` sequences, the formula behind pretrain_gpt's
    "throughput per GPU (TFLOP/s/GPU)" log field: megatron/training/training_log.cpp
    num_floating_point_operations (dense GPT/LLaMA, no MoE, no MTP; Megatron's training.py
    num_floating_point_operations, docs/megatron-reference.md#flops):
      T*[6*h*f*gate*L + 6*(h*(q+2k) + q*h)*L + 6*h*Vp] + B*s^2*6*q*L
    with T = B*s, q = kv_channels*heads, k = kv_channels*groups, gate 3 for SwiGLU, Vp the vocab
    padded to a multiple of `divisible_by` (--make-vocab-size-divisible-by 128, TP 1).
    Returns a float (FLOPs, not TFLOPs)."""
    B, s, h, L, f = float(batch), float(seq), float(hidden), float(layers), float(ffn)
    q = float(kv_channels) * heads
    k = float(kv_channels) * groups
    vp = float(math.ceil(vocab / divisible_by) * divisible_by)
    gate = 3.0 if swiglu else 2.0
    T = B * s
    return T * (6.0 * h * f * gate * L + 6.0 * (h * (q + 2.0 * k) + q * h) * L + 6.0 * h * vp) + B * s * s * 6.0 * q * L


def build_model(torch, a):
    """The decoder as an nn.Module on the current CUDA device, fp32 parameters; forward(tokens
    [B, S] int64, targets [B, S] int64) -> mean cross-entropy (fp32 scalar)."""
    nn = torch.nn
    F = torch.nn.functional
    H, NH, NG, D, FF, V = a.hidden, a.heads, a.groups, a.head_dim, a.ffn, a.vocab

    class RMSNorm(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))
            self.eps = 1e-5

        def forward(self, x):  # fp32 math, output in the input's dtype (bf16 under autocast)
            xf = x.float()
            y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
            return (y * self.weight).to(x.dtype)

    def rotate_half(t):
        t1, t2 = t.chunk(2, dim=-1)
        return torch.cat((-t2, t1), dim=-1)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1 = RMSNorm(H)
            self.wq = nn.Linear(H, NH * D, bias=False)
            self.wk = nn.Linear(H, NG * D, bias=False)
            self.wv = nn.Linear(H, NG * D, bias=False)
            self.wo = nn.Linear(NH * D, H, bias=False)
            self.n2 = RMSNorm(H)
            self.w1 = nn.Linear(H, FF, bias=False)  # gate
            self.w3 = nn.Linear(H, FF, bias=False)  # up
            self.w2 = nn.Linear(FF, H, bias=False)  # down

        def forward(self, x, cos, sin):
            B, S, _ = x.shape
            y = self.n1(x)
            q = self.wq(y).view(B, S, NH, D).transpose(1, 2)  # [B, NH, S, D]
            k = self.wk(y).view(B, S, NG, D).transpose(1, 2)  # [B, NG, S, D]
            v = self.wv(y).view(B, S, NG, D).transpose(1, 2)
            c, s_ = cos.to(q.dtype), sin.to(q.dtype)  # Megatron casts the rotary table to t's dtype
            q = q * c + rotate_half(q) * s_
            k = k * c + rotate_half(k) * s_
            if a.gqa == "native":
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            else:
                k = k.repeat_interleave(NH // NG, dim=1)
                v = v.repeat_interleave(NH // NG, dim=1)
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.wo(o.transpose(1, 2).reshape(B, S, NH * D))
            y = self.n2(x)
            return x + self.w2(F.silu(self.w1(y)) * self.w3(y))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, H)
            self.layers = nn.ModuleList(Layer() for _ in range(a.layers))
            self.norm = RMSNorm(H)
            self.out = nn.Linear(H, V, bias=False)
            inv = 1.0 / (a.rope_base ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
            ang = torch.outer(torch.arange(a.seq, dtype=torch.float32), inv)  # [S, D/2]
            ang = torch.cat((ang, ang), dim=-1)  # rotate-half layout
            self.register_buffer("cos", ang.cos()[None, None], persistent=False)  # [1, 1, S, D]
            self.register_buffer("sin", ang.sin()[None, None], persistent=False)

        def forward(self, tokens, targets):
            x = self.emb(tokens).to(torch.bfloat16)  # bf16 residual stream, as Megatron --bf16
            for layer in self.layers:
                x = layer(x, self.cos, self.sin)
            logits = self.out(self.norm(x))
            return F.cross_entropy(logits.view(-1, V).float(), targets.view(-1))

    with torch.device("cuda"):  # built and initialised on the GPU (2 B fp32 values: slow on the host)
        m = Decoder()
    torch.cuda.manual_seed(a.seed)
    with torch.no_grad():  # Megatron's init: normal(0, 0.02) for the matrices (norm weights 1)
        for p in m.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.02)
    return m


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--gbs", type=int, default=1, help="global batch = micro-batches of 1 sequence per step")
    ap.add_argument("--iters", type=int, default=8, help="timed optimizer steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first (compilation happens here)")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--compile", dest="compile", action="store_true", default=True, help="torch.compile the model (default)")
    g.add_argument("--eager", dest="compile", action="store_false")
    # repeat (default): K/V repeated to all 32 heads, then plain causal SDPA, which every fused
    # backend (FlashAttention, cuDNN) takes; < 1 % of the step (two [1, 32, S, 128] bf16 copies
    # per layer). native: enable_gqa=True, fused only where the backend supports GQA
    # (the math backend is disabled then).
    ap.add_argument("--gqa", choices=("native", "repeat"), default="repeat",
                    help="repeat: repeat K/V to all heads first (default); native: SDPA enable_gqa=True")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--ffn", type=int, default=14336)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--rope-base", type=float, default=500000.0)
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    tag = f"PEER torch_llama compile={int(a.compile)} L={a.layers} S={a.seq} GBS={a.gbs}"

    def on_term(signum, _frame):  # `timeout` sends SIGTERM: say so in the one summary line
        print(f"{tag} FAILED killed by signal {signum} (time limit)", flush=True)
        sys.exit(1)
    signal.signal(signal.SIGTERM, on_term)
    try:
        return run(a, tag)
    except Exception as e:  # compile errors, OOM, missing kernels: one line, no traceback storm
        msg = " ".join(f"{type(e).__name__}: {e}".split())[:300]
        print(f"{tag} FAILED {msg}", flush=True)
        return 1


def run(a, tag):
    import torch
    t_start = time.time()
    torch.manual_seed(a.seed)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    print(f"torch {torch.__version__} cuda {torch.version.cuda} cudnn {torch.backends.cudnn.version()} "
          f"{torch.cuda.get_device_name(0)} gqa={a.gqa}", flush=True)
    if a.gqa == "native":
        # enable_gqa is fused only by some backends; the math fallback would materialise S x S
        # scores per head: fail loudly instead. (Plain MHA shapes of --gqa repeat always fuse.)
        torch.backends.cuda.enable_math_sdp(False)
    model = build_model(torch, a)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.999), eps=1e-8, fused=True)
    fwd = torch.compile(model) if a.compile else model
    gen = torch.Generator(device="cpu").manual_seed(a.seed + 1)
    data = torch.randint(0, a.vocab, (a.gbs, 1, a.seq + 1), generator=gen)
    # One contiguous [1, S] input and target tensor per micro-batch (no offset views: inductor
    # guards on input alignment).
    inputs = [data[i, :, :-1].contiguous().to(dev) for i in range(a.gbs)]
    targets = [data[i, :, 1:].contiguous().to(dev) for i in range(a.gbs)]
    params = list(model.parameters())

    def step():
        for i in range(a.gbs):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = fwd(inputs[i], targets[i])
            (loss / a.gbs).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for w in range(a.warmup):
        t0 = time.time()
        loss = step()
        torch.cuda.synchronize()
        print(f"PEER-WARMUP {w + 1}/{a.warmup} {(time.time() - t0) * 1000:.1f} ms wall loss {loss.item():.4f}", flush=True)
    torch.cuda.reset_peak_memory_stats()
    times = []
    for it in range(a.iters):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        loss = step()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
        print(f"PEER-STEP {it + 1}/{a.iters} {times[-1]:.2f} ms loss {loss.item():.4f}", flush=True)
    if not times:
        raise RuntimeError("--iters 0: nothing timed")
    ms = sum(times) / len(times)
    flops = megatron_flops(a.gbs, a.seq, a.layers, a.hidden, a.ffn, a.heads, a.groups, a.head_dim, a.vocab)
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"{tag}: ms/iter {ms:.2f} tokens/s {a.gbs * a.seq / ms * 1000.0:.0f} TFLOP/s {flops / (ms * 1e-3) / 1e12:.1f} "
          f"peak_mem_GiB {peak:.1f} steps {len(times)} (params {n_params / 1e9:.3f} B, "
          f"min {min(times):.2f} max {max(times):.2f} ms, wall {time.time() - t_start:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
