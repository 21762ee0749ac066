"""One graph op computed with PyTorch: shared by tools/torch_crosscheck.py (the
float32 reference) and bench/torch_compare.py (the framework path)."""

import math

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


def sdpa_fwd(q, k, v, op):
    """Outputs of sdpa_fwd by role: "o" and, when the op names a "stats" output,
    "stats" = logsumexp of the scaled, masked scores (natural log), [B,Hq,Sq,1]."""
    scale = op.get("attn_scale")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    causal = bool(op.get("causal", False))
    hq, hk = q.shape[1], k.shape[1]
    kwargs = {"enable_gqa": True} if hq != hk else {}
    # top-left causal, as torch's is_causal
    out = {"o": F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, **kwargs)}
    if "stats" in op.get("outputs", {}):
        kk = k.repeat_interleave(hq // hk, dim=1) if hq != hk else k
        s = torch.matmul(q, kk.transpose(-2, -1)) * scale
        if causal:
            sq, skv = s.shape[-2], s.shape[-1]
            mask = torch.ones(sq, skv, dtype=torch.bool, device=s.device).tril()
            s = s.masked_fill(~mask, float("-inf"))
        out["stats"] = torch.logsumexp(s, dim=-1, keepdim=True)
    return out


def apply_op(op, ins):
    """`op` is the JSON op object, `ins` maps its input roles to tensors.
    Returns a tensor (the "y" output), or for multi-output ops (sdpa_fwd) a
    dict output role -> tensor."""
    kind = op["op"]
    if kind == "sdpa_fwd":
        return sdpa_fwd(ins["q"], ins["k"], ins["v"], op)
    if kind == "conv_fprop":
        return conv(ins["x"], ins["w"], op)
    if kind == "matmul":
        return torch.matmul(ins["a"], ins["b"])
    if kind in _POINTWISE:
        return _POINTWISE[kind](ins)
    raise ValueError(f"op {op.get('name')!r}: no torch version of {kind!r}")
