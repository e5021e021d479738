#!/usr/bin/env python3
"""Hugging Face transformers reference fixtures for tiny mixture-of-experts models.

Run on a machine with torch + transformers (5.x) + safetensors, CPU only, no network (the GPU
machine's Python), from the repository root:

    python3 tests/reference/hf_moe/generate_hf_moe_fixtures.py tests/reference/hf_moe/

writes OUT_DIR/<name>/ for name in mixtral_tiny (MixtralForCausalLM), qwen3_moe_tiny
(Qwen3MoeForCausalLM) and qwen2_moe_tiny (Qwen2MoeForCausalLM), the format of
tests/reference/hf/generate_hf_fixtures.py; "--only qwen2_moe_tiny" (comma-separated names) writes
just those:
    config.json                      transformers' config.save_pretrained
    model.safetensors                the weights in the Hugging Face Hub layout (per-expert
                                     tensors: block_sparse_moe.experts.E.w1/w2/w3 for Mixtral,
                                     mlp.experts.E.gate_proj/up_proj/down_proj for Qwen3-MoE
                                     and Qwen2-MoE; Qwen2-MoE adds mlp.shared_expert.* and
                                     mlp.shared_expert_gate.weight [1, hidden] and q/k/v biases)
    inputs.json                      tokens [b][s], labels [b][s] (labels = next token)
    logits.safetensors               "logits" float32 [b, s, V]
    grads.safetensors                d(mean CE loss)/d(weight) for every tensor of model.safetensors
    loss.json                        {"loss": mean cross entropy over all b*s positions}
    meta.json                        versions and the smallest router top-k margin

The weights are drawn here (seeded) in the Hub layout and loaded with from_pretrained, so the
files are what a Hub checkpoint looks like whatever layout transformers uses in memory
(transformers 5 fuses the experts into 3-D parameters); from_pretrained must report no missing,
unexpected or mismatched keys. The in-memory parameters are matched back to the Hub tensors by
value (each is a distinct random tensor) to name the gradients in the Hub layout.

The loss is the plain mean cross entropy of the logits: output_router_logits=False, so the
model adds no router load-balancing (aux) loss; Megatron's aux loss is a training term compared
elsewhere (tests/reference/moe/).

Router weights are drawn large enough that no token's k-th and (k+1)-th router logits are
within 1e-3 (checked; meta.json "min_topk_margin"): summation-order differences (~1e-6) between
transformers and megatron.cpp cannot change which experts a token goes to. A seed that gives a
smaller margin is replaced by the next one (meta.json "seed" records the one used), so the script
never needs a second run.

Export check (after convert_checkpoint --loader mcore --saver hf wrote EXPORT_DIR):

    python3 generate_hf_moe_fixtures.py --check-export EXPORT_DIR --fixture OUT_DIR/<name>

loads EXPORT_DIR with transformers, runs the fixture's tokens and prints one line
"PASS|FAIL <dir> max_abs_logit_diff ... rel ..." (PASS: relative difference <= 1e-5; exit 1 on FAIL).
"""
import argparse
import json
import os
import re
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig

VOCAB, B, S = 128, 2, 16
MARGIN = 1e-3


def mixtral_config():
    return MixtralConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
        rms_norm_eps=1e-6, rope_theta=1000000.0, sliding_window=None, num_local_experts=4,
        num_experts_per_tok=2, router_aux_loss_coef=0.02, output_router_logits=False,
        router_jitter_noise=0.0, attention_dropout=0.0, tie_word_embeddings=False, hidden_act="silu")


def qwen3_moe_config():
    # head_dim 24 != hidden / heads (4 x 24 = 96 > 64, as Qwen3-30B-A3B's 32 x 128 > 2048); layer 1
    # dense (mlp_only_layers) -> --moe-layer-freq [1,0,1];
    # norm_topk_prob False -> --moe-router-pre-softmax (Mixtral covers the renormalized top-k).
    return Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
        max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=1000000.0, num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[1],
        router_aux_loss_coef=0.001, output_router_logits=False, attention_bias=False,
        use_sliding_window=False, attention_dropout=0.0, tie_word_embeddings=True, hidden_act="silu")


def qwen2_moe_config():
    # Qwen1.5-MoE-A2.7B's structure, tiny: q/k/v biases (Qwen2 attention; qkv_bias defaults to
    # true), a shared expert of its own width (32, neither the routed 16 nor the dense 48) behind a
    # sigmoid gate, decoder_sparse_step 2 -> layers 1 and 3 are MoE ((i + 1) % 2 == 0), 0 and 2
    # dense -> --moe-layer-freq [0,1,0,1]; top-4 of 8 without renormalization (norm_topk_prob
    # false, as the real model); untied; head_dim = hidden / heads (Qwen2-MoE has no head_dim).
    return Qwen2MoeConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=48, moe_intermediate_size=16,
        shared_expert_intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=1000000.0,
        num_experts=8, num_experts_per_tok=4, norm_topk_prob=False, decoder_sparse_step=2,
        mlp_only_layers=[], router_aux_loss_coef=0.001, output_router_logits=False,
        use_sliding_window=False, attention_dropout=0.0, tie_word_embeddings=False, hidden_act="silu")


ARCHITECTURES = {"mixtral": "MixtralForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM"}


def is_moe_layer(kind, cfg, i):
    """Which decoder layers are sparse, as each transformers model decides it."""
    if kind == "mixtral":
        return True
    if i in (cfg.mlp_only_layers or []):
        return False
    return cfg.num_experts > 0 and (i + 1) % cfg.decoder_sparse_step == 0


def hub_weights(kind, cfg, gen):
    """Random weights under the Hub's names and [out, in] Linear layouts."""
    h, nh, ng = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
    d = getattr(cfg, "head_dim", None) or h // nh
    w = {}

    def lin(name, out, inp, gain=1.0):
        w[name] = torch.randn((out, inp), generator=gen) * (gain / inp ** 0.5)

    def norm(name, n):
        w[name] = 1.0 + 0.1 * torch.randn((n,), generator=gen)

    # Tied: the embedding is also the output layer, so scale it for O(1) logits (well-conditioned CE).
    w["model.embed_tokens.weight"] = torch.randn((VOCAB, h), generator=gen) * (h ** -0.5 if cfg.tie_word_embeddings else 1.0)
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        norm(p + "input_layernorm.weight", h)
        lin(p + "self_attn.q_proj.weight", nh * d, h)
        lin(p + "self_attn.k_proj.weight", ng * d, h)
        lin(p + "self_attn.v_proj.weight", ng * d, h)
        lin(p + "self_attn.o_proj.weight", h, nh * d)
        if kind == "qwen2_moe":  # O(1) biases, comparable to x @ W^T, so that their gradients matter
            for proj, n in (("q_proj", nh * d), ("k_proj", ng * d), ("v_proj", ng * d)):
                w[p + f"self_attn.{proj}.bias"] = 0.5 * torch.randn((n,), generator=gen)
        if kind == "qwen3_moe":
            norm(p + "self_attn.q_norm.weight", d)
            norm(p + "self_attn.k_norm.weight", d)
        norm(p + "post_attention_layernorm.weight", h)
        if kind == "mixtral":
            m, names, E, f = p + "block_sparse_moe.", ("w1", "w3", "w2"), cfg.num_local_experts, cfg.intermediate_size
        elif not is_moe_layer(kind, cfg, i):
            lin(p + "mlp.gate_proj.weight", cfg.intermediate_size, h)
            lin(p + "mlp.up_proj.weight", cfg.intermediate_size, h)
            lin(p + "mlp.down_proj.weight", h, cfg.intermediate_size)
            continue
        else:
            m, names, E, f = p + "mlp.", ("gate_proj", "up_proj", "down_proj"), cfg.num_experts, cfg.moe_intermediate_size
        lin(m + "gate.weight", E, h, gain=8.0)  # large router logits: clear top-k margins
        for e in range(E):
            lin(m + f"experts.{e}.{names[0]}.weight", f, h)
            lin(m + f"experts.{e}.{names[1]}.weight", f, h)
            lin(m + f"experts.{e}.{names[2]}.weight", h, f)
        if kind == "qwen2_moe":
            fs = cfg.shared_expert_intermediate_size
            lin(m + "shared_expert.gate_proj.weight", fs, h)
            lin(m + "shared_expert.up_proj.weight", fs, h)
            lin(m + "shared_expert.down_proj.weight", h, fs)
            lin(m + "shared_expert_gate.weight", 1, h)  # logits O(1): the sigmoid is not saturated
    norm("model.norm.weight", h)
    if not cfg.tie_word_embeddings:
        lin("lm_head.weight", VOCAB, h)
    return w


def load(d, **kwargs):
    model, info = AutoModelForCausalLM.from_pretrained(
        d, dtype=torch.float32, attn_implementation="eager", output_loading_info=True, **kwargs)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:
        sys.exit(f"{d}: transformers did not load the Hub-layout weights cleanly: {bad}")
    return model.float().eval()


def match_to_hub(model, hub):
    """{model parameter name: function(grad) -> {hub name: grad}}, found by comparing values."""
    out, used = {}, set()
    expert_re = re.compile(r"model\.layers\.(\d+)\.(?:block_sparse_moe|mlp)\.experts\.(\d+)\.(\w+)\.weight$")
    role = {"w1": "gate", "gate_proj": "gate", "w3": "up", "up_proj": "up", "w2": "down", "down_proj": "down"}
    experts = {}  # layer -> role -> [hub names by expert]
    for n in hub:
        m = expert_re.match(n)
        if m:
            experts.setdefault(int(m.group(1)), {}).setdefault(role[m.group(3)], {})[int(m.group(2))] = n
    for pn, p in model.named_parameters():
        P = p.detach()
        same = [hn for hn, t in hub.items() if hn not in used and t.shape == P.shape and torch.equal(t, P)]
        if len(same) == 1:
            used.add(same[0])
            out[pn] = (lambda hn: lambda g: {hn: g})(same[0])
            continue
        found = None
        lm = re.search(r"layers\.(\d+)\.", pn)
        if P.dim() == 3 and lm and int(lm.group(1)) in experts:
            ex = experts[int(lm.group(1))]
            E = len(ex["gate"])
            gate = [ex["gate"][e] for e in range(E)]
            up = [ex["up"][e] for e in range(E)]
            down = [ex["down"][e] for e in range(E)]
            f = hub[gate[0]].shape[0]
            cands = []
            for first, second in ((gate, up), (up, gate)):
                st = torch.stack([torch.cat([hub[a], hub[b]], 0) for a, b in zip(first, second)])
                for tr in (False, True):
                    def inv(g, first=first, second=second, tr=tr):
                        g = g.transpose(1, 2) if tr else g
                        r = {a: g[e, :f].contiguous() for e, a in enumerate(first)}
                        r.update({b: g[e, f:].contiguous() for e, b in enumerate(second)})
                        return r
                    cands.append((st.transpose(1, 2) if tr else st, first + second, inv))
            st = torch.stack([hub[n] for n in down])
            for tr in (False, True):
                def inv(g, tr=tr, down=down):  # bind this layer's names (not the loop's last)
                    return {n: (g[e].t() if tr else g[e]).contiguous() for e, n in enumerate(down)}
                cands.append((st.transpose(1, 2) if tr else st, down, inv))
            hits = [c for c in cands if c[0].shape == P.shape and torch.equal(c[0], P)]
            if len(hits) == 1:
                found = hits[0]
        if found is None:
            sys.exit(f"parameter {pn} {tuple(P.shape)}: no Hub tensor (or stack of expert tensors) has its values")
        used.update(found[1])
        out[pn] = found[2]
    missing = sorted(set(hub) - used)
    if missing:
        sys.exit(f"Hub tensors not used by any parameter: {missing}")
    return out


def inputs(seed=1234):
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, VOCAB, (B, S + 1), generator=g)
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def router_margins(model, hub, topk):
    """Registers pre-hooks on the router modules; returns the list the hooks append margins to."""
    margins, params = [], dict(model.named_parameters())
    for pn, p in params.items():
        if (not pn.endswith("gate.weight") or pn.endswith("shared_expert_gate.weight") or p.dim() != 2
                or p.shape[0] >= p.shape[1]):
            continue
        mod = model.get_submodule(pn[: -len(".weight")])

        def hook(module, args, kwargs, W=p):
            x = args[0] if args else kwargs["hidden_states"]
            logits = x.reshape(-1, W.shape[1]).double() @ W.detach().double().t()
            v = logits.sort(dim=-1, descending=True).values
            margins.append((v[:, topk - 1] - v[:, topk]).min().item())
        mod.register_forward_pre_hook(hook, with_kwargs=True)
    return margins


class MarginTooSmall(Exception):
    pass


def generate(name, cfg, out, seed):
    """Writes OUT/NAME/; raises MarginTooSmall when this seed puts a token's top-k router logits
    within MARGIN (the caller tries the next seed)."""
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    hub = hub_weights(cfg.model_type, cfg, gen)
    cfg.architectures = [ARCHITECTURES[cfg.model_type]]
    cfg.save_pretrained(d)
    save_file({k: v.contiguous() for k, v in hub.items()}, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    model = load(d)
    back = match_to_hub(model, hub)
    margins = router_margins(model, hub, cfg.num_experts_per_tok)
    tokens, labels = inputs()
    logits = model(input_ids=tokens).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    loss.backward()
    if not margins:
        sys.exit(f"{name}: found no router modules to check the top-k margins")
    if min(margins) < MARGIN:
        raise MarginTooSmall(f"{name}: seed {seed}: a token's top-k router logits are within {min(margins):.2e} (< {MARGIN})")
    grads = {}
    for pn, p in model.named_parameters():
        grads.update(back[pn](p.grad.detach()))
    if set(grads) != set(hub):
        sys.exit(f"{name}: gradients named {sorted(set(grads) - set(hub))} are not Hub tensors and Hub tensors "
                 f"{sorted(set(hub) - set(grads))} got no gradient")
    save_file({"logits": logits.detach().contiguous()}, os.path.join(d, "logits.safetensors"))
    save_file(grads, os.path.join(d, "grads.safetensors"))
    # The same model in float64: the reference both float32 implementations are measured against
    # (the C++ test bounds our float32 error by a multiple of transformers' own float32 error, so
    # the tolerance follows from the model's conditioning instead of being guessed). Stored as
    # float32: that rounding (6e-8 relative) is far below the float32 errors it measures (>= 1e-7).
    # experts_implementation="eager" (the per-expert loop): transformers 5's default grouped_mm
    # backend (torch._grouped_mm) has no float64 kernel.
    model64 = load(d, experts_implementation="eager").double()
    logits64 = model64(input_ids=tokens).logits
    loss64 = torch.nn.functional.cross_entropy(logits64.reshape(-1, logits64.shape[-1]), labels.reshape(-1))
    loss64.backward()
    grads64 = {}
    for pn, p in model64.named_parameters():
        grads64.update(back[pn](p.grad.detach()))
    if set(grads64) != set(hub):
        sys.exit(f"{name}: the float64 model's parameters do not map onto the Hub tensors as the float32 one's")
    save_file({"logits": logits64.detach().float().contiguous()}, os.path.join(d, "logits64.safetensors"))
    save_file({k: v.float().contiguous() for k, v in grads64.items()}, os.path.join(d, "grads64.safetensors"))
    with open(os.path.join(d, "inputs.json"), "w") as f:
        json.dump({"tokens": tokens.tolist(), "labels": labels.tolist()}, f)
    with open(os.path.join(d, "loss.json"), "w") as f:
        json.dump({"loss": loss.item(), "loss64": loss64.item()}, f)
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump({"torch": torch.__version__, "transformers": transformers.__version__, "seed": seed,
                   "min_topk_margin": min(margins), "routers_checked": len(margins)}, f, indent=1)
    print(f"{name}: loss {loss.item():.6f}, {len(hub)} tensors, min top-k margin {min(margins):.3e}")


def check_export(export_dir, fixture):
    model = load(export_dir)
    with open(os.path.join(fixture, "inputs.json")) as f:
        tokens = torch.tensor(json.load(f)["tokens"])
    with torch.no_grad():
        logits = model(input_ids=tokens).logits
    ref = load_file(os.path.join(fixture, "logits.safetensors"))["logits"]
    diff = (logits - ref).abs().max().item()
    rel = diff / ref.abs().max().item()
    with open(os.path.join(export_dir, "config.json")) as f:
        arch = json.load(f).get("architectures")
    ok = rel <= 1e-5 and type(model).__name__ in (arch or [])
    print(f"{'PASS' if ok else 'FAIL'} {export_dir} ({type(model).__name__}, config architectures {arch}): "
          f"max_abs_logit_diff {diff:.3e} rel {rel:.3e} vs {fixture}")
    return 0 if ok else 1


# name -> (config, first seed). mixtral and qwen3 keep the seeds their committed fixtures used.
CASES = {"mixtral_tiny": (mixtral_config, 11), "qwen3_moe_tiny": (qwen3_moe_config, 12),
         "qwen2_moe_tiny": (qwen2_moe_config, 13)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?")
    ap.add_argument("--check-export")
    ap.add_argument("--fixture")
    ap.add_argument("--only", help="comma-separated fixture names to write (default: all of " + ", ".join(CASES) + ")")
    a = ap.parse_args()
    if a.check_export:
        if not a.fixture:
            sys.exit("--check-export needs --fixture FIXTURE_DIR (the generated <name> folder)")
        sys.exit(check_export(a.check_export, a.fixture))
    if not a.out:
        sys.exit("usage: generate_hf_moe_fixtures.py OUT_DIR [--only NAME,...] | --check-export DIR --fixture FIXTURE_DIR")
    names = a.only.split(",") if a.only else list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        sys.exit(f"--only: unknown fixture {unknown}; the fixtures are {', '.join(CASES)}")
    for name in names:
        config, seed = CASES[name]
        for attempt in range(20):  # a seed with a too-small router margin is replaced by the next
            torch.manual_seed(0)
            try:
                generate(name, config(), a.out, seed=seed + 100 * attempt)
                break
            except MarginTooSmall as e:
                print(f"{e}; trying seed {seed + 100 * (attempt + 1)}")
        else:
            sys.exit(f"{name}: 20 seeds gave router top-k margins below {MARGIN}")


if __name__ == "__main__":
    main()
