"""Writes tests/reference/model/data/tiny_llama_hf.{json,bin} from Hugging Face transformers'
LlamaForCausalLM (the lead runs this where transformers is installed, e.g. the GPU machine's
Python; it is NOT needed to build or run the tests).

It loads the weights, tokens, labels and dloss of the committed tiny_llama fixture (written
by gen_model_fixtures.py), converts the Megatron-named weights back to Hugging Face names
(linear_qkv rows grouped per query group -> q_proj/k_proj/v_proj; linear_fc1 = [gate; up]),
runs LlamaForCausalLM in float64 (eager attention), and writes logits [s, b, V], the
per-token loss [b, s] and d(sum(loss * dloss))/dparam under Megatron names, in the same
format. tests/unit_tests/models/gpt_model_test.cpp (TinyLlamaMatchesTransformers) compares
our model with it when the file exists.

Run: python3 tests/reference/model/hf_llama_reference.py
"""
import json
import os

import numpy as np
import torch
import torch.nn.functional as F

from fixture_io import DATA_DIR, write_fixture

L, H, HEADS, GROUPS, FFN, V, BASE, EPS = 2, 64, 4, 2, 176, 256, 500000.0, 1e-5
D = H // HEADS
NPG = HEADS // GROUPS


def read_fixture(name):
    base = os.path.join(DATA_DIR, name)
    with open(base + ".json") as f:
        index = json.load(f)["tensors"]
    raw = open(base + ".bin", "rb").read()
    out = {}
    for k, e in index.items():
        dt = np.int64 if e["dtype"] == "int64" else np.float32
        n = int(np.prod(e["shape"])) if e["shape"] else 1
        arr = np.frombuffer(raw, dtype=dt, count=n, offset=e["offset"]).reshape(e["shape"])
        out[k] = torch.from_numpy(arr.copy())
    return out


def megatron_to_hf(M):
    W = {"model.embed_tokens.weight": M["embedding.word_embeddings.weight"]}
    for i in range(L):
        mg, hf = f"decoder.layers.{i}.", f"model.layers.{i}."
        qkv = M[mg + "self_attention.linear_qkv.weight"].view(GROUPS, NPG + 2, D, H)
        W[hf + "self_attn.q_proj.weight"] = qkv[:, :NPG].reshape(HEADS * D, H)
        W[hf + "self_attn.k_proj.weight"] = qkv[:, NPG].reshape(GROUPS * D, H)
        W[hf + "self_attn.v_proj.weight"] = qkv[:, NPG + 1].reshape(GROUPS * D, H)
        W[hf + "self_attn.o_proj.weight"] = M[mg + "self_attention.linear_proj.weight"]
        W[hf + "input_layernorm.weight"] = M[mg + "input_layernorm.weight"]
        W[hf + "post_attention_layernorm.weight"] = M[mg + "pre_mlp_layernorm.weight"]
        fc1 = M[mg + "mlp.linear_fc1.weight"]
        W[hf + "mlp.gate_proj.weight"], W[hf + "mlp.up_proj.weight"] = fc1[:FFN], fc1[FFN:]
        W[hf + "mlp.down_proj.weight"] = M[mg + "mlp.linear_fc2.weight"]
    W["model.norm.weight"] = M["decoder.final_layernorm.weight"]
    W["lm_head.weight"] = M["output_layer.weight"]
    return W


def hf_grads_to_megatron(G):
    M = {"embedding.word_embeddings.weight": G["model.embed_tokens.weight"]}
    for i in range(L):
        mg, hf = f"decoder.layers.{i}.", f"model.layers.{i}."
        q = G[hf + "self_attn.q_proj.weight"].view(GROUPS, NPG * D, H)
        k = G[hf + "self_attn.k_proj.weight"].view(GROUPS, D, H)
        v = G[hf + "self_attn.v_proj.weight"].view(GROUPS, D, H)
        M[mg + "self_attention.linear_qkv.weight"] = torch.cat([q, k, v], dim=1).reshape(-1, H)
        M[mg + "self_attention.linear_proj.weight"] = G[hf + "self_attn.o_proj.weight"]
        M[mg + "input_layernorm.weight"] = G[hf + "input_layernorm.weight"]
        M[mg + "pre_mlp_layernorm.weight"] = G[hf + "post_attention_layernorm.weight"]
        M[mg + "mlp.linear_fc1.weight"] = torch.cat([G[hf + "mlp.gate_proj.weight"], G[hf + "mlp.up_proj.weight"]])
        M[mg + "mlp.linear_fc2.weight"] = G[hf + "mlp.down_proj.weight"]
    M["decoder.final_layernorm.weight"] = G["model.norm.weight"]
    M["output_layer.weight"] = G["lm_head.weight"]
    return M


def main():
    from transformers import LlamaConfig, LlamaForCausalLM

    fx = read_fixture("tiny_llama")
    M = {k[len("param/"):]: v for k, v in fx.items() if k.startswith("param/")}
    cfg = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=FFN, num_hidden_layers=L,
                      num_attention_heads=HEADS, num_key_value_heads=GROUPS, head_dim=D, max_position_embeddings=64,
                      rope_theta=BASE, rms_norm_eps=EPS, hidden_act="silu", tie_word_embeddings=False,
                      attention_bias=False, mlp_bias=False, attention_dropout=0.0)
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg)
    missing, unexpected = model.load_state_dict(megatron_to_hf(M), strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    model = model.double()
    tokens, labels, dloss = fx["tokens"], fx["labels"], fx["dloss"].double()
    b, s = tokens.shape
    logits = model(input_ids=tokens).logits  # [b, s, V]
    loss = F.cross_entropy(logits.reshape(b * s, V), labels.reshape(-1), reduction="none").view(b, s)
    (loss * dloss).sum().backward()
    G = {n: p.grad for n, p in model.named_parameters()}
    out = {"tokens": tokens, "labels": labels, "dloss": fx["dloss"], "position_ids": fx["position_ids"],
           "logits": logits.detach().transpose(0, 1).contiguous(), "loss": loss.detach()}
    for k, v in M.items():
        out["param/" + k] = v
    for k, v in hf_grads_to_megatron(G).items():
        out["grad/" + k] = v
    write_fixture("tiny_llama_hf", out)


if __name__ == "__main__":
    main()
