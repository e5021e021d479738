#!/usr/bin/env bash
# pretrain_gpt with MoE layers (--num-experts 4, top-2, SwiGLU experts, aux loss + z-loss, a dense
# first layer by --moe-layer-freq '([0]+[1])', a shared expert) on mock data: the single-rank run
# against DP2, DP2 + --use-distributed-optimizer, TP2 + --sequence-parallel (experts split by
# expert-TP = TP, tokens gathered by the allgather dispatcher), PP2 (dense stage + MoE stage), and the
# alltoall dispatcher, all under mpirun; expert parallelism and expert-TP != TP (below). Every lm loss / validation loss must equal the single-rank
# run within 1e-5 relative and the grad norm within one printed unit: the aux losses' gradients change
# the weights, so a wrong aux-loss scale (1/M, 1/DP, TP token counts) moves the iteration-2+ losses
# by far more (see pretrain_gpt_parallel.sh for why 1e-5 is a wide margin over fp32 reordering).
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/dist_common.inc"
source "$SRC/tests/functional_tests/train_log.inc"  # log_summary, summaries_equal
source "$SRC/tests/functional_tests/moe_common.inc"  # MOE_ARGS, moe_summary, moe_equal
ARGS=("${MOE_ARGS[@]}" --train-iters 4 --eval-interval 2 --moe-layer-freq '([0]+[1])')

run() {  # run NAME LAUNCHER... -- EXTRA ARGS (moe_common.inc moe_run), then the log's summaries
  local name=$1
  moe_run 180 "$@"
  log_summary "$LOGDIR/$name.log" >"$LOGDIR/$name.sum"
  [ "$name" = no_aux ] && return  # load_balancing_loss is 0 there, and a zero average is not printed
  moe_summary "$LOGDIR/$name.log" >"$LOGDIR/$name.moe" || fail "$name: MoE metrics missing from the iteration lines"
}
run single env -- --tensorboard-dir "$LOGDIR/single.tb"
# The metrics' scale at iteration 1 (router weights near 0, so nearly uniform probabilities over the
# 4 experts): the Switch aux loss of uniform routing is 1 and the z-loss log(4)^2 = 1.922 (within 5%:
# the initial logits are ~0.1, which moves them by under 1%). A missing 1/num_microbatches would
# read 4x, an average over all 2 layers instead of the 1 MoE layer 0.5x.
python3 - "$LOGDIR/single.moe" <<'EOF' || fail "iteration-1 MoE metrics off their uniform-routing values"
import math, sys
it, lb, z = open(sys.argv[1]).readline().split()
lb, z = float(lb), float(z)
print('iteration 1: load_balancing_loss %g (uniform 1), z_loss %g (uniform %.4f)' % (lb, z, math.log(4) ** 2))
sys.exit(not (abs(lb - 1) < 0.05 and abs(z / math.log(4) ** 2 - 1) < 0.05))
EOF
if command -v protoc >/dev/null && /usr/bin/python3 -c 'import google.protobuf' 2>/dev/null; then
  # TensorBoard: Megatron's writer.add_scalar(name, value, iteration) for each tracked MoE metric,
  # every iteration, equal to the iteration line's value (one iteration per log line here; the
  # run's second line, iteration 2, prints the mean of 1 and 2). Bound 1e-6 relative: the printed
  # 7 digits (<= 5e-7) and the float32 TensorBoard values (6e-8).
  /usr/bin/python3 "$SRC/tests/reference/tensorboard/read_events.py" "$LOGDIR"/single.tb/events.out.tfevents.* \
    >"$LOGDIR/single.events" || fail "single: event file unreadable"
  python3 - "$LOGDIR/single.events" "$LOGDIR/single.moe" <<'EOF' || fail "MoE TensorBoard scalars differ from the log"
import re, sys
tb = {}
for line in open(sys.argv[1]):
    m = re.match(r'step (\d+) wall_time \S+ (load_balancing_loss|z_loss)=(\S+)$', line.strip())
    if m: tb.setdefault(m.group(2), {})[int(m.group(1))] = float(m.group(3))
lines = [l.split() for l in open(sys.argv[2])]
for k, (it, lb, z) in enumerate(lines):
    # TensorBoard gets each iteration's own value; the log's second line averages the run's first
    # two iterations (Megatron's first logged iteration does not reset the interval).
    its = [int(lines[0][0]), int(it)] if k == 1 else [int(it)]
    for name, v in (('load_balancing_loss', lb), ('z_loss', z)):
        vals = [tb.get(name, {}).get(i) for i in its]
        got = None if None in vals else sum(vals) / len(vals)
        if got is None or abs(got - float(v)) > 1e-6 * abs(float(v)): sys.exit('%s at %s: TB %s, log %s' % (name, it, vals, v))
print('TensorBoard: load_balancing_loss and z_loss at every iteration, as the iteration line (line 2: the mean of 1 and 2)')
EOF
else
  echo "NOTE: MoE TensorBoard tag check not run (protoc / python3-protobuf missing)"
fi
run single_a2a env -- --moe-token-dispatcher-type alltoall
summaries_equal "$LOGDIR/single.sum" "$LOGDIR/single_a2a.sum" single_a2a \
  || fail "the alltoall dispatcher differs from allgather on one rank"
run dp2 "${MPIRUN[@]}" -np 2 --
run dp2_distopt "${MPIRUN[@]}" -np 2 -- --use-distributed-optimizer
run tp2_sp "${MPIRUN[@]}" -np 2 -- --tensor-model-parallel-size 2 --sequence-parallel
run tp2_sp_a2a "${MPIRUN[@]}" -np 2 -- --tensor-model-parallel-size 2 --sequence-parallel --moe-token-dispatcher-type alltoall
run pp2 "${MPIRUN[@]}" -np 2 -- --pipeline-model-parallel-size 2
# Expert parallelism (docs/moe.md "Expert parallelism in training"): the experts' weights in their own
# buffer reduced over expt-dp (pre-scale 1/DP), the grad norm as Megatron's ChainedOptimizer (dense
# part over tp-pp, experts over tp-ep-pp, or one norm over the world with the distributed
# optimizer). EP2 (expert-DP 1), EP2 x expert-DP2 on 4 ranks, EP4, EP2 with the distributed
# optimizer (plus DP2 and overlapped reduce / param gather), expert-TP != TP both ways (TP1 with
# expert-TP2; TP2 + SP with expert-TP1 and EP2: Megatron's expert rank order puts the two TP ranks
# on different EP ranks), EP2 under PP2 and with the alltoall dispatcher.
run ep2 "${MPIRUN[@]}" -np 2 -- --expert-model-parallel-size 2
run ep2_dp2 "${MPIRUN[@]}" -np 4 -- --expert-model-parallel-size 2
run ep4 "${MPIRUN[@]}" -np 4 -- --expert-model-parallel-size 4 --moe-token-dispatcher-type alltoall
run ep2_distopt "${MPIRUN[@]}" -np 2 -- --expert-model-parallel-size 2 --use-distributed-optimizer
run ep2_dp2_distopt_overlap "${MPIRUN[@]}" -np 4 -- --expert-model-parallel-size 2 --use-distributed-optimizer \
  --overlap-grad-reduce --overlap-param-gather --ddp-bucket-size 4000
run etp2 "${MPIRUN[@]}" -np 2 -- --expert-tensor-parallel-size 2
run tp2_sp_etp1_ep2 "${MPIRUN[@]}" -np 4 -- --tensor-model-parallel-size 2 --sequence-parallel \
  --expert-tensor-parallel-size 1 --expert-model-parallel-size 2
run pp2_ep2 "${MPIRUN[@]}" -np 4 -- --pipeline-model-parallel-size 2 --expert-model-parallel-size 2
# The TCP backend (--distributed-backend gloo under megatron_launch) as well as MPI.
run ep2_dp2_tcp "$BIN/megatron_launch" --nproc-per-node 4 --master-port "$(free_port)" -- \
  --expert-model-parallel-size 2 --use-distributed-optimizer --distributed-backend gloo
for name in dp2 dp2_distopt tp2_sp tp2_sp_a2a pp2 ep2 ep2_dp2 ep4 ep2_distopt ep2_dp2_distopt_overlap etp2 \
  tp2_sp_etp1_ep2 pp2_ep2 ep2_dp2_tcp; do
  summaries_equal "$LOGDIR/single.sum" "$LOGDIR/$name.sum" $name \
    || { cat "$LOGDIR/single.sum" "$LOGDIR/$name.sum" >&2; fail "$name differs from the single-rank run"; }
  moe_equal "$LOGDIR/single.moe" "$LOGDIR/$name.moe" $name || fail "$name: MoE metrics differ from the single-rank run"
  echo "$name: lm loss, grad norm, validation losses, load_balancing_loss and z_loss equal the single-rank MoE run"
done
# Adam normalizes the gradient's scale away, so a wrong expert-gradient scale shows above only in the
# grad norm. With SGD (momentum 0.9, lr 0.3) it moves the weights: EP2 x expert-DP2 on 4 ranks (DP 4,
# expert-DP 2, where Megatron's 1/DP pre-scale and a 1/expert-DP one differ by 2x) must equal the
# single-rank SGD run; with the expert gradients scaled 2x the iteration-3+ losses differ by > 1e-5
# relative (measured: 1.6e-5 at iteration 3, 3.8e-5 for the validation loss), which this catches.
SGD=(--optimizer sgd --sgd-momentum 0.9 --lr 0.3 --min-lr 0.03 --train-iters 6)
run single_sgd env -- "${SGD[@]}"
run ep2_dp2_sgd "${MPIRUN[@]}" -np 4 -- "${SGD[@]}" --expert-model-parallel-size 2
run ep2_dp2_sgd_distopt "${MPIRUN[@]}" -np 4 -- "${SGD[@]}" --expert-model-parallel-size 2 --use-distributed-optimizer
for name in ep2_dp2_sgd ep2_dp2_sgd_distopt; do
  summaries_equal "$LOGDIR/single_sgd.sum" "$LOGDIR/$name.sum" $name \
    || { cat "$LOGDIR/single_sgd.sum" "$LOGDIR/$name.sum" >&2; fail "$name differs from the single-rank SGD run"; }
  moe_equal "$LOGDIR/single_sgd.moe" "$LOGDIR/$name.moe" $name || fail "$name: MoE metrics differ from the single-rank run"
  echo "$name: equal to the single-rank SGD run"
done
# --log-num-zeros-in-grad and --log-params-norm (Megatron's calc_params_norm: dense over tp-pp,
# experts over tp-ep-pp) under EP2 x expert-DP2 print what the single-rank run prints.
stats() { grep -o 'params norm: [^|]*\|num zeros: [^|]*' "$1"; }
run single_stats env -- --log-num-zeros-in-grad --log-params-norm
run ep2_dp2_stats "${MPIRUN[@]}" -np 4 -- --log-num-zeros-in-grad --log-params-norm --expert-model-parallel-size 2
[ "$(stats "$LOGDIR/single_stats.log" | wc -l)" -ge 8 ] || fail "no params norm / num zeros in the single-rank log"
[ "$(stats "$LOGDIR/single_stats.log")" = "$(stats "$LOGDIR/ep2_dp2_stats.log")" ] \
  || fail "EP2 x DP2 params norm / num zeros differ from the single-rank run"
echo "ep2_dp2: params norm and num zeros equal the single-rank run"
# The aux losses act: without them the run differs (so the comparisons above see their gradients).
run no_aux env -- --moe-aux-loss-coeff 0
summaries_equal "$LOGDIR/single.sum" "$LOGDIR/no_aux.sum" no_aux 2>/dev/null \
  && fail "--moe-aux-loss-coeff 0 gave the same losses: the aux loss has no effect"
# Bad input: one line each, naming the flag.
bad() {  # bad EXPECTED-TEXT ARGS... (BAD_LAUNCH: a launcher, e.g. mpirun -np 2)
  local want=$1; shift
  if ${BAD_LAUNCH:-} "$BIN/pretrain_gpt" "${ARGS[@]}" "$@" >"$LOGDIR/bad.log" 2>&1; then fail "accepted: $*"; fi
  grep -q -- "$want" "$LOGDIR/bad.log" || { cat "$LOGDIR/bad.log" >&2; fail "no '$want' for: $*"; }
}
bad "--moe-router-topk (8) must not exceed --num-experts (4)" --moe-router-topk 8
bad "--num-experts (4) must be a multiple of --expert-model-parallel-size (3)" --expert-model-parallel-size 3
bad "--moe-expert-capacity-factor must be > 0" --moe-expert-capacity-factor 0
bad "invalid length of the layer pattern: 3, expected 2" --moe-layer-freq '[1]*3'
bad "makes no layer a mixture-of-experts layer while --num-experts is 4" --moe-layer-freq '[0]*2'
# Biases (Megatron's default) with experts: refused at argument time, naming the flag to add.
WITH_BIAS=(); for x in "${ARGS[@]}"; do [ "$x" = --disable-bias-linear ] || WITH_BIAS+=("$x"); done
if "$BIN/pretrain_gpt" "${WITH_BIAS[@]}" >"$LOGDIR/bad.log" 2>&1; then fail "accepted experts with bias"; fi
grep -q -- "--num-experts: the routed experts have no bias linear layers; add --disable-bias-linear" "$LOGDIR/bad.log" ||
  { cat "$LOGDIR/bad.log" >&2; fail "no clear line for experts with bias"; }
bad "--moe-token-dispatcher-type flex" --moe-token-dispatcher-type flex
bad "--moe-enable-deepep is a Megatron-LM flag that megatron.cpp does not implement" --moe-enable-deepep
BAD_LAUNCH="${MPIRUN[*]} -np 2" bad "needs --sequence-parallel" --tensor-model-parallel-size 2
BAD_LAUNCH="${MPIRUN[*]} -np 2" bad "world size (2) is not divisible by --expert-tensor-parallel-size (1) x --expert-model-parallel-size (4) x --pipeline-model-parallel-size (1)" \
  --expert-model-parallel-size 4 --expert-tensor-parallel-size 1
# The shared expert's fc1 is split by TP: an indivisible size is refused naming the flag (the error
# used to name decoder.layers.N.mlp.shared_experts.linear_fc1.weight only).
BAD_LAUNCH="${MPIRUN[*]} -np 2" bad "error: --moe-shared-expert-intermediate-size (65) must be divisible by --tensor-model-parallel-size (2)" \
  --tensor-model-parallel-size 2 --sequence-parallel --moe-shared-expert-intermediate-size 65
echo "bad MoE input: one clear line each"
