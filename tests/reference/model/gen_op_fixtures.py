"""Reference fixtures for the CPU op tests (tests/unit_tests/ops/cpu_ops_test.cpp).

Every op of megatron/core/ops/ops.h is written here from its formula with PyTorch (float64
math from float32 inputs; gradients by autograd from a random upstream gradient dy).

Run: /usr/bin/python3 tests/reference/model/gen_op_fixtures.py   (Debian python3-torch 1.13)
"""
import math

import torch
import torch.nn.functional as F

from fixture_io import write_fixture

DT = torch.float64
gen = torch.Generator().manual_seed(99)
out = {}


def rnd(*shape, std=1.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float32) * std).to(DT).requires_grad_(True)


def save(prefix, **tensors):
    for k, v in tensors.items():
        out[f"{prefix}/{k}"] = v.detach() if isinstance(v, torch.Tensor) else v


def grads(y, inputs):
    dy = torch.randn(y.shape, generator=gen, dtype=torch.float32).to(DT)
    gs = torch.autograd.grad(y, inputs, dy)
    return dy, gs


# ---- norms -------------------------------------------------------------------------------------
for name, zc in (("layernorm", False), ("layernorm_1p", True)):
    x, g, b = rnd(6, 40, std=2.0), rnd(40, std=0.5), rnd(40, std=0.5)
    y = F.layer_norm(x, (40,), g + (1.0 if zc else 0.0), b, 1e-5)
    dy, (dx, dg, db) = grads(y, (x, g, b))
    save(name, x=x, gamma=g, beta=b, y=y, dy=dy, dx=dx, dgamma=dg, dbeta=db)
for name, zc in (("rmsnorm", False), ("rmsnorm_1p", True)):
    x, g = rnd(6, 40, std=2.0), rnd(40, std=0.5)
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * (g + (1.0 if zc else 0.0))
    dy, (dx, dg) = grads(y, (x, g))
    save(name, x=x, gamma=g, y=y, dy=dy, dx=dx, dgamma=dg)

# ---- activations -------------------------------------------------------------------------------
for name, approx in (("gelu_erf", "none"), ("gelu_tanh", "tanh")):
    x = rnd(5, 33, std=2.0)
    y = F.gelu(x, approximate=approx)
    dy, (dx,) = grads(y, (x,))
    save(name, x=x, y=y, dy=dy, dx=dx)
x = rnd(5, 2 * 20, std=2.0)
y = F.silu(x[:, :20]) * x[:, 20:]
dy, (dx,) = grads(y, (x,))
save("swiglu", x=x, y=y, dy=dy, dx=dx)

# ---- linear / gemm -----------------------------------------------------------------------------
x, w, b = rnd(3, 5, 24), rnd(16, 24), rnd(16)
y = x @ w.T + b
dy, (dx, dw, db) = grads(y, (x, w, b))
save("linear", x=x, w=w, b=b, y=y, dy=dy, dx=dx, dw=dw, db=db)
a, bm, c = rnd(7, 5), rnd(5, 9), rnd(7, 9)
save("gemm", a=a, b=bm, c=c, at=a.T.contiguous(), bt=bm.T.contiguous(), ab=a @ bm, axpby=2.0 * (a @ bm) + 0.5 * c)

# ---- embedding (a vocab shard [5, 15) of a 20-row table) ---------------------------------------
table = rnd(20, 8)
ids = torch.randint(0, 20, (4, 3), generator=gen)
full = table[ids]
inside = ((ids >= 5) & (ids < 15)).unsqueeze(-1)
y = torch.where(inside, full, torch.zeros_like(full))
dy, (dtable,) = grads(y, (table,))
save("embedding", table=table[5:15], ids=ids, y=y, dy=dy, dtable=dtable[5:15])


# ---- RoPE (Megatron RotaryEmbedding + apply_rotary_pos_emb) ------------------------------------
def rope_ref(t, pos, base, percent, interleaved):
    d = t.shape[-1]
    rot = int(d * percent)
    inv_freq = 1.0 / (base ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
    freqs = pos.float()[..., None] * inv_freq  # [s, b, rot/2]
    if interleaved:
        emb = torch.stack((freqs, freqs), dim=-1).flatten(-2)
    else:
        emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(DT)[:, :, None, :], emb.sin().to(DT)[:, :, None, :]
    tr, tp = t[..., :rot], t[..., rot:]
    if interleaved:
        x1, x2 = tr[..., 0::2], tr[..., 1::2]
        rotated = torch.stack((-x2, x1), dim=-1).flatten(-2)
    else:
        x1, x2 = tr[..., : rot // 2], tr[..., rot // 2:]
        rotated = torch.cat((-x2, x1), dim=-1)
    return torch.cat((tr * cos + rotated * sin, tp), dim=-1)


s, b = 6, 2
pos_default = torch.arange(s)[:, None].expand(s, b)
x = rnd(s, b, 3, 8)
y = rope_ref(x, pos_default, 10000.0, 1.0, False)
dy, (dx,) = grads(y, (x,))
save("rope_half", x=x, y=y, dy=dy, dx=dx)
pos_ids = torch.randint(0, 50, (s, b), generator=gen)
x = rnd(s, b, 3, 8)
y = rope_ref(x, pos_ids, 500.0, 0.5, True)
dy, (dx,) = grads(y, (x,))
save("rope_interleaved_half_percent", x=x, position_ids=pos_ids, y=y, dy=dy, dx=dx)

# ---- fused QKV split (rows per query group: [q_1..q_{np/ng}, k, v]) + RoPE ---------------------
np_, ng, d = 4, 2, 8
qkv = rnd(s, b, ng * (np_ // ng + 2) * d)
grp = qkv.view(s, b, ng, np_ // ng + 2, d)
q = grp[:, :, :, : np_ // ng].reshape(s, b, np_, d)
k, v = grp[:, :, :, np_ // ng], grp[:, :, :, np_ // ng + 1]
q, k = rope_ref(q, pos_default, 10000.0, 1.0, False), rope_ref(k, pos_default, 10000.0, 1.0, False)
yq = torch.cat([q.flatten(), k.flatten(), v.flatten()])
dy = torch.randn(yq.shape, generator=gen, dtype=torch.float32).to(DT)
(dqkv,) = torch.autograd.grad(yq, (qkv,), dy)
nq, nk = q.numel(), k.numel()
save("qkv_split_rope", qkv=qkv, q=q, k=k, v=v, dq=dy[:nq].view(q.shape), dk=dy[nq:nq + nk].view(k.shape),
     dv=dy[nq + nk:].view(v.shape), dqkv=dqkv)


# ---- core attention (GQA, causal or explicit mask) --------------------------------------------
def attention_ref(q, k, v, mask):  # q [s, b, np, d], k/v [sk, b, ng, d], mask [b, 1, s, sk] True = masked
    npg = q.shape[2] // k.shape[2]
    qh = q.permute(1, 2, 0, 3)
    kh = k.permute(1, 2, 0, 3).repeat_interleave(npg, dim=1)
    vh = v.permute(1, 2, 0, 3).repeat_interleave(npg, dim=1)
    scores = qh @ kh.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [b, np, s]
    o = torch.softmax(scores, dim=-1) @ vh
    return o.permute(2, 0, 1, 3), lse


s = 7
for name in ("attention_causal", "attention_mask"):
    q, k, v = rnd(s, b, 4, 8), rnd(s, b, 2, 8), rnd(s, b, 2, 8)
    if name == "attention_causal":
        mask = torch.triu(torch.ones(s, s, dtype=torch.bool), 1).expand(b, 1, s, s)
    else:
        mask = torch.rand((b, 1, s, s), generator=gen) < 0.4
        mask = mask & ~torch.eye(s, dtype=torch.bool)  # keep the diagonal: no fully masked row
    o, lse = attention_ref(q, k, v, mask)
    dy, (dq, dk, dv) = grads(o, (q, k, v))
    save(name, q=q, k=k, v=v, mask=mask.to(torch.int64), out=o, lse=lse, dout=dy, dq=dq, dk=dk, dv=dv)

# A long causal sequence: several 64-row blocks of the CPU kernel, the last one partial.
s = 150
q, k, v = rnd(s, 1, 2, 8), rnd(s, 1, 1, 8), rnd(s, 1, 1, 8)
mask = torch.triu(torch.ones(s, s, dtype=torch.bool), 1).expand(1, 1, s, s)
o, lse = attention_ref(q, k, v, mask)
dy, (dq, dk, dv) = grads(o, (q, k, v))
save("attention_long", q=q, k=k, v=v, out=o, lse=lse, dout=dy, dq=dq, dk=dk, dv=dv)

# ---- cross entropy over two vocab shards [0, 12) and [12, 24) ----------------------------------
logits = rnd(10, 24, std=3.0)
labels = torch.randint(0, 24, (10,), generator=gen)
loss = F.cross_entropy(logits, labels, reduction="none")
dl = torch.rand((10,), generator=gen, dtype=torch.float32).to(DT)
(dlogits,) = torch.autograd.grad(loss, (logits,), dl)
save("cross_entropy", logits=logits, labels=labels, loss=loss, lse=torch.logsumexp(logits, -1), dloss=dl,
     dlogits=dlogits)

# ---- Adam / AdamW: 3 steps, torch.optim ---------------------------------------------------------
for name, decoupled in (("adamw", True), ("adam_l2", False)):
    p0 = torch.randn(50, generator=gen, dtype=torch.float32)
    gs = [torch.randn(50, generator=gen, dtype=torch.float32) for _ in range(3)]
    p = p0.clone().to(DT).requires_grad_(True)
    opt_cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    opt = opt_cls([p], lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for g in gs:
        p.grad = g.to(DT)
        opt.step()
    st = opt.state[p]
    save(name, p0=p0, g0=gs[0], g1=gs[1], g2=gs[2], p3=p, exp_avg=st["exp_avg"], exp_avg_sq=st["exp_avg_sq"])

if __name__ == "__main__":
    write_fixture("ops", out)
