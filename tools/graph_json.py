"""Reads fusebox graph JSON files for the Python tools (stdlib only).

A small mirror of the graph format (docs/graph-format.md): enough to find the
inputs, outputs, scalars and dtypes of a graph, count its FLOPs and walk its
ops in topological order. fusebox's resolve() stays the authority: these
tools only read graphs that fusebox accepts.
"""
import glob
import json
import math
import os

DTYPE_ALIASES = {
    "bf16": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "half": "fp16", "float16": "fp16",
    "fp32": "fp32", "float": "fp32", "float32": "fp32",
    "fp8_e4m3": "fp8_e4m3", "e4m3": "fp8_e4m3",
    "fp8_e5m2": "fp8_e5m2", "e5m2": "fp8_e5m2",
    "int32": "int32", "int64": "int64",
}
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8_e4m3": 1, "fp8_e5m2": 1, "int32": 4, "int64": 8}
UNARY_OPS = {"relu", "gelu_tanh", "gelu_erf", "silu", "sigmoid", "tanh"}


def canonical_dtype(name):
    if name not in DTYPE_ALIASES:
        raise ValueError(f"unknown dtype {name!r}")
    return DTYPE_ALIASES[name]


def default_graphs(repo_root):
    """Valid example graphs: examples/graphs/*.json and small/*.json, no invalid_*."""
    paths = sorted(glob.glob(os.path.join(repo_root, "examples", "graphs", "*.json")))
    paths += sorted(glob.glob(os.path.join(repo_root, "examples", "graphs", "small", "*.json")))
    return [p for p in paths if not os.path.basename(p).startswith("invalid_")]


def conv_out_dims(x_dims, w_dims, padding, stride, dilation):
    nsp = len(x_dims) - 2
    padding = padding or [0] * nsp
    stride = stride or [1] * nsp
    dilation = dilation or [1] * nsp
    out = [x_dims[0], w_dims[0]]
    for i in range(nsp):
        span = dilation[i] * (w_dims[2 + i] - 1) + 1
        out.append((x_dims[2 + i] + 2 * padding[i] - span) // stride[i] + 1)
    return out


SDPA_OPS = {"sdpa_fwd", "sdpa_bwd", "sdpa_fp8_fwd", "sdpa_fp8_bwd"}
FP8_SCALE_ROLES = ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")
SEQ_LEN_ROLES = ("seq_len_q", "seq_len_kv")
INT_DTYPES = {"int32", "int64"}


def primary_role(op):
    """The op's main output role: "o" for sdpa_fwd and sdpa_fp8_fwd, "dq" for
    sdpa_bwd, "y" for every other op."""
    return {"sdpa_fwd": "o", "sdpa_fp8_fwd": "o", "sdpa_bwd": "dq"}.get(op["op"], "y")


class SdpaOptions:
    """An sdpa op's options, resolved as fusebox's resolve() does (graph.h,
    SdpaOptions): attn_scale defaults to 1/sqrt(D); causal sets right_bound 0;
    padding and bias are on when the op names those inputs."""

    def __init__(self, op, head_dim):
        self.kind = op["op"]
        scale = op.get("attn_scale")
        self.attn_scale = float(scale) if scale is not None else 1.0 / math.sqrt(head_dim)
        self.causal = bool(op.get("causal", False))
        alignment = op.get("alignment", "top_left")
        if alignment not in ("top_left", "bottom_right"):
            raise ValueError(f"op {op.get('name')!r}: unknown alignment {alignment!r}")
        self.bottom_right = alignment == "bottom_right"
        self.left_bound = op.get("left_bound")
        self.right_bound = op.get("right_bound")
        if self.causal and self.right_bound is None:
            self.right_bound = 0
        self.alibi = bool(op.get("alibi", False))
        self.dropout = op.get("dropout")
        ins = op["inputs"]
        self.padding = any(r in ins for r in SEQ_LEN_ROLES)
        self.bias = "bias" in ins

    def offset(self, lq, lkv):
        return lkv - lq if self.bottom_right else 0

    def keeps(self, i, j, lq, lkv):
        """Whether score (i, j) is kept: sdpa_keeps() of src/graph/graph.cpp."""
        if self.padding and (j >= lkv or i >= lq):
            return False
        off = self.offset(lq, lkv)
        if self.right_bound is not None and j > i + off + self.right_bound:
            return False
        if self.left_bound is not None and j <= i + off - self.left_bound:
            return False
        return True

    def kept_pairs(self, lq, lkv):
        """Kept (query, key) pairs of one (batch, head) with actual lengths lq, lkv."""
        off = self.offset(lq, lkv)
        pairs = 0
        for i in range(lq):
            hi = lkv - 1
            if self.right_bound is not None:
                hi = min(hi, i + off + self.right_bound)
            lo = 0
            if self.left_bound is not None:
                lo = max(lo, i + off - self.left_bound + 1)
            if hi >= lo:
                pairs += hi - lo + 1
        return pairs


def alibi_slopes(heads):
    """cuDNN's ALiBi slope per query head (alibi_slopes() of graph.cpp, the
    frontend's get_alibi_slope): n = largest power of two <= heads; head h < n
    gets 2^(-8(h+1)/n), the others 2^(-4(2m+1)/n), m = 0, 1, ... Computed in
    float32 like the C++ (float exponent, powf)."""
    import numpy as np  # local: graph_json itself stays stdlib-only for other users
    n = 1
    while n * 2 <= heads:
        n *= 2
    exps = [float(h + 1) for h in range(n)] + [(m + 1) * 0.5 for m in range(0, 2 * (heads - n), 2)]
    out = []
    for e in exps:
        x = np.float32(-8.0) * np.float32(e) / np.float32(n)
        out.append(float(np.power(np.float32(2.0), x, dtype=np.float32)))
    return out


def broadcast_dims(a, b):
    if len(a) != len(b):
        # Scalars without dims broadcast to anything.
        return list(a) if len(a) >= len(b) else list(b)
    return [max(x, y) if 1 in (x, y) else x for x, y in zip(a, b)]


class Graph:
    """A parsed graph: tensors (name -> dict), ops in topological order."""

    def __init__(self, path):
        self.path = path
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        self.name = doc.get("name") or os.path.splitext(os.path.basename(path))[0]
        self.io_dtype = canonical_dtype(doc.get("io_dtype", "bf16"))
        self.intermediate_dtype = canonical_dtype(doc.get("intermediate_dtype", "fp32"))
        self.compute_dtype = canonical_dtype(doc.get("compute_dtype", "fp32"))
        self.declared = {t["name"]: t for t in doc["tensors"]}
        produced = {}
        for op in doc["ops"]:
            role = primary_role(op)
            op.setdefault("outputs", {role: op["name"] + "." + role})
            for y in op["outputs"].values():
                produced[y] = op
        self.produced = produced
        self.ops = self._topo_sort(doc["ops"])
        self.dims = {}
        for name, t in self.declared.items():
            if "scalar" in t:
                self.dims[name] = list(t["dims"]) if t.get("dims") else []
            elif name not in produced:
                self.dims[name] = list(t["dims"])
        for op in self.ops:
            dims = self._infer(op)
            if not isinstance(dims, dict):
                dims = {"y": dims}
            for role, name in op["outputs"].items():
                self.dims[name] = dims[role]

    def _topo_sort(self, ops):
        done, order, pending = set(), [], list(ops)
        while pending:
            ready = [op for op in pending
                     if all(t not in self.produced or t in done for t in op["inputs"].values())]
            if not ready:
                raise ValueError(f"{self.path}: ops form a cycle or use undefined tensors")
            for op in ready:
                order.append(op)
                done.update(op["outputs"].values())
                pending.remove(op)
        return order

    def _infer(self, op):
        kind, ins = op["op"], op["inputs"]
        if kind == "conv_fprop":
            return conv_out_dims(self.dims[ins["x"]], self.dims[ins["w"]],
                                 op.get("padding"), op.get("stride"), op.get("dilation"))
        if kind == "matmul":
            a, b = self.dims[ins["a"]], self.dims[ins["b"]]
            batch = [max(x, y) for x, y in zip(a[:-2], b[:-2])]
            return batch + [a[-2], b[-1]]
        if kind in ("add", "sub", "mul"):
            return broadcast_dims(self.dims[ins["a"]], self.dims[ins["b"]])
        if kind in ("bias_add", "scale") or kind in UNARY_OPS:
            return list(self.dims[ins["x"]])
        if kind in SDPA_OPS:
            q, k, v = self.dims[ins["q"]], self.dims[ins["k"]], self.dims[ins["v"]]
            one = [1, 1, 1, 1]
            out = {"dropout_mask": [q[0], q[1], q[2], k[2]]}
            if kind in ("sdpa_fwd", "sdpa_fp8_fwd"):
                out.update({"o": [q[0], q[1], q[2], v[3]], "stats": [q[0], q[1], q[2], 1],
                            "amax_s": one, "amax_o": one})
            else:
                out.update({"dq": list(q), "dk": list(k), "dv": list(v), "amax_dq": one, "amax_dk": one,
                            "amax_dv": one, "amax_dp": one})
            return out
        raise ValueError(f"{self.path}: unknown op {kind!r}")

    def is_scalar(self, name):
        return "scalar" in self.declared.get(name, {})

    def inputs(self):
        """Graph inputs (not scalars) in declaration order."""
        return [n for n, t in self.declared.items()
                if n not in self.produced and "scalar" not in t]

    def outputs(self):
        return [n for n, t in self.declared.items()
                if n in self.produced and not t.get("virtual", False)]

    def values(self, name):
        """A graph input's fixed contents ("values", logical row-major), else None."""
        v = self.declared.get(name, {}).get("values")
        return list(v) if v else None

    def sdpa_options(self, op):
        return SdpaOptions(op, self.dims[op["inputs"]["q"]][3])

    def consumers(self, name):
        """(op, role) pairs reading tensor `name`."""
        return [(op, role) for op in self.ops for role, t in op["inputs"].items() if t == name]

    def output_role(self, name):
        """(op, role) producing tensor `name`, or (None, None)."""
        op = self.produced.get(name)
        if op is None:
            return None, None
        return op, next(r for r, t in op["outputs"].items() if t == name)

    def dtype(self, name):
        t = self.declared.get(name)
        op, role = self.output_role(name)
        if op is not None and op["op"] in SDPA_OPS and (t is None or "dtype" not in t):
            # resolve(): stats and amax are fp32; o, dq, dk, dv take q's dtype.
            if role in ("stats", "amax_s", "amax_o", "amax_dq", "amax_dk", "amax_dv", "amax_dp", "dropout_mask"):
                return "fp32"
            return self.dtype(op["inputs"]["q"])
        if t is not None and "dtype" in t:
            return canonical_dtype(t["dtype"])
        if t is not None and "scalar" in t:
            return "fp32"
        if t is None or t.get("virtual", False):
            return self.intermediate_dtype
        return self.io_dtype

    def seq_lens(self, op, inputs=None):
        """Per-batch (lq, lkv) lists of an sdpa op: from `inputs` (tensor name ->
        values, anything iterable), else the tensor's "values", else full length."""
        q, k = self.dims[op["inputs"]["q"]], self.dims[op["inputs"]["k"]]
        out = []
        for role, full in (("seq_len_q", q[2]), ("seq_len_kv", k[2])):
            name = op["inputs"].get(role)
            vals = None
            if name is not None:
                if inputs is not None and name in inputs:
                    vals = [int(x) for x in _flat(inputs[name])]
                elif self.values(name):
                    vals = [int(x) for x in self.values(name)]
            out.append(vals if vals is not None else [full] * q[0])
        return out[0], out[1]

    def sdpa_kept_pairs(self, op, inputs=None):
        """Kept (query, key) pairs summed over the batch (per head)."""
        opts = self.sdpa_options(op)
        lq, lkv = self.seq_lens(op, inputs)
        cache, pairs = {}, 0
        for a, b in zip(lq, lkv):
            if (a, b) not in cache:
                cache[(a, b)] = opts.kept_pairs(a, b)
            pairs += cache[(a, b)]
        return pairs

    def sdpa_flops(self, op, inputs=None):
        """fusebox's count: 2*Hq*(D+Dv) per kept pair (4*B*Hq*D*pairs when Dv == D);
        2.5 times that for sdpa_bwd."""
        q, v = self.dims[op["inputs"]["q"]], self.dims[op["inputs"]["v"]]
        f = 2 * q[1] * self.sdpa_kept_pairs(op, inputs) * (q[3] + v[3])
        return f * 2.5 if op["op"] in ("sdpa_bwd", "sdpa_fp8_bwd") else f

    def flops(self, inputs=None):
        """2*MACs for conv and matmul, one per output element for pointwise ops,
        2*B*Hq*(D+Dv) per kept query/key pair for the sdpa forwards, 2.5 times
        that for sdpa_bwd (as ResolvedGraph::flops). `inputs`: tensor name ->
        values for seq_len tensors (padding); missing ones count as full length."""
        total = 0
        for op in self.ops:
            if op["op"] in SDPA_OPS:
                total += self.sdpa_flops(op, inputs)
                continue
            y = self.dims[op["outputs"]["y"]]
            n_out = prod(y)
            if op["op"] == "conv_fprop":
                w = self.dims[op["inputs"]["w"]]
                total += 2 * n_out * prod(w[1:])
            elif op["op"] == "matmul":
                total += 2 * n_out * self.dims[op["inputs"]["a"]][-1]
            else:
                total += n_out
        return total

    def bytes_moved(self):
        names = self.inputs() + self.outputs()
        return sum(prod(self.dims[n]) * DTYPE_BYTES[self.dtype(n)] for n in names)


def _flat(x):
    if hasattr(x, "reshape") and hasattr(x, "tolist"):
        return x.reshape(-1).tolist()
    out = []
    for e in x:
        out.extend(_flat(e) if isinstance(e, (list, tuple)) else [e])
    return out


def prod(xs):
    p = 1
    for x in xs:
        p *= x
    return p
