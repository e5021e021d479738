#!/usr/bin/env python3
"""LR / WD schedule fixtures from Megatron-LM's own OptimizerParamScheduler (run as an oracle).

Usage: /usr/bin/python3 gen_scheduler.py /path/to/Megatron-LM > scheduler_cases.txt

Each case builds Megatron's scheduler over a fake optimizer with two param groups (a default
group and a decoupled-lr group with its own max_lr/min_lr), steps it by `increment` samples
and records, at every step, the lr of both groups and the weight decay. Output, one line each:
  case <name> <init_lr> <max_lr> <min_lr> <warmup> <decay> <style> <start_wd> <end_wd> <wd_incr_steps> <wd_style> <wsd_steps> <wsd_style> <dec_max_lr> <dec_min_lr>
  step <num_steps> <lr_default> <lr_decoupled> <wd>
Values are printed with repr() (shortest round-trip).
"""
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_megatron_flags import install_stubs

install_stubs(sys.argv[1])
import torch  # a stand-in (see install_stubs)
torch.Tensor = type("Tensor", (), {})
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler


class FakeOptimizer:
    def __init__(self, dec_max, dec_min):
        self.param_groups = [
            {'params': [], 'lr': 0.0, 'weight_decay': 0.0, 'wd_mult': 1.0, 'lr_mult': 1.0},
            {'params': [], 'lr': 0.0, 'weight_decay': 0.0, 'wd_mult': 1.0, 'lr_mult': 1.0,
             'max_lr': dec_max, 'min_lr': dec_min},
        ]


CASES = [
    # name, init, max, min, warmup, decay, style, start_wd, end_wd, wd_steps, wd_style, wsd_steps, wsd_style, inc, nsteps
    ('linear', 0.0, 1e-3, 1e-5, 40, 400, 'linear', 0.1, 0.1, 400, 'constant', None, 'exponential', 8, 60),
    ('cosine', 1e-6, 1.5e-4, 1e-5, 64, 640, 'cosine', 0.0, 0.1, 640, 'linear', None, 'exponential', 16, 50),
    ('constant', 0.0, 3e-4, 0.0, 32, 320, 'constant', 0.02, 0.2, 320, 'cosine', None, 'exponential', 8, 50),
    ('invsqrt', 0.0, 1e-3, 2e-5, 50, 500, 'inverse-square-root', 0.01, 0.01, 500, 'constant', None, 'exponential', 10, 60),
    ('invsqrt_nowarm', 0.0, 1e-3, 2e-5, 0, 500, 'inverse-square-root', 0.01, 0.01, 500, 'constant', None, 'exponential', 10, 60),
    ('wsd_exp', 0.0, 1e-3, 1e-4, 20, 400, 'WSD', 0.1, 0.1, 400, 'constant', 100, 'exponential', 8, 60),
    ('wsd_lin', 0.0, 1e-3, 1e-4, 20, 400, 'WSD', 0.1, 0.1, 400, 'constant', 100, 'linear', 8, 60),
    ('wsd_cos', 0.0, 1e-3, 1e-4, 20, 400, 'WSD', 0.1, 0.1, 400, 'constant', 100, 'cosine', 8, 60),
    ('wsd_msqrt', 0.0, 1e-3, 1e-4, 20, 400, 'WSD', 0.1, 0.1, 400, 'constant', 100, 'minus_sqrt', 8, 60),
    ('linear_nowarm', 0.0, 2e-3, 0.0, 0, 300, 'linear', 0.0, 0.3, 200, 'cosine', None, 'exponential', 7, 60),
]

for (name, init, mx, mn, warm, decay, style, swd, ewd, wds, wdst, wsd, wsdst, inc, nsteps) in CASES:
    dec_max, dec_min = 5e-4, 4.5e-5
    opt = FakeOptimizer(dec_max, dec_min)
    s = OptimizerParamScheduler(opt, init_lr=init, max_lr=mx, min_lr=mn, lr_warmup_steps=warm,
                                lr_decay_steps=decay, lr_decay_style=style, start_wd=swd, end_wd=ewd,
                                wd_incr_steps=wds, wd_incr_style=wdst, wsd_decay_steps=wsd,
                                lr_wsd_decay_style=wsdst)
    print('case', name, repr(init), repr(mx), repr(mn), warm, decay, style, repr(swd), repr(ewd), wds, wdst,
          wsd or 0, wsdst, repr(dec_max), repr(dec_min))
    for k in range(nsteps + 1):
        if k > 0:
            s.step(inc)
        print('step', s.num_steps, repr(opt.param_groups[0]['lr']), repr(opt.param_groups[1]['lr']),
              repr(opt.param_groups[0]['weight_decay']))
