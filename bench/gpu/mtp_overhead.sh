#!/usr/bin/env bash
# Step-time overhead of multi-token prediction (--mtp-num-layers 1) on the GPU machine, one GPU:
# the LLaMA-3-8B-shaped 4-layer model of run_bench.sh's ll4 suite (seq 8192, mbs 1, gbs 1, bf16,
# vocab 128256, mock data, seed 1234), without MTP and with --mtp-num-layers 1, alternated in one
# call in ABBA order (none, mtp | mtp, none | none, mtp for 3 alternations) so that clock or
# thermal drift hits both sides alike. Each run's figure is the mean "elapsed time per iteration
# (ms)" of iterations 3..ITERS (the first two carry warm-up, as in run_bench.sh).
#
#   bench/gpu/run_bench.sh mtp BIN_DIR        (the driver: commit, machine, RESULTS, flags)
#
# run_bench.sh calls `mtp_overhead.sh BIN_DIR LOG_DIR` with MTP_BENCH_FLAGS = its ll4 flags (LL +
# COMMON, global batch 1) and BENCH_COMMIT / BENCH_MACHINE / BENCH_SUITE / RESULTS exported.
# Environment: ITERS (default 8), ALTERNATIONS (default 3), DTYPE (bf16 | fp8, default bf16),
# BUDGET_S (default 90: an alternation that would end past it, judged by the slowest run so far,
# is skipped and said so; one run is cut at BUDGET_S/2). A failed run in the first alternation
# stops the script (exit 1, its log's tail printed).
#
# Rows appended through bench/append_result.py (suite "mtp"): per run the pretrain rows (ms/iter,
# TFLOP/s/GPU, tokens/s, peak memory) named ll4_<dtype>_gbs1_mtp<D> (alternation k); per
# alternation "... --mtp-num-layers 1 ms/iter" with the run without MTP as peer; the median
# overhead in % and as a ratio. Throughput counts MTP's extra layer and logits (Megatron's FLOPs
# formula), so TFLOP/s stays comparable while tokens/s shows the cost. Prints the rows it appended
# (merge with `tail -n +2 $OUT/results.csv >> bench/results.csv`) and one INFO line.
set -u
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
usage="usage: bench/gpu/run_bench.sh mtp BIN_DIR (it calls mtp_overhead.sh BIN_DIR LOG_DIR)"
BIN=${1:?$usage}; O=${2:?$usage}
[ -x "$BIN/pretrain_gpt" ] || { echo "mtp_overhead.sh: $BIN/pretrain_gpt is missing: build it first" >&2; exit 2; }
for v in MTP_BENCH_FLAGS BENCH_COMMIT BENCH_MACHINE RESULTS; do
  [ -n "${!v:-}" ] || { echo "mtp_overhead.sh: $v is not set: $usage" >&2; exit 2; }
done
mkdir -p "$O"
ITERS=${ITERS:-8}; ALT=${ALTERNATIONS:-3}; BUDGET=${BUDGET_S:-90}; DT=${DTYPE:-bf16}
case $DT in bf16|fp8) ;; *) echo "mtp_overhead.sh: DTYPE=$DT: expected bf16 or fp8" >&2; exit 2 ;; esac
[ "$ITERS" -ge 3 ] 2>/dev/null || { echo "mtp_overhead.sh: ITERS=$ITERS: need at least 3 (iterations 3..ITERS are timed)" >&2; exit 2; }
CMD="${DTYPE:+DTYPE=$DT }bench/gpu/run_bench.sh mtp BIN_DIR"
START_ROWS=$( [ -f "$RESULTS" ] && wc -l < "$RESULTS" || echo 1)
LL=$MTP_BENCH_FLAGS

mean_ms() {  # mean elapsed ms of logged iterations 3..ITERS of LOG, or empty
  sed -n 's/.* iteration *\([0-9]*\)\/.*elapsed time per iteration (ms): \([0-9.]*\).*/\1 \2/p' "$1" |
    awk -v n="$ITERS" '$1 >= 3 && $1 <= n {s += $2; c++} END {if (c) printf "%.2f", s / c}'
}
slowest=0; t0=$SECONDS; fails=0
# rows [COMMON OPTIONS] PARSER ARGS...: append through bench/append_result.py; a refusal counts as a failure.
rows() { python3 "$ROOT/bench/append_result.py" "$@" || { echo "mtp_overhead.sh: append_result.py $* failed" >&2; fails=$((fails + 1)); }; }
declare -A MS
# run D A: one pretrain_gpt run; sets MS[D,A] (empty on failure) and appends its rows.
run() {
  local d=$1 a=$2 n="ll4_${DT}_gbs1_mtp$1" log="$O/ll4_${DT}_mtp$1_a$2.log" s=$SECONDS flag=""
  [ "$d" -gt 0 ] && flag="--mtp-num-layers $d"
  CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} timeout $((BUDGET / 2)) "$BIN/pretrain_gpt" $LL $flag --train-iters "$ITERS" > "$log" 2>&1
  local rc=$? w=$((SECONDS - s))
  [ "$w" -gt "$slowest" ] && slowest=$w
  MS[$d,$a]=$(mean_ms "$log")
  echo "== $n alternation $a: rc=$rc, ${w} s wall, ${MS[$d,$a]:-no} ms/iteration (iterations 3..$ITERS)" \
       "$(grep -o 'mtp_1 loss: [0-9.E+-]*' "$log" | tail -1)"
  if [ "$rc" -ne 0 ] || [ -z "${MS[$d,$a]}" ]; then tail -5 "$log"; fails=$((fails + 1)); MS[$d,$a]=""; return; fi
  BENCH_COMMAND="$CMD [$n]" rows pretrain "$log" --iters "3-$ITERS" --tokens-per-iter 8192 --name "$n (alternation $a)"
}
done_alt=0; ratios=()
for a in $(seq 1 "$ALT"); do
  if [ "$a" -gt 1 ] && [ $((SECONDS - t0 + 2 * slowest)) -gt "$BUDGET" ]; then
    echo "mtp_overhead.sh: alternation $a skipped: $((SECONDS - t0)) s spent, 2 runs of up to $slowest s would pass BUDGET_S=$BUDGET"
    break
  fi
  if [ $((a % 2)) -eq 1 ]; then run 0 "$a"; run 1 "$a"; else run 1 "$a"; run 0 "$a"; fi
  d0=${MS[0,$a]}; d1=${MS[1,$a]}
  if [ -z "$d0" ] || [ -z "$d1" ]; then
    [ "$a" -eq 1 ] && break  # a configuration that fails once fails again: keep the device time
    continue
  fi
  done_alt=$((done_alt + 1))
  ratios+=("$(python3 -c "import sys; print(float(sys.argv[2]) / float(sys.argv[1]))" "$d0" "$d1")")
  BENCH_COMMAND="$CMD" rows --source "$O/ll4_${DT}_mtp1_a$a.log" value \
    --metric "ll4_${DT}_gbs1 --mtp-num-layers 1 ms/iter (iters 3-$ITERS, alternation $a)" --value "$d1" --unit ms \
    --peer "no MTP (same call)" --peer-value "$d0"
done
if [ "$done_alt" -eq 0 ]; then echo "FAIL mtp overhead: no alternation with both runs ($fails failed runs)"; exit 1; fi
med=$(python3 -c "import statistics, sys; print(statistics.median(map(float, sys.argv[1:])))" "${ratios[@]}")
spread=$(python3 -c "import sys; r = list(map(float, sys.argv[1:])); print(f'{min(r):.3f}-{max(r):.3f}')" "${ratios[@]}")
note="median of $done_alt alternations (ABBA order), per-alternation ratios $spread"
BENCH_COMMAND="$CMD" rows --source "$O" --note "$note" value \
  --metric "ll4_${DT}_gbs1 --mtp-num-layers 1 step time / no MTP (iters 3-$ITERS)" --value "$(printf %.4f "$med")" --unit x
BENCH_COMMAND="$CMD" rows --source "$O" --note "$note" value \
  --metric "ll4_${DT}_gbs1 --mtp-num-layers 1 step-time overhead vs no MTP (iters 3-$ITERS)" \
  --value "$(python3 -c "import sys; print(round((float(sys.argv[1]) - 1) * 100, 2))" "$med")" --unit %
echo "rows appended to $RESULTS:"
tail -n +"$((START_ROWS + 1))" "$RESULTS"
python3 -c "import sys; m = float(sys.argv[1]); print(f'INFO mtp overhead --mtp-num-layers 1 vs none: {m:.3f} x step time ({(m - 1) * 100:.1f} %), {sys.argv[2]}')" "$med" "$note"
echo "total $((SECONDS - t0)) s"
[ "$fails" -eq 0 ]
