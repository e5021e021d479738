#!/usr/bin/env bash
# Oracle for torch_dist checkpoints (issue 25) against Megatron-LM itself. Run on the GPU machine
# (torch, no network) from the repository root, with Megatron-LM copied into the ignored folder
# .oracle/Megatron-LM:
#
#   tests/gpu/torch_dist_oracle.sh BIN_DIR [gpt|llama|all]
#
# BIN_DIR: our build's bin folder (pretrain_gpt, megatron_launch). For each model (tiny GPT,
# tiny LLaMA; fp32, dropout 0, constant LR, Megatron's local spec --transformer-impl local):
#  (a) Megatron trains on mock data (NullTokenizer) with --train-iters 10 --exit-interval 5 (so the
#      LR schedule of the saved run is the one of the resumed run) and saves --ckpt-format
#      torch_dist at iteration 5 (with --use-distributed-optimizer --dist-ckpt-optim-fully-reshardable
#      in the DP2 layout), then continues from its own checkpoint to iteration 10;
#  (b) we --load that checkpoint on the CPU in TP1, TP2, PP2 and DP2 + distributed optimizer and
#      continue to iteration 10: lm loss of iteration 6 within 1e-5 relative of Megatron's, 7..10
#      within 1e-4 (fp32; the layouts differ only in reduction order);
#  (c) we train (TP2, the same --train-iters 10 --exit-interval 5) and save --ckpt-format
#      torch_dist; Megatron --load's it with its optimizer (Adam moments, param groups, step,
#      scheduler; --no-load-rng: the RNG streams are not Megatron's, and dropout is 0) and
#      continues (once as written, once without common.pt so that it reads our "common_state"
#      object); we continue from the same checkpoint with the same flags; same tolerances.
# Every leg runs even when an earlier one fails; each failure is reported.
# Megatron's layouts: TP1 with one GPU; TP2, PP2 and DP2 + distributed optimizer (torchrun, one
# rank per GPU) when 2 GPUs are visible. Exit status 0 only if every comparison holds; the
# per-iteration losses and the key list of Megatron's .metadata are printed for the report.
set -uo pipefail
BIN=${1:?usage: tests/gpu/torch_dist_oracle.sh BIN_DIR [gpt|llama|all]}
WHICH=${2:-all}
BIN=$(cd "$BIN" && pwd)
REPO=$(pwd)
MLM=$REPO/.oracle/Megatron-LM
[[ -f $MLM/pretrain_gpt.py ]] || { echo "error: $MLM/pretrain_gpt.py missing: copy Megatron-LM to .oracle/Megatron-LM"; exit 2; }
OUT=${ORACLE_OUT:-$(mktemp -d /tmp/td_oracle.XXXXXX)}
mkdir -p "$OUT"
echo "work dir: $OUT"
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
export CUDA_DEVICE_MAX_CONNECTIONS=1 PYTHONPATH=$MLM${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=2
FAILS=0

COMMON=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64
        --micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --min-lr 1e-3 --lr-decay-style constant
        --weight-decay 0.01 --clip-grad 1.0 --seed 1234 --init-method-std 0.02
        --attention-dropout 0 --hidden-dropout 0 --mock-data --tokenizer-type NullTokenizer --vocab-size 127
        --make-vocab-size-divisible-by 64 --log-interval 1 --eval-interval 1000 --eval-iters 0
        --no-bias-gelu-fusion --save-interval 5 --ckpt-format torch_dist)
GPT=()
LLAMA=(--swiglu --normalization RMSNorm --position-embedding-type rope --disable-bias-linear
       --untie-embeddings-and-output-weights --group-query-attention --num-query-groups 2)
# Megatron without Transformer Engine / apex: the local spec and unfused kernels.
MEGATRON_ONLY=(--transformer-impl local --attention-backend unfused --no-gradient-accumulation-fusion
               --no-masked-softmax-fusion --no-bias-dropout-fusion --no-rope-fusion --no-persist-layer-norm
               --distributed-backend nccl --data-cache-path "$OUT/mcache")
OURS_ONLY=(--data-cache-path "$OUT/ocache")

megatron() {  # $1 log, $2 nproc, rest: flags
  local log=$1 np=$2
  shift 2
  (cd "$MLM" && torchrun --nproc-per-node "$np" --master-port $((29500 + RANDOM % 1000)) pretrain_gpt.py \
     "${COMMON[@]}" "${MEGATRON_ONLY[@]}" "$@") > "$log" 2>&1
}
ours() {  # $1 log, $2 nproc, rest: flags (CPU)
  local log=$1 np=$2
  shift 2
  if [[ $np == 1 ]]; then
    MEGATRON_DEVICE=cpu "$BIN/pretrain_gpt" "${COMMON[@]}" "${OURS_ONLY[@]}" "$@" > "$log" 2>&1
  else
    MEGATRON_DEVICE=cpu "$BIN/megatron_launch" --nproc-per-node "$np" "$BIN/pretrain_gpt" "${COMMON[@]}" "${OURS_ONLY[@]}" \
      --distributed-backend gloo "$@" > "$log" 2>&1
  fi
}
losses() { grep -o ' iteration *[0-9]*/ *[0-9]* .*lm loss: [0-9.E+-]*' "$1" | sed 's/ iteration *\([0-9]*\)\/.*lm loss: \([0-9.E+-]*\)/\1 \2/'; }
compare() {  # $1 reference log, $2 log, $3 label
  python3 - "$1" "$2" "$3" <<'PY'
import re, sys
def losses(p):
    out = {}
    for line in open(p, errors='replace'):
        m = re.search(r' iteration +(\d+)/ *\d+ .*lm loss: ([0-9.E+-]+)', line)
        if m: out[int(m.group(1))] = float(m.group(2))
    return out
a, b = losses(sys.argv[1]), losses(sys.argv[2])
bad = 0
for it in range(6, 11):
    if it not in a or it not in b:
        print(f'{sys.argv[3]}: iteration {it} missing (reference {it in a}, run {it in b})'); bad = 1; continue
    rel = abs(a[it] - b[it]) / abs(a[it])
    tol = 1e-5 if it == 6 else 1e-4
    ok = rel <= tol
    bad |= not ok
    print(f'{sys.argv[3]}: iteration {it}: reference {a[it]:.6E} ours {b[it]:.6E} rel {rel:.2e} (tol {tol:g}) {"ok" if ok else "FAIL"}')
sys.exit(bad)
PY
}
check() { if ! "$@"; then FAILS=$((FAILS + 1)); fi; }
dump_keys() {  # the DCP key list of a checkpoint (for the report)
  python3 - "$1" <<'PY'
import pickle, sys
sys.path.insert(0, '.oracle/Megatron-LM')
import torch  # noqa: F401  (the metadata classes)
md = pickle.load(open(sys.argv[1] + '/.metadata', 'rb'))
for k, v in sorted(md.state_dict_metadata.items()):
    print(' ', k, getattr(v, 'size', 'bytes'))
PY
}

run_model() {
  local name=$1
  shift
  local arch=("$@")
  local layouts=("tp1:1:")
  if (( NGPU >= 2 )); then
    layouts+=("tp2:2:--tensor-model-parallel-size 2" "pp2:2:--pipeline-model-parallel-size 2"
              "dp2do:2:--use-distributed-optimizer --dist-ckpt-optim-fully-reshardable")
  fi
  for lay in "${layouts[@]}"; do
    IFS=: read -r lname lnp lflags <<< "$lay"
    local d=$OUT/$name-$lname
    rm -rf "$d"
    mkdir -p "$d"
    echo "== $name, Megatron layout $lname"
    # (a) Megatron: iterations 1..5 of a 10-iteration run + save, then continue from its own
    # checkpoint to 10.
    # (--exit-interval leaves through sys.exit: the checkpoint decides, not the exit status.)
    megatron "$d/m5.log" "$lnp" "${arch[@]}" $lflags --train-iters 10 --exit-interval 5 --save "$d/mckpt" ||
      echo "note: Megatron's 5-iteration run exited with a non-zero status"
    [[ -f $d/mckpt/iter_0000005/.metadata ]] ||
      { echo "Megatron wrote no checkpoint at iteration 5: tail of $d/m5.log"; tail -20 "$d/m5.log"; FAILS=$((FAILS + 1)); continue; }
    megatron "$d/m10.log" "$lnp" "${arch[@]}" $lflags --train-iters 10 --load "$d/mckpt" --save "$d/mckpt_cont" ||
      { echo "Megatron resume failed: tail of $d/m10.log"; tail -20 "$d/m10.log"; FAILS=$((FAILS + 1)); }
    [[ $lname == tp1 ]] && { echo "Megatron's torch_dist keys ($name):"; dump_keys "$d/mckpt/iter_0000005"; }
    # (b) we continue from Megatron's checkpoint in several layouts (CPU).
    local optflag=
    [[ $lname == dp2do ]] && optflag=--use-distributed-optimizer
    for ol in "tp1:1:$optflag" "tp2:2:--tensor-model-parallel-size 2 $optflag" "pp2:2:--pipeline-model-parallel-size 2 $optflag" \
              "dp2do:2:--use-distributed-optimizer"; do
      IFS=: read -r oname onp oflags <<< "$ol"
      if ! ours "$d/o_$oname.log" "$onp" "${arch[@]}" $oflags --train-iters 10 --load "$d/mckpt" --save "$d/o_$oname"; then
        echo "our resume ($oname) from Megatron's checkpoint failed:"; grep -m3 '^error' "$d/o_$oname.log" || tail -5 "$d/o_$oname.log"
        FAILS=$((FAILS + 1)); continue
      fi
      check compare "$d/m10.log" "$d/o_$oname.log" "$name Megatron-$lname -> ours-$oname"
    done
  done
  # (c) we save torch_dist, Megatron continues (TP1 on one GPU; our save in TP2 when possible).
  local d=$OUT/$name-ours
  rm -rf "$d"
  mkdir -p "$d"
  echo "== $name, our torch_dist checkpoint -> Megatron"
  ours "$d/o5.log" 2 "${arch[@]}" --tensor-model-parallel-size 2 --train-iters 10 --exit-interval 5 --save "$d/ockpt"
  [[ -f $d/ockpt/iter_0000005/.metadata ]] ||
    { echo "our training failed:"; grep -m3 '^error' "$d/o5.log"; FAILS=$((FAILS + 1)); return; }
  [[ $name == gpt ]] && { echo "our torch_dist keys ($name):"; dump_keys "$d/ockpt/iter_0000005"; }
  ours "$d/o10.log" 1 "${arch[@]}" --train-iters 10 --load "$d/ockpt" --save "$d/ockpt_cont" --no-load-rng ||
    { echo "our resume failed:"; grep -m3 '^error' "$d/o10.log"; FAILS=$((FAILS + 1)); }
  if megatron "$d/m10.log" 1 "${arch[@]}" --train-iters 10 --load "$d/ockpt" --save "$d/mckpt_cont" --no-load-rng; then
    check compare "$d/o10.log" "$d/m10.log" "$name ours-tp2 -> Megatron-tp1"
  else
    echo "Megatron could not load our checkpoint: tail of $d/m10.log"; tail -25 "$d/m10.log"; FAILS=$((FAILS + 1))
  fi
  # The same without common.pt: Megatron reads its current layout, our "common_state" object.
  cp -r "$d/ockpt" "$d/ockpt_obj" && rm "$d/ockpt_obj/iter_0000005/common.pt"
  if megatron "$d/m10_obj.log" 1 "${arch[@]}" --train-iters 10 --load "$d/ockpt_obj" --save "$d/mckpt_cont_obj" --no-load-rng; then
    check compare "$d/o10.log" "$d/m10_obj.log" "$name ours-tp2 (common_state object) -> Megatron-tp1"
  else
    echo "Megatron could not load our checkpoint without common.pt: tail of $d/m10_obj.log"; tail -25 "$d/m10_obj.log"
    FAILS=$((FAILS + 1))
  fi
}

[[ $WHICH == all || $WHICH == gpt ]] && run_model gpt "${GPT[@]}"
[[ $WHICH == all || $WHICH == llama ]] && run_model llama "${LLAMA[@]}"
if (( FAILS )); then echo "FAIL: $FAILS comparison(s) or run(s) failed (logs in $OUT)"; exit 1; fi
echo "PASS: torch_dist oracle (logs in $OUT)"
