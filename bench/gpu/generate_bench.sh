#!/usr/bin/env bash
# Text generation on one GPU (issue 23, docs/inference.md#performance): LLaMA-3-8B shape, bf16,
# random weights, megatron.cpp's run_text_generation_server beside transformers' generate (static
# KV cache) in the same call, both on the SAME weights:
#   1. transformers builds LlamaForCausalLM (seeded normal init, std 0.02), saves it (safetensors,
#      bf16) to a scratch dir, measures its decode at batch 1 and 32 and records the greedy
#      continuations (with the raw logits' top-2 margins) of the oracle prompts;
#   2. meanwhile (other CPU cores) our convert_checkpoint imports that HF model (--loader hf);
#   3. our server loads the import (--load) and runs the same decode measurements and prompts, three
#      times: with the decode step as a CUDA graph and the greedy loop pipelined (the default, "ours"),
#      with one graph launch per step (MEGATRON_DECODE_CUDA_GRAPH=1, rows marked "per-step graph";
#      GRAPH1=0 skips this run) and op by op (MEGATRON_DECODE_CUDA_GRAPH=0, rows marked "op by op");
#      their greedy tokens must be equal.
# Builds nothing. Needs python3 with torch + transformers (+ safetensors) and a CUDA build's bin/.
#
#   bash bench/gpu/generate_bench.sh BIN_DIR [OUT_DIR]          (from the repository root)
#   env: NUM_LAYERS (default 32), WORK (scratch, default /tmp/generate_bench_work; deleted at the
#        end: ~2 x 16 GB), PORT (5123), COMMIT (for the results rows; default BIN_DIR/commit.txt, else git rev-parse),
#        GRAPH1=0: no per-step-graph run (MEGATRON_DECODE_CUDA_GRAPH=1),
#        HF_COMPILE=1: also transformers' default static-cache mode on CUDA, the decode step
#        torch.compile'd (phase 3b; its compilation takes minutes: beyond the ~4 minutes otherwise)
# The transformers peer of the default run is eager (generation_config.disable_compile = True).
#
# Decode tokens/s is a difference, so prefill, start-up and HTTP overhead cancel:
#   tok/s = batch * (N2 - N1) / (t(N2) - t(N1)),  N1 = 32, N2 = 160 new tokens after a 128-token
#   prompt (min over repeats); stop_token -1 / eos None keep every sequence to the full length.
# HBM bound (issue 23): weight bytes / 4.8 TB/s per token at batch 1, weight bytes = all parameters
# x 2 (transformers' count, embedding included); also printed against the bytes a decode step reads
# (the embedding table less its b looked-up rows is not read).
# Greedy oracle: 2 prompts of 32 random ids, 64 new tokens each, ours (one request, batch 2: equal
# to one by one, docs/inference.md) vs transformers (batch 1 each); prints per prompt the first
# index where the tokens differ and transformers' top-2 logit margin there (bf16 noise, not a bug,
# when that margin is small), and the smallest margin before it.
# Output: OUT_DIR/gpu_bench_decode.log (gpu_bench decode: the step's GEMMs at m = 1 and 32 in GB/s
# of weights, the decode attention, the argmax), OUT_DIR/generate_bench.json, OUT_DIR/results_rows.csv (bench/append_result.py rows, ours
# as value, transformers as peer), OUT_DIR/kernel_profile.txt (our decode steps at batch 1 and 32,
# CUPTI, from two extra untimed requests of the default run; kernel_profile_graph1.txt and
# kernel_profile_eager.txt: the same of the per-step-graph and op-by-op runs), OUT_DIR/ours.json /
# ours_graph1.json / ours_eager.json (the server runs), logs (server.log, server_graph1.log,
# server_eager.log). If the import fails, ours runs on its own random init
# (perf only, no oracle) and says so.
set -euo pipefail
BIN=$(cd "${1:?usage: generate_bench.sh BIN_DIR [OUT_DIR]}" && pwd)
OUT=${2:-${OUT:-/tmp/generate_bench}}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
REPO=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${WORK:-/tmp/generate_bench_work}
PORT=${PORT:-5123}
NUM_LAYERS=${NUM_LAYERS:-32}
# The commit the binaries were built from (BIN_DIR/commit.txt, written by every build); the GPU
# machine's copy of the tree may carry a stale git HEAD, so git is only the fallback.
if [ -z "${COMMIT:-}" ] && [ -f "$BIN/commit.txt" ]; then COMMIT=$(cut -c1-7 "$BIN/commit.txt"); fi
COMMIT=${COMMIT:-$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)}
T0=$(date +%s)
phase() { echo "[generate_bench +$(($(date +%s) - T0)) s] $*"; }
for b in run_text_generation_server convert_checkpoint; do
  [[ -x "$BIN/$b" ]] || { echo "generate_bench: $BIN/$b missing (a CUDA build's bin/ is needed)"; exit 2; }
done
rm -rf "$WORK"
mkdir -p "$WORK"
SERVER_PID=""
CONVERT_PID=""
cleanup() {
  [[ -n "$SERVER_PID" ]] && kill "$SERVER_PID" 2>/dev/null || true
  [[ -n "$CONVERT_PID" ]] && kill "$CONVERT_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
NCPU=$(nproc)
HALF=$((NCPU / 2 > 0 ? NCPU / 2 : 1))
# transformers on the first half of the cores, the import on the other half (if taskset exists),
# so that the import does not slow transformers' Python launch loop.
PIN_HF=() PIN_CONV=()
if command -v taskset > /dev/null && ((NCPU >= 4)); then
  PIN_HF=(taskset -c "0-$((HALF - 1))")
  PIN_CONV=(taskset -c "$HALF-$((NCPU - 1))")
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>/dev/null || true
phase "GPU: $(cat "$OUT/gpu.txt" 2>/dev/null); layers $NUM_LAYERS; commit $COMMIT"

# ---- 0. the decode step's kernels alone (GEMMs at m = 1 / 32, decode attention, argmax) ------------
if [[ -x "$BIN/gpu_bench" ]]; then
  "$BIN/gpu_bench" decode > "$OUT/gpu_bench_decode.log" 2>&1 || echo "gpu_bench decode failed (rc $?)"
  cat "$OUT/gpu_bench_decode.log"
  phase "kernel timings done"
fi

# ---- 1. transformers: build + save, then (while we import) its decode and greedy runs ------------
"${PIN_HF[@]}" python3 - "$WORK" "$OUT" "$NUM_LAYERS" > "$OUT/hf.log" 2>&1 <<'PY' &
import json, os, sys, time
import torch, transformers
from transformers import LlamaConfig, LlamaForCausalLM
work, out, layers = sys.argv[1], sys.argv[2], int(sys.argv[3])
t0 = time.time()
cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                  num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=8192,
                  rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, initializer_range=0.02,
                  attention_bias=False, mlp_bias=False, hidden_act="silu")
torch.manual_seed(1234)
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    model = LlamaForCausalLM(cfg).eval()
torch.set_default_dtype(torch.float32)
model.generation_config.eos_token_id = None
model.generation_config.pad_token_id = 0
# Eager: transformers 5 would torch.compile the decode step of a static-cache generate on CUDA
# (minutes of compilation per shape); HF_COMPILE=1 measures that mode too (phase 3b).
model.generation_config.disable_compile = True
print(f"built in {time.time() - t0:.1f} s", flush=True)
model.save_pretrained(os.path.join(work, "hf"), safe_serialization=True, max_shard_size="5GB")
open(os.path.join(work, "hf.saved"), "w").write("ok")
print(f"saved at {time.time() - t0:.1f} s", flush=True)
weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
embed_bytes = model.model.embed_tokens.weight.numel() * 2

def gen(ids, n, **kw):
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, num_beams=1,
                              max_new_tokens=n, min_new_tokens=n, cache_implementation="static", **kw)

def timed(b, n):
    ids = torch.arange(1000, 1128, device="cuda")[None].repeat(b, 1)
    torch.cuda.synchronize(); t = time.perf_counter()
    gen(ids, n)
    torch.cuda.synchronize(); return time.perf_counter() - t

hf = {}
for b in (1, 32):
    timed(b, 8)
    t1, t2 = min(timed(b, 32) for _ in range(2)), min(timed(b, 160) for _ in range(2))
    hf[b] = b * 128 / (t2 - t1)
    print(f"batch {b}: {hf[b]:.1f} tok/s ({1e3 * (t2 - t1) / 128:.2f} ms/step)", flush=True)
g = torch.Generator().manual_seed(4321)
prompts = [torch.randint(0, 128000, (32,), generator=g).tolist() for _ in range(2)]
oracle = []
for p in prompts:
    r = gen(torch.tensor([p], device="cuda"), 64, output_logits=True, return_dict_in_generate=True)
    top2 = [torch.topk(l[0].float(), 2) for l in r.logits]
    oracle.append({"prompt": p, "tokens": r.sequences[0, len(p):].tolist(),
                   "top2_ids": [t.indices.tolist() for t in top2],
                   "margin": [float(t.values[0] - t.values[1]) for t in top2]})
json.dump({"tok_s": hf, "weight_bytes": weight_bytes, "embedding_bytes": embed_bytes, "oracle": oracle,
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__}},
          open(os.path.join(out, "hf.json"), "w"))
print(f"done at {time.time() - t0:.1f} s", flush=True)
PY
HF_PID=$!
while [[ ! -e "$WORK/hf.saved" ]]; do
  kill -0 $HF_PID 2>/dev/null || { wait $HF_PID || true; echo "generate_bench: transformers failed:"; tail -20 "$OUT/hf.log"; exit 1; }
  sleep 1
done
phase "transformers model saved ($(du -sh "$WORK/hf" | cut -f1)); importing it"

# ---- 2. our import of the same weights (other cores) -------------------------------------------
OMP_NUM_THREADS=$((NCPU - HALF)) "${PIN_CONV[@]}" "$BIN/convert_checkpoint" --loader hf --saver mcore \
  --load-dir "$WORK/hf" --save-dir "$WORK/ckpt" --make-vocab-size-divisible-by 128 > "$OUT/convert.log" 2>&1 &
CONVERT_PID=$!
HF_RC=0
wait $HF_PID || HF_RC=$?
phase "transformers done (rc $HF_RC): $(grep -E '^batch' "$OUT/hf.log" | tr '\n' ' ')"
((HF_RC == 0)) || { tail -20 "$OUT/hf.log"; exit 1; }
CONV_RC=0
wait $CONVERT_PID || CONV_RC=$?
CONVERT_PID=""
[[ "${HF_COMPILE:-0}" == 1 ]] || rm -rf "$WORK/hf"
LOAD=()
IMPORT_FLAGS=()
if ((CONV_RC == 0)); then
  LOAD=(--load "$WORK/ckpt")
  # The architecture flags the import printed (those its checkpoint args are checked against).
  read -r -a IMPORT_FLAGS <<< "$(sed -n 's/^model flags: //p' "$OUT/convert.log")"
  phase "import done: $(grep -E '^converted' "$OUT/convert.log")"
else
  phase "import FAILED (rc $CONV_RC, $OUT/convert.log): ours runs on its own random init, no greedy oracle"
  tail -5 "$OUT/convert.log"
fi

# ---- 3. ours -----------------------------------------------------------------------------------
MODEL=(--num-layers "$NUM_LAYERS" --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32
  --group-query-attention --num-query-groups 8 --kv-channels 128 --max-position-embeddings 8192
  --position-embedding-type rope --rotary-base 500000 --normalization RMSNorm --norm-epsilon 1e-5
  --swiglu --untie-embeddings-and-output-weights --disable-bias-linear --bf16
  --tokenizer-type NullTokenizer --vocab-size 128256 --make-vocab-size-divisible-by 128)
if ((${#IMPORT_FLAGS[@]} > 0)); then
  MODEL=("${IMPORT_FLAGS[@]}" --bf16 --tokenizer-type NullTokenizer --vocab-size 128256)
fi
echo "our model flags: ${MODEL[*]}"
# Server runs on the same checkpoint: MODE graph (the default: the decode step replays a CUDA
# graph and the greedy loop is pipelined, docs/inference.md "Pipelined decode"), MODE graph1
# (MEGATRON_DECODE_CUDA_GRAPH=1: one graph launch per step, after the previous step's ids were
# read) and MODE eager (MEGATRON_DECODE_CUDA_GRAPH=0: op by op), each with the same requests:
# timings, the greedy oracle prompts (the runs' tokens must be equal: the modes give the same bits)
# and the two profiled requests.
ours_server() {
  local mode=$1 log="$OUT/server.log" json="$OUT/ours.json" vars=(MEGATRON_GENERATE_PROFILE=16,17)
  if [[ $mode == eager ]]; then
    log="$OUT/server_eager.log" json="$OUT/ours_eager.json" vars=(MEGATRON_GENERATE_PROFILE=16,17 MEGATRON_DECODE_CUDA_GRAPH=0)
  elif [[ $mode == graph1 ]]; then
    log="$OUT/server_graph1.log" json="$OUT/ours_graph1.json" vars=(MEGATRON_GENERATE_PROFILE=16,17 MEGATRON_DECODE_CUDA_GRAPH=1)
  fi
  # Requests 16 and 17 (see the client below) record a kernel profile of their decode steps.
  env "${vars[@]}" MEGATRON_TEXT_GENERATION_HOST=127.0.0.1 "$BIN/run_text_generation_server" "${MODEL[@]}" "${LOAD[@]}" \
    --port "$PORT" --max-tokens-to-oom 100000 > "$log" 2>&1 &
  SERVER_PID=$!
  until grep -q "Serving Megatron" "$log"; do
    kill -0 $SERVER_PID 2>/dev/null || { echo "generate_bench: our server ($mode) exited:"; tail -20 "$log"; exit 1; }
    sleep 1
  done
  phase "our server up ($mode decode)"
  python3 - "$PORT" "$OUT" "${#LOAD[@]}" "$mode" "$json" <<'PY'
import json, sys, time, urllib.request
port, out, loaded, mode, out_json = sys.argv[1], sys.argv[2], sys.argv[3] != "0", sys.argv[4], sys.argv[5]
def put(prompts, n):
    body = json.dumps({"prompts": prompts, "tokens_to_generate": n, "top_k": 1, "stop_token": -1,
                       "no_log": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api", data=body, method="PUT",
                                 headers={"Content-Type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        res = json.loads(r.read())
    return time.perf_counter() - t, res
prompt = " ".join(str(1000 + i) for i in range(128))
ours = {}
for b in (1, 32):
    put([prompt] * b, 8)  # warm-up
    t1 = min(put([prompt] * b, 32)[0] for _ in range(3))
    t2 = min(put([prompt] * b, 160)[0] for _ in range(3))
    ours[b] = b * 128 / (t2 - t1)
    print(f"ours ({mode}) batch {b}: {ours[b]:.1f} tok/s ({1e3 * (t2 - t1) / 128:.2f} ms/step)", flush=True)
res = {"tok_s": ours, "loaded_hf_weights": loaded, "decode": mode}
# Request 15: the greedy oracle (always sent, so that the profiled requests keep their numbers).
hf = json.load(open(f"{out}/hf.json"))["oracle"]
_, r = put([" ".join(map(str, o["prompt"])) for o in hf], 64)
res["greedy_tokens"] = [t[len(o["prompt"]):len(o["prompt"]) + 64] for t, o in zip(r["tokens"], hf)]
json.dump(res, open(out_json, "w"))
# Requests 16 and 17: kernel profiles (MEGATRON_GENERATE_PROFILE) at batch 1 and 32; not timed.
for b in (1, 32):
    put([prompt] * b, 64)
PY
  kill -TERM $SERVER_PID
  wait $SERVER_PID || true
  SERVER_PID=""
  phase "ours done ($mode decode)"
}
ours_server graph
rm -f "$OUT/ours_graph1.json"
if [[ "${GRAPH1:-1}" != 0 ]]; then ours_server graph1; fi
ours_server eager
grep -E "^text generation:" "$OUT/server.log" || true  # a graph capture failure would be noted here
grep -E "^generate call|kernel profile \|" "$OUT/server.log" > "$OUT/kernel_profile.txt" || true
grep -E "^generate call|kernel profile \|" "$OUT/server_eager.log" > "$OUT/kernel_profile_eager.txt" || true
echo "kernel profile, decode step as a CUDA graph, greedy loop pipelined:"; cat "$OUT/kernel_profile.txt"
if [[ -f "$OUT/server_graph1.log" && -f "$OUT/ours_graph1.json" ]]; then
  grep -E "^generate call|kernel profile \|" "$OUT/server_graph1.log" > "$OUT/kernel_profile_graph1.txt" || true
  echo "kernel profile, one graph launch per step (MEGATRON_DECODE_CUDA_GRAPH=1):"; cat "$OUT/kernel_profile_graph1.txt"
fi
echo "kernel profile, op by op (MEGATRON_DECODE_CUDA_GRAPH=0):"; cat "$OUT/kernel_profile_eager.txt"

# ---- 3b. optional (HF_COMPILE=1): transformers' default static-cache mode, the decode step compiled ----
if [[ "${HF_COMPILE:-0}" == 1 ]]; then
  "${PIN_HF[@]}" python3 - "$WORK" "$OUT" > "$OUT/hf_compiled.log" 2>&1 <<'PY' || echo "transformers compiled run failed: $(tail -3 "$OUT/hf_compiled.log")"
import json, os, sys, time
import torch
from transformers import LlamaForCausalLM
work, out = sys.argv[1], sys.argv[2]
model = LlamaForCausalLM.from_pretrained(os.path.join(work, "hf"), dtype=torch.bfloat16, device_map="cuda").eval()
model.generation_config.eos_token_id = None
model.generation_config.pad_token_id = 0
model.generation_config.disable_compile = False
def timed(b, n):
    ids = torch.arange(1000, 1128, device="cuda")[None].repeat(b, 1)
    torch.cuda.synchronize(); t = time.perf_counter()
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, num_beams=1,
                       max_new_tokens=n, min_new_tokens=n, cache_implementation="static")
    torch.cuda.synchronize(); return time.perf_counter() - t
res = {}
for b in (1, 32):
    t = time.time()
    timed(b, 160); timed(b, 160)  # compiles; the 288-token cache is then reused by every call of this batch size
    print(f"batch {b}: compiled in {time.time() - t:.0f} s", flush=True)
    t1, t2 = min(timed(b, 32) for _ in range(2)), min(timed(b, 160) for _ in range(2))
    res[b] = b * 128 / (t2 - t1)
    print(f"batch {b}: {res[b]:.1f} tok/s ({1e3 * (t2 - t1) / 128:.2f} ms/step), compiled", flush=True)
json.dump({"tok_s": res}, open(os.path.join(out, "hf_compiled.json"), "w"))
PY
  phase "transformers compiled: $(grep -E 'tok/s' "$OUT/hf_compiled.log" | tr '\n' ' ')"
fi

# ---- 4. summary and results rows ---------------------------------------------------------------
python3 - "$OUT" "$NUM_LAYERS" "$COMMIT" "$REPO" <<'PY'
import datetime, json, subprocess, sys
out, layers, commit, repo = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
hf, ours = json.load(open(f"{out}/hf.json")), json.load(open(f"{out}/ours.json"))
eager = json.load(open(f"{out}/ours_eager.json"))
E = {int(k): v for k, v in eager["tok_s"].items()}
try:
    graph1 = json.load(open(f"{out}/ours_graph1.json"))
    G1 = {int(k): v for k, v in graph1["tok_s"].items()}
except FileNotFoundError:
    graph1, G1 = None, {}
H = {int(k): v for k, v in hf["tok_s"].items()}
try:
    HC = {int(k): v for k, v in json.load(open(f"{out}/hf_compiled.json"))["tok_s"].items()}
except FileNotFoundError:
    HC = {}
O = {int(k): v for k, v in ours["tok_s"].items()}
wb, eb = hf["weight_bytes"], hf["embedding_bytes"]
bound_all, bound_read = 4.8e12 / wb, 4.8e12 / (wb - eb)
shape = "LLaMA-3-8B shape" if layers == 32 else f"LLaMA-3-8B shape with {layers} layers"
res = {"shape": shape, "weight_bytes": wb, "hbm_bound_tok_s_batch1": bound_all,
       "hbm_bound_ms_per_token": 1e3 / bound_all, "read_bytes_bound_tok_s_batch1": bound_read,
       "ours_tok_s": O, "transformers_static_cache_tok_s": H,
       "ours_ms_per_step": {b: 1e3 * b / O[b] for b in O}, "transformers_ms_per_step": {b: 1e3 * b / H[b] for b in H},
       "ours_batch1_fraction_of_hbm_bound": O[1] / bound_all,
       "speedup_vs_transformers": {b: O[b] / H[b] for b in (1, 32)}, "versions": hf["versions"],
       "transformers_compiled_tok_s": HC, "speedup_vs_transformers_compiled": {b: O[b] / HC[b] for b in HC},
       "ours_loaded_transformers_weights": ours["loaded_hf_weights"],
       "ours_eager_decode_tok_s": E, "ours_eager_decode_ms_per_step": {b: 1e3 * b / E[b] for b in E},
       "graph_speedup_vs_eager_decode": {b: O[b] / E[b] for b in (1, 32)},
       "graph_greedy_tokens_equal_eager": ours["greedy_tokens"] == eager["greedy_tokens"],
       "ours_graph1_tok_s": G1, "ours_graph1_ms_per_step": {b: 1e3 * b / G1[b] for b in G1},
       "pipelined_speedup_vs_graph1": {b: O[b] / G1[b] for b in G1},
       "pipelined_greedy_tokens_equal_graph1": None if graph1 is None else ours["greedy_tokens"] == graph1["greedy_tokens"]}
lines = [f"CUDA graph decode vs op by op (MEGATRON_DECODE_CUDA_GRAPH=0): greedy oracle tokens "
         f"{'EQUAL' if res['graph_greedy_tokens_equal_eager'] else 'DIFFER (a bug: the modes must agree bit for bit)'}"]
if graph1 is not None:
    lines.append(f"pipelined vs per-step graph (MEGATRON_DECODE_CUDA_GRAPH=1): greedy oracle tokens "
                 f"{'EQUAL' if res['pipelined_greedy_tokens_equal_graph1'] else 'DIFFER (a bug: the modes must agree bit for bit)'}")
if ours["loaded_hf_weights"]:
    res["greedy"] = []
    for i, (o, mine) in enumerate(zip(hf["oracle"], ours["greedy_tokens"])):
        ref = o["tokens"]
        div = next((j for j in range(min(len(ref), len(mine))) if ref[j] != mine[j]), None)
        n_eq = div if div is not None else min(len(ref), len(mine))
        g = {"prompt": i, "equal_tokens": n_eq, "of": len(ref), "first_divergence": div,
             "min_margin_before": min(o["margin"][:n_eq]) if n_eq else None}
        if div is not None:
            g.update(margin_at_divergence=o["margin"][div], transformers_top2=o["top2_ids"][div], ours=mine[div])
        res["greedy"].append(g)
        lines.append(f"greedy prompt {i}: {n_eq}/{len(ref)} tokens equal" +
                     (f"; first divergence at {div}: transformers top-2 {o['top2_ids'][div]} margin "
                      f"{o['margin'][div]:.4f}, ours {mine[div]}" if div is not None else "") +
                     (f"; smallest margin before it {g['min_margin_before']:.4f}" if n_eq else ""))
json.dump(res, open(f"{out}/generate_bench.json", "w"), indent=1)
print(json.dumps(res, indent=1))
print("\n".join(lines))
for b in (1, 32):
    print(f"batch {b}: ours {O[b]:.1f} tok/s ({1e3 * b / O[b]:.2f} ms/step), transformers {H[b]:.1f} tok/s "
          f"({1e3 * b / H[b]:.2f} ms/step): {O[b] / H[b]:.2f}x")
for b in (1, 32):
    print(f"batch {b}: ours op by op (MEGATRON_DECODE_CUDA_GRAPH=0) {E[b]:.1f} tok/s ({1e3 * b / E[b]:.2f} ms/step); "
          f"graph {O[b] / E[b]:.3f}x of that")
for b in G1:
    print(f"batch {b}: ours per-step graph (MEGATRON_DECODE_CUDA_GRAPH=1) {G1[b]:.1f} tok/s ({1e3 * b / G1[b]:.2f} ms/step); "
          f"pipelined {O[b] / G1[b]:.3f}x of that")
for b in HC:
    print(f"batch {b}: transformers torch.compile {HC[b]:.1f} tok/s ({1e3 * b / HC[b]:.2f} ms/step): ours {O[b] / HC[b]:.2f}x")
print(f"batch 1: {1e3 / O[1]:.2f} ms/token = {O[1] / bound_all:.1%} of the HBM bound {1e3 / bound_all:.2f} ms "
      f"({wb / 1e9:.2f} GB / 4.8 TB/s); goal >= 70% and >= 2x transformers")
try:
    gpu = open(f"{out}/gpu.txt").read().split(",")
    machine = f"1x H200 (nvidia-h200; driver {gpu[1].strip()})"
except Exception:
    machine = "1x H200 (nvidia-h200)"
cmd = "bash bench/gpu/generate_bench.sh BIN_DIR" + ("" if layers == 32 else f" (NUM_LAYERS={layers})")
note = f"random weights (std 0.02), transformers {hf['versions']['transformers']} torch {hf['versions']['torch']}"
def row(metric, value, unit, peer_value=None, peer="transformers generate static cache eager"):
    a = [sys.executable, f"{repo}/bench/append_result.py", "--results", f"{out}/results_rows.csv",
         "--commit", commit, "--machine", machine, "--suite", "generate", "--command", cmd,
         "--source", f"{out}/generate_bench.json", "--note", note,
         "--date", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
         "value", "--metric", metric, "--value", f"{value:.6g}", "--unit", unit]
    if peer_value is not None:
        a += ["--peer", peer, "--peer-value", f"{peer_value:.6g}"]
    subprocess.run(a, check=True)
for b in (1, 32):
    row(f"{shape} bf16 decode batch {b} tokens/s", O[b], "tokens/s", H[b])
    row(f"{shape} bf16 decode batch {b} ms/step", 1e3 * b / O[b], "ms", 1e3 * b / H[b])
    row(f"{shape} bf16 decode batch {b} tokens/s, op by op (MEGATRON_DECODE_CUDA_GRAPH=0)", E[b], "tokens/s", H[b])
    row(f"{shape} bf16 decode batch {b} ms/step, op by op (MEGATRON_DECODE_CUDA_GRAPH=0)", 1e3 * b / E[b], "ms",
        1e3 * b / H[b])
    if b in G1:
        row(f"{shape} bf16 decode batch {b} tokens/s, per-step graph (MEGATRON_DECODE_CUDA_GRAPH=1)", G1[b], "tokens/s",
            H[b])
        row(f"{shape} bf16 decode batch {b} ms/step, per-step graph (MEGATRON_DECODE_CUDA_GRAPH=1)", 1e3 * b / G1[b],
            "ms", 1e3 * b / H[b])
if HC:
    for b in HC:
        row(f"{shape} bf16 decode batch {b} tokens/s (peer: transformers torch.compile)", O[b], "tokens/s", HC[b],
            peer="transformers generate static cache torch.compile")
row(f"{shape} bf16 decode batch 1 fraction of HBM bound (weight bytes / 4.8 TB/s)", O[1] / bound_all, "ratio")
for g in res.get("greedy", []):
    row(f"{shape} bf16 greedy prompt {g['prompt']} tokens equal to transformers (of {g['of']})",
        g["equal_tokens"], "tokens")
import os
if os.path.exists(f"{out}/gpu_bench_decode.log"):
    subprocess.run([sys.executable, f"{repo}/bench/append_result.py", "--results", f"{out}/results_rows.csv",
                    "--commit", commit, "--machine", machine, "--suite", "generate",
                    "--command", "BIN_DIR/gpu_bench decode", "--source", f"{out}/gpu_bench_decode.log",
                    "--date", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
                    "bench-lines", f"{out}/gpu_bench_decode.log"], check=False)
print(open(f"{out}/results_rows.csv").read())
PY
phase "done"
