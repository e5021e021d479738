#!/usr/bin/env bash
# Refactor invariant (docs/architecture.md, "Refactoring without changing behaviour"): runs a fixed
# set of tiny CPU trainings with dropout on and prints, per configuration, every iteration's printed
# lm loss and grad norm. A refactor must leave this output unchanged: lm loss within 3e-6 relative
# (the runs are deterministic on one machine; 3e-6 admits a last-bit change of a reordered fp32 sum),
# grad norm equal as printed.
#
#   tools/dev/refactor_invariant.sh record BIN OUT.txt      # write the summary
#   tools/dev/refactor_invariant.sh compare BIN BASE.txt    # run again and compare with BASE.txt
#
# BIN is the build's bin/ folder. This is a regression pin between two commits of this project on
# one machine (it says nothing about correctness: the oracles live in tests/). Not run by ctest:
# the pinned numbers depend on the CPU's OpenBLAS kernels.
set -euo pipefail
mode=$1 BIN=$2 FILE=$3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
MPIRUN=(mpirun --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS)
TMP=$(mktemp -d /tmp/refactor_invariant.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

GPT=(--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
  --attention-dropout 0.1 --hidden-dropout 0.1 --make-vocab-size-divisible-by 64
  --micro-batch-size 2 --global-batch-size 8 --train-iters 6 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine
  --lr-warmup-iters 2 --weight-decay 0.1 --clip-grad 1.0 --seed 1234
  --mock-data --tokenizer-type NullTokenizer --vocab-size 128 --data-cache-path "$TMP/cache"
  --log-interval 1 --eval-interval 3 --eval-iters 1)
LLAMA=(--swiglu --normalization RMSNorm --position-embedding-type rope --untie-embeddings-and-output-weights
  --disable-bias-linear --group-query-attention --num-query-groups 2 --ffn-hidden-size 96)

# name | ranks | extra flags
CONFIGS=(
  "gpt|1|"
  "llama|1|${LLAMA[*]}"
  "gpt_tp2|2|--tensor-model-parallel-size 2"
  "llama_tp2_sp|2|${LLAMA[*]} --tensor-model-parallel-size 2 --sequence-parallel"
  "gpt_pp2_vp2|2|--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2"
  "llama_dp2_distopt_overlap|2|${LLAMA[*]} --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather"
  "gpt_cp2|2|--context-parallel-size 2"
  "llama_cp2|2|${LLAMA[*]} --context-parallel-size 2"
  "llama_fp8|1|${LLAMA[*]} --bf16 --fp8-format hybrid --fp8-amax-history-len 4 --fp8-amax-compute-algo max"
  "gpt_bf16|1|--bf16"
  "llama_bf16_tp2|2|${LLAMA[*]} --bf16 --tensor-model-parallel-size 2"
  "gpt_recompute_full|1|--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
  "gpt_sgd|1|--optimizer sgd --sgd-momentum 0.9"
  "llama_decoupled_lr|1|${LLAMA[*]} --decoupled-lr 1e-2 --decoupled-min-lr 1e-3"
  "gpt_fp16|1|--fp16 --initial-loss-scale 4096 --accumulate-allreduce-grads-in-fp32"
  # Added when fp16 runs got Megatron's default fp16 gradient buffer (issue 20): pinned from then on.
  "gpt_fp16_param_dtype_grads|1|--fp16 --initial-loss-scale 4096"
)

summarize() {  # LOG NAME -> "NAME train ITER LOSS GRADNORM" / "NAME valid WHERE LOSS"
  python3 - "$1" "$2" <<'PY'
import re, sys
name = sys.argv[2]
for line in open(sys.argv[1]):
    m = re.search(r'\] iteration +(\d+)/ +\d+ \|.*lm loss: ([0-9.E+-]+) .*grad norm: ([0-9.E+-]+)', line)
    if m: print(name, 'train', *m.groups())
    m = re.search(r'validation loss at (.*) \| lm loss value: ([0-9.E+-]+)', line)
    if m: print(name, 'valid', m.group(1).replace(' ', '_'), m.group(2))
PY
}

out="$TMP/summary.txt"; : > "$out"
for c in "${CONFIGS[@]}"; do
  IFS='|' read -r name np extra <<<"$c"
  # shellcheck disable=SC2206
  flags=($extra)
  if [ "$np" = 1 ]; then launch=(); else launch=("${MPIRUN[@]}" -np "$np"); fi
  if ! timeout 300 "${launch[@]}" "$BIN/pretrain_gpt" "${GPT[@]}" "${flags[@]}" >"$TMP/$name.log" 2>&1; then
    tail -20 "$TMP/$name.log" >&2; echo "refactor_invariant: $name failed" >&2; exit 1
  fi
  n=$(summarize "$TMP/$name.log" "$name" | tee -a "$out" | grep -c ' train ' || true)
  [ "$n" = 6 ] || { echo "refactor_invariant: $name printed $n training lines (expected 6)" >&2; exit 1; }
done

if [ "$mode" = record ]; then cp "$out" "$FILE"; echo "refactor_invariant: recorded $(wc -l <"$out") lines in $FILE"; exit 0; fi
python3 - "$FILE" "$out" <<'PY'
import sys
base = [l.split() for l in open(sys.argv[1])]
got = [l.split() for l in open(sys.argv[2])]
bad = 0
if len(base) != len(got):
    print(f"refactor_invariant: {len(got)} lines vs {len(base)} in the baseline"); sys.exit(1)
worst = 0.0
for b, g in zip(base, got):
    if b[:3] != g[:3]:
        print("refactor_invariant: line differs:", g, "baseline:", b); bad += 1; continue
    if b[1] == 'train':
        lb, lg = float(b[3]), float(g[3])
        rel = abs(lb - lg) / max(abs(lb), 1e-30); worst = max(worst, rel)
        if rel > 3e-6 or b[4] != g[4]:
            print("refactor_invariant: differs:", ' '.join(g), "| baseline:", ' '.join(b)); bad += 1
    else:
        lb, lg = float(b[3]), float(g[3])
        rel = abs(lb - lg) / max(abs(lb), 1e-30); worst = max(worst, rel)
        if rel > 3e-6:
            print("refactor_invariant: differs:", ' '.join(g), "| baseline:", ' '.join(b)); bad += 1
print(f"refactor_invariant: {len(got)} lines compared, {bad} differ, largest lm-loss relative difference {worst:.3g}")
sys.exit(1 if bad else 0)
PY
