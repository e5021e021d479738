#!/usr/bin/env bash
# Expert parallelism with context parallelism (docs/moe.md "Parallelism": Megatron's MoE parallel
# folding, the EP ranks taken from the dense CP x DP ranks). The tiny MoE GPT of moe_common.inc
# (a dense first layer and a MoE layer, top-2 of 4 experts, shared expert) with a large aux-loss
# coefficient (1, and z-loss 0.1, so that the aux losses' gradients are a sizeable part of the
# router's: without the CP factor of their backward scale the CP2 run's iteration-1 grad norm read
# 0.965 instead of 1.069 and its iteration-5 loss 4.537 instead of 4.653, measured) on mock data,
# 5 iterations of global batch 8, as one rank and as
#   CP2 (EP1), EP2 x CP2 on 2 ranks (the EP group is the CP group, expert-DP 1), and EP2 x CP2 x DP2
#   on 4 ranks with the alltoall dispatcher (expert-DP 2: the expert gradients summed over expt-dp
#   and scaled 1/(DP x CP) as the dense ones), EP4 x CP2 x DP2, TP2 + SP x CP2 x EP2 (expert-TP1),
#   EP2 x CP2 x DP2 with the distributed optimizer, PP2 x CP2 x EP2, expert-TP2 x EP2 x CP2 (TP1),
#   EP2 x CP2 on the TCP backend,
# for --moe-router-load-balancing-type aux_loss, and EP2 x CP2 for seq_aux_loss, global_aux_loss and
# --calculate-per-token-loss. Each CP rank routes its own tokens;
# the aux loss takes its token counts summed over TP x CP (so it is the whole sequence's), each CP rank's
# part covers its own tokens' probabilities, and the aux losses' backward scale carries the CP size as
# the main loss's does (Megatron's MoEAuxLossAutoScaler.set_loss_scale(loss_scale * cp / M)).
# Every lm loss / validation loss must equal the single-rank run within 1e-5 relative and the grad
# norm within one printed unit, and the logged load_balancing_loss (seq_load_balancing_loss) and
# z_loss within 1e-5 relative (summaries_equal, moe_equal: CP and EP change only the fp32 summation
# order, ~1e-7; the log prints 7 digits). Checkpoints: EP2 x CP2 saves at iteration 2, one rank
# (EP1 CP1) loads it and trains on; and the reverse. Iterations 3..5 must equal the uninterrupted
# single-rank run (lm loss 1e-6 relative, grad norm 1.5e-3, as ckpt_moe_resharding.sh).
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/dist_common.inc"
source "$SRC/tests/functional_tests/train_log.inc"  # log_summary, summaries_equal
source "$SRC/tests/functional_tests/moe_common.inc"  # MOE_ARGS, moe_summary, moe_equal
ARGS=("${MOE_ARGS[@]}" --train-iters 5 --eval-interval 2 --moe-layer-freq '([0]+[1])'
  --moe-aux-loss-coeff 1 --moe-z-loss-coeff 0.1)
source "$SRC/tests/functional_tests/ckpt_common.inc"  # launch, save_run, load_run

run() {  # run NAME NP LB_NAME EXTRA ARGS...   (NP "L2": megatron_launch with 2 processes, the TCP backend)
  local name=$1 np=$2 lb=$3; shift 3
  if [ "${np#L}" != "$np" ]; then
    timeout 180 "$BIN/megatron_launch" --nproc-per-node "${np#L}" --master-port "$(free_port)" -- \
      "$BIN/pretrain_gpt" "${ARGS[@]}" "$@" --distributed-backend gloo >"$LOGDIR/$name.log" 2>&1 \
      || { tail -30 "$LOGDIR/$name.log" >&2; fail "$name exited with status $?"; }
  else
    launch "$np" "$LOGDIR/$name.log" "$@"
  fi
  log_summary "$LOGDIR/$name.log" >"$LOGDIR/$name.sum"
  moe_summary "$LOGDIR/$name.log" "$lb" >"$LOGDIR/$name.moe" || fail "$name: MoE metrics missing from the iteration lines"
}
compare() {  # compare NAME REF
  summaries_equal "$LOGDIR/$2.sum" "$LOGDIR/$1.sum" "$1" || { cat "$LOGDIR/$2.sum" "$LOGDIR/$1.sum" >&2; fail "$1 differs from $2"; }
  moe_equal "$LOGDIR/$2.moe" "$LOGDIR/$1.moe" "$1" || fail "$1: MoE metrics differ from $2"
  echo "$1: lm loss, grad norm, validation losses and the MoE metrics equal $2"
}

run single 1 load_balancing_loss --save "$LOGDIR/single" --save-interval 2
run cp2 2 load_balancing_loss --context-parallel-size 2
compare cp2 single
run ep2_cp2 2 load_balancing_loss --context-parallel-size 2 --expert-model-parallel-size 2 \
  --save "$LOGDIR/ep2_cp2" --save-interval 2
compare ep2_cp2 single
grep -q 'context-parallel size: 2' "$LOGDIR/ep2_cp2.log" || fail "ep2_cp2: no 'context-parallel size: 2' line"
run ep2_cp2_dp2_a2a 4 load_balancing_loss --context-parallel-size 2 --expert-model-parallel-size 2 \
  --moe-token-dispatcher-type alltoall
compare ep2_cp2_dp2_a2a single
# EP4 over CP2 x DP2 (the EP group spans both CP groups, expert-DP 1); TP2 + SP x CP2 with expert-TP1
# x EP2 (the aux losses' TP x CP group of 4 ranks, expert-DP 2); EP2 x CP2 x DP2 with the distributed
# optimizer (the expert buffer sharded over expt-dp); PP2 x CP2 x EP2; expert-TP2 x EP2 over CP2 x DP2
# with TP1 (the experts split over ranks of different CP groups); EP2 x CP2 on the TCP backend.
run ep4_cp2_dp2 4 load_balancing_loss --context-parallel-size 2 --expert-model-parallel-size 4
compare ep4_cp2_dp2 single
run tp2_sp_cp2_etp1_ep2 4 load_balancing_loss --tensor-model-parallel-size 2 --sequence-parallel \
  --context-parallel-size 2 --expert-tensor-parallel-size 1 --expert-model-parallel-size 2
compare tp2_sp_cp2_etp1_ep2 single
run ep2_cp2_dp2_distopt 4 load_balancing_loss --context-parallel-size 2 --expert-model-parallel-size 2 \
  --use-distributed-optimizer
compare ep2_cp2_dp2_distopt single
run pp2_cp2_ep2 4 load_balancing_loss --pipeline-model-parallel-size 2 --context-parallel-size 2 \
  --expert-model-parallel-size 2
compare pp2_cp2_ep2 single
run etp2_ep2_cp2 4 load_balancing_loss --context-parallel-size 2 --expert-tensor-parallel-size 2 \
  --expert-model-parallel-size 2
compare etp2_ep2_cp2 single
run ep2_cp2_tcp L2 load_balancing_loss --context-parallel-size 2 --expert-model-parallel-size 2
compare ep2_cp2_tcp single

SEQ=(--moe-router-load-balancing-type seq_aux_loss)
run single_seq 1 seq_load_balancing_loss "${SEQ[@]}"
run ep2_cp2_seq 2 seq_load_balancing_loss "${SEQ[@]}" --context-parallel-size 2 --expert-model-parallel-size 2
compare ep2_cp2_seq single_seq
# --calculate-per-token-loss (the aux losses scaled by the local token count x TP x CP instead) and
# global_aux_loss (token counts over TP x DP x CP, averaged over the micro-batch steps: DP1 here, as
# with DP > 1 each step's counts span DP micro-batches, so the single-rank run is no reference).
PTL=(--calculate-per-token-loss)
run single_ptl 1 load_balancing_loss "${PTL[@]}"
run ep2_cp2_ptl 2 load_balancing_loss "${PTL[@]}" --context-parallel-size 2 --expert-model-parallel-size 2
compare ep2_cp2_ptl single_ptl
GLOB=(--moe-router-load-balancing-type global_aux_loss)
run single_glob 1 global_load_balancing_loss "${GLOB[@]}"
run ep2_cp2_glob 2 global_load_balancing_loss "${GLOB[@]}" --context-parallel-size 2 --expert-model-parallel-size 2
compare ep2_cp2_glob single_glob
# seq_aux_loss is per sequence, aux_loss over the micro-batch: with 2 sequences per micro-batch they differ.
summaries_equal "$LOGDIR/single.sum" "$LOGDIR/single_seq.sum" single_seq 2>/dev/null \
  && fail "seq_aux_loss trained as aux_loss: the comparison above cannot tell them apart"

# Checkpoints across the layouts.
RESUMED=(python3 "$SRC/tests/functional_tests/support/resumed_log.py")
same() {  # same NAME REF: NAME (loaded at 2) prints iterations 3..5 as REF
  "${RESUMED[@]}" compare "$LOGDIR/$2.log" "$LOGDIR/$1.log" --iterations 3-5 \
    --fields 'lm loss,grad norm' --tol 'lm loss=rel:1e-6' --tol 'grad norm=abs:1.5e-3' --name "$1" \
    || fail "$1 differs from $2"
}
load_run ep2_cp2_to_1 ep2_cp2 1
same ep2_cp2_to_1 single
load_run single_to_ep2_cp2 single 2 --context-parallel-size 2 --expert-model-parallel-size 2
same single_to_ep2_cp2 single
echo "checkpoints: EP2 x CP2 -> one rank and one rank -> EP2 x CP2 continue as the single-rank run"
