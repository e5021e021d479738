#!/usr/bin/env python3
"""10 optimizer steps of the tiny GPT in PyTorch: the reference for
tests/unit_tests/training/gpt_training_test.cpp.

The model is written from the formulas (Megatron's pretrain_gpt GPT: learned positions,
pre-LayerNorm, fused per-head QKV, causal softmax attention, tanh-GeLU MLP, biases, final
LayerNorm, tied output layer), in float64, starting from the tiny GPT weights of
tests/reference/model/data/tiny_gpt (written by gen_model_fixtures.py). Training as
Megatron with 2 micro-batches per step: per micro-batch loss = sum(loss*mask)/sum(mask), divided
by the number of micro-batches (docs/megatron-reference.md#loss-normalisation); global-norm clipping at 1.0
(torch.nn.utils.clip_grad_norm_); torch.optim.AdamW(betas=(0.9, 0.95), eps=1e-8) with weight decay
0.1 on 2-D weights and 0 on biases / norm parameters (docs/megatron-reference.md#param-groups); constant lr 1e-3.
Recorded: per step the token-weighted lm loss (docs/megatron-reference.md#training-log-line) and the pre-clip grad norm, and the final
parameters.

Run: /usr/bin/python3 tests/reference/training/gen_tiny_gpt_training.py   (python3-torch 1.13)
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "model"))
import fixture_io  # noqa: E402

DT = torch.float64
L, h, heads, V, s, b, ffn = 2, 64, 4, 128, 32, 2, 256
d = h // heads
EPS = 1e-5


def load_tiny_gpt():
    base = os.path.join(HERE, "..", "model", "data", "tiny_gpt")
    idx = json.load(open(base + ".json"))["tensors"]
    raw = open(base + ".bin", "rb").read()
    P = {}
    for k, e in idx.items():
        if not k.startswith("param/"):
            continue
        n = int(np.prod(e["shape"]))
        a = np.frombuffer(raw, dtype="<f4", count=n, offset=e["offset"]).reshape(e["shape"])
        P[k[len("param/"):]] = torch.tensor(a.copy(), dtype=DT, requires_grad=True)
    return P


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(0.79788456 * x * (1.0 + 0.044715 * x * x)))


def per_token_loss(P, tokens, labels):
    pos = torch.arange(s).unsqueeze(0).expand(tokens.shape[0], s)
    x = (P["embedding.word_embeddings.weight"][tokens] + P["embedding.position_embeddings.weight"][pos]).transpose(0, 1)
    bb = tokens.shape[0]
    causal = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
    for i in range(L):
        pre = f"decoder.layers.{i}."
        ln = F.layer_norm(x, (h,), P[pre + "input_layernorm.weight"], P[pre + "input_layernorm.bias"], EPS)
        qkv = (ln @ P[pre + "self_attention.linear_qkv.weight"].T + P[pre + "self_attention.linear_qkv.bias"])
        qkv = qkv.view(s, bb, heads, 3, d)
        q, k, v = (qkv[:, :, :, j].permute(1, 2, 0, 3) for j in range(3))
        sc = (q @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(causal, float("-inf"))
        ctx = (torch.softmax(sc, dim=-1) @ v).permute(2, 0, 1, 3).reshape(s, bb, h)
        x = x + ctx @ P[pre + "self_attention.linear_proj.weight"].T + P[pre + "self_attention.linear_proj.bias"]
        ln = F.layer_norm(x, (h,), P[pre + "pre_mlp_layernorm.weight"], P[pre + "pre_mlp_layernorm.bias"], EPS)
        fc1 = ln @ P[pre + "mlp.linear_fc1.weight"].T + P[pre + "mlp.linear_fc1.bias"]
        x = x + gelu_tanh(fc1) @ P[pre + "mlp.linear_fc2.weight"].T + P[pre + "mlp.linear_fc2.bias"]
    x = F.layer_norm(x, (h,), P["decoder.final_layernorm.weight"], P["decoder.final_layernorm.bias"], EPS)
    logits = x @ P["embedding.word_embeddings.weight"].T
    return F.cross_entropy(logits.reshape(s * bb, V), labels.T.reshape(-1), reduction="none").view(s, bb).T


def main():
    P = load_tiny_gpt()
    gen = torch.Generator().manual_seed(42)
    steps, nmb = 10, 2
    decay = [p for n, p in P.items() if p.dim() > 1 and not n.endswith(".bias")]
    no_decay = [p for n, p in P.items() if not (p.dim() > 1 and not n.endswith(".bias"))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    out = {}
    losses, norms = [], []
    for step in range(steps):
        opt.zero_grad()
        num, den = 0.0, 0.0
        for m in range(nmb):
            # A learnable pattern (label = token + 1) plus random masked positions.
            tokens = torch.randint(0, V, (b, s), generator=gen)
            labels = (tokens + 1) % V
            mask = (torch.rand((b, s), generator=gen) > 0.2).to(DT)
            out[f"tokens/{step}/{m}"] = tokens
            out[f"labels/{step}/{m}"] = labels
            out[f"loss_mask/{step}/{m}"] = mask.float()
            lt = per_token_loss(P, tokens, labels)
            lsum = (lt * mask).sum()
            (lsum / mask.sum().clamp(min=1) / nmb).backward()
            num += float(lsum)
            den += float(mask.sum())
        norm = torch.nn.utils.clip_grad_norm_(list(P.values()), max_norm=1.0)
        opt.step()
        losses.append(num / den)
        norms.append(float(norm))
    out["lm_loss"] = torch.tensor(losses, dtype=torch.float32)
    out["grad_norm"] = torch.tensor(norms, dtype=torch.float32)
    for n, p in P.items():
        out["final/" + n] = p.detach()
    fixture_io.DATA_DIR = os.path.join(HERE, "data")
    fixture_io.write_fixture("tiny_gpt_training", out)
    print("losses", losses)


if __name__ == "__main__":
    main()
