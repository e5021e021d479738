#!/usr/bin/env bash
# Real Megatron-LM torch_dist checkpoints (tests/reference/torch_dist/megatron_{gpt,llama}_tp1,
# written by Megatron-LM itself: see the README there) load into pretrain_gpt and continue:
#  1. every tensor of our model and optimizer is found under Megatron's keys (the load fails
#     naming the key otherwise), the common state comes from Megatron's "common_state" object;
#  2. the lm loss of iteration 6 (a fresh batch, the weights after Megatron's 5 updates) is finite,
#     within 0.25 of Megatron's printed iteration-5 loss and at least 0.3 below its iteration-1
#     loss. Why: Megatron's own loss falls at every one of its iterations 1..5, by at most 0.204
#     per iteration; a model with a tensor mis-mapped (or an untrained one) sits near ln(127) =
#     4.84, i.e. at Megatron's iteration-1 loss (4.87 / 4.89), outside the bound. The exact
#     comparison with Megatron's own continuation runs on the GPU machine
#     (tests/gpu/torch_dist_oracle.sh);
#  3. continuing in TP2, PP2 and DP2 + distributed optimizer (mpirun, CPU) prints the lm loss of
#     TP1 for iterations 6..10 within 1e-5 relative (fp32; the layouts differ in reduction order
#     only): the chunks are assembled the same way whatever the layout;
#  4. our torch_dist save after such a load holds exactly Megatron's tensors (key, dtype, shape)
#     and objects (tests/reference/torch_dist/dcp_stdlib.py keys), RNG / rerun state aside;
#  5. a .distcp cut inside the common_state object: one error line naming it, exit status 1.
# Args: bin dir, source dir.
set -euo pipefail
BIN=$1
SRC=$2
REF=$SRC/tests/reference/torch_dist
PY="python3 $REF/dcp_stdlib.py"
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
# The oracle's flags (tests/gpu/torch_dist_oracle.sh COMMON), which made the fixtures; the
# fixtures were saved by a 5-iteration run, so the schedule is the checkpoint's.
# shellcheck source=tests/functional_tests/support/torch_dist_oracle_flags.sh
source "$SRC/tests/functional_tests/support/torch_dist_oracle_flags.sh"
COMMON=("${TD_MODEL[@]}" --ckpt-format torch_dist --data-cache-path "$OUT/cache"
        --train-iters 10 --use-checkpoint-opt_param-scheduler)
LLAMA=("${TD_LLAMA[@]}")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMP_NUM_THREADS=1
MPI=(mpirun --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS -np 2)
fail() { for f in "$OUT"/*.log; do echo "== $f"; grep -m3 -i error "$f" || tail -3 "$f"; done; echo "FAIL: $*"; exit 1; }
losses() { grep -oE ' iteration +[0-9]+/ +[0-9]+ .*lm loss: [0-9.E+-]+' "$1" | sed -E 's/ iteration +([0-9]+)\/.*lm loss: /\1 /'; }

for model in gpt llama; do
  fx=$REF/megatron_${model}_tp1
  arch=(); [[ $model == llama ]] && arch=("${LLAMA[@]}")
  "$BIN/pretrain_gpt" "${COMMON[@]}" "${arch[@]}" --load "$fx" --save "$OUT/$model-save" --save-interval 6 \
    --exit-interval 6 > "$OUT/$model-tp1.log" 2>&1 || fail "$model: loading Megatron's checkpoint (TP1)"
  "$BIN/pretrain_gpt" "${COMMON[@]}" "${arch[@]}" --load "$fx" > "$OUT/$model-tp1-10.log" 2>&1 ||
    fail "$model: continuing to iteration 10 (TP1)"
  python3 - "$fx/megatron_iterations_1_5.log" "$OUT/$model-tp1-10.log" "$model" <<'PY' || fail "$model: iteration-6 loss"
import math, re, sys
def losses(p):
    return {int(m.group(1)): float(m.group(2)) for m in
            (re.search(r' iteration +(\d+)/ *\d+ .*lm loss: ([0-9.E+-]+)', l) for l in open(p)) if m}
meg, ours = losses(sys.argv[1]), losses(sys.argv[2])
assert sorted(meg) == [1, 2, 3, 4, 5] and sorted(ours) == [6, 7, 8, 9, 10], (sorted(meg), sorted(ours))
l6 = ours[6]
ok = math.isfinite(l6) and abs(l6 - meg[5]) <= 0.25 and l6 <= meg[1] - 0.3
print(f'{sys.argv[3]}: Megatron iteration 1 {meg[1]:.6f}, 5 {meg[5]:.6f}; ours iteration 6 {l6:.6f}', 'ok' if ok else 'FAIL')
sys.exit(0 if ok else 1)
PY
  for lay in "--tensor-model-parallel-size 2" "--pipeline-model-parallel-size 2" "--use-distributed-optimizer"; do
    name=${lay// /}
    "${MPI[@]}" "$BIN/pretrain_gpt" "${COMMON[@]}" "${arch[@]}" $lay --distributed-backend nccl --load "$fx" \
      > "$OUT/$model$name.log" 2>&1 || fail "$model: continuing with $lay"
    python3 - "$OUT/$model-tp1-10.log" "$OUT/$model$name.log" "$model $lay" <<'PY' || fail "$model $lay differs from TP1"
import re, sys
def losses(p):
    return {int(m.group(1)): float(m.group(2)) for m in
            (re.search(r' iteration +(\d+)/ *\d+ .*lm loss: ([0-9.E+-]+)', l) for l in open(p)) if m}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert sorted(a) == sorted(b) == [6, 7, 8, 9, 10], (sorted(a), sorted(b))
worst = max(abs(a[i] - b[i]) / abs(a[i]) for i in a)
print(f'{sys.argv[3]}: iterations 6..10 within {worst:.1e} of TP1', 'ok' if worst <= 1e-5 else 'FAIL')
sys.exit(0 if worst <= 1e-5 else 1)
PY
  done
  $PY keys "$fx/iter_0000005" "$OUT/$model-save/iter_0000006" || fail "$model: our save's keys differ from Megatron's"
done
# Bad input: the common_state object cut short (the .distcp truncated inside it) is one error line
# naming the file and the object, exit status 1.
mkdir -p "$OUT/cut/iter_0000005"
cp "$REF/megatron_gpt_tp1/latest_checkpointed_iteration.txt" "$OUT/cut/"
cp "$REF/megatron_gpt_tp1/iter_0000005/.metadata" "$REF/megatron_gpt_tp1/iter_0000005/metadata.json" "$OUT/cut/iter_0000005/"
head -c 30000 "$REF/megatron_gpt_tp1/iter_0000005/__0_0.distcp" > "$OUT/cut/iter_0000005/__0_0.distcp"
set +e
"$BIN/pretrain_gpt" "${COMMON[@]}" --load "$OUT/cut" > "$OUT/cut.log" 2>&1
rc=$?
set -e
[[ $rc == 1 ]] || fail "truncated common_state: exit status $rc"
[[ $(grep -c '^error' "$OUT/cut.log") == 1 ]] && grep -q "__0_0.distcp (object 'common_state/shard_0_1').*truncated" "$OUT/cut.log" ||
  fail "truncated common_state: $(grep -m1 error "$OUT/cut.log")"
echo "PASS: Megatron-LM's torch_dist checkpoints load and continue"
