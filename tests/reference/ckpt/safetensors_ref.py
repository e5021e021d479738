#!/usr/bin/env python3
"""Independent safetensors writer/reader written from the published format description
(github.com/huggingface/safetensors README, "Format"): 8-byte little-endian header size N,
N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}},
then the byte buffer. Canonical order (as the reference implementation): tensors sorted by
dtype descending in the enum order BOOL < U8 < I8 < F8_E5M2 < F8_E4M3 < I16 < U16 < F16 < BF16 <
I32 < F32 < F64 < I64, then by name; compact JSON listing "__metadata__" first (its keys sorted),
then the tensors in buffer order, each {"dtype", "shape", "data_offsets"} in that field order
(the order the reference implementation serializes), padded with spaces to a multiple of 8 bytes.

Usage:
  safetensors_ref.py write OUT.safetensors     # writes the committed fixture (reference.safetensors)
  safetensors_ref.py check FILE.safetensors    # parses FILE, checks it holds the fixture's tensors
  safetensors_ref.py dump FILE.safetensors     # prints name dtype shape values
Only numpy is needed (Debian python3-numpy). Values are chosen so that every encoding can be
checked by hand: bf16/fp8 bit patterns are written here as literal integers.
"""
import json
import struct
import sys

import numpy as np

ORDER = ["BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32", "F32", "F64", "I64"]
NP = {"BOOL": np.uint8, "U8": np.uint8, "I8": np.int8, "F8_E5M2": np.uint8, "F8_E4M3": np.uint8,
      "I16": np.int16, "U16": np.uint16, "F16": np.float16, "BF16": np.uint16, "I32": np.int32,
      "F32": np.float32, "F64": np.float64, "I64": np.int64}


def fixture():
    """name -> (dtype, shape, numpy array of the stored element bits/values)."""
    return {
        "a.f32": ("F32", [2, 3], (np.arange(6, dtype=np.float32) * 0.5 - 1.0)),
        # bf16 bits: 1.0=0x3f80, -2.5=0xc020, 3.140625=0x4049, 0.0=0x0000
        "b.bf16": ("BF16", [4], np.array([0x3F80, 0xC020, 0x4049, 0x0000], dtype=np.uint16)),
        "c.f16": ("F16", [2, 2], np.array([1.0, 0.333251953125, -65504.0, 2.0 ** -24], dtype=np.float16)),
        # e4m3: 1.0=0x38, 448=0x7e, -1.0=0xb8 ; e5m2: 1.0=0x3c, 57344=0x7b, -0.0=0x80
        "d.e4m3": ("F8_E4M3", [3], np.array([0x38, 0x7E, 0xB8], dtype=np.uint8)),
        "e.e5m2": ("F8_E5M2", [3], np.array([0x3C, 0x7B, 0x80], dtype=np.uint8)),
        "f.i64": ("I64", [2], np.array([-1, 2 ** 40], dtype=np.int64)),
        "g.i32": ("I32", [1, 2], np.array([-7, 123456], dtype=np.int32)),
        "h.u8": ("U8", [2], np.array([0, 255], dtype=np.uint8)),
        "i.bool": ("BOOL", [3], np.array([1, 0, 1], dtype=np.uint8)),
        "j.f64": ("F64", [2], np.array([np.pi, -1e300], dtype=np.float64)),
        "k.i8": ("I8", [2], np.array([-128, 127], dtype=np.int8)),
        "l.i16": ("I16", [2], np.array([-32768, 32767], dtype=np.int16)),
        "m.u16": ("U16", [2], np.array([0, 65535], dtype=np.uint16)),
        "scalar": ("F32", [], np.array([7.0], dtype=np.float32)),
        "empty": ("F32", [0, 3], np.zeros([0], dtype=np.float32)),
    }


METADATA = {"format": "pt", "producer": "tests/reference/ckpt/safetensors_ref.py"}


def write(path, tensors, metadata):
    names = sorted(tensors, key=lambda n: n)
    names = sorted(names, key=lambda n: -ORDER.index(tensors[n][0]))  # stable: dtype desc, then name
    header = {}
    if metadata:
        header["__metadata__"] = {k: metadata[k] for k in sorted(metadata)}
    buf = b""
    for n in names:
        dt, shape, arr = tensors[n]
        data = np.ascontiguousarray(arr, dtype=NP[dt]).astype("<" + np.dtype(NP[dt]).str[1:]).tobytes()
        header[n] = {"dtype": dt, "shape": shape, "data_offsets": [len(buf), len(buf) + len(data)]}  # field order matters
        buf += data
    hj = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hj += b" " * ((8 - len(hj) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj + buf)


def read(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    buf = raw[8 + n:]
    out = {}
    spans = []
    for name, e in header.items():
        b, end = e["data_offsets"]
        dt = e["dtype"]
        count = int(np.prod(e["shape"])) if e["shape"] else 1
        assert end - b == count * np.dtype(NP[dt]).itemsize, (name, e)
        spans.append((b, end))
        out[name] = (dt, e["shape"], np.frombuffer(buf[b:end], dtype=np.dtype(NP[dt]).newbyteorder("<")))
    spans.sort()
    pos = 0
    for b, end in spans:  # fully indexed, no holes, no overlap
        assert b == pos, ("hole or overlap at", b)
        pos = end
    assert pos == len(buf), "trailing bytes"
    return out, meta


def check(path):
    got, meta = read(path)
    want = fixture()
    assert set(got) == set(want), (sorted(got), sorted(want))
    for n, (dt, shape, arr) in want.items():
        gdt, gshape, garr = got[n]
        assert gdt == dt and list(gshape) == shape, (n, gdt, gshape)
        assert np.array_equal(garr.view(np.uint8), np.ascontiguousarray(arr, dtype=NP[dt]).view(np.uint8)), n
    print("safetensors_ref: %s OK (%d tensors, metadata %s)" % (path, len(got), meta))


if __name__ == "__main__":
    cmd, path = sys.argv[1], sys.argv[2]
    if cmd == "write":
        write(path, fixture(), METADATA)
    elif cmd == "check":
        check(path)
    else:
        for n, (dt, shape, arr) in read(path)[0].items():
            print(n, dt, shape, arr.tolist())
