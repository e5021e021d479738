#!/usr/bin/env python3
"""Append benchmark figures parsed from a log to bench/results.csv (Python 3 stdlib only).

bench/results.csv is the one record of every measured figure the docs report (docs/performance.md,
"Results file"). Columns (RFC 4180 CSV, UTF-8, header row first):

  date        YYYY-MM-DD (UTC) of the measurement
  commit      short hash of the source tree the measured binary was built from
  machine     e.g. "1x H200 (nvidia-h200)", "2x H200 (nvidia-h200-x2)", "build VM (2-core EPYC)"
  suite       the bench/gpu/run_bench.sh suite (or other driver) that produced the row
  command     the command that reproduces the row (a driver invocation)
  metric      what was measured, e.g. "gpt2-124m bf16 ms/iter (iters 11-30)"
  value       the number (as printed by the program, or the mean of printed numbers)
  unit        ms, TFLOP/s, GB/s, tokens/s, MB, MiB, s, ...
  peer        the peer implementation measured in the same call (empty when none)
  peer_value  the peer's value of the same metric (empty when none)
  source      the log the value was read from (a path under $OUT of the driver, or, for rows
              migrated from the old bench/results/ folder, "<commit>:<path>" for `git show`)
  note        free text ("log not kept" when the raw log was never committed)

Parsers (subcommands), each reading one log and appending rows:
  bench-lines LOG [--peer-log PEERLOG]  lines "<label>  <t> ms  <r> TFLOP/s|GB/s" of
        bench/gpu/gpu_bench.cpp and bench/gpu/torch_peers.py; one row per line and quantity;
        with --peer-log the matching torch line (same shape label) fills peer/peer_value.
  pretrain LOG --iters A-B [--tokens-per-iter N] [--name NAME] [--each]  Megatron log lines of
        pretrain_gpt: mean "elapsed time per iteration (ms)" and "throughput per GPU" over the
        logged iterations A..B; tokens/s = N / mean ms; "max allocated"/"max reserved" if printed.
  kprof LOG [--name NAME]   the "[Rank 0] kernel profile | <category> ms/step" rows and wall.
  preprocess LOG   "ours|megatron <tokenizer> w=<workers> [_tag]: ..." lines of
        bench/preprocess/device_bench.sh: processing seconds, MiB/s, MiB per CPU s, startup s;
        Megatron's own "Processed ... MB/s" figure.
  fp8-gemm LOG      fp8_gpu_test's "time <gemm> m.. n.. k.. fp8 <t> ms <r> TFLOP/s | bf16 <t> ms <r> TFLOP/s"
        and "time fp8_quantize... <t> ms, <r> GB/s" lines; the bf16 GEMM is the peer.
  ncu-profile TXT [--name NAME]  "<category>  <t> ms  <p> %" lines of bench/gpu/ncu_step_profile.py.
  info LOG [--grep REGEX]  every "<number> <unit>" (ms/iter, ms, tok/s, tokens/s, GB/s, MB/s,
        TFLOP/s, MB, MiB, s) of the "INFO|PASS|FAIL ..." lines of a tests/gpu/*_check.sh log (lines matching
        REGEX only); the metric is the INFO line itself (cut to 160 characters) and the unit's index.
  ckpt LOG          "RESULT key value ..." and "dd ...: N MB/s" / "save|load N MB/s" lines of
        bench/checkpoint/device_ckpt_bench.sh and checkpoint_bench.
  smi-peak CSV[.gz] [--name NAME]  peak memory.used (MiB) per GPU of an nvidia-smi -lms sample file.
  peer LOG --name NAME [--peer P] [--ours-log OURS --iters A-B --tokens-per-iter N]  the
        "PEER <tag>: ms/iter X tokens/s Y [TFLOP/s Z] [peak_mem_GiB W] [steps n]" summary line of
        bench/gpu/torch_llama_peer.py / llmc_peer.sh; one row per quantity with ours (the mean of
        OURS's iterations A..B, as `pretrain`) as value and the peer's figure as peer_value. A
        quantity ours lacks (or an OURS log without iteration lines) becomes a peer-only row: the
        peer's figure as value, the metric saying "peer ... alone". A "PEER <tag> FAILED" line
        is an error naming the reason.
  value --metric M --value V --unit U [--peer P --peer-value PV]  one row given on the command line.

Common options: --results FILE (default $RESULTS, else bench/results.csv next to this script), --date, --commit,
--machine, --suite, --command, --source (default: the log path), --note.  A bad or empty log is an
error (exit 2, one line naming the file); nothing is appended then.
"""
import argparse
import csv
import datetime
import gzip
import os
import re
import sys

COLUMNS = ["date", "commit", "machine", "suite", "command", "metric", "value", "unit",
           "peer", "peer_value", "source", "note"]
DEFAULT_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results.csv")

BENCH_LINE = re.compile(r"^(?P<label>\S.*?)\s+(?P<t>[0-9.]+) ms\s+(?P<r>[0-9.]+) (?P<u>TFLOP/s|GB/s)\s*$")
ITER_LINE = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): ([0-9.]+)"
                       r"(?:.*?throughput per GPU \(TFLOP/s/GPU\): ([0-9.]+))?")
MEM_LINE = re.compile(r"\[Rank (\d+)\].*?max allocated: ([0-9.]+) \| reserved: ([0-9.]+) \| max reserved: ([0-9.]+)")
KPROF_WALL = re.compile(r"\[Rank 0\] kernel profile \| iterations (\d+)-(\d+) .*?\| wall ([0-9.]+) ms/step")
KPROF_TOP = re.compile(r"\[Rank 0\] kernel profile \|\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+(\w+)\s+(\S.*)$")
KPROF_ROW = re.compile(r"\[Rank 0\] kernel profile \| (gemm|attention|optimizer|other|memcpy|memset|"
                       r"communication|idle)\s+([0-9.]+)\s+([0-9.]+)(?:\s+([0-9.]+))?")


class LogError(Exception):
    """A log that cannot be parsed; the message names the file and what is missing."""


def _read(path):
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", errors="replace") as f:
            return f.read()
    except OSError as e:
        raise LogError(f"{path}: cannot read ({e.strerror})")


def _peer_key(label):
    """Shape part of a bench label: 'torch gemm qkv ...' / 'gemm qkv ...' -> 'gemm qkv ...';
    'torch-sdpa-cudnn llama3-8b ...' / 'attention llama3-8b ...' -> 'attention llama3-8b ...'."""
    m = re.search(r"\b(llama3-8b|gpt2-124m)\b.*", label)
    if m and (label.startswith("attention") or label.startswith("torch-sdpa-")):
        return "attention " + m.group(0)
    if label.startswith("torch "):
        return label[len("torch "):]
    return label


def parse_bench_lines(path, peer_path=None):
    """Rows of gpu_bench / torch_peers output: (metric, value, unit, peer, peer_value)."""
    def lines(p):
        out = []
        for ln in _read(p).splitlines():
            m = BENCH_LINE.match(ln.strip())
            if m:
                out.append((" ".join(m.group("label").split()), float(m.group("t")),
                            float(m.group("r")), m.group("u")))
        if not out:
            raise LogError(f"{p}: no '<label> <t> ms <rate> TFLOP/s|GB/s' line")
        return out
    peers = {}
    if peer_path:
        for label, t, r, u in lines(peer_path):
            peers.setdefault(_peer_key(label), (label.split(" ")[0], t, r))
    rows = []
    for label, t, r, u in lines(path):
        p = peers.get(_peer_key(label))
        rows.append((f"{label} time", t, "ms", p[0] if p else "", p[1] if p else ""))
        rows.append((f"{label} rate", r, u, p[0] if p else "", p[2] if p else ""))
    return rows


def _iter_window(path, first, last):
    """The logged iterations first..last of a pretrain_gpt log: (ms/iter values, TFLOP/s values,
    [(iteration, ms, TFLOP/s string or None)]), in log order."""
    ms, tf, per = [], [], []
    for ln in _read(path).splitlines():
        m = ITER_LINE.search(ln)
        if m and first <= int(m.group(1)) <= last:
            ms.append(float(m.group(2)))
            per.append((int(m.group(1)), float(m.group(2)), m.group(3)))
            if m.group(3):
                tf.append(float(m.group(3)))
    return ms, tf, per


def parse_pretrain(path, first, last, tokens_per_iter=None, name="", each=False):
    """Mean step time / throughput over logged iterations first..last of a pretrain_gpt log;
    with each=True also one row per logged line (its interval's ms/iter and TFLOP/s)."""
    ms, tf, per = _iter_window(path, first, last)
    if not ms:
        raise LogError(f"{path}: no 'elapsed time per iteration' line for iterations {first}-{last}")
    pre = f"{name} " if name else ""
    win = f"(iters {first}-{last}, mean of {len(ms)} logged)"
    mean = sum(ms) / len(ms)
    rows = [(f"{pre}ms/iter {win}", round(mean, 3), "ms", "", "")]
    if tf:
        rows.append((f"{pre}TFLOP/s/GPU {win}", round(sum(tf) / len(tf), 2), "TFLOP/s", "", ""))
    if tokens_per_iter:
        rows.append((f"{pre}tokens/s {win}", round(tokens_per_iter / mean * 1000.0, 1), "tokens/s", "", ""))
    if each:
        for it, t, f in per:
            rows.append((f"{pre}ms/iter (logged at iteration {it})", t, "ms", "", ""))
            if f:
                rows.append((f"{pre}TFLOP/s/GPU (logged at iteration {it})", float(f), "TFLOP/s", "", ""))
            if tokens_per_iter:
                rows.append((f"{pre}tokens/s (logged at iteration {it})", round(tokens_per_iter / t * 1000.0, 1), "tokens/s", "", ""))
    last = {}
    for rank, alloc, _res, maxres in MEM_LINE.findall(_read(path)):
        last[rank] = (alloc, maxres)
    for rank, (alloc, maxres) in sorted(last.items(), key=lambda kv: int(kv[0])):
        rows.append((f"{pre}rank {rank} max allocated (last report)", float(alloc), "MB", "", ""))
        rows.append((f"{pre}rank {rank} max reserved (last report)", float(maxres), "MB", "", ""))
    return rows


PEER_LINE = re.compile(r"^PEER (?P<tag>\S.*?): ms/iter (?P<ms>[0-9.]+) tokens/s (?P<tok>[0-9.]+)"
                       r"(?: TFLOP/s (?P<tf>[0-9.]+))?(?: peak_mem_GiB (?P<mem>[0-9.]+))?(?: steps (?P<n>\d+))?")
PEER_FAILED = re.compile(r"^PEER (?P<tag>\S.*?) FAILED (?P<why>.*)$")


def parse_peer(path, name, peer="", ours_log=None, first=None, last=None, tokens_per_iter=None):
    """Rows pairing a peer's summary line with ours: (metric, ours, unit, peer, peer value)."""
    text = _read(path)
    m = next((PEER_LINE.match(ln) for ln in text.splitlines() if PEER_LINE.match(ln)), None)
    if not m:
        f = next((PEER_FAILED.match(ln) for ln in text.splitlines() if PEER_FAILED.match(ln)), None)
        if f:
            raise LogError(f"{path}: peer {f.group('tag')} FAILED {f.group('why')[:200]}")
        raise LogError(f"{path}: no 'PEER <tag>: ms/iter X tokens/s Y' line")
    tag = m.group("tag")
    peer = peer or tag
    nsteps = f", mean of {m.group('n')} steps" if m.group("n") else ""
    ours = {}
    if ours_log:
        try:
            ms, tf, _ = _iter_window(ours_log, first, last)
        except LogError:
            ms, tf = [], []
        if ms:
            ours["ms/iter"] = round(sum(ms) / len(ms), 3)
            if tf:
                ours["TFLOP/s/GPU"] = round(sum(tf) / len(tf), 2)
            if tokens_per_iter:
                ours["tokens/s"] = round(tokens_per_iter / ours["ms/iter"] * 1000.0, 1)
    win = f"ours iters {first}-{last}" if ours_log else "ours not run"
    rows = []
    for key, unit, grp in (("ms/iter", "ms", "ms"), ("tokens/s", "tokens/s", "tok"), ("TFLOP/s/GPU", "TFLOP/s", "tf")):
        if m.group(grp) is None:
            continue
        pv = float(m.group(grp))
        if key in ours:
            rows.append((f"{name} {key} ({win}; peer: {tag}{nsteps})", ours[key], unit, peer, pv))
        else:
            rows.append((f"{name} {key}: peer {tag} alone ({win if not ours_log else 'no ours figure'}{nsteps})",
                         pv, unit, "", ""))
    if m.group("mem"):
        rows.append((f"{name}: peer {tag} peak memory (torch.cuda.max_memory_allocated)", float(m.group("mem")), "GiB", "", ""))
    return rows


def parse_kprof(path, name=""):
    """Category rows of the CUPTI kernel profile of rank 0 (first profile in the log)."""
    text = _read(path)
    w = KPROF_WALL.search(text)
    if not w:
        raise LogError(f"{path}: no '[Rank 0] kernel profile | iterations A-B ... wall' line")
    pre = f"{name} " if name else ""
    win = f"(profile iters {w.group(1)}-{w.group(2)})"
    rows = [(f"{pre}kernel profile wall {win}", float(w.group(3)), "ms/step", "", "")]
    seen = set()
    for m in KPROF_ROW.finditer(text[w.start():]):
        cat = m.group(1)
        if cat in seen:
            break
        seen.add(cat)
        rows.append((f"{pre}kernel profile {cat} {win}", float(m.group(2)), "ms/step", "", ""))
        rows.append((f"{pre}kernel profile {cat} share {win}", float(m.group(3)), "%", "", ""))
        if m.group(4):
            rows.append((f"{pre}kernel profile {cat} kernel total {win}", float(m.group(4)), "ms/step", "", ""))
    top = text.find("[Rank 0] kernel profile | top ", w.start())
    if top >= 0:
        for ln in text[top:].splitlines()[1:26]:
            m = KPROF_TOP.search(ln)
            if not m:
                break
            k = f"{pre}kernel profile top kernel {m.group(5)[:90]} {win}"
            rows.append((f"{k} ms/step", float(m.group(1)), "ms/step", "", ""))
            rows.append((f"{k} mean per call", float(m.group(3)), "us", "", ""))
    return rows


PRE_OURS = re.compile(r"^ours (\S+) w=(\d+) ?(\S*) ?: Time to startup: ([0-9.]+) \| Done: .*? in ([0-9.]+) s, "
                      r"([0-9.]+) MiB/s, \d+ workers, ([0-9.]+) CPU s \(([0-9.]+) MiB per CPU second\)")
PRE_MEG = re.compile(r"^megatron (\S+) w=(\d+) ?(\S*) ?: Time to startup: ([0-9.]+) \| Processed (\d+) documents "
                     r"\([0-9.]+ docs/s, ([0-9.]+) MB/s\)")


def parse_preprocess(path):
    """Rows of bench/preprocess/device_bench.sh's summary (ours and Megatron's preprocess_data)."""
    rows = []
    for ln in _read(path).splitlines():
        m = PRE_OURS.match(ln)
        if m:
            tok, w, tag = m.group(1), m.group(2), m.group(3)
            pre = f"preprocess_data {tok} --workers {w}{' ' + tag if tag else ''}"
            rows += [(f"{pre} startup", float(m.group(4)), "s", "", ""),
                     (f"{pre} processing", float(m.group(5)), "s", "", ""),
                     (f"{pre} rate", float(m.group(6)), "MiB/s", "", ""),
                     (f"{pre} CPU", float(m.group(7)), "s", "", ""),
                     (f"{pre} rate per CPU s", float(m.group(8)), "MiB/CPU s", "", "")]
            continue
        m = PRE_MEG.match(ln)
        if m:
            pre = f"Megatron preprocess_data.py {m.group(1)} --workers {m.group(2)}"
            rows += [(f"{pre} startup", float(m.group(4)), "s", "", ""),
                     (f"{pre} rate ({m.group(5)} documents)", float(m.group(6)), "MB/s", "", "")]
    if not rows:
        raise LogError(f"{path}: no 'ours|megatron <tokenizer> w=N : Time to startup' line")
    return rows


FP8_GEMM = re.compile(r"^time (.+?)\s+m(\d+)\s+n(\d+)\s+k(\d+)\s+fp8\s+([0-9.]+) ms\s+([0-9.]+) TFLOP/s.*?"
                      r"\| bf16\s+([0-9.]+) ms\s+([0-9.]+) TFLOP/s")
FP8_Q = re.compile(r"^time (fp8_quantize\S*) (\S+) (\S+): ([0-9.]+) ms, ([0-9.]+) GB/s")
NCU_TOP = re.compile(r"^\s+([0-9.]+) ms\s+(\d+)x\s+(\S.*)$")
NCU_ROW = re.compile(r"^\s+(\S.*?)\s+([0-9.]+) ms\s+([0-9.]+) %\s*$")


def parse_fp8_gemm(path):
    """FP8 vs bf16 GEMM and quantize timing lines of fp8_gpu_test (bf16 = the peer)."""
    rows = []
    for ln in _read(path).splitlines():
        m = FP8_GEMM.match(ln.strip())
        if m:
            g = f"fp8 gemm {' '.join(m.group(1).split())} {m.group(2)}x{m.group(3)}x{m.group(4)}"
            rows += [(f"{g} time", float(m.group(5)), "ms", "bf16 cuBLASLt", float(m.group(7))),
                     (f"{g} rate", float(m.group(6)), "TFLOP/s", "bf16 cuBLASLt", float(m.group(8)))]
            continue
        m = FP8_Q.match(ln.strip())
        if m:
            q = f"{m.group(1)} {m.group(2)} {m.group(3)}"
            rows += [(f"{q} time", float(m.group(4)), "ms", "", ""), (f"{q} rate", float(m.group(5)), "GB/s", "", "")]
    if not rows:
        raise LogError(f"{path}: no 'time <gemm> m.. n.. k.. fp8 ...' line")
    return rows


def parse_ncu_profile(path, name=""):
    """Category lines of bench/gpu/ncu_step_profile.py's summary (ms per step and share)."""
    rows = []
    pre = f"{name} " if name else ""
    in_top = False
    for ln in _read(path).splitlines():
        if ln.startswith("top kernels"):
            in_top = True
            continue
        if in_top:
            m = NCU_TOP.match(ln)
            if m:
                k = f"{pre}ncu step profile kernel {m.group(3)[:100]}"
                rows += [(f"{k} ms/step", float(m.group(1)), "ms/step", "", ""),
                         (f"{k} per call", round(float(m.group(1)) / int(m.group(2)), 4), "ms", "", "")]
            continue
        m = NCU_ROW.match(ln)
        if m:
            c = " ".join(m.group(1).split())
            rows += [(f"{pre}ncu step profile {c}", float(m.group(2)), "ms/step", "", ""),
                     (f"{pre}ncu step profile {c} share", float(m.group(3)), "%", "", "")]
    if not rows:
        raise LogError(f"{path}: no '<category>  <t> ms  <p> %' line")
    return rows


INFO_NUM = re.compile(r"(?<![\w.])(\d[\d,]*(?:\.\d+)?)\s*(ms/iter|ms/step|tok/s|tokens/s|GB/s|MB/s|TFLOP/s|ms|MB|MiB|s)\b")


def parse_info(path, grep=None):
    """Numbers with units of the INFO / PASS / FAIL lines of a GPU check log."""
    rows = []
    pat = re.compile(grep) if grep else None
    for ln in _read(path).splitlines():
        if not ln.startswith(("INFO ", "PASS ", "FAIL ")) or (pat and not pat.search(ln)):
            continue
        text = " ".join(ln.split())[:160]
        for k, m in enumerate(INFO_NUM.finditer(ln[5:])):
            rows.append((f"{text} [#{k + 1}]", float(m.group(1).replace(",", "")), m.group(2), "", ""))
    if not rows:
        raise LogError(f"{path}: no 'INFO|PASS|FAIL ... <number> <unit>' line" + (f" matching {grep!r}" if grep else ""))
    return rows


CKPT_RESULT = re.compile(r"^RESULT (.*)$")
CKPT_RATE = re.compile(r"^((?:dd|save|load)[^:=]*?):? ([0-9.]+) MB/s")
CKPT_COPIED = re.compile(r"^(\d+) bytes .*copied, ([0-9.]+) s, ([0-9.]+) MB/s")
UNITS = {"_s": "s", "_GBps": "GB/s", "_ms": "ms"}


def parse_ckpt(path):
    """Save/load figures of the checkpoint benches and the dd references beside them; a
    "== <section>" header line (e.g. "== after (1)") prefixes the metrics below it."""
    rows = []
    section = ""
    for ln in _read(path).splitlines():
        ln = ln.strip()
        if ln.startswith("== "):
            section = ln[3:].strip() + ": "
            continue
        m = CKPT_RESULT.match(ln)
        if m:
            toks = m.group(1).split()
            for k, v in zip(toks[0::2], toks[1::2]):
                try:
                    x = float(v)
                except ValueError:
                    continue
                unit = next((u for suf, u in UNITS.items() if k.endswith(suf)), "")
                rows.append((f"{section}checkpoint_bench {k}", x, unit, "", ""))
                if unit == "GB/s":
                    rows.append((f"{section}checkpoint_bench {k[:-4]}MBps", round(x * 1000, 3), "MB/s", "", ""))
            continue
        m = CKPT_COPIED.match(ln)
        if m:
            rows.append((f"{section}dd {m.group(1)} bytes in {m.group(2)} s", float(m.group(3)), "MB/s", "", ""))
            continue
        m = CKPT_RATE.match(ln)
        if m:
            rows.append((section + " ".join(m.group(1).split()), float(m.group(2)), "MB/s", "", ""))
    if not rows:
        raise LogError(f"{path}: no 'RESULT ...' or 'dd|save|load ... MB/s' line")
    return rows


def parse_smi_peak(path, name=""):
    """Peak memory.used per GPU of 'index, memory.used, utilization' samples."""
    peak = {}
    for ln in _read(path).splitlines():
        f = [x.strip() for x in ln.split(",")]
        if len(f) >= 2 and f[0].isdigit():
            try:
                peak[f[0]] = max(peak.get(f[0], 0.0), float(f[1]))
            except ValueError:
                continue
    if not peak:
        raise LogError(f"{path}: no 'index, memory.used' sample")
    pre = f"{name} " if name else ""
    return [(f"{pre}nvidia-smi peak memory.used gpu{g}", v, "MiB", "", "") for g, v in sorted(peak.items())]


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.6g}" if abs(v) < 1e6 else f"{v:.0f}"
    return str(v)


def append(results, common, rows):
    """Append rows (metric, value, unit, peer, peer_value) with the common columns to results."""
    new = not os.path.exists(results) or os.path.getsize(results) == 0
    with open(results, "a", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        if new:
            w.writerow(COLUMNS)
        for metric, value, unit, peer, pv in rows:
            w.writerow([common["date"], common["commit"], common["machine"], common["suite"],
                        common["command"], metric, _fmt(value), unit, peer, _fmt(pv) if pv != "" else "",
                        common["source"], common["note"]])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", default=os.environ.get("RESULTS", DEFAULT_RESULTS))
    ap.add_argument("--date", default=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"))
    ap.add_argument("--commit", default=os.environ.get("BENCH_COMMIT", ""))
    ap.add_argument("--machine", default=os.environ.get("BENCH_MACHINE", ""))
    ap.add_argument("--suite", default=os.environ.get("BENCH_SUITE", ""))
    ap.add_argument("--command", default=os.environ.get("BENCH_COMMAND", ""))
    ap.add_argument("--source", default=None)
    ap.add_argument("--note", default="")
    sub = ap.add_subparsers(dest="kind", required=True)
    p = sub.add_parser("bench-lines"); p.add_argument("log"); p.add_argument("--peer-log")
    p = sub.add_parser("pretrain"); p.add_argument("log"); p.add_argument("--iters", required=True)
    p.add_argument("--tokens-per-iter", type=float); p.add_argument("--name", default="")
    p.add_argument("--each", action="store_true")
    p = sub.add_parser("kprof"); p.add_argument("log"); p.add_argument("--name", default="")
    p = sub.add_parser("preprocess"); p.add_argument("log")
    p = sub.add_parser("fp8-gemm"); p.add_argument("log")
    p = sub.add_parser("ncu-profile"); p.add_argument("log"); p.add_argument("--name", default="")
    p = sub.add_parser("info"); p.add_argument("log"); p.add_argument("--grep")
    p = sub.add_parser("ckpt"); p.add_argument("log")
    p = sub.add_parser("smi-peak"); p.add_argument("log"); p.add_argument("--name", default="")
    p = sub.add_parser("peer"); p.add_argument("log"); p.add_argument("--name", required=True)
    p.add_argument("--peer", default=""); p.add_argument("--ours-log"); p.add_argument("--iters")
    p.add_argument("--tokens-per-iter", type=float)
    p = sub.add_parser("value"); p.add_argument("--metric", required=True)
    p.add_argument("--value", required=True, type=float); p.add_argument("--unit", required=True)
    p.add_argument("--peer", default=""); p.add_argument("--peer-value", default="")
    a = ap.parse_args(argv)
    if not a.commit or not a.machine:
        ap.error("--commit and --machine (or BENCH_COMMIT / BENCH_MACHINE) are required")
    try:
        if a.kind == "bench-lines":
            rows = parse_bench_lines(a.log, a.peer_log)
        elif a.kind == "pretrain":
            m = re.fullmatch(r"(\d+)-(\d+)", a.iters)
            if not m:
                ap.error(f"--iters {a.iters!r}: expected FIRST-LAST, e.g. 11-30")
            rows = parse_pretrain(a.log, int(m.group(1)), int(m.group(2)), a.tokens_per_iter, a.name, a.each)
        elif a.kind == "peer":
            first = last = None
            if a.ours_log:
                m = re.fullmatch(r"(\d+)-(\d+)", a.iters or "")
                if not m:
                    ap.error("peer --ours-log needs --iters FIRST-LAST")
                first, last = int(m.group(1)), int(m.group(2))
            rows = parse_peer(a.log, a.name, a.peer, a.ours_log, first, last, a.tokens_per_iter)
        elif a.kind == "kprof":
            rows = parse_kprof(a.log, a.name)
        elif a.kind == "preprocess":
            rows = parse_preprocess(a.log)
        elif a.kind == "fp8-gemm":
            rows = parse_fp8_gemm(a.log)
        elif a.kind == "ncu-profile":
            rows = parse_ncu_profile(a.log, a.name)
        elif a.kind == "info":
            rows = parse_info(a.log, a.grep)
        elif a.kind == "ckpt":
            rows = parse_ckpt(a.log)
        elif a.kind == "smi-peak":
            rows = parse_smi_peak(a.log, a.name)
        else:
            pv = float(a.peer_value) if a.peer_value != "" else ""
            rows = [(a.metric, a.value, a.unit, a.peer, pv)]
    except LogError as e:
        print(f"append_result.py: {e}", file=sys.stderr)
        return 2
    src = a.source if a.source is not None else getattr(a, "log", "")
    append(a.results, {"date": a.date, "commit": a.commit, "machine": a.machine, "suite": a.suite,
                       "command": a.command, "source": src, "note": a.note}, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
