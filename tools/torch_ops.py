"""One graph op computed with PyTorch: shared by tools/torch_crosscheck.py (the
float32 reference) and bench/torch_compare.py (the framework path)."""

import torch
import torch.nn.functional as F


def conv(x, w, op):
    nsp = x.dim() - 2
    fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nsp]
    return fn(x, w, padding=tuple(op.get("padding") or [0] * nsp),
              stride=tuple(op.get("stride") or [1] * nsp),
              dilation=tuple(op.get("dilation") or [1] * nsp))


_POINTWISE = {
    "add": lambda i: i["a"] + i["b"],
    "sub": lambda i: i["a"] - i["b"],
    "mul": lambda i: i["a"] * i["b"],
    "bias_add": lambda i: i["x"] + i["bias"],
    "scale": lambda i: i["x"] * i["scale"],
    "relu": lambda i: torch.relu(i["x"]),
    "gelu_tanh": lambda i: F.gelu(i["x"], approximate="tanh"),
    "gelu_erf": lambda i: F.gelu(i["x"]),
    "silu": lambda i: F.silu(i["x"]),
    "sigmoid": lambda i: torch.sigmoid(i["x"]),
    "tanh": lambda i: torch.tanh(i["x"]),
}


def apply_op(op, ins):
    """`op` is the JSON op object, `ins` maps its input roles to tensors."""
    kind = op["op"]
    if kind == "conv_fprop":
        return conv(ins["x"], ins["w"], op)
    if kind == "matmul":
        return torch.matmul(ins["a"], ins["b"])
    if kind in _POINTWISE:
        return _POINTWISE[kind](ins)
    raise ValueError(f"op {op.get('name')!r}: no torch version of {kind!r}")
