#!/usr/bin/env python3
"""Builds the real-text JSONL corpora used by the preprocess_data byte-identity test and benchmark.

Sources (all offline, see docs/tokenizers.md#test-assets): Debian dict-gcide, dict-foldoc,
dict-jargon, fortunes, fortunes-ru, fortunes-zh; npm nlp-corpus@4.4.0 (unpacked folder given
with --nlp-corpus). Deterministic: same packages -> same bytes.

  make_corpus.py oracle OUT.jsonl --nlp-corpus DIR   # ~450 docs + edge-case lines (test)
  make_corpus.py bench  OUT.jsonl --nlp-corpus DIR   # >= 50 MB (benchmark)
"""
import argparse
import glob
import gzip
import json
import os
import random


def dict_paragraphs(name):
    path = f"/usr/share/dictd/{name}.dict.dz"
    with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
        text = f.read()
    return [p.strip("\n") for p in text.split("\n\n") if p.strip()]


def fortunes():
    out = []
    files = sorted(glob.glob("/usr/share/games/fortunes/*") + glob.glob("/usr/share/games/fortunes/*/*"))
    for path in files:
        if path.endswith(".dat") or os.path.islink(path) or os.path.isdir(path):
            continue
        with open(path, "rb") as f:
            raw = f.read()
        text = raw.decode("utf-8", errors="replace")
        out.extend(p.strip("\n") for p in text.split("\n%\n") if p.strip())
    return out


def nlp_corpus(folder):
    out = []
    for i in range(100):
        path = os.path.join(folder, "builds", f"doc-{i}.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                out.extend(json.load(f))
    return out


def group(paras, target):
    """Joins consecutive paragraphs into documents of about `target` characters."""
    docs, cur, n = [], [], 0
    for p in paras:
        cur.append(p)
        n += len(p)
        if n >= target:
            docs.append("\n\n".join(cur))
            cur, n = [], 0
    if cur:
        docs.append("\n\n".join(cur))
    return docs


def line(obj, i):
    # half the records with \\u escapes (ensure_ascii), half raw UTF-8, as real dumps vary
    return json.dumps(obj, ensure_ascii=(i % 2 == 0)) + "\n"


def oracle(args):
    rng = random.Random(1234)
    nlp = nlp_corpus(args.nlp_corpus)
    fort = fortunes()
    gc = dict_paragraphs("gcide")
    docs = rng.sample(nlp, 150) + rng.sample(fort, 150) + group(rng.sample(gc, 300), 800)[:100]
    zh = [f for f in fort if any("\u4e00" <= c <= "\u9fff" for c in f)]
    ru = [f for f in fort if any("\u0400" <= c <= "\u04ff" for c in f)]
    docs += rng.sample(zh, 20) + rng.sample(ru, 20)
    edge = [
        "", " ", "\n\n", "Hello<|endoftext|>world", "<|end_of_text|> at the start",
        "I'LL DON'T we've They'RE", "1234567890 123 4.5e10", "tab\there\r\nCRLF\rCR",
        "emoji \U0001F600\U0001F469\u200d\U0001F4BB and flags \U0001F1E9\U0001F1EA",
        "line\u2028separator\u2029para \u0085nel \u00a0nbsp \u3000ideographic",
        "combining e\u0301 a\u0300 \u0915\u094d\u0937", "   leading and trailing spaces   ",
        "nul\u0000inside", "\ufeffbom inside text", "ANSI \u001b[1mbold\u001b[0m",
        "long " + " ".join(rng.sample(gc, 200)),
    ]
    docs += edge
    rng.shuffle(docs)
    with open(args.out, "w", encoding="utf-8", newline="") as f:
        for i, d in enumerate(docs):
            f.write(line({"text": d, "title": d[:40]}, i))
        # Raw lines that json.dumps cannot produce; Python's json.loads accepts all of them.
        f.write('{"text": "first", "title": "t", "text": "duplicate key: the last one wins"}\n')
        f.write('{"text": "NaN in another field", "title": "t", "score": NaN, "w": -Infinity}\n')
        f.write('{"text": "big int", "title": "t", "n": 123456789012345678901234567890}\n')
        f.write('{"text": "lone surrogate in another field", "title": "t", "junk": "\\ud800"}\n')
        f.write('{"text": "surrogate pair \\ud83d\\ude00 escaped", "title": "t"}\r\n')
        f.write('{"text": "CRLF ending", "title": "t"}\r\n')
        f.write('{"text": "lone CR ending", "title": "t"}\r')
        f.write('  {"text": "spaces around", "title": "t"}  \n')
        f.write('{"text": ["a list", " of sentences", ""], "title": "list value"}\n')
        f.write('{"text": "last line without newline", "title": "t"}')


def bench(args):
    nlp = nlp_corpus(args.nlp_corpus)
    docs = group(dict_paragraphs("gcide"), 3000)
    docs += group(dict_paragraphs("foldoc"), 2000) + group(dict_paragraphs("jargon"), 2000)
    docs += fortunes() + nlp
    random.Random(1).shuffle(docs)
    with open(args.out, "w", encoding="utf-8") as f:
        for i, d in enumerate(docs):
            f.write(line({"text": d}, i))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["oracle", "bench"])
    ap.add_argument("out")
    ap.add_argument("--nlp-corpus", required=True)
    a = ap.parse_args()
    oracle(a) if a.what == "oracle" else bench(a)
