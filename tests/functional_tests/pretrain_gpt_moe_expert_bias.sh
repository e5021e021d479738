#!/usr/bin/env bash
# pretrain_gpt with --moe-router-enable-expert-bias (aux-loss-free balancing) and
# --moe-per-layer-logging, on mock data, 2 MoE layers (sigmoid top-2 of 4; every layer MoE: a
# --moe-layer-freq pattern with dense layers cannot be saved yet, see docs/moe.md):
#  * the expert bias is updated at every optimizer step (Megatron's finalize_model_grads ->
#    get_updated_expert_bias) and saved under Megatron's key decoder.layers.mlp.router.expert_bias
#    ([num_layers, E], float32): every entry is k * rate with
#    |k| <= iterations (sign steps of the update), not all zero;
#  * with --moe-router-bias-update-rate 0 the losses differ from iteration 2 on (the bias steers the
#    routing, so the comparisons below see it);
#  * DP2 and TP2 + sequence parallel (the token counts are all-reduced over TP x DP x CP) equal the
#    single-rank run: losses within 1e-5 relative, the saved expert bias bit for bit (the counts
#    are integers, so equal routing gives equal bias);
#  * resume: 2 iterations, save, load, 2 more give the straight run's iteration lines 3..4
#    (consumed samples, learning rate, lm loss, grad norm as printed; iteration 4, the resumed run's
#    second line, prints the mean of its 3 and 4 as Megatron, whose first logged iteration does not
#    reset the interval: its lm loss must equal the mean of the straight run's two within print
#    rounding, tests/functional_tests/support/resumed_log.py) and its final expert bias bit for bit;
#  * TensorBoard: moe/load_balancing_loss_layer_<i> and moe/z_loss_layer_<i> for i = 0, 1 at
#    every iteration (Megatron's MoEMetricsTracker._log_per_layer), each positive, and the sum over
#    the layers / 2 (MoE layers) equal to the aggregated load_balancing_loss / z_loss scalar (the
#    dense-layer zeros: MoEMetricsTracker.PerLayerTagsAsMegatron).
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/dist_common.inc"
source "$SRC/tests/functional_tests/train_log.inc"  # log_summary, summaries_equal, run_pretrain_gpt
RATE=1e-3
ARGS=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
  --attention-dropout 0.0 --hidden-dropout 0.0 --make-vocab-size-divisible-by 64
  --micro-batch-size 2 --global-batch-size 8 --train-iters 4 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine
  --lr-warmup-iters 1 --weight-decay 0.1 --clip-grad 1.0 --seed 1234
  --mock-data --tokenizer-type NullTokenizer --vocab-size 128 --data-cache-path "$LOGDIR/cache"
  --log-interval 1 --eval-interval 2 --eval-iters 1 --distributed-backend nccl
  --disable-bias-linear --swiglu --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 48
  --moe-router-score-function sigmoid
  --moe-router-enable-expert-bias --moe-router-bias-update-rate $RATE
  --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3 --moe-per-layer-logging)

run() {  # run NAME LAUNCHER... -- EXTRA ARGS
  local name=$1; shift
  run_pretrain_gpt "$name" 180 "$@"
  log_summary "$LOGDIR/$name.log" >"$LOGDIR/$name.sum"
}
# expert_bias CKPT_ITER_DIR: prints "layer e0 e1 e2 e3" (float32 values as exact decimals, repr)
# for each layer row of decoder.layers.mlp.router.expert_bias found in the checkpoint's safetensors
# shards; fails if the key is absent.
expert_bias() {
  python3 - "$1" <<'EOF'
import glob, json, os, struct, sys
rows = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], '**', '*.safetensors'), recursive=True)):
    with open(f, 'rb') as fh:
        n = struct.unpack('<Q', fh.read(8))[0]
        header = json.loads(fh.read(n))
        base = 8 + n
        for key, info in header.items():
            if key == '__metadata__' or not key.startswith('decoder.layers.mlp.router.expert_bias'): continue
            assert info['dtype'] == 'F32', (key, info['dtype'])
            b, e = info['data_offsets']
            fh.seek(base + b)
            vals = struct.unpack('<%df' % ((e - b) // 4), fh.read(e - b))
            meta = header.get('__metadata__', {})
            rows[key] = (vals, meta.get(key, ''))
if not rows: sys.exit('no decoder.layers.mlp.router.expert_bias in ' + sys.argv[1])
for key in sorted(rows):
    vals, meta = rows[key]
    print(key, meta, *(repr(v) for v in vals))
EOF
}

run single env -- --save "$LOGDIR/single_ckpt" --save-interval 4 --tensorboard-dir "$LOGDIR/single.tb"
expert_bias "$LOGDIR/single_ckpt/iter_0000004" >"$LOGDIR/single.bias" || fail "single: expert bias not in the checkpoint"
cat "$LOGDIR/single.bias"
python3 - "$LOGDIR/single.bias" "$RATE" <<'EOF' || fail "saved expert bias is not a sum of +-rate steps"
import struct, sys
rate = struct.unpack('f', struct.pack('f', float(sys.argv[2])))[0]
vals = [float(v) for line in open(sys.argv[1]) for v in line.split()[-4:]]
if len(vals) != 8: sys.exit('expected 2 MoE layers x 4 experts, got %d values' % len(vals))
for v in vals:
    k = round(v / rate)
    if abs(k) > 4 or abs(v - k * rate) > 4 * 2 ** -24 * 4 * rate: sys.exit('bias %r is not k * rate, |k| <= 4' % v)
if all(v == 0 for v in vals): sys.exit('expert bias never updated')
print('expert bias: 8 entries, each k * %g with |k| <= 4, not all zero' % rate)
EOF

run no_update env -- --moe-router-bias-update-rate 0
summaries_equal "$LOGDIR/single.sum" "$LOGDIR/no_update.sum" no_update 2>/dev/null \
  && fail "--moe-router-bias-update-rate 0 gave the same losses: the expert bias has no effect"

run dp2 "${MPIRUN[@]}" -np 2 -- --save "$LOGDIR/dp2_ckpt" --save-interval 4
run tp2_sp "${MPIRUN[@]}" -np 2 -- --tensor-model-parallel-size 2 --sequence-parallel --save "$LOGDIR/tp2_ckpt" --save-interval 4
for name in dp2 tp2_sp; do
  summaries_equal "$LOGDIR/single.sum" "$LOGDIR/$name.sum" $name \
    || { cat "$LOGDIR/single.sum" "$LOGDIR/$name.sum" >&2; fail "$name differs from the single-rank run"; }
done
expert_bias "$LOGDIR/dp2_ckpt/iter_0000004" >"$LOGDIR/dp2.bias" || fail "dp2: expert bias not in the checkpoint"
expert_bias "$LOGDIR/tp2_ckpt/iter_0000004" >"$LOGDIR/tp2_sp.bias" || fail "tp2_sp: expert bias not in the checkpoint"
for name in dp2 tp2_sp; do
  cmp -s "$LOGDIR/single.bias" "$LOGDIR/$name.bias" \
    || { cat "$LOGDIR/single.bias" "$LOGDIR/$name.bias" >&2; fail "$name: saved expert bias differs from the single-rank run"; }
  echo "$name: losses, grad norm and the saved expert bias equal the single-rank run"
done

# Resume: the expert bias comes back from the checkpoint (a fresh zero bias would route differently).
run first_half env -- --save "$LOGDIR/resume_ckpt" --save-interval 100 --exit-interval 2
run second_half env -- --load "$LOGDIR/resume_ckpt" --save "$LOGDIR/resume_ckpt" --save-interval 4
python3 "$SRC/tests/functional_tests/support/resumed_log.py" compare "$LOGDIR/single.log" "$LOGDIR/second_half.log" \
  --iterations 3-4 --fields 'consumed samples,learning rate,lm loss,grad norm' --name second_half \
  || fail "resumed iterations 3-4 differ from the straight run"
expert_bias "$LOGDIR/resume_ckpt/iter_0000004" >"$LOGDIR/resume.bias" || fail "resume: expert bias not in the checkpoint"
cmp -s "$LOGDIR/single.bias" "$LOGDIR/resume.bias" || fail "resumed run's final expert bias differs from the straight run"
echo "resume: iterations 3-4 (iteration 4: the mean of the straight run's 3 and 4) and the final expert bias (bit for bit) equal the straight run"

if command -v protoc >/dev/null && /usr/bin/python3 -c 'import google.protobuf' 2>/dev/null; then
  /usr/bin/python3 "$SRC/tests/reference/tensorboard/read_events.py" "$LOGDIR"/single.tb/events.out.tfevents.* \
    >"$LOGDIR/single.events" || fail "single: event file unreadable"
  python3 - "$LOGDIR/single.events" <<'EOF' || fail "per-layer MoE TensorBoard scalars wrong"
import re, sys
tb = {}
for line in open(sys.argv[1]):
    m = re.match(r'step (\d+) wall_time \S+ (\S+)=(\S+)$', line.strip())
    if m: tb.setdefault(m.group(2), {})[int(m.group(1))] = float(m.group(3))
for name in ('load_balancing_loss', 'z_loss'):
    for it in range(1, 5):
        layers = [tb.get('moe/%s_layer_%d' % (name, i), {}).get(it) for i in range(2)]
        agg = tb.get(name, {}).get(it)
        if None in layers or agg is None: sys.exit('%s at %d: per-layer %s, aggregate %s' % (name, it, layers, agg))
        if min(layers) <= 0: sys.exit('%s at %d: an MoE layer has %s' % (name, it, layers))
        if abs(sum(layers) / 2 - agg) > 1e-6 * agg: sys.exit('%s at %d: layers %s vs aggregate %g' % (name, it, layers, agg))
extra = sorted(t for t in tb if t.startswith('moe/') and not re.match(r'moe/(load_balancing_loss|z_loss)_layer_[01]$', t))
if extra: sys.exit('unexpected per-layer tags: %s' % extra)
print('TensorBoard: moe/<name>_layer_0..1 at every iteration, sum / 2 = the aggregate')
EOF
else
  echo "NOTE: per-layer TensorBoard tag check not run (protoc / python3-protobuf missing)"
fi
echo PASS
