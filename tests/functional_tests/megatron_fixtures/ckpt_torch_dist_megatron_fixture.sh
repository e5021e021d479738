#!/usr/bin/env bash
# A real Megatron-LM torch_dist checkpoint of tests/gpu/torch_dist_oracle.sh legs (e) / (f)
# (bf16, bf16 + distributed optimizer, MoE; written there with TD_FIXTURES=DIR and committed as
# tests/reference/torch_dist/<FIXTURE>, README there) loads into pretrain_gpt on the CPU:
#  1. exactly: loaded and saved again at iteration 5 without a step, every tensor of Megatron's
#     checkpoint is in our save with the same bytes (bf16 weights, fp32 main params, both Adam
#     moments; tests/reference/torch_dist/dcp_stdlib.py values), and our save holds exactly
#     Megatron's keys, dtypes, shapes and objects (dcp_stdlib.py keys);
#  2. continuing to iteration 10 prints the losses Megatron-LM printed continuing the same
#     checkpoint (megatron_iterations_6_10.log, on an H200): the tolerances of
#     tests/gpu/torch_dist_oracle_report.py (fp32: 1e-5 relative at iteration 6, 1e-4 after; bf16:
#     2e-3 / 1e-2, derived there), load_balancing_loss included for MoE; MoE also continues with
#     --expert-model-parallel-size 2 (2 ranks, mpirun) against the same log.
#  megatron_gpt_bf16_distopt_tp1 has check 1 only: Megatron-LM could not continue its own
#  distributed-optimizer checkpoint when it was written (no Transformer Engine / Apex: its
#  DistributedOptimizer.state_dict() asserts on the empty optimizer state at load time; the oracle
#  now runs Megatron through tests/gpu/megatron_samples.py's shim for that), so that fixture has
#  no megatron_iterations_6_10.log (tests/reference/torch_dist/README.md).
# Registered by tests/CMakeLists.txt only for the fixtures that exist. Args: bin dir, source dir,
# fixture name.
set -euo pipefail
BIN=$1
SRC=$2
NAME=$3
REF=$SRC/tests/reference/torch_dist
FX=$REF/$NAME
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
# tests/gpu/torch_dist_oracle.sh's COMMON flags (the fixtures were saved by its --train-iters 10
# --exit-interval 5 runs) and the group flags of legs (e) / (f).
# shellcheck source=tests/functional_tests/support/torch_dist_oracle_flags.sh
source "$SRC/tests/functional_tests/support/torch_dist_oracle_flags.sh"
COMMON=("${TD_MODEL[@]}" --ckpt-format torch_dist --data-cache-path "$OUT/cache"
        --train-iters 10 --use-checkpoint-opt_param-scheduler)
case $NAME in
  megatron_gpt_bf16_tp1) FLAGS=("${TD_BF16[@]}"); KIND="cmpbf16" ;;
  megatron_gpt_bf16_distopt_tp1) FLAGS=("${TD_BF16[@]}" --use-distributed-optimizer); KIND="cmpbf16" ;;
  megatron_gpt_moe_tp1) FLAGS=("${TD_MOE[@]}"); KIND="cmp" ;;
  *) echo "error: unknown fixture '$NAME' (megatron_gpt_bf16_tp1, megatron_gpt_bf16_distopt_tp1, megatron_gpt_moe_tp1)"; exit 2 ;;
esac
CONTINUE=1
[[ $NAME == megatron_gpt_bf16_distopt_tp1 && ! -f $FX/megatron_iterations_6_10.log ]] && CONTINUE=0
[[ -f $FX/iter_0000005/.metadata && ( $CONTINUE == 0 || -s $FX/megatron_iterations_6_10.log ) ]] ||
  { echo "error: $FX is incomplete (needs iter_0000005/.metadata and a non-empty megatron_iterations_6_10.log)"; exit 1; }
export OMP_NUM_THREADS=1 MEGATRON_DEVICE=cpu
fail() { for f in "$OUT"/*.log; do echo "== $f"; grep -m3 -i error "$f" || tail -3 "$f"; done; echo "FAIL: $*"; exit 1; }

"$BIN/pretrain_gpt" "${COMMON[@]}" "${FLAGS[@]}" --load "$FX" --train-iters 5 --save-interval 3 --save "$OUT/resave" \
  > "$OUT/resave.log" 2>&1 || fail "$NAME: loading Megatron's checkpoint and saving it again"
python3 "$REF/dcp_stdlib.py" values "$FX/iter_0000005" "$OUT/resave/iter_0000005" || fail "$NAME: tensors differ after load + save"
python3 "$REF/dcp_stdlib.py" keys "$FX/iter_0000005" "$OUT/resave/iter_0000005" || fail "$NAME: our save's keys or objects differ from Megatron's"
if [[ $CONTINUE == 0 ]]; then
  echo "$NAME: exact load + save and keys / objects checked; no Megatron continuation to compare with (no megatron_iterations_6_10.log)"
  exit 0
fi

"$BIN/pretrain_gpt" "${COMMON[@]}" "${FLAGS[@]}" --load "$FX" > "$OUT/tp1.log" 2>&1 || fail "$NAME: continuing to iteration 10"
printf '%s\t%s\t%s\t%s\n' "$KIND" "$NAME: Megatron's continuation vs ours (TP1)" "$FX/megatron_iterations_6_10.log" "$OUT/tp1.log" > "$OUT/legs.tsv"
if [[ $NAME == megatron_gpt_moe_tp1 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
  mpirun --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS -x MEGATRON_DEVICE -np 2 \
    "$BIN/pretrain_gpt" "${COMMON[@]}" "${FLAGS[@]}" --expert-model-parallel-size 2 --distributed-backend nccl \
    --load "$FX" > "$OUT/ep2.log" 2>&1 || fail "$NAME: continuing with --expert-model-parallel-size 2"
  printf '%s\t%s\t%s\t%s\n' "$KIND" "$NAME: Megatron's continuation vs ours (EP2)" "$FX/megatron_iterations_6_10.log" "$OUT/ep2.log" >> "$OUT/legs.tsv"
fi
python3 "$SRC/tests/gpu/torch_dist_oracle_report.py" "$OUT/legs.tsv" || fail "$NAME: losses differ from Megatron's"
