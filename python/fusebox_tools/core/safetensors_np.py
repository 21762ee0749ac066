"""Reading and writing safetensors files with numpy alone (no torch, no
safetensors package): what fusebox's pipelines read for constants with a
`.safetensors` file (docs/pipeline-format.md), for the tools and tests.

    read(path, key)  -> np.ndarray (float32 for float dtypes, int64 for ints)
    keys(path)       -> the tensor names
    metadata(path)   -> the `__metadata__` strings ({} when absent)
    write(path, {name: array}, dtypes={name: "BF16"})  (float arrays rounded to
                     BF16/F16 when asked; F32 otherwise, I32/I64 for ints)
"""
import json
import struct

import numpy as np

_NP = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32}
_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "F8_E4M3": 1, "F8_E5M2": 1}


def _header(f):
    n = struct.unpack("<Q", f.read(8))[0]
    if n > 100 << 20:
        raise ValueError(f"safetensors header of {n} bytes is over 100 MiB")
    return json.loads(f.read(n)), 8 + n


def keys(path):
    with open(path, "rb") as f:
        h, _ = _header(f)
    return [k for k in h if k != "__metadata__"]


def metadata(path):
    """The file's `__metadata__` (str -> str); {} when it has none."""
    with open(path, "rb") as f:
        h, _ = _header(f)
    return dict(h.get("__metadata__") or {})


def _fp8_to_float(raw, mant, bias, e4m3):
    s = np.where(raw & 0x80, -1.0, 1.0)
    e = (raw >> mant) & ((0x7F >> mant))
    m = raw & ((1 << mant) - 1)
    sub = s * m * 2.0 ** (1 - bias - mant)
    norm = s * (1 + m / (1 << mant)) * 2.0 ** (e.astype(np.float64) - bias)
    out = np.where(e == 0, sub, norm)
    if e4m3:
        out = np.where((e == 15) & (m == 7), np.nan, out)
    else:
        out = np.where(e == 31, np.where(m == 0, s * np.inf, np.nan), out)
    return out.astype(np.float32)


def read(path, key):
    with open(path, "rb") as f:
        h, start = _header(f)
        if key not in h or key == "__metadata__":
            raise KeyError(f"{path}: no tensor named {key!r}")
        e = h[key]
        begin, end = e["data_offsets"]
        f.seek(start + begin)
        raw = f.read(end - begin)
    dt, shape = e["dtype"], e["shape"]
    if dt == "BF16":
        a = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
    elif dt in ("F8_E4M3", "F8_E5M2"):
        b = np.frombuffer(raw, np.uint8)
        a = _fp8_to_float(b, 3, 7, True) if dt == "F8_E4M3" else _fp8_to_float(b, 2, 15, False)
    else:
        a = np.frombuffer(raw, _NP[dt])
        a = a.astype(np.int64 if dt.startswith("I") else np.float32)
    return a.reshape(shape)


def _bf16_bits(a):
    u = np.ascontiguousarray(a, np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even


def write(path, tensors, dtypes=None, metadata=None):
    """Writes `tensors` (name -> array) in order; dtypes: name -> "F32", "F16",
    "BF16", "I32", "I64" (default F32 for floats, I64 for ints)."""
    dtypes = dtypes or {}
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, a in tensors.items():
        a = np.asarray(a)
        dt = dtypes.get(name) or ("F32" if a.dtype.kind == "f" else "I64")
        if dt == "BF16":
            b = _bf16_bits(a).tobytes()
        else:
            b = np.ascontiguousarray(a, _NP[dt]).astype(np.dtype(_NP[dt]).newbyteorder("<")).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
