#!/usr/bin/env bash
# TensorBoard event files written by our SummaryWriter, read by the Python protobuf runtime
# (tests/reference/tensorboard/read_events.py). Skips when python3-protobuf or protoc is absent.
# Args: <bin dir> <source dir>
set -euo pipefail
BIN=$1; SRC=$2
PY=/usr/bin/python3
if ! command -v protoc >/dev/null || ! $PY -c 'import google.protobuf' 2>/dev/null; then
  echo "SKIP: python3-protobuf or protoc not installed"; exit 77
fi
DIR=$(mktemp -d /tmp/tb_reader.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
MEGATRON_TB_KEEP_DIR="$DIR/tb" "$BIN/unit_tests" --gtest_filter='TensorBoard.WritesScalarsTensorBoardCanRead' > "$DIR/log" 2>&1 || { cat "$DIR/log"; exit 1; }
f=$(ls "$DIR"/tb/events.out.tfevents.*)
# values written by the unit test: lm loss 10.5 @1, learning-rate 3e-4 @1 (float32), lm loss 9.25 @2
$PY "$SRC/tests/reference/tensorboard/read_events.py" "$f" --expect-scalars 'lm loss@1=10.5;learning-rate@1=0.0003;lm loss@2=9.25'
echo "tb_python_reader: 1 passed, 0 failed"
