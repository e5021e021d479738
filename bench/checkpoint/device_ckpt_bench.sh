#!/usr/bin/env bash
# Checkpoint save/load throughput beside the disk's raw speed, on one machine, in < 60 s.
#
#   bench/checkpoint/device_ckpt_bench.sh OUTDIR [BIN_DIR]
#
# BIN_DIR holds checkpoint_bench (default: build/bin next to this script's repository). The data
# goes to $CKPT_BENCH_DIR (default: ./.ckpt_bench_tmp in the current directory — choose the disk
# checkpoints would go to) and is removed at the end. Size: 8 GiB, or less when a 1 GiB O_DIRECT
# probe says 8 GiB would not fit the time budget (each full-size write is kept to ≈ 4 s; our
# save/load run first, then the dd runs), or when
# the filesystem lacks space. Writes OUTDIR/summary.txt (one line per figure, plus the ratios to the
# raw dd figures) and the raw logs. The page cache is not dropped (needs root); the dd reads use
# O_DIRECT, and our first load after an O_DIRECT save finds nothing cached by the save itself.
set -u
OUT=${1:?usage: device_ckpt_bench.sh OUTDIR [BIN_DIR]}
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${2:-$HERE/../../build/bin}
DIR=${CKPT_BENCH_DIR:-$PWD/.ckpt_bench_tmp}
mkdir -p "$OUT" "$DIR"
S=$OUT/summary.txt
: > "$S"
log() { echo "$*" | tee -a "$S"; }
T0=$(date +%s)
trap 'rm -rf "$DIR"' EXIT

log "date $(date -u +%FT%TZ) host $(hostname) kernel $(uname -r)"
log "cpu $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') x $(nproc); mem $(free -g | awk '/Mem:/{print $2}') GiB"
log "dir $DIR: $(df -hT "$DIR" | tail -1 | awk '{print $1, $2, "size", $3, "avail", $5}')"
[ -x "$BIN/checkpoint_bench" ] || { log "FAIL: no $BIN/checkpoint_bench"; exit 1; }
( cd "$HERE/../.." && git rev-parse --short HEAD 2>/dev/null | sed 's/^/commit /' ) | tee -a "$S"

# (each dd is cut by SIGINT after 7 s (writes) / 5 s (read); dd then reports what it did)
# dd prints "... copied, 1.234 s, 1.5 GB/s": bytes/seconds -> MB/s (1e6) ourselves, for all units.
ddrate() { awk '/copied/{for(i=1;i<=NF;i++) if($i=="s,"||$i~/^s,$/){print int($1/$(i-1)/1e6); exit}}'; }
dd_w() {  # name bs count flags...
  local name=$1 bs=$2 cnt=$3; shift 3
  timeout -s INT 7 dd if=/dev/zero of="$DIR/dd$name.bin" bs=$bs count=$cnt "$@" 2> "$OUT/dd_$name.log"
  mv -f "$DIR/dd$name.bin" "$DIR/dd.bin"
  ddrate < "$OUT/dd_$name.log"
}

# 1 GiB O_DIRECT probe picks the size.
probe=$(dd_w probe 64M 16 oflag=direct conv=fdatasync); probe=${probe:-100}
avail_mb=$(df -Pm "$DIR" | tail -1 | awk '{print $4}')
size_mb=$(( probe * 4 ))                     # ≈ 4 s per full-size write at the probe's rate
[ $size_mb -gt 8192 ] && size_mb=8192
[ $size_mb -gt $(( avail_mb / 3 )) ] && size_mb=$(( avail_mb / 3 ))
size_mb=$(( size_mb / 64 * 64 )); [ $size_mb -lt 512 ] && size_mb=512
cnt=$(( size_mb / 64 ))
log "probe: 1 GiB dd oflag=direct bs=64M: $probe MB/s -> size $size_mb MiB"

left=$(( 34 - ($(date +%s) - T0) ))
log "checkpoint_bench bench --size-mb $size_mb --repeat 1 (time left $left s)"
timeout $left "$BIN/checkpoint_bench" bench --dir "$DIR/ck" --size-mb $size_mb --repeat 1 > "$OUT/checkpoint_bench.log" 2>&1
rc=$?
grep RESULT "$OUT/checkpoint_bench.log" | tee -a "$S"
[ $rc -eq 0 ] || log "FAIL: checkpoint_bench rc=$rc (124 = cut by the time budget; see checkpoint_bench.log)"
W_BUF=$(dd_w buffered_64M 64M $cnt conv=fdatasync); rm -f "$DIR/dd.bin"
W_DIR=$(dd_w direct_64M 64M $cnt oflag=direct conv=fdatasync)
timeout -s INT 5 dd if="$DIR/dd.bin" of=/dev/null bs=64M iflag=direct 2> "$OUT/dd_read_direct_64M.log"
R_DIR=$(ddrate < "$OUT/dd_read_direct_64M.log"); rm -f "$DIR/dd.bin"
# Two O_DIRECT streams at once (our writer keeps 2 writes in flight; one dd keeps 1).
( dd_w par1 64M $(( cnt / 2 )) oflag=direct conv=fdatasync > "$OUT/par1.rate" ) &
( dd_w par2 64M $(( cnt / 2 )) oflag=direct conv=fdatasync > "$OUT/par2.rate" ) &
wait
W_PAR=$(( $(cat "$OUT/par1.rate" 2>/dev/null || echo 0) + $(cat "$OUT/par2.rate" 2>/dev/null || echo 0) ))
rm -f "$DIR"/dd*.bin
log "dd write buffered+fdatasync bs=64M: $W_BUF MB/s"
log "dd write oflag=direct+fdatasync bs=64M: $W_DIR MB/s"
log "dd read iflag=direct bs=64M: $R_DIR MB/s"
log "dd write oflag=direct bs=64M, 2 streams at once (sum): $W_PAR MB/s"

save=$(awk '/save_GBps/{print $5*1000}' "$OUT/checkpoint_bench.log")
cold=$(awk '/load_cold_GBps/{print $5*1000}' "$OUT/checkpoint_bench.log")
if [ -n "$save" ] && [ -n "$W_DIR" ]; then
  log "save $save MB/s = $(awk -v a=$save -v b=$W_DIR 'BEGIN{printf "%.0f", 100*a/b}')% of dd oflag=direct, $(awk -v a=$save -v b=$W_BUF 'BEGIN{printf "%.0f", 100*a/b}')% of dd buffered, $(awk -v a=$save -v b=$W_PAR 'BEGIN{printf "%.0f", 100*a/b}')% of 2-stream dd oflag=direct (goal >= 70%)"
fi
if [ -n "$cold" ] && [ -n "$R_DIR" ]; then
  log "load (first after save) $cold MB/s = $(awk -v a=$cold -v b=$R_DIR 'BEGIN{printf "%.0f", 100*a/b}')% of dd iflag=direct"
fi
log "total $(( $(date +%s) - T0 )) s"
