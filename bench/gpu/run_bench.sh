#!/usr/bin/env bash
# Benchmark driver for the GPU machine: runs one suite and appends its figures, one row per figure,
# to $RESULTS (default $OUT/results.csv) through bench/append_result.py. Merge the rows into
# bench/results.csv with `tail -n +2 $OUT/results.csv >> bench/results.csv` (docs/performance.md,
# "Results file"). Each row of bench/results.csv names the suite and command that produced it.
#
#   bench/gpu/run_bench.sh SUITE BIN_DIR [ARGS...]
#
# SUITE
#   kernels        gpu_bench (all groups) beside bench/gpu/torch_peers.py (the peer)    1 GPU
#   kernels-mem    gpu_bench mem (memory-bound kernels)                                1 GPU
#   gpt2           GPT-2 124M, mbs 64, bf16, 12 iterations (KPROF=10:11 profiles)     1 GPU
#   ll4            LLaMA-3-8B-shaped 4 layers, seq 8192, mbs 1; DTYPE=bf16|fp8, GBS=1, ITERS=10
#   e2e            gpt2 + ll4 (bf16, gbs 1) in one call                                1 GPU
#   fp8            ll4 in bf16 and in fp8 (hybrid, history 1024, max), gbs 1           1 GPU
#   mtp            ll4 (gbs 1) without and with --mtp-num-layers 1, 3 ABBA alternations,
#                  <= 90 s: bench/gpu/mtp_overhead.sh (DTYPE, ITERS, ALTERNATIONS, BUDGET_S)  1 GPU
#   moe            gpu_bench moe (MoE expert GEMMs grouped / loop / dense, MoE layer share) beside
#                  bench/gpu/moe_peers.py, then a Mixtral-shaped pretrain_gpt (MOE_LAYERS=2
#                  layers, seq 4096, gbs 1, ITERS=8; MOE_PRETRAIN=0 skips it); bench/gpu/moe_bench.sh 1 GPU
#   dist           bench/gpu/pretrain_gpt_dist.sh BIN_DIR OUT gpu ll (DP2 variants)    2 GPUs
#   cp             bench/gpu/pretrain_gpt_cp.sh BIN_DIR OUT gpu long (CP1 vs CP2)      2 GPUs
#   llama8b        examples/llama/train_llama3_8b_h100_fp8.sh through
#                  bench/gpu/llama3_8b_bench_args.sh; DTYPE, BENCH_GBS, BENCH_ITERS, BENCH_TP,
#                  BENCH_CKPT, EXTRA_ARGS as there; NPROC_PER_NODE (default 2)           2 GPUs
#   peers          ours beside the issue-21 peers, interleaved, one GPU, <= BUDGET_S (540) s:
#                  ll4 bf16 gbs 1, bench/gpu/torch_llama_peer.py (torch.compile) gbs 1, ll4 gbs 8,
#                  torch peer gbs 8, gpt2 (mbs 64) gbs 64, llm.c (bench/gpu/llmc_peer.sh run) gbs 64,
#                  gpt2 gbs 512, llm.c gbs 512. LLMC_DIR: the dir `llmc_peer.sh build` wrote
#                  (default .device/peers/llmc); LLMC_DATA: where its random-token shards go
#                  (default /tmp/llmc_peer_data, outside OUT); PEERS_ONLY=torch|llmc: only the LLaMA or the GPT-2
#                  pairs; PEERS_OURS=0: the peers without ours. A step that would not fit is skipped
#                  with a "== SKIP" line. Peer rows: value = ours, peer_value = the peer.   1 GPU
#   check NAME     tests/gpu/NAME_check.sh BIN_DIR (hostgap, fp8perf, fp8fuse, fp8pg, gpt2perf,
#                  cefuse, ...): every "INFO ... <number> <unit>" of its output
#   ckptio         bench/checkpoint/device_ckpt_bench.sh (our save/load beside dd)
#   preprocess DIR bench/preprocess/device_bench.sh DIR (ours vs Megatron's preprocess_data.py)
#
# Environment: OUT (default /tmp/out), RESULTS, BENCH_COMMIT (default: BIN_DIR/commit.txt, which the
# build writes (tools/dev/write_commit.cmake), else `git rev-parse --short HEAD`), BENCH_MACHINE
# (default: from nvidia-smi), KPROF (a MEGATRON_KERNEL_PROFILE window for gpt2/ll4). Logs: $OUT/<suite>/<name>.log.
set -u
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
SUITE=${1:?usage: run_bench.sh SUITE BIN_DIR [ARGS...]}; BIN=$(cd "${2:?usage: run_bench.sh SUITE BIN_DIR [ARGS...]}" && pwd); shift 2
OUT=${OUT:-/tmp/out}; O=$OUT/$SUITE; mkdir -p "$O"
export RESULTS=${RESULTS:-$OUT/results.csv}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ -z "${BENCH_COMMIT:-}" ]; then
  if [ -f "$BIN/commit.txt" ]; then BENCH_COMMIT=$(cut -c1-7 "$BIN/commit.txt")
  else BENCH_COMMIT=$(git -C "$ROOT" rev-parse --short=7 HEAD 2>/dev/null || echo unknown); fi
fi
if [ -z "${BENCH_MACHINE:-}" ]; then
  BENCH_MACHINE="$(nvidia-smi -L 2>/dev/null | wc -l)x $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
fi
export BENCH_COMMIT BENCH_MACHINE BENCH_SUITE=$SUITE
APPEND="python3 $ROOT/bench/append_result.py"
# rows CMD PARSER LOG [PARSER ARGS]: append the figures of LOG, recording CMD as the command.
rows() { local cmd=$1; shift; BENCH_COMMAND="$cmd" $APPEND "$@" || echo "run_bench.sh: no rows from $2" >&2; }

COMMON="--mock-data --tokenizer-type NullTokenizer --attention-dropout 0 --hidden-dropout 0 --seed 1234 --eval-iters 0 --data-cache-path /tmp/cache"
GPT2="--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024 --vocab-size 50257 --log-interval 1 --lr 6e-4 --min-lr 6e-5 --lr-decay-style cosine --lr-warmup-iters 5 --weight-decay 0.1 --clip-grad 1.0 --bf16 --log-throughput --micro-batch-size 64 --global-batch-size 64"
LL="--num-layers 4 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128 --seq-length 8192 --max-position-embeddings 8192 --position-embedding-type rope --rotary-base 500000 --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear --vocab-size 128256 --micro-batch-size 1 --bf16 --log-interval 1 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2 --clip-grad 1.0 --log-throughput"
# Mixtral-8x7B-shaped (docs/moe.md "Performance"), MOE_LAYERS layers.
MIXTRAL="--num-layers ${MOE_LAYERS:-2} --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128 --seq-length 4096 --max-position-embeddings 4096 --position-embedding-type rope --rotary-base 1000000 --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear --vocab-size 32000 --num-experts 8 --moe-router-topk 2 --moe-grouped-gemm --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-2 --micro-batch-size 1 --global-batch-size 1 --bf16 --log-interval 1 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2 --clip-grad 1.0 --log-throughput"
FP8="--fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo max"

# train NAME TOKENS_PER_ITER ITERS FLAGS...: one pretrain_gpt run on GPU 0; rows = mean of
# iterations 3..ITERS (the first two carry warm-up), each logged iteration, kernel profile if any.
train() {
  local n=$1 tok=$2 it=$3; shift 3
  local cmd="bench/gpu/run_bench.sh $SUITE BIN_DIR${KPROF:+ (KPROF=$KPROF)} [$n]"
  CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} MEGATRON_KERNEL_PROFILE=${KPROF:-} MEGATRON_KERNEL_PROFILE_OUT=$O \
    timeout "${TRAIN_TIMEOUT:-300}" "$BIN/pretrain_gpt" "$@" $COMMON --train-iters "$it" > "$O/$n.log" 2>&1
  echo "== $n rc=$? $(grep -cE ' iteration +[0-9]+/' "$O/$n.log") iterations logged"
  rows "$cmd" pretrain "$O/$n.log" --iters "3-$it" --tokens-per-iter "$tok" --name "$n" --each
  [ -n "${KPROF:-}" ] && rows "$cmd" kprof "$O/$n.log" --name "$n"
  return 0
}
ll4() {  # ll4 DTYPE GBS
  local fp8=""; [ "$1" = fp8 ] && fp8=$FP8
  train "ll4_${1}_gbs$2" $(( 8192 * $2 )) "${ITERS:-10}" $LL $fp8 --global-batch-size "$2"
}

case $SUITE in
  kernels)
    CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} timeout 300 "$BIN/gpu_bench" > "$O/gpu_bench.log" 2>&1
    CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} timeout 300 python3 "$HERE/torch_peers.py" > "$O/torch_peers.log" 2>&1
    rows "bench/gpu/run_bench.sh kernels BIN_DIR" bench-lines "$O/gpu_bench.log" --peer-log "$O/torch_peers.log"
    rows "bench/gpu/run_bench.sh kernels BIN_DIR (peer: bench/gpu/torch_peers.py)" bench-lines "$O/torch_peers.log" ;;
  kernels-mem)
    CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} timeout 300 "$BIN/gpu_bench" mem > "$O/gpu_bench_mem.log" 2>&1
    rows "bench/gpu/run_bench.sh kernels-mem BIN_DIR" bench-lines "$O/gpu_bench_mem.log" ;;
  moe)
    CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} timeout 300 "$BIN/gpu_bench" moe > "$O/gpu_bench_moe.log" 2>&1
    echo "== gpu_bench moe rc=$?"; cat "$O/gpu_bench_moe.log"
    CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} timeout 120 python3 "$HERE/moe_peers.py" > "$O/moe_peers.log" 2>&1
    echo "== moe_peers.py rc=$?"; cat "$O/moe_peers.log"
    rows "bench/gpu/run_bench.sh moe BIN_DIR" bench-lines "$O/gpu_bench_moe.log" --peer-log "$O/moe_peers.log"
    rows "bench/gpu/run_bench.sh moe BIN_DIR (peer: bench/gpu/moe_peers.py)" bench-lines "$O/moe_peers.log"
    grep -E ' share +[0-9.]+ %$' "$O/gpu_bench_moe.log" | while read -r ln; do
      rows "bench/gpu/run_bench.sh moe BIN_DIR" value --metric "$(echo "$ln" | awk '{NF-=2; print}')" --value "$(echo "$ln" | awk '{print $(NF-1)}')" \
        --unit % --source "$O/gpu_bench_moe.log"
    done
    [ "${MOE_PRETRAIN:-1}" = 1 ] && train "mixtral_${MOE_LAYERS:-2}l_s4096_gbs1" 4096 "${ITERS:-8}" $MIXTRAL ;;
  peers)
    # Issue 21's "measured in the same run as its peer": ours and the peer alternate on GPU 0.
    budget=${BUDGET_S:-540}; t0=$SECONDS; only=${PEERS_ONLY:-all}
    LLMC_DIR=${LLMC_DIR:-$ROOT/.device/peers/llmc}
    # go NEED LIMIT NAME: true (and LIM = min(LIMIT, seconds left)) when NEED seconds remain.
    go() {
      local left=$(( budget - (SECONDS - t0) ))
      if [ "$left" -lt "$1" ]; then echo "== SKIP $3: ${left} s of BUDGET_S=$budget left, it needs ~$1 s"; return 1; fi
      LIM=$(( $2 < left ? $2 : left )); echo "== $3 (limit $LIM s, $(( SECONDS - t0 )) s into the suite)"; return 0
    }
    ours() { [ "${PEERS_OURS:-1}" = 1 ]; }
    GOT=""; MISSED=""
    # result NAME OURS_LOG FIRST PEER_LOG TOKENS: one "RESULT" line (ours and the peer, ms/iter,
    # tokens/s, ours/peer speed ratio); records which runs gave no figure for the PASS/FAIL line.
    result() {
      local om pm
      om=$(awk -v f="$3" 'match($0, / iteration +[0-9]+\//) { split(substr($0, RSTART, RLENGTH), a, /[ \/]+/); it = a[3] + 0 }
                          /elapsed time per iteration \(ms\): / && it >= f { sub(/.*elapsed time per iteration \(ms\): /, ""); s += $1 + 0; n++ }
                          END { if (n) printf "%.2f", s / n }' "$2" 2>/dev/null)
      pm=$(sed -n 's/^PEER [^:]*: ms\/iter \([0-9.]*\) .*/\1/p' "$4" 2>/dev/null | head -1)
      if ours; then if [ -n "$om" ]; then GOT="$GOT $1"; else MISSED="$MISSED $1"; fi; fi
      if [ -n "$pm" ]; then GOT="$GOT $1-peer"; else MISSED="$MISSED $1-peer"; fi
      awk -v n="$1" -v o="$om" -v p="$pm" -v t="$5" 'BEGIN {
        printf "RESULT %s ours %s ms/iter (%s tokens/s) peer %s ms/iter (%s tokens/s)%s\n", n,
          o == "" ? "-" : o, o == "" ? "-" : sprintf("%.0f", t * 1000 / o), p == "" ? "-" : p,
          p == "" ? "-" : sprintf("%.0f", t * 1000 / p), (o != "" && p != "") ? sprintf(" ours/peer speed %.3fx", p / o) : "" }'
    }
    # torch_pair GBS ITERS PEER_ITERS: our ll4 bf16 at GBS (ITERS iterations, rows of 3..ITERS),
    # then the torch.compile peer (2 warm-up steps, which compile, and PEER_ITERS timed steps).
    torch_pair() {
      local g=$1 it=$2 pit=$3 n=ll4_bf16_gbs$1
      ours && go 45 150 "$n" && TRAIN_TIMEOUT=$LIM train "$n" $(( 8192 * g )) "$it" $LL --global-batch-size "$g"
      if go 90 240 "torch_llama compile gbs $g"; then
        CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} timeout -k 10 "$LIM" python3 "$HERE/torch_llama_peer.py" \
          --layers 4 --seq 8192 --gbs "$g" --iters "$pit" --warmup 2 --compile > "$O/torch_llama_gbs$g.log" 2>&1
        echo "== torch_llama gbs $g rc=$?"; grep -E '^PEER ' "$O/torch_llama_gbs$g.log" || tail -5 "$O/torch_llama_gbs$g.log"
        local tv; tv=$(sed -n 's/^torch \([^ ]*\) .*/\1/p' "$O/torch_llama_gbs$g.log" | head -1)
        rows "bench/gpu/run_bench.sh peers BIN_DIR [$n vs torch_llama_peer.py --gbs $g --iters $pit --warmup 2 --compile]" \
          peer "$O/torch_llama_gbs$g.log" --name "$n" --peer "PyTorch ${tv:-?} torch.compile (bench/gpu/torch_llama_peer.py)" \
          $(ours && echo --ours-log "$O/$n.log" --iters "3-$it" --tokens-per-iter $(( 8192 * g )))
        result "$n" "$O/$n.log" 3 "$O/torch_llama_gbs$g.log" $(( 8192 * g ))
      fi
    }
    # llmc_pair GBS ITERS: our GPT-2 124M mbs 64 at GBS sequences, then llm.c, ITERS steps each
    # (rows: the mean of steps 3..ITERS of both).
    llmc_pair() {
      local g=$1 it=$2 n=gpt2_124m_mbs64_gbs$1
      ours && go 30 120 "$n" && TRAIN_TIMEOUT=$LIM train "$n" $(( 1024 * g )) "$it" $GPT2 --global-batch-size "$g"
      if go 30 120 "llm.c gbs $g"; then
        LLMC_TIMEOUT=$LIM bash "$HERE/llmc_peer.sh" run "$LLMC_DIR" "${LLMC_DATA:-/tmp/llmc_peer_data}" "$g" "$it" "$O/llmc_gbs$g.log" > "$O/llmc_gbs$g.summary" 2>&1
        echo "== llm.c gbs $g rc=$?"; cat "$O/llmc_gbs$g.summary"
        cat "$O/llmc_gbs$g.summary" >> "$O/llmc_gbs$g.log"
        local lc; lc=$(sed -n 's/^llm.c \(.......\).*/\1/p' "$LLMC_DIR/llmc_commit.txt" 2>/dev/null)
        rows "bench/gpu/run_bench.sh peers BIN_DIR [$n vs llmc_peer.sh run LLMC_DIR DATA $g $it]" \
          peer "$O/llmc_gbs$g.log" --name "$n" --peer "llm.c ${lc:-?} train_gpt2cu cuDNN (bench/gpu/llmc_peer.sh)" \
          $(ours && echo --ours-log "$O/$n.log" --iters "3-$it" --tokens-per-iter $(( 1024 * g )))
        result "$n" "$O/$n.log" 3 "$O/llmc_gbs$g.log" $(( 1024 * g ))
      fi
    }
    echo "== peers suite: BUDGET_S=$budget PEERS_ONLY=$only LLMC_DIR=$LLMC_DIR ($(head -1 "$LLMC_DIR/llmc_commit.txt" 2>/dev/null || echo 'no llmc_commit.txt'))"
    if [ "$only" = all ] || [ "$only" = torch ]; then torch_pair 1 10 8; torch_pair 8 6 5; fi
    if [ "$only" = all ] || [ "$only" = llmc ]; then llmc_pair 64 12; llmc_pair 512 6; fi
    echo "== peers suite done in $(( SECONDS - t0 )) s"
    if [ -z "$MISSED" ] && [ -n "$GOT" ]; then echo "PASS peers: figures from$GOT"
    else echo "FAIL peers: no figure from${MISSED:- any run}${GOT:+ (figures from$GOT)}"; fi ;;
  gpt2) train gpt2_124m_mbs64 65536 "${ITERS:-12}" $GPT2 ;;
  ll4) ll4 "${DTYPE:-bf16}" "${GBS:-1}" ;;
  e2e) train gpt2_124m_mbs64 65536 "${ITERS:-12}" $GPT2; ll4 bf16 1 ;;
  fp8) ll4 bf16 "${GBS:-1}"; ll4 fp8 "${GBS:-1}" ;;
  mtp)
    fp8=""; [ "${DTYPE:-bf16}" = fp8 ] && fp8=$FP8
    MTP_BENCH_FLAGS="$LL $fp8 --global-batch-size 1 $COMMON" bash "$HERE/mtp_overhead.sh" "$BIN" "$O" ;;
  dist)
    bash "$HERE/pretrain_gpt_dist.sh" "$BIN" "$O" gpu ll
    for n in ll_1gpu ll_dp2 ll_dp2_distopt ll_dp2_bf16grad ll_dp2_overlap; do
      [ -f "$O/$n.log" ] && rows "bench/gpu/run_bench.sh dist BIN_DIR [$n]" pretrain "$O/$n.log" --iters 16-20 --tokens-per-iter 8192 --name "$n" --each
    done ;;
  cp)
    bash "$HERE/pretrain_gpt_cp.sh" "$BIN" "$O" gpu long
    for f in "$O"/ll_s*_cp*.log; do
      n=$(basename "$f" .log); s=${n#ll_s}; s=${s%_cp*}
      rows "bench/gpu/run_bench.sh cp BIN_DIR [$n]" pretrain "$f" --iters 2-8 --tokens-per-iter "$s" --name "$n" --each
    done ;;
  llama8b)
    n=llama8b_${DTYPE:-bf16}_gbs${BENCH_GBS:-8}${BENCH_TP:+_tp$BENCH_TP}
    nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader,nounits -lms 500 > "$O/$n.mem.csv" 2>/dev/null & smi=$!
    (cd "$ROOT" && env NPROC_PER_NODE=${NPROC_PER_NODE:-2} LAUNCHER="$BIN/megatron_launch" PRETRAIN_GPT="$ROOT/bench/gpu/llama3_8b_bench_args.sh" \
      REAL_PRETRAIN_GPT="$BIN/pretrain_gpt" MASTER_PORT=$((29700 + RANDOM % 200)) timeout 600 \
      bash examples/llama/train_llama3_8b_h100_fp8.sh /tmp/ckpt8b /tmp/tb8b "${TOKA:-MOCK}" "${DATAA:-MOCK}" > "$O/$n.log" 2>&1)
    kill $smi 2>/dev/null; wait $smi 2>/dev/null
    it=${BENCH_ITERS:-6}; tp=${BENCH_TP:-1}
    cmd="DTYPE=${DTYPE:-bf16} BENCH_GBS=${BENCH_GBS:-8} BENCH_ITERS=$it${BENCH_TP:+ BENCH_TP=$BENCH_TP} bench/gpu/run_bench.sh llama8b BIN_DIR"
    rows "$cmd" pretrain "$O/$n.log" --iters "2-$it" --tokens-per-iter $(( ${BENCH_GBS:-8} * 8192 * tp / ${NPROC_PER_NODE:-2} )) --name "$n (per GPU)" --each
    rows "$cmd" smi-peak "$O/$n.mem.csv" --name "$n"
    [ -n "${MEGATRON_KERNEL_PROFILE:-}" ] && rows "$cmd" kprof "$O/$n.log" --name "$n" ;;
  check)
    c=${1:?usage: run_bench.sh check BIN_DIR NAME}
    OUT=$O timeout 590 bash "$ROOT/tests/gpu/${c}_check.sh" "$BIN" > "$O/$c.log" 2>&1; echo "== $c rc=$?"
    grep -E "^(PASS|FAIL)" "$O/$c.log"
    rows "bench/gpu/run_bench.sh check BIN_DIR $c" info "$O/$c.log" ;;
  ckptio)
    bash "$ROOT/bench/checkpoint/device_ckpt_bench.sh" "$O" "$BIN"
    rows "bench/gpu/run_bench.sh ckptio BIN_DIR" ckpt "$O/summary.txt" ;;
  preprocess)
    d=${1:?usage: run_bench.sh preprocess BIN_DIR DIR (see bench/preprocess/device_bench.sh)}
    OUT=$O bash "$ROOT/bench/preprocess/device_bench.sh" "$d" > /dev/null 2>&1  # it writes $O/bench.log
    rows "bench/gpu/run_bench.sh preprocess BIN_DIR DIR" preprocess "$O/bench.log" ;;
  *) echo "run_bench.sh: unknown suite '$SUITE' (kernels, kernels-mem, gpt2, ll4, e2e, fp8, mtp, moe, peers, dist, cp, llama8b, check, ckptio, preprocess)" >&2; exit 2 ;;
esac
if [ -f "$RESULTS" ]; then echo "rows appended to $RESULTS: $(($(wc -l < "$RESULTS") - 1)) in all"; else echo "no rows in $RESULTS"; fi
