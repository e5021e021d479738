#!/usr/bin/env python3
"""Compares the training log lines of a run resumed with --load against the uninterrupted run.

Why a helper: as Megatron-LM's training_log (should_reset = not is_first_iteration), the first
iteration a run prints (the first after a --load too) does not reset the interval, so with
--log-interval 1 the resumed run's SECOND line shows the mean of its first two iterations while
the uninterrupted run printed each on its own (docs/megatron-reference.md, "Training log line").
What the resumed run must print, from the uninterrupted run's lines of the same iterations:
  * first line, and every line from the third on: the same field values;
  * second line: the interval fields (every "... loss" field, e.g. "lm loss", "mtp_1 loss", MoE
    "load_balancing_loss") equal the mean of the uninterrupted run's two values, and the
    "number of skipped / nan iterations" counts their sum; the per-iteration fields (consumed
    samples, learning rate, global batch size, loss scale, grad norm, params norm, ...) are the
    iteration's own, compared as on any other line.
Timing fields (elapsed time, throughput, energy, power) and the timestamp are never compared.

Tolerances. A field without a --tol is compared exactly: the printed strings must be identical,
except for the second line's means, which the log can only show rounded: the printed mean y of
two printed values a, b (Megatron's {:.6E}: 7 significant digits) must satisfy
    |y - (a + b) / 2| <= h(y) + (h(a) + h(b)) / 2 + 1e-12 |y|,
h(v) being half a unit of the last printed digit of v (the print rounding of each of the three
values; 1e-12 covers this script's double arithmetic). A field with --tol FIELD=rel:R (or abs:A)
is compared as |y - x| <= R |x| (or A) on every line, and on the second line the print-rounding
terms above are added to that bound (three rounded values enter instead of two).

Usage:
  resumed_log.py compare REF_LOG RESUMED_LOG --iterations FIRST-LAST [--fields 'F1,F2,...']
                 [--tol 'FIELD=rel:R' ...] [--only A-B] [--name NAME]
      Exit 0 and one "OK" line when the resumed run printed exactly the iterations FIRST..LAST
      (consecutive: --log-interval 1) and each (each of A..B with --only, e.g. a run from the start
      compared from its third line on) agrees as above; else exit 1 with one line naming
      NAME, the iteration, the field and both values. --fields restricts the comparison to those
      fields (as printed, e.g. 'consumed samples,learning rate,lm loss,grad norm'); by default all
      non-timing fields of the uninterrupted run's line are compared and must all be present.
  resumed_log.py expected REF_LOG --iterations FIRST-LAST --field FIELD --at IT
      Prints the value (a float) the resumed run is to print for FIELD at iteration IT: the mean at
      the second iteration for a loss field, the uninterrupted run's own value otherwise (for the
      controls that require a resumed run to differ from it).
"""
import argparse
import decimal
import re
import sys

TIMING = ("elapsed time per iteration", "throughput per GPU", "energy per GPU", "power per GPU")
COUNTS = ("number of skipped iterations", "number of nan iterations")


def parse_log(path):
    """{iteration: {field: printed string}} of the training log lines in PATH (the last line of an
    iteration wins; timing fields left out)."""
    out = {}
    for line in open(path, errors="replace"):
        m = re.search(r"\] iteration +(\d+)/ *\d+ \|(.*)$", line)
        if not m:
            continue
        fields = {}
        for part in m.group(2).split("|"):
            name, sep, value = part.strip().partition(": ")
            if sep and not name.startswith(TIMING):
                fields[name] = value.strip()
        out[int(m.group(1))] = fields
    return out


def is_interval_field(name):
    """Fields Megatron averages over the interval (total_loss_dict): every '... loss' / '..._loss'."""
    return name.endswith("loss")


def half_ulp(s):
    """Half a unit of the last printed digit of the decimal string s."""
    return 0.5 * 10.0 ** decimal.Decimal(s).as_tuple().exponent


def parse_tol(specs):
    tol = {}
    for spec in specs:
        field, sep, rest = spec.partition("=")
        kind, sep2, value = rest.partition(":")
        if not sep or not sep2 or kind not in ("rel", "abs"):
            sys.exit(f"resumed_log.py: --tol '{spec}': expected FIELD=rel:R or FIELD=abs:A")
        tol[field] = (kind, float(value))
    return tol


def iteration_range(text):
    a, sep, b = text.partition("-")
    if not sep or int(b) < int(a) + 1:
        sys.exit(f"resumed_log.py: --iterations '{text}': expected FIRST-LAST with LAST > FIRST")
    return list(range(int(a), int(b) + 1))


def expected_value(ref, its, field, it):
    """What the resumed run (printing its first line at its[0]) shows for FIELD at IT, as a float."""
    if it == its[1] and is_interval_field(field):
        return (float(ref[its[0]][field]) + float(ref[its[1]][field])) / 2
    if it == its[1] and field in COUNTS:
        return float(int(ref[its[0]][field]) + int(ref[its[1]][field]))
    return float(ref[it][field])


def compare(args):
    ref, got = parse_log(args.ref), parse_log(args.resumed)
    its = iteration_range(args.iterations)
    tol = parse_tol(args.tol)
    name = args.name or args.resumed
    if sorted(got) != its:
        sys.exit(f"{name}: the resumed run printed iterations {sorted(got)}, expected {its[0]}..{its[-1]}")
    missing = [it for it in its if it not in ref]
    if missing:
        sys.exit(f"{name}: the uninterrupted run {args.ref} has no line for iterations {missing}")
    fields = args.fields.split(",") if args.fields else None
    checked = iteration_range(args.only) if args.only else its
    if not set(checked) <= set(its):
        sys.exit(f"resumed_log.py: --only {args.only} is not within --iterations {args.iterations}")
    for it in checked:
        for field in fields or ref[it].keys():
            if field not in ref[it] or field not in got[it]:
                sys.exit(f"{name}: iteration {it}: no '{field}' field in "
                         f"{'the uninterrupted run' if field not in ref[it] else 'the resumed run'}")
            x, y = ref[it][field], got[it][field]
            second = it == its[1]
            if second and field in COUNTS:
                want = int(ref[its[0]][field]) + int(x)
                if int(y) != want:
                    sys.exit(f"{name}: iteration {it} {field}: {y} vs {want} (the sum over iterations "
                             f"{its[0]} and {it} of the uninterrupted run)")
                continue
            if second and is_interval_field(field):
                a, b = ref[its[0]][field], x
                mean = (float(a) + float(b)) / 2
                kind, t = tol.get(field, ("abs", 0.0))
                bound = (t * abs(mean) if kind == "rel" else t) + half_ulp(y) + (half_ulp(a) + half_ulp(b)) / 2 \
                    + 1e-12 * abs(mean)
                if abs(float(y) - mean) > bound:
                    sys.exit(f"{name}: iteration {it} {field}: {y} vs {mean:.9E}, the mean of the uninterrupted "
                             f"run's {a} (iteration {its[0]}) and {b} (iteration {it}) (bound {bound:.2E}: Megatron's "
                             f"first logged iteration does not reset the interval)")
                continue
            if field not in tol:
                if x != y:
                    sys.exit(f"{name}: iteration {it} {field}: {y} vs {x} in the uninterrupted run (exact)")
                continue
            kind, t = tol[field]
            bound = t * abs(float(x)) if kind == "rel" else t
            if abs(float(y) - float(x)) > bound:
                sys.exit(f"{name}: iteration {it} {field}: {y} vs {x} in the uninterrupted run ({kind} {t:g})")
    what = ", ".join(fields) if fields else "all non-timing fields"
    mean = (f"; iteration {its[1]} prints the mean of {its[0]} and {its[1]} (Megatron's first logged iteration "
            f"does not reset)" if its[1] in checked else "")
    print(f"OK {name}: iterations {checked[0]}..{checked[-1]} ({what}) agree with the uninterrupted run{mean}")


def expected(args):
    ref = parse_log(args.ref)
    its = iteration_range(args.iterations)
    if args.at not in its or any(it not in ref or args.field not in ref[it] for it in its[:2] + [args.at]):
        sys.exit(f"resumed_log.py: {args.ref}: no '{args.field}' at the iterations needed for {args.at}")
    print(repr(expected_value(ref, its, args.field, args.at)))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare")
    c.add_argument("ref")
    c.add_argument("resumed")
    c.add_argument("--iterations", required=True)
    c.add_argument("--fields")
    c.add_argument("--tol", action="append", default=[])
    c.add_argument("--only")
    c.add_argument("--name")
    e = sub.add_parser("expected")
    e.add_argument("ref")
    e.add_argument("--iterations", required=True)
    e.add_argument("--field", required=True)
    e.add_argument("--at", type=int, required=True)
    args = p.parse_args()
    compare(args) if args.cmd == "compare" else expected(args)


if __name__ == "__main__":
    main()
