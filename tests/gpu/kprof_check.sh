#!/usr/bin/env bash
# GPU check of the kernel profiler (docs/performance.md "Kernel profile") and of evaluation only
# (--skip-train) on one H200. Usage: tests/gpu/kprof_check.sh BIN_DIR   (results in ${OUT:-/tmp/out}/kprof)
# Needs pretrain_gpt built with -DMEGATRON_CUDA=ON and libcupti (CUDA toolkit or the PyTorch
# wheel's nvidia/*/lib; found below). Prints PASS/FAIL lines with numbers; exit 1 on any FAIL.
# About 30 s.
set -u
BIN=$(cd "${1:?usage: kprof_check.sh BIN_DIR}" && pwd)
O=${OUT:-/tmp/out}/kprof
mkdir -p "$O" && O=$(cd "$O" && pwd) && cd "$O"  # --profile also writes trace_rank0.json to the working folder
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} MEGATRON_DEVICE=cuda  # no silent CPU fallback
# Libraries: the toolkit's and the PyTorch wheel's (cuBLASLt, cuDNN, CUPTI), then any still missing.
. "$(dirname "${BASH_SOURCE[0]}")/cuda_libs.sh"
for l in libcublasLt.so.13 libcudart.so.13 libnccl.so.2; do
  if ! ldd "$BIN/pretrain_gpt" | grep -q "$l => /"; then
    f=$(find / -xdev -name "$l" 2>/dev/null | head -1); [ -n "$f" ] && export LD_LIBRARY_PATH="$(dirname "$f"):$LD_LIBRARY_PATH"
  fi
done
. "$(dirname "${BASH_SOURCE[0]}")/gpucheck_lib.sh"  # gc_find_cupti (its pass/fail are redefined below)
gc_find_cupti
echo "libcupti: ${MEGATRON_CUPTI_LIB:-<not found by find; relying on LD_LIBRARY_PATH>}" | tee "$O/env.txt"
ldd "$BIN/pretrain_gpt" | grep -E "cublas|cudart|nccl|not found" >> "$O/env.txt"
status=0
pass() { echo "PASS kprof: $*"; }
fail() { echo "FAIL kprof: $*"; status=1; }

COMMON=(--mock-data --tokenizer-type NullTokenizer --vocab-size 1024 --attention-dropout 0 --hidden-dropout 0 --seed 1234
  --data-cache-path "$O/cache" --num-layers 2 --hidden-size 512 --ffn-hidden-size 1536 --num-attention-heads 8
  --group-query-attention --num-query-groups 2 --kv-channels 64 --seq-length 512 --max-position-embeddings 512
  --position-embedding-type rope --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights
  --disable-bias-linear --micro-batch-size 4 --global-batch-size 8 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine
  --lr-warmup-iters 1 --clip-grad 1.0 --bf16 --log-interval 1)

# 1) MEGATRON_KERNEL_PROFILE=3:4 (iterations 3 and 4), JSON to $O/env_json.
MEGATRON_KERNEL_PROFILE=3:4 MEGATRON_KERNEL_PROFILE_OUT="$O/env_json" timeout 60 "$BIN/pretrain_gpt" "${COMMON[@]}" \
  --train-iters 5 --eval-iters 0 > "$O/profile_env.log" 2>&1
echo "rc $?" >> "$O/profile_env.log"
grep "kernel profile" "$O/profile_env.log" | head -60
check_json() {  # check_json NAME FILE STEPS
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
name, path, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    j = json.load(open(path))
except Exception as e:
    print(f"FAIL kprof: {name}: no JSON at {path}: {e}"); sys.exit(1)
c = j["categories"]; ok = True
def check(cond, what):
    global ok
    print(("PASS" if cond else "FAIL") + f" kprof: {name}: {what}")
    ok &= bool(cond)
ex = sum(v["exclusive_ms"] for v in c.values())
check(j["steps"] == steps, f"steps {j['steps']} == {steps}")
check(c["gemm"]["exclusive_ms"] > 0, f"GEMM time {c['gemm']['exclusive_ms']:.3f} ms > 0 "
      f"(share of busy {100*c['gemm']['exclusive_ms']/max(j['busy_ms'],1e-9):.1f}%)")
check(c["attention"]["count"] > 0, f"attention kernels counted: {c['attention']['count']}")
check(0 < j["busy_ms"] <= j["wall_ms"] * (1 + 1e-9), f"0 < busy {j['busy_ms']:.3f} <= wall {j['wall_ms']:.3f} ms")
check(abs(ex - j["busy_ms"]) <= 1e-6 * j["wall_ms"] + 1e-6, f"categories sum {ex:.4f} == busy {j['busy_ms']:.4f} ms")
check(abs(j["busy_ms"] + j["idle_ms"] - j["wall_ms"]) <= 1e-6 * j["wall_ms"], "busy + idle == wall")
check(all(v["total_ms"] >= v["exclusive_ms"] - 1e-6 for v in c.values()), "per category total >= exclusive")
g = sum(b["ms"] for b in j["idle_gaps_by_length"])
check(abs(g - j["idle_ms"]) <= 1e-6 * j["wall_ms"] + 1e-6, f"idle gaps by length sum {g:.4f} == idle {j['idle_ms']:.4f} ms "
      + ", ".join(f"{b['length']}: {b['count']} / {b['ms']:.3f} ms" for b in j["idle_gaps_by_length"]))
check(len(j["top_kernels"]) > 0 and len(j["longest_gaps"]) > 0,
      f"{len(j['top_kernels'])} top kernels, {len(j['longest_gaps'])} gaps; top: {j['top_kernels'][0]['name'] if j['top_kernels'] else '-'}")
check(j["dropped_records"] == 0, f"dropped records {j['dropped_records']}")
sys.exit(0 if ok else 1)
PY
}
if grep -q "kernel profile | gemm" "$O/profile_env.log"; then pass "env: table printed"; else fail "env: no table (tail: $(tail -3 "$O/profile_env.log" | tr '\n' ' '))"; fi
check_json env "$O/env_json/kernel_profile_rank0.json" 2 || status=1

# 2) Megatron's flags: --profile --profile-step-start 2 --profile-step-end 4 (iterations 3, 4), JSON to --tensorboard-dir.
timeout 60 "$BIN/pretrain_gpt" "${COMMON[@]}" --train-iters 5 --eval-iters 0 --profile --profile-step-start 2 \
  --profile-step-end 4 --tensorboard-dir "$O/tb" > "$O/profile_flags.log" 2>&1
echo "rc $?" >> "$O/profile_flags.log"
if grep -q "kernel profile | gemm" "$O/profile_flags.log"; then pass "flags: table printed"; else fail "flags: no table"; fi
check_json flags "$O/tb/kernel_profile_rank0.json" 2 || status=1

# 3) Without profiling nothing is printed.
timeout 60 "$BIN/pretrain_gpt" "${COMMON[@]}" --train-iters 3 --eval-iters 1 --eval-interval 3 \
  --save "$O/ckpt" --save-interval 3 > "$O/noprofile.log" 2>&1
echo "rc $?" >> "$O/noprofile.log"
if ! grep -q "^rc 0" "$O/noprofile.log"; then fail "run without profiling failed (tail: $(tail -3 "$O/noprofile.log" | tr '\n' ' '))"
elif grep -q "kernel profile" "$O/noprofile.log"; then fail "profile output without --profile"; else pass "off by default"; fi

# 4) Evaluation only on the GPU: the checkpoint of 3), no grads/optimizer state, same validation loss.
timeout 60 "$BIN/pretrain_gpt" "${COMMON[@]}" --skip-train --load "$O/ckpt" --no-load-optim --no-load-rng \
  --eval-iters 1 > "$O/evalonly.log" 2>&1
echo "rc $?" >> "$O/evalonly.log"
ref=$(grep -E "validation loss at iteration 3 \|" "$O/noprofile.log" | head -1 | sed -n 's/.*lm loss value: \([0-9.E+-]*\).*/\1/p')
got=$(grep -E "validation loss at iteration 3 on validation set" "$O/evalonly.log" | head -1 | sed -n 's/.*lm loss value: \([0-9.E+-]*\).*/\1/p')
echo "eval-only: $(grep 'allocated bytes' "$O/evalonly.log") / training: $(grep 'allocated bytes' "$O/noprofile.log")"
if [ -n "$ref" ] && [ -n "$got" ] && python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if abs(a-b)<=1e-5*abs(a) else 1)" "$ref" "$got"; then
  pass "eval-only validation loss $got == training's $ref (1e-5: same bf16 kernels, printed 7 digits)"
else fail "eval-only validation loss '$got' vs training '$ref' (tail: $(tail -3 "$O/evalonly.log" | tr '\n' ' '))"; fi
if grep -q "allocated bytes: parameters [0-9]* | main grads 0 | optimizer state 0$" "$O/evalonly.log"; then
  pass "eval-only allocates no grads/optimizer state"; else fail "eval-only allocation line missing or non-zero"; fi
echo "kprof_check: status $status (logs and JSON in $O)"
exit $status
