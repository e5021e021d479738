#!/usr/bin/env bash
# Full activation recomputation with MoE layers (--recompute-granularity full with --num-experts):
# the tiny MoE GPT of moe_common.inc with 4 layers, dense / MoE / dense / MoE, dropout 0.1, input
# jitter, sigmoid routing with the expert bias, aux loss + z-loss, 4 micro-batches per step, 4
# iterations, trained with and without recomputation. On the CPU in fp32 the iteration lines (lm
# loss, load_balancing_loss, z_loss, grad norm), the validation losses and the trained parameters
# (MEGATRON_DUMP_PARAMS) must be BITWISE equal: the recomputed forward replays the same kernels on
# the same inputs with the same dropout and jitter streams, and (as Megatron's CheckpointFunction,
# whose first forward runs under torch.no_grad()) the router records the aux losses and counts the
# expert-bias tokens once, in the replay. A double count doubles the printed load_balancing_loss /
# z_loss (checked by breaking it once; doubled token counts leave the expert-bias update sign(mean -
# count) unchanged, so the lm loss would not show it). Legs: uniform 1, uniform 3 (a 3-layer chunk +
# a 1-layer chunk), block 2, without jitter, and PP2 (one dense + one MoE layer per stage) under
# mpirun; selective recomputation of the MoE layers (--recompute-granularity selective
# --recompute-modules moe, and the deprecated --moe-layer-recompute, Megatron's moe_layer_recompute)
# the same way, and its finer modules with --moe-grouped-gemm: moe_act (the experts' activation
# re-applied to the kept fc1 output) with shared_experts (the shared expert re-run from its input).
# Megatron's refusals of moe_act / shared_experts combinations: one line each.
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/dist_common.inc"
source "$SRC/tests/functional_tests/moe_common.inc"  # MOE_ARGS
ARGS=("${MOE_ARGS[@]}" --num-layers 4 --moe-layer-freq '([0]+[1])*2' --train-iters 4 --eval-interval 2
  --attention-dropout 0.1 --hidden-dropout 0.1 --moe-router-score-function sigmoid --moe-router-enable-expert-bias)
JITTER=(--moe-input-jitter-eps 0.1)
UNIFORM1=(--recompute-granularity full --recompute-method uniform --recompute-num-layers 1)
source "$SRC/tests/functional_tests/recompute_common.inc"  # run, values, same

run ref env -- "${JITTER[@]}"
grep -qE '\| load_balancing_loss: [0-9.E+-]+ \| z_loss: [0-9.E+-]+ \|' "$LOGDIR/ref.log" \
  || fail "ref: no load_balancing_loss / z_loss in the iteration lines"
run uniform1 env -- "${JITTER[@]}" "${UNIFORM1[@]}"
grep -q 'recompute_granularity \.* full' "$LOGDIR/uniform1.log" || fail "uniform1: arguments table lacks recompute_granularity full"
same ref uniform1
run uniform3 env -- "${JITTER[@]}" --recompute-granularity full --recompute-method uniform --recompute-num-layers 3
same ref uniform3
run block2 env -- "${JITTER[@]}" --recompute-granularity full --recompute-method block --recompute-num-layers 2
same ref block2
run selective_moe env -- "${JITTER[@]}" --recompute-granularity selective --recompute-modules moe
same ref selective_moe
run moe_layer_recompute env -- "${JITTER[@]}" --moe-layer-recompute
grep -q 'WARNING: --moe-layer-recompute is deprecated' "$LOGDIR/moe_layer_recompute.log" \
  || fail "moe_layer_recompute: no deprecation warning"
same ref moe_layer_recompute
run grouped_ref env -- "${JITTER[@]}" --moe-grouped-gemm
run selective_moe_act_shared env -- "${JITTER[@]}" --moe-grouped-gemm --recompute-granularity selective \
  --recompute-modules moe_act shared_experts
grep -q "recompute_modules \.* \['moe_act', 'shared_experts'\]" "$LOGDIR/selective_moe_act_shared.log" \
  || fail "selective_moe_act_shared: arguments table lacks recompute_modules"
same grouped_ref selective_moe_act_shared
SEL=(--recompute-granularity selective --recompute-modules)
bad 'moe_act in recompute_modules is only supported with moe_grouped_gemm' "${SEL[@]}" moe_act
bad 'shared_experts recompute cannot work with --moe-shared-expert-overlap' "${SEL[@]}" shared_experts \
  --moe-shared-expert-overlap --moe-token-dispatcher-type alltoall
bad 'Delayed scaling does not support moe_act and layernorm recompute for fp8' "${SEL[@]}" moe_act \
  --moe-grouped-gemm --fp8-format hybrid --fp8-recipe delayed
bad 'recompute-modules moe_act with --fp8-format is not implemented' "${SEL[@]}" moe_act --moe-grouped-gemm \
  --fp8-format hybrid --fp8-recipe tensorwise
echo "PASS argument checks"
run nojitter_ref env --
run nojitter_uniform1 env -- "${UNIFORM1[@]}"
same nojitter_ref nojitter_uniform1
# The jitter draws reach the routing (else the jitter legs would test nothing the others do not).
if diff -q <(values ref) <(values nojitter_ref) >/dev/null; then fail "--moe-input-jitter-eps changed nothing"; fi

PP=(--pipeline-model-parallel-size 2)
run pp2 "${MPIRUN[@]}" -np 2 -- "${JITTER[@]}" "${PP[@]}"
run pp2_uniform1 "${MPIRUN[@]}" -np 2 -- "${JITTER[@]}" "${PP[@]}" "${UNIFORM1[@]}"
same pp2 pp2_uniform1
echo "PASS all"
