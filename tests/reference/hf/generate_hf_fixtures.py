#!/usr/bin/env python3
"""Writes Hugging Face transformers reference fixtures for tiny LLaMA and GPT-2 models.

Run on a machine with torch + transformers + safetensors (the GPU machine's Python):
    python3 generate_hf_fixtures.py OUT_DIR
For each model it writes OUT_DIR/<name>/:
    config.json, model.safetensors   (save_pretrained, float32)
    inputs.json                      tokens [b][s], labels [b][s] (labels = next token)
    logits.safetensors               "logits" float32 [b, s, V]
    grads.safetensors                d(mean CE loss)/d(param) for every HF parameter name
    loss.json                        {"loss": mean cross entropy over all b*s positions}
The loss is computed here from the logits (plain mean cross entropy), not by the model's own
labels path, so the comparison does not depend on HF's internal label shifting.
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM


def run(model, name, out, vocab, b=2, s=16, seed=1234):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    model = model.float().eval()  # eval: no dropout
    model.save_pretrained(d, safe_serialization=True)
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, vocab, (b, s + 1), generator=g)
    tokens, labels = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
    logits = model(input_ids=tokens).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    loss.backward()
    save_file({"logits": logits.detach().contiguous()}, os.path.join(d, "logits.safetensors"))
    grads = {n: p.grad.detach().contiguous() for n, p in model.named_parameters() if p.grad is not None}
    save_file(grads, os.path.join(d, "grads.safetensors"))
    with open(os.path.join(d, "inputs.json"), "w") as f:
        json.dump({"tokens": tokens.tolist(), "labels": labels.tolist()}, f)
    with open(os.path.join(d, "loss.json"), "w") as f:
        json.dump({"loss": loss.item()}, f)
    print(name, "loss", loss.item(), "params", sum(p.numel() for p in model.parameters()))


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False, hidden_act="silu", initializer_range=0.02))
    run(llama, "llama_tiny", out, 256)
    torch.manual_seed(1)
    gpt2 = GPT2LMHeadModel(GPT2Config(
        vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=4,
        activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        layer_norm_epsilon=1e-5, initializer_range=0.02))
    run(gpt2, "gpt2_tiny", out, 256)


if __name__ == "__main__":
    main()
