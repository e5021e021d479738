#!/usr/bin/env python3
"""Expected GPT dataset index files, produced by Megatron-LM's own dataset code (the oracle).

Run (Megatron-LM's megatron/ tree exported to $MEGATRON_ORACLE, its helpers built with
`make -C megatron/core/datasets`; Debian python3-numpy and python3-torch):

    MEGATRON_ORACLE=/path/to/export python3 tests/reference/datasets/generate.py

For every configuration below it writes synthetic .bin/.idx datasets (token values and sequence
lengths from simple formulas that tests/unit_tests/datasets/gpt_dataset_oracle_test.cpp
re-implements) at fixed absolute paths under /tmp/megatron_cpp_dsref (the cache hash includes
the dataset path), runs BlendedMegatronDatasetBuilder(GPTDataset or MockGPTDataset, sizes, ...)
with a cache folder, and copies what Megatron wrote into tests/reference/datasets/<config>/:
the description .txt and .npy files (or only their MD5s for the large mock indices), plus
samples.json with a few samples of each split as __getitem__ returns them.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.environ["MEGATRON_ORACLE"])

import numpy  # noqa: E402
import torch  # noqa: E402

from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder  # noqa: E402
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset  # noqa: E402
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder  # noqa: E402
from megatron.core.datasets.utils import get_blend_from_list  # noqa: E402
from megatron.core.tokenizers import MegatronTokenizer  # noqa: E402

ROOT = "/tmp/megatron_cpp_dsref"
HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB = 1000
EOD = VOCAB - 1

# Synthetic datasets: name -> (num_sequences, length formula parameters, dtype)
# length(i) = (a * i * i + b * i + c) % m  (+ lo); zero-length sequences where the formula gives 0
DATASETS = {
    "alpha": dict(n=1000, a=7, b=13, c=5, m=97, lo=1, dtype=numpy.uint16),
    "beta": dict(n=120, a=3, b=29, c=11, m=151, lo=1, dtype=numpy.uint16),
    "gamma": dict(n=50, a=11, b=5, c=2, m=61, lo=2, dtype=numpy.uint16),
    # sequences of length 0 every 3rd (empty documents)
    "empty": dict(n=90, a=5, b=7, c=3, m=41, lo=0, dtype=numpy.uint16),
    "wide": dict(n=40, a=2, b=3, c=1, m=37, lo=1, dtype=numpy.int32),
}


def seq_len(p, i):
    if p["lo"] == 0 and i % 3 == 0:
        return 0
    return (p["a"] * i * i + p["b"] * i + p["c"]) % p["m"] + max(p["lo"], 1)


def token(i, j, length):
    # the last token of every non-empty sequence is EOD, the others (i*31 + j*17) % (VOCAB-1)
    return EOD if j == length - 1 else (i * 31 + j * 17) % (VOCAB - 1)


def write_dataset(name):
    p = DATASETS[name]
    prefix = os.path.join(ROOT, "data", name)
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=p["dtype"])
    for i in range(p["n"]):
        n = seq_len(p, i)
        b.add_item(torch.tensor([token(i, j, n) for j in range(n)], dtype=torch.int64))
        b.end_document()
    b.finalize(prefix + ".idx")
    return prefix


def md5(path):
    with open(path, "rb") as f:
        return hashlib.md5(f.read()).hexdigest()


# name -> config. sizes: [train, valid, test] requested samples (None = Python None).
CONFIGS = {
    "single_default_split": dict(data_path=["alpha"], split="969, 30, 1", seq=64, seed=1234, sizes=[200, 40, 8]),
    "single_seed7_seq33": dict(data_path=["alpha"], split="80,15,5", seq=33, seed=7, sizes=[50, 10, 5]),
    # 3 epochs for train; the final one is separated (few samples from it)
    "epochs_separate_last": dict(data_path=["beta"], split="90,10,0", seq=50, seed=1234, sizes=[400, 10, 0]),
    # 2 epochs, final epoch mostly used -> not separated
    "epochs_no_separate": dict(data_path=["beta"], split="90,10,0", seq=50, seed=99, sizes=[330, 10, 0]),
    "blend_three_weighted": dict(data_path=["0.5", "alpha", "0.3", "beta", "0.2", "gamma"], split="90,8,2",
                                 seq=40, seed=1234, sizes=[300, 30, 10]),
    "blend_two_unweighted": dict(data_path=["alpha", "gamma"], split="80,20,0", seq=32, seed=1234, sizes=[100, 4, 0]),
    "empty_documents": dict(data_path=["empty"], split="70,20,10", seq=16, seed=3, sizes=[60, 12, 6]),
    "int32_tokens_no_extra": dict(data_path=["wide"], split="100,0,0", seq=20, seed=5, sizes=[30, 0, 0],
                                  add_extra_token=False),
    "per_split_blends": dict(per_split=[["0.6", "alpha", "0.4", "beta"], ["gamma"], ["alpha", "empty"]],
                             seq=24, seed=1234, sizes=[120, 16, 8]),
    "mock": dict(mock=True, seq=128, seed=1234, sizes=[100, 20, 10], md5_only=True),
    "mock_seed42_seq512": dict(mock=True, seq=512, seed=42, sizes=[64, 8, 8], md5_only=True,
                               reset=True),
}


def tokenizer():
    return MegatronTokenizer.from_pretrained(metadata_path={"library": "null-text"}, vocab_size=VOCAB, pad_id=-1)


def sample_json(ds, idx):
    s = ds[idx]
    out = {"index": idx}
    if "dataset_id" in s:
        out["dataset_id"] = int(s["dataset_id"])
    for k in ("tokens", "labels", "position_ids"):
        out[k] = [int(v) for v in s[k].tolist()]
    out["loss_mask"] = [float(v) for v in s["loss_mask"].tolist()]
    if "attention_mask" in s:
        am = s["attention_mask"][0].numpy().astype(numpy.uint8)
        out["attention_mask_md5"] = hashlib.md5(am.tobytes()).hexdigest()
    return out


def main():
    shutil.rmtree(ROOT, ignore_errors=True)
    prefixes = {name: write_dataset(name) for name in DATASETS}
    manifest = {"vocab_size": VOCAB, "root": ROOT, "datasets": {}, "configs": {}}
    for name, p in DATASETS.items():
        manifest["datasets"][name] = {k: (str(numpy.dtype(v)) if k == "dtype" else v) for k, v in p.items()}
        manifest["datasets"][name]["bin_md5"] = md5(prefixes[name] + ".bin")
        manifest["datasets"][name]["idx_md5"] = md5(prefixes[name] + ".idx")
    for cname, c in CONFIGS.items():
        cache = os.path.join(ROOT, "cache", cname)
        kw = dict(random_seed=c["seed"], sequence_length=c["seq"], path_to_cache=cache, tokenizer=tokenizer(),
                  reset_position_ids=c.get("reset", False), reset_attention_mask=c.get("reset", False),
                  eod_mask_loss=c.get("reset", False),
                  add_extra_token_to_sequence=c.get("add_extra_token", True))
        sub = lambda lst: [prefixes[x] if x in prefixes else x for x in lst]  # noqa: E731
        if c.get("mock"):
            cls = MockGPTDataset
        elif "per_split" in c:
            cls = GPTDataset
            kw["blend_per_split"] = [get_blend_from_list(sub(b)) for b in c["per_split"]]
        else:
            cls = GPTDataset
            kw["blend"] = get_blend_from_list(sub(c["data_path"]))
            kw["split"] = c["split"]
        cfg = GPTDatasetConfig(**kw)
        datasets = BlendedMegatronDatasetBuilder(cls, c["sizes"], lambda: True, cfg).build()
        out_dir = os.path.join(HERE, cname)
        shutil.rmtree(out_dir, ignore_errors=True)
        os.makedirs(out_dir)
        files = {}
        for f in sorted(os.listdir(cache)):
            files[f] = md5(os.path.join(cache, f))
            if not c.get("md5_only") or f.endswith(".txt"):
                shutil.copy(os.path.join(cache, f), os.path.join(out_dir, f))
        samples = {}
        lengths = {}
        for split, ds in zip(("train", "valid", "test"), datasets):
            if ds is None:
                lengths[split] = None
                continue
            lengths[split] = len(ds)
            n = len(ds)
            picks = sorted(set(i for i in (0, 1, 2, n // 2, n - 1) if 0 <= i < n))
            samples[split] = [sample_json(ds, i) for i in picks]
        entry = dict(c)
        entry["files"] = files
        entry["lengths"] = lengths
        manifest["configs"][cname] = entry
        with open(os.path.join(out_dir, "samples.json"), "w") as f:
            json.dump(samples, f, separators=(",", ":"))
        print(cname, lengths, len(files), "files")
    with open(os.path.join(HERE, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


if __name__ == "__main__":
    main()
