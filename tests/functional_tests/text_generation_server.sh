#!/usr/bin/env bash
# run_text_generation_server end to end with real HTTP clients (curl and Python's urllib), on the
# tiny LLaMA imported from Hugging Face (convert_checkpoint --loader hf) and on a checkpoint
# trained by pretrain_gpt: the one-shot --prompts answer; concurrent PUT /api requests equal to it;
# text_generation_cli; Megatron's 400 messages for malformed JSON, a missing field, a negative
# tokens_to_generate and a prompt longer than the context; 100 parallel clients; clients that
# disconnect mid-request; bounded memory; clean exit on SIGTERM; TP2 (mpirun) equal to TP1.
# Only the server processes this script starts are signalled, by PID. Loopback only.
# Args: <bin dir> <source dir>
BIN=$1 SRC=$2
source "$SRC/tests/functional_tests/dist_common.inc"
set -eo pipefail
SERVER_PID=
cleanup() { [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null; rm -rf "$LOGDIR"; }
trap cleanup EXIT
D=$LOGDIR

"$BIN/convert_checkpoint" --loader hf --saver mcore --load-dir "$SRC/tests/reference/hf/llama_tiny" \
  --save-dir "$D/llama.ckpt" > "$D/convert.log"
MODEL=(--num-layers 2 --hidden-size 64 --ffn-hidden-size 176 --num-attention-heads 4 --kv-channels 16
  --max-position-embeddings 64 --normalization RMSNorm --norm-epsilon 1e-05 --position-embedding-type rope
  --group-query-attention --num-query-groups 2 --rotary-base 500000 --swiglu --disable-bias-linear
  --untie-embeddings-and-output-weights --make-vocab-size-divisible-by 128
  --load "$D/llama.ckpt" --tokenizer-type NullTokenizer --vocab-size 256)

# 1. One-shot answer (greedy: Megatron's --top_k default 1) = the reference for the server's answers.
"$BIN/run_text_generation_server" "${MODEL[@]}" --prompts "1 2 3 4" "10 20" --num-tokens-to-generate 8 \
  > "$D/oneshot.log" || { cat "$D/oneshot.log"; fail "one-shot generation failed"; }
tail -1 "$D/oneshot.log" > "$D/oneshot.json"
python3 - "$D/oneshot.json" <<'EOF' || fail "one-shot output malformed"
import json, sys
r = json.load(open(sys.argv[1]))
assert set(r) == {"text", "segments", "logprobs", "tokens"}, r.keys()
# "10 20" is shorter: Megatron's batch generates to longest prompt + 8 = 12 tokens for both.
assert [len(t) for t in r["tokens"]] == [12, 12], r["tokens"]
assert r["tokens"][0][:4] == [1, 2, 3, 4] and r["tokens"][1][:2] == [10, 20]
assert r["text"][0] == " ".join(map(str, r["tokens"][0]))
assert r["segments"][0][:2] == ["1 ", "2 "] and "".join(r["segments"][0]) == r["text"][0]
assert [len(l) for l in r["logprobs"]] == [11, 11] and all(-20 < x < 0 for x in r["logprobs"][0])
EOF
echo "one-shot --prompts: Megatron's response fields and batch lengths"

# 2. The server on a free loopback port.
PORT=$(free_port)
MEGATRON_TEXT_GENERATION_HOST=127.0.0.1 "$BIN/run_text_generation_server" "${MODEL[@]}" --port "$PORT" \
  > "$D/server.log" 2>&1 &
SERVER_PID=$!
URL="http://127.0.0.1:$PORT/api"
for _ in $(seq 100); do
  grep -q "Serving Megatron's text generation API" "$D/server.log" && break
  kill -0 "$SERVER_PID" 2>/dev/null || { cat "$D/server.log"; fail "server exited at start"; }
  sleep 0.1
done
rss() { awk '/VmRSS/ {print $2}' "/proc/$SERVER_PID/status"; }

python3 - "$URL" "$D/oneshot.json" "$SERVER_PID" <<'EOF' || { tail -30 "$D/server.log"; fail "HTTP checks failed"; }
import json, socket, sys, threading, urllib.error, urllib.parse, urllib.request
url, ref, pid = sys.argv[1], json.load(open(sys.argv[2])), sys.argv[3]
def put(body, raw=False):
    data = body if raw else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="PUT", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
def rss():
    return int([l for l in open(f"/proc/{pid}/status") if l.startswith("VmRSS")][0].split()[1])
greedy = {"prompts": ["1 2 3 4", "10 20"], "tokens_to_generate": 8, "top_k": 1, "logprobs": True, "no_log": True}
# Concurrent identical requests answer what the one-shot CLI printed.
out = [None] * 8
ts = [threading.Thread(target=lambda i=i: out.__setitem__(i, put(greedy))) for i in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
for st, r in out:
    assert st == 200, (st, r)
    assert r["tokens"] == ref["tokens"] and r["text"] == ref["text"] and r["segments"] == ref["segments"], r
    # Same arithmetic as the one-shot run (one generation at a time under the server's lock, the
    # same batch shapes, the same kernels), so equal in exact terms; 1e-6 (about two fp32 ulps at
    # |log-prob| ~ 5) only allows for the float's text round trip.
    assert max(abs(a - b) for x, y in zip(r["logprobs"], ref["logprobs"]) for a, b in zip(x, y)) < 1e-6
print("8 concurrent requests: equal to the one-shot output")
# Megatron's 400 messages.
bad = [
    (b'{"prompts": ["1 2"', True, None),
    ({"tokens_to_generate": 3}, False, "prompts argument required"),
    ({"prompts": ["1 2"], "tokens_to_generate": -1}, False,
     "tokens_to_generate must be an integer greater than or equal to 0"),
    ({"prompts": [" ".join(["5"] * 60)], "tokens_to_generate": 10}, False,
     "Length of prompt + tokens_to_generate longer than allowed"),
    ({"prompts": ["1 2"], "beam_width": 2}, False, "Beam search is no longer supported."),
    ({"prompts": ["1 x"]}, False, None),
    ({"prompts": ["1 999"]}, False, "prompt 0 has token id 999 outside the vocabulary [0, 256)"),
    # Checked before anything is allocated or broadcast (top_k >= vocab would fail in sampling).
    ({"prompts": ["1 2 3"], "tokens_to_generate": 3, "top_k": 256}, False,
     "top_k 256 must be less than the vocabulary size 256 (top-k is larger than vocab size.)"),
    ({"prompts": ["1 2 3"] * 128, "tokens_to_generate": 10**12}, False,
     "Length of prompt + tokens_to_generate longer than allowed"),
    ({"prompts": ["1 2 3"], "tokens_to_generate": 2**63}, False,
     "Length of prompt + tokens_to_generate longer than allowed"),
]
for body, raw, msg in bad:
    st, r = put(body, raw)
    assert st == 400, (body, st, r)
    if raw:
        assert "Failed to decode JSON object" in r["message"], r
    elif msg:
        assert r == msg, (body, r)
    else:
        assert isinstance(r, str) and "tokenize" in r, r
print("malformed JSON, missing prompts, negative tokens_to_generate, too long, beam_width, bad ids, top_k >= vocab, "
      "tokens_to_generate 1e12 / 2^63: 400 + message")
# 100 parallel clients, twice; memory must not grow from the first round to the second.
def round_():
    res = [None] * 100
    def one(i):
        res[i] = put({"prompts": [f"{i % 50} 7 8"], "tokens_to_generate": 4, "top_k": 1, "no_log": True})
    ts = [threading.Thread(target=one, args=(i,)) for i in range(100)]
    [t.start() for t in ts]; [t.join() for t in ts]
    assert all(st == 200 for st, _ in res), [x for x in res if x[0] != 200][:3]
    for i, (_, r) in enumerate(res):  # same prompt, same greedy answer
        assert r["tokens"] == res[i % 50][1]["tokens"], i
before = rss(); round_(); mid = rss(); round_(); after = rss()
assert after <= mid + 8192, (before, mid, after)  # KiB: bounded (no per-request growth)
print(f"2 x 100 parallel clients: all 200, equal answers; VmRSS {before} -> {mid} -> {after} KiB")
# Clients that disconnect: mid-body, and right after sending a whole request.
host, port = urllib.parse.urlparse(url).hostname, urllib.parse.urlparse(url).port
for partial in (True, False):
    for _ in range(5):
        s = socket.create_connection((host, port))
        body = json.dumps({"prompts": ["3 4"], "tokens_to_generate": 40, "no_log": True}).encode()
        head = f"PUT /api HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        s.sendall(head + (body[:5] if partial else body))
        s.close()
st, r = put(greedy)
assert st == 200 and r["tokens"] == ref["tokens"], (st, r)
print("clients disconnecting mid-request: the server keeps serving")
EOF

# 3. Megatron's interactive client (it sends only prompts + tokens_to_generate: the server's
# defaults, top_k 0 = sampling, so the answer is checked for its shape, not its tokens).
printf '1 2 3 4\n8\n' | "$BIN/text_generation_cli" "127.0.0.1:$PORT" > "$D/cli.log"
python3 -c "
import sys
lines = open('$D/cli.log').read().split('\\n')
i = [k for k, l in enumerate(lines) if l.endswith('Megatron Response: ')][0]
ids = lines[i + 1].split(' ')
sys.exit(0 if ids[:4] == ['1', '2', '3', '4'] and len(ids) == 12 and all(0 <= int(t) < 256 for t in ids) else 1)" \
  || { cat "$D/cli.log"; fail "text_generation_cli: unexpected answer"; }
printf '1 2\n-1\n' | "$BIN/text_generation_cli" "127.0.0.1:$PORT" > "$D/cli_err.log"
grep -q "Error 400: tokens_to_generate must be an integer greater than or equal to 0" "$D/cli_err.log" \
  || { cat "$D/cli_err.log"; fail "cli error line"; }
echo "text_generation_cli: answer and error line"

# 4. SIGTERM: clean shutdown, exit status 0.
kill -TERM "$SERVER_PID"
for _ in $(seq 100); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
kill -0 "$SERVER_PID" 2>/dev/null && fail "server still running 10 s after SIGTERM"
wait "$SERVER_PID" && rc=0 || rc=$?
SERVER_PID=
[ "$rc" = 0 ] || { tail "$D/server.log"; fail "server exit status $rc after SIGTERM"; }
grep -q "text generation server stopped" "$D/server.log" || fail "no shutdown line"
echo "SIGTERM: clean shutdown (exit 0)"

# 4b. SIGTERM mid-request without OMP_NUM_THREADS (OpenMP / OpenBLAS threads of their own): the
# request is answered, then the server stops with exit 0.
PORT2=$(free_port)
env -u OMP_NUM_THREADS MEGATRON_TEXT_GENERATION_HOST=127.0.0.1 "$BIN/run_text_generation_server" "${MODEL[@]}" \
  --port "$PORT2" > "$D/server2.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 100); do
  grep -q "Serving Megatron's text generation API" "$D/server2.log" && break
  kill -0 "$SERVER_PID" 2>/dev/null || { cat "$D/server2.log"; fail "server (no OMP_NUM_THREADS) exited at start"; }
  sleep 0.1
done
python3 - "http://127.0.0.1:$PORT2/api" "$SERVER_PID" "$D/server2.log" <<'EOF' || { tail -20 "$D/server2.log"; fail "SIGTERM mid-request"; }
import json, os, signal, sys, threading, time, urllib.request
url, pid, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
body = {"prompts": ["1 2 3"] * 128, "tokens_to_generate": 60, "top_k": 1}
res = {}
def go():
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="PUT", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        res["st"], res["r"] = r.status, json.loads(r.read())
t = threading.Thread(target=go); t.start()
deadline = time.time() + 120
while "start time" not in open(log).read():  # the server logs the request as it starts it
    assert time.time() < deadline and t.is_alive(), "the server did not start the request"
    time.sleep(0.01)
assert t.is_alive(), "request finished before the signal: make it longer"
os.kill(pid, signal.SIGTERM)
t.join()
assert res.get("st") == 200 and len(res["r"]["tokens"]) == 128, res.get("st")
EOF
for _ in $(seq 100); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
wait "$SERVER_PID" && rc=0 || rc=$?
SERVER_PID=
[ "$rc" = 0 ] || { tail "$D/server2.log"; fail "server (no OMP_NUM_THREADS) exit status $rc after SIGTERM"; }
grep -q "text generation server stopped" "$D/server2.log" || fail "no shutdown line (no OMP_NUM_THREADS)"
echo "SIGTERM mid-request without OMP_NUM_THREADS: request answered, exit 0"

# 4c. One-shot errors are one clear line, not std::bad_alloc / a misleading message.
if "$BIN/run_text_generation_server" "${MODEL[@]}" --prompts "1 2 3" --num-tokens-to-generate 100000000000 \
  > "$D/big.log" 2>&1; then fail "one-shot with 1e11 tokens succeeded"; fi
grep -q "Length of prompt + tokens_to_generate longer than allowed" "$D/big.log" || { cat "$D/big.log"; fail "1e11 tokens message"; }
if "$BIN/run_text_generation_server" "${MODEL[@]}" --prompts "1 2 3" --top_p 0.5 > "$D/topp.log" 2>&1; then
  fail "one-shot --top_p with the default --top_k 1 succeeded"; fi
grep -q "pass --top_k 0" "$D/topp.log" || { cat "$D/topp.log"; fail "--top_p message"; }
echo "one-shot: 1e11 tokens and --top_p without --top_k 0 are clear errors"

# 5. TP2 under mpirun (rank 0 broadcasts the request) answers as TP1.
if command -v mpirun >/dev/null; then
  timeout 300 "${MPIRUN[@]}" -np 2 "$BIN/run_text_generation_server" "${MODEL[@]}" --tensor-model-parallel-size 2 \
    --prompts "1 2 3 4" "10 20" --num-tokens-to-generate 8 > "$D/tp2.log" 2>&1 || { cat "$D/tp2.log"; fail "TP2 one-shot failed"; }
  python3 - "$D/oneshot.json" "$D/tp2.log" <<'EOF' || fail "TP2 differs from TP1"
import json, sys
a = json.load(open(sys.argv[1]))
b = json.loads([l for l in open(sys.argv[2]) if l.startswith('{"logprobs"')][-1])
assert a["tokens"] == b["tokens"], (a["tokens"], b["tokens"])
# TP2 changes only fp32 summation order (row-parallel partial sums + all-reduce, vocab-parallel
# log-softmax): a few ulps per value through 2 layers, ~1e-6 relative at most, so < 1e-5 absolute
# for log-probs of magnitude <= ~10. The greedy tokens are compared exactly: only two top logits
# within ~1e-6 of each other (chance ~1e-6 per step for logits spread over ~1) could flip one.
assert max(abs(x - y) for p, q in zip(a["logprobs"], b["logprobs"]) for x, y in zip(p, q)) < 1e-5
EOF
  echo "TP2 (mpirun -np 2): same tokens, log-probs within 1e-5 of TP1"
  # A request rank 0 refuses must not leave rank 1 waiting (it did for top_k >= vocab).
  rc=0; timeout 120 "${MPIRUN[@]}" -np 2 "$BIN/run_text_generation_server" "${MODEL[@]}" --tensor-model-parallel-size 2 \
    --prompts "1 2 3" --num-tokens-to-generate 3 --top_k 256 > "$D/tp2_bad.log" 2>&1 || rc=$?
  [ "$rc" != 0 ] && [ "$rc" != 124 ] || { cat "$D/tp2_bad.log"; fail "TP2 top_k 256: rc $rc (124 = wedged)"; }
  grep -q "top-k is larger than vocab size" "$D/tp2_bad.log" || { cat "$D/tp2_bad.log"; fail "TP2 top_k 256 message"; }
  echo "TP2: a refused request (top_k 256) ends every rank with the message"
fi

# 6. A checkpoint trained by pretrain_gpt (learned positions, LayerNorm, GeLU, tied output).
GPT=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
  --tokenizer-type NullTokenizer --vocab-size 128)
"$BIN/pretrain_gpt" "${GPT[@]}" --micro-batch-size 2 --global-batch-size 2 --train-iters 2 --lr 1e-3 --mock-data \
  --data-cache-path "$D/cache" --save "$D/gpt.ckpt" --save-interval 2 --eval-iters 0 > "$D/train.log" 2>&1 \
  || { tail -20 "$D/train.log"; fail "pretrain_gpt failed"; }
"$BIN/run_text_generation_server" "${GPT[@]}" --load "$D/gpt.ckpt" --prompts "1 2 3" --num-tokens-to-generate 5 \
  > "$D/gpt.log" 2>&1 || { cat "$D/gpt.log"; fail "generation from the pretrain_gpt checkpoint failed"; }
grep -q "successfully loaded checkpoint from $D/gpt.ckpt" "$D/gpt.log" || fail "checkpoint not loaded"
python3 -c "import json,sys; r=json.loads(open('$D/gpt.log').read().strip().split('\n')[-1]); sys.exit(0 if len(r['tokens'][0])==8 else 1)" \
  || { cat "$D/gpt.log"; fail "pretrain_gpt checkpoint: unexpected answer"; }
echo "pretrain_gpt checkpoint: loaded and sampled"
echo "text_generation_server: all checks passed"
