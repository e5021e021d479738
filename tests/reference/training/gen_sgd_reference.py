#!/usr/bin/env python3
"""SGD (Megatron's --optimizer sgd) fixture from PyTorch: torch.optim.SGD + clip_grad_norm_.

Usage: /usr/bin/python3 gen_sgd_reference.py > sgd_steps.json   (Debian python3-torch 1.13)

Megatron's --optimizer sgd is torch.optim.SGD(params, lr, weight_decay, momentum=--sgd-momentum)
on the fp32 main params (megatron/core/optimizer/__init__.py), with global-norm clipping of the
fp32 main grads before the step (--clip-grad) and, for bf16 models, the bf16 model params written
from the fp32 main params after it (Float16OptimizerWithFloat16Params).

Two params: "layer.weight" [4, 3] (weight decay 0.1) and "layer.bias" [3] (no weight decay:
Megatron's rule for biases and 1-D params). 8 steps; each step has new random grads (some large
enough to be clipped at --clip-grad 1.0) and its own lr. Cases:
  bf16 model params (fp32 main params = the bf16 values), momentum 0.9 and 0, clip 1.0;
  fp32 params, momentum 0.9, no clipping.
Per step: lr, pre-clip global grad norm, the (pre-clip) grads, the fp32 main params after the
step, the model params after the step (bf16 values as floats) and the momentum buffers.
"""
import json

import torch


def run(name, momentum, dtype, clip):
    torch.manual_seed(1234)
    init = {'layer.weight': torch.randn(4, 3) * 0.5, 'layer.bias': torch.randn(3) * 0.1}
    model = {n: t.to(dtype) for n, t in init.items()}            # model params (bf16 or fp32)
    main = {n: torch.nn.Parameter(t.float().clone()) for n, t in model.items()}  # fp32 main params
    opt = torch.optim.SGD([{'params': [main['layer.weight']], 'weight_decay': 0.1},
                           {'params': [main['layer.bias']], 'weight_decay': 0.0}],
                          lr=0.1, momentum=momentum)
    case = {'name': name, 'momentum': momentum, 'model_dtype': str(dtype).replace('torch.', ''),
            'clip_grad': clip, 'weight_decay': {'layer.weight': 0.1, 'layer.bias': 0.0},
            'init': {n: [float(x) for x in t.float().reshape(-1).tolist()] for n, t in model.items()},
            'shape': {n: list(t.shape) for n, t in model.items()}, 'steps': []}
    lrs = [0.1, 0.08, 0.12, 0.05, 0.1, 0.03, 0.07, 0.02]
    for t, lr in enumerate(lrs, start=1):
        scale = 4.0 if t % 3 == 0 else 0.3
        grads = {n: torch.randn(p.shape) * scale for n, p in main.items()}
        for n, p in main.items():
            p.grad = grads[n].clone()
        if clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(list(main.values()), max_norm=clip)
        else:
            norm = torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in grads.values()]))
        for g in opt.param_groups:
            g['lr'] = lr
        opt.step()
        for n, p in main.items():
            model[n] = p.detach().to(dtype)
        step = {'step': t, 'lr': lr, 'grad_norm': float(norm),
                'grad': {n: [float(x) for x in g.reshape(-1).tolist()] for n, g in grads.items()},
                'main_param': {n: [float(x) for x in p.detach().reshape(-1).tolist()] for n, p in main.items()},
                'model_param': {n: [float(x) for x in m.float().reshape(-1).tolist()] for n, m in model.items()},
                'momentum_buffer': {}}
        for n, p in main.items():
            buf = opt.state[p].get('momentum_buffer')
            step['momentum_buffer'][n] = None if buf is None else [float(x) for x in buf.reshape(-1).tolist()]
        case['steps'].append(step)
    return case


cases = [run('bf16_momentum0.9_clip1', 0.9, torch.bfloat16, 1.0),
         run('bf16_momentum0_clip1', 0.0, torch.bfloat16, 1.0),
         run('fp32_momentum0.9_noclip', 0.9, torch.float32, 0.0)]
print(json.dumps({'generator': 'tests/reference/training/gen_sgd_reference.py',
                  'torch': torch.__version__, 'cases': cases}, indent=1))
