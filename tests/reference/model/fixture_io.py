"""Writes named tensors as <name>.json (index) + <name>.bin (raw little-endian data), the format
read by tests/unit_tests/test_utils/fixture_util.cpp."""
import json
import os

import numpy as np
import torch

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def write_fixture(name, tensors):
    os.makedirs(DATA_DIR, exist_ok=True)
    index, chunks, offset = {}, [], 0
    for key, t in tensors.items():
        if isinstance(t, torch.Tensor):
            t = t.detach().cpu()
            arr = t.numpy().astype("<i8") if t.dtype == torch.int64 else t.to(torch.float32).numpy().astype("<f4")
        else:
            arr = np.asarray(t)
        dtype = "int64" if arr.dtype.kind == "i" else "float32"
        arr = np.ascontiguousarray(arr.astype("<i8" if dtype == "int64" else "<f4"))
        index[key] = {"dtype": dtype, "shape": list(arr.shape), "offset": offset}
        chunks.append(arr.tobytes())
        offset += arr.nbytes
    base = os.path.join(DATA_DIR, name)
    with open(base + ".bin.tmp", "wb") as f:
        for c in chunks:
            f.write(c)
    with open(base + ".json.tmp", "w") as f:
        json.dump({"tensors": index}, f, indent=0, sort_keys=True)
    os.replace(base + ".bin.tmp", base + ".bin")
    os.replace(base + ".json.tmp", base + ".json")
    print(f"wrote {base}.{{json,bin}}: {len(index)} tensors, {offset} bytes")
