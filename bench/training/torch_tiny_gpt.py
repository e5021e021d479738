#!/usr/bin/env python3
"""The peer for bench/training/run_bench.sh: the same tiny GPT as pretrain_gpt builds it
(learned positions, pre-LayerNorm, fused per-head QKV, causal attention, tanh-GeLU MLP with
biases, tied output layer), trained in PyTorch fp32 on CPU with AdamW (betas 0.9/0.999, wd 0.01
on 2-D weights), global-norm clipping 1.0, one micro-batch per step (Megatron's masked-mean
loss). Written from the formulas (not from megatron.cpp). Prints tokens/s over the timed steps.

Usage: /usr/bin/python3 torch_tiny_gpt.py --threads T --layers L --hidden H --heads N --seq S
       --batch B --vocab V --steps K --warmup W
"""
import argparse
import math
import time

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, h, heads):
        super().__init__()
        self.heads, self.d = heads, h // heads
        self.ln1 = torch.nn.LayerNorm(h, eps=1e-5)
        self.qkv = torch.nn.Linear(h, 3 * h)
        self.proj = torch.nn.Linear(h, h)
        self.ln2 = torch.nn.LayerNorm(h, eps=1e-5)
        self.fc1 = torch.nn.Linear(h, 4 * h)
        self.fc2 = torch.nn.Linear(4 * h, h)

    def forward(self, x, causal):  # x [s, b, h]
        s, b, h = x.shape
        qkv = self.qkv(self.ln1(x)).view(s, b, self.heads, 3, self.d)
        q, k, v = (qkv[:, :, :, j].permute(1, 2, 0, 3) for j in range(3))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(self.d)
        att = att.masked_fill(causal, float("-inf")).softmax(-1)
        ctx = (att @ v).permute(2, 0, 1, 3).reshape(s, b, h)
        x = x + self.proj(ctx)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(torch.nn.Module):
    def __init__(self, L, h, heads, V, s):
        super().__init__()
        self.wte = torch.nn.Embedding(V, h)
        self.wpe = torch.nn.Embedding(s, h)
        self.blocks = torch.nn.ModuleList(Block(h, heads) for _ in range(L))
        self.ln_f = torch.nn.LayerNorm(h, eps=1e-5)
        for p in self.parameters():
            if p.dim() > 1:
                torch.nn.init.normal_(p, 0.0, 0.02)

    def forward(self, tokens, labels, mask):
        b, s = tokens.shape
        x = (self.wte(tokens) + self.wpe(torch.arange(s))).transpose(0, 1)
        causal = torch.triu(torch.ones(s, s, dtype=torch.bool), 1)
        for blk in self.blocks:
            x = blk(x, causal)
        logits = self.ln_f(x) @ self.wte.weight.T  # tied
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.T.reshape(-1), reduction="none")
        m = mask.T.reshape(-1)
        return (loss * m).sum() / m.sum()


def main():
    ap = argparse.ArgumentParser()
    for k, v in dict(threads=2, layers=2, hidden=128, heads=4, seq=128, batch=8, vocab=128, steps=20, warmup=3).items():
        ap.add_argument("--" + k, type=int, default=v)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    Vp = (a.vocab + 127) // 128 * 128
    model = GPT(a.layers, a.hidden, a.heads, Vp, a.seq)
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    rest = [p for n, p in model.named_parameters() if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}], lr=1e-3)
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq))
    labels = (tokens + 1) % a.vocab
    mask = torch.ones(a.batch, a.seq)
    t0 = None
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            t0 = time.perf_counter()
        opt.zero_grad()
        loss = model(tokens, labels, mask)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    dt = time.perf_counter() - t0
    print(f"torch {torch.__version__} threads {a.threads}: {a.steps} steps in {dt:.3f} s, "
          f"{a.steps * a.batch * a.seq / dt:.0f} tokens/s, final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
