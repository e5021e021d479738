#!/usr/bin/env bash
# The GPU checks written in session 9 (2026-12-01), which no GPU was lent to run: each change's
# speed and correctness on one H200 (docs/performance.md "Session 9", docs/moe.md "Performance" /
# "FP8 experts"). Two groups, each sized for one device call (< 600 s):
#   tests/gpu/session9_checks.sh a BIN_DIR LOGDIR   optimizer overlap (optoverlap_check.sh), the FP8
#                                                   output layer's speed (fp8head_check.sh) and accuracy
#                                                   on real text (fp8head_convergence.sh)
#   tests/gpu/session9_checks.sh b BIN_DIR LOGDIR   blockwise FP8 kernels and fusion (blockq_check.sh),
#                                                   the device MoE router (moerouter_check.sh), FP8
#                                                   experts (moefp8_check.sh)
# BIN_DIR: a CUDA build's bin (pretrain_gpt, preprocess_data, gpu_ops_test, fp8_gpu_test, gpu_bench).
# Each check prints its own RESULT / PASS / FAIL lines (see each script's header for what PASS
# means); this runner repeats those lines, one "<check> rc=N t=S" line per check, and exits 1 iff a
# check failed or timed out. Logs: LOGDIR/<check>/ and LOGDIR/<check>.log (small text files).
set -u
group=${1:?usage: session9_checks.sh a|b BIN_DIR LOGDIR}
BIN=$(cd "${2:?usage: session9_checks.sh a|b BIN_DIR LOGDIR}" && pwd)
LOGDIR=${3:?usage: session9_checks.sh a|b BIN_DIR LOGDIR}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$LOGDIR" && LOGDIR=$(cd "$LOGDIR" && pwd)
export NCCL_NVLS_ENABLE=0
case "$group" in
  a) checks=(optoverlap_check:200 fp8head_check:190 fp8head_convergence:180) ;;
  b) checks=(blockq_check:190 moerouter_check:180 moefp8_check:190) ;;
  *) echo "session9_checks.sh: unknown group '$group' (use a or b)" >&2; exit 2 ;;
esac
status=0 t0=$(date +%s)
for c in "${checks[@]}"; do
  name=${c%%:*} limit=${c##*:}
  timeout "$limit" bash "$HERE/$name.sh" "$BIN" "$LOGDIR/$name" > "$LOGDIR/$name.log" 2>&1
  rc=$?
  echo "$name rc=$rc t=$(( $(date +%s) - t0 ))"
  grep -E '^(RESULT|PASS|FAIL)' "$LOGDIR/$name.log" | cut -c1-240
  [ "$rc" -eq 0 ] || status=1
done
exit $status
