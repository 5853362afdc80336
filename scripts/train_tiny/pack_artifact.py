"""Packs an exported checkpoint (make-checkpoint --from master weights) into the compact artifact
that ships in the repository (models/tiny-brown/weights.safetensors):

- every tensor as stored in the published checkpoint (FP8 block + e8m0 scales, MXFP4 + scales,
  bf16, f32), except:
- embed.weight / head.weight: only the rows of `vocab_ids` plus the shared row of every other id
  (last), as F8_E4M3 with 128x128 e8m0 block scales (`embed.scale`, `head.scale`); expanded back
  to bf16 by make-checkpoint --from (exact: e4m3 * 2^k is a bf16 value);
- gate.tid2eid as U8.

`make-checkpoint --from ARTIFACT` then reproduces the checkpoint except for the FP8 rounding of the
embed/head rows (measured by eval-checkpoint on the re-expanded checkpoint).
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402

_POS = st.E4M3[:0x7F].astype(np.float64)  # codes 0..126: non-negative values, increasing


def quant_e4m3(x):
    """Round to nearest e4m3 (ties to even code), saturating at 448. Returns codes."""
    a = np.minimum(np.abs(x).astype(np.float64), 448.0)
    hi = np.clip(np.searchsorted(_POS, a), 0, 126)
    lo = np.clip(hi - 1, 0, 126)
    dlo, dhi = a - _POS[lo], _POS[hi] - a
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo).astype(np.uint8)
    return np.where(x < 0, code | 0x80, code).astype(np.uint8)


def quant_fp8_block(w):
    """128x128 blocks, s = 2^ceil(log2(amax / 448)) (ue8m0), as src/model/weight_format.cpp."""
    n, k = w.shape
    nb, kb = (n + 127) // 128, (k + 127) // 128
    codes = np.zeros((n, k), np.uint8)
    scales = np.zeros((nb, kb), np.uint8)
    for i in range(nb):
        for j in range(kb):
            blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            amax = float(np.abs(blk).max())
            e = 0 if amax == 0 else int(np.ceil(np.log2(amax / 448.0)))
            # Exactly the power of two at or above amax/448.
            while amax > 0 and np.ldexp(448.0, e - 1) >= amax:
                e -= 1
            while amax > 0 and np.ldexp(448.0, e) < amax:
                e += 1
            scales[i, j] = e + 127
            codes[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = quant_e4m3(blk / np.ldexp(1.0, e))
    return codes, scales


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True, help="exported checkpoint directory")
    ap.add_argument("--master", required=True, help="train.py weights.safetensors (vocab_ids)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    raw = st.read_dir(a.checkpoint)
    vocab_ids = st.read_file(a.master)["vocab_ids"][2].astype(np.int64)
    other = np.setdiff1d(np.arange(raw["embed.weight"][1][0]), vocab_ids)[0]
    tensors = {}
    for name, (dt, shape, arr) in raw.items():
        if name in ("embed.weight", "head.weight"):
            full = st.bf16_to_f32(arr).reshape(shape)
            rows = np.concatenate([full[vocab_ids], full[other:other + 1]], 0)
            codes, scales = quant_fp8_block(rows)
            base = name[:-len(".weight")]
            tensors[name] = ("F8_E4M3", list(codes.shape), codes)
            tensors[base + ".scale"] = ("F8_E8M0", list(scales.shape), scales)
        elif name.endswith("tid2eid"):
            tensors[name] = ("U8", shape, arr.astype(np.uint8))
        else:
            tensors[name] = (dt, shape, arr)
    tensors["vocab_ids"] = ("U32", [len(vocab_ids)], vocab_ids.astype(np.uint32))
    names = sorted(tensors)
    header, off = {}, 0
    for n in names:
        dt, shape, arr = tensors[n]
        nb = arr.nbytes
        header[n] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + nb]}
        off += nb
    header["__metadata__"] = {"format": "pt", "source": "scripts/train_tiny (docs/tiny_model.md)"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for n in names:
            f.write(np.ascontiguousarray(tensors[n][2]).tobytes())
    print(f"{a.out}: {os.path.getsize(a.out)} bytes, {len(names)} tensors")


if __name__ == "__main__":
    main()
