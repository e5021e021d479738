#!/usr/bin/env bash
# MoE expert parallelism in pretrain_gpt on the NCCL backend, two GPUs (H200), < 2 min.
#   tests/gpu/moe_ep_nccl_check.sh BIN_DIR   (a CUDA build's bin with pretrain_gpt and megatron_launch)
# Results and logs go to ${OUT:-/tmp/out}/moe_ep/. PASS/FAIL/INFO lines; exit 1 on any FAIL.
#
# What: the expert-parallel training path (docs/moe.md "Expert parallelism in training": the
# experts' own buffer reduced over expt-dp, the distributed optimizer sharding it, the grad norm
# as Megatron's ChainedOptimizer) on CUDA tensors and NCCL, where the CPU tests
# (functional.pretrain_gpt_moe, functional.ckpt_moe_resharding) run MPI and TCP.
# A tiny fp32 MoE GPT (2 layers, layer 0 dense, 4 SwiGLU experts top-2, aux + z loss, a shared
# expert), 10 iterations, --deterministic-mode, dropout 0, mock data, validation after 5 and 10:
# one GPU (reference) vs two GPUs with EP2, EP2 + --use-distributed-optimizer, expert-TP2 (TP1)
# and EP2 --moe-token-dispatcher-type alltoall; then an EP2 checkpoint at iteration 5 loaded on
# one GPU (iterations 6..10). Every printed lm loss / validation loss within 1e-5 relative of the
# reference (fp32; the layouts change only summation order, ~1e-7; a wrong expert gradient scale
# or a lost expert shows as >= 1e-4 by iteration 10) and the grad norm within 2e-3 absolute
# (printed with 3 decimals).
# MOEEP_CPU=1: the same on the CPU (gloo/TCP backend): a dry run of this script.
set -u
BIN=${1:?usage: tests/gpu/moe_ep_nccl_check.sh BIN_DIR}
BIN=$(cd "$BIN" && pwd)
OUTD=${OUT:-/tmp/out}/moe_ep
rm -rf "$OUTD"; mkdir -p "$OUTD"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
unset CUDA_VISIBLE_DEVICES
status=0
if [ "${MOEEP_CPU:-0}" = 1 ]; then
  export MEGATRON_DEVICE=cpu OMP_NUM_THREADS=1; BACKEND=gloo
  echo "INFO MOEEP_CPU=1: on the CPU (dry run of the script)"
else
  export MEGATRON_DEVICE=cuda; BACKEND=nccl
  source "$(dirname "$0")/cuda_libs.sh"
  ngpu=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)
  if [ "$ngpu" -lt 2 ]; then echo "FAIL moe_ep needs 2 GPUs, found $ngpu"; exit 1; fi
fi
ARGS=(--num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64
  --attention-dropout 0.0 --hidden-dropout 0.0 --micro-batch-size 2 --global-batch-size 8 --train-iters 10
  --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters 2 --clip-grad 1.0 --weight-decay 0.1
  --seed 1234 --mock-data --tokenizer-type NullTokenizer --vocab-size 256 --data-cache-path "$OUTD/cache"
  --log-interval 1 --eval-interval 5 --eval-iters 1 --deterministic-mode --distributed-backend "$BACKEND"
  --disable-bias-linear --swiglu --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 96
  --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3 --moe-layer-freq '([0]+[1])'
  --moe-shared-expert-intermediate-size 64)
port=29781
run() {  # run NAME NPROC ARGS...
  local name=$1 np=$2; shift 2
  port=$((port + 1))
  if ! timeout 120 "$BIN/megatron_launch" --nproc-per-node "$np" --master-port $port "$BIN/pretrain_gpt" "${ARGS[@]}" "$@" \
    >"$OUTD/$name.log" 2>&1; then
    echo "FAIL $name exited with an error (see $OUTD/$name.log)"; tail -5 "$OUTD/$name.log"; status=1; return 1
  fi
}
compare() {  # compare NAME REF [FIRST_ITERATION]
  python3 - "$OUTD/$1.log" "$OUTD/$2.log" "$1" "${3:-1}" <<'EOF' || status=1
import re, sys
def parse(path, first):
    it, va = {}, []
    for line in open(path):
        m = re.search(r'\] iteration +(\d+)/.*lm loss: ([0-9.E+-]+) .*grad norm: ([0-9.]+)', line)
        if m and int(m.group(1)) >= first: it[int(m.group(1))] = (float(m.group(2)), float(m.group(3)))
        m = re.search(r'validation loss at iteration (\d+) .*lm loss value: ([0-9.E+-]+)', line)
        if m and int(m.group(1)) >= first: va.append(float(m.group(2)))
    return it, va
first = int(sys.argv[4])
(g, gv), (r, rv) = parse(sys.argv[1], first), parse(sys.argv[2], first)
name = sys.argv[3]
if not g or sorted(g) != sorted(r) or len(gv) != len(rv) or not gv:
    print('FAIL %s: iterations %s / %d validation losses vs reference %s / %d' % (name, sorted(g), len(gv), sorted(r), len(rv))); sys.exit(1)
worst = max([abs(g[i][0] - r[i][0]) / abs(r[i][0]) for i in r] + [abs(a - b) / abs(b) for a, b in zip(gv, rv)])
gn = max(abs(g[i][1] - r[i][1]) for i in r)
ok = worst <= 1e-5 and gn <= 2e-3
print('%s %s: worst lm-loss relative difference %.2e, grad norm %.3f (iterations %d-%d)' % ('PASS' if ok else 'FAIL', name, worst, gn, min(r), max(r)))
sys.exit(0 if ok else 1)
EOF
}
run ref 1 --save "$OUTD/ref_ckpt" --save-interval 5 || exit 1
run ep2 2 --expert-model-parallel-size 2 --save "$OUTD/ep2_ckpt" --save-interval 5 && compare ep2 ref
run ep2_distopt 2 --expert-model-parallel-size 2 --use-distributed-optimizer && compare ep2_distopt ref
run etp2 2 --expert-tensor-parallel-size 2 && compare etp2 ref
run ep2_a2a 2 --expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall && compare ep2_a2a ref
run ep2_to_1gpu 1 --load "$OUTD/ep2_ckpt" --ckpt-step 5 && compare ep2_to_1gpu ref 6
exit $status
