#!/usr/bin/env python3
"""Write a token shard in llm.c's training-data format, filled with seeded random tokens.

The peer benchmark bench/gpu/llmc_peer.sh feeds llm.c's train_gpt2cu random GPT-2 tokens, as our
GPT-2 benchmark feeds pretrain_gpt --mock-data. Format facts (from llm.c's llmc/dataloader.h, read
for the layout only): a header of 256 little-endian int32 -- [0] magic 20240520, [1] version 1,
[2] number of tokens, the rest 0 -- then that many uint16 tokens. The loader checks the file size
equals 256*4 + 2*tokens bytes and takes B*T+1 tokens per micro-batch.

    python3 bench/gpu/llmc_data.py OUT.bin --tokens N [--seed S] [--vocab 50257]

Tokens are uniform in [0, vocab) from random.Random(seed) (deterministic for a given seed).
Raises SystemExit on a token count outside [1, 2**31-1] or a vocabulary outside [1, 65536].
"""
import argparse
import array
import os
import random
import struct
import sys

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256


def write_shard(path, n_tokens, seed, vocab):
    """Writes n_tokens uint16 tokens < vocab drawn from random.Random(seed) to path, after the
    256-int32 header (magic, version, n_tokens). Returns the file size in bytes."""
    if not 1 <= n_tokens <= 2**31 - 1:
        raise SystemExit(f"llmc_data.py: --tokens {n_tokens} outside [1, 2^31-1] (the header holds an int32)")
    if not 1 <= vocab <= 65536:
        raise SystemExit(f"llmc_data.py: --vocab {vocab} outside [1, 65536] (tokens are uint16)")
    rng = random.Random(seed)
    header = [0] * HEADER_INTS
    header[0], header[1], header[2] = MAGIC, VERSION, n_tokens
    toks = array.array("H", (rng.randrange(vocab) for _ in range(n_tokens)))
    if sys.byteorder != "little":
        toks.byteswap()
    tmp = path + ".tmp"  # written whole, then renamed: a killed run leaves no short shard behind
    with open(tmp, "wb") as f:
        f.write(struct.pack("<%di" % HEADER_INTS, *header))
        f.write(toks.tobytes())
    os.replace(tmp, path)
    return HEADER_INTS * 4 + 2 * n_tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--vocab", type=int, default=50257)
    a = ap.parse_args()
    size = write_shard(a.out, a.tokens, a.seed, a.vocab)
    print(f"llmc_data.py: wrote {a.out}: {a.tokens} tokens < {a.vocab}, seed {a.seed}, {size} bytes")


if __name__ == "__main__":
    main()
