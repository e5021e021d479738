// Peer figure for bench/preprocess: Hugging Face tokenizers 0.23.2 (the Rust core as a Node addon,
// npm tokenizers@0.23.2) encoding the "text" of every JSONL line, with special tokens as
// Megatron's HuggingFaceTokenizer does. Reports MB/s of JSONL input (the same measure as
// preprocess_data's summary), per wall second and per CPU second. Threads: RAYON_NUM_THREADS.
//   node hf_tokenizers_bench.js <tokenizers pkg dir> <tokenizer.json> <input.jsonl> [max_docs]
const fs = require('fs');
const readline = require('readline');
const [pkg, tokJson, input, maxDocs] = process.argv.slice(2);
const tk = require(require('path').resolve(pkg, 'index.js'));
(async () => {
  const tok = tk.Tokenizer.fromFile(tokJson);
  const texts = [];
  let bytes = 0;
  const rl = readline.createInterface({ input: fs.createReadStream(input), crlfDelay: Infinity });
  for await (const line of rl) {
    texts.push(JSON.parse(line).text);
    bytes += Buffer.byteLength(line) + 1;
    if (maxDocs && texts.length >= +maxDocs) break;
  }
  const t0 = process.hrtime.bigint();
  const c0 = process.cpuUsage();
  let tokens = 0;
  const B = 1000;
  for (let i = 0; i < texts.length; i += B) {
    const encs = await tok.encodeBatch(texts.slice(i, i + B), { addSpecialTokens: true });
    for (const e of encs) tokens += e.getIds().length;
  }
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  const cu = process.cpuUsage(c0);
  const cpu = (cu.user + cu.system) / 1e6;
  console.log(`hf-tokenizers-0.23.2 docs=${texts.length} tokens=${tokens} bytes=${bytes} seconds=${s.toFixed(2)} MiB/s=${(bytes / 1048576 / s).toFixed(2)} cpu_s=${cpu.toFixed(2)} MiB_per_cpu_s=${(bytes / 1048576 / cpu).toFixed(2)} threads=${process.env.RAYON_NUM_THREADS || 'all'}`);
})();
