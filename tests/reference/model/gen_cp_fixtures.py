"""Reference fixtures for context-parallel (ring) attention
(tests/unit_tests/transformer/context_parallel_test.cpp).

Plain full-sequence attention written from its formula with PyTorch (float64 math from float32
inputs, gradients by autograd): softmax(q k^T / sqrt(d) + mask) v with grouped-query K/V, on a
sequence long enough to be cut into 2*CP chunks for CP = 1, 2, 3, 4, 6. The test slices q/k/v
per CP rank itself; no chunking or ring happens here, so the reference is independent of the
code under test.

Run: /usr/bin/python3 tests/reference/model/gen_cp_fixtures.py   (Debian python3-torch 1.13)
"""
import math

import torch

from fixture_io import write_fixture

DT = torch.float64
gen = torch.Generator().manual_seed(2024)
out = {}


def rnd(*shape):
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(DT).requires_grad_(True)


def attention_ref(q, k, v, mask):  # q [s, b, np, d], k/v [s, b, ng, d], mask [b, 1, s, s] True = masked
    npg = q.shape[2] // k.shape[2]
    qh = q.permute(1, 2, 0, 3)
    kh = k.permute(1, 2, 0, 3).repeat_interleave(npg, dim=1)
    vh = v.permute(1, 2, 0, 3).repeat_interleave(npg, dim=1)
    scores = qh @ kh.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [b, np, s]
    o = torch.softmax(scores, dim=-1) @ vh
    return o.permute(2, 0, 1, 3), lse


s, b = 24, 2
causal = torch.triu(torch.ones(s, s, dtype=torch.bool), 1)
# Megatron's --reset-attention-mask: causal within documents; documents end after tokens 6 and 15.
doc = torch.zeros(s, dtype=torch.int64)
doc[7:16] = 1
doc[16:] = 2
reset = causal | (doc[:, None] != doc[None, :])
for name, mask2d in (("cp_attention_causal", causal), ("cp_attention_reset", reset)):
    q, k, v = rnd(s, b, 4, 8), rnd(s, b, 2, 8), rnd(s, b, 2, 8)
    mask = mask2d.expand(b, 1, s, s)
    o, lse = attention_ref(q, k, v, mask)
    dy = torch.randn(o.shape, generator=gen, dtype=torch.float32).to(DT)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), dy)
    for key, t in dict(q=q, k=k, v=v, mask=mask.to(torch.int64), out=o, lse=lse, dout=dy, dq=dq, dk=dk,
                       dv=dv).items():
        out[f"{name}/{key}"] = t.detach()

if __name__ == "__main__":
    write_fixture("cp_attention", out)
