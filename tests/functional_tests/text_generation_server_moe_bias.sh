#!/usr/bin/env bash
# run_text_generation_server loads the routers' trained expert bias (--moe-router-enable-expert-bias,
# saved by pretrain_gpt under decoder.layers.mlp.router.expert_bias) as pretrain_gpt's --load does:
# a tiny MoE model (sigmoid top-2 of 4) is trained 3 iterations (odd: a bias oscillating by
# +-rate cannot end at zero) and saved; the checkpoint's bias is checked non-zero; generating with
# --moe-router-enable-expert-bias must give other log-probs than generating from the same
# checkpoint without it (the model then has no bias; > 1e-4 apart somewhere: the bias changes which
# experts a token uses, an O(1) change of that token's MLP output), and generating twice with it
# gives identical answers (so the difference is the bias, not noise). A server that drops the saved
# bias (keeping a fresh zero bias) answers as without the flag and fails here.
# Args: <bin dir> <source dir>
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/dist_common.inc"
set -eo pipefail
D=$LOGDIR
MODEL=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
  --attention-dropout 0.0 --hidden-dropout 0.0 --make-vocab-size-divisible-by 64 --disable-bias-linear --swiglu
  --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 48 --moe-router-score-function sigmoid
  --tokenizer-type NullTokenizer --vocab-size 128 --seed 1234)
BIAS=(--moe-router-enable-expert-bias --moe-router-bias-update-rate 0.01)
"$BIN/pretrain_gpt" "${MODEL[@]}" "${BIAS[@]}" --micro-batch-size 2 --global-batch-size 8 --train-iters 3 --lr 3e-3 \
  --mock-data --data-cache-path "$D/cache" --log-interval 1 --eval-iters 0 --save "$D/ck" --save-interval 3 \
  > "$D/train.log" 2>&1 || { tail -20 "$D/train.log"; fail "pretrain_gpt (MoE, expert bias) failed"; }
python3 - "$D/ck/iter_0000003" <<'PY' || fail "no non-zero expert bias in the checkpoint: the test would see nothing"
import glob, json, os, struct, sys
vals = []
for f in sorted(glob.glob(os.path.join(sys.argv[1], '*.safetensors'))):
    with open(f, 'rb') as fh:
        n = struct.unpack('<Q', fh.read(8))[0]
        for key, info in json.loads(fh.read(n)).items():
            if key.startswith('decoder.layers.mlp.router.expert_bias'):
                b, e = info['data_offsets']
                fh.seek(8 + n + b)
                vals += struct.unpack('<%df' % ((e - b) // 4), fh.read(e - b))
print('saved expert bias:', vals)
sys.exit(0 if any(v != 0 for v in vals) else 1)
PY
gen() {  # gen NAME [FLAGS...]
  local name=$1; shift
  "$BIN/run_text_generation_server" "${MODEL[@]}" "$@" --load "$D/ck" --prompts "1 2 3 4 5 6 7 8" "9 10 11" \
    --num-tokens-to-generate 8 > "$D/$name.log" 2>&1 || { cat "$D/$name.log"; fail "generation ($name) failed"; }
  grep -q "successfully loaded checkpoint" "$D/$name.log" || fail "$name: checkpoint not loaded"
  grep '^{"logprobs"' "$D/$name.log" | tail -1 > "$D/$name.json"
  [ -s "$D/$name.json" ] || { cat "$D/$name.log"; fail "$name: no answer"; }
}
gen trained "${BIAS[@]}"; gen again "${BIAS[@]}"; gen nobias
cmp -s "$D/trained.json" "$D/again.json" || fail "two generations from one checkpoint differ"
python3 - "$D/trained.json" "$D/nobias.json" <<'PY' || fail "the saved expert bias did not change generation: not loaded?"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
d = max(abs(x - y) for p, q in zip(a["logprobs"], b["logprobs"]) for x, y in zip(p, q))
print("max |log-prob difference| with vs without the expert bias: %.3g" % d)
sys.exit(0 if d > 1e-4 or a["tokens"] != b["tokens"] else 1)
PY
echo "PASS: the text generation server uses the trained expert bias"
