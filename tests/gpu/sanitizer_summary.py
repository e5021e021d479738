#!/usr/bin/env python3
"""Summarizes one compute-sanitizer log (tests/gpu/run_gpu_tests.sh).

  sanitizer_summary.py LABEL TOOL LOG RC

Counts the error records the tool printed ("========= Invalid __global__ read ...",
"========= Uninitialized __global__ memory read ...", "========= Error: Race reported between ...",
"========= Barrier error ...", "========= Program hit cudaErrorX ... on CUDA API call to ..."),
attributes each to the kernel named on its "at KERNEL+0x..." line (or the API call), splits them
into library kernels (cuDNN, cuBLAS/cuBLASLt, CUTLASS) and ours, and reads the tool's own summary
("ERROR SUMMARY: N errors", "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)").
Verdict (one line; exit 0 iff not FAIL):
  PASS  the summary says 0 errors / 0 hazards;
  PASS  racecheck whose hazards are all inside cuDNN's / cuBLASLt's own kernels (docs/cuda.md:
        the tool does not model their mbarrier/TMA synchronization), reported with the count;
  PASS  initcheck / synccheck whose every error (the summary's count all printed) is inside cuDNN's
        / cuBLAS's own kernels or on a host copy of a buffer the program then verified (its checks
        all passed: the values were written; initcheck did not see those writes);
  INFO  the same when the print limit hid some errors (unattributed: not judged);
  FAIL  any other error record, or records without a summary, or the program itself failed;
  INFO  no summary and no record: the run did not finish (timeout) -- nothing was checked fully.
"""
import re
import sys

LIB = re.compile(r"cudnn|cublas|cutlass|xmma|nvjet|gemmSN|gemv|sm\d+_|cask|fort_native|flash_fprop|flash_bprop", re.I)
HEAD = re.compile(r"^========= (Invalid|Uninitialized|Error: Race|Race|Barrier|Program hit|Warning: Race|Host API|"
                  r"Illegal|Misaligned|Out-of-range|Malloc|Cuda API|Error:|Leaked|Unused)", re.I)


def main():
    label, tool, path, rc = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError:
        lines = []
    recs = []  # (kind, where)
    for i, ln in enumerate(lines):
        if not HEAD.match(ln) or "SUMMARY" in ln:
            continue
        kind = ln[10:].strip()
        kind = kind.split(" at ")[0].split(" on CUDA API")[0][:60]
        where = "?"
        m = re.search(r"(?:access at|at) (.+?)\+0x", ln)
        if m:
            where = m.group(1)
        else:
            for nxt in lines[i + 1:i + 4]:
                m = re.match(r"^=========\s+at (.+?)(\+0x| in |$)", nxt)
                if m:
                    where = m.group(1).strip()
                    break
        if kind.startswith("Host API"):
            # initcheck on a host<->device copy: "Uninitialized access to ... by cudaMemcpy source"
            nxt = " ".join(lines[i + 1:i + 2])
            where = "host copy" if "cudaMemcpy source" in nxt else "API host access"
        if kind.startswith("Program hit"):
            m = re.search(r"on CUDA API call to (\S+)", ln)
            where = "API " + (m.group(1) if m else "?")
        recs.append((kind, where))
    summ = None
    for ln in lines:
        m = re.search(r"ERROR SUMMARY: (\d+) error", ln)
        if m:
            summ = int(m.group(1))
        m = re.search(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)", ln)
        if m:
            summ = int(m.group(2))  # errors; warnings are reported as INFO
            warn = int(m.group(3))
            if warn:
                print(f"INFO {label}: racecheck {warn} warnings (not errors)")
    lib = [r for r in recs if LIB.search(r[1]) and not r[1].startswith("API")]
    host = [r for r in recs if r[1] == "host copy"]
    ours = [r for r in recs if r not in lib and r not in host]
    # The program's own verdict lines (gpu_ops_test / fp8_gpu_test print "FAIL <check>").
    prog_failed = any(ln.startswith("FAIL ") for ln in lines)
    top = {}
    for k, w in recs:
        key = f"{k[:60]} @ {w[:90]}"
        top[key] = top.get(key, 0) + 1
    tops = "; ".join(f"{n}x {k}" for k, n in sorted(top.items(), key=lambda x: -x[1])[:4])
    if summ is None:
        if not recs:
            print(f"INFO {label}: {tool}: no summary (exit {rc}: timed out or crashed before the end); no error record seen")
            return 0
        print(f"FAIL {label}: {tool}: no summary (exit {rc}); {len(recs)} error records ({len(ours)} outside "
              f"cuDNN/cuBLAS kernels): {tops}")
        return 1
    if summ == 0 and not recs:
        if rc not in ("0", "3"):  # the tool passes the program's own exit status through
            print(f"FAIL {label}: {tool}: 0 errors, but the program exited with {rc} (see the log)")
            return 1
        print(f"PASS {label}: {tool}: 0 errors")
        return 0
    if tool == "racecheck" and recs and not ours and not host:
        print(f"PASS {label}: {tool}: 0 hazards in our kernels; {len(lib)} in cuDNN/cuBLAS's own kernels "
              f"(known false positives, docs/cuda.md): {tops}")
        return 0
    complete = summ is not None and summ <= len(recs)  # every error was printed and attributed
    if tool in ("initcheck", "synccheck") and recs and not ours and complete and not (host and prog_failed):
        # Records only inside cuDNN's / cuBLAS's own kernels, and host copies of buffers whose values
        # the program then checked against its references (all checks passed, so they were written:
        # the tool did not see those writes).
        print(f"PASS {label}: {tool}: 0 in our kernels; {len(lib)} inside cuDNN/cuBLAS's own kernels, "
              f"{len(host)} on host copies of verified buffers (docs/cuda.md): {tops}")
        return 0
    if tool in ("initcheck", "synccheck") and recs and not ours and not complete:
        print(f"INFO {label}: {tool}: {summ} errors by the summary, only {len(recs)} printed (print limit): all "
              f"printed ones inside cuDNN/cuBLAS kernels or host copies, the rest unattributed: {tops}")
        return 0
    print(f"FAIL {label}: {tool}: {summ} errors by the summary, {len(recs)} records ({len(ours)} outside "
          f"cuDNN/cuBLAS kernels, {len(lib)} inside), exit {rc}: {tops}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
