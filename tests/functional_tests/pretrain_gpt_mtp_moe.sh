#!/usr/bin/env bash
# pretrain_gpt --mtp-num-layers 2 with MoE (docs/training.md, Multi-token prediction; docs/moe.md):
# the tiny MoE GPT of moe_common.inc with a dense first layer ('([0]+[1])'), so the MTP layers take
# the last (MoE) decoder layer's spec (Megatron's get_gpt_mtp_block_spec):
#  * the iteration line carries lm loss, load_balancing_loss, z_loss, mtp_1 loss, mtp_2 loss; at
#    iteration 1 (router weights near 0: nearly uniform routing) load_balancing_loss is within 5% of
#    1, the Switch aux loss of uniform routing, which holds only if the average runs over the 3 MoE
#    layers that recorded (decoder layer 2 and both MTP layers: 3x if the MTP layers were left out
#    of Megatron's num_moe_layers, 1.5x if they recorded nothing);
#  * DP2, TP2 + --sequence-parallel and PP2 (the MoE metrics all-reduced over the stages at
#    num_layers + D entries each) print the single-rank run's lm loss, MTP losses, MoE metrics
#    and grad norm (1e-5 relative, the grad norm within its printed unit; fp32 reordering only);
#  * 3 iterations + --load + 3 print the straight run's lines exactly (the MTP layer's router and
#    experts are checkpointed under Megatron's keys, per-layer keys for the '([0]+[1])' list; the
#    resumed run's second line is the mean of its first two iterations, as Megatron's log:
#    tests/functional_tests/support/resumed_log.py compares it);
#  * a TP2 checkpoint loaded by one process continues like the single-rank run (1e-5);
#  * the same in Megatron's torch_dist format (--ckpt-format torch_dist: per-layer keys, experts,
#    MTP keys as Megatron names them, tests/unit_tests/training/torch_dist_keys_test.cpp): 3 + 3
#    bitwise, and a TP2 torch_dist checkpoint continued by one process (1e-5).
# Args: bin dir, source dir.
set -euo pipefail
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/dist_common.inc"
source "$SRC/tests/functional_tests/moe_common.inc"  # MOE_ARGS
ARGS=("${MOE_ARGS[@]}" --position-embedding-type rope --train-iters 6 --eval-interval 100 --moe-layer-freq '([0]+[1])'
      --mtp-num-layers 2 --mtp-loss-scaling-factor 0.3)
dump() { for f in "$LOGDIR"/*.log; do echo "== $f"; tail -20 "$f"; done; fail "$*"; }
run() {  # run NAME LAUNCHER... -- EXTRA ARGS
  local name=$1; shift
  local launch=()
  while [ "$1" != "--" ]; do launch+=("$1"); shift; done
  shift
  timeout 300 "${launch[@]}" "$BIN/pretrain_gpt" "${ARGS[@]}" "$@" >"$LOGDIR/$name.log" 2>&1 || dump "$name failed"
}
# summary LOG: "ITERATION lm lb z mtp1 mtp2 gradnorm" per iteration line (fails if a field is missing).
summary() {
  python3 - "$1" <<'EOF'
import re, sys
n = 0
for line in open(sys.argv[1]):
    if '] iteration ' not in line: continue
    m = re.search(r'\] iteration +(\d+)/.*\| lm loss: (\S+) \| load_balancing_loss: (\S+) \| z_loss: (\S+) \| '
                  r'mtp_1 loss: (\S+) \| mtp_2 loss: (\S+) \|.*grad norm: (\S+) \|', line)
    if not m: sys.exit('iteration line without lm / MoE / MTP fields: ' + line.strip())
    print(*m.groups()); n += 1
if n == 0: sys.exit('no iteration lines')
EOF
}
close() {  # close REF GOT NAME: same iterations, 1e-5 relative, grad norm within 1e-3
  python3 - "$1" "$2" "$3" <<'EOF'
import sys
a = [l.split() for l in open(sys.argv[1])]; b = [l.split() for l in open(sys.argv[2])]
if len(a) != len(b) or not a: sys.exit('%s: %d vs %d lines' % (sys.argv[3], len(b), len(a)))
for x, y in zip(a, b):
    for i, (u, v) in enumerate(zip(x, y)):
        tol = 1e-3 if i == 6 else 1e-5 * abs(float(u))
        if x[0] != y[0] or abs(float(u) - float(v)) > tol: sys.exit('%s: %s vs single-rank %s' % (sys.argv[3], y, x))
EOF
}

run single env -- --save "$LOGDIR/unused" --save-interval 100
summary "$LOGDIR/single.log" >"$LOGDIR/single.sum" || dump "single: fields"
python3 - "$LOGDIR/single.sum" <<'EOF' || dump "iteration-1 load_balancing_loss is not the uniform-routing 1"
import sys
lb = float(open(sys.argv[1]).readline().split()[2])
print('iteration 1: load_balancing_loss %g over 3 MoE layers (uniform routing: 1)' % lb)
sys.exit(abs(lb - 1) >= 0.05)
EOF

run dp2 "${MPIRUN[@]}" -np 2 --
summary "$LOGDIR/dp2.log" >"$LOGDIR/dp2.sum" && close "$LOGDIR/single.sum" "$LOGDIR/dp2.sum" dp2 || dump "DP2 differs"
run tp2 "${MPIRUN[@]}" -np 2 -- --tensor-model-parallel-size 2 --sequence-parallel --save "$LOGDIR/tp2ckpt" \
  --save-interval 3
summary "$LOGDIR/tp2.log" >"$LOGDIR/tp2.sum" && close "$LOGDIR/single.sum" "$LOGDIR/tp2.sum" tp2 || dump "TP2 differs"
run pp2 "${MPIRUN[@]}" -np 2 -- --pipeline-model-parallel-size 2
summary "$LOGDIR/pp2.log" >"$LOGDIR/pp2.sum" && close "$LOGDIR/single.sum" "$LOGDIR/pp2.sum" pp2 || dump "PP2 differs"
echo "DP2, TP2 + SP and PP2 (dense stage, MoE stage + MTP) with MoE MTP layers: every field equals the single-rank run"

# resumed NAME [TOL]: NAME (resumed at 3) prints iterations 4..6 as the straight run (exactly, or
# lm / MTP / MoE losses and grad norm within TOL relative).
RESUMED=(python3 "$SRC/tests/functional_tests/support/resumed_log.py" compare)
FIELDS='consumed samples,learning rate,lm loss,load_balancing_loss,z_loss,mtp_1 loss,mtp_2 loss,grad norm'
resumed() {
  local tol=()
  [ -n "${2:-}" ] && for f in 'lm loss' load_balancing_loss z_loss 'mtp_1 loss' 'mtp_2 loss'; do tol+=(--tol "$f=rel:$2"); done
  [ -n "${2:-}" ] && tol+=(--tol 'grad norm=abs:1e-3')
  "${RESUMED[@]}" "$LOGDIR/single.log" "$LOGDIR/$1.log" --iterations 4-6 --fields "$FIELDS" "${tol[@]}" --name "$1" \
    || dump "$1: iterations 4..6 differ from the straight run"
}
run first env -- --save "$LOGDIR/resume" --save-interval 100 --exit-interval 3
run second env -- --load "$LOGDIR/resume" --save "$LOGDIR/resume" --save-interval 100
resumed second
echo "resume with MoE MTP layers: iterations 4..6 as the straight run"

run from_tp2 env -- --load "$LOGDIR/tp2ckpt" --ckpt-step 3 --save "$LOGDIR/unused2" --save-interval 100
resumed from_tp2 1e-5
echo "TP2 checkpoint (iteration 3) loaded on one rank: iterations 4..6 equal the single-rank run"

run td_first env -- --ckpt-format torch_dist --save "$LOGDIR/td" --save-interval 100 --exit-interval 3
run td_second env -- --ckpt-format torch_dist --load "$LOGDIR/td" --save "$LOGDIR/td" --save-interval 100
resumed td_second
run td_tp2 "${MPIRUN[@]}" -np 2 -- --tensor-model-parallel-size 2 --sequence-parallel --ckpt-format torch_dist \
  --save "$LOGDIR/td_tp2" --save-interval 100 --exit-interval 3
run td_from_tp2 env -- --ckpt-format torch_dist --load "$LOGDIR/td_tp2" --save "$LOGDIR/unused3" --save-interval 100
resumed td_from_tp2 1e-5
echo "torch_dist: resume exact, TP2 checkpoint continued on one rank like the single-rank run"
