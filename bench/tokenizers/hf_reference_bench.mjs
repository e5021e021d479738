// Reference throughput of Hugging Face tokenizers 0.23.2 (npm Node addon = the Rust library) on
// the same documents as tokenizer_bench: encodeBatch() of 1,000 documents (per-document encode()
// is dominated by Node promise overhead), RAYON_NUM_THREADS=1. Prints MB/s per CPU second of this
// process (includes the JS <-> Rust marshalling).
// Usage: RAYON_NUM_THREADS=1 node bench/tokenizers/hf_reference_bench.mjs <tokenizer.json> [seconds]
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const require = createRequire(import.meta.url);
const { Tokenizer } = require(path.join(root, 'third_party/npm/tokenizers/index.js'));
const [tj, secs = '3'] = process.argv.slice(2);
const dir = path.join(root, 'third_party/npm/nlp-corpus/builds');
const docs = [];
for (const f of fs.readdirSync(dir).filter((f) => f.endsWith('.json')).sort())
  docs.push(...JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8')));
const t = Tokenizer.fromFile(tj);
const bytes = docs.map((d) => Buffer.byteLength(d, 'utf8'));
const c0 = process.cpuUsage();
let done = 0, cpu = 0;
outer: for (;;) {
  for (let i = 0; i < docs.length; i += 1000) {
    await t.encodeBatch(docs.slice(i, i + 1000), { addSpecialTokens: true });
    for (let k = i; k < Math.min(i + 1000, docs.length); ++k) done += bytes[k];
    const u = process.cpuUsage(c0);
    cpu = (u.user + u.system) / 1e6;
    if (cpu > Number(secs)) break outer;
  }
}
console.log(`HF tokenizers 0.23.2 (Node) ${tj}: ${(done / cpu / 1e6).toFixed(2)} MB/s per CPU second`);
