#!/usr/bin/env python3
"""Megatron-LM's own index build on the files dataset_index_bench wrote (same sizes and config).

    MEGATRON_ORACLE=.oracle/lite PYTHONPATH=tests/reference/datasets/oracle_stubs \\
        /usr/bin/python3 bench/datasets/megatron_index_bench.py [--tokens 1e9] [--seq-length 4096]
"""
import argparse
import os
import shutil
import sys
import time

sys.path.insert(0, os.environ["MEGATRON_ORACLE"])
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder  # noqa: E402
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset  # noqa: E402
from megatron.core.tokenizers import MegatronTokenizer  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--tokens", type=float, default=1e9)
p.add_argument("--seq-length", type=int, default=4096)
p.add_argument("--dir", default="/tmp/megatron_ds_bench")
p.add_argument("--train-samples", type=int, default=-1)
a = p.parse_args()
train = a.train_samples if a.train_samples >= 0 else int(0.969 * int(a.tokens) / a.seq_length)
sizes = [train, train // 100, train // 1000]
tok = MegatronTokenizer.from_pretrained(metadata_path={"library": "null-text"}, vocab_size=50001, pad_id=-1)
cache = os.path.join(a.dir, "cache_megatron")
shutil.rmtree(cache, ignore_errors=True)
cfg = GPTDatasetConfig(random_seed=1234, sequence_length=a.seq_length, blend=([os.path.join(a.dir, "bench_text_document")], None),
                       split="969,30,1", path_to_cache=cache, tokenizer=tok, reset_position_ids=False,
                       reset_attention_mask=False, eod_mask_loss=False)
t0, c0 = time.time(), time.process_time()
ds = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, cfg).build()
t_build, c_build = time.time() - t0, time.process_time() - c0
t0, c0 = time.time(), time.process_time()
BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, cfg).build()
t_load, c_load = time.time() - t0, time.process_time() - c0
print(f"megatron index build (3 splits, incl. writing the cache): {t_build:.3f} s wall, {c_build:.3f} s CPU; train samples {len(ds[0])}")
print(f"megatron index load from cache: {t_load:.3f} s wall, {c_load:.3f} s CPU")
mcfg = GPTDatasetConfig(random_seed=1234, sequence_length=a.seq_length, tokenizer=tok, reset_position_ids=False,
                        reset_attention_mask=False, eod_mask_loss=False)
t0, c0 = time.time(), time.process_time()
BlendedMegatronDatasetBuilder(MockGPTDataset, sizes, lambda: True, mcfg).build()
print(f"megatron MockGPTDataset build (3 splits): {time.time() - t0:.3f} s wall, {time.process_time() - c0:.3f} s CPU")
t0 = time.time()
n = 0
while time.time() - t0 < 5:
    for i in range(4):
        ds[0][n + i]
    n += 4
print(f"megatron __getitem__ (no DataLoader workers): {n / (time.time() - t0):.0f} samples/s")
