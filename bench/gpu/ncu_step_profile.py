#!/usr/bin/env python3
"""Per-step GPU kernel time by category from an `ncu --csv --page raw --metrics gpu__time_duration.sum`
run of pretrain_gpt (bench/gpu/profile_step.sh). Steps are split at the last Adam kernel of each
optimizer step; the last complete step is reported. Host gaps = measured step time (from an
unprofiled run, given on the command line) minus the summed kernel time (one stream, kernels in
sequence).
usage: ncu_step_profile.py NCU_CSV [STEP_MS]"""
import csv, re, sys
from collections import defaultdict

def category(name):
    n = name.lower()
    if "sdpa" in n or "cudnn::" in n or "fmha" in n or re.search(r"\bfa_(fwd|bwd|dq)", n): return "attention"
    if "gemm" in n or "nvjet" in n or "xmma" in n or "cutlass" in n or "splitkreduce" in n: return "gemm"
    if "adam" in n: return "optimizer (adam)"
    if "reduce_stage" in n or "scale_kernel" in n: return "grad norm / clip"
    if "norm" in n: return "layernorm/rmsnorm"
    if "ce_" in n or "cross_entropy" in n or "embed" in n: return "embedding / cross entropy"
    if "colsum" in n: return "bias grads (column sums)"
    if "rope" in n or "qkv_split" in n: return "qkv split / rope"
    if "gelu" in n or "swiglu" in n: return "activation"
    if "cast" in n: return "cast"
    if "axpy" in n or "add" in n or "fill" in n or "bias" in n: return "add / fill / bias"
    return "other"

def main():
    rows = []
    with open(sys.argv[1], newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    rd = csv.reader(lines)
    hdr = next(rd)
    ki, ti = hdr.index("Kernel Name"), hdr.index("gpu__time_duration.sum")
    for r in rd:
        if len(r) <= ti or not r[0].isdigit(): continue
        rows.append((r[ki], float(r[ti].replace(",", "")) / 1e6))  # ns -> ms
    # step boundaries: the end of each run of adam kernels
    ends = [i for i in range(len(rows)) if "adam" in rows[i][0].lower()
            and (i + 1 == len(rows) or "adam" not in rows[i + 1][0].lower())]
    if len(ends) < 2: sys.exit("fewer than 2 optimizer steps in the profile")
    step = rows[ends[-2] + 1: ends[-1] + 1]
    tot = sum(t for _, t in step)
    cats, names = defaultdict(float), defaultdict(lambda: [0, 0.0])
    for n, t in step:
        cats[category(n)] += t
        k = re.sub(r"\(.*", "", n)[:90]
        names[k][0] += 1; names[k][1] += t
    step_ms = float(sys.argv[2]) if len(sys.argv) > 2 else None
    print(f"kernels in step: {len(step)}, kernel time {tot:.2f} ms" + (f", step {step_ms:.1f} ms" if step_ms else ""))
    denom = step_ms or tot
    for c, t in sorted(cats.items(), key=lambda x: -x[1]):
        print(f"  {c:28s} {t:8.2f} ms {100 * t / denom:5.1f} %")
    if step_ms:
        print(f"  {'host gaps (step - kernels)':28s} {step_ms - tot:8.2f} ms {100 * (step_ms - tot) / step_ms:5.1f} %")
    print("top kernels:")
    for k, (c, t) in sorted(names.items(), key=lambda x: -x[1][1])[:25]:
        print(f"  {t:8.2f} ms {c:5d}x  {k}")

main()
