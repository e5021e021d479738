#!/usr/bin/env python3
"""Writes the text-generation oracle fixtures: greedy continuations and log-probs by transformers.

Run on a machine with torch + transformers + safetensors (the GPU machine's Python; CPU math,
float32, no network):
    python3 tests/reference/hf/generate_generation_fixtures.py tests/reference/hf/generation
For each model it writes OUT_DIR/<name>/:
    config.json, model.safetensors  (save_pretrained, float32)
    generation.json                 {"prompts": [[ids]], "continuations": [[64 ids]],
                                     "log_probs": [[log p(token j+1 | tokens 0..j)]] over prompt +
                                     continuation, "min_top2_margin": [per prompt], "versions": {...}}
The models have the tiny shapes of generate_hf_fixtures.py (2 layers, hidden 64, vocab 256) but
128 positions (GPT-2's 64 cannot hold a prompt plus 64 new tokens) and initializer_range 0.2: with
the usual 0.02 the next-token distribution of a random model is nearly uniform (log p ~ -ln 256)
and the top-2 logit margins (~1e-4) approach float32 summation noise, so token-for-token
equality would test rounding, not the implementation. min_top2_margin records the smallest
margin seen while generating; the script fails if it is below 1e-3.
Each prompt is generated alone (batch 1, no padding): Megatron's batching semantics are checked
by our own tests against these single-prompt results.
"""
import json
import os
import sys

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

NEW_TOKENS = 64
MIN_MARGIN = 1e-3


def generate_all(model, vocab, prompt_lengths, seed):
    """Greedy 64-token continuations, log-probs and top-2 margins of prompts drawn from `seed`."""
    g = torch.Generator().manual_seed(seed)
    res = {"prompts": [], "continuations": [], "log_probs": [], "min_top2_margin": [],
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}
    with torch.no_grad():
        for n in prompt_lengths:
            prompt = torch.randint(0, vocab, (1, n), generator=g)
            gen = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                 max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, num_beams=1,
                                 output_scores=True, return_dict_in_generate=True)
            seq = gen.sequences[0]
            margins = [float(s[0].topk(2).values[0] - s[0].topk(2).values[1]) for s in gen.scores]
            logits = model(input_ids=seq[None]).logits[0]  # full recompute of prompt + continuation
            lp = torch.log_softmax(logits.double(), dim=-1)[:-1].gather(1, seq[1:, None])[:, 0]
            res["prompts"].append(prompt[0].tolist())
            res["continuations"].append(seq[n:].tolist())
            res["log_probs"].append(lp.tolist())
            res["min_top2_margin"].append(min(margins))
            assert len(seq) - n == NEW_TOKENS, len(seq) - n
    return res


def run(model, name, out, vocab, prompt_lengths, seed):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    model = model.float().eval()
    model.generation_config.eos_token_id = None  # exactly NEW_TOKENS tokens (our side: no early stop)
    model.generation_config.pad_token_id = 0
    model.save_pretrained(d, safe_serialization=True)
    # Prompts are drawn from seed, seed + 1000, ...: the first draw whose greedy continuations all
    # keep every top-2 logit margin >= MIN_MARGIN is kept (its seed is recorded), so the fixture
    # never asks for token equality where float32 rounding could decide the argmax.
    for attempt in range(20):
        prompt_seed = seed + 1000 * attempt
        res = generate_all(model, vocab, prompt_lengths, prompt_seed)
        if min(res["min_top2_margin"]) >= MIN_MARGIN:
            break
        print(name, "prompt seed", prompt_seed, "has a top-2 margin", min(res["min_top2_margin"]), "< MIN_MARGIN: next seed")
    res["prompt_seed"] = prompt_seed
    with open(os.path.join(d, "generation.json"), "w") as f:
        json.dump(res, f)
    print(name, "min top-2 margin per prompt", res["min_top2_margin"])
    if min(res["min_top2_margin"]) < MIN_MARGIN:
        sys.exit(f"{name}: a top-2 margin below {MIN_MARGIN}: greedy equality would be fragile; change the seed")


def main():
    out = sys.argv[1]
    torch.manual_seed(10)
    llama = LlamaForCausalLM(LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False, hidden_act="silu", initializer_range=0.2))
    run(llama, "llama_tiny", out, 256, [7, 12], seed=1)
    torch.manual_seed(11)
    gpt2 = GPT2LMHeadModel(GPT2Config(
        vocab_size=256, n_positions=128, n_embd=64, n_layer=2, n_head=4,
        activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        layer_norm_epsilon=1e-5, initializer_range=0.2))
    run(gpt2, "gpt2_tiny", out, 256, [7, 12], seed=2)


if __name__ == "__main__":
    main()
