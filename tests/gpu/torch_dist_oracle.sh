#!/usr/bin/env bash
# Oracle for torch_dist checkpoints (issue 25) against Megatron-LM itself. Run on the GPU machine
# (torch + numpy, no network) from the repository root, with Megatron-LM copied into the ignored
# folder .oracle/Megatron-LM:
#
#   [ORACLE_OUT=DIR] [TD_RESULTS=DIR] [LEGS=fp32,bf16,moe] [TD_FIXTURES=DIR] \
#     tests/gpu/torch_dist_oracle.sh BIN_DIR [gpt|llama|all]
#
# LEGS (default all three) picks the groups of legs: fp32 = (a)..(d) below for the models of the
# second argument; bf16 and moe = (e) and (f), tiny GPT only, one GPU. With TD_FIXTURES set, the
# Megatron-LM checkpoints of (e) and (f) are copied there as the CPU fixtures
# tests/reference/torch_dist/megatron_gpt_{bf16,bf16_distopt,moe}_tp1 (README there).
# BIN_DIR: our build's bin folder (pretrain_gpt, megatron_launch). For each model (tiny GPT,
# tiny LLaMA; fp32, dropout 0, constant LR, Megatron's local spec --transformer-impl local):
#  (a) Megatron trains on mock data (NullTokenizer) with --train-iters 10 --exit-interval 5 and
#      saves --ckpt-format torch_dist at iteration 5 (with --use-distributed-optimizer
#      --dist-ckpt-optim-fully-reshardable in the DP2 layout), then continues from its own
#      checkpoint to iteration 10; it also trains 10 iterations uninterrupted (is its resume its
#      own uninterrupted run?);
#  (b) we --load that checkpoint on the CPU in TP1, TP2, PP2 and DP2 + distributed optimizer and
#      continue to iteration 10: lm loss of iteration 6 within 1e-5 relative of Megatron's, 7..10
#      within 1e-4 (fp32; the layouts differ only in reduction order); grad norms equal as printed;
#  (c) we train (TP2, the same --train-iters 10 --exit-interval 5) and save --ckpt-format
#      torch_dist; Megatron --load's it with its optimizer (--no-load-rng: the RNG streams are not
#      Megatron's, and dropout is 0) and continues (once as written, once without common.pt so
#      that it reads our "common_state" object); we continue from the same checkpoint with the
#      same flags; same tolerances. We also train 10 iterations uninterrupted;
#  (d) the samples: every Megatron run goes through tests/gpu/megatron_samples.py, which prints
#      each sample Megatron's GPTDataset.__getitem__ returns to the data loader, our runs set
#      MEGATRON_DUMP_SAMPLES=1; train samples 0..39 are compared field by field, and with
#      megatron_samples.py's standalone build of the dataset. megatron_samples.py also lets
#      Megatron's DistributedOptimizer load without Transformer Engine / Apex (a test-harness shim
#      of its state_dict() on the empty pre-load state, docstring there; no Megatron file changed);
#  (e) bf16 (LEGS bf16): Megatron trains with --bf16 (bf16 weights, fp32 main params and Adam state in
#      the optimizer) TP1, once with its non-distributed optimizer (main params saved as
#      optimizer.state.fp32_param.*) and once with --use-distributed-optimizer
#      --dist-ckpt-optim-fully-reshardable at DP1 (optimizer.state.param.*), 5 + save, then continues
#      to 10; we --load each with --bf16 on the CPU (TP1, with and without the distributed
#      optimizer) and continue: lm loss of iteration 6 within 2e-3 relative of Megatron's, 7..10
#      within 1e-2, grad norms within 2e-2 relative (bf16 activations from other kernels; the
#      derivation is in torch_dist_oracle_report.py); and exactly: our load + save at iteration 5
#      (no step: --train-iters 5) holds every tensor of Megatron's checkpoint bitwise (bf16 weights,
#      fp32 main params, both Adam moments; tests/reference/torch_dist/dcp_stdlib.py values). The
#      reverse: we train with --bf16 (with and without the distributed optimizer) and save; Megatron
#      continues (compared with our continuation, same tolerances) and, loading and saving at
#      iteration 5, holds our tensors bitwise;
#  (f) MoE (LEGS moe): a tiny GPT with 4 experts, top-2, alltoall dispatcher, aux loss 1e-2, fp32,
#      no linear biases, Megatron's local spec (SequentialMLP), EP1: the legs of (e) with the fp32
#      tolerances of (b) (and the printed load_balancing_loss compared like the lm loss); ours also
#      continues Megatron's checkpoint with --expert-model-parallel-size 2 (2 CPU ranks). Both
#      directions also check our save's keys, dtypes, shapes and objects against Megatron's
#      (dcp_stdlib.py keys: every MoE key Megatron writes and we do not, or the reverse, is named).
# Megatron's GPU runs and our CPU runs go in two parallel waves (one GPU is enough: the models are
# tiny). Megatron's layouts: TP1 with one GPU; also TP2, PP2, DP2 + distributed optimizer
# (torchrun, one rank per GPU) when 2 GPUs are visible. Every leg runs even when another fails.
# The summary (tests/gpu/torch_dist_oracle_report.py) is printed last and written to
# $ORACLE_OUT/summary.txt; with TD_RESULTS set, the summary and a tarball of all logs are copied
# there. Exit status 0 only if every comparison holds. TD_RUN_TIMEOUT (seconds, default 200) caps
# each single run.
set -uo pipefail
BIN=${1:?usage: tests/gpu/torch_dist_oracle.sh BIN_DIR [gpt|llama|all]}
WHICH=${2:-all}
BIN=$(cd "$BIN" && pwd)
REPO=$(pwd)
MLM=$REPO/.oracle/Megatron-LM
[[ -f $MLM/pretrain_gpt.py ]] || { echo "error: $MLM/pretrain_gpt.py missing: copy Megatron-LM to .oracle/Megatron-LM"; exit 2; }
W=${ORACLE_OUT:-$(mktemp -d /tmp/td_oracle.XXXXXX)}
mkdir -p "$W"
echo "work dir: $W"
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
RUN_TIMEOUT=${TD_RUN_TIMEOUT:-200}
export CUDA_DEVICE_MAX_CONNECTIONS=1 PYTHONPATH=$MLM${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=2 PYTHONUNBUFFERED=1
START=$SECONDS
PORT=$((20000 + RANDOM % 20000))
SELECT=${LEGS:-fp32,bf16,moe}
for g in ${SELECT//,/ }; do
  [[ $g == fp32 || $g == bf16 || $g == moe ]] || { echo "error: LEGS=$SELECT: unknown group '$g' (fp32, bf16, moe)"; exit 2; }
done
LEGS_TSV=$W/legs.tsv
: > "$LEGS_TSV"

# shellcheck source=tests/functional_tests/support/torch_dist_oracle_flags.sh
source "$REPO/tests/functional_tests/support/torch_dist_oracle_flags.sh"
COMMON=("${TD_MODEL[@]}" --save-interval 5 --ckpt-format torch_dist --train-iters 10)
LLAMA=("${TD_LLAMA[@]}")
# Megatron without Transformer Engine / apex: the local spec and unfused kernels. Each run has its
# own index cache folder (the runs of a wave start together).
MEGATRON_ONLY=(--transformer-impl local --attention-backend unfused --no-gradient-accumulation-fusion
               --no-masked-softmax-fusion --no-bias-dropout-fusion --no-rope-fusion --no-persist-layer-norm
               --distributed-backend nccl)

arch_of() { [[ $1 == llama ]] && echo "${LLAMA[*]}"; }
# megatron LOG NPROC FLAGS...: one Megatron run (through megatron_samples.py run), in the background.
megatron() {
  local log=$1 np=$2
  shift 2
  PORT=$((PORT + 1))
  (cd "$MLM" && timeout "$RUN_TIMEOUT" torchrun --nproc-per-node "$np" --master-port "$PORT" \
     "$REPO/tests/gpu/megatron_samples.py" run "$MLM/pretrain_gpt.py" \
     "${COMMON[@]}" "${MEGATRON_ONLY[@]}" --data-cache-path "$log.cache" "$@") > "$log" 2>&1 &
}
# ours LOG NPROC FLAGS...: one of our CPU runs, in the background.
ours() {
  local log=$1 np=$2
  shift 2
  PORT=$((PORT + 1))
  if [[ $np == 1 ]]; then
    MEGATRON_DUMP_SAMPLES=1 MEGATRON_DEVICE=cpu timeout "$RUN_TIMEOUT" "$BIN/pretrain_gpt" "${COMMON[@]}" \
      --data-cache-path "$log.cache" "$@" > "$log" 2>&1 &
  else
    MEGATRON_DUMP_SAMPLES=1 MEGATRON_DEVICE=cpu timeout "$RUN_TIMEOUT" "$BIN/megatron_launch" --nproc-per-node "$np" \
      --master-port "$PORT" "$BIN/pretrain_gpt" "${COMMON[@]}" --data-cache-path "$log.cache" \
      --distributed-backend gloo "$@" > "$log" 2>&1 &
  fi
}
leg() { printf '%s\t%s\t%s\t%s\n' "$@" >> "$LEGS_TSV"; }
has_legs() { [[ ,$SELECT, == *,$1,* ]]; }
wave_done() { wait; echo "-- $1 done at $((SECONDS - START)) s"; }

MODELS=()
has_legs fp32 && [[ $WHICH == all || $WHICH == gpt ]] && MODELS+=(gpt)
has_legs fp32 && [[ $WHICH == all || $WHICH == llama ]] && MODELS+=(llama)
MLAYOUTS=("tp1:1:")
if (( NGPU >= 2 )); then
  MLAYOUTS+=("tp2:2:--tensor-model-parallel-size 2" "pp2:2:--pipeline-model-parallel-size 2"
             "dp2do:2:--use-distributed-optimizer --dist-ckpt-optim-fully-reshardable")
fi

# (e) bf16 and (f) MoE: tiny GPT, Megatron TP1 on the GPU, ours on the CPU.
BF16=("${TD_BF16[@]}")
MOE=("${TD_MOE[@]}")
EGROUPS=()
has_legs bf16 && EGROUPS+=(bf16)
has_legs moe && EGROUPS+=(moe)
# Per group: its flags, the report kind of its loss comparisons, its optimizer variants
# (NAME:OUR FLAGS; Megatron's distributed optimizer also gets --dist-ckpt-optim-fully-reshardable)
# and the layout of our save (NPROC:FLAGS).
group_flags() { [[ $1 == bf16 ]] && echo "${BF16[*]}" || echo "${MOE[*]}"; }
group_kind() { [[ $1 == bf16 ]] && echo cmpbf16 || echo cmp; }
group_variants() { [[ $1 == bf16 ]] && echo "plain: do:--use-distributed-optimizer" || echo "plain:"; }
group_save_layout() { [[ $1 == bf16 ]] && echo "1:" || echo "2:--expert-model-parallel-size 2"; }
megatron_opt() { [[ -n $1 ]] && echo "$1 --dist-ckpt-optim-fully-reshardable"; }
# Load and save again at iteration 5 without a step (--train-iters 5; the end-of-training save,
# --save-interval 3 so that 5 is not a save interval): the checkpoint as the loader holds it.
RESAVE=(--train-iters 5 --use-checkpoint-opt_param-scheduler --save-interval 3)

wave1_extra() {
  local g d v vname vflags snp sflags
  for g in "${EGROUPS[@]}"; do
    d=$W/$g; rm -rf "$d"; mkdir -p "$d"
    read -r -a gf <<< "$(group_flags "$g")"
    IFS=: read -r snp sflags <<< "$(group_save_layout "$g")"
    for v in $(group_variants "$g"); do
      IFS=: read -r vname vflags <<< "$v"
      # shellcheck disable=SC2046,SC2086
      megatron "$d/m5_$vname.log" 1 "${gf[@]}" $(megatron_opt "$vflags") --exit-interval 5 --save "$d/mckpt_$vname"
      # shellcheck disable=SC2086
      ours "$d/o5_$vname.log" "$snp" "${gf[@]}" $vflags $sflags --exit-interval 5 --save "$d/ockpt_$vname"
    done
  done
}

wave2_extra() {
  local g d v vname vflags kind
  for g in "${EGROUPS[@]}"; do
    d=$W/$g
    read -r -a gf <<< "$(group_flags "$g")"
    kind=$(group_kind "$g")
    for v in $(group_variants "$g"); do
      IFS=: read -r vname vflags <<< "$v"
      read -r -a mo <<< "$(megatron_opt "$vflags")"
      if [[ -f $d/mckpt_$vname/iter_0000005/.metadata ]]; then
        megatron "$d/m10_$vname.log" 1 "${gf[@]}" "${mo[@]}" --load "$d/mckpt_$vname" --save "$d/mckpt_cont_$vname"
        # shellcheck disable=SC2086
        ours "$d/o_$vname.log" 1 "${gf[@]}" $vflags --load "$d/mckpt_$vname" --save "$d/o_$vname"
        leg "$kind" "$g Megatron-$vname -> ours-tp1${vflags:+ $vflags}" "$d/m10_$vname.log" "$d/o_$vname.log"
        if [[ -n $vflags ]]; then  # the distributed optimizer's checkpoint into our non-distributed one
          ours "$d/o_${vname}_plain.log" 1 "${gf[@]}" --load "$d/mckpt_$vname" --save "$d/o_${vname}_plain"
          leg "$kind" "$g Megatron-$vname -> ours-tp1 (non-distributed optimizer)" "$d/m10_$vname.log" "$d/o_${vname}_plain.log"
        fi
        if [[ $g == moe ]]; then
          ours "$d/o_${vname}_ep2.log" 2 "${gf[@]}" --expert-model-parallel-size 2 --load "$d/mckpt_$vname" --save "$d/o_${vname}_ep2"
          leg "$kind" "$g Megatron-$vname -> ours-ep2" "$d/m10_$vname.log" "$d/o_${vname}_ep2.log"
        fi
        # shellcheck disable=SC2086
        ours "$d/ores_$vname.log" 1 "${gf[@]}" $vflags --load "$d/mckpt_$vname" "${RESAVE[@]}" --save "$d/ores_$vname"
      else
        echo "Megatron ($g, $vname) wrote no checkpoint at iteration 5: tail of its log"; tail -15 "$d/m5_$vname.log"
        leg cmp "$g Megatron-$vname wrote its checkpoint" "$d/m5_$vname.log" "$d/none"
      fi
      if [[ -f $d/ockpt_$vname/iter_0000005/.metadata ]]; then
        # shellcheck disable=SC2086
        ours "$d/o10_$vname.log" 1 "${gf[@]}" $vflags --load "$d/ockpt_$vname" --save "$d/ockpt_cont_$vname" --no-load-rng
        megatron "$d/m10o_$vname.log" 1 "${gf[@]}" "${mo[@]}" --load "$d/ockpt_$vname" --save "$d/mckpt_from_ours_$vname" --no-load-rng
        leg "$kind" "$g ours-$vname -> Megatron-tp1" "$d/o10_$vname.log" "$d/m10o_$vname.log"
        megatron "$d/mres_$vname.log" 1 "${gf[@]}" "${mo[@]}" --load "$d/ockpt_$vname" --no-load-rng "${RESAVE[@]}" --save "$d/mres_$vname"
      else
        echo "our training ($g, $vname) wrote no checkpoint:"; grep -m3 '^error' "$d/o5_$vname.log" || tail -5 "$d/o5_$vname.log"
        leg cmp "$g ours-$vname wrote its checkpoint" "$d/o5_$vname.log" "$d/none"
      fi
    done
  done
}

# The exact checks (tests/reference/torch_dist/dcp_stdlib.py, standard library): each log ends in
# "OK: ..." or names what differs.
dcp() {
  local log=$1; shift
  if [[ -f $2/.metadata && -f $3/.metadata ]]; then python3 "$REPO/tests/reference/torch_dist/dcp_stdlib.py" "$@" > "$log" 2>&1
  else echo "missing checkpoint: $2 or $3 (see the runs' logs)" > "$log"; fi
}
extra_checks() {
  local g d v vname it=iter_0000005
  for g in "${EGROUPS[@]}"; do
    d=$W/$g
    for v in $(group_variants "$g"); do
      IFS=: read -r vname _ <<< "$v"
      dcp "$d/chk_keys_$vname.log" keys "$d/mckpt_$vname/$it" "$d/ockpt_$vname/$it"
      leg check "$g keys: Megatron-$vname's checkpoint vs ours (key, dtype, shape, objects)" - "$d/chk_keys_$vname.log"
      dcp "$d/chk_load_$vname.log" values "$d/mckpt_$vname/$it" "$d/ores_$vname/$it"
      leg check "$g exact: Megatron-$vname's tensors as our --load holds them (ours re-saved at 5)" - "$d/chk_load_$vname.log"
      dcp "$d/chk_mload_$vname.log" values "$d/ockpt_$vname/$it" "$d/mres_$vname/$it"
      leg check "$g exact: our $vname tensors as Megatron's --load holds them (Megatron re-saved at 5)" - "$d/chk_mload_$vname.log"
    done
  done
  [[ -n ${TD_FIXTURES:-} ]] && write_fixtures
}

# TD_FIXTURES: Megatron's iteration-5 checkpoints of (e) and (f) as CPU test fixtures
# (tests/reference/torch_dist/README.md), with the iteration lines Megatron printed for 1..5 and,
# continuing from them, for 6..10.
write_fixtures() {
  local src name
  for src in bf16/plain:megatron_gpt_bf16_tp1 bf16/do:megatron_gpt_bf16_distopt_tp1 moe/plain:megatron_gpt_moe_tp1; do
    IFS=: read -r gv name <<< "$src"
    local d=$W/${gv%/*} v=${gv#*/}
    [[ -f $d/mckpt_$v/iter_0000005/.metadata ]] || continue
    rm -rf "${TD_FIXTURES:?}/$name"; mkdir -p "$TD_FIXTURES/$name/iter_0000005"
    cp "$d/mckpt_$v/latest_checkpointed_iteration.txt" "$TD_FIXTURES/$name/"
    find "$d/mckpt_$v/iter_0000005" -maxdepth 1 -type f -exec cp {} "$TD_FIXTURES/$name/iter_0000005/" \;
    grep -E ' iteration +[0-9]+/ +[0-9]+ \|' "$d/m5_$v.log" > "$TD_FIXTURES/$name/megatron_iterations_1_5.log"
    grep -E ' iteration +[0-9]+/ +[0-9]+ \|' "$d/m10_$v.log" > "$TD_FIXTURES/$name/megatron_iterations_6_10.log"
    echo "wrote fixture $TD_FIXTURES/$name"
  done
}

# Megatron's C++ dataset helpers, compiled once before the parallel runs (each run's rank 0 calls
# make, a no-op then).
make -C "$MLM/megatron/core/datasets" > "$W/helpers_make.log" 2>&1 || { echo "note: building Megatron's dataset helpers failed:"; tail -3 "$W/helpers_make.log"; }

# Wave 1: Megatron 5 + save and 10 uninterrupted (GPU); ours TP2 5 + save and 10 uninterrupted
# (CPU); Megatron's standalone dataset (CPU).
for m in "${MODELS[@]}"; do
  d=$W/$m; rm -rf "$d"; mkdir -p "$d"
  read -r -a arch <<< "$(arch_of "$m")"
  for lay in "${MLAYOUTS[@]}"; do
    IFS=: read -r lname lnp lflags <<< "$lay"
    # shellcheck disable=SC2086
    megatron "$d/m5_$lname.log" "$lnp" "${arch[@]}" $lflags --exit-interval 5 --save "$d/mckpt_$lname"
    # shellcheck disable=SC2086
    megatron "$d/mfull_$lname.log" "$lnp" "${arch[@]}" $lflags
  done
  ours "$d/o5.log" 2 "${arch[@]}" --tensor-model-parallel-size 2 --exit-interval 5 --save "$d/ockpt"
  ours "$d/ofull.log" 2 "${arch[@]}" --tensor-model-parallel-size 2
done
has_legs fp32 && (timeout 120 python3 "$REPO/tests/gpu/megatron_samples.py" dataset --cache "$W/standalone_cache" > "$W/standalone_samples.log" 2>&1) &
wave1_extra
wave_done "wave 1 (Megatron 5+save, 10 uninterrupted; ours 5+save, 10 uninterrupted)"

# Wave 2: the continuations.
for m in "${MODELS[@]}"; do
  d=$W/$m
  read -r -a arch <<< "$(arch_of "$m")"
  for lay in "${MLAYOUTS[@]}"; do
    IFS=: read -r lname lnp lflags <<< "$lay"
    if [[ ! -f $d/mckpt_$lname/iter_0000005/.metadata ]]; then
      echo "Megatron ($m, $lname) wrote no checkpoint at iteration 5: tail of its log"; tail -15 "$d/m5_$lname.log"
      leg cmp "$m Megatron-$lname wrote its checkpoint" "$d/m5_$lname.log" "$d/none"
      continue
    fi
    # shellcheck disable=SC2086
    megatron "$d/m10_$lname.log" "$lnp" "${arch[@]}" $lflags --load "$d/mckpt_$lname" --save "$d/mckpt_cont_$lname"
    leg self "$m Megatron-$lname resume vs its uninterrupted run" "$d/mfull_$lname.log" "$d/m10_$lname.log"
    optflag=
    [[ $lname == dp2do ]] && optflag=--use-distributed-optimizer
    for ol in "tp1:1:$optflag" "tp2:2:--tensor-model-parallel-size 2 $optflag" \
              "pp2:2:--pipeline-model-parallel-size 2 $optflag" "dp2do:2:--use-distributed-optimizer"; do
      IFS=: read -r oname onp oflags <<< "$ol"
      # shellcheck disable=SC2086
      ours "$d/o_${lname}_$oname.log" "$onp" "${arch[@]}" $oflags --load "$d/mckpt_$lname" --save "$d/o_${lname}_$oname"
      leg cmp "$m Megatron-$lname -> ours-$oname" "$d/m10_$lname.log" "$d/o_${lname}_$oname.log"
    done
  done
  if [[ -f $d/ockpt/iter_0000005/.metadata ]]; then
    ours "$d/o10.log" 1 "${arch[@]}" --load "$d/ockpt" --save "$d/ockpt_cont" --no-load-rng
    leg self "$m ours resume (TP2 save, TP1 load) vs our uninterrupted TP2 run" "$d/ofull.log" "$d/o10.log"
    megatron "$d/m10o.log" 1 "${arch[@]}" --load "$d/ockpt" --save "$d/mckpt_from_ours" --no-load-rng
    leg cmp "$m ours-tp2 -> Megatron-tp1" "$d/o10.log" "$d/m10o.log"
    # Without common.pt: Megatron reads its current layout, our "common_state" object.
    cp -r "$d/ockpt" "$d/ockpt_obj" && rm -f "$d/ockpt_obj/iter_0000005/common.pt"
    megatron "$d/m10o_obj.log" 1 "${arch[@]}" --load "$d/ockpt_obj" --save "$d/mckpt_from_ours_obj" --no-load-rng
    leg cmp "$m ours-tp2 (common_state object) -> Megatron-tp1" "$d/o10.log" "$d/m10o_obj.log"
  else
    echo "our training ($m) wrote no checkpoint:"; grep -m3 '^error' "$d/o5.log" || tail -5 "$d/o5.log"
    leg cmp "$m ours wrote its checkpoint" "$d/o5.log" "$d/none"
  fi
done
wave2_extra
wave_done "wave 2 (continuations)"
extra_checks

# The samples: Megatron's uninterrupted TP1 run (what its loader fetched: 0..39 and prefetch) against
# ours (TP2, rank 0 of DP1: the same samples) and against Megatron's standalone dataset build.
if has_legs fp32; then
m=${MODELS[0]}
leg samples "samples: Megatron training loader vs ours" "$W/$m/mfull_tp1.log" "$W/$m/ofull.log"
leg samples "samples: Megatron standalone dataset vs ours" "$W/standalone_samples.log" "$W/$m/ofull.log"
grep -m1 '^description hash' "$W/standalone_samples.log" || { echo "standalone dataset build:"; tail -5 "$W/standalone_samples.log"; }
echo "Megatron's index cache files (the description hash prefixes them):"
for f in "$W/$m/mfull_tp1.log.cache"/*-train-*; do [[ -e $f ]] && echo "  ${f##*/}"; done
[[ -f $W/$m/mckpt_tp1/iter_0000005/.metadata ]] && {
  echo "Megatron's torch_dist keys ($m):"
  python3 - "$W/$m/mckpt_tp1/iter_0000005" <<'PY'
import pickle, sys
import torch  # noqa: F401  (the metadata classes)
md = pickle.load(open(sys.argv[1] + '/.metadata', 'rb'))
print(' ', ' '.join(sorted(md.state_dict_metadata)))
PY
}
fi

echo "== summary ($((SECONDS - START)) s)"
python3 "$REPO/tests/gpu/torch_dist_oracle_report.py" "$LEGS_TSV" | tee "$W/summary.txt"
rc=${PIPESTATUS[0]}
if [[ -n ${TD_RESULTS:-} ]]; then
  mkdir -p "$TD_RESULTS"
  cp "$W/summary.txt" "$TD_RESULTS/torch_dist_summary.txt"
  (cd "$W" && find . -name '*.log' -print0 | tar czf "$TD_RESULTS/torch_dist_logs.tgz" --null -T -)
fi
echo "logs in $W"
exit "$rc"
