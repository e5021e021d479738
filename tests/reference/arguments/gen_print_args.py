#!/usr/bin/env python3
"""Writes print_args.json: the expected text of Megatron-LM's arguments block for a few known
values, and Python's repr() of many floats.

Megatron's _print_args (megatron/training/arguments.py) prints, for every attribute of the
argparse namespace, '  {} {} {}'.format(name, '.' * (48 - len(name)), value) -- so the value is
Python's str(): None, True/False, [1, 2], ['a', 'b'], float repr (1e-05, 0.0001, 1000.0) -- and
sorts the lines with key=str.lower, between a title line and an end line. This generator
restates that rule with real argparse/Python values (it does not import Megatron) so that
tests/unit_tests/training/arguments_print_test.cpp can check our C++ formatting against
Python's own str()/repr().

Run: python3 tests/reference/arguments/gen_print_args.py  (writes print_args.json next to it)
"""
import argparse
import json
import math
import os
import random


def print_args_block(title, namespace):
    lines = ['  {} {} {}'.format(k, '.' * (48 - len(k)), getattr(namespace, k)) for k in vars(namespace)]
    head = '------------------------ {} ------------------------'.format(title)
    tail = '-------------------- end of {} ---------------------'.format(title)
    return '\n'.join([head] + sorted(lines, key=lambda x: x.lower()) + [tail])


def encode(v):
    """A value as the C++ test rebuilds it (floats exactly, as float.hex())."""
    if v is None:
        return {'type': 'none'}
    if isinstance(v, bool):
        return {'type': 'bool', 'value': v}
    if isinstance(v, int):
        return {'type': 'int', 'value': v}
    if isinstance(v, float):
        return {'type': 'float', 'hex': v.hex()}
    if isinstance(v, str):
        return {'type': 'str', 'value': v}
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return {'type': 'str_list', 'value': v}
    if isinstance(v, list) and all(isinstance(x, int) for x in v):
        return {'type': 'int_list', 'value': v}
    raise TypeError(v)


def main():
    # A real argparse namespace: flags declared and parsed as Megatron declares them.
    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument('--lr', type=float, default=None)
    p.add_argument('--lr-decay-iters', type=int, default=None)
    p.add_argument('--lr-warmup-fraction', type=float, default=None)
    p.add_argument('--min-lr', type=float, default=0.0)
    p.add_argument('--adam-eps', type=float, default=1e-08)
    p.add_argument('--adam-beta2', type=float, default=0.999)
    p.add_argument('--norm-epsilon', type=float, default=1e-5, dest='layernorm_epsilon')
    p.add_argument('--initial-loss-scale', type=float, default=2**32)
    p.add_argument('--loss-scale-window', type=float, default=1000)
    p.add_argument('--init-method-std', type=float, default=0.02)
    p.add_argument('--weight-decay', type=float, default=0.01)
    p.add_argument('--hidden-size', type=int, default=None)
    p.add_argument('--num-layers', type=int, default=None)
    p.add_argument('--fp16', action='store_true')
    p.add_argument('--bf16', action='store_true')
    p.add_argument('--fp8-format', default=None, dest='fp8')
    p.add_argument('--fp8-margin', type=int, default=0)
    p.add_argument('--disable-bias-linear', action='store_false', dest='add_bias_linear')
    p.add_argument('--no-barrier-with-level-1-timing', action='store_false', dest='barrier_with_L1_time')
    p.add_argument('--data-path', nargs='*', default=None)
    p.add_argument('--cp-comm-type', nargs='+', type=str, default=['p2p'])
    p.add_argument('--profile-ranks', nargs='+', type=int, default=[])
    p.add_argument('--split', type=str, default=None)
    p.add_argument('--tokenizer-type', type=str, default=None)
    p.add_argument('--wandb-project', type=str, default='')
    p.add_argument('--null-tokenizer-pad-id', type=int, default=-1)
    p.add_argument('--a-very-long-argument-name-that-is-longer-than-48-chars', type=int, default=7)
    p.add_argument('--exactly-forty-eight-characters-long-argument-xyz', type=int, default=48)
    p.add_argument('--Zeta-upper', type=int, default=1)
    ns = p.parse_args(['--lr', '3e-5', '--lr-decay-iters', '320000', '--hidden-size', '4096', '--num-layers', '32',
                       '--bf16', '--disable-bias-linear', '--data-path', '0.3', "it's", '0.7', 'b/c',
                       '--profile-ranks', '0', '3', '--split', '969, 30, 1', '--tokenizer-type', 'GPT2BPETokenizer',
                       '--min-lr', '1e-4', '--null-tokenizer-pad-id', '-7', '--fp8-format', 'hybrid'])
    assert len('exactly_forty_eight_characters_long_argument_xyz') == 48
    items = [{'name': k, **encode(getattr(ns, k))} for k in vars(ns)]

    rnd = random.Random(1234)
    floats = [0.0, -0.0, 1.0, -1.5, 1e-5, 3e-5, 1e-4, 0.0001, 9.9e-5, 1e-8, 0.02, 0.1, 0.999, 0.1 + 0.2, 2 / 3,
              4294967296.0, 1000.0, 1e15, 1e16, 9999999999999998.0, 1.2345678901234567e16, 123456789012345678.0,
              1e22, 1e100, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, math.pi, 1 / 3 * 1e-4,
              float('inf'), float('-inf'), float('nan')]
    for _ in range(300):
        floats.append(rnd.uniform(-1, 1) * 10.0 ** rnd.randint(-30, 30))
    for _ in range(100):  # exact short decimals, as typed on command lines
        floats.append(float('{}e{}'.format(rnd.randint(1, 999), rnd.randint(-12, 12))))
    out = {
        'items': items,
        'block': print_args_block('arguments', ns),
        'floats': [[x.hex(), repr(x)] for x in floats],
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'print_args.json')
    with open(path + '.tmp', 'w') as f:
        json.dump(out, f, indent=1)
        f.write('\n')
    os.replace(path + '.tmp', path)


if __name__ == '__main__':
    main()
