#!/usr/bin/env bash
# MoE checkpoints across expert-parallel layouts (docs/moe.md "Parameter names and checkpoints"):
# the routed experts are saved as Megatron's SequentialMLP / TEGroupedMLP sharded_state_dict does,
# one tensor per layer "decoder.layers.N.mlp.experts.experts.linear_fc{1,2}.weight" with an expert
# axis (global expert index), replicated over expt-dp; with --moe-layer-freq a list the layers are
# keyed per layer (Megatron's non_homogeneous_layers), with --moe-layer-freq 1 stacked along a layer
# axis. A tiny fp32 MoE GPT on mock data (dropout 0) trains 5 iterations in layout A, saving at
# iteration 2; layout B loads iteration 2 and trains on. Iterations 3..5 (lm loss, grad norm) must
# equal layout A's uninterrupted run: lm loss within 1e-6 relative (the layouts differ only in fp32
# summation order, ~1e-7, and the log prints 7 digits; a misplaced expert or lost Adam state moves it
# by >= 1e-3, see the --no-load-optim control) and the grad norm within 1.5 printed units (1.5e-3).
# Iteration 4, the resumed run's second line, prints the mean of its iterations 3 and 4 as Megatron
# (the first logged iteration does not reset the interval): its lm loss is compared with the mean of
# layout A's two within 1e-6 relative plus the print rounding of the three values
# (tests/functional_tests/support/resumed_log.py); its grad norm is the iteration's own. Two runs
# from the start (ep2 vs ref, ep2_bias vs ref_bias) both print that mean at iteration 2: they are
# compared on iterations 3..5, line for line, as before.
#   EP2 -> EP1, EP1 -> EP2 x expert-DP2 with the distributed optimizer (4 ranks), EP2 with the
#   distributed optimizer -> EP1 without, --moe-grouped-gemm EP2 -> SequentialMLP EP1
#   (interchangeable as in Megatron), the router's expert bias (per-layer key) EP2 -> EP1, and
#   all-MoE layers (stacked keys) EP2 -> EP1 and back, and the shared expert with
#   --moe-shared-expert-gate (its gate_weight [1, h] replicated over TP) TP2 + SP -> TP1, where a TP2
#   run from the start must equal the TP1 one (the gate's gradient is all-reduced over TP with SP).
# Args: bin dir, source dir.
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/dist_common.inc"
source "$SRC/tests/functional_tests/moe_common.inc"  # MOE_ARGS
ARGS=("${MOE_ARGS[@]}" --train-iters 5 --eval-interval 1000)
MIXED=(--moe-layer-freq '([0]+[1])')

source "$SRC/tests/functional_tests/ckpt_common.inc"  # launch, save_run, load_run
RESUMED=(python3 "$SRC/tests/functional_tests/support/resumed_log.py")
same() {  # same NAME REF [FIRST]: NAME's iterations 3..5 equal REF's (tolerances: see the header);
  # FIRST: the first iteration NAME printed (3: loaded at 2, the default; 1: a run from the start)
  "${RESUMED[@]}" compare "$LOGDIR/$2.log" "$LOGDIR/$1.log" --iterations "${3:-3}-5" --only 3-5 \
    --fields 'lm loss,grad norm' --tol 'lm loss=rel:1e-6' --tol 'grad norm=abs:1.5e-3' --name "$1" \
    || fail "$1 differs from $2"
}
loss() {  # loss LOG IT: the lm loss printed at iteration IT
  grep -E "\] iteration +$2/ +5 \|" "$1" | head -1 | sed -n 's/.*lm loss: \([0-9.E+-]*\).*/\1/p'
}

# Mixed dense / MoE layers (per-layer keys).
save_run ref 1 "${MIXED[@]}"
save_run ep2 2 "${MIXED[@]}" --expert-model-parallel-size 2
same ep2 ref 1
# The checkpoint keys and shapes are Megatron's: one expert tensor [experts, rows, cols] per MoE
# layer, no per-expert keys and no stacked layer axis (layer 0 is dense).
python3 - "$LOGDIR/ep2/iter_0000002/.metadata" <<'EOF' || fail "EP2 checkpoint: expert keys are not Megatron's"
import json, sys
t = json.load(open(sys.argv[1]))['tensors']
want = {'decoder.layers.1.mlp.experts.experts.linear_fc1.weight': [4, 96, 64],
        'decoder.layers.1.mlp.experts.experts.linear_fc2.weight': [4, 64, 48],
        'optimizer.state.exp_avg.decoder.layers.1.mlp.experts.experts.linear_fc1.weight': [4, 96, 64]}
for k, shape in want.items():
    if k not in t or t[k]['global_shape'] != shape: sys.exit('%s: %s' % (k, t.get(k, {}).get('global_shape')))
    if sorted(s['global_offset'][0] for s in t[k]['shards']) != [0, 0, 1, 1, 2, 2, 3, 3] and k.endswith('fc1.weight'):
        sys.exit('%s: expert offsets %s' % (k, [s['global_offset'] for s in t[k]['shards']]))
bad = [k for k in t if 'local_experts' in k or 'decoder.layers.mlp' in k]
if bad: sys.exit('unexpected keys %s' % bad[:3])
print('EP2 checkpoint: Megatron expert keys, expert axis of 4, both EP ranks wrote their experts')
EOF
load_run ep2_to_ep1 ep2 1 "${MIXED[@]}"
same ep2_to_ep1 ref
load_run ep1_to_ep2_dp2_distopt ref 4 "${MIXED[@]}" --expert-model-parallel-size 2 --use-distributed-optimizer
same ep1_to_ep2_dp2_distopt ref
save_run ep2_distopt 2 "${MIXED[@]}" --expert-model-parallel-size 2 --use-distributed-optimizer
load_run ep2_distopt_to_ep1 ep2_distopt 1 "${MIXED[@]}"
same ep2_distopt_to_ep1 ref
# (The grouped weights are initialized from their own names, so the reference is the grouped run.)
save_run ep2_grouped 2 "${MIXED[@]}" --expert-model-parallel-size 2 --moe-grouped-gemm
load_run grouped_to_sequential ep2_grouped 1 "${MIXED[@]}"
same grouped_to_sequential ep2_grouped
# Control: without the optimizer state the resumed run must differ (so the checks above see it):
# its iteration 4 (the mean of its 3 and 4) vs the mean the full load must print there.
load_run no_optim ep2 1 "${MIXED[@]}" --no-load-optim
a=$("${RESUMED[@]}" expected "$LOGDIR/ref.log" --iterations 3-5 --field 'lm loss' --at 4); b=$(loss "$LOGDIR/no_optim.log" 4)
python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if abs(a-b) > 1e-3*abs(a) else 1)" "$a" "$b" \
  || fail "--no-load-optim resumed like the full load (iteration 4 loss $b vs $a): the optimizer state is not checked"
echo "OK --no-load-optim differs (iteration 4: $b vs $a)"

# Aux-loss-free balancing (--moe-router-enable-expert-bias): the router's expert_bias is model state,
# keyed per layer here (decoder.layers.1.mlp.router.expert_bias [4]); EP2 -> EP1 resumes.
BIAS=("${MIXED[@]}" --moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-bias-update-rate 1e-2)
save_run ref_bias 1 "${BIAS[@]}"
save_run ep2_bias 2 "${BIAS[@]}" --expert-model-parallel-size 2
same ep2_bias ref_bias 1
python3 -c "
import json, sys
t = json.load(open(sys.argv[1]))['tensors']
k = 'decoder.layers.1.mlp.router.expert_bias'
sys.exit(0 if k in t and t[k]['global_shape'] == [4] else '%s: %s' % (k, t.get(k, {}).get('global_shape')))
" "$LOGDIR/ep2_bias/iter_0000002/.metadata" || fail "EP2 expert-bias checkpoint: no per-layer expert_bias"
load_run bias_ep2_to_ep1 ep2_bias 1 "${BIAS[@]}"
same bias_ep2_to_ep1 ref_bias

# Every layer an MoE layer: Megatron's stacked keys with a layer axis, then the expert axis.
save_run ref_all 1 --moe-layer-freq 1
save_run ep2_all 2 --moe-layer-freq 1 --expert-model-parallel-size 2
python3 - "$LOGDIR/ep2_all/iter_0000002/.metadata" <<'EOF' || fail "all-MoE EP2 checkpoint: no stacked expert key"
import json, sys
t = json.load(open(sys.argv[1]))['tensors']
k = 'decoder.layers.mlp.experts.experts.linear_fc1.weight'
sys.exit(0 if k in t and t[k]['global_shape'] == [2, 4, 96, 64] else '%s: %s' % (k, t.get(k, {}).get('global_shape')))
EOF
load_run all_ep2_to_ep1 ep2_all 1 --moe-layer-freq 1
same all_ep2_to_ep1 ref_all
load_run all_ep1_to_ep2 ref_all 2 --moe-layer-freq 1 --expert-model-parallel-size 2
same all_ep1_to_ep2 ref_all
# The gated shared expert (docs/moe.md "Shared-expert gate"): Megatron's key
# decoder.layers.1.mlp.shared_experts.gate_weight [1, 64], one replica per TP rank; TP2 + SP from
# the start equals TP1 (without the sequence-parallel all-reduce each rank would step on the partial
# gradient of its own sequence shard and the replicas would drift apart);
# TP2 -> TP1 resumes.
GATE=("${MIXED[@]}" --moe-shared-expert-gate)
save_run ref_gate 1 "${GATE[@]}"
save_run tp2_gate 2 "${GATE[@]}" --tensor-model-parallel-size 2 --sequence-parallel
same tp2_gate ref_gate 1
python3 -c "
import json, sys
t = json.load(open(sys.argv[1]))['tensors']
k = 'decoder.layers.1.mlp.shared_experts.gate_weight'
sys.exit(0 if k in t and t[k]['global_shape'] == [1, 64] else '%s: %s' % (k, t.get(k, {}).get('global_shape')))
" "$LOGDIR/tp2_gate/iter_0000002/.metadata" || fail "TP2 gated-shared-expert checkpoint: no gate_weight [1, 64]"
load_run gate_tp2_to_tp1 tp2_gate 1 "${GATE[@]}"
same gate_tp2_to_tp1 ref_gate
a=$(loss "$LOGDIR/ref.log" 5); b=$(loss "$LOGDIR/ref_gate.log" 5)
python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if abs(a-b) > 1e-4*abs(a) else 1)" "$a" "$b" \
  || fail "--moe-shared-expert-gate trained like the ungated run (iteration 5 loss $b vs $a): the gate has no effect"
echo "OK the gated shared expert reshards TP2 -> TP1 and its TP2 run equals TP1 (iteration 5: $b, ungated $a)"
echo "MoE checkpoints reshard across EP 1/2/4-rank layouts, both optimizers and both expert layouts"
