#!/usr/bin/env bash
# pretrain_gpt with MoE layers (--num-experts 4, top-2, SwiGLU experts, aux loss + z-loss, a dense
# first layer by --moe-layer-freq '([0]+[1])', a shared expert) on mock data: the single-rank run
# against DP2, DP2 + --use-distributed-optimizer, TP2 + --sequence-parallel (experts split by
# expert-TP = TP, tokens gathered by the allgather dispatcher), PP2 (dense stage + MoE stage), and the
# alltoall dispatcher, all under mpirun. Every lm loss / validation loss must equal the single-rank
# run within 1e-5 relative and the grad norm within one printed unit: the aux losses' gradients change
# the weights, so a wrong aux-loss scale (1/M, 1/DP, TP token counts) moves the iteration-2+ losses
# by far more (see pretrain_gpt_parallel.sh for why 1e-5 is a wide margin over fp32 reordering).
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/dist_common.inc"
source "$SRC/tests/functional_tests/train_log.inc"  # log_summary, summaries_equal
ARGS=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
  --attention-dropout 0.0 --hidden-dropout 0.0 --make-vocab-size-divisible-by 64
  --micro-batch-size 2 --global-batch-size 8 --train-iters 4 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine
  --lr-warmup-iters 1 --weight-decay 0.1 --clip-grad 1.0 --seed 1234
  --mock-data --tokenizer-type NullTokenizer --vocab-size 128 --data-cache-path "$LOGDIR/cache"
  --log-interval 1 --eval-interval 2 --eval-iters 1 --distributed-backend nccl
  --disable-bias-linear --swiglu --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 48
  --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3 --moe-layer-freq '([0]+[1])'
  --moe-shared-expert-intermediate-size 32)

run() {  # run NAME LAUNCHER... -- EXTRA ARGS
  local name=$1; shift
  local launch=()
  while [ "$1" != "--" ]; do launch+=("$1"); shift; done
  shift
  timeout 180 "${launch[@]}" "$BIN/pretrain_gpt" "${ARGS[@]}" "$@" >"$LOGDIR/$name.log" 2>&1 \
    || { tail -30 "$LOGDIR/$name.log" >&2; fail "$name exited with status $?"; }
  log_summary "$LOGDIR/$name.log" >"$LOGDIR/$name.sum"
  [ "$name" = no_aux ] && return  # load_balancing_loss is 0 there, and a zero average is not printed
  moe_summary "$LOGDIR/$name.log" >"$LOGDIR/$name.moe" || fail "$name: MoE metrics missing from the iteration lines"
}
# moe_summary LOG: "ITERATION load_balancing_loss z_loss" per iteration line (Megatron's
# track_moe_metrics names, in the loss-dict part of the line after lm loss); fails if a line lacks them.
moe_summary() {
  python3 - "$1" <<'EOF'
import re, sys
n = 0
for line in open(sys.argv[1]):
    if '] iteration ' not in line: continue
    m = re.search(r'\] iteration +(\d+)/.*\| lm loss: [0-9.E+-]+ \| load_balancing_loss: ([0-9.E+-]+) \| '
                  r'z_loss: ([0-9.E+-]+) \| loss scale:', line)
    if not m: sys.exit('no load_balancing_loss / z_loss after lm loss in: ' + line.strip())
    print(*m.groups()); n += 1
if n < 4: sys.exit('only %d iteration lines' % n)
EOF
}
# moe_equal REF GOT NAME: the MoE metrics of every iteration agree within 1e-5 relative (the same
# per-layer means over the same global batch: Megatron sums them over PP and TP x CP, averages over
# DP; fp32 reordering moves the 7th digit at most, as for lm loss above).
moe_equal() {
  python3 - "$1" "$2" "$3" <<'EOF'
import sys
a = [l.split() for l in open(sys.argv[1])]; b = [l.split() for l in open(sys.argv[2])]
if len(a) != len(b) or not a: sys.exit('%s: %d vs %d MoE metric lines' % (sys.argv[3], len(a), len(b)))
for x, y in zip(a, b):
    if x[0] != y[0] or any(abs(float(p) - float(q)) > 1e-5 * abs(float(p)) for p, q in zip(x[1:], y[1:])):
        sys.exit('%s: MoE metrics %s vs single-rank %s' % (sys.argv[3], y, x))
EOF
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
for name in dp2 dp2_distopt tp2_sp tp2_sp_a2a pp2; do
  summaries_equal "$LOGDIR/single.sum" "$LOGDIR/$name.sum" $name \
    || { cat "$LOGDIR/single.sum" "$LOGDIR/$name.sum" >&2; fail "$name differs from the single-rank run"; }
  moe_equal "$LOGDIR/single.moe" "$LOGDIR/$name.moe" $name || fail "$name: MoE metrics differ from the single-rank run"
  echo "$name: lm loss, grad norm, validation losses, load_balancing_loss and z_loss equal the single-rank MoE run"
done
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
bad "--moe-token-dispatcher-type flex" --moe-token-dispatcher-type flex
bad "--moe-enable-deepep is a Megatron-LM flag that megatron.cpp does not implement" --moe-enable-deepep
BAD_LAUNCH="${MPIRUN[*]} -np 2" bad "needs --sequence-parallel" --tensor-model-parallel-size 2
BAD_LAUNCH="${MPIRUN[*]} -np 2" bad "expert parallelism is not available in pretrain_gpt yet" --expert-model-parallel-size 2
echo "bad MoE input: one clear line each"
