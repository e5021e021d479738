#!/usr/bin/env bash
# Checkpoint I/O on the GPU host's disk (issue #8 performance; docs/performance.md "ckptio").
# Usage: tests/gpu/ckptio_check.sh BIN_DIR   (results in ${OUT:-/tmp/out}/ckptio; < 90 s)
# 1. the O_DIRECT writer / streamed loader unit tests with TMPDIR on the disk under test
#    (CKPT_BENCH_DIR, default ./.ckpt_bench_tmp): the bytes written and loaded must be exact there;
# 2. bench/checkpoint/device_ckpt_bench.sh: our save/load of up to 8 GiB beside dd (raw write,
#    O_DIRECT write, 2 O_DIRECT streams, O_DIRECT read), ratios printed.
# Uses no GPU. Prints PASS/FAIL lines with numbers; exit 1 on any FAIL.
set -u
BIN=$(cd "${1:?usage: ckptio_check.sh BIN_DIR}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
O=${OUT:-/tmp/out}/ckptio
mkdir -p "$O"
DATA=${CKPT_BENCH_DIR:-$PWD/.ckpt_bench_tmp}
mkdir -p "$DATA/tmp"
# Libraries a CUDA build links (toolkit or the PyTorch wheel's nvidia/*/lib), as kprof_check.sh.
. "$(dirname "${BASH_SOURCE[0]}")/cuda_libs.sh"
for l in $(ldd "$BIN/checkpoint_bench" 2>/dev/null | awk '/not found/{print $1}'); do
  f=$(find / -xdev -name "$l" 2>/dev/null | head -1); [ -n "$f" ] && export LD_LIBRARY_PATH="$(dirname "$f"):$LD_LIBRARY_PATH"
done
status=0
pass() { echo "PASS ckptio: $*"; }
fail() { echo "FAIL ckptio: $*"; status=1; }

if [ -x "$BIN/unit_tests" ]; then
  TMPDIR="$DATA/tmp" timeout 40 "$BIN/unit_tests" --gtest_filter='AlignedWriter*:*StreamedLoad*:DistCheckpointing*' > "$O/unit_tests.log" 2>&1
  rc=$?
  n=$(grep -c '^\[       OK' "$O/unit_tests.log")
  direct=$(grep -m1 'size 25165837: O_DIRECT' "$O/unit_tests.log" | sed 's/.*O_DIRECT //')
  if [ $rc -eq 0 ]; then pass "unit tests on $(df -T "$DATA" | tail -1 | awk '{print $1, $2}'): $n OK (O_DIRECT $direct)"
  else fail "unit tests rc=$rc ($n OK; see $O/unit_tests.log)"; fi
else
  fail "no $BIN/unit_tests"
fi
rm -rf "$DATA/tmp"

CKPT_BENCH_DIR="$DATA" timeout 75 "$HERE/../../bench/checkpoint/device_ckpt_bench.sh" "$O" "$BIN" > "$O/bench_stdout.log" 2>&1
rc=$?
cat "$O/summary.txt"
save=$(awk '/save_GBps/{print $5*1000}' "$O/summary.txt")
wdir=$(awk -F': ' '/dd write oflag=direct\+fdatasync/{print $2+0}' "$O/summary.txt")
if [ $rc -ne 0 ] || [ -z "$save" ] || [ -z "$wdir" ] || [ "$wdir" = 0 ]; then
  fail "bench did not complete (rc=$rc; see $O/bench_stdout.log, $O/checkpoint_bench.log)"
elif awk -v a="$save" -v b="$wdir" 'BEGIN{exit !(a >= 0.7*b)}'; then
  pass "save $save MB/s >= 70% of dd oflag=direct $wdir MB/s"
else
  fail "save $save MB/s < 70% of dd oflag=direct $wdir MB/s"
fi
exit $status
