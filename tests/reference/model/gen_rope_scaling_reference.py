"""Reference values for Llama-3.1 RoPE frequency scaling and RoPE position interpolation
(tests/unit_tests/ops/rope_scaling_test.cpp).

Written from the published formulas, independently of megatron.cpp:
  * inv_freq[i] = 1 / base^(2i / rot_dim)                        (RoFormer / Megatron RotaryEmbedding)
  * Llama-3.1 scaling (Hugging Face transformers' _compute_llama3_parameters, the same rule as
    Megatron-Core's RotaryEmbedding._apply_scaling), with wavelen = 2*pi / inv_freq:
      wavelen > original / low_freq_factor   -> inv_freq / factor
      wavelen < original / high_freq_factor  -> inv_freq
      otherwise smooth = (original / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor),
                -> (1 - smooth) * inv_freq / factor + smooth * inv_freq
  * --rotary-seq-len-interpolation-factor F: the rotation angle at position p is (p / F) * inv_freq.
  * Rotation (rotate-half): y[i] = x[i] cos - x[i + rot/2] sin, y[i + rot/2] = x[i + rot/2] cos + x[i] sin.
All arithmetic in float64 (torch.float64); the inputs x are float32 values. Output:
tests/reference/model/data/rope_scaling.json.

Run: /usr/bin/python3 tests/reference/model/gen_rope_scaling_reference.py   (Debian python3-torch 1.13)
"""
import json
import math
import os

import torch

DT = torch.float64
LOW, HIGH, ORIG = 1.0, 4.0, 8192.0


def inv_freq(base, rot):
    return 1.0 / (base ** (torch.arange(0, rot, 2, dtype=DT) / rot))


def llama3(f, factor, low=LOW, high=HIGH, orig=ORIG):
    wavelen = 2 * math.pi / f
    out = torch.empty_like(f)
    for i in range(f.numel()):
        w, v = wavelen[i].item(), f[i].item()
        if w > orig / low:
            out[i] = v / factor
        elif w < orig / high:
            out[i] = v
        else:
            s = (orig / w - low) / (high - low)
            out[i] = (1 - s) * v / factor + s * v
    return out


def band(f):
    w = 2 * math.pi / f
    return ["low" if x > ORIG / LOW else "high" if x < ORIG / HIGH else "medium" for x in w.tolist()]


def rope(x, pos, freqs):
    """x [s, n, d] float64, pos [s] float64 positions (already divided by the interpolation factor)."""
    rot = 2 * freqs.numel()
    ang = pos[:, None] * freqs[None, :]  # [s, rot/2]
    c, s = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]
    y = x.clone()
    a, b = x[..., : rot // 2], x[..., rot // 2 : rot]
    y[..., : rot // 2] = a * c - b * s
    y[..., rot // 2 : rot] = b * c + a * s
    return y


out = {"inv_freq": [], "forward": []}
# (base, rot_dim, factor): Llama-3.1-8B/70B (theta 500000, head dim 128, factor 8), Llama-3.2-1B's
# factor 32, and a small base whose three bands all have entries at rot 64.
for base, rot, factor in [(500000.0, 128, 8.0), (500000.0, 64, 32.0), (10000.0, 64, 8.0)]:
    f = inv_freq(base, rot)
    g = llama3(f, factor)
    bands = band(f)
    # Distance of each wavelen from the band edges (relative): the fp32 kernels must not flip a band.
    w = (2 * math.pi / f).tolist()
    margin = min(min(abs(x - ORIG / LOW), abs(x - ORIG / HIGH)) / x for x in w)
    out["inv_freq"].append({"base": base, "rot": rot, "factor": factor, "unscaled": f.tolist(), "scaled": g.tolist(),
                            "bands": bands, "min_relative_distance_to_band_edge": margin})

gen = torch.Generator().manual_seed(2026)
# Forward cases: x [s, n=2, d=64] (float32 values), positions, Llama-3 base, scaling and/or interpolation.
for name, factor, interp, positions in [
    ("scaled", 8.0, None, [0, 1, 5, 37, 100, 1000]),
    ("interpolated", None, 4, [0, 1, 5, 37, 100, 1000]),
    ("scaled_interpolated", 8.0, 2, [0, 3, 64, 999]),
    ("plain", None, None, [0, 1, 5, 37, 100, 1000]),
]:
    d, n, base = 64, 2, 500000.0
    x = torch.randn((len(positions), n, d), generator=gen, dtype=torch.float32).to(DT)
    f = inv_freq(base, d)
    if factor is not None:
        f = llama3(f, factor)
    pos = torch.tensor(positions, dtype=DT)
    if interp is not None:
        pos = pos / interp
    y = rope(x, pos, f)
    out["forward"].append({"name": name, "base": base, "d": d, "n": n, "factor": factor, "interp": interp,
                           "positions": positions, "x": x.flatten().tolist(), "y": y.flatten().tolist()})

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "rope_scaling.json")
tmp = path + ".tmp"
with open(tmp, "w") as fh:
    json.dump(out, fh, indent=None, separators=(",", ":"))
    fh.write("\n")
os.replace(tmp, path)
for c in out["inv_freq"]:
    print(c["base"], c["rot"], c["factor"], {b: c["bands"].count(b) for b in ("high", "medium", "low")},
          "min rel distance to band edge %.3g" % c["min_relative_distance_to_band_edge"])
print("wrote", path, os.path.getsize(path), "bytes")
