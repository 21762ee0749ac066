"""Reads fusebox graph JSON files for the Python tools (stdlib only).

A small mirror of the graph format (docs/graph-format.md): enough to find the
inputs, outputs, scalars and dtypes of a graph, count its FLOPs and walk its
ops in topological order. fusebox's resolve() stays the authority: these
tools only read graphs that fusebox accepts.
"""
import glob
import json
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


def primary_role(op):
    """The op's main output role: "o" for sdpa_fwd, "y" for every other op."""
    return "o" if op["op"] == "sdpa_fwd" else "y"


def sdpa_unmasked_pairs(sq, skv, causal):
    """Query/key pairs scored per (batch, head); top-left causal: row i sees keys j <= i."""
    if not causal:
        return sq * skv
    full = min(sq, skv)
    return full * (full + 1) // 2 + max(sq - skv, 0) * skv


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
        if kind == "sdpa_fwd":
            q, v = self.dims[ins["q"]], self.dims[ins["v"]]
            return {"o": [q[0], q[1], q[2], v[3]], "stats": [q[0], q[1], q[2], 1]}
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

    def dtype(self, name):
        t = self.declared.get(name)
        op = self.produced.get(name)
        if (op is not None and op["op"] == "sdpa_fwd" and op["outputs"].get("stats") == name
                and (t is None or "dtype" not in t)):
            return "fp32"  # sdpa stats are always fp32
        if t is not None and "dtype" in t:
            return canonical_dtype(t["dtype"])
        if t is not None and "scalar" in t:
            return "fp32"
        if t is None or t.get("virtual", False):
            return self.intermediate_dtype
        return self.io_dtype

    def flops(self):
        """2*MACs for conv and matmul, one per output element for pointwise ops,
        2*B*Hq*(D+Dv) per unmasked query/key pair for sdpa_fwd."""
        total = 0
        for op in self.ops:
            if op["op"] == "sdpa_fwd":
                q, k, v = (self.dims[op["inputs"][r]] for r in ("q", "k", "v"))
                pairs = sdpa_unmasked_pairs(q[2], k[2], bool(op.get("causal", False)))
                total += 2 * q[0] * q[1] * pairs * (q[3] + v[3])
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


def prod(xs):
    p = 1
    for x in xs:
        p *= x
    return p
