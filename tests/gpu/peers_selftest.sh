#!/usr/bin/env bash
# CPU self-test of the issue-21 peer scripts (no GPU, no torch, no llm.c build needed):
#  1. bench/gpu/llmc_data.py writes llm.c's token-file layout: the header read back with od
#     (magic 20240520, version 1, token count, zeros), the size 1024 + 2*N bytes, tokens < vocab,
#     the same tokens for the same seed;
#  2. `llmc_peer.sh parse` on step lines printed with llm.c's own printf format (train_gpt2.cu):
#     mean of steps 3..N against the mean computed here, and FAILED on a log without step lines;
#  3. torch_llama_peer.megatron_flops: LLaMA-3 8B at seq 8192 = 51.470 GFLOP/token
#     (docs/megatron-reference.md#flops) and ll4 gbs 1 = 544.4 TFLOP/s at 138.3 ms/iter, as our
#     own log printed them (bench/results.csv, suite e2e, 3ba2c1c, iteration 3; the log's ms has
#     one decimal, so +-0.2 TFLOP/s);
#  4. the `peers` suite of run_bench.sh end to end with stand-ins for pretrain_gpt, python3 (for
#     the torch peer only) and train_gpt2cu: PASS line, RESULT lines, and the paired rows
#     (value = ours, peer_value = the peer) that append_result.py wrote.
# Prints PASS/FAIL lines; exit 1 on any FAIL.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fails=0 passes=0
ok() { echo "PASS $*"; passes=$((passes + 1)); }
bad() { echo "FAIL $*"; fails=$((fails + 1)); }

# 1. data file
python3 "$ROOT/bench/gpu/llmc_data.py" "$T/a.bin" --tokens 1000 --seed 7 > /dev/null
python3 "$ROOT/bench/gpu/llmc_data.py" "$T/b.bin" --tokens 1000 --seed 7 > /dev/null
hdr=$(od -A n -t d4 -N 1024 -v "$T/a.bin" | tr -s ' \n' ' ' | sed 's/^ //; s/ $//')
want="20240520 1 1000$(printf ' 0%.0s' $(seq 1 253))"
[ "$hdr" = "$want" ] && ok "llmc_data header (od): magic 20240520, version 1, 1000 tokens, 253 zeros" || bad "llmc_data header: '${hdr:0:60}...'"
[ "$(stat -c %s "$T/a.bin")" = 3024 ] && ok "llmc_data size 1024 + 2*1000 bytes" || bad "llmc_data size $(stat -c %s "$T/a.bin")"
mx=$(od -A n -t u2 -j 1024 -v "$T/a.bin" | tr -s ' ' '\n' | grep -v '^$' | sort -n | tail -1)
[ "$mx" -lt 50257 ] && ok "llmc_data tokens < 50257 (max $mx)" || bad "llmc_data token $mx >= 50257"
cmp -s "$T/a.bin" "$T/b.bin" && ok "llmc_data same seed, same file" || bad "llmc_data not deterministic"

# 2. llm.c step-line parser
fmt='step %4d/%d | loss %7.6f (%+.2fz)| norm %6.4f (%+.2fz)| lr %.2e | %.2f ms | %.1f%% bf16 MFU | %.0f tok/s\n'
{ echo "val loss 10.99"
  for s in 1 2 3 4 5 6; do printf "$fmt" $s 6 10.9 0 3.2 0 3e-4 $(( s < 3 ? 900 : 130 + s )).25 41.0 480000; done
  echo "val loss 10.5"; } > "$T/llmc.log"
got=$(bash "$ROOT/bench/gpu/llmc_peer.sh" parse "$T/llmc.log" 64)
mean=$(python3 -c "print('%.2f' % ((133.25 + 134.25 + 135.25 + 136.25) / 4))")
tok=$(python3 -c "print('%.0f' % (64 * 1024 * 1000 / ((133.25 + 134.25 + 135.25 + 136.25) / 4)))")
case "$got" in "PEER llmc GBS=64: ms/iter $mean tokens/s $tok steps 4 "*) ok "llmc parse: $got" ;; *) bad "llmc parse: '$got' (want ms/iter $mean tokens/s $tok)" ;; esac
echo "no steps here" > "$T/empty.log"
got=$(bash "$ROOT/bench/gpu/llmc_peer.sh" parse "$T/empty.log" 64); rc=$?
[ $rc -ne 0 ] && [[ "$got" == "PEER llmc GBS=64 FAILED"* ]] && ok "llmc parse of a log without steps: FAILED, rc $rc" || bad "llmc parse empty: rc $rc '$got'"

# 3. FLOPs formula
python3 - "$ROOT/bench/gpu" <<'EOF' && ok "megatron_flops: 51.470 GFLOP/token (8B), ll4 544.4 TFLOP/s at 138.3 ms as our log" || bad "megatron_flops"
import sys; sys.path.insert(0, sys.argv[1])
import torch_llama_peer as t
g = t.megatron_flops(1, 8192, 32, 4096, 14336, 32, 8, 128, 128256) / 8192 / 1e9
assert abs(g - 51.470) < 5e-4, g
tf = t.megatron_flops(1, 8192, 4, 4096, 14336, 32, 8, 128, 128256) / 0.1383 / 1e12
assert abs(tf - 544.4) < 0.25, tf
EOF

# 4. the suite with stand-ins
mkdir -p "$T/bin" "$T/py" "$T/llmc"
cat > "$T/bin/pretrain_gpt" <<'EOF'
#!/usr/bin/env bash
it=0; gbs=0
while [ $# -gt 0 ]; do case $1 in --train-iters) it=$2; shift ;; --global-batch-size) gbs=$2; shift ;; esac; shift; done
for i in $(seq 1 "$it"); do
  printf ' [2026-12-02 13:00:00] iteration %8d/%8d | consumed samples: %12d | elapsed time per iteration (ms): %d.0 | throughput per GPU (TFLOP/s/GPU): 500.0 | global batch size: %5d | lm loss: 1.000000E+01 | loss scale: 1.0 |\n' "$i" "$it" $((i * gbs)) $((100 * gbs + i)) "$gbs"
done
EOF
cat > "$T/py/python3" <<'EOF'
#!/usr/bin/env bash
case "$1" in
  *torch_llama_peer.py) g=1; while [ $# -gt 0 ]; do [ "$1" = --gbs ] && g=$2; shift; done
    echo "torch 9.9.9 cuda 13.0 cudnn 0 stand-in gqa=repeat"
    echo "PEER torch_llama compile=1 L=4 S=8192 GBS=$g: ms/iter $((110 * g)).00 tokens/s 1 TFLOP/s 400.0 peak_mem_GiB 33.0 steps 5 (x)" ;;
  *) exec "$REAL_PYTHON3" "$@" ;;
esac
EOF
cat > "$T/llmc/train_gpt2cu" <<'EOF'
#!/usr/bin/env bash
d=0; x=0; while [ $# -gt 0 ]; do case $1 in -d) d=$2 ;; -x) x=$2 ;; esac; shift; done
fmt='step %4d/%d | loss %7.6f (%+.2fz)| norm %6.4f (%+.2fz)| lr %.2e | %.2f ms | %.1f%% bf16 MFU | %.0f tok/s\n'
for s in $(seq 1 "$x"); do printf "$fmt" "$s" "$x" 10.5 0 1.1 0 3e-4 $((d / 1024 * 2)).00 40 480000; done
EOF
chmod +x "$T/bin/pretrain_gpt" "$T/py/python3" "$T/llmc/train_gpt2cu"
echo "llm.c f1e2ace651495b74ae22d45d1723443fd00ecd3a" > "$T/llmc/llmc_commit.txt"
echo 0000000 > "$T/bin/commit.txt"
REAL_PYTHON3=$(command -v python3) PATH="$T/py:$PATH" OUT="$T/out" BENCH_MACHINE=selftest LLMC_DIR="$T/llmc" LLMC_DATA="$T/data" \
  bash "$ROOT/bench/gpu/run_bench.sh" peers "$T/bin" > "$T/suite.log" 2>&1
grep -q '^PASS peers: figures from ll4_bf16_gbs1 ll4_bf16_gbs1-peer ll4_bf16_gbs8 ll4_bf16_gbs8-peer gpt2_124m_mbs64_gbs64 gpt2_124m_mbs64_gbs64-peer gpt2_124m_mbs64_gbs512 gpt2_124m_mbs64_gbs512-peer$' "$T/suite.log" \
  && ok "peers suite with stand-ins: all 8 runs gave figures" || { bad "peers suite: no PASS line"; tail -20 "$T/suite.log"; }
# ours ll4 gbs 8 = 800 + i ms at iterations 3..6 -> 804.5; the peer 880: speed 880/804.5
grep -q '^RESULT ll4_bf16_gbs8 ours 804.50 ms/iter (81462 tokens/s) peer 880.00 ms/iter (74473 tokens/s) ours/peer speed 1.094x$' "$T/suite.log" \
  && ok "RESULT ll4_bf16_gbs8 line" || bad "RESULT ll4_bf16_gbs8: $(grep '^RESULT ll4_bf16_gbs8' "$T/suite.log")"
python3 - "$T/out/results.csv" <<'EOF' && ok "paired rows: value = ours, peer_value = peer (ll4 gbs 1, GPT-2 gbs 512)" || bad "paired rows"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
def one(prefix):
    r = [x for x in rows if x["metric"].startswith(prefix) and x["peer"]]
    assert len(r) == 1, (prefix, len(r))
    return r[0]
r = one("ll4_bf16_gbs1 ms/iter (ours iters 3-10")
assert float(r["value"]) == 106.5 and float(r["peer_value"]) == 110.0 and "torch.compile" in r["peer"], r
r = one("gpt2_124m_mbs64_gbs512 tokens/s (ours iters 3-6")
assert abs(float(r["value"]) - 524288 / 51204.5 * 1000) < 0.1 and float(r["peer_value"]) == round(524288 / 1024 * 1000), r
assert r["peer"].startswith("llm.c f1e2ace"), r
EOF
# Bad arguments to llmc_peer.sh run: one FAILED line naming the argument, before anything runs.
for args in "abc 12|GBS must be a positive multiple of 64 (the micro-batch), got 'abc'" \
            "96 12|GBS must be a positive multiple of 64 (the micro-batch), got '96'" \
            "64 2|STEPS must be an integer >= 3 (the figure is the mean of steps 3..STEPS), got '2'"; do
  a=${args%%|*}; want=${args#*|}
  got=$(bash "$ROOT/bench/gpu/llmc_peer.sh" run "$T/nollmc" "$T/nodata" $a "$T/bad.log" 2>&1); rc=$?
  if [ $rc -ne 0 ] && [ "$got" = "PEER llmc GBS=${a%% *} FAILED $want" ] && [ ! -e "$T/nodata" ]; then ok "llmc_peer.sh run $a refused: $want"
  else bad "llmc_peer.sh run $a: rc $rc, '$got'"; fi
done
echo "peers_selftest: $passes passed, $fails failed"
[ $fails -eq 0 ]
