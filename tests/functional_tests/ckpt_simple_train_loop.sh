#!/usr/bin/env bash
# examples/run_simple_mcore_train_loop under mpirun -np 2 (TP2 on CPU): 5 iterations with finite,
# decreasing-on-average losses printed in Megatron's format, a distributed checkpoint in ./ckpt,
# and "Successfully loaded the model". Skips when mpirun is absent.
# Args: <bin dir> <source dir>
set -euo pipefail
BIN=$(cd "$1" && pwd)
command -v mpirun >/dev/null || { echo "SKIP: no mpirun"; exit 77; }
DIR=$(mktemp -d /tmp/simple_loop.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
cd "$DIR"
# --device cpu: on a CUDA build with a GPU the default (auto) would train on the GPU.
mpirun -np 2 --oversubscribe --allow-run-as-root "$BIN/run_simple_mcore_train_loop" --device cpu > out.log 2>&1 || { cat out.log; exit 1; }
cat out.log
[ "$(grep -c "^Iteration [0-4]: Losses reduced:  \[{'lm loss': tensor([0-9.]*)}\]$" out.log)" = 5 ] || { echo "FAIL: iteration lines"; exit 1; }
grep -q "^Successfully loaded the model$" out.log
[ -f ckpt/metadata.json ] && [ -f ckpt/__0_0.safetensors ] && [ -f ckpt/__1_0.safetensors ]
first=$(sed -n "s/^Iteration 0: .*tensor(\([0-9.]*\)).*/\1/p" out.log)
last=$(sed -n "s/^Iteration 4: .*tensor(\([0-9.]*\)).*/\1/p" out.log)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || { echo "FAIL: loss did not go down ($first -> $last)"; exit 1; }
# A bad --device value is a one-line error naming the flag, exit status 1.
rc=0; "$BIN/run_simple_mcore_train_loop" --device tpu > bad.log 2>&1 || rc=$?
[ "$rc" = 1 ] && grep -q "^error: --device tpu: unknown device (use auto, cpu or cuda)$" bad.log || { cat bad.log; echo "FAIL: --device tpu"; exit 1; }
echo "ckpt_simple_train_loop: 2 passed, 0 failed"
