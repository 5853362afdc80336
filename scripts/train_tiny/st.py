"""Minimal safetensors reader/writer and the checkpoint's quantized formats, in numpy.

Reads the published DeepSeek-V4 layout (sharded safetensors: 8-byte little-endian header length,
JSON header, raw bytes) and dequantizes FP8 e4m3 with e8m0 128x128 block scales and MXFP4 (e2m1,
element 2j in the low nibble, one e8m0 per 32 K-elements) exactly as src/kernels/cpu/linear.cpp.
"""
import glob
import json
import os
import struct

import numpy as np

_NP = {"F32": np.float32, "I64": np.int64, "I32": np.int32, "U8": np.uint8, "I8": np.uint8,
       "F8_E4M3": np.uint8, "F8_E8M0": np.uint8, "BF16": np.uint16, "U32": np.uint32}


def e4m3_table():
    t = np.zeros(256, np.float32)
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e = (b >> 3) & 0xF
        m = b & 0x7
        if e == 0xF and m == 0x7:
            t[b] = np.nan
        elif e == 0:
            t[b] = s * (m / 8.0) * 2.0 ** -6
        else:
            t[b] = s * (1.0 + m / 8.0) * 2.0 ** (e - 7)
    return t


E4M3 = e4m3_table()
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def e8m0(b):
    return np.ldexp(np.float32(1.0), b.astype(np.int32) - 127).astype(np.float32)


def bf16_to_f32(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x):
    """Round to nearest even bf16 bits."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def read_file(path):
    """{name: (dtype string, shape, raw numpy array of the storage dtype)}."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        arr = np.frombuffer(data[a:b], dtype=_NP[meta["dtype"]]).copy()
        out[name] = (meta["dtype"], meta["shape"], arr)
    return out


def read_dir(path):
    out = {}
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    for f in files:
        out.update(read_file(f))
    return out


def dequant_fp8_block(codes, shape, scale):
    n, k = shape
    w = E4M3[codes.reshape(n, k)]
    s = e8m0(scale).reshape((n + 127) // 128, (k + 127) // 128)
    s = np.repeat(np.repeat(s, 128, 0), 128, 1)[:n, :k]
    return w * s


def dequant_mxfp4(packed, shape, scale):
    n, kp = shape  # stored [N, K/2]
    k = kp * 2
    p = packed.reshape(n, kp)
    codes = np.empty((n, k), np.uint8)
    codes[:, 0::2] = p & 0xF
    codes[:, 1::2] = p >> 4
    s = np.repeat(e8m0(scale).reshape(n, k // 32), 32, 1)
    return E2M1[codes] * s


def load_fp32(path):
    """All tensors of a checkpoint directory dequantized to fp32 (tid2eid stays int64), under the
    published names without the '.weight' scale siblings."""
    raw = read_dir(path)
    out = {}
    for name, (dt, shape, arr) in raw.items():
        if name.endswith(".scale") and (name[:-6] + ".weight") in raw:
            continue
        if dt == "F8_E4M3":
            sc = raw[name[:-7] + ".scale"]
            out[name] = dequant_fp8_block(arr, shape, sc[2])
        elif dt == "I8":
            sc = raw[name[:-7] + ".scale"]
            out[name] = dequant_mxfp4(arr, shape, sc[2])
        elif dt == "BF16":
            out[name] = bf16_to_f32(arr).reshape(shape)
        elif dt == "F32":
            out[name] = arr.reshape(shape)
        elif dt == "I64":
            out[name] = arr.reshape(shape)
        else:
            raise ValueError(f"{name}: unsupported dtype {dt}")
    return out


def write_file(path, tensors, metadata=None):
    """tensors: {name: numpy array (float32 -> F32, uint16 -> BF16, int64 -> I64, uint32 -> U32)}."""
    names = sorted(tensors)
    header = {}
    off = 0
    blobs = []
    for n in names:
        a = np.ascontiguousarray(tensors[n])
        dt = {np.dtype(np.float32): "F32", np.dtype(np.uint16): "BF16", np.dtype(np.int64): "I64",
              np.dtype(np.uint32): "U32", np.dtype(np.int32): "I32", np.dtype(np.uint8): "U8"}[a.dtype]
        b = a.tobytes()
        header[n] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
