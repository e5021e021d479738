#!/usr/bin/env python3
"""Compares two pretrain_gpt training logs iteration by iteration (tests/gpu/run_gpu_tests.sh).

  train_log_compare.py LABEL TEST_LOG REF_LOG [options]

Reads every training log line (Megatron's format, docs/training.md; --log-interval 1):
  " [date] iteration   k/  N | ... | lm loss: X | loss scale: S | grad norm: G |
    number of skipped iterations: n | number of nan iterations: m |"
and checks the TEST run against the REFERENCE run:
  * TEST has all --iters lines, every lm loss / grad norm finite, no nan iteration (a skipped fp16
    iteration, which prints no grad norm, is fine when --fp16 is given);
  * per iteration |loss_t - loss_r| / |loss_r| <= --loss-tol (iterations that both runs applied);
  * the final loss and the mean of the last 10 applied iterations' losses within --mean-tol;
  * per iteration |gn_t - gn_r| <= --gn-tol * gn_r + --gn-abs (--gn-abs covers the log's 3
    decimals: each printed norm is rounded to 0.0005, so two of them differ by up to 0.001);
  * with --fp16: the "loss scale" of every iteration and the skipped-iteration flags are equal
    (dynamic loss scaling takes the same decisions), and the counts are printed.
Prints one PASS or FAIL line (with the numbers) plus INFO lines; exit status 0 iff PASS.
With --info-only the verdict is printed as INFO (a comparison that is reported, not judged).
"""
import argparse
import math
import re
import sys

LINE = re.compile(r"\] iteration +(\d+)/ *(\d+) \|")


def field(line, key):
    i = line.find(key)
    if i < 0:
        return None
    return line[i + len(key):].split("|", 1)[0].strip()


def pow2(s):
    """'4294967296.0' -> '2^32' (loss scales are powers of two unless --loss-scale says otherwise)."""
    try:
        v = float(s)
        e = round(math.log2(v))
        return f"2^{e}" if v > 0 and 2.0 ** e == v else f"{v:g}"
    except (TypeError, ValueError):
        return str(s)


def parse(path):
    """Returns {iteration: dict(loss, scale, gn, skipped, nan)} from a pretrain_gpt log."""
    rows = {}
    try:
        with open(path, errors="replace") as f:
            for line in f:
                m = LINE.search(line)
                if not m:
                    continue
                it = int(m.group(1))
                num = lambda s: None if s is None else float(s)
                skipped = int(field(line, "number of skipped iterations:") or 0)
                rows[it] = dict(
                    loss=num(field(line, "lm loss:")),
                    scale=field(line, "loss scale:"),
                    gn=num(field(line, "grad norm:")),
                    skipped=skipped,
                    nan=int(field(line, "number of nan iterations:") or 0),
                )
                if skipped:  # a skipped iteration's loss is not part of the interval's mean
                    rows[it]["loss"] = None
    except OSError:
        pass
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("label")
    ap.add_argument("test")
    ap.add_argument("ref")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--loss-tol", type=float, required=True)
    ap.add_argument("--mean-tol", type=float, required=True)
    ap.add_argument("--gn-tol", type=float, required=True)
    ap.add_argument("--gn-abs", type=float, default=0.0011)
    ap.add_argument("--fp16", action="store_true", help="compare loss scales and skipped iterations too")
    ap.add_argument("--info-only", action="store_true")
    ap.add_argument("--closer-than", metavar="OTHER_LOG",
                    help="also require the mean relative lm-loss difference to REF to be smaller than to OTHER_LOG "
                         "(e.g. GPU fp8 closer to the CPU fp8 emulation than to the GPU bf16 run: FP8 is applied)")
    a = ap.parse_args()
    t, r = parse(a.test), parse(a.ref)
    bad = []
    want = list(range(1, a.iters + 1))
    mt = [i for i in want if i not in t]
    mr = [i for i in want if i not in r]
    if mt:
        bad.append(f"test log lacks {len(mt)} of {a.iters} iterations (first missing {mt[0]})")
    if mr:
        bad.append(f"reference log lacks {len(mr)} of {a.iters} iterations (first missing {mr[0]})")
    both = [i for i in want if i in t and i in r]
    # no NaN / inf in the test run
    nonfinite = [i for i in both if (t[i]["loss"] is not None and not math.isfinite(t[i]["loss"]))
                 or (t[i]["gn"] is not None and not math.isfinite(t[i]["gn"]))]
    nan_its = [i for i in both if t[i]["nan"]]
    if nonfinite:
        bad.append(f"non-finite loss/grad norm at iterations {nonfinite[:5]}")
    if nan_its:
        bad.append(f"nan iterations at {nan_its[:5]}")
    if not a.fp16:
        skips = [i for i in both if t[i]["skipped"] or r[i]["skipped"]]
        if skips:
            bad.append(f"skipped iterations at {skips[:5]} (not fp16)")
    # fp16: identical loss-scale trajectory and skip decisions
    info = []
    if a.fp16 and both:
        ds = [i for i in both if t[i]["scale"] != r[i]["scale"]]
        dk = [i for i in both if t[i]["skipped"] != r[i]["skipped"]]
        nt = sum(t[i]["skipped"] for i in both)
        nr = sum(r[i]["skipped"] for i in both)
        traj = []
        for i in both:  # the loss-scale changes, compactly
            if not traj or traj[-1][1] != r[i]["scale"]:
                traj.append((i, r[i]["scale"]))
        info.append(f"skipped iterations {nt} (test) vs {nr} (ref); loss scale (ref) "
                    + " ".join(f"it{i}:{pow2(s)}" for i, s in traj[:12]) + (" ..." if len(traj) > 12 else ""))
        if ds or dk:
            # after a different skip decision the two runs train on different weights; how close
            # they were before it tells a borderline overflow (a gradient within rounding of the
            # fp16 maximum) from a wrong loss scaler
            k = min(ds + dk)
            pre = [i for i in both if i < k and t[i]["loss"] is not None and r[i]["loss"] is not None]
            pm = max((abs(t[i]["loss"] - r[i]["loss"]) / max(abs(r[i]["loss"]), 1e-30) for i in pre), default=0.0)
            info.append(f"first different loss scale / skip decision at it {k}; before it: {len(pre)} applied "
                        f"iterations, lm loss max rel diff {pm:.3g} (tol {a.loss_tol:g})")
        if ds:
            i = ds[0]
            bad.append(f"loss scale differs at {len(ds)} iterations, first it {i}: {t[i]['scale']} vs {r[i]['scale']}")
        if dk:
            i = dk[0]
            bad.append(f"skip decision differs at {len(dk)} iterations, first it {i}: "
                       f"{t[i]['skipped']} (test) vs {r[i]['skipped']} (ref)")
    # losses and grad norms on the iterations both runs applied
    applied = [i for i in both if t[i]["loss"] is not None and r[i]["loss"] is not None]
    lrel, lworst = 0.0, None
    for i in applied:
        d = abs(t[i]["loss"] - r[i]["loss"]) / max(abs(r[i]["loss"]), 1e-30)
        if not math.isfinite(d):
            d = math.inf
        if lworst is None or d > lrel:
            lrel, lworst = d, i
    gexc, gworst, grel = 0.0, None, 0.0
    for i in both:
        if t[i]["gn"] is None or r[i]["gn"] is None:
            continue
        d = abs(t[i]["gn"] - r[i]["gn"])
        allowed = a.gn_tol * abs(r[i]["gn"]) + a.gn_abs
        if not math.isfinite(d):
            d = math.inf
        ratio = d / allowed if allowed > 0 else (0.0 if d == 0 else math.inf)
        if gworst is None or ratio > gexc:
            gexc, gworst = ratio, i
            grel = d / max(abs(r[i]["gn"]), 1e-30)
    if not applied:
        bad.append("no iteration with a loss in both runs")
    else:
        last = applied[-10:]
        mt_ = sum(t[i]["loss"] for i in last) / len(last)
        mr_ = sum(r[i]["loss"] for i in last) / len(last)
        mrel = abs(mt_ - mr_) / max(abs(mr_), 1e-30)
        f = applied[-1]
        frel = abs(t[f]["loss"] - r[f]["loss"]) / max(abs(r[f]["loss"]), 1e-30)
        if lrel > a.loss_tol:
            bad.append(f"lm loss rel diff {lrel:.3g} at it {lworst} > {a.loss_tol:g}")
        if mrel > a.mean_tol or frel > a.mean_tol:
            bad.append(f"last-10 mean rel diff {mrel:.3g} / final {frel:.3g} > {a.mean_tol:g}")
        if gexc > 1.0:
            bad.append(f"grad norm at it {gworst}: {t[gworst]['gn']} vs {r[gworst]['gn']} (> {a.gn_tol:g} rel + {a.gn_abs:g})")
        gtxt = (f"grad norm max rel diff {grel:.3g} (it {gworst}, tol {a.gn_tol:g} rel + {a.gn_abs:g})"
                if gworst else "no grad norms")
        nums = (f"{len(applied)} its: lm loss max rel diff {lrel:.3g} (it {lworst}, tol {a.loss_tol:g}); "
                f"last-10 mean {mt_:.6f} vs {mr_:.6f} rel {mrel:.3g}, final it {f} {t[f]['loss']:.6f} vs "
                f"{r[f]['loss']:.6f} rel {frel:.3g} (tol {a.mean_tol:g}); {gtxt}")
    if a.closer_than and applied:
        o = parse(a.closer_than)
        common = [i for i in applied if i in o and o[i]["loss"] is not None]
        if common:
            rel = lambda x, y: abs(x - y) / max(abs(y), 1e-30)
            d_ref = sum(rel(t[i]["loss"], r[i]["loss"]) for i in common) / len(common)
            d_oth = sum(rel(t[i]["loss"], o[i]["loss"]) for i in common) / len(common)
            info.append(f"mean lm loss rel diff over {len(common)} its: {d_ref:.3g} to the reference, {d_oth:.3g} "
                        f"to {a.closer_than.rsplit('/', 1)[-1]}")
            if not d_ref < d_oth:
                bad.append(f"not closer to the reference ({d_ref:.3g}) than to {a.closer_than.rsplit('/', 1)[-1]} "
                           f"({d_oth:.3g})")
        else:
            bad.append(f"no common iterations with {a.closer_than}")
    if applied:  # how the difference grows along the run (chaotic growth vs a constant offset)
        marks = sorted({applied[0], *[i for i in applied if i in (5, 10, 20, 30, 40)], applied[-1]})
        info.append("lm loss rel diff along the run: " + ", ".join(
            f"it {i} {abs(t[i]['loss'] - r[i]['loss']) / max(abs(r[i]['loss']), 1e-30):.2g}" for i in marks))
    verdict = "FAIL" if bad else "PASS"
    if a.info_only:
        verdict = "INFO"
    msg = f"{verdict} {a.label}: " + (nums if applied else "")
    if bad:
        msg += (" | " if applied else "") + "; ".join(bad)
    print(msg)
    for s in info:
        print(f"INFO {a.label}: {s}")
    return 1 if (bad and not a.info_only) else 0


if __name__ == "__main__":
    sys.exit(main())
