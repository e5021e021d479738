#!/usr/bin/env python3
"""The verdicts and compact summary of tests/gpu/torch_dist_oracle.sh (standard library only).

  torch_dist_oracle_report.py LEGS_TSV
  torch_dist_oracle_report.py --self-test   (the verdicts on synthetic logs; a ctest)

Each line of LEGS_TSV: KIND <tab> LABEL <tab> REFERENCE_LOG <tab> RUN_LOG, KIND one of
  cmp      the printed lm loss of iterations 6..10 of RUN against REFERENCE (1e-5 relative for 6,
           1e-4 after; fp32 runs that differ in reduction order only) and the printed grad norm
           (3 decimals on both sides: equal within 1.5e-3); the printed load_balancing_loss (MoE)
           like the lm loss when both logs print it
  cmpbf16  the same for --bf16 runs, with 2e-3 relative for iteration 6, 1e-2 for 7..10 and
           2e-2 relative for the grad norm. Why: the weights are the same bits at iteration 6
           (the "check" legs prove it), so only the forward/backward kernels differ (Megatron's on
           the GPU, ours on the CPU): each rounds its GEMM outputs and activations to bf16
           (unit roundoff u = 2^-9 = 2e-3), at places and with accumulation orders that need not
           agree, so a logit differs by a few u relative at worst. The loss, an average of the
           cross entropy over 256 tokens in fp32, moves by at most about u relative if every
           logit's error had the same sign (|d CE / d logit| <= 2 per token, logits O(1) at this
           init, CE ~ 4.5), and by ~u/16 for independent errors: 2e-3 bounds the worst case.
           The grad norm: a sum of squares of bf16-rounded gradients, the same u per element,
           up to a few u once the backward's bf16 roundings compound over the 2 layers: 2e-2.
           After the step the fp32 main params differ by ~lr * (relative grad error) ~ 1e-6, which
           flips the bf16 rounding of ~1% of the weights per step by one ulp; four such steps stay
           well inside 1e-2 (5x the iteration-6 bound). A wrong optimizer state need not move the
           loss beyond these bounds in four steps: the "check" legs test it exactly
  check    RUN is a tests/reference/torch_dist/dcp_stdlib.py log (keys / values): PASS iff its
           last line starts with "OK" (REFERENCE is "-")
  self     an implementation's resumed run (RUN, iterations 6..10) against its own uninterrupted
           run (REFERENCE): printed values, and the resumed run's iteration-7 loss "de-averaged"
           (2 * printed(7) - printed(6)): Megatron-LM's training_log logs the first iteration of a
           run without resetting its accumulators (should_reset = not is_first_iteration), so with
           --log-interval 1 the run's second log line prints the mean of its first two iterations
  samples  the SAMPLE lines (MEGATRON_DUMP_SAMPLES / megatron_samples.py) of split train, index
           < 40, of the two logs, compared field by field
Prints one line per leg and exits 1 if any cmp, cmpbf16, check or samples leg fails (self legs only
inform).
"""
import re
import sys

LINE = re.compile(r' iteration +(\d+)/ *\d+ \|.*?elapsed time per iteration \(ms\): ([0-9.]+) .*?lm loss: ([0-9.E+-]+)'
                  r'(?:.*?grad norm: ([0-9.]+))?')
LBL = re.compile(r'\| load_balancing_loss: ([0-9.E+-]+)')
# Tolerances per kind: (iteration 6 relative, iterations 7..10 relative, grad norm absolute, grad
# norm relative); see the docstring.
TOL = {"cmp": (1e-5, 1e-4, 1.5e-3, 0.0), "cmpbf16": (2e-3, 1e-2, 1.5e-3, 2e-2)}


def iterations(path):
    """{iteration: (elapsed_ms, lm_loss, grad_norm or None, load_balancing_loss or None)} of a
    Megatron-format log."""
    out = {}
    try:
        for line in open(path, errors="replace"):
            m = LINE.search(line)
            if m:
                lb = LBL.search(line)
                out[int(m.group(1))] = (float(m.group(2)), float(m.group(3)),
                                        float(m.group(4)) if m.group(4) else None,
                                        float(lb.group(1)) if lb else None)
    except OSError:
        pass
    return out


def samples(path):
    out = {}
    try:
        for line in open(path, errors="replace"):
            if not line.startswith("SAMPLE train "):
                continue
            f = line.split()
            if len(f) >= 3 and f[2].isdigit() and int(f[2]) < 40:
                out[int(f[2])] = " ".join(f[3:])
    except OSError:
        pass
    return out


def why_missing(path):
    try:
        lines = [l.rstrip() for l in open(path, errors="replace")]
    except OSError:
        return "no log"
    err = [l for l in lines if re.search(r"^error|Error|Traceback|exception", l)]
    return " / ".join((err or lines)[-2:])[:300] or "empty log"


def rel(a, b):
    return abs(a - b) / abs(a) if a else abs(b)


def cmp_leg(label, ref, run, kind="cmp"):
    a, b = iterations(ref), iterations(run)
    missing = [it for it in range(6, 11) if it not in a or it not in b]
    if missing:
        src = ref if any(it not in a for it in missing) else run
        return False, f"{label}: iterations {missing} missing ({why_missing(src)})"
    tol6, tol, gabs, grel = TOL[kind]
    parts, ok, lbl = [], True, []
    for it in range(6, 11):
        r = rel(a[it][1], b[it][1])
        t = tol6 if it == 6 else tol
        gn = (a[it][2] is not None and b[it][2] is not None
              and abs(a[it][2] - b[it][2]) > max(gabs, grel * abs(a[it][2])))
        lb = None
        if a[it][3] is not None and b[it][3] is not None:
            lb = rel(a[it][3], b[it][3])
            lbl.append(f"{lb:.1e}{'!' if lb > t else ''}")
        ok = ok and r <= t and not gn and (lb is None or lb <= t)
        parts.append(f"{it}:{r:.1e}{'!' if r > t else ''}" + (f"(gn {a[it][2]:.3f}/{b[it][2]:.3f}!)" if gn else ""))
    if any(a[it][3] is not None for it in a) != any(b[it][3] is not None for it in b):
        ok = False
        lbl.append("printed by one log only!")
    extra = f" | load_balancing_loss rel {' '.join(lbl)}" if lbl else ""
    return ok, f"{label}: loss rel {' '.join(parts)}{extra} | {'PASS' if ok else 'FAIL'}"


def check_leg(label, log):
    try:
        lines = [l.rstrip() for l in open(log, errors="replace") if l.strip()]
    except OSError:
        lines = []
    ok = bool(lines) and lines[-1].startswith("OK")
    detail = lines[-1] if ok else " / ".join(lines[-4:])[:600] or "no output"
    return ok, f"{label}: {detail} | {'PASS' if ok else 'FAIL'}"


def self_leg(label, full, resumed):
    a, b = iterations(full), iterations(resumed)
    if any(it not in a or it not in b for it in range(6, 11)):
        return f"{label}: incomplete ({why_missing(full if len(a) < 10 else resumed)})"
    raw = [rel(a[it][1], b[it][1]) for it in range(6, 11)]
    deavg7 = 2 * b[7][1] - b[6][1]
    gn = max(abs(a[it][2] - b[it][2]) for it in range(6, 11) if a[it][2] is not None and b[it][2] is not None)
    el = f"elapsed ms 6,7 = {b[6][0]:.1f},{b[7][0]:.1f}"
    return (f"{label}: printed rel 6..10 {' '.join(f'{x:.1e}' for x in raw)} | iteration 7 de-averaged "
            f"(2*p7-p6) rel {rel(a[7][1], deavg7):.1e} | grad norm max |diff| {gn:.3f} | {el}")


def samples_leg(label, ref, run):
    a, b = samples(ref), samples(run)
    if not a or not b:
        return False, f"{label}: no SAMPLE lines ({'reference' if not a else 'run'}: {why_missing(ref if not a else run)})"
    common = sorted(set(a) & set(b))
    bad = [i for i in common if a[i] != b[i]]
    msg = f"{label}: {len(common)} train samples in both (indices {common[0]}..{common[-1]}), {len(bad)} differ"
    for i in bad[:3]:
        fa, fb = a[i].split(), b[i].split()
        fields = [x.split("=")[0] for x, y in zip(fa, fb) if x != y]
        msg += f"\n    sample {i}: fields {fields} differ"
        for x, y in zip(fa, fb):
            if x != y:
                xs, ys = x.split("=", 1)[1].split(","), y.split("=", 1)[1].split(",")
                pos = [k for k in range(min(len(xs), len(ys))) if xs[k] != ys[k]][:8]
                msg += f"\n      {x.split('=')[0]} at {pos}: reference {[xs[k] for k in pos]} run {[ys[k] for k in pos]}"
    ok = not bad and len(common) >= 20
    return ok, msg + f" | {'PASS' if ok else 'FAIL'}"


def self_test():
    """The verdicts on synthetic logs: each tolerance passes inside and fails outside its bound."""
    import os
    import tempfile

    d = tempfile.mkdtemp()

    def log(name, l6, gn6, lbl=None):
        p = os.path.join(d, name)
        with open(p, "w") as f:
            for it in range(6, 11):
                lb = f" load_balancing_loss: {lbl:E} |" if lbl else ""
                f.write(f" [t] iteration {it:8d}/      10 | consumed samples: 1 | elapsed time per iteration (ms): 9.0 "
                        f"| learning rate: 1.0E-03 | lm loss: {l6 if it == 6 else 4.0:E} |{lb} loss scale: 1.0 "
                        f"| grad norm: {gn6 if it == 6 else 0.5:.3f} |\n")
        return p
    ref = log("ref", 4.5, 1.0)
    cases = [("cmpbf16", log("b1", 4.5 * (1 + 1.5e-3), 1.015), True), ("cmpbf16", log("b2", 4.5 * (1 + 2.5e-3), 1.0), False),
             ("cmpbf16", log("b3", 4.5, 1.025), False), ("cmp", log("f1", 4.5 * (1 + 5e-6), 1.001), True),
             ("cmp", log("f2", 4.5 * (1 + 2e-5), 1.0), False), ("cmp", log("m1", 4.5, 1.0, 1.0), False)]
    for kind, run, want in cases:
        ok, msg = cmp_leg(run, ref, run, kind)
        assert ok == want, msg
    lbl_ref = log("m2", 4.5, 1.0, 1.0)
    assert cmp_leg("lbl", lbl_ref, log("m3", 4.5, 1.0, 1.0 + 5e-6))[0]
    assert not cmp_leg("lbl", lbl_ref, log("m4", 4.5, 1.0, 1.0 + 2e-5))[0]
    with open(os.path.join(d, "ok.log"), "w") as f:
        f.write("missing in x: k\nOK: 3 of 3 tensors\n")
    with open(os.path.join(d, "bad.log"), "w") as f:
        f.write("differs: k\nFAIL: 2 of 3 tensors\n")
    assert check_leg("c", os.path.join(d, "ok.log"))[0] and not check_leg("c", os.path.join(d, "bad.log"))[0]
    assert not check_leg("c", os.path.join(d, "none.log"))[0]
    print("self-test OK")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return
    fails = 0
    for line in open(sys.argv[1]):
        f = line.rstrip("\n").split("\t")
        if len(f) != 4:
            continue
        kind, label, ref, run = f
        if kind in TOL:
            ok, msg = cmp_leg(label, ref, run, kind)
        elif kind == "check":
            ok, msg = check_leg(label, run)
        elif kind == "samples":
            ok, msg = samples_leg(label, ref, run)
        else:
            ok, msg = True, self_leg(label, ref, run)
        fails += not ok
        print(msg)
    print(f"{'FAIL' if fails else 'PASS'}: {fails} failing comparison(s)")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
