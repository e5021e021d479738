#!/usr/bin/env python3
"""Compares the "lm loss" of two pretrain_gpt logs (a single-rank run and a parallel one):

    early_losses_match.py SINGLE_LOG PARALLEL_LOG ITERATIONS EARLY BOUND

Both logs must print iterations 1..ITERATIONS; the first EARLY iterations must agree within BOUND
relative (the scripts that call this state why their bound holds, e.g. dist_fp8_amax.sh); both runs
must train (finite losses, the last below the first). Prints every iteration's pair; exit 1 on a
failure.
"""
import re
import sys


def losses(path):
    pat = re.compile(r'\] iteration +(\d+)/ +\d+ \|.*lm loss: ([0-9.E+-]+) ')
    return {int(m.group(1)): float(m.group(2)) for m in (pat.search(line) for line in open(path)) if m}


def main():
    single, parallel, n, early, bound = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    a, b = losses(single), losses(parallel)
    if sorted(a) != list(range(1, n + 1)) or sorted(b) != sorted(a):
        sys.exit(f"iterations: single {sorted(a)} parallel {sorted(b)}")
    for it in a:
        rel = abs(a[it] - b[it]) / abs(a[it])
        print(f"iteration {it}: single {a[it]:.6e} parallel {b[it]:.6e} rel {rel:.1e}" +
              (f" (bound {bound:g})" if it <= early else ""))
        if it <= early and rel > bound:
            sys.exit(1)
    for name, l in (("single", a), ("parallel", b)):
        if not all(v == v and v < 1e30 for v in l.values()) or not l[n] < l[1]:
            sys.exit(f"{name}: did not train ({l})")


if __name__ == "__main__":
    main()
