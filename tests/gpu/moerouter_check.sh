#!/usr/bin/env bash
# The MoE device router and permutation on one H200 (docs/moe.md "Kernels", "Performance"; issue 22).
#   tests/gpu/moerouter_check.sh BIN_DIR LOGDIR   (a CUDA build's bin: gpu_ops_test, gpu_bench, pretrain_gpt)
# About 2 minutes. Logs (small text files) under LOGDIR. PASS/FAIL and RESULT lines; exit 1 on any FAIL.
#  1. gpu_ops_test --only router: the device router / permute / unpermute / router backward
#     against the host float64 router, and a whole MoELayer with MEGATRON_MOE_DEVICE_ROUTER=1 vs
#     =0 (bounds in the test's header comment). PASS = every check of the group passed.
#  2. gpu_bench moe_layer with MEGATRON_MOE_DEVICE_ROUTER=0 (host router) and =1 (device router):
#     the Mixtral-8x7B- and Qwen3-30B-A3B-shaped MoELayer fwd + bwd and the router + permute +
#     unpermute + aux-loss share (goal: <= 10 % with the device router at both shapes; INFO only,
#     a figure, not a correctness check).
#  3. a 2-layer Mixtral-shaped pretrain_gpt (as bench/gpu/moe_bench.sh, 6 iterations) with the
#     switch 0 / 1: lm loss and load_balancing_loss per iteration. Bound: iteration 1 within 1e-3
#     relative (same logits; the selection is on the logits, so only the float32-vs-float64 probs,
#     both rounded to bf16, differ) and every iteration within 2e-2 (bf16 Adam steps amplify
#     last-bit differences, as in tests/gpu/moegemm_check.sh); TFLOP/s/GPU of iterations 3..6.
set -u
BIN=${1:?usage: tests/gpu/moerouter_check.sh BIN_DIR LOGDIR}
LOG=${2:?usage: tests/gpu/moerouter_check.sh BIN_DIR LOGDIR}
BIN=$(cd "$BIN" && pwd)
mkdir -p "$LOG"
source "$(dirname "$0")/cuda_libs.sh"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
status=0

# 1. kernels and layer vs the host router
timeout 60 "$BIN/gpu_ops_test" --only router > "$LOG/gpu_ops_test_router.log" 2>&1
rc=$?
grep -E '^FAIL' "$LOG/gpu_ops_test_router.log" | head -20
npass=$(grep -c '^PASS' "$LOG/gpu_ops_test_router.log"); nfail=$(grep -c '^FAIL' "$LOG/gpu_ops_test_router.log")
if [ "$rc" = 0 ] && [ "$nfail" = 0 ] && [ "$npass" -gt 40 ]; then
  echo "PASS gpu_ops_test --only router ($npass checks)"
else
  echo "FAIL gpu_ops_test --only router rc=$rc, $npass passed, $nfail failed (see $LOG/gpu_ops_test_router.log)"
  tail -5 "$LOG/gpu_ops_test_router.log"; status=1
fi

# 2. layer share, host vs device router
for r in 0 1; do
  MEGATRON_MOE_DEVICE_ROUTER=$r timeout 100 "$BIN/gpu_bench" moe_layer > "$LOG/gpu_bench_moe_layer_router$r.log" 2>&1
  echo "INFO gpu_bench moe_layer MEGATRON_MOE_DEVICE_ROUTER=$r rc=$?"
  name=$([ $r = 1 ] && echo device || echo host)
  for shape in mixtral-8x7b qwen3-30b-a3b; do
    ms=$(grep -E "^moe $shape layer fwd\+bwd" "$LOG/gpu_bench_moe_layer_router$r.log" | awk '{for(i=1;i<=NF;i++) if($i=="ms") print $(i-1)}')
    share=$(grep -E "^moe $shape router\+permute\+unpermute\+aux share" "$LOG/gpu_bench_moe_layer_router$r.log" | awk '{print $(NF-1)}')
    grep -E "^moe $shape layer: FAILED" "$LOG/gpu_bench_moe_layer_router$r.log" && status=1
    echo "RESULT moe_layer_ms_${shape}_${name}_router ${ms:-NA} ms"
    echo "RESULT moe_router_share_${shape}_${name}_router ${share:-NA} %"
  done
done

# 3. 2-layer Mixtral-shaped pretrain_gpt, host vs device router
source "$(dirname "$0")/moe_mixtral2l_args.sh"
mixtral2l_args "$LOG/cache"
mixtral2l_run_routers "$LOG/pretrain_router" 120 ""
rm -rf "$LOG/cache"
python3 - "$LOG/pretrain_router0.log" "$LOG/pretrain_router1.log" <<'PY' || status=1
import re, sys
def parse(path):
    it = {}
    try:
        for line in open(path):
            m = re.search(r'\] iteration +(\d+)/.*lm loss: ([0-9.E+-]+)', line)
            if not m: continue
            lb = re.search(r'load_balancing_loss: ([0-9.E+-]+)', line)
            tf = re.search(r'throughput per GPU \(TFLOP/s/GPU\): ([0-9.]+)', line)
            it[int(m.group(1))] = (float(m.group(2)), float(lb.group(1)) if lb else None, float(tf.group(1)) if tf else None)
    except OSError:
        pass
    return it
h, d = parse(sys.argv[1]), parse(sys.argv[2])
for name, r in (('host', h), ('device', d)):
    tf = [r[i][2] for i in sorted(r) if i >= 3 and r[i][2] is not None]
    print('RESULT moe_pretrain_mixtral2l_tflops_%s_router %s TFLOP/s/GPU' % (name, '%.1f' % (sum(tf) / len(tf)) if tf else 'NA'))
if len(h) != 6 or sorted(h) != sorted(d):
    print('FAIL pretrain_gpt host vs device router: iterations %s vs %s' % (sorted(h), sorted(d))); sys.exit(1)
rel = {i: abs(d[i][0] - h[i][0]) / abs(h[i][0]) for i in h}
lb = {i: abs(d[i][1] - h[i][1]) / abs(h[i][1]) for i in h if h[i][1] and d[i][1] is not None}
ok = rel[1] <= 1e-3 and max(rel.values()) <= 2e-2 and len(lb) == 6 and lb[1] <= 1e-3 and max(lb.values()) <= 2e-2
print('%s pretrain_gpt device vs host router: lm loss rel diff it1 %.2e worst %.2e; load_balancing_loss it1 %.2e worst %.2e (lm loss %.4f -> %.4f)'
      % ('PASS' if ok else 'FAIL', rel[1], max(rel.values()), lb.get(1, float('nan')), max(lb.values()) if lb else float('nan'),
         h[1][0], h[6][0]))
sys.exit(0 if ok else 1)
PY
exit $status
