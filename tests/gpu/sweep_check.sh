#!/usr/bin/env bash
# Configuration sweep of GPU training (issues #7, #10): for each configuration a Megatron user could
# pass, a tiny model trains 6 steps with pretrain_gpt on the GPU and on the CPU, and the per-iteration
# losses are compared.
#   tests/gpu/sweep_check.sh BIN_DIR [config-name-regex]
# BIN_DIR: a CUDA build's bin dir (pretrain_gpt, megatron_launch). Writes ${OUT:-/tmp/out}/sweep/
# (table.md, results.tsv, one log per run: NAME.gpu.log, NAME.cpu.log). Needs 2 GPUs for the dist
# configurations (skipped with INFO on one). Prints PASS/FAIL/UNSUP per configuration; exit 1 on FAIL.
# < 150 s on 2 H200 (16+ cores): SWEEP_JOBS configurations at a time (default 8).
#
# The tiny model: 2 layers, hidden 64, 4 heads, seq 64, vocab 500, mbs 2, gbs 4, 6 steps, lr 1e-3,
# --init-method-std 0.05 (not 0.02: at 0.02 the logits are so small that on the mock data's tokens
# the attention path moves the loss by ~1e-5 and a GPU kernel ignoring e.g. --rotary-percent would
# pass; at 0.05 --rotary-percent 0.5 moves the first loss by 3.7e-3 and later ones by ~1e-2, while
# bf16 rounding moves the first by ~3e-5, measured on the CPU). Iteration 1 is the forward of the
# same initial weights on both devices (only rounding differs), so it is held to a tighter bound:
# 1e-3 (bf16), 2e-3 (fp8: an e4m3 rounding flip now and then), 5e-4 (fp16).
#
# Modes (what runs where, what is compared):
#  bf16   GPU --bf16 vs CPU fp32: every step's lm loss within 2e-2 relative (bf16 keeps 8 significant
#         bits; 5 spacings of 2^-8, as tests/gpu/run_gpu_tests.sh), grad norm within 5e-2 + 0.0011.
#  bf16e  GPU --bf16 vs CPU --bf16 (flags that need a 16-bit dtype): bf16 tolerances.
#  fp8    GPU --bf16 --fp8-format hybrid vs the same flags on the CPU (the FP8 emulation): loss 1e-2.
#  fp16   GPU --fp16 (dynamic loss scaling) vs the same flags on the CPU (fp16 emulation): loss 5e-3,
#         and the loss scale / skipped iterations equal.
#  drop   dropout 0.1 on the GPU (bf16; GPU and CPU RNG streams differ): every loss finite, no NaN
#         iteration, the last loss below the first.
#  dist   GPU bf16 on 2 ranks (megatron_launch --nproc-per-node 2; the 4th field's parallel flags) vs
#         the single-process CPU fp32 run: bf16 tolerance.
#  dist8 / dist16: the same with fp8 (vs the CPU emulation) / fp16 (vs CPU fp16) tolerances.
#  err    must fail with a one-line "error: ..." (exit 1) on both the GPU and the CPU: no crash, hang,
#         internal error.
# A mode ending in "?" may instead fail cleanly on the GPU (exit 1, one "error:" line; e.g. FP8 GEMM
# sizes not divisible by 16, which Transformer Engine rejects too, while the CPU emulation trains):
# UNSUP (reported, not failed). Everything else -- exit 2 (internal error), a signal, a
# timeout, NaN, a missing iteration, a loss outside tolerance -- is FAIL.
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
BIN="$(cd "${1:?usage: sweep_check.sh BIN_DIR [regex]}" && pwd)"
FILTER="${2:-.}"
OUTD="${OUT:-/tmp/out}/sweep"
mkdir -p "$OUTD"; rm -f "$OUTD"/*.log "$OUTD"/results.tsv "$OUTD"/table.md
W=$(mktemp -d "${TMPDIR:-/tmp}/sweep.XXXXXX"); trap 'rm -rf "$W"' EXIT
export NCCL_NVLS_ENABLE=0
. "$HERE/cuda_libs.sh"
JOBS=${SWEEP_JOBS:-8}
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
T0=$(date +%s)
ITERS=6

BASE="--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 1024
 --vocab-size 500 --micro-batch-size 2 --global-batch-size 4 --train-iters $ITERS --lr 1e-3 --min-lr 1e-4
 --lr-decay-style cosine --lr-warmup-iters 1 --clip-grad 1.0 --weight-decay 0.1 --seed 1234 --mock-data
 --tokenizer-type NullTokenizer --attention-dropout 0 --hidden-dropout 0 --log-interval 1 --eval-iters 0
 --init-method-std 0.05"
LL="--position-embedding-type rope --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear"
GQA="--group-query-attention --num-query-groups"
FP16="--fp16 --initial-loss-scale 65536 --loss-scale-window 3 --hysteresis 1 --min-loss-scale 1"
DROP="--attention-dropout 0.1 --hidden-dropout 0.1"

# name;mode;flags (both runs);parallel flags (dist: GPU run only)
CONFIGS="
hd32;bf16;--hidden-size 64 --num-attention-heads 2
hd64;bf16;--hidden-size 128 --num-attention-heads 2
hd80;bf16;--hidden-size 160 --num-attention-heads 2
hd96;bf16;$LL --hidden-size 192 --num-attention-heads 2
hd128;bf16;$LL --hidden-size 256 --num-attention-heads 2
hd256;bf16;$LL --hidden-size 512 --num-attention-heads 2
hd24_h72_heads3;bf16;--hidden-size 72 --num-attention-heads 3
hd40_h200_heads5;bf16;--hidden-size 200 --num-attention-heads 5
hd72;bf16;$LL --hidden-size 144 --num-attention-heads 2
hd100;bf16;--hidden-size 200 --num-attention-heads 2
hd160;bf16;$LL --hidden-size 320 --num-attention-heads 2
kvch32_h64;bf16;--hidden-size 64 --num-attention-heads 4 --kv-channels 32
kvch48_ll;bf16;$LL --hidden-size 128 --num-attention-heads 4 --kv-channels 48
heads1;bf16;--hidden-size 64 --num-attention-heads 1
mqa_g1;bf16;$LL --hidden-size 128 --num-attention-heads 4 $GQA 1
gqa_g2;bf16;$LL --hidden-size 128 --num-attention-heads 4 $GQA 2
gqa_g4;bf16;$LL --hidden-size 128 --num-attention-heads 4 $GQA 4
gqa_h6g3_hd40;bf16;$LL --hidden-size 240 --num-attention-heads 6 $GQA 3
seq1;bf16?;--seq-length 1
seq2;bf16;--seq-length 2
seq7_mbs3;bf16;--seq-length 7 --micro-batch-size 3 --global-batch-size 6
seq100_ll;bf16;$LL --seq-length 100
seq129;bf16;--seq-length 129 --micro-batch-size 3 --global-batch-size 3
seq257_ll;bf16;$LL --seq-length 257 --micro-batch-size 1 --global-batch-size 2
seq1000_ll;bf16;$LL --seq-length 1000 --micro-batch-size 1 --global-batch-size 2
ffn100;bf16;--ffn-hidden-size 100
ffn344_ll;bf16;$LL --hidden-size 128 --ffn-hidden-size 344
vocab503_div1;bf16;--vocab-size 503 --make-vocab-size-divisible-by 1
vocab1001_default;bf16;--vocab-size 1001
rope_pct05;bf16;$LL --rotary-percent 0.5
rope_base;bf16;$LL --rotary-base 500000
rope_scaling;bf16;$LL --use-rope-scaling --rotary-base 500000
rope_scaling_f32;bf16;$LL --use-rope-scaling --rope-scaling-factor 32
rope_interp;bf16;$LL --rotary-seq-len-interpolation-factor 2
rope_scaling_interp;bf16;$LL --use-rope-scaling --rotary-seq-len-interpolation-factor 4
rope_interleaved;bf16?;$LL --rotary-interleaved
pos_none;bf16;--position-embedding-type none
layernorm_1p;bf16;--apply-layernorm-1p
rmsnorm_1p;bf16;$LL --apply-layernorm-1p
swiglu_layernorm;bf16;--swiglu
qkv_bias;bf16;$LL --add-qkv-bias
qk_layernorm;bf16?;$LL --qk-layernorm
gpt_untied;bf16;--untie-embeddings-and-output-weights
gpt_no_bias;bf16;--disable-bias-linear
softmax_fp32;bf16;--attention-softmax-in-fp32
fp32_residual;bf16e;--fp32-residual-connection
openai_gelu;bf16;--openai-gelu --disable-bias-linear
init_std;bf16;$LL --init-method-std 0.02
squared_relu;bf16;--squared-relu --disable-bias-linear
squared_relu_bias;bf16;--squared-relu --no-bias-gelu-fusion
err_squared_relu_fused;err;--squared-relu
err_squared_relu_swiglu;err;$LL --squared-relu
post_ln_residual;bf16;--apply-residual-connection-post-layernorm
recompute_sel;bf16;$LL --recompute-granularity selective
recompute_full_uniform;bf16;--recompute-granularity full --recompute-method uniform --recompute-num-layers 1
recompute_full_block_ll;bf16;$LL --recompute-granularity full --recompute-method block --recompute-num-layers 1
fp16_gpt;fp16;$FP16
fp16_ll;fp16;$LL $FP16
fp16_hd80_seq100;fp16;$FP16 --hidden-size 160 --num-attention-heads 2 --seq-length 100
fp8_gpt;fp8;--hidden-size 128
fp8_ll;fp8;$LL --hidden-size 128 --ffn-hidden-size 352
fp8_h72;fp8?;--hidden-size 72 --num-attention-heads 3
fp8_ffn100;fp8?;$LL --hidden-size 128 --ffn-hidden-size 100
fp8_vocab503;fp8?;--hidden-size 128 --vocab-size 503 --make-vocab-size-divisible-by 1
fp8_seq7_mbs3;fp8?;--hidden-size 128 --seq-length 7 --micro-batch-size 3 --global-batch-size 6
fp8_tensorwise;fp8;$LL --hidden-size 128 --fp8-recipe tensorwise
fp8_no_wgrad;fp8;$LL --hidden-size 128 --no-fp8-wgrad
fp8_squared_relu;fp8;--hidden-size 128 --squared-relu --disable-bias-linear
fp8_recompute;fp8;$LL --hidden-size 128 --recompute-granularity selective
dropout_gpt;drop;$DROP
dropout_ll;drop;$LL $DROP
err_heads;err;--hidden-size 72 --num-attention-heads 5
err_seq_gt_maxpos;err;--seq-length 2048
err_gqa_groups;err;$LL --num-attention-heads 4 $GQA 3
tp2;dist;$LL --hidden-size 128;--tensor-model-parallel-size 2
tp2_sp;dist;$LL --hidden-size 128;--tensor-model-parallel-size 2 --sequence-parallel
tp2_gpt_vocab503;dist;--hidden-size 128 --vocab-size 503 --make-vocab-size-divisible-by 2;--tensor-model-parallel-size 2
cp2;dist;$LL --hidden-size 128;--context-parallel-size 2
cp2_seq100;dist?;$LL --hidden-size 128 --seq-length 100;--context-parallel-size 2
pp2;dist;$LL --hidden-size 128;--pipeline-model-parallel-size 2
pp2_gpt;dist;--hidden-size 128;--pipeline-model-parallel-size 2
dp2_distopt;dist;$LL --hidden-size 128;--use-distributed-optimizer
hd256_seq1000;bf16;$LL --hidden-size 512 --num-attention-heads 2 --seq-length 1000 --micro-batch-size 1 --global-batch-size 1
gqa_hd80_seq129_mbs3;bf16;$LL --hidden-size 320 --num-attention-heads 4 $GQA 2 --seq-length 129 --micro-batch-size 3 --global-batch-size 3
layers1;bf16;--num-layers 1
attn_unfused;bf16?;$LL --attention-backend unfused
attn_local;bf16?;$LL --transformer-impl local
deterministic;bf16;$LL --deterministic-mode
per_token_loss;bf16;$LL --calculate-per-token-loss
fp16_static;fp16;--fp16 --loss-scale 4096
fp16_recompute_full;fp16;$LL $FP16 --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
fp8_e4m3;fp8;$LL --hidden-size 128 --fp8-format e4m3
fp8_amax_hist;fp8;$LL --hidden-size 128 --fp8-amax-history-len 16 --fp8-amax-compute-algo max
tp2_fp8;dist8?;$LL --hidden-size 128;--tensor-model-parallel-size 2
tp2_sp_seq7;dist?;$LL --hidden-size 128 --seq-length 7;--tensor-model-parallel-size 2 --sequence-parallel
pp2_3layers;dist?;$LL --hidden-size 128 --num-layers 3;--pipeline-model-parallel-size 2
tp2_fp16;dist16?;$FP16 --hidden-size 128;--tensor-model-parallel-size 2
sgd;bf16;--optimizer sgd --lr 0.05 --min-lr 0.005
no_clip_no_wd;bf16;$LL --clip-grad 0 --weight-decay 0
decoupled_lr;bf16;$LL --decoupled-lr 3e-3
eval_logging;bf16;--eval-iters 2 --eval-interval 3 --log-params-norm --log-num-zeros-in-grad --empty-unused-memory-level 1
dp2_overlap;dist;$LL --hidden-size 128;--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
dp2_grad_bf16;dist;$LL --hidden-size 128;--grad-reduce-in-bf16
pp2_vpp;dist?;$LL --hidden-size 128 --num-layers 4;--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1
pp2_uneven;dist?;$LL --hidden-size 128 --num-layers 3;--pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 1
pp2_fp16;dist16;$FP16 --hidden-size 128;--pipeline-model-parallel-size 2
dp2_fp8_param_gather;dist8?;$LL --hidden-size 128;--use-distributed-optimizer --fp8-param-gather
pp2_fp8_h72;dist8?;--hidden-size 72 --num-attention-heads 3;--pipeline-model-parallel-size 2
tp2_mqa;err;$LL --hidden-size 128 $GQA 1 --tensor-model-parallel-size 2
"

NCORES=$(nproc 2>/dev/null || echo 8)
THR=$(( NCORES / JOBS > 1 ? NCORES / JOBS : 1 ))
export OMP_NUM_THREADS=$THR OPENBLAS_NUM_THREADS=$THR
PORT=$(( 29100 + RANDOM % 400 ))

# judge NAME MODE: compares NAME.gpu.log with NAME.cpu.log; appends a row to results.tsv
judge() {
  python3 - "$OUTD" "$1" "$2" "$ITERS" <<'EOF'
import math, re, sys
outd, name, mode, iters = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
LINE = re.compile(r"\] iteration +(\d+)/ *(\d+) \|")
def field(l, k):
    i = l.find(k)
    return None if i < 0 else l[i + len(k):].split("|", 1)[0].strip()
def load(tag):
    try:
        txt = open(f"{outd}/{name}.{tag}.log", errors="replace").read()
    except OSError:
        return None
    rc = re.findall(r"^SWEEP_RC=(\d+)", txt, re.M)
    rc = int(rc[-1]) if rc else -1
    rows = {}
    for l in txt.splitlines():
        m = LINE.search(l)
        if m:
            f = lambda k: (lambda s: None if s is None else float(s))(field(l, k))
            rows[int(m.group(1))] = dict(loss=f("lm loss:"), gn=f("grad norm:"), scale=field(l, "loss scale:"),
                                         nan=int(field(l, "number of nan iterations:") or 0),
                                         skip=int(field(l, "number of skipped iterations:") or 0))
    errs = [l.strip() for l in txt.splitlines() if re.match(r"^\s*(\[rank\d+\]\s*)?(error|internal error|terminate|what\(\)|Segmentation|Aborted|CUDA error|.*NCCL.*[Ee]rror)", l)]
    return dict(rc=rc, rows=rows, err=errs[0][:200] if errs else "", txt=txt)
def clean_error(r):
    return r is not None and r["rc"] == 1 and r["err"].lstrip("[rank0123] ").startswith("error:") \
        and "internal error" not in r["txt"] and "terminate called" not in r["txt"]
def bad(r):  # why a run that should have trained did not, or None
    if r is None: return "no log"
    if r["rc"] == 124 or r["rc"] == 137: return "timeout (hang?)"
    if r["rc"] != 0: return f"exit {r['rc']}: {r['err']}"
    if len(r["rows"]) != iters: return f"{len(r['rows'])}/{iters} iterations"
    for it, v in r["rows"].items():
        if v["nan"]: return f"nan iteration at {it}"
        if v["loss"] is not None and not math.isfinite(v["loss"]): return f"loss {v['loss']} at {it}"
    return None
g, c = load("gpu"), load("cpu")
base = mode.rstrip("?")
status, diff, note = "FAIL", "", ""
if base == "err":
    ok = [clean_error(r) for r in (g, c)]
    status = "PASS" if all(ok) else "FAIL"
    note = (g or {}).get("err") or "(no error)"
    if not ok[1]: note += f" | cpu: rc {c and c['rc']} {c and c['err']}"
elif mode.endswith("?") and clean_error(g):
    status, note = "UNSUP", g["err"] + ("" if clean_error(c) else " (GPU only: the CPU run trains)")
elif bad(g):
    note = "gpu " + bad(g)
    if clean_error(g) and not clean_error(c): note += " (CPU trains: GPU-only limitation)"
elif base == "drop":
    ls = [g["rows"][i]["loss"] for i in sorted(g["rows"])]
    status = "PASS" if ls[-1] < ls[0] else "FAIL"
    note = f"losses {ls[0]:.4f} -> {ls[-1]:.4f} (dropout 0.1, finite)"
elif bad(c):
    note = "cpu " + bad(c)
else:
    tol = {"bf16e": 2e-2, "bf16": 2e-2, "dist": 2e-2, "fp8": 1e-2, "dist8": 1e-2, "fp16": 5e-3, "dist16": 5e-3}[base]
    tol1 = {"bf16e": 1e-3, "bf16": 1e-3, "dist": 1e-3, "fp8": 2e-3, "dist8": 2e-3, "fp16": 5e-4, "dist16": 5e-4}[base]
    d1 = None
    gtol = {"bf16e": 5e-2, "bf16": 5e-2, "dist": 5e-2, "fp8": 1e-1, "dist8": 1e-1, "fp16": 2e-2, "dist16": 2e-2}[base]
    md, mg, msgs = 0.0, 0.0, []
    for it in sorted(c["rows"]):
        a, b = g["rows"][it], c["rows"][it]
        if base in ("fp16", "dist16") and (a["scale"] != b["scale"] or a["skip"] != b["skip"]):
            msgs.append(f"it {it}: loss scale/skip {a['scale']}/{a['skip']} vs {b['scale']}/{b['skip']}")
        if a["loss"] is None or b["loss"] is None:
            if (a["loss"] is None) != (b["loss"] is None): msgs.append(f"it {it}: loss printed in one run only")
            continue
        d = abs(a["loss"] - b["loss"]) / abs(b["loss"])
        md = max(md, d)
        if it == 1:
            d1 = d
            if d > tol1: msgs.append(f"iteration 1 (forward of the same initial weights) loss diff {d:.2e} > {tol1:g}")
        if a["gn"] is not None and b["gn"] is not None:
            mg = max(mg, abs(a["gn"] - b["gn"]) / max(abs(b["gn"]), 1e-9))
            if abs(a["gn"] - b["gn"]) > gtol * abs(b["gn"]) + 0.0011: msgs.append(f"it {it}: grad norm {a['gn']} vs {b['gn']}")
    diff = f"{md:.2e}" + ("" if d1 is None else f" (it1 {d1:.1e})")
    if md > tol: msgs.insert(0, f"loss diff {md:.2e} > {tol:g}")
    status = "FAIL" if msgs else "PASS"
    note = "; ".join(msgs[:3]) if msgs else f"tol {tol:g}, max grad-norm diff {mg:.2e}, final loss {g['rows'][iters]['loss']:.4f} vs {c['rows'][iters]['loss']:.4f}"
print(f"{name}\t{mode}\t{status}\t{diff}\t{note}")
EOF
}

# one NAME MODE FLAGS PFLAGS GPU: runs the GPU and CPU runs of one configuration, then judges
one() {
  local name=$1 mode=$2 flags=$3 pflags=$4 gpu=$5 base=${2%\?}
  local gflags="$BASE $flags --data-cache-path $W/c_$name" cflags="$BASE $flags --data-cache-path $W/c_${name}_cpu"
  case $base in
    bf16|drop|dist) gflags+=" --bf16";;
    bf16e) gflags+=" --bf16"; cflags+=" --bf16";;
    fp8|dist8) [[ "$flags" == *fp8-format* ]] && { gflags+=" --bf16"; cflags+=" --bf16"; } ||
         { gflags+=" --bf16 --fp8-format hybrid"; cflags+=" --bf16 --fp8-format hybrid"; };;
  esac
  [ $base = drop ] && cflags+=" --train-iters 1"  # the CPU run only has to start: not compared
  if [[ $base == dist* ]] || [[ " $flags " == *tensor-model-parallel-size* ]]; then
    # shellcheck disable=SC2086
    ( timeout -k 5 80 "$BIN/megatron_launch" --nproc-per-node 2 --master-port $(( PORT + gpu )) \
        "$BIN/pretrain_gpt" $gflags $pflags; echo "SWEEP_RC=$?" ) > "$OUTD/$name.gpu.log" 2>&1 &
  else
    # shellcheck disable=SC2086
    ( CUDA_VISIBLE_DEVICES=$gpu timeout -k 5 60 "$BIN/pretrain_gpt" $gflags; echo "SWEEP_RC=$?" ) \
      > "$OUTD/$name.gpu.log" 2>&1 &
  fi
  # shellcheck disable=SC2086
  ( MEGATRON_DEVICE=cpu timeout -k 5 80 "$BIN/pretrain_gpt" $cflags; echo "SWEEP_RC=$?" ) > "$OUTD/$name.cpu.log" 2>&1
  wait
  local row; row=$(judge "$name" "$mode")
  echo "$row" >> "$OUTD/results.tsv"
  echo "$row" | awk -F'\t' '{printf "%s %s (%s): %s %s\n", $3, $1, $2, ($4 == "" ? "" : "max loss diff " $4 ","), $5}'
}

echo "sweep_check: bin $BIN, $NGPU GPU(s), $NCORES cores, $JOBS at a time, $THR CPU threads per run, logs $OUTD"
i=0
while IFS=';' read -r name mode flags pflags; do
  [ -z "$name" ] && continue
  [[ "$name" =~ $FILTER ]] || continue
  if [ "$NGPU" -lt 2 ] && { [[ "$mode" == dist* ]] || [[ "$name" == tp2* ]]; }; then
    echo "INFO $name: needs 2 GPUs"; continue; fi
  one "$name" "$mode" "$flags" "${pflags:-}" $(( i % (NGPU > 0 ? NGPU : 1) )) &
  i=$(( i + 1 ))
  PORT=$(( PORT + 2 ))
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do sleep 0.2; done
done <<< "$CONFIGS"
wait

{
  echo "| config | mode | status | max loss diff | note / error line |"
  echo "|---|---|---|---|---|"
  sort "$OUTD/results.tsv" | awk -F'\t' '{gsub(/\|/, "\\|", $5); printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5}'
} > "$OUTD/table.md"
NP=$(grep -c $'\tPASS\t' "$OUTD/results.tsv"); NF=$(grep -c $'\tFAIL\t' "$OUTD/results.tsv"); NU=$(grep -c $'\tUNSUP\t' "$OUTD/results.tsv")
echo "sweep_check: $NP PASS, $NF FAIL, $NU UNSUP in $(( $(date +%s) - T0 )) s (table: $OUTD/table.md)"
[ "$NF" = 0 ]
