"""Reference fixtures for the tiny GPT and tiny LLaMA model tests
(tests/unit_tests/models/gpt_model_test.cpp).

Independent PyTorch implementations written from the formulas (not from our C++ code):
  * GPT as Megatron's pretrain_gpt builds it: learned absolute positions, pre-LayerNorm,
    fused QKV with rows grouped per head ([q, k, v] per head when groups == heads), causal
    softmax attention, tanh-GeLU MLP (Megatron's fused bias_gelu), biases, final LayerNorm,
    output layer tied to the word embedding.
  * LLaMA following Hugging Face LlamaForCausalLM's math: RMSNorm, rotate_half RoPE, GQA via
    repeat_kv, SwiGLU MLP (down(silu(gate(x)) * up(x))), untied lm_head, no biases. Its
    HF-layout weights are converted to Megatron names (QKV rows grouped per query group, fc1 =
    [gate; up]) for our model.

Math is done in float64 from float32 weights so the fixture is exact to float32 precision.
Weights are random (biases and norm weights too, so every term is exercised). The loss
gradient dloss [b, s] is random; the gradients are d(sum(loss * dloss))/dparam.

Run: /usr/bin/python3 tests/reference/model/gen_model_fixtures.py   (Debian python3-torch 1.13)
"""
import math

import torch
import torch.nn.functional as F

from fixture_io import write_fixture

DT = torch.float64


def rand(shape, std, gen):
    return (torch.randn(shape, generator=gen, dtype=torch.float32) * std).to(DT).requires_grad_(True)


# ----------------------------------------------------------------------------------------------
# GPT (Megatron names and layouts)
# ----------------------------------------------------------------------------------------------
def gpt_reference():
    L, h, heads, V, s, b, ffn, max_pos = 2, 64, 4, 128, 32, 2, 256, 40
    d = h // heads
    eps = 1e-5
    gen = torch.Generator().manual_seed(1234)
    P = {}
    P["embedding.word_embeddings.weight"] = rand((V, h), 0.02, gen)
    P["embedding.position_embeddings.weight"] = rand((max_pos, h), 0.02, gen)
    for i in range(L):
        pre = f"decoder.layers.{i}."
        P[pre + "input_layernorm.weight"] = (1 + rand((h,), 0.1, gen)).detach().requires_grad_(True)
        P[pre + "input_layernorm.bias"] = rand((h,), 0.1, gen)
        P[pre + "self_attention.linear_proj.weight"] = rand((h, h), 0.02, gen)
        P[pre + "self_attention.linear_proj.bias"] = rand((h,), 0.02, gen)
        P[pre + "self_attention.linear_qkv.weight"] = rand((3 * h, h), 0.02, gen)
        P[pre + "self_attention.linear_qkv.bias"] = rand((3 * h,), 0.02, gen)
        P[pre + "pre_mlp_layernorm.weight"] = (1 + rand((h,), 0.1, gen)).detach().requires_grad_(True)
        P[pre + "pre_mlp_layernorm.bias"] = rand((h,), 0.1, gen)
        P[pre + "mlp.linear_fc1.weight"] = rand((ffn, h), 0.02, gen)
        P[pre + "mlp.linear_fc1.bias"] = rand((ffn,), 0.02, gen)
        P[pre + "mlp.linear_fc2.weight"] = rand((h, ffn), 0.02, gen)
        P[pre + "mlp.linear_fc2.bias"] = rand((h,), 0.02, gen)
    P["decoder.final_layernorm.weight"] = (1 + rand((h,), 0.1, gen)).detach().requires_grad_(True)
    P["decoder.final_layernorm.bias"] = rand((h,), 0.1, gen)

    tokens = torch.randint(0, V, (b, s), generator=gen)
    labels = torch.randint(0, V, (b, s), generator=gen)
    position_ids = torch.arange(s).unsqueeze(0).expand(b, s).contiguous()
    dloss = torch.rand((b, s), generator=gen, dtype=torch.float32)

    def gelu_tanh(x):  # Megatron fused bias_gelu
        return 0.5 * x * (1.0 + torch.tanh(0.79788456 * x * (1.0 + 0.044715 * x * x)))

    x = P["embedding.word_embeddings.weight"][tokens] + P["embedding.position_embeddings.weight"][position_ids]
    x = x.transpose(0, 1)  # [s, b, h]
    causal = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
    for i in range(L):
        pre = f"decoder.layers.{i}."
        ln = F.layer_norm(x, (h,), P[pre + "input_layernorm.weight"], P[pre + "input_layernorm.bias"], eps)
        qkv = ln @ P[pre + "self_attention.linear_qkv.weight"].T + P[pre + "self_attention.linear_qkv.bias"]
        qkv = qkv.view(s, b, heads, 3, d)  # groups == heads: per head [q, k, v]
        q, k, v = qkv[:, :, :, 0], qkv[:, :, :, 1], qkv[:, :, :, 2]  # [s, b, n, d]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))  # [b, n, s, d]
        scores = q @ k.transpose(-1, -2) / math.sqrt(d)
        scores = scores.masked_fill(causal, float("-inf"))
        ctx = torch.softmax(scores, dim=-1) @ v  # [b, n, s, d]
        ctx = ctx.permute(2, 0, 1, 3).reshape(s, b, h)
        attn = ctx @ P[pre + "self_attention.linear_proj.weight"].T + P[pre + "self_attention.linear_proj.bias"]
        x = x + attn
        ln = F.layer_norm(x, (h,), P[pre + "pre_mlp_layernorm.weight"], P[pre + "pre_mlp_layernorm.bias"], eps)
        fc1 = ln @ P[pre + "mlp.linear_fc1.weight"].T + P[pre + "mlp.linear_fc1.bias"]
        x = x + gelu_tanh(fc1) @ P[pre + "mlp.linear_fc2.weight"].T + P[pre + "mlp.linear_fc2.bias"]
    x = F.layer_norm(x, (h,), P["decoder.final_layernorm.weight"], P["decoder.final_layernorm.bias"], eps)
    logits = x @ P["embedding.word_embeddings.weight"].T  # [s, b, V], tied
    loss = F.cross_entropy(logits.reshape(s * b, V), labels.T.reshape(-1), reduction="none").view(s, b).T  # [b, s]
    (loss * dloss.to(DT)).sum().backward()

    out = {"tokens": tokens, "labels": labels, "position_ids": position_ids, "dloss": dloss,
           "logits": logits.detach(), "loss": loss.detach()}
    for k, p in P.items():
        out["param/" + k] = p.detach()
        out["grad/" + k] = p.grad
    write_fixture("tiny_gpt", out)


# ----------------------------------------------------------------------------------------------
# LLaMA (Hugging Face LlamaForCausalLM math, HF layouts, converted to Megatron names)
# ----------------------------------------------------------------------------------------------
LLAMA = dict(L=2, h=64, heads=4, groups=2, ffn=176, V=256, s=32, b=2, base=500000.0, eps=1e-5)


def llama_hf_weights(gen):
    c = LLAMA
    h, d = c["h"], c["h"] // c["heads"]
    W = {"model.embed_tokens.weight": rand((c["V"], h), 0.02, gen)}
    for i in range(c["L"]):
        pre = f"model.layers.{i}."
        W[pre + "input_layernorm.weight"] = (1 + rand((h,), 0.1, gen)).detach().requires_grad_(True)
        W[pre + "self_attn.q_proj.weight"] = rand((c["heads"] * d, h), 0.02, gen)
        W[pre + "self_attn.k_proj.weight"] = rand((c["groups"] * d, h), 0.02, gen)
        W[pre + "self_attn.v_proj.weight"] = rand((c["groups"] * d, h), 0.02, gen)
        W[pre + "self_attn.o_proj.weight"] = rand((h, c["heads"] * d), 0.02, gen)
        W[pre + "post_attention_layernorm.weight"] = (1 + rand((h,), 0.1, gen)).detach().requires_grad_(True)
        W[pre + "mlp.gate_proj.weight"] = rand((c["ffn"], h), 0.02, gen)
        W[pre + "mlp.up_proj.weight"] = rand((c["ffn"], h), 0.02, gen)
        W[pre + "mlp.down_proj.weight"] = rand((h, c["ffn"]), 0.02, gen)
    W["model.norm.weight"] = (1 + rand((h,), 0.1, gen)).detach().requires_grad_(True)
    W["lm_head.weight"] = rand((c["V"], h), 0.02, gen)
    return W


def hf_to_megatron(W, get):
    """Maps HF LLaMA tensors (via get(name)) to Megatron names/layouts (docs/megatron-reference.md#distributed-checkpoint)."""
    c = LLAMA
    d, npg = c["h"] // c["heads"], c["heads"] // c["groups"]
    M = {"embedding.word_embeddings.weight": get("model.embed_tokens.weight")}
    for i in range(c["L"]):
        hf, mg = f"model.layers.{i}.", f"decoder.layers.{i}."
        q = get(hf + "self_attn.q_proj.weight").view(c["groups"], npg * d, -1)
        k = get(hf + "self_attn.k_proj.weight").view(c["groups"], d, -1)
        v = get(hf + "self_attn.v_proj.weight").view(c["groups"], d, -1)
        M[mg + "input_layernorm.weight"] = get(hf + "input_layernorm.weight")
        M[mg + "self_attention.linear_proj.weight"] = get(hf + "self_attn.o_proj.weight")
        M[mg + "self_attention.linear_qkv.weight"] = torch.cat([q, k, v], dim=1).reshape(-1, c["h"])
        M[mg + "pre_mlp_layernorm.weight"] = get(hf + "post_attention_layernorm.weight")
        M[mg + "mlp.linear_fc1.weight"] = torch.cat([get(hf + "mlp.gate_proj.weight"), get(hf + "mlp.up_proj.weight")])
        M[mg + "mlp.linear_fc2.weight"] = get(hf + "mlp.down_proj.weight")
    M["decoder.final_layernorm.weight"] = get("model.norm.weight")
    M["output_layer.weight"] = get("lm_head.weight")
    return M


def llama_reference():
    c = LLAMA
    L, h, heads, groups, V, s, b = c["L"], c["h"], c["heads"], c["groups"], c["V"], c["s"], c["b"]
    d = h // heads
    gen = torch.Generator().manual_seed(4321)
    W = llama_hf_weights(gen)
    tokens = torch.randint(0, V, (b, s), generator=gen)
    labels = torch.randint(0, V, (b, s), generator=gen)
    dloss = torch.rand((b, s), generator=gen, dtype=torch.float32)

    def rmsnorm(x, w):  # LlamaRMSNorm
        var = x.pow(2).mean(-1, keepdim=True)
        return w * (x * torch.rsqrt(var + c["eps"]))

    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    inv_freq = 1.0 / (c["base"] ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    freqs = torch.arange(s).float()[:, None] * inv_freq[None, :]  # float32 as HF
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(DT), emb.sin().to(DT)  # [s, d]
    causal = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)

    x = W["model.embed_tokens.weight"][tokens]  # [b, s, h]
    for i in range(L):
        pre = f"model.layers.{i}."
        r = x
        x = rmsnorm(x, W[pre + "input_layernorm.weight"])
        q = (x @ W[pre + "self_attn.q_proj.weight"].T).view(b, s, heads, d).transpose(1, 2)
        k = (x @ W[pre + "self_attn.k_proj.weight"].T).view(b, s, groups, d).transpose(1, 2)
        v = (x @ W[pre + "self_attn.v_proj.weight"].T).view(b, s, groups, d).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(heads // groups, dim=1)  # repeat_kv
        v = v.repeat_interleave(heads // groups, dim=1)
        scores = (q @ k.transpose(2, 3)) / math.sqrt(d)
        scores = scores.masked_fill(causal, float("-inf"))
        a = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, s, h)
        x = r + a @ W[pre + "self_attn.o_proj.weight"].T
        r = x
        x = rmsnorm(x, W[pre + "post_attention_layernorm.weight"])
        x = (F.silu(x @ W[pre + "mlp.gate_proj.weight"].T) * (x @ W[pre + "mlp.up_proj.weight"].T)) @ \
            W[pre + "mlp.down_proj.weight"].T
        x = r + x
    x = rmsnorm(x, W["model.norm.weight"])
    logits = x @ W["lm_head.weight"].T  # [b, s, V]
    loss = F.cross_entropy(logits.reshape(b * s, V), labels.reshape(-1), reduction="none").view(b, s)
    (loss * dloss.to(DT)).sum().backward()

    out = {"tokens": tokens, "labels": labels, "dloss": dloss,
           "position_ids": torch.arange(s).unsqueeze(0).expand(b, s).contiguous(),
           "logits": logits.detach().transpose(0, 1).contiguous(),  # [s, b, V] like our last_logits
           "loss": loss.detach()}
    for k, t in hf_to_megatron(W, lambda n: W[n].detach()).items():
        out["param/" + k] = t
    for k, t in hf_to_megatron(W, lambda n: W[n].grad).items():
        out["grad/" + k] = t
    write_fixture("tiny_llama", out)


# ----------------------------------------------------------------------------------------------
# Option variants (Megatron formulas): --qk-layernorm, --apply-layernorm-1p, --add-qkv-bias with
# --disable-bias-linear, --kv-channels 12 (not hidden/heads = 8), RoPE interleaved with
# --rotary-percent 0.5, GQA, exact-erf GeLU, untied
# output layer, LayerNorm, and an explicit block-diagonal causal attention mask
# (--reset-attention-mask style: two documents per sequence).
# ----------------------------------------------------------------------------------------------
VARIANT = dict(L=2, h=48, heads=6, groups=3, kv=12, ffn=80, V=64, s=16, b=2, base=10000.0, percent=0.5, eps=1e-5)


def variant_reference():
    c = VARIANT
    L, h, heads, groups, V, s, b, ffn = c["L"], c["h"], c["heads"], c["groups"], c["V"], c["s"], c["b"], c["ffn"]
    d, npg = c["kv"], heads // groups
    gen = torch.Generator().manual_seed(777)
    P = {"embedding.word_embeddings.weight": rand((V, h), 0.02, gen)}
    for i in range(L):
        pre = f"decoder.layers.{i}."
        P[pre + "input_layernorm.weight"] = rand((h,), 0.1, gen)  # zero-centred: scale = 1 + w
        P[pre + "input_layernorm.bias"] = rand((h,), 0.1, gen)
        P[pre + "self_attention.linear_proj.weight"] = rand((h, heads * d), 0.05, gen)
        P[pre + "self_attention.linear_qkv.weight"] = rand(((heads + 2 * groups) * d, h), 0.05, gen)
        P[pre + "self_attention.linear_qkv.bias"] = rand(((heads + 2 * groups) * d,), 0.05, gen)
        P[pre + "self_attention.q_layernorm.weight"] = rand((d,), 0.1, gen)
        P[pre + "self_attention.q_layernorm.bias"] = rand((d,), 0.1, gen)
        P[pre + "self_attention.k_layernorm.weight"] = rand((d,), 0.1, gen)
        P[pre + "self_attention.k_layernorm.bias"] = rand((d,), 0.1, gen)
        P[pre + "pre_mlp_layernorm.weight"] = rand((h,), 0.1, gen)
        P[pre + "pre_mlp_layernorm.bias"] = rand((h,), 0.1, gen)
        P[pre + "mlp.linear_fc1.weight"] = rand((ffn, h), 0.05, gen)
        P[pre + "mlp.linear_fc2.weight"] = rand((h, ffn), 0.05, gen)
    P["decoder.final_layernorm.weight"] = rand((h,), 0.1, gen)
    P["decoder.final_layernorm.bias"] = rand((h,), 0.1, gen)
    P["output_layer.weight"] = rand((V, h), 0.05, gen)

    tokens = torch.randint(0, V, (b, s), generator=gen)
    labels = torch.randint(0, V, (b, s), generator=gen)
    dloss = torch.rand((b, s), generator=gen, dtype=torch.float32)
    # Two documents per row, boundaries at 5 and 11: causal within a document only.
    doc = torch.stack([(torch.arange(s) >= 5).long(), (torch.arange(s) >= 11).long()])
    allowed = (doc[:, :, None] == doc[:, None, :]) & torch.tril(torch.ones(s, s, dtype=torch.bool))
    mask = ~allowed[:, None]  # [b, 1, s, s], True = masked

    def ln(x, pre):  # LayerNorm with zero-centred gamma
        return F.layer_norm(x, (x.shape[-1],), 1.0 + P[pre + ".weight"], P[pre + ".bias"], c["eps"])

    rot = int(d * c["percent"])
    inv_freq = 1.0 / (c["base"] ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
    freqs = torch.arange(s).float()[:, None] * inv_freq
    emb = torch.stack((freqs, freqs), dim=-1).flatten(-2)  # interleaved
    cos, sin = emb.cos().to(DT)[:, None, None, :], emb.sin().to(DT)[:, None, None, :]

    def rope(t):  # [s, b, n, d], interleaved pairs (2i, 2i+1) on the first `rot` channels
        tr, tp = t[..., :rot], t[..., rot:]
        rotated = torch.stack((-tr[..., 1::2], tr[..., 0::2]), dim=-1).flatten(-2)
        return torch.cat((tr * cos + rotated * sin, tp), dim=-1)

    x = P["embedding.word_embeddings.weight"][tokens].transpose(0, 1)  # [s, b, h], no positions
    for i in range(L):
        pre = f"decoder.layers.{i}."
        y = ln(x, pre + "input_layernorm")
        qkv = y @ P[pre + "self_attention.linear_qkv.weight"].T + P[pre + "self_attention.linear_qkv.bias"]
        qkv = qkv.view(s, b, groups, npg + 2, d)
        q = qkv[:, :, :, :npg].reshape(s, b, heads, d)
        k, v = qkv[:, :, :, npg], qkv[:, :, :, npg + 1]
        q = rope(ln(q, pre + "self_attention.q_layernorm"))
        k = rope(ln(k, pre + "self_attention.k_layernorm"))
        qh = q.permute(1, 2, 0, 3)
        kh = k.permute(1, 2, 0, 3).repeat_interleave(npg, dim=1)
        vh = v.permute(1, 2, 0, 3).repeat_interleave(npg, dim=1)
        scores = (qh @ kh.transpose(-1, -2) / math.sqrt(d)).masked_fill(mask, float("-inf"))
        a = (torch.softmax(scores, -1) @ vh).permute(2, 0, 1, 3).reshape(s, b, heads * d)
        x = x + a @ P[pre + "self_attention.linear_proj.weight"].T
        y = ln(x, pre + "pre_mlp_layernorm")
        x = x + F.gelu(y @ P[pre + "mlp.linear_fc1.weight"].T) @ P[pre + "mlp.linear_fc2.weight"].T
    x = ln(x, "decoder.final_layernorm")
    logits = x @ P["output_layer.weight"].T  # [s, b, V]
    loss = F.cross_entropy(logits.reshape(s * b, V), labels.T.reshape(-1), reduction="none").view(s, b).T
    (loss * dloss.to(DT)).sum().backward()
    out = {"tokens": tokens, "labels": labels, "position_ids": torch.arange(s).expand(b, s).contiguous(),
           "attention_mask": mask.to(torch.int64), "dloss": dloss, "logits": logits.detach(), "loss": loss.detach()}
    for k, p in P.items():
        out["param/" + k] = p.detach()
        out["grad/" + k] = p.grad
    write_fixture("tiny_variants", out)


if __name__ == "__main__":
    torch.set_num_threads(1)
    gpt_reference()
    llama_reference()
    variant_reference()
