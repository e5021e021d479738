#!/usr/bin/env python3
"""Expected Megatron log lines, from the Python format strings of megatron/training/training.py
(training_log and evaluate_and_print_results, core v0.16+; docs/megatron-reference.md#training-log-line, #validation-log-line),
evaluated by Python for chosen values.

Usage: python3 gen_log_lines.py > log_lines.txt
Each case is one 'values' line (tab-separated key=value, what the C++ test feeds the formatter)
followed by one 'expect' line per output line. Values: None = field absent.
"""
import math

TRAIN = [
    dict(ts='2026-08-22 10:00:00.123456', it=100, train_iters=1000, consumed=12800, skipped_samples=0,
         ms=1234.5, tflops=456.7, lr=1.5e-4, gbs=128, losses=[('lm loss', 7.123456)], ls=1.0,
         gn=1.2344999, nz=None, pn=None, skipped=0, nan=0),
    dict(ts='2026-01-02 03:04:05.000007', it=1, train_iters=15258789, consumed=128, skipped_samples=0,
         ms=98765.4321, tflops=None, lr=0.0, gbs=128, losses=[('lm loss', 11.93)], ls=1.0,
         gn=None, nz=None, pn=None, skipped=0, nan=0),
    dict(ts='2026-12-31 23:59:59.999999', it=123456789, train_iters=123456789, consumed=9876543210123,
         skipped_samples=64, ms=0.04, tflops=1234.56, lr=2.5e-05, gbs=100000,
         losses=[('lm loss', 1e-9), ('mtp loss', -1.0)], ls=4294967296.0, gn=float('nan'), nz=12345,
         pn=271.82818, skipped=3, nan=1),
    dict(ts='2026-06-15 12:00:00.500000', it=30, train_iters=40, consumed=480, skipped_samples=0,
         ms=15.25, tflops=0.05, lr=9.999999e-4, gbs=16, losses=[('lm loss', 4.85203)], ls=65536.0,
         gn=0.0005, nz=0, pn=12.3456, skipped=0, nan=0),
    # An interval of skipped iterations (fp16 loss-scale overflow) and an untrained MoE aux loss:
    # zero averages are printed (Megatron: `if avg >= 0.0`).
    dict(ts='2026-12-01 14:00:00.000001', it=12, train_iters=20, consumed=48, skipped_samples=0,
         ms=8.5, tflops=None, lr=3e-3, gbs=4, losses=[('lm loss', 0.0), ('load_balancing_loss', 0.0)],
         ls=8192.0, gn=None, nz=None, pn=None, skipped=1, nan=0),
]

VALID = [
    dict(prefix='iteration 100', suffix='', losses=[('lm loss', 6.54321)]),
    dict(prefix='iteration 40 on validation set', suffix='', losses=[('lm loss', 25.0)]),
    dict(prefix='iteration 40 on test set', suffix='', losses=[('lm loss', 0.000123456)]),
    dict(prefix='iteration 7', suffix='-1', losses=[('lm loss', 3.0)]),
]


def training_line(v):
    # Format strings of training_log (one field each, see docs/megatron-reference.md#training-log-line).
    s = f" [{v['ts']}]"
    s += ' iteration {:8d}/{:8d} |'.format(v['it'], v['train_iters'])
    s += ' consumed samples: {:12d} |'.format(v['consumed'])
    if v['skipped_samples'] > 0:
        s += ' skipped samples: {:12d} |'.format(v['skipped_samples'])
    s += ' elapsed time per iteration (ms): {:.1f} |'.format(v['ms'])
    if v['tflops'] is not None:
        s += f" throughput per GPU (TFLOP/s/GPU): {v['tflops']:.1f} |"
    if v['lr'] is not None:
        s += f" learning rate: {v['lr']:.6E} |"
    s += f" global batch size: {v['gbs']:5d} |"
    for key, avg in v['losses']:
        if avg >= 0.0:
            s += ' {}: {:.6E} |'.format(key, avg)
    s += f" loss scale: {v['ls']:.1f} |"
    if v['gn'] is not None:
        s += f" grad norm: {v['gn']:.3f} |"
    if v['nz'] is not None:
        s += f" num zeros: {v['nz']} |"
    if v['pn'] is not None:
        s += f" params norm: {v['pn']:.3f} |"
    s += ' number of skipped iterations: {:3d} |'.format(v['skipped'])
    s += ' number of nan iterations: {:3d} |'.format(v['nan'])
    return [s]


def validation_lines(v):
    s = f" validation{v['suffix']} loss at {v['prefix']} | "
    for key, val in v['losses']:
        s += '{} value: {:.6E} | '.format(key, val)
        s += '{} PPL: {:.6E} | '.format(key, math.exp(min(20, val)))
    n = len(s) + 1
    return ['-' * n, s, '-' * n]


def enc(x):
    if isinstance(x, list):
        return ';'.join(f'{k}:{val!r}' for k, val in x)
    return repr(x) if not isinstance(x, str) else x


for v in TRAIN:
    print('train\t' + '\t'.join(f'{k}={enc(x)}' for k, x in v.items()))
    for line in training_line(v):
        print('expect\t' + line)
for v in VALID:
    print('valid\t' + '\t'.join(f'{k}={enc(x)}' for k, x in v.items()))
    for line in validation_lines(v):
        print('expect\t' + line)
