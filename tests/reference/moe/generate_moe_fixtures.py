#!/usr/bin/env python3
"""Megatron-LM's own MoE routing code as the oracle for megatron.cpp's router (issue 22).

Runs megatron/core/transformer/moe/moe_utils.py of a Megatron-LM checkout on the CPU with torch
(no GPU, no Transformer Engine: only the unfused paths) on fixed logits and writes
tests/reference/moe/megatron_routing.json, read by tests/unit_tests/transformer/moe/
moe_fixture_test.cpp (which SKIPs until the file is committed). Cases:
  * topk_routing_with_score_function: softmax / pre-softmax / sigmoid / sqrtsoftplus, top-k scaling,
    group-limited top-k, expert bias: routing probs, routing map, and d(logits) of sum(w * probs)
    by autograd;
  * compute_routing_scores_for_aux_loss + switch_load_balancing_loss_func (aux_loss; seq_aux_loss
    as the router reshapes it; global_aux_loss with accumulated counts) and their logits gradients;
  * z_loss_func and its gradient;
  * apply_router_token_dropping with drop policies probs / position, with and without padding (on
    the CPU, and on CUDA when available: torch.topk breaks exact ties differently there);
  * permute(): the token order (sorted_indices) and permuted probs;
  * get_updated_expert_bias (single-process gloo group).

Run on the GPU machine (any machine with torch):
  git clone https://github.com/NVIDIA/Megatron-LM .oracle/Megatron-LM   # ignored folder
  python3 tests/reference/moe/generate_moe_fixtures.py --megatron .oracle/Megatron-LM
"""
import argparse
import json
import os
import sys

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--megatron", default=".oracle/Megatron-LM", help="Megatron-LM checkout")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "megatron_routing.json"))
    args = ap.parse_args()
    sys.path.insert(0, os.path.abspath(args.megatron))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=0, world_size=1)
    from megatron.core.transformer.moe import moe_utils as mu

    torch.manual_seed(1234)
    T, E = 12, 8
    logits = torch.randn(T, E, dtype=torch.float64)
    w = torch.randn(T, E, dtype=torch.float64)
    bias = 0.1 * torch.randn(E, dtype=torch.float64)
    out = {"T": T, "E": E, "logits": logits.flatten().tolist(), "w": w.flatten().tolist(),
           "expert_bias": bias.tolist(), "topk": [], "aux": [], "drop": [], "permute": {}, "z": {}, "bias_update": {}}

    cases = [
        dict(score_function="softmax", topk=2),
        dict(score_function="softmax", topk=2, use_pre_softmax=True, scaling_factor=2.5),
        dict(score_function="softmax", topk=1, use_pre_softmax=True),
        dict(score_function="sigmoid", topk=2, expert_bias=True),
        dict(score_function="sigmoid", topk=1),
        dict(score_function="sqrtsoftplus", topk=3, expert_bias=True, scaling_factor=1.5),
        dict(score_function="softmax", topk=4, use_pre_softmax=True, num_groups=4, group_topk=2),
        dict(score_function="sigmoid", topk=4, num_groups=4, group_topk=2, expert_bias=True),
    ]
    for c in cases:
        l = logits.clone().requires_grad_(True)
        kw = dict(c)
        kw["expert_bias"] = bias if c.get("expert_bias") else None
        probs, rmap = mu.topk_routing_with_score_function(l, **kw)
        (probs * w).sum().backward()
        out["topk"].append(dict(case=c, probs=probs.detach().flatten().tolist(),
                                routing_map=rmap.int().flatten().tolist(), dlogits=l.grad.flatten().tolist()))

    # Aux losses as TopKRouter applies them (tp_cp group of one rank), for each score function.
    seq, bsz, topk, coeff = 6, 2, 2, 0.01
    for sf in ["softmax", "sigmoid", "sqrtsoftplus"]:
        l = logits.clone().requires_grad_(True)
        rmap, scores = mu.compute_routing_scores_for_aux_loss(l, topk, sf)
        tpe = rmap.sum(0).double()
        aux = mu.switch_load_balancing_loss_func(scores, tpe, T, topk, E, coeff)
        s2, m2 = scores.reshape(seq, -1), rmap.reshape(seq, -1)
        seq_aux = mu.switch_load_balancing_loss_func(s2, m2.sum(0).double(), seq, topk, E, coeff) / bsz
        prev = torch.arange(E, dtype=torch.float64)  # global aux: counts of an earlier micro-batch
        glob = mu.switch_load_balancing_loss_func(scores, (prev + tpe) / 2, T, topk, E, coeff)
        grads = {}
        for name, v in [("aux_loss", aux), ("seq_aux_loss", seq_aux), ("global_aux_loss", glob)]:
            g, = torch.autograd.grad(v, l, retain_graph=True)
            grads[name] = g.flatten().tolist()
        out["aux"].append(dict(score_function=sf, topk=topk, coeff=coeff, seq_length=seq, bsz=bsz,
                               aux_loss=aux.item(), seq_aux_loss=seq_aux.item(), global_aux_loss=glob.item(),
                               global_prev_tokens=prev.tolist(), routing_map=rmap.int().flatten().tolist(),
                               scores=scores.detach().flatten().tolist(), dlogits=grads))

    l = logits.clone().requires_grad_(True)
    z = mu.z_loss_func(l, 0.001)
    z.backward()
    out["z"] = dict(coeff=0.001, z_loss=z.item(), dlogits=l.grad.flatten().tolist())

    probs, rmap = mu.topk_routing_with_score_function(logits, 2, score_function="softmax")

    def dropping_cases(device):
        cases = []
        pd, md = probs.to(device), rmap.to(device)
        for policy in ["probs", "position"]:
            for pad in [False, True]:
                for cf in [0.5, 1.0, 1.5]:
                    p2, m2 = mu.apply_router_token_dropping(pd, md, 2, cf, drop_policy=policy, pad_to_capacity=pad)
                    cases.append(dict(policy=policy, pad=pad, capacity_factor=cf, topk=2,
                                      probs_in=probs.flatten().tolist(), map_in=rmap.int().flatten().tolist(),
                                      probs=p2.cpu().flatten().tolist(), routing_map=m2.cpu().int().flatten().tolist()))
        return cases

    out["drop"] = dropping_cases("cpu")

    # The same cases on CUDA where available (the GPU machine): apply_router_token_dropping keeps
    # the `capacity` largest keys per expert with torch.topk(dim=0, sorted=False), and where the
    # capacity boundary falls inside a run of equal keys (always for the "position" policy, and for
    # the zero-probability padding) CPU torch (std::nth_element) keeps an arbitrary subset of the
    # ties while CUDA torch keeps the first seen (lowest token index), the device Megatron trains
    # on. moe_fixture_test.cpp compares "drop_cuda" exactly and "drop" as far as ties allow.
    if torch.cuda.is_available():
        out["drop_cuda"] = dropping_cases("cuda")
    else:
        print("no CUDA: drop_cuda cases not written (the test then checks the tie order only against CPU torch)")

    tokens = torch.arange(T, dtype=torch.float64).unsqueeze(1).repeat(1, 3)
    pt, pp, sorted_idx, _, _ = mu.permute(tokens, rmap, probs=probs, num_out_tokens=int(rmap.sum()))
    out["permute"] = dict(routing_map=rmap.int().flatten().tolist(), sorted_indices=sorted_idx.tolist(),
                          permuted_probs=pp.tolist())

    tpe = torch.tensor([5., 1., 3., 3., 0., 7., 2., 3.])
    eb = torch.zeros(E, dtype=torch.float32)
    new_bias = mu.get_updated_expert_bias(tpe.clone(), eb, 1e-3, tp_dp_cp_group=dist.group.WORLD)
    out["bias_update"] = dict(tokens_per_expert=tpe.tolist(), rate=1e-3, updated=new_bias.tolist())

    with open(args.out, "w") as f:
        json.dump(out, f)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
