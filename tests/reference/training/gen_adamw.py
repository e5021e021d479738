#!/usr/bin/env python3
"""AdamW + global-norm clipping fixture from PyTorch (torch.optim.AdamW, torch.nn.utils.clip_grad_norm_).

Usage: /usr/bin/python3 gen_adamw.py > adamw_steps.txt   (Debian python3-torch 1.13)

Two fp32 params: "layer.weight" [4, 3] (weight decay 0.1) and "layer.bias" [3] (no weight decay,
Megatron's rule for biases). 10 steps; at each step fixed random grads are clipped to global
norm 1.0 (the pre-clip norm is recorded) and AdamW(betas=(0.9, 0.95), eps=1e-8) steps with the
step's lr. Lines:
  init <name> <values...>
  step <t> <lr> <grad_norm_preclip>
  grad <name> <values...>        (before clipping)
  param <name> <values...>       (after the step)
"""
import torch

torch.manual_seed(0)
w = torch.nn.Parameter(torch.randn(4, 3) * 0.5)
b = torch.nn.Parameter(torch.randn(3) * 0.1)
params = {'layer.weight': w, 'layer.bias': b}
opt = torch.optim.AdamW([{'params': [w], 'weight_decay': 0.1}, {'params': [b], 'weight_decay': 0.0}],
                        lr=1e-2, betas=(0.9, 0.95), eps=1e-8)


def dump(tag, name, t):
    print(tag, name, ' '.join(repr(float(x)) for x in t.detach().reshape(-1).tolist()))


for n, p in params.items():
    dump('init', n, p)
lrs = [0.0, 2e-3, 4e-3, 6e-3, 8e-3, 1e-2, 9e-3, 7e-3, 5e-3, 3e-3]
for t in range(1, 11):
    scale = 3.0 if t % 3 == 0 else 0.2  # some steps clipped, some not
    w.grad = torch.randn(4, 3) * scale
    b.grad = torch.randn(3) * scale
    grads = {n: p.grad.clone() for n, p in params.items()}
    norm = torch.nn.utils.clip_grad_norm_([w, b], max_norm=1.0)
    for g in opt.param_groups:
        g['lr'] = lrs[t - 1]
    opt.step()
    print('step', t, repr(lrs[t - 1]), repr(float(norm)))
    for n, g in grads.items():
        dump('grad', n, g)
    for n, p in params.items():
        dump('param', n, p)
