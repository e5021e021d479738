#!/usr/bin/env bash
# Decode throughput of run_text_generation_server on one GPU, LLaMA-3-8B shape, bf16, random
# weights (no --load), beside transformers' generate (static KV cache, same shape, random weights)
# in the same run. Not a CPU test: the lead runs it on the H200 machine.
#
#   bash bench/gpu/generate_bench.sh BUILD_BIN_DIR [OUT_DIR]
#
# Decode tokens/s is measured as a difference, so prefill, start-up and HTTP overhead cancel:
#   tok/s = batch * (N2 - N1) / (t(N2) - t(N1)),  N1 = 32, N2 = 160 new tokens after a 128-token prompt.
# stop_token -1 (never sampled) keeps every sequence to the full length; greedy (top_k 1).
# Prints and writes OUT_DIR/generate_bench.json: ours and transformers' tok/s at batch 1 and 32, and
# batch-1 decode against the HBM bound weight_bytes / 4.8 TB/s per token (issue 23 goal >= 70%).
set -euo pipefail
BIN=${1:?usage: generate_bench.sh BUILD_BIN_DIR [OUT_DIR]}
OUT=${2:-${OUT:-/tmp/generate_bench}}
mkdir -p "$OUT"
PORT=${PORT:-5123}
MODEL=(--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32
  --group-query-attention --num-query-groups 8 --kv-channels 128 --max-position-embeddings 8192
  --position-embedding-type rope --rotary-base 500000 --normalization RMSNorm --norm-epsilon 1e-5
  --swiglu --untie-embeddings-and-output-weights --disable-bias-linear --bf16
  --tokenizer-type NullTokenizer --vocab-size 128256 --make-vocab-size-divisible-by 128)
MEGATRON_TEXT_GENERATION_HOST=127.0.0.1 "$BIN/run_text_generation_server" "${MODEL[@]}" --port "$PORT" \
  --max-tokens-to-oom 100000 > "$OUT/server.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true' EXIT
for _ in $(seq 600); do grep -q "Serving Megatron" "$OUT/server.log" && break; kill -0 $PID; sleep 1; done
python3 - "$PORT" "$OUT" <<'PY'
import json, sys, time, urllib.request
port, out = sys.argv[1], sys.argv[2]
prompt = " ".join(str(1000 + i) for i in range(128))
def timed(b, n):
    body = json.dumps({"prompts": [prompt] * b, "tokens_to_generate": n, "top_k": 1, "stop_token": -1,
                       "no_log": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api", data=body, method="PUT",
                                 headers={"Content-Type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=3600) as r:
        r.read()
    return time.perf_counter() - t
ours = {}
for b in (1, 32):
    timed(b, 8)  # warm-up
    t1, t2 = min(timed(b, 32) for _ in range(3)), min(timed(b, 160) for _ in range(3))
    ours[b] = b * 128 / (t2 - t1)
json.dump(ours, open(f"{out}/ours.json", "w"))
print("megatron.cpp decode tok/s", ours)
PY
kill -TERM $PID; wait $PID || true; trap - EXIT
python3 - "$OUT" <<'PY'
import json, sys, time, torch
from transformers import LlamaConfig, LlamaForCausalLM
out = sys.argv[1]
cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                  rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)
with torch.device("cuda"):
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
model.generation_config.eos_token_id = None
model.generation_config.pad_token_id = 0
weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
def timed(b, n):
    ids = torch.arange(1000, 1128, device="cuda")[None].repeat(b, 1)
    torch.cuda.synchronize(); t = time.perf_counter()
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                       min_new_tokens=n, cache_implementation="static")
    torch.cuda.synchronize(); return time.perf_counter() - t
hf = {}
for b in (1, 32):
    timed(b, 8)
    t1, t2 = min(timed(b, 32) for _ in range(2)), min(timed(b, 160) for _ in range(2))
    hf[b] = b * 128 / (t2 - t1)
ours = {int(k): v for k, v in json.load(open(f"{out}/ours.json")).items()}
bound = 4.8e12 / weight_bytes
res = {"weight_bytes": weight_bytes, "hbm_bound_tok_s_batch1": bound,
       "ours_tok_s": ours, "transformers_static_cache_tok_s": hf,
       "ours_batch1_fraction_of_hbm_bound": ours[1] / bound,
       "speedup_vs_transformers": {b: ours[b] / hf[b] for b in (1, 32)},
       "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__}}
json.dump(res, open(f"{out}/generate_bench.json", "w"), indent=1)
print(json.dumps(res, indent=1))
PY
