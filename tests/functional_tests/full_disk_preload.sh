#!/usr/bin/env bash
# Full disks, simulated on any machine (no root): every writer of the tree fails cleanly. Two
# ways to fail a write: an LD_PRELOAD shim (support/fail_writes_preload.cpp) makes each write to
# files whose path contains a pattern fail with ENOSPC after the file was created (the reported
# case: a 0-byte latest_checkpointed_iteration.txt.tmp-PID), and `ulimit -f` makes any file grow
# past N KiB fail with EFBIG (SIGXFSZ ignored). Cases: preprocess_data (.bin/.idx, partitions),
# pretrain_gpt --save (rank file, common.json/.metadata/metadata.json, the tracker: the save
# fails with exit 1 and the old tracker/checkpoint stay loadable), the dataset index cache
# (--data-cache-path .npy/description), --profile trace, TensorBoard event file,
# convert_checkpoint --saver hf. Real ENOSPC on a small tmpfs: full_disk_tmpfs.sh.
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/full_disk.inc"
SHIM="$BIN/libfail_writes_preload.so"
[[ -f "$SHIM" ]] || fail "$SHIM not built (target fail_writes_preload)"
T=$(mktemp -d /tmp/megatron_full_disk.XXXXXX)
trap 'rm -rf "$T"' EXIT
export MEGATRON_DEVICE=cpu OMP_NUM_THREADS=1
fails_on() {  # PATTERN CMD...: CMD with writes to paths containing PATTERN failing (ENOSPC)
  local pat=$1; shift
  FAIL_WRITES_MATCHING="$pat" LD_PRELOAD="$SHIM" "$@"
}
efbig() {  # KIB CMD...: CMD with every file limited to KIB KiB (EFBIG)
  local kib=$1; shift
  ( trap '' XFSZ; ulimit -f "$kib"; exec "$@" )
}
n=0

# --- preprocess_data: the .bin (EFBIG), the .idx (ENOSPC), partitions ----------------------------
corpus "$T/c.jsonl" 400   # ~80k tokens: 160 KB of uint16
mkdir -p "$T/pp"
efbig 64 "$BIN/preprocess_data" --input "$T/c.jsonl" --output-prefix "$T/pp/a" --tokenizer-type NullTokenizer \
  --vocab-size 1000 --workers 1 > "$T/pp1.log" 2>&1; rc=$?
expect_user_error $rc "$T/pp1.log" "preprocess_data, .bin too large" "a_text_document.bin"
no_temps "$T/pp" "preprocess_data .bin"; [[ -z "$(ls "$T/pp")" ]] || fail "preprocess_data left $(ls "$T/pp")"
n=$((n + 1))
fails_on "_document.idx" "$BIN/preprocess_data" --input "$T/c.jsonl" --output-prefix "$T/pp/a" --tokenizer-type NullTokenizer \
  --vocab-size 1000 --workers 1 > "$T/pp2.log" 2>&1; rc=$?
expect_user_error $rc "$T/pp2.log" "preprocess_data, .idx write" "a_text_document.idx"
no_temps "$T/pp" "preprocess_data .idx"; [[ -z "$(ls "$T/pp")" ]] || fail "preprocess_data left $(ls "$T/pp")"
n=$((n + 1))
cp "$T/c.jsonl" "$T/c2.jsonl"
efbig 96 "$BIN/preprocess_data" --input "$T/c*.jsonl" --partitions 2 --output-prefix "$T/pp/b" --tokenizer-type NullTokenizer \
  --vocab-size 1000 --workers 2 > "$T/pp3.log" 2>&1; rc=$?
expect_user_error $rc "$T/pp3.log" "preprocess_data --partitions 2" "b_text_document"
no_temps "$T/pp" "preprocess_data --partitions 2"; [[ -z "$(ls "$T/pp")" ]] || fail "preprocess_data left $(ls "$T/pp")"
n=$((n + 1))

# --- merge_datasets: the merged .bin (EFBIG) -------------------------------------------------------
mkdir -p "$T/parts" "$T/merged"
for i in 1 2; do
  "$BIN/preprocess_data" --input "$T/c.jsonl" --output-prefix "$T/parts/p$i" --tokenizer-type NullTokenizer \
    --vocab-size 1000 --workers 1 > /dev/null 2>&1 || fail "preprocess for merge"
done
efbig 200 "$BIN/merge_datasets" --input "$T/parts" --output-prefix "$T/merged/m" > "$T/mg.log" 2>&1; rc=$?
expect_user_error $rc "$T/mg.log" "merge_datasets" "m.bin"
no_temps "$T/merged" "merge_datasets"; [[ -z "$(ls "$T/merged")" ]] || fail "merge_datasets left $(ls "$T/merged")"
n=$((n + 1))

# --- pretrain_gpt --save ------------------------------------------------------------------------------
# a good checkpoint at iteration 2 first: whatever fails later must leave it loadable
"$BIN/pretrain_gpt" "${GPT[@]}" --exit-interval 2 --save "$T/ck" --save-interval 2 > "$T/s0.log" 2>&1 || { tail "$T/s0.log"; fail "first save"; }
[[ $(cat "$T/ck/latest_checkpointed_iteration.txt") == 2 ]] || fail "tracker after the first save"
for pat in latest_checkpointed_iteration.txt common.json metadata.json __0_0.safetensors; do
  fails_on "$pat" "$BIN/pretrain_gpt" "${GPT[@]}" --load "$T/ck" --save "$T/ck" --save-interval 2 > "$T/s.log" 2>&1; rc=$?
  expect_user_error $rc "$T/s.log" "save with $pat failing" "$pat"
  no_temps "$T/ck" "save with $pat failing"
  [[ $(cat "$T/ck/latest_checkpointed_iteration.txt") == 2 ]] || fail "save with $pat failing: tracker changed"
  if [[ $pat == latest_checkpointed_iteration.txt ]]; then
    # the checkpoint itself is complete: the message says how to resume from it
    [[ -f "$T/ck/iter_0000004/metadata.json" ]] || fail "tracker failure: iteration 4 not complete"
    grep -q "checkpoint $T/ck/iter_0000004 is complete but the tracker could not be updated .*--ckpt-step 4" "$T/s.log" ||
      { tail -3 "$T/s.log"; fail "tracker failure: message does not say how to resume"; }
    "$BIN/pretrain_gpt" "${GPT[@]}" --load "$T/ck" --ckpt-step 4 > "$T/r.log" 2>&1 || { tail "$T/r.log"; fail "resume with --ckpt-step 4"; }
    grep -q "successfully loaded checkpoint from .* at iteration 4" "$T/r.log" || fail "--ckpt-step 4 did not load iteration 4"
    rm -rf "$T/ck/iter_0000004"
  else
    [[ ! -e "$T/ck/iter_0000004" ]] || fail "save with $pat failing: a partial iter_0000004 is visible"
  fi
  n=$((n + 1))
done
"$BIN/pretrain_gpt" "${GPT[@]}" --load "$T/ck" > "$T/r2.log" 2>&1 || { tail "$T/r2.log"; fail "resume after the failed saves"; }
grep -q "successfully loaded checkpoint from .* at iteration 2" "$T/r2.log" || fail "iteration 2 not loadable after the failed saves"
n=$((n + 1))

# --- the dataset index cache, --profile trace, TensorBoard -----------------------------------------
for pat in "-document_index.npy" "-description.txt"; do
  fails_on "$pat" "$BIN/pretrain_gpt" "${GPT[@]}" --data-cache-path "$T/cache" > "$T/c.log" 2>&1; rc=$?
  expect_user_error $rc "$T/c.log" "index cache with $pat failing" "$pat"
  no_temps "$T/cache" "index cache with $pat failing"
  n=$((n + 1))
done
fails_on "trace_rank0.json" "$BIN/pretrain_gpt" "${GPT[@]}" --profile --profile-step-start 1 --profile-step-end 2 \
  --tensorboard-dir "$T/tb" > "$T/p.log" 2>&1; rc=$?
expect_user_error $rc "$T/p.log" "--profile trace" "trace_rank0.json"
no_temps "$T/tb" "--profile trace"
n=$((n + 1))
fails_on "events.out.tfevents" "$BIN/pretrain_gpt" "${GPT[@]}" --tensorboard-dir "$T/tb2" > "$T/tb.log" 2>&1; rc=$?
expect_user_error $rc "$T/tb.log" "TensorBoard" "events.out.tfevents"
[[ -z "$(ls -A "$T/tb2" 2>/dev/null)" ]] || fail "TensorBoard left $(ls "$T/tb2")"
n=$((n + 1))

# --- convert_checkpoint --saver hf: model.safetensors, config.json --------------------------------
for pat in model.safetensors config.json; do
  fails_on "hf/$pat" "$BIN/convert_checkpoint" --loader mcore --saver hf --load-dir "$T/ck" --save-dir "$T/hf" > "$T/h.log" 2>&1; rc=$?
  expect_user_error $rc "$T/h.log" "convert_checkpoint with $pat failing" "$pat"
  no_temps "$T/hf" "convert_checkpoint with $pat failing"
  [[ -z "$(ls -A "$T/hf" 2>/dev/null)" ]] || fail "convert_checkpoint with $pat failing left $(ls "$T/hf")"
  n=$((n + 1))
done
echo "full_disk_preload: $n passed, 0 failed"
