#!/usr/bin/env python3
"""Check that every number in docs/performance.md's tables is a row of bench/results.csv.

(--doc docs/moe.md checks that page the same way: ctest docs.moe_perf_tables_match_results.)

Each Markdown table in the doc must be preceded (blank lines allowed) by one marker comment:

  <!-- perf-table commits=83d2530,cfbf136 cols=2-4,6 -->
      the numbers in columns 2..4 and 6 (1-based, the first column is the row label) of every
      body row must each equal the `value` or `peer_value` of some row of the results file whose
      `commit` is one of the listed commits, rounded or truncated to the doc's last printed digit
      ("45.5k": 45450 <= x < 45600; "11,076": 11075.5 <= x < 11077; "0.888": 0.8875 <= x < 0.889).
  <!-- perf-table unchecked: <reason> -->
      the table holds no measurement (a prediction, a plan, code read); the reason is required.

Not checked inside a checked cell: text in parentheses, numbers followed by "%" or "x"/"×"
(ratios and shares derived from the measured values), and numbers of the form "NxM" (shapes).
A table without a marker, a marker without a table, a commit with no row in the results file, or a
number found in no row fails the check (exit 1, one line per problem naming doc line and number).

Usage: check_perf_docs.py [--doc docs/performance.md] [--results bench/results.csv]
       check_perf_docs.py --self-test   (the real doc passes; a doc with one changed number, and a
                                         doc with an unmarked table, must both fail)
Python 3 stdlib only.
"""
import argparse
import csv
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = re.compile(r"^\s*<!--\s*perf-table\s+(.*?)\s*-->\s*$")
NUMBER = re.compile(r"(?<![\w.,/])(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)(k)?(?![\w.,]*\d)")


def load_results(path):
    """{commit: [float values and peer values]} of the results CSV; raises ValueError on a bad row."""
    by_commit = {}
    with open(path, newline="", encoding="utf-8") as f:
        rd = csv.DictReader(f)
        need = {"commit", "value", "peer_value", "metric"}
        if not rd.fieldnames or not need <= set(rd.fieldnames):
            raise ValueError(f"{path}: header lacks one of {sorted(need)}")
        for i, row in enumerate(rd, start=2):
            vals = by_commit.setdefault(row["commit"], [])
            for key in ("value", "peer_value"):
                if row[key] != "":
                    try:
                        vals.append(float(row[key]))
                    except ValueError:
                        raise ValueError(f"{path}:{i}: {key} {row[key]!r} is not a number")
    return by_commit


def parse_cols(spec):
    cols = set()
    for part in spec.split(","):
        a, _, b = part.partition("-")
        cols.update(range(int(a), int(b or a) + 1))
    return cols


def cell_numbers(cell):
    """(text, value, unit of the last printed digit) of the checked numbers of one table cell."""
    text = cell.replace("**", "").replace("`", "")
    while True:  # drop parenthesized notes (innermost first)
        t2 = re.sub(r"\([^()]*\)", " ", text)
        if t2 == text:
            break
        text = t2
    out = []
    for m in NUMBER.finditer(text):
        tail = text[m.end():m.end() + 3].lstrip()
        head = text[max(0, m.start() - 2):m.start()].rstrip()
        if tail[:1] in ("%", "×", "x") or head.endswith(("×", "x")):
            continue
        s, k = m.group(1), m.group(2)
        digits = s.replace(",", "")
        dec = len(digits.split(".")[1]) if "." in digits else 0
        v = float(digits)
        ulp = 10.0 ** -dec
        if k:
            v, ulp = v * 1000, ulp * 1000
        out.append((m.group(0), v, ulp))
    return out


def matches(x, doc_value, ulp):
    """x printed at the doc's precision (one unit = ulp) gives doc_value, rounded or truncated."""
    eps = ulp * 1e-6
    return abs(x - doc_value) <= 0.5 * ulp + eps or doc_value - eps <= x < doc_value + ulp - eps


def split_row(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def check(doc_lines, results, doc_name="docs/performance.md"):
    """List of problems (strings); empty when the doc agrees with the results."""
    problems = []
    i, n = 0, len(doc_lines)
    pending = None  # (line number, marker text)
    while i < n:
        line = doc_lines[i]
        m = MARKER.search(line)
        if m:
            if pending:
                problems.append(f"{doc_name}:{pending[0]}: perf-table marker not followed by a table")
            pending = (i + 1, m.group(1))
            i += 1
            continue
        if not line.startswith("|"):
            if line.strip() and pending:
                problems.append(f"{doc_name}:{pending[0]}: perf-table marker not followed by a table")
                pending = None
            i += 1
            continue
        start = i
        rows = []
        while i < n and doc_lines[i].startswith("|"):
            rows.append((i + 1, doc_lines[i]))
            i += 1
        if not pending:
            problems.append(f"{doc_name}:{start + 1}: table without a '<!-- perf-table ... -->' marker")
            continue
        mline, spec = pending
        pending = None
        if spec.startswith("unchecked:"):
            if not spec[len("unchecked:"):].strip():
                problems.append(f"{doc_name}:{mline}: 'unchecked:' needs a reason")
            continue
        fields = dict(re.findall(r"(\w+)=(\S+)", spec))
        if "commits" not in fields or "cols" not in fields:
            problems.append(f"{doc_name}:{mline}: marker needs commits=... and cols=... (or 'unchecked: reason')")
            continue
        commits = fields["commits"].split(",")
        values = []
        for c in commits:
            if c not in results:
                problems.append(f"{doc_name}:{mline}: commit {c} has no row in the results file")
            values.extend(results.get(c, []))
        cols = parse_cols(fields["cols"])
        for lineno, text in rows[2:]:  # header and separator rows first
            cells = split_row(text)
            for ci, cell in enumerate(cells, start=1):
                if ci not in cols:
                    continue
                for tok, v, ulp in cell_numbers(cell):
                    if not any(matches(x, v, ulp) for x in values):
                        problems.append(f"{doc_name}:{lineno}: column {ci}: {tok} is in no results row of "
                                        f"commit {','.join(commits)}")
    if pending:
        problems.append(f"{doc_name}:{pending[0]}: perf-table marker not followed by a table")
    return problems


def self_test(doc_lines, results):
    """The real doc passes; one changed number fails; an unmarked table fails. Returns exit code."""
    ok = True
    base = check(doc_lines, results)
    if base:
        print("self-test: the doc itself fails:\n  " + "\n  ".join(base))
        ok = False
    # change the first checked number of the first checked table by +37% (never a rounding change)
    changed = None
    for idx, line in enumerate(doc_lines):
        m = MARKER.search(line)
        if not m or "commits=" not in m.group(1):
            continue
        cols = parse_cols(dict(re.findall(r"(\w+)=(\S+)", m.group(1)))["cols"])
        j = idx + 1
        while not doc_lines[j].startswith("|"):
            j += 1
        j += 2
        cells = split_row(doc_lines[j])
        for ci in sorted(cols):
            nums = cell_numbers(cells[ci - 1]) if ci <= len(cells) else []
            if nums:
                tok, v, _ = nums[0]
                new = f"{v * 1.37 + 0.011:.3f}"
                mutated = list(doc_lines)
                mutated[j] = doc_lines[j].replace(tok, new, 1)
                changed = (j + 1, tok, new, mutated)
                break
        if changed:
            break
    if not changed:
        print("self-test: no checked number found to change")
        return 1
    lineno, tok, new, mutated = changed
    probs = check(mutated, results)
    if not any(f":{lineno}:" in p and new in p for p in probs):
        print(f"self-test: changing {tok} to {new} on doc line {lineno} was not caught")
        ok = False
    unmarked = ["# t", "", "| a | b |", "|---|---|", "| x | 1.0 |"]
    if not any("without a" in p for p in check(unmarked, results, "unmarked.md")):
        print("self-test: a table without a marker was not caught")
        ok = False
    bad = ["<!-- perf-table commits=nosuchcommit cols=2 -->", "| a | b |", "|---|---|", "| x | 1.0 |"]
    if not any("has no row" in p for p in check(bad, results, "bad.md")):
        print("self-test: an unknown commit was not caught")
        ok = False
    print("self-test: " + ("PASS" if ok else "FAIL") +
          f" (doc clean: {not base}; changed {tok} -> {new} on line {lineno} caught; unmarked table and unknown commit caught)")
    return 0 if ok else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "performance.md"))
    ap.add_argument("--results", default=os.path.join(ROOT, "bench", "results.csv"))
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args(argv)
    try:
        results = load_results(a.results)
        with open(a.doc, encoding="utf-8") as f:
            doc_lines = f.read().splitlines()
    except (OSError, ValueError) as e:
        print(f"check_perf_docs.py: {e}")
        return 2
    if a.self_test:
        return self_test(doc_lines, results)
    probs = check(doc_lines, results, os.path.relpath(a.doc, ROOT) if a.doc.startswith(ROOT) else a.doc)
    for p in probs:
        print(p)
    if probs:
        print(f"check_perf_docs.py: {len(probs)} problem(s)")
        return 1
    print(f"check_perf_docs.py: every checked number of {a.doc} is in {a.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
