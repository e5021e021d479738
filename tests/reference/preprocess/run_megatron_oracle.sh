#!/bin/bash
# Runs Megatron-LM's tools/preprocess_data.py as the oracle (CPU only). Output: $OUT/oracle.tgz
cd "$(dirname "$0")"
export PYTHONPATH=$PWD/megatron-lm CUDA_VISIBLE_DEVICES= TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
M=megatron-lm/tools/preprocess_data.py
mkdir -p o p q
{ date -u; nproc; lscpu | grep 'Model name'; python3 -c "import sys,numpy,transformers,tokenizers;print(sys.version, numpy.__version__, transformers.__version__, tokenizers.__version__)"; } > o/env.txt 2>&1
run() { local name=$1; shift; local t0=$(date +%s.%N); timeout 90 python3 $M "$@" > o/$name.stdout 2> o/$name.stderr; local rc=$?; echo "$name rc=$rc wall=$(python3 -c "print($(date +%s.%N)-$t0)")" >> o/rc.txt; }
run gpt2 --input oracle.jsonl --json-keys text title --output-prefix o/gpt2 --tokenizer-type HuggingFaceTokenizer --tokenizer-model ./gpt2-tok --append-eod --workers 2 --log-interval 100
run llama3 --input oracle.jsonl --output-prefix o/llama3 --tokenizer-type HuggingFaceTokenizer --tokenizer-model ./llama3-tok --append-eod --workers 2 --log-interval 100
cp oracle.jsonl p/oracle.jsonl; cp oracle.jsonl q/oracle.jsonl
run llama3rr --input p/oracle.jsonl --output-prefix o/llama3rr --tokenizer-type HuggingFaceTokenizer --tokenizer-model ./llama3-tok --append-eod --workers 2 --partitions 2 --log-interval 100
run llama3seq --input q/oracle.jsonl --output-prefix o/llama3seq --tokenizer-type HuggingFaceTokenizer --tokenizer-model ./llama3-tok --workers 3 --partitions 3 --keep-sequential-samples --log-interval 100
run nullgolden --input null_golden.jsonl --output-prefix o/nullgolden --tokenizer-type NullTokenizer --vocab-size 1000 --append-eod --workers 1
run nullbig --input null_big.jsonl --output-prefix o/nullbig --tokenizer-type NullTokenizer --vocab-size 1000 --append-eod --workers 1
run nullover --input null_over.jsonl --output-prefix o/nullover --tokenizer-type NullTokenizer --vocab-size 1000 --append-eod --workers 1
run bench1 --input bench30k.jsonl --output-prefix bench1 --tokenizer-type HuggingFaceTokenizer --tokenizer-model ./llama3-tok --append-eod --workers 1 --log-interval 5000
run bench4 --input bench30k.jsonl --output-prefix bench4 --tokenizer-type HuggingFaceTokenizer --tokenizer-model ./llama3-tok --append-eod --workers 4 --log-interval 5000
run bench1g --input bench30k.jsonl --output-prefix bench1g --tokenizer-type HuggingFaceTokenizer --tokenizer-model ./gpt2-tok --append-eod --workers 1 --log-interval 5000
md5sum bench1_text_document.* bench4_text_document.* bench1g_text_document.* > o/bench_md5.txt 2>&1
ls -la o p q >> o/env.txt
tar czf $OUT/oracle.tgz o
cat o/rc.txt
