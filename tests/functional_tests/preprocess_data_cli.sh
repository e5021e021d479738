#!/usr/bin/env bash
# preprocess_data end to end: Appendix A golden bytes through the CLI, Megatron's stdout lines,
# unknown-flag suggestion, a bad line stopping at file:line, and an interrupted run leaving no
# .bin/.idx pair. Args: <bin dir> <source dir>.
set -euo pipefail
BIN=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# The golden vectors (docs/megatron-reference.md#golden-vectors): 10 docs, vocab 1000, --append-eod
for i in $(seq 0 9); do
  n=$(( i % 4 + 3 )); ids=""
  for j in $(seq 1 $n); do ids="$ids${ids:+ }$(( 10 * i + j ))"; done
  echo "{\"text\": \"$ids\"}"
done > "$T/golden.jsonl"
"$BIN/preprocess_data" --input "$T/golden.jsonl" --output-prefix "$T/g" --tokenizer-type NullTokenizer \
  --vocab-size 1000 --append-eod --workers 2 > "$T/out.txt" 2> "$T/err.txt" || { cat "$T/err.txt"; fail "golden run"; }
[ "$(md5sum < "$T/g_text_document.bin" | cut -d' ' -f1)" = 89a5cacce6396cc0bd067b7ae4febd06 ] || fail ".bin MD5"
[ "$(xxd -p "$T/g_text_document.idx" | tr -d '\n' | md5sum | cut -d' ' -f1)" = \
  "$(printf %s 4d4d494449445800000100000000000000080a000000000000000b00000000000000040000000500000006000000070000000400000005000000060000000700000004000000050000000000000000000000080000000000000012000000000000001e000000000000002c0000000000000034000000000000003e000000000000004a000000000000005800000000000000600000000000000000000000000000000100000000000000020000000000000003000000000000000400000000000000050000000000000006000000000000000700000000000000080000000000000009000000000000000a00000000000000 | md5sum | cut -d' ' -f1)" ] || fail ".idx bytes"
grep -qx "Processing data with 2 workers." "$T/out.txt" || fail "Processing line"
grep -qx "Opening $T/golden.jsonl" "$T/out.txt" || fail "Opening line"
grep -q "^Time to startup: [0-9.e-]*$" "$T/out.txt" || fail "startup line"
grep -q "^Done: 10 documents, 53 tokens" "$T/out.txt" || fail "summary line"

# --find-optimal-num-workers: one short run per candidate (5 is not divisible by --partitions 2
# and is removed, as Megatron does), then the table
"$BIN/preprocess_data" --input "$T/golden.jsonl" --output-prefix "$T/f" --tokenizer-type NullTokenizer \
  --vocab-size 1000 --workers 1 --partitions 2 --find-optimal-num-workers --workers-to-check 2 5 4 \
  --max-documents 6 > "$T/out.txt" 2> "$T/err.txt" || { cat "$T/err.txt"; fail "find-optimal run"; }
grep -q "Removing num_workers (5) from workers list" "$T/out.txt" || fail "removal line"
grep -q "^The most optimal num of workers is [24] with avg. preprocessed docs/s: " "$T/out.txt" || fail "optimal line"
[ "$(grep -c '^Done: 6 documents' "$T/out.txt")" = 2 ] || fail "--max-documents"

# unknown flag -> closest known flag
if "$BIN/preprocess_data" --input x --output-prefix y --workers 1 --tokenizer-type NullTokenizer --vocab-sise 5 \
  2> "$T/err.txt"; then fail "unknown flag accepted"; fi
grep -q "unknown flag --vocab-sise; did you mean --vocab-size?" "$T/err.txt" || { cat "$T/err.txt"; fail "suggestion"; }

# --json-keys given twice: the last list wins (argparse), one key, one output
"$BIN/preprocess_data" --input "$T/golden.jsonl" --output-prefix "$T/j" --tokenizer-type NullTokenizer \
  --vocab-size 1000 --workers 1 --json-keys text --json-keys text > /dev/null 2> "$T/err.txt" \
  || { cat "$T/err.txt"; fail "--json-keys text --json-keys text"; }
[ -e "$T/j_text_document.idx" ] || fail "--json-keys repeated: no output"
# the same key twice in one list is refused with one line naming --json-keys
if "$BIN/preprocess_data" --input "$T/golden.jsonl" --output-prefix "$T/jj" --tokenizer-type NullTokenizer \
  --vocab-size 1000 --workers 1 --json-keys text text > /dev/null 2> "$T/err.txt"; then fail "duplicate key accepted"; fi
grep -q "argument --json-keys: key 'text' is given twice" "$T/err.txt" || { cat "$T/err.txt"; fail "duplicate key line"; }

# a bad line stops with file:line and leaves no output
printf '{"text": "1 2"}\n{"text": "3"\n' > "$T/bad.jsonl"
if "$BIN/preprocess_data" --input "$T/bad.jsonl" --output-prefix "$T/b" --tokenizer-type NullTokenizer \
  --vocab-size 1000 --workers 1 > /dev/null 2> "$T/err.txt"; then fail "bad line accepted"; fi
grep -q "bad.jsonl:2: invalid JSON" "$T/err.txt" || { cat "$T/err.txt"; fail "file:line"; }
ls "$T"/b_text_document.* 2>/dev/null && fail "output left after a failed run"

# an interrupted run (SIGKILL) never leaves a .bin/.idx pair
seq 1 2000000 | awk '{print "{\"text\": \"" ($1 % 900) " 2 3 4 5 6 7 8 9 10 11 12\"}"}' > "$T/big.jsonl"
timeout -s KILL 0.3 "$BIN/preprocess_data" --input "$T/big.jsonl" --output-prefix "$T/k" --tokenizer-type NullTokenizer \
  --vocab-size 1000 --workers 2 > /dev/null 2>&1 || true
if [ -e "$T/k_text_document.idx" ]; then
  echo "note: the run finished before the kill; nothing to check"
else
  [ -e "$T/k_text_document.bin" ] && fail "a .bin without .idx under the final name"
fi

# SIGINT: stops, removes its temporary files, exits non-zero
# The signal is sent once the run has created its (temporary) output, i.e. after start-up: a
# fixed delay raced with start-up on a loaded machine (SIGINT before the handler existed).
"$BIN/preprocess_data" --input "$T/big.jsonl" --output-prefix "$T/i" --tokenizer-type NullTokenizer \
  --vocab-size 1000 --workers 2 > /dev/null 2> "$T/err.txt" &
pid=$!
for _ in $(seq 1 200); do
  compgen -G "$T/i_text_document*" > /dev/null && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.05
done
kill -INT "$pid" 2>/dev/null || true
wait "$pid" && rc=0 || rc=$?
if [ -e "$T/i_text_document.idx" ]; then
  echo "note: the run finished before SIGINT; nothing to check"
else
  [ "$rc" != 0 ] || fail "interrupted run exited 0"
  grep -q "interrupted" "$T/err.txt" || { cat "$T/err.txt"; fail "interrupted message"; }
  ls "$T"/i_text_document* 2>/dev/null && fail "files left after SIGINT"
fi
echo "preprocess_data_cli: ok"
