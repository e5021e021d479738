#!/usr/bin/env bash
# Full disks for real: a small tmpfs (`mount -t tmpfs -o size=...`, needs root or CAP_SYS_ADMIN;
# otherwise the test exits 77 and ctest reports it skipped). preprocess_data whose .bin does not
# fit (ENOSPC) leaves nothing; pretrain_gpt --save whose second checkpoint does not fit fails with
# exit 1, leaves no temporary directory/file, and the first checkpoint and its tracker still load.
# The same writers under simulated failures, on any machine: full_disk_preload.sh.
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/full_disk.inc"
export MEGATRON_DEVICE=cpu OMP_NUM_THREADS=1
T=$(mktemp -d /tmp/megatron_full_disk_tmpfs.XXXXXX)
M="$T/mnt"
mkdir -p "$M"
cleanup() { mountpoint -q "$M" && umount "$M"; rm -rf "$T"; }
trap cleanup EXIT
if ! mount -t tmpfs -o size=2560k tmpfs "$M" 2> "$T/mount.err"; then
  echo "SKIP: cannot mount a tmpfs here ($(cat "$T/mount.err")); full_disk_preload.sh covers the writers without a mount"
  exit 77
fi
n=0
corpus "$T/c.jsonl" 8000   # 1.6M tokens: 3.2 MB of uint16, more than the 2.5 MiB tmpfs
"$BIN/preprocess_data" --input "$T/c.jsonl" --output-prefix "$M/a" --tokenizer-type NullTokenizer \
  --vocab-size 1000 --workers 1 > "$T/pp.log" 2>&1; rc=$?
expect_user_error $rc "$T/pp.log" "preprocess_data on a full tmpfs" "No space left on device"
[[ -z "$(ls -A "$M")" ]] || fail "preprocess_data left $(ls -A "$M")"
n=$((n + 1))

# ~1.7 MB per checkpoint (weights + Adam state): the first fits, the second does not.
"$BIN/pretrain_gpt" "${GPT[@]}" --exit-interval 2 --save "$M/ck" --save-interval 2 > "$T/s0.log" 2>&1 || { tail "$T/s0.log"; fail "first save"; }
"$BIN/pretrain_gpt" "${GPT[@]}" --load "$M/ck" --save "$M/ck" --save-interval 2 > "$T/s1.log" 2>&1; rc=$?
expect_user_error $rc "$T/s1.log" "second save on a full tmpfs" "No space left on device"
no_temps "$M" "second save on a full tmpfs"
[[ $(cat "$M/ck/latest_checkpointed_iteration.txt") == 2 && ! -e "$M/ck/iter_0000004" ]] || fail "second save changed the tracker or left iter_0000004"
"$BIN/pretrain_gpt" "${GPT[@]}" --load "$M/ck" > "$T/r.log" 2>&1 || { tail "$T/r.log"; fail "resume after the failed save"; }
grep -q "successfully loaded checkpoint from .* at iteration 2" "$T/r.log" || fail "iteration 2 not loadable after the failed save"
n=$((n + 1))
echo "full_disk_tmpfs: $n passed, 0 failed"
