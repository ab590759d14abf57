"""gguf_write.py — a minimal GGUF v3 writer for scripts/train-models (gguf-py is not packaged in Debian).

Writes metadata key/values and F32 / F16 / Q8_0 tensors, 32-byte aligned, in the layout
src/gguf/gguf.c reads. Q8_0 follows ggml's quantize_row_q8_0_ref exactly: blocks of 32 values,
d = amax / 127 stored as f16, q = roundf(x / d) (round half away from zero) as int8.
"""
import struct

import numpy as np

GGML_F32, GGML_F16, GGML_Q8_0 = 0, 1, 8
T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR = 4, 5, 6, 7, 8, 9
ALIGN = 32


def _str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def q8_0_bytes(a):
    """ggml Q8_0 blocks of a float32 matrix whose rows are multiples of 32 long."""
    x = np.ascontiguousarray(a, dtype=np.float32).reshape(-1, 32)
    amax = np.abs(x).max(axis=1)
    d = (amax / np.float32(127.0)).astype(np.float32)
    inv = np.where(d != 0, np.float32(1.0) / np.where(d != 0, d, np.float32(1.0)), np.float32(0.0)).astype(np.float32)
    v = (x * inv[:, None]).astype(np.float32)
    q = (np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))).astype(np.int8)
    out = np.empty((x.shape[0], 34), dtype=np.uint8)
    out[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.tobytes()


def q8_0_dequant(a):
    """The float32 values a Q8_0 round trip gives (for the Python side of parity checks)."""
    x = np.ascontiguousarray(a, dtype=np.float32).reshape(-1, 32)
    raw = np.frombuffer(q8_0_bytes(a), dtype=np.uint8).reshape(-1, 34)
    d = raw[:, 0:2].copy().view(np.float16).astype(np.float32)
    q = raw[:, 2:].copy().view(np.int8).astype(np.float32)
    return (q * d).reshape(np.shape(a))


class Writer:
    def __init__(self):
        self.kv = []
        self.tensors = []  # (name, ne list, type, bytes)

    def u32(self, k, v): self.kv.append(_str(k) + struct.pack("<II", T_U32, v))
    def i32(self, k, v): self.kv.append(_str(k) + struct.pack("<Ii", T_I32, v))
    def f32(self, k, v): self.kv.append(_str(k) + struct.pack("<If", T_F32, v))
    def bool(self, k, v): self.kv.append(_str(k) + struct.pack("<IB", T_BOOL, 1 if v else 0))
    def str(self, k, v): self.kv.append(_str(k) + struct.pack("<I", T_STR) + _str(v))

    def arr_str(self, k, vals):
        body = b"".join(_str(s) for s in vals)
        self.kv.append(_str(k) + struct.pack("<IIQ", T_ARR, T_STR, len(vals)) + body)

    def arr_f32(self, k, vals):
        self.kv.append(_str(k) + struct.pack("<IIQ", T_ARR, T_F32, len(vals)) + np.asarray(vals, "<f4").tobytes())

    def arr_i32(self, k, vals):
        self.kv.append(_str(k) + struct.pack("<IIQ", T_ARR, T_I32, len(vals)) + np.asarray(vals, "<i4").tobytes())

    def tensor(self, name, a, typ):
        """a: numpy array in PyTorch layout ([rows][cols]); GGUF ne is the reverse (ne[0] = cols)."""
        a = np.ascontiguousarray(a, dtype=np.float32)
        ne = list(reversed(a.shape))
        if typ == GGML_F32:
            data = a.astype("<f4").tobytes()
        elif typ == GGML_F16:
            data = a.astype("<f2").tobytes()
        elif typ == GGML_Q8_0:
            assert a.shape[-1] % 32 == 0, name
            data = q8_0_bytes(a)
        else:
            raise ValueError(typ)
        self.tensors.append((name, ne, typ, data))

    def write(self, path):
        with open(path, "wb") as f:
            f.write(b"GGUF" + struct.pack("<IQQ", 3, len(self.tensors), len(self.kv)))
            for kv in self.kv:
                f.write(kv)
            off = 0
            offs = []
            for name, ne, typ, data in self.tensors:
                offs.append(off)
                off += (len(data) + ALIGN - 1) // ALIGN * ALIGN
            for (name, ne, typ, data), o in zip(self.tensors, offs):
                f.write(_str(name) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne) +
                        struct.pack("<IQ", typ, o))
            pad = (-f.tell()) % ALIGN
            f.write(b"\0" * pad)
            for name, ne, typ, data in self.tensors:
                f.write(data)
                f.write(b"\0" * ((-len(data)) % ALIGN))
