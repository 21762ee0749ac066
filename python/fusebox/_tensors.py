"""Device tensors as fusebox binds them: a torch tensor (or anything that
quacks like one: dtype, shape, stride(), device, data_ptr()) or an object with
__cuda_array_interface__ (cupy, numba, ...), checked against the graph before
any pointer reaches the library. No copy is ever made."""
from dataclasses import dataclass
from typing import Optional, Tuple

from . import errors

# torch dtype (as str(dtype) prints it, so torch need not be imported) -> fusebox dtype
TORCH_TO_FUSEBOX = {
    "torch.bfloat16": "bf16",
    "torch.float16": "fp16",
    "torch.float32": "fp32",
    "torch.float8_e4m3fn": "fp8_e4m3",
    "torch.float8_e5m2": "fp8_e5m2",
    "torch.int32": "int32",
    "torch.int64": "int64",
    "torch.uint8": "uint8",
}
FUSEBOX_TO_TORCH = {v: k for k, v in TORCH_TO_FUSEBOX.items()}
# __cuda_array_interface__ typestr -> fusebox dtype (it has no bf16 or fp8 spelling)
TYPESTR_TO_FUSEBOX = {"<f2": "fp16", "<f4": "fp32", "<i4": "int32", "<i8": "int64", "|u1": "uint8"}
ITEMSIZE = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8_e4m3": 1, "fp8_e5m2": 1, "int32": 4, "int64": 8, "uint8": 1}


def torch_dtype(name):
    """The torch dtype of a fusebox dtype name ("bf16" -> torch.bfloat16)."""
    import torch
    try:
        return getattr(torch, FUSEBOX_TO_TORCH[name][len("torch."):])
    except KeyError:
        raise errors.InvalidArgument(f"no torch dtype for fusebox dtype {name!r}") from None


@dataclass
class View:
    """What binding needs of one tensor."""

    kind: str  # "torch" or "cuda_array_interface"
    dtype: Optional[str]  # fusebox name, None when unknown to fusebox
    dtype_text: str  # as the caller's library spells it
    shape: Tuple[int, ...]
    strides: Optional[Tuple[int, ...]]  # elements; None: not a whole number of elements
    device_type: str
    device_index: Optional[int]  # None: not known (a __cuda_array_interface__ object without .device)
    ptr: int
    obj: object = None


def _is_torch_like(obj):
    return all(callable(getattr(obj, a, None)) for a in ("data_ptr", "stride")) and hasattr(obj, "dtype") \
        and hasattr(obj, "shape") and hasattr(obj, "device")


def view(name, obj, with_pointer=True) -> View:
    """A View of `obj` for tensor `name`; InvalidArgument when it is no tensor. `with_pointer`
    False leaves ptr 0 (torch's fake tensors, under tracing, have none)."""
    if _is_torch_like(obj):
        dt = str(obj.dtype)
        dev = obj.device
        return View("torch", TORCH_TO_FUSEBOX.get(dt), dt, tuple(int(d) for d in obj.shape),
                    tuple(int(s) for s in obj.stride()), str(getattr(dev, "type", dev)),
                    getattr(dev, "index", None), int(obj.data_ptr()) if with_pointer else 0, obj)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if isinstance(cai, dict):
        typestr = cai.get("typestr", "?")
        shape = tuple(int(d) for d in cai.get("shape", ()))
        dtype = TYPESTR_TO_FUSEBOX.get(typestr)
        try:
            itemsize = int(typestr[2:])
        except ValueError:
            itemsize = 0
        raw = cai.get("strides")
        if raw is None:  # C-contiguous
            strides, acc = [], 1
            for d in reversed(shape):
                strides.append(acc)
                acc *= d
            strides = tuple(reversed(strides))
        elif itemsize and all(int(s) % itemsize == 0 for s in raw):
            strides = tuple(int(s) // itemsize for s in raw)
        else:
            strides = None
        dev = getattr(obj, "device", None)
        index = getattr(dev, "id", None)
        return View("cuda_array_interface", dtype, f"typestr {typestr!r}", shape, strides, "cuda", index,
                    int(cai["data"][0] or 0), obj)
    raise errors.InvalidArgument(
        f"tensor '{name}': a {type(obj).__module__}.{type(obj).__qualname__} is not a device tensor; expected a "
        "torch tensor or an object with __cuda_array_interface__")


def _contiguous(dims):
    out, acc = [], 1
    for d in reversed(dims):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


def _channels_last(dims):
    # torch's channels_last (4-d) / channels_last_3d (5-d): N, spatial..., C innermost
    if len(dims) not in (4, 5):
        return None
    n, c, *sp = dims
    strides = [0] * len(dims)
    strides[1] = 1
    acc = c
    for i in range(len(dims) - 1, 1, -1):
        strides[i] = acc
        acc *= dims[i]
    strides[0] = acc
    return tuple(strides)


def same_layout(dims, want, got):
    """Strides agree on every dimension of size > 1 (a size-1 dimension never moves in memory)."""
    return len(want) == len(got) and all(d == 1 or w == g for d, w, g in zip(dims, want, got))


def _layout_hint(dims, want):
    if same_layout(dims, _contiguous(dims), want):
        return "the graph declares it contiguous; pass tensor.contiguous()"
    cl = _channels_last(dims)
    if cl and same_layout(dims, cl, want):
        fmt = "channels_last" if len(dims) == 4 else "channels_last_3d"
        return f"the graph lays it out NHWC; pass tensor.contiguous(memory_format=torch.{fmt})"
    return "lay it out as the graph does (torch.empty_strided(dims, strides), or graph.empty(name))"


def check(where, t, v: View, device_index: Optional[int]):
    """Raises InvalidArgument when the View `v` cannot be bound as the graph's tensor `t` (a TensorInfo).

    `device_index`: the session's GPU (None for a deviceless session: any CUDA device)."""
    who = f"{where}: tensor '{t.name}'"
    if v.device_type != "cuda":
        raise errors.InvalidArgument(f"{who} is on {v.device_type}; expected a CUDA tensor"
                                     + (f" on cuda:{device_index}" if device_index is not None else ""))
    if device_index is not None and v.device_index is not None and v.device_index != device_index:
        raise errors.InvalidArgument(f"{who} is on cuda:{v.device_index}; the session runs on cuda:{device_index}")
    if v.dtype != t.dtype:
        expect = t.dtype + (f" ({FUSEBOX_TO_TORCH[t.dtype]})" if v.kind == "torch" else "")
        raise errors.InvalidArgument(f"{who} has dtype {v.dtype_text}; expected {expect}")
    if tuple(v.shape) != tuple(t.dims):
        raise errors.InvalidArgument(f"{who} has shape {list(v.shape)}; expected {list(t.dims)}")
    if v.strides is None or not same_layout(t.dims, t.strides, v.strides):
        got = "strides that are not whole elements" if v.strides is None else f"strides {list(v.strides)}"
        noncontig = v.strides is not None and not same_layout(t.dims, _contiguous(t.dims), v.strides)
        raise errors.InvalidArgument(
            f"{who} has {got}{' (not contiguous)' if noncontig else ''}; expected strides {list(t.strides)}: "
            + _layout_hint(t.dims, t.strides))
    if v.ptr == 0:
        raise errors.InvalidArgument(f"{who} has a NULL data pointer")
    if v.ptr % ITEMSIZE[t.dtype]:
        raise errors.InvalidArgument(f"{who}: data pointer {v.ptr:#x} is not aligned to its {ITEMSIZE[t.dtype]}-byte "
                                     "elements")


def check_all(where, graph_name, infos, tensors, device_index):
    """Checks a {name: tensor} mapping against the graph's tensors to bind; returns [(name, View)] in
    the graph's order. Unknown names first, then missing ones, then each tensor."""
    by_name = {t.name: t for t in infos}
    listing = ", ".join(t.name for t in infos)
    for name in tensors:
        if name not in by_name:
            raise errors.InvalidArgument(f"{where}: graph '{graph_name}' has no tensor '{name}' to bind; it binds "
                                         f"{listing}")
    missing = [t.name for t in infos if t.name not in tensors]
    if missing:
        raise errors.InvalidArgument(f"{where}: no tensor given for {', '.join(repr(m) for m in missing)} of graph "
                                     f"'{graph_name}' (it binds {listing})")
    out = []
    for t in infos:
        v = view(t.name, tensors[t.name])
        check(where, t, v, device_index)
        out.append((t.name, v))
    return out
