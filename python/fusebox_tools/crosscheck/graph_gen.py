"""A randomized generator of valid fusebox graph files (issue #29, item 5).

`generate(seed)` returns one graph document (the JSON format of docs/graph-format.md),
chosen deterministically from the seed: the seed picks the op family (round robin over
`FAMILIES`, so seeds 0 .. len(FAMILIES)-1 cover every family once) and seeds a
`random.Random` that draws everything else. Every document is meant to pass
`fusebox check` (exit 0): shapes, dtypes, roles and attributes follow the format's rules.
Whether cuDNN 9.19 runs a combination on a given GPU is cuDNN's decision: a generated graph
may be refused by `build` with `NotSupported` (exit 1), never with anything else.

Families (one small function each, registered in `FAMILIES`):

* `conv_fprop`: 2-D and 3-D convolutions, nchw/nhwc (ncdhw/ndhwc), bf16/fp16/fp32, odd
  sizes, strides, padding, dilation, grouped and depthwise, with epilogues (`bias_add`,
  `scale` by a by-value scalar or a per-channel tensor, residual `add`, `sub`, `mul`,
  `relu`, `gelu_tanh`, `gelu_erf`, `silu`, `sigmoid`, `tanh`, the sigmoid*tanh gate).
* `conv_dgrad` (optionally with a fused `relu_bwd`), `conv_wgrad`: 2-D and 3-D, grouped,
  strided (x sizes that stride > 1 rounds), dilated.
* `conv_reduce`: a convolution, its pointwise ops and a final reduction (channel sums, amax).
* `matmul`: rank 3 and 4 (batched, broadcast batch dims), row/col-major and padded
  leading dims, column and row biases, residuals, scales, gates, activations.
* `matmul_reduce`: a GEMM, its epilogue and a final reduction (row/column sums, max, amax).
* `fp8_matmul`: e4m3/e5m2 x e4m3/e5m2 with fp32 descales, optional bias and activation,
  `reduce_amax` before the output scale, an e4m3 (scaled), bf16, fp16 or fp32 output.
* `pointwise`: standalone pointwise graphs (binary ops with broadcasting, `relu_bwd`,
  activations, scales).
* `reduction`: standalone `reduce_sum/max/min/amax` (and, rarely, `reduce_mean`, which
  cuDNN 9.19 refuses) of bf16/fp16/fp32/fp8 tensors over several dim sets.
* `layernorm`, `rmsnorm`: inference and training phase, [rows, H, 1, 1] nhwc, [B, S, H]
  and [N, C, H, W] forms, fp32 or half gains, epsilon values, rmsnorm with and without bias.
* `layernorm_bwd`, `rmsnorm_bwd` (with and without dbias).
* `batchnorm` (training, optionally + ReLU), `batchnorm_inference`, `batchnorm_bwd`:
  2-D and 3-D, nhwc and nchw, epsilon and momentum values.
* `pool`: `max_pool`, `avg_pool` (count_include_pad both ways), 2-D and 3-D, windows,
  strides and paddings per dim; `global_avg_pool`.
* `embedding`: int32 ids (random or fixed), optional position table, dtypes.
* `sdpa_fwd`, `sdpa_bwd`: bf16/fp16, bhsd/bshd, MHA/GQA/MQA, causal, bottom-right
  alignment, sliding windows, right bounds, padding masks, additive bias, ALiBi, dropout
  (with and without the mask dump), attention sinks (and their gradient), stats,
  deterministic backward, head dims that are multiples of 8 and Dv != D.
* `sdpa_fp8_fwd`, `sdpa_fp8_bwd`: e4m3 attention with its scales (do e4m3 or e5m2).
* `sdpa_paged`: paged K/V caches (decode and chunked prefill, fixed or generated page
  tables, one table shared or two, max_seq_len_kv).
* `sdpa_decode`: one query per sequence, dense caches, ragged lengths.
* `sdpa_block_mask`: block-sparse attention (refused on Hopper by design: NotSupported).
* `dynamic`: symbolic dims (conv, matmul, sdpa, pooling with batch/sequence symbols).

Sizes are small on purpose: at most MAX_FLOPS (2e8) counted FLOPs and MAX_BYTES (64 MiB)
of tensors per graph (a draw over either is redrawn), so that a GPU sweep of hundreds of
graphs with `run --verify` finishes in minutes.

CLI: `python3 -m fusebox_tools.crosscheck.graph_gen --count N --seed S --out DIR [--families a,b]`
writes `DIR/gen_<family>_<seed>.json` for seeds S .. S+N-1.
"""
import argparse
import json
import math
import os
import random
import sys

MAX_FLOPS = 2e8
MAX_BYTES = 64 << 20

DSIZE = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8_e4m3": 1, "fp8_e5m2": 1, "int32": 4, "int64": 8, "uint8": 1}
IO = ("bf16", "fp16", "fp32")
HALF = ("bf16", "fp16")
FP8 = ("fp8_e4m3", "fp8_e5m2")
ACTS = ("relu", "gelu_tanh", "gelu_erf", "silu", "sigmoid", "tanh")
REDUCES = ("reduce_sum", "reduce_max", "reduce_min", "reduce_amax")
EPSILONS = (1e-5, 1e-5, 1e-6, 1e-3, 1e-12, 0.0, 3.7e-4)
# Odd and prime sizes beside powers of two.
SMALL = (1, 2, 3, 4, 5, 7)
SPATIAL = (3, 5, 7, 8, 9, 11, 13, 14, 16, 17, 23, 27, 31, 32)
CHANNELS = (1, 3, 4, 7, 8, 13, 16, 24, 27, 32, 48, 64)
GEMM = (1, 7, 13, 16, 27, 31, 32, 48, 64, 96, 100, 128, 129, 200, 256)


def _numel(dims):
    n = 1
    for d in dims:
        n *= d
    return n


def _span(dims, strides):
    if strides is None:
        return _numel(dims)
    return 1 + sum((d - 1) * s for d, s in zip(dims, strides))


def _pick(rng, seq):
    return seq[rng.randrange(len(seq))]


def _chance(rng, p):
    return rng.random() < p


def _pow2(x):
    """The largest power of two <= x (x > 0)."""
    return 2.0 ** math.floor(math.log2(x))


class _Graph:
    """A graph document being built, with its counted FLOPs and bytes."""

    def __init__(self, name, io="bf16", symbols=None):
        self.doc = {"name": name, "io_dtype": io, "intermediate_dtype": "fp32", "compute_dtype": "fp32"}
        self.sym = {}
        if symbols:
            self.doc["symbols"] = symbols
            for k, v in symbols.items():
                self.sym[k] = v["default"] if isinstance(v, dict) else v[1]
        self.io = io
        self.tensors = []
        self.ops = []
        self.flops = 0.0
        self.bytes = 0
        self._count = 0

    def fresh(self, stem):
        self._count += 1
        return f"{stem}{self._count}"

    def _concrete(self, dims):
        return [self.sym[d] if isinstance(d, str) else d for d in dims]

    def inp(self, name, dims, dtype=None, layout=None, strides=None, values=None):
        t = {"name": name, "dims": list(dims)}
        if dtype:
            t["dtype"] = dtype
        if layout:
            t["layout"] = layout
        if strides:
            t["strides"] = list(strides)
        if values is not None:
            t["values"] = list(values)
        self.tensors.append(t)
        self.bytes += _span(self._concrete(dims), strides) * DSIZE[dtype or self.io]
        return name

    def scalar(self, name, value):
        self.tensors.append({"name": name, "scalar": value, "dtype": "fp32"})
        return name

    def out(self, name, dims, dtype=None, layout=None, give_dims=False):
        t = {"name": name}
        if give_dims:
            t["dims"] = list(dims)
        if dtype:
            t["dtype"] = dtype
        if layout:
            t["layout"] = layout
        self.tensors.append(t)
        self.bytes += _numel(self._concrete(dims)) * DSIZE[dtype or self.io]
        return name

    def op(self, op, name, inputs, outputs, flops=0.0, **attrs):
        o = {"op": op, "name": name, "inputs": inputs, "outputs": outputs}
        o.update(attrs)
        self.ops.append(o)
        self.flops += flops
        return o

    def document(self):
        d = dict(self.doc)
        d["tensors"] = self.tensors
        d["ops"] = self.ops
        return d


# ---------------------------------------------------------------- shared pieces


def _conv_layouts(rng, rank):
    if rank == 4:
        return _pick(rng, ("nhwc", "nhwc", "nchw"))
    return _pick(rng, ("ndhwc", "ndhwc", "ncdhw"))


def _per_channel(rank, c):
    return [1, c] + [1] * (rank - 2)


def _conv_geometry(rng, spatial, max_tries=40):
    """Draws a forward convolution: x dims, w dims, padding, stride, dilation, y dims."""
    for _ in range(max_tries):
        n = _pick(rng, (1, 1, 2, 2, 3, 4))
        mode = rng.random()
        if mode < 0.65:
            groups, cpg = 1, _pick(rng, CHANNELS)
            kpg = _pick(rng, CHANNELS)
        elif mode < 0.85:
            groups = _pick(rng, (2, 3, 4, 8))
            cpg = _pick(rng, (1, 2, 3, 4, 8, 16))
            kpg = _pick(rng, (1, 2, 4, 5, 8))
        else:  # depthwise
            groups = _pick(rng, (3, 8, 13, 16, 32))
            cpg, kpg = 1, _pick(rng, (1, 1, 2))
        c, k = groups * cpg, groups * kpg
        ins = [_pick(rng, SPATIAL if spatial == 2 else (3, 4, 5, 7, 8, 9)) for _ in range(spatial)]
        filt = [_pick(rng, (1, 3, 3, 3, 5, 7) if spatial == 2 else (1, 2, 3, 3)) for _ in range(spatial)]
        if _chance(rng, 0.15) and spatial == 2:
            filt = [filt[0], _pick(rng, (1, 3, 5))]  # non-square
        pad = [rng.randint(0, max(0, f // 2 + (1 if _chance(rng, 0.2) else 0))) for f in filt]
        stride = [_pick(rng, (1, 1, 1, 2, 2, 3)) for _ in range(spatial)]
        dil = [_pick(rng, (1, 1, 1, 1, 2, 3)) for _ in range(spatial)]
        if _chance(rng, 0.6):  # mostly one value for all spatial dims, as models do
            stride = [stride[0]] * spatial
            dil = [dil[0]] * spatial
        out = []
        ok = True
        for i in range(spatial):
            num = ins[i] + 2 * pad[i] - dil[i] * (filt[i] - 1) - 1
            if num < 0:
                ok = False
                break
            out.append(num // stride[i] + 1)
        if not ok:
            continue
        return {"n": n, "c": c, "k": k, "groups": groups, "ins": ins, "filt": filt, "pad": pad,
                "stride": stride, "dil": dil, "out": out,
                "x": [n, c] + ins, "w": [k, c // groups] + filt, "y": [n, k] + out}
    ins = [8] * spatial  # a 1x1 convolution always fits
    return {"n": 1, "c": 8, "k": 8, "groups": 1, "ins": ins, "filt": [1] * spatial, "pad": [0] * spatial,
            "stride": [1] * spatial, "dil": [1] * spatial, "out": ins, "x": [1, 8] + ins, "w": [8, 8] + [1] * spatial,
            "y": [1, 8] + ins}


def _conv_flops(geo):
    return 2.0 * _numel(geo["y"]) * (geo["c"] // geo["groups"]) * _numel(geo["filt"])


def _geometry_attrs(rng, geo):
    """padding/stride/dilation attributes, leaving out defaults at random."""
    attrs = {}
    sp = len(geo["ins"])
    for key, default in (("pad", 0), ("stride", 1), ("dil", 1)):
        v = geo[key]
        name = {"pad": "padding", "stride": "stride", "dil": "dilation"}[key]
        if v != [default] * sp or _chance(rng, 0.5):
            attrs[name] = v
    return attrs


def _epilogue(g, rng, cur, ydims, layout, chan_dims, row_dims=None, n_ops=None, allow_gate=True):
    """Appends pointwise ops after `cur` (dims `ydims`); returns the last virtual tensor name.

    chan_dims: a per-channel (per-column) broadcast tensor's dims; row_dims: a per-row
    one (matmul), or None."""
    if n_ops is None:
        n_ops = _pick(rng, (0, 1, 1, 2, 2, 3, 4))
    numel = _numel(g._concrete(ydims))
    for _ in range(n_ops):
        kind = _pick(rng, ("bias", "bias", "scale", "scale_t", "residual", "act", "act", "act", "mul", "sub",
                           "gate", "rowbias"))
        if kind == "rowbias" and row_dims is None:
            kind = "bias"
        if kind == "gate" and not allow_gate:
            kind = "act"
        nxt = g.fresh("t")
        if kind in ("bias", "rowbias"):
            dims = chan_dims if kind == "bias" else row_dims
            b = g.inp(g.fresh("bias"), dims, dtype=_pick(rng, (None, None, "fp32")), layout=layout)
            g.op("bias_add", g.fresh("bias_add"), {"x": cur, "bias": b}, {"y": nxt}, flops=numel)
        elif kind == "scale":
            s = g.scalar(g.fresh("alpha"), _pick(rng, (0.5, 2.0, -1.25, 0.125, 3.0)))
            g.op("scale", g.fresh("scale"), {"x": cur, "scale": s}, {"y": nxt}, flops=numel)
        elif kind == "scale_t":
            dims = chan_dims
            dt = "fp32" if _numel(g._concrete(dims)) == 1 else _pick(rng, (None, "fp32"))
            s = g.inp(g.fresh("gain"), dims, dtype=dt, layout=layout)
            g.op("scale", g.fresh("scale"), {"x": cur, "scale": s}, {"y": nxt}, flops=numel)
        elif kind in ("residual", "mul", "sub"):
            other = g.inp(g.fresh("res" if kind == "residual" else "z"), ydims, layout=layout)
            op = {"residual": "add", "mul": "mul", "sub": "sub"}[kind]
            ins = {"a": cur, "b": other} if _chance(rng, 0.7) else {"a": other, "b": cur}
            g.op(op, g.fresh(op), ins, {"y": nxt}, flops=numel)
        elif kind == "act":
            act = _pick(rng, ACTS)
            g.op(act, g.fresh(act), {"x": cur}, {"y": nxt}, flops=numel)
        else:  # gate: sigmoid(cur) * tanh(cur)
            s, t = g.fresh("sig"), g.fresh("tanh")
            g.op("sigmoid", g.fresh("sigmoid"), {"x": cur}, {"y": s}, flops=numel)
            g.op("tanh", g.fresh("tanh"), {"x": cur}, {"y": t}, flops=numel)
            g.op("mul", g.fresh("gated"), {"a": s, "b": t}, {"y": nxt}, flops=numel)
        cur = nxt
    return cur


def _finish(g, cur, name, dims, dtype=None, layout=None):
    """Makes `cur` (a virtual op output) the declared output `name` by renaming it."""
    for o in g.ops:
        for role, t in o["outputs"].items():
            if t == cur:
                o["outputs"][role] = name
        for role, t in o["inputs"].items():
            if t == cur:
                o["inputs"][role] = name
    return g.out(name, dims, dtype=dtype, layout=layout)


# ---------------------------------------------------------------- convolutions


def gen_conv_fprop(rng, name):
    spatial = 2 if _chance(rng, 0.8) else 3
    geo = _conv_geometry(rng, spatial)
    io = _pick(rng, IO)
    g = _Graph(name, io)
    rank = spatial + 2
    lay = _conv_layouts(rng, rank)
    g.inp("x", geo["x"], layout=lay)
    g.inp("w", geo["w"], layout=lay if _chance(rng, 0.9) else None)
    g.op("conv_fprop", "conv", {"x": "x", "w": "w"}, {"y": "conv_out"}, flops=_conv_flops(geo),
         **_geometry_attrs(rng, geo))
    if _chance(rng, 0.15):  # the product as an output too, and an epilogue after it
        g.out("conv_out", geo["y"], layout=lay)
        cur = _epilogue(g, rng, "conv_out", geo["y"], lay, _per_channel(rank, geo["k"]), n_ops=rng.randint(1, 3))
    else:
        cur = _epilogue(g, rng, "conv_out", geo["y"], lay, _per_channel(rank, geo["k"]))
    out_dtype = _pick(rng, (None, None, None, "fp32")) if io != "fp32" else None
    _finish(g, cur, "y", geo["y"], dtype=out_dtype, layout=lay if _chance(rng, 0.8) else None)
    return g


def gen_conv_dgrad(rng, name):
    spatial = 2 if _chance(rng, 0.8) else 3
    geo = _conv_geometry(rng, spatial)
    g = _Graph(name, _pick(rng, IO))
    lay = _conv_layouts(rng, spatial + 2)
    g.inp("dy", geo["y"], layout=lay)
    g.inp("w", geo["w"], layout=lay)
    attrs = _geometry_attrs(rng, geo)
    fl = _conv_flops(geo)
    if _chance(rng, 0.4):
        g.op("conv_dgrad", "dgrad", {"dy": "dy", "w": "w"}, {"dx": "dx"}, flops=fl, x_dims=geo["x"], **attrs)
        g.inp("relu_in", geo["x"], layout=lay)
        g.op("relu_bwd", "drelu", {"dy": "dx", "x": "relu_in"}, {"y": "dz"}, flops=_numel(geo["x"]))
        g.out("dz", geo["x"], layout=lay)
    else:
        g.op("conv_dgrad", "dgrad", {"dy": "dy", "w": "w"}, {"dx": "dx"}, flops=fl, x_dims=geo["x"], **attrs)
        g.out("dx", geo["x"], layout=lay if _chance(rng, 0.8) else None, give_dims=_chance(rng, 0.3))
    return g


def gen_conv_wgrad(rng, name):
    spatial = 2 if _chance(rng, 0.8) else 3
    geo = _conv_geometry(rng, spatial)
    g = _Graph(name, _pick(rng, IO))
    lay = _conv_layouts(rng, spatial + 2)
    g.inp("dy", geo["y"], layout=lay)
    g.inp("x", geo["x"], layout=lay)
    g.op("conv_wgrad", "wgrad", {"dy": "dy", "x": "x"}, {"dw": "dw"}, flops=_conv_flops(geo), w_dims=geo["w"],
         **_geometry_attrs(rng, geo))
    g.out("dw", geo["w"], dtype=_pick(rng, (None, None, "fp32")), layout=lay if _chance(rng, 0.8) else None,
          give_dims=_chance(rng, 0.3))
    return g


def gen_conv_reduce(rng, name):
    geo = _conv_geometry(rng, 2)
    g = _Graph(name, _pick(rng, IO))
    lay = _pick(rng, ("nhwc", "nhwc", "nchw"))
    g.inp("x", geo["x"], layout=lay)
    g.inp("w", geo["w"], layout=lay)
    g.op("conv_fprop", "conv", {"x": "x", "w": "w"}, {"y": "conv_out"}, flops=_conv_flops(geo),
         **_geometry_attrs(rng, geo))
    cur = _epilogue(g, rng, "conv_out", geo["y"], lay, _per_channel(4, geo["k"]), n_ops=rng.randint(0, 2),
                    allow_gate=False)
    if _chance(rng, 0.6):  # the tensor reduced is an output too
        cur = _finish(g, cur, "y", geo["y"], layout=lay)
    red = _pick(rng, REDUCES)
    dims = _pick(rng, ([0, 2, 3], [0, 2, 3], None, [1], [2, 3], [0]))
    attrs = {} if dims is None else {"reduce_dims": dims}
    ydims = [1] * 4 if dims is None else [1 if i in dims else d for i, d in enumerate(geo["y"])]
    g.op(red, "reduce", {"x": cur}, {"y": "r"}, flops=_numel(geo["y"]), **attrs)
    g.out("r", ydims, dtype=_pick(rng, ("fp32", "fp32", None)))
    return g


# ---------------------------------------------------------------- matmul


def _matmul_shapes(rng, rank):
    m, k, n = _pick(rng, GEMM), _pick(rng, GEMM[1:]), _pick(rng, GEMM)
    batch_a, batch_b = [], []
    for _ in range(rank - 2):
        bsz = _pick(rng, (1, 2, 3, 4))
        r = rng.random()
        batch_a.append(bsz if r > 0.2 else 1)
        batch_b.append(bsz if r < 0.6 else 1)
    return m, k, n, batch_a, batch_b


def _matrix_layout(rng, g, name, dims, dtype=None, allow_pad=True, force=None):
    """A matrix input: row-major, col_major or with a padded leading dimension."""
    r = rng.random() if force is None else force
    if r < 0.55:
        return g.inp(name, dims, dtype=dtype)
    if r < 0.85 or not allow_pad:
        return g.inp(name, dims, dtype=dtype, layout="col_major")
    # row-major with the row stride padded to a multiple of 8 (plus 8)
    rows, cols = dims[-2], dims[-1]
    ld = (cols + 7) // 8 * 8 + 8
    strides = [0] * len(dims)
    strides[-1], strides[-2] = 1, ld
    acc = rows * ld
    for i in range(len(dims) - 3, -1, -1):
        strides[i] = acc
        acc *= dims[i]
    return g.inp(name, dims, dtype=dtype, strides=strides)


def gen_matmul(rng, name):
    rank = 3 if _chance(rng, 0.7) else 4
    m, k, n, ba, bb = _matmul_shapes(rng, rank)
    io = _pick(rng, IO)
    g = _Graph(name, io)
    _matrix_layout(rng, g, "a", ba + [m, k])
    _matrix_layout(rng, g, "b", bb + [k, n])
    batch = [max(x, y) for x, y in zip(ba, bb)]
    ydims = batch + [m, n]
    g.op("matmul", "gemm", {"a": "a", "b": "b"}, {"y": "gemm_out"}, flops=2.0 * _numel(ydims) * k)
    col = [1] * (rank - 1) + [n]
    row = [1] * (rank - 2) + [m, 1]
    cur = _epilogue(g, rng, "gemm_out", ydims, None, col, row_dims=row)
    _finish(g, cur, "y", ydims, dtype=_pick(rng, (None, None, None, "fp32")) if io != "fp32" else None)
    return g


def gen_matmul_reduce(rng, name):
    m, k, n, ba, bb = _matmul_shapes(rng, 3)
    g = _Graph(name, _pick(rng, IO))
    _matrix_layout(rng, g, "a", ba + [m, k], allow_pad=False, force=rng.random() * 0.8)
    _matrix_layout(rng, g, "b", bb + [k, n], allow_pad=False, force=rng.random() * 0.8)
    ydims = [max(ba[0], bb[0]), m, n]
    g.op("matmul", "gemm", {"a": "a", "b": "b"}, {"y": "gemm_out"}, flops=2.0 * _numel(ydims) * k)
    cur = _epilogue(g, rng, "gemm_out", ydims, None, [1, 1, n], row_dims=[1, m, 1], n_ops=rng.randint(0, 2),
                    allow_gate=False)
    if _chance(rng, 0.7):
        cur = _finish(g, cur, "y", ydims)
    red = _pick(rng, REDUCES)
    dims = _pick(rng, ([2], [2], [1], None, [0, 1], [0, 2]))
    attrs = {} if dims is None else {"reduce_dims": dims}
    rdims = [1, 1, 1] if dims is None else [1 if i in dims else d for i, d in enumerate(ydims)]
    g.op(red, "reduce", {"x": cur}, {"y": "r"}, flops=_numel(ydims), **attrs)
    g.out("r", rdims, dtype=_pick(rng, ("fp32", "fp32", "bf16")))
    return g


def gen_fp8_matmul(rng, name):
    """An FP8 GEMM with the FP8-style epilogue (docs/graph-format.md, FP8 epilogues)."""
    rank = 3
    m = _pick(rng, (16, 32, 48, 64, 96, 128, 13, 200))
    k = _pick(rng, (32, 64, 96, 128, 256, 48))
    n = _pick(rng, (16, 32, 40, 64, 80, 128))
    bsz = _pick(rng, (1, 1, 2, 3))
    ba = [bsz]
    bb = [bsz if _chance(rng, 0.5) else 1]
    g = _Graph(name, "bf16")
    da, db = _pick(rng, FP8), _pick(rng, FP8)
    if da == "fp8_e5m2" and db == "fp8_e5m2" and _chance(rng, 0.5):
        db = "fp8_e4m3"
    g.inp("a", ba + [m, k], dtype=da)
    g.inp("b", bb + [k, n], dtype=db, layout="col_major" if _chance(rng, 0.85) else None)
    sa, sb = _pick(rng, (0.125, 0.25, 0.5, 1.0)), _pick(rng, (0.25, 0.5, 1.0, 2.0))
    g.inp("descale_a", [1, 1, 1], dtype="fp32", values=[sa])
    g.inp("descale_b", [1, 1, 1], dtype="fp32", values=[sb])
    ydims = [bsz, m, n]
    numel = _numel(ydims)
    g.op("matmul", "gemm", {"a": "a", "b": "b"}, {"y": "acc"}, flops=2.0 * numel * k)
    g.op("scale", "descale_a", {"x": "acc", "scale": "descale_a"}, {"y": "acc_a"}, flops=numel)
    g.op("scale", "descale_b", {"x": "acc_a", "scale": "descale_b"}, {"y": "h"}, flops=numel)
    cur = "h"
    if _chance(rng, 0.5):
        g.inp("bias", [1, 1, n], dtype=_pick(rng, ("bf16", "fp32")))
        g.op("bias_add", "bias_add", {"x": cur, "bias": "bias"}, {"y": "hb"}, flops=numel)
        cur = "hb"
    if _chance(rng, 0.5):
        act = _pick(rng, ("relu", "gelu_tanh", "silu"))
        g.op(act, "act", {"x": cur}, {"y": "r"}, flops=numel)
        cur = "r"
    out = _pick(rng, ("fp8_e4m3", "fp8_e4m3", "bf16", "fp16", "fp32"))
    want_amax = _chance(rng, 0.7 if out == "fp8_e4m3" else 0.25)
    if want_amax:  # the amax of the value before the output scale
        g.op("reduce_amax", "amax", {"x": cur}, {"y": "amax_y"}, flops=numel)
        g.out("amax_y", [1, 1, 1], dtype="fp32")
    if out == "fp8_e4m3":
        bound = k * sa * sb + 1.0  # |inputs| <= 1: amax * scale_y stays below 448
        g.inp("scale_y", [1, 1, 1], dtype="fp32", values=[_pow2(400.0 / bound)])
        g.op("scale", "scale_y", {"x": cur, "scale": "scale_y"}, {"y": "y"}, flops=numel)
        g.out("y", ydims, dtype="fp8_e4m3")
    else:
        _finish(g, cur, "y", ydims, dtype=out)
    return g


# ---------------------------------------------------------------- pointwise and reductions


def gen_pointwise(rng, name):
    rank = _pick(rng, (3, 4, 4))
    dims = [_pick(rng, (1, 2, 3, 4))] + [_pick(rng, (3, 7, 8, 13, 16, 27, 32, 64)) for _ in range(rank - 1)]
    g = _Graph(name, _pick(rng, IO))
    lay = _pick(rng, ("nhwc", None)) if rank == 4 else None
    g.inp("x", dims, layout=lay)
    numel = _numel(dims)
    cur = "x"
    nops = rng.randint(1, 4)
    for i in range(nops):
        kind = _pick(rng, ("binary", "binary", "act", "scale", "relu_bwd", "bcast"))
        nxt = g.fresh("t")
        if kind == "binary":
            other = g.inp(g.fresh("in"), dims, layout=lay)
            op = _pick(rng, ("add", "sub", "mul"))
            g.op(op, g.fresh(op), {"a": cur, "b": other}, {"y": nxt}, flops=numel)
        elif kind == "bcast":
            bd = [d if _chance(rng, 0.4) else 1 for d in dims]
            other = g.inp(g.fresh("in"), bd)
            op = _pick(rng, ("add", "sub", "mul", "bias_add"))
            ins = {"x": cur, "bias": other} if op == "bias_add" else {"a": cur, "b": other}
            g.op(op, g.fresh(op), ins, {"y": nxt}, flops=numel)
        elif kind == "act":
            act = _pick(rng, ACTS)
            g.op(act, g.fresh(act), {"x": cur}, {"y": nxt}, flops=numel)
        elif kind == "scale":
            s = g.scalar(g.fresh("alpha"), _pick(rng, (0.5, -2.0, 1.5)))
            g.op("scale", g.fresh("scale"), {"x": cur, "scale": s}, {"y": nxt}, flops=numel)
        else:
            xin = g.inp(g.fresh("fwd_in"), dims, layout=lay)
            g.op("relu_bwd", g.fresh("relu_bwd"), {"dy": cur, "x": xin}, {"y": nxt}, flops=numel)
        cur = nxt
    _finish(g, cur, "y", dims, layout=lay)
    return g


def gen_reduction(rng, name):
    form = rng.random()
    io = _pick(rng, IO + FP8 if _chance(rng, 0.2) else IO)
    g = _Graph(name, io)
    if form < 0.8:
        dims = [_pick(rng, (1, 2, 3, 4, 8)), _pick(rng, CHANNELS), _pick(rng, SPATIAL), _pick(rng, SPATIAL)]
        lay = "nhwc" if _chance(rng, 0.8) else "nchw"
        rd = _pick(rng, ([0, 2, 3], [0, 2, 3], [1], [2, 3], [0], None, [0, 1, 2, 3], [1, 2, 3]))
    else:  # a 3-D row-major tensor (cuDNN 9.19 refuses some of these on the H200)
        dims = [_pick(rng, (1, 2, 4)), _pick(rng, GEMM[1:]), _pick(rng, GEMM[1:])]
        lay = None
        rd = _pick(rng, ([2], [1], None, [0, 1]))
    g.inp("x", dims, layout=lay)
    op = "reduce_mean" if _chance(rng, 0.1) else _pick(rng, REDUCES)
    attrs = {} if rd is None else {"reduce_dims": rd}
    ydims = [1] * len(dims) if rd is None else [1 if i in rd else d for i, d in enumerate(dims)]
    g.op(op, "reduce", {"x": "x"}, {"y": "y"}, flops=_numel(dims), **attrs)
    g.out("y", ydims, dtype=_pick(rng, (None, "fp32", "fp32", "bf16", "fp16")) if io in IO else "fp32",
          give_dims=_chance(rng, 0.3))
    return g


# ---------------------------------------------------------------- normalization


def _norm_form(rng):
    """x dims, scale dims, stats dims, x layout (and the scale's)."""
    r = rng.random()
    if r < 0.5:  # cuDNN's samples: [rows, H, 1, 1] nhwc
        rows = _pick(rng, (1, 2, 7, 16, 27, 64, 100, 128, 255, 512))
        h = _pick(rng, (8, 16, 24, 48, 64, 96, 128, 256, 384, 768, 1024, 1000))
        return [rows, h, 1, 1], [1, h, 1, 1], [rows, 1, 1, 1], "nhwc"
    if r < 0.85:  # [B, S, H]
        b, s = _pick(rng, (1, 2, 3, 4)), _pick(rng, (1, 7, 16, 33, 64, 128))
        h = _pick(rng, (8, 32, 64, 128, 256, 384, 512, 768))
        if _chance(rng, 0.8):
            return [b, s, h], [1, 1, h], [b, s, 1], None
        return [b, s, h], [1, s, h], [b, 1, 1], None
    n, c, hh, ww = _pick(rng, (2, 3, 4, 8)), _pick(rng, (4, 8, 16)), _pick(rng, (3, 4, 7, 8)), _pick(rng, (4, 8))
    return [n, c, hh, ww], [1, c, hh, ww], [n, 1, 1, 1], None


def _norm_params(rng, io):
    return _pick(rng, ("fp32", "fp32", io, "bf16" if io == "bf16" else "fp16"))


def _gen_norm_fwd(rng, name, op):
    io = _pick(rng, IO)
    g = _Graph(name, io)
    xd, sd, std, lay = _norm_form(rng)
    pdt = _norm_params(rng, io)
    g.inp("x", xd, layout=lay)
    g.inp("scale", sd, dtype=pdt, layout=lay)
    ins = {"x": "x", "scale": "scale"}
    with_bias = op == "layernorm" or _chance(rng, 0.4)
    if with_bias:
        g.inp("bias", sd, dtype=pdt, layout=lay)
        ins["bias"] = "bias"
    training = _chance(rng, 0.5)
    outs = {"y": "y"}
    g.out("y", xd, dtype=_pick(rng, (None, None, None, "fp32")), layout=lay)
    if training:
        stats = ["mean", "inv_variance"] if op == "layernorm" else ["inv_variance"]
        for s in stats:
            g.out(s, std, dtype="fp32", give_dims=_chance(rng, 0.3))
            outs[s] = s
    attrs = {}
    if _chance(rng, 0.8):
        attrs["epsilon"] = _pick(rng, EPSILONS)
    per = 8 if op == "layernorm" else (5 if with_bias else 4)
    g.op(op, "norm", ins, outs, flops=per * _numel(xd), **attrs)
    return g


def gen_layernorm(rng, name):
    return _gen_norm_fwd(rng, name, "layernorm")


def gen_rmsnorm(rng, name):
    return _gen_norm_fwd(rng, name, "rmsnorm")


def _gen_norm_bwd(rng, name, op):
    io = _pick(rng, IO)
    g = _Graph(name, io)
    xd, sd, std, lay = _norm_form(rng)
    pdt = _norm_params(rng, io)
    g.inp("dy", xd, layout=lay)
    g.inp("x", xd, layout=lay)
    g.inp("scale", sd, dtype=pdt, layout=lay)
    ins = {"dy": "dy", "x": "x", "scale": "scale"}
    if op == "layernorm_bwd":
        g.inp("mean", std, dtype="fp32")
        ins["mean"] = "mean"
    g.inp("inv_variance", std, dtype="fp32")
    ins["inv_variance"] = "inv_variance"
    outs = {"dx": "dx", "dscale": "dscale"}
    g.out("dx", xd, layout=lay)
    g.out("dscale", sd, dtype=pdt, layout=lay)
    if op == "layernorm_bwd" or _chance(rng, 0.5):
        g.out("dbias", sd, dtype=pdt, layout=lay)
        outs["dbias"] = "dbias"
    g.op(op, "norm_bwd", ins, outs, flops=(14 if op == "layernorm_bwd" else 11) * _numel(xd))
    return g


def gen_layernorm_bwd(rng, name):
    return _gen_norm_bwd(rng, name, "layernorm_bwd")


def gen_rmsnorm_bwd(rng, name):
    return _gen_norm_bwd(rng, name, "rmsnorm_bwd")


def _bn_shape(rng):
    rank = 4 if _chance(rng, 0.85) else 5
    n = _pick(rng, (1, 2, 3, 4, 8))
    c = _pick(rng, (1, 3, 8, 13, 16, 32, 64))
    sp = [_pick(rng, (1, 2, 3, 5, 7, 8, 14)) for _ in range(rank - 2)]
    if n * _numel(sp) < 2:
        sp[-1] = 2
    lay = ("nhwc" if rank == 4 else "ndhwc") if _chance(rng, 0.8) else ("nchw" if rank == 4 else "ncdhw")
    return [n, c] + sp, _per_channel(rank, c), lay


def gen_batchnorm(rng, name):
    io = _pick(rng, IO)
    g = _Graph(name, io)
    xd, cd, lay = _bn_shape(rng)
    pdt = _pick(rng, ("fp32", "fp32", "fp32", io))
    g.inp("x", xd, layout=lay)
    g.inp("scale", cd, dtype=pdt, layout=lay)
    g.inp("bias", cd, dtype=pdt, layout=lay)
    g.inp("running_mean", cd, dtype="fp32", layout=lay)
    g.inp("running_var", cd, dtype="fp32", layout=lay)
    relu = _chance(rng, 0.35)
    outs = {"y": "bn_out" if relu else "y"}
    for s in ("mean", "inv_variance", "next_running_mean", "next_running_var"):
        g.out(s, cd, dtype="fp32")
        outs[s] = s
    attrs = {}
    if _chance(rng, 0.85):
        attrs["epsilon"] = _pick(rng, EPSILONS)
    if _chance(rng, 0.85):
        attrs["momentum"] = _pick(rng, (0.1, 0.01, 0.5, 0.9, 0.0, 1.0, 0.3))
    g.op("batchnorm", "bn", {"x": "x", "scale": "scale", "bias": "bias", "running_mean": "running_mean",
                             "running_var": "running_var"}, outs, flops=8 * _numel(xd), **attrs)
    if relu:
        g.op("relu", "act", {"x": "bn_out"}, {"y": "y"}, flops=_numel(xd))
    g.out("y", xd, layout=lay)
    return g


def gen_batchnorm_inference(rng, name):
    io = _pick(rng, IO)
    g = _Graph(name, io)
    xd, cd, lay = _bn_shape(rng)
    pdt = _pick(rng, ("fp32", "fp32", io))
    g.inp("x", xd, layout=lay)
    g.inp("scale", cd, dtype=pdt, layout=lay)
    g.inp("bias", cd, dtype=pdt, layout=lay)
    g.inp("mean", cd, dtype="fp32", layout=lay)
    g.inp("inv_variance", cd, dtype="fp32", layout=lay)
    g.op("batchnorm_inference", "bn", {"x": "x", "scale": "scale", "bias": "bias", "mean": "mean",
                                       "inv_variance": "inv_variance"}, {"y": "y"}, flops=4 * _numel(xd))
    g.out("y", xd, dtype=_pick(rng, (None, None, "fp32")), layout=lay)
    return g


def gen_batchnorm_bwd(rng, name):
    io = _pick(rng, IO)
    g = _Graph(name, io)
    xd, cd, lay = _bn_shape(rng)
    pdt = _pick(rng, ("fp32", "fp32", io))
    g.inp("dy", xd, layout=lay)
    g.inp("x", xd, layout=lay)
    g.inp("scale", cd, dtype=pdt, layout=lay)
    g.inp("mean", cd, dtype="fp32", layout=lay)
    g.inp("inv_variance", cd, dtype="fp32", layout=lay)
    g.out("dx", xd, layout=lay)
    g.out("dscale", cd, dtype=pdt)
    g.out("dbias", cd, dtype=pdt)
    g.op("batchnorm_bwd", "dbn", {"dy": "dy", "x": "x", "scale": "scale", "mean": "mean",
                                  "inv_variance": "inv_variance"},
         {"dx": "dx", "dscale": "dscale", "dbias": "dbias"}, flops=10 * _numel(xd))
    return g


# ---------------------------------------------------------------- pooling, embedding


def gen_pool(rng, name):
    spatial = 2 if _chance(rng, 0.8) else 3
    io = _pick(rng, IO)
    g = _Graph(name, io)
    n, c = _pick(rng, (1, 2, 3, 4)), _pick(rng, CHANNELS)
    ins = [_pick(rng, SPATIAL if spatial == 2 else (3, 4, 5, 7, 9)) for _ in range(spatial)]
    op = _pick(rng, ("max_pool", "avg_pool"))
    window, pad, stride = [], [], []
    for i in range(spatial):
        w = rng.randint(1, min(5, ins[i] + 2))
        p = rng.randint(0, w - 1) if _chance(rng, 0.5) else 0
        while w > ins[i] + 2 * p:  # the window must fit in the padded input
            w -= 1
        p = min(p, w - 1)
        window.append(w)
        pad.append(p)
        stride.append(rng.randint(1, 3))
    attrs = {"window": window}
    if _chance(rng, 0.8):
        attrs["stride"] = stride
    else:
        stride = window
    if any(pad) or _chance(rng, 0.3):
        attrs["padding"] = pad
    if op == "avg_pool" and _chance(rng, 0.6):
        attrs["count_include_pad"] = _chance(rng, 0.5)
    out = [(ins[i] + 2 * pad[i] - window[i]) // stride[i] + 1 for i in range(spatial)]
    lay = _conv_layouts(rng, spatial + 2)
    g.inp("x", [n, c] + ins, layout=lay)
    g.op(op, "pool", {"x": "x"}, {"y": "y"}, flops=_numel([n, c] + out) * _numel(window), **attrs)
    g.out("y", [n, c] + out, dtype=_pick(rng, (None, None, "fp32")), layout=lay)
    return g


def gen_global_avg_pool(rng, name):
    spatial = 2 if _chance(rng, 0.8) else 3
    g = _Graph(name, _pick(rng, IO))
    n, c = _pick(rng, (1, 2, 4, 8)), _pick(rng, CHANNELS + (128, 256))
    ins = [_pick(rng, (1, 3, 7, 8, 13, 14)) for _ in range(spatial)]
    lay = _conv_layouts(rng, spatial + 2)
    g.inp("x", [n, c] + ins, layout=lay)
    ydims = [n, c] + [1] * spatial
    g.op("global_avg_pool", "gap", {"x": "x"}, {"y": "y"}, flops=_numel([n, c] + ins))
    g.out("y", ydims, layout=lay)
    return g


def gen_embedding(rng, name):
    io = _pick(rng, IO)
    g = _Graph(name, io)
    n = _pick(rng, (1, 7, 12, 32, 100, 128, 257))
    v = _pick(rng, (2, 13, 50, 1000, 4099))
    h = _pick(rng, (1, 8, 13, 64, 100, 384))
    values = [rng.randrange(v) for _ in range(n)] if _chance(rng, 0.4) else None
    g.inp("ids", [n, 1, 1, 1], dtype="int32", values=values)
    g.inp("table", [v, h, 1, 1], dtype=_pick(rng, (None, None) + IO), layout=_pick(rng, ("nhwc", None)))
    ins = {"ids": "ids", "table": "table"}
    if _chance(rng, 0.5):
        divisors = [p for p in range(1, n + 1) if n % p == 0]
        p = _pick(rng, divisors)
        g.inp("pos", [p, h, 1, 1], dtype=_pick(rng, (None, None) + IO), layout=_pick(rng, ("nhwc", None)))
        ins["add"] = "pos"
    g.op("embedding", "embed", ins, {"y": "y"}, flops=n * h)
    g.out("y", [n, h, 1, 1], dtype=_pick(rng, (None, None) + IO), layout=_pick(rng, ("nhwc", None)))
    return g


# ---------------------------------------------------------------- attention

SEQ = (16, 31, 37, 64, 96, 100, 128, 129, 160, 200, 256)
HEAD = (64, 64, 128, 128, 32, 96, 40, 72, 256, 16)


def _heads(rng):
    hk = _pick(rng, (1, 2, 2, 4))
    return hk * _pick(rng, (1, 1, 2, 3, 4)), hk


def _bhsd(rng, g, name, dims, dtype=None, layout="bhsd", values=None):
    return g.inp(name, dims, dtype=dtype, layout=layout if layout != "bhsd" or _chance(rng, 0.5) else None,
                 values=values)


def _lengths(rng, b, s, lo=1):
    return [rng.randint(max(1, lo), s) if _chance(rng, 0.7) else s for _ in range(b)]


def _sdpa_options(rng, g, ins, outs, b, hq, sq, skv, dt, fwd=True, fp8=False):
    """Masks and score modifiers (docs/graph-format.md); adds their inputs and outputs."""
    attrs = {}
    if _chance(rng, 0.5):
        attrs["attn_scale"] = _pick(rng, (0.125, 0.088, 0.25, 1.0, 0.05))
    causal = _chance(rng, 0.55)
    bottom_right = (not fp8) and skv >= sq and _chance(rng, 0.2)
    padding = _chance(rng, 0.3)
    bias = (not fp8) and not bottom_right and _chance(rng, 0.2)
    alibi = (not fp8) and causal and not bottom_right and _chance(rng, 0.12)
    dropout = (not fp8) and not bottom_right and _chance(rng, 0.12)
    sink = (not fp8 or fwd) and sq > 1 and _chance(rng, 0.1)
    if fp8 and sink and not fwd:
        sink = False
    if causal:
        attrs["causal"] = True
    elif _chance(rng, 0.12):
        attrs["right_bound"] = rng.randint(0, 64)
    if bottom_right:
        attrs["alignment"] = "bottom_right"
    elif _chance(rng, 0.1):
        attrs["alignment"] = "top_left"
    if (causal or "right_bound" in attrs) and _chance(rng, 0.2):
        attrs["left_bound"] = rng.randint(1, max(1, skv // 2))
    if alibi:
        attrs["alibi"] = True
    if padding:
        vq = _lengths(rng, b, sq)
        # bottom-right: every sequence has at least as many keys as queries (each row keeps a key)
        vkv = [rng.randint(q, skv) if bottom_right else rng.randint(1, skv) for q in vq]
        give = bottom_right or _chance(rng, 0.6)
        g.inp("seq_len_q", [b, 1, 1, 1], dtype="int32", values=vq if give else None)
        g.inp("seq_len_kv", [b, 1, 1, 1], dtype="int32", values=vkv if give else None)
        ins["seq_len_q"], ins["seq_len_kv"] = "seq_len_q", "seq_len_kv"
    if bias:
        bd = [_pick(rng, (1, b)), _pick(rng, (1, hq)), sq, skv]
        g.inp("bias", bd, dtype=_pick(rng, (None, "fp32", dt)))
        ins["bias"] = "bias"
    if dropout:
        attrs["dropout"] = _pick(rng, (0.1, 0.2, 0.5, 0.0))
        g.inp("seed", [1, 1, 1, 1], dtype="int64", values=[rng.randint(0, 99999)] if _chance(rng, 0.6) else None)
        g.inp("offset", [1, 1, 1, 1], dtype="int64", values=[rng.randint(0, 99)] if _chance(rng, 0.6) else None)
        ins["seed"], ins["offset"] = "seed", "offset"
        if _chance(rng, 0.6):
            g.out("dropout_mask", [b, hq, sq, skv], dtype="fp32")
            outs["dropout_mask"] = "dropout_mask"
    if sink:
        g.inp("sink", [1, hq, 1, 1], dtype="fp32",
              values=[round(rng.uniform(-2, 4), 2) for _ in range(hq)] if _chance(rng, 0.6) else None)
        ins["sink_token"] = "sink"
    return attrs, sink


def _sdpa_dims(rng):
    b = _pick(rng, (1, 1, 2, 3))
    hq, hk = _heads(rng)
    sq, skv = _pick(rng, SEQ), _pick(rng, SEQ) if _chance(rng, 0.5) else None
    if skv is None:
        skv = sq
    d = _pick(rng, HEAD)
    dv = d if _chance(rng, 0.85) else _pick(rng, (32, 64, 128))
    return b, hq, hk, sq, skv, d, dv


def _sdpa_flops(b, hq, sq, skv, d, dv):
    return 2.0 * b * hq * sq * skv * (d + dv)


def gen_sdpa_fwd(rng, name):
    dt = _pick(rng, HALF)
    g = _Graph(name, dt)
    b, hq, hk, sq, skv, d, dv = _sdpa_dims(rng)
    lq = _pick(rng, ("bhsd", "bshd"))
    lk = lq if _chance(rng, 0.8) else _pick(rng, ("bhsd", "bshd"))
    _bhsd(rng, g, "q", [b, hq, sq, d], layout=lq)
    _bhsd(rng, g, "k", [b, hk, skv, d], layout=lk)
    _bhsd(rng, g, "v", [b, hk, skv, dv], layout=lk)
    ins, outs = {"q": "q", "k": "k", "v": "v"}, {"o": "o"}
    attrs, _ = _sdpa_options(rng, g, ins, outs, b, hq, sq, skv, dt)
    g.out("o", [b, hq, sq, dv], layout=lq if _chance(rng, 0.8) else None)
    if _chance(rng, 0.5):
        g.out("stats", [b, hq, sq, 1], dtype="fp32")
        outs["stats"] = "stats"
    g.op("sdpa_fwd", "attn", ins, outs, flops=_sdpa_flops(b, hq, sq, skv, d, dv), **attrs)
    return g


def gen_sdpa_bwd(rng, name):
    dt = _pick(rng, HALF)
    g = _Graph(name, dt)
    b, hq, hk, sq, skv, d, dv = _sdpa_dims(rng)
    lq = _pick(rng, ("bhsd", "bshd"))
    lk = lq if _chance(rng, 0.8) else _pick(rng, ("bhsd", "bshd"))
    _bhsd(rng, g, "q", [b, hq, sq, d], layout=lq)
    _bhsd(rng, g, "k", [b, hk, skv, d], layout=lk)
    _bhsd(rng, g, "v", [b, hk, skv, dv], layout=lk)
    _bhsd(rng, g, "o", [b, hq, sq, dv], layout=lq)
    _bhsd(rng, g, "do", [b, hq, sq, dv], layout=lq)
    g.inp("stats", [b, hq, sq, 1], dtype="fp32")
    ins = {"q": "q", "k": "k", "v": "v", "o": "o", "do": "do", "stats": "stats"}
    outs = {"dq": "dq", "dk": "dk", "dv": "dv"}
    attrs, sink = _sdpa_options(rng, g, ins, outs, b, hq, sq, skv, dt, fwd=False)
    g.out("dq", [b, hq, sq, d], layout=lq if _chance(rng, 0.8) else None)
    g.out("dk", [b, hk, skv, d], layout=lk if _chance(rng, 0.8) else None)
    g.out("dv", [b, hk, skv, dv], layout=lk if _chance(rng, 0.8) else None)
    if sink and _chance(rng, 0.7):
        g.out("dsink", [1, hq, 1, 1], dtype="fp32")
        outs["dsink_token"] = "dsink"
    if _chance(rng, 0.3):
        attrs["deterministic"] = True
    g.op("sdpa_bwd", "attn_bwd", ins, outs, flops=2.5 * _sdpa_flops(b, hq, sq, skv, d, dv), **attrs)
    return g


def _fp8_scales(g, names_values):
    for n, v in names_values:
        g.inp(n, [1, 1, 1, 1], dtype="fp32", values=None if v is None else [v])


def gen_sdpa_fp8_fwd(rng, name):
    g = _Graph(name, "fp8_e4m3")
    b = _pick(rng, (1, 2, 3))
    hq, hk = _heads(rng)
    sq = _pick(rng, (16, 64, 100, 128, 129, 256))
    skv = sq if _chance(rng, 0.6) else _pick(rng, (64, 128, 200, 256))
    d = _pick(rng, (64, 128, 128, 32, 96))
    lay = _pick(rng, ("bhsd", "bshd"))
    for n, dims in (("q", [b, hq, sq, d]), ("k", [b, hk, skv, d]), ("v", [b, hk, skv, d])):
        _bhsd(rng, g, n, dims, layout=lay)
    given = _chance(rng, 0.7)
    _fp8_scales(g, [("descale_q", 1.0 if given else None), ("descale_k", 1.0 if given else None),
                    ("descale_v", 1.0 if given else None), ("descale_s", 1.0 / 448 if given else None),
                    ("scale_s", 448.0 if given else None), ("scale_o", _pick(rng, (1.0, 4.0, 16.0)) if given else None)])
    ins = {"q": "q", "k": "k", "v": "v"}
    for s in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o"):
        ins[s] = s
    outs = {"o": "o", "amax_s": "amax_s", "amax_o": "amax_o"}
    attrs, _ = _sdpa_options(rng, g, ins, outs, b, hq, sq, skv, "fp8_e4m3", fwd=True, fp8=True)
    g.out("o", [b, hq, sq, d], layout=lay)
    g.out("amax_s", [1, 1, 1, 1], dtype="fp32")
    g.out("amax_o", [1, 1, 1, 1], dtype="fp32")
    if _chance(rng, 0.5):
        g.out("stats", [b, hq, sq, 1], dtype="fp32")
        outs["stats"] = "stats"
    g.op("sdpa_fp8_fwd", "attn", ins, outs, flops=_sdpa_flops(b, hq, sq, skv, d, d), **attrs)
    return g


def gen_sdpa_fp8_bwd(rng, name):
    g = _Graph(name, "fp8_e4m3")
    b = _pick(rng, (1, 2))
    hq, hk = _heads(rng)
    sq = _pick(rng, (64, 128, 128, 256, 100))
    skv = sq if _chance(rng, 0.7) else _pick(rng, (64, 128, 256))
    d = _pick(rng, (64, 128, 128))
    lay = _pick(rng, ("bhsd", "bshd"))
    for n, dims in (("q", [b, hq, sq, d]), ("k", [b, hk, skv, d]), ("v", [b, hk, skv, d]), ("o", [b, hq, sq, d])):
        _bhsd(rng, g, n, dims, layout=lay)
    _bhsd(rng, g, "do", [b, hq, sq, d], dtype=_pick(rng, (None, "fp8_e4m3", "fp8_e5m2")), layout=lay)
    g.inp("stats", [b, hq, sq, 1], dtype="fp32")
    given = _chance(rng, 0.8)
    scales = [("descale_q", 1.0), ("descale_k", 1.0), ("descale_v", 1.0), ("descale_o", 0.0625),
              ("descale_do", 1.0), ("descale_s", 1.0 / 448), ("descale_dp", 1.0 / 1024), ("scale_s", 448.0),
              ("scale_dq", 256.0), ("scale_dk", 256.0), ("scale_dv", 64.0), ("scale_dp", 1024.0)]
    _fp8_scales(g, [(n, v if given else None) for n, v in scales])
    ins = {"q": "q", "k": "k", "v": "v", "o": "o", "do": "do", "stats": "stats"}
    for n, _ in scales:
        ins[n] = n
    outs = {"dq": "dq", "dk": "dk", "dv": "dv", "amax_dq": "amax_dq", "amax_dk": "amax_dk", "amax_dv": "amax_dv",
            "amax_dp": "amax_dp"}
    attrs, _ = _sdpa_options(rng, g, ins, outs, b, hq, sq, skv, "fp8_e4m3", fwd=False, fp8=True)
    for n, dims in (("dq", [b, hq, sq, d]), ("dk", [b, hk, skv, d]), ("dv", [b, hk, skv, d])):
        g.out(n, dims, layout=lay)
    for n in ("amax_dq", "amax_dk", "amax_dv", "amax_dp"):
        g.out(n, [1, 1, 1, 1], dtype="fp32")
    g.op("sdpa_fp8_bwd", "attn_bwd", ins, outs, flops=2.5 * _sdpa_flops(b, hq, sq, skv, d, d), **attrs)
    return g


def gen_sdpa_paged(rng, name):
    fp8 = _chance(rng, 0.1)
    dt = "fp8_e4m3" if fp8 else _pick(rng, HALF)
    g = _Graph(name, dt)
    b = _pick(rng, (1, 2, 3, 4))
    hq, hk = _heads(rng)
    d = _pick(rng, (64, 128, 64) if fp8 else (64, 128, 64, 32, 96))
    page = _pick(rng, (16, 16, 32, 64))
    decode = _chance(rng, 0.5)
    sq = 1 if decode else _pick(rng, (16, 32, 37, 64))
    max_pages = rng.randint(max(1, -(-(sq + page) // page)), 8)  # room for every query's keys
    num_pages = max(1, b * max_pages + rng.randint(-max_pages, 4))
    num_pages_v = num_pages if _chance(rng, 0.8) else max(1, num_pages + rng.randint(-2, 4))
    cap = max_pages * page
    skv = cap if _chance(rng, 0.5) else rng.randint(cap - page + 1, cap)
    lay = _pick(rng, ("bhsd", "bshd"))
    _bhsd(rng, g, "q", [b, hq, sq, d], layout=lay)
    g.inp("k_cache", [num_pages, hk, page, d])
    g.inp("v_cache", [num_pages_v, hk, page, d])
    vq = [1] * b if decode else _lengths(rng, b, sq)
    vkv = [rng.randint(q, skv) for q in vq]
    g.inp("seq_len_q", [b, 1, 1, 1], dtype="int32", values=vq)
    g.inp("seq_len_kv", [b, 1, 1, 1], dtype="int32", values=vkv)
    shared = num_pages == num_pages_v and _chance(rng, 0.4)
    tables = ["page_table"] if shared else ["page_table_k", "page_table_v"]
    for t, pool in zip(tables, (num_pages, num_pages_v)):
        pool = min(num_pages, num_pages_v) if shared else pool
        vals = None
        if _chance(rng, 0.4):
            vals = [rng.randrange(pool) for _ in range(b * max_pages)]
        g.inp(t, [b, 1, max_pages, 1], dtype="int32", values=vals)
    ins = {"q": "q", "k": "k_cache", "v": "v_cache", "seq_len_q": "seq_len_q", "seq_len_kv": "seq_len_kv",
           "page_table_k": tables[0], "page_table_v": tables[-1]}
    attrs = {}
    if not fp8:  # FP8 bottom-right alignment is Blackwell-only
        attrs["alignment"] = "bottom_right"
        if _chance(rng, 0.8):
            attrs["causal"] = True
    if skv != cap or _chance(rng, 0.3):
        attrs["max_seq_len_kv"] = skv
    if _chance(rng, 0.4):
        attrs["attn_scale"] = 1.0 / math.sqrt(d)
    outs = {"o": "o"}
    g.out("o", [b, hq, sq, d], layout=lay)
    if fp8:
        _fp8_scales(g, [("descale_q", 1.0), ("descale_k", 1.0), ("descale_v", 1.0), ("descale_s", 1.0 / 448),
                        ("scale_s", 448.0), ("scale_o", 16.0)])
        for s in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o"):
            ins[s] = s
        g.out("amax_s", [1, 1, 1, 1], dtype="fp32")
        g.out("amax_o", [1, 1, 1, 1], dtype="fp32")
        outs.update({"amax_s": "amax_s", "amax_o": "amax_o"})
    if _chance(rng, 0.5):
        g.out("stats", [b, hq, sq, 1], dtype="fp32")
        outs["stats"] = "stats"
    g.op("sdpa_fp8_fwd" if fp8 else "sdpa_fwd", "attn", ins, outs, flops=_sdpa_flops(b, hq, sq, skv, d, d),
         **attrs)
    return g


def gen_sdpa_decode(rng, name):
    dt = _pick(rng, HALF)
    g = _Graph(name, dt)
    b = _pick(rng, (1, 2, 4, 8, 5))
    hq, hk = _heads(rng)
    skv = _pick(rng, (16, 100, 128, 256, 333, 512, 1024))
    d = _pick(rng, (64, 128, 128, 32))
    lay = _pick(rng, ("bhsd", "bshd"))
    _bhsd(rng, g, "q", [b, hq, 1, d], layout=lay)
    _bhsd(rng, g, "k", [b, hk, skv, d], layout=lay)
    _bhsd(rng, g, "v", [b, hk, skv, d], layout=lay)
    ins = {"q": "q", "k": "k", "v": "v"}
    attrs = {}
    if _chance(rng, 0.6):
        g.inp("seq_len_q", [b, 1, 1, 1], dtype="int32", values=[1] * b if _chance(rng, 0.7) else None)
        g.inp("seq_len_kv", [b, 1, 1, 1], dtype="int32", values=[rng.randint(1, skv) for _ in range(b)])
        ins["seq_len_q"], ins["seq_len_kv"] = "seq_len_q", "seq_len_kv"
    if _chance(rng, 0.6):
        attrs["causal"] = True
        attrs["alignment"] = "bottom_right"
        if _chance(rng, 0.3):
            attrs["left_bound"] = rng.randint(1, skv)
    if _chance(rng, 0.5):
        attrs["attn_scale"] = 1.0 / math.sqrt(d)
    outs = {"o": "o"}
    g.out("o", [b, hq, 1, d], layout=lay)
    if _chance(rng, 0.4):
        g.out("stats", [b, hq, 1, 1], dtype="fp32")
        outs["stats"] = "stats"
    g.op("sdpa_fwd", "attn", ins, outs, flops=_sdpa_flops(b, hq, 1, skv, d, d), **attrs)
    return g


def gen_sdpa_block_mask(rng, name):
    dt = _pick(rng, HALF)
    g = _Graph(name, dt)
    b = _pick(rng, (1, 2))
    hq, hk = _heads(rng)
    sq, skv = _pick(rng, (128, 200, 256)), _pick(rng, (128, 256, 384, 129))
    d = _pick(rng, (32, 64))
    lay = _pick(rng, ("bhsd", "bshd"))
    _bhsd(rng, g, "q", [b, hq, sq, d], layout=lay)
    _bhsd(rng, g, "k", [b, hk, skv, d], layout=lay)
    _bhsd(rng, g, "v", [b, hk, skv, d], layout=lay)
    md = [b, hq, -(-sq // 128), -(-(-(-skv // 128)) // 8)]
    vals = [rng.randint(1, 255) for _ in range(_numel(md))] if _chance(rng, 0.5) else None
    g.inp("blocks", md, dtype="uint8", values=vals)
    ins = {"q": "q", "k": "k", "v": "v", "block_mask": "blocks"}
    attrs = {"causal": True} if _chance(rng, 0.3) else {}
    outs = {"o": "o"}
    g.out("o", [b, hq, sq, d], layout=lay)
    if _chance(rng, 0.5):
        g.out("stats", [b, hq, sq, 1], dtype="fp32")
        outs["stats"] = "stats"
    g.op("sdpa_fwd", "attn", ins, outs, flops=_sdpa_flops(b, hq, sq, skv, d, d), **attrs)
    return g


# ---------------------------------------------------------------- symbolic dims


def _symbol(rng, lo, hi, default):
    if _chance(rng, 0.5):
        return {"min": lo, "max": hi, "default": default}
    return [lo, default]  # the default is max


def gen_dynamic(rng, name):
    kind = _pick(rng, ("conv", "matmul", "sdpa", "pool"))
    if kind == "conv":
        nd = _pick(rng, (1, 2, 3))
        g = _Graph(name, _pick(rng, HALF), symbols={"N": _symbol(rng, 1, 8, nd)})
        c, k = _pick(rng, (8, 16, 13)), _pick(rng, (8, 16, 32))
        hw = _pick(rng, (7, 10, 16))
        f = _pick(rng, (1, 3))
        stride = _pick(rng, (1, 2))
        out = (hw + 2 * (f // 2) - f) // stride + 1
        g.inp("x", ["N", c, hw, hw], layout="nhwc")
        g.inp("w", [k, c, f, f], layout="nhwc")
        g.op("conv_fprop", "conv", {"x": "x", "w": "w"}, {"y": "conv_out"}, flops=2.0 * nd * k * out * out * c * f * f,
             padding=[f // 2] * 2, stride=[stride] * 2)
        cur = _epilogue(g, rng, "conv_out", ["N", k, out, out], "nhwc", [1, k, 1, 1], n_ops=rng.randint(0, 2),
                        allow_gate=False)
        _finish(g, cur, "y", ["N", k, out, out], layout="nhwc")
        return g
    if kind == "matmul":
        bd, md = _pick(rng, (1, 2, 3)), _pick(rng, (16, 64, 100))
        g = _Graph(name, _pick(rng, IO), symbols={"B": _symbol(rng, 1, 8, bd), "M": _symbol(rng, 16, 256, md)})
        kk, n = _pick(rng, (32, 64, 96)), _pick(rng, (16, 48, 64))
        g.inp("a", ["B", "M", kk])
        g.inp("w", [1, kk, n], layout=_pick(rng, (None, "col_major")))
        g.op("matmul", "gemm", {"a": "a", "b": "w"}, {"y": "gemm_out"}, flops=2.0 * bd * md * n * kk)
        cur = _epilogue(g, rng, "gemm_out", ["B", "M", n], None, [1, 1, n], n_ops=rng.randint(0, 2),
                        allow_gate=False)
        _finish(g, cur, "y", ["B", "M", n])
        return g
    if kind == "sdpa":
        bd, sd = _pick(rng, (1, 2)), _pick(rng, (16, 64, 100, 128))
        g = _Graph(name, _pick(rng, HALF), symbols={"B": _symbol(rng, 1, 4, bd), "S": _symbol(rng, 16, 256, sd)})
        hq, hk = _heads(rng)
        d = _pick(rng, (64, 128))
        lay = _pick(rng, ("bhsd", "bshd"))
        g.inp("q", ["B", hq, "S", d], layout=lay)
        g.inp("k", ["B", hk, "S", d], layout=lay)
        g.inp("v", ["B", hk, "S", d], layout=lay)
        g.out("o", ["B", hq, "S", d], layout=lay)
        attrs = {"causal": True} if _chance(rng, 0.6) else {}
        g.op("sdpa_fwd", "attn", {"q": "q", "k": "k", "v": "v"}, {"o": "o"},
             flops=_sdpa_flops(bd, hq, sd, sd, d, d), **attrs)
        return g
    nd = _pick(rng, (1, 2, 4))
    g = _Graph(name, _pick(rng, IO), symbols={"N": _symbol(rng, 1, 16, nd)})
    c, hw = _pick(rng, (8, 16, 13)), _pick(rng, (7, 9, 14))
    g.inp("x", ["N", c, hw, hw], layout="nhwc")
    out = (hw + 2 - 3) // 2 + 1
    g.op("max_pool", "pool", {"x": "x"}, {"y": "y"}, flops=nd * c * out * out * 9, window=[3, 3], stride=[2, 2],
         padding=[1, 1])
    g.out("y", ["N", c, out, out], layout="nhwc")
    return g


FAMILIES = {
    "conv_fprop": gen_conv_fprop,
    "conv_dgrad": gen_conv_dgrad,
    "conv_wgrad": gen_conv_wgrad,
    "conv_reduce": gen_conv_reduce,
    "matmul": gen_matmul,
    "matmul_reduce": gen_matmul_reduce,
    "fp8_matmul": gen_fp8_matmul,
    "pointwise": gen_pointwise,
    "reduction": gen_reduction,
    "layernorm": gen_layernorm,
    "rmsnorm": gen_rmsnorm,
    "layernorm_bwd": gen_layernorm_bwd,
    "rmsnorm_bwd": gen_rmsnorm_bwd,
    "batchnorm": gen_batchnorm,
    "batchnorm_inference": gen_batchnorm_inference,
    "batchnorm_bwd": gen_batchnorm_bwd,
    "pool": gen_pool,
    "global_avg_pool": gen_global_avg_pool,
    "embedding": gen_embedding,
    "sdpa_fwd": gen_sdpa_fwd,
    "sdpa_bwd": gen_sdpa_bwd,
    "sdpa_fp8_fwd": gen_sdpa_fp8_fwd,
    "sdpa_fp8_bwd": gen_sdpa_fp8_bwd,
    "sdpa_paged": gen_sdpa_paged,
    "sdpa_decode": gen_sdpa_decode,
    "sdpa_block_mask": gen_sdpa_block_mask,
    "dynamic": gen_dynamic,
}
FAMILY_NAMES = tuple(FAMILIES)


def family_of(seed, families=None):
    """The family that `seed` picks: round robin over `families` (default: all, in FAMILIES order)."""
    fams = tuple(families) if families else FAMILY_NAMES
    return fams[seed % len(fams)]


def _build(seed, families=None):
    family = family_of(seed, families)
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}: known are {', '.join(FAMILY_NAMES)}")
    rng = random.Random(f"fusebox-graph-gen:{seed}")
    name = f"gen_{family}_{seed}"
    for _ in range(200):
        g = FAMILIES[family](rng, name)
        if g is not None and g.flops <= MAX_FLOPS and g.bytes <= MAX_BYTES:
            return family, g
    raise RuntimeError(f"{name}: no draw within {MAX_FLOPS:g} FLOPs and {MAX_BYTES} bytes")


def generate(seed, families=None):
    """One graph document (a dict), chosen deterministically from `seed` (and the family list)."""
    return _build(seed, families)[1].document()


def estimate(seed, families=None):
    """(family, counted FLOPs, bytes of non-virtual tensors) of generate(seed)'s graph, as drawn."""
    family, g = _build(seed, families)
    return family, g.flops, g.bytes


def write(doc, path):
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m fusebox_tools.crosscheck.graph_gen", description=__doc__.split("\n")[0])
    p.add_argument("--count", type=int, default=len(FAMILIES), help="number of graphs (default: one per family)")
    p.add_argument("--seed", type=int, default=0, help="first seed; graphs use seeds SEED .. SEED+COUNT-1")
    p.add_argument("--out", required=True, help="folder for gen_<family>_<seed>.json (created)")
    p.add_argument("--families", default="", help="comma-separated families (default all): " + ",".join(FAMILY_NAMES))
    p.add_argument("--list", action="store_true", help="print the family names and exit")
    a = p.parse_args(argv)
    if a.list:
        print("\n".join(FAMILY_NAMES))
        return 0
    fams = [f.strip() for f in a.families.split(",") if f.strip()]
    unknown = [f for f in fams if f not in FAMILIES]
    if unknown:
        p.error(f"unknown families {', '.join(unknown)}: known are {', '.join(FAMILY_NAMES)}")
    if a.count < 0:
        p.error("--count must be >= 0")
    os.makedirs(a.out, exist_ok=True)
    for seed in range(a.seed, a.seed + a.count):
        family, g = _build(seed, fams or None)
        write(g.document(), os.path.join(a.out, f"gen_{family}_{seed}.json"))
    print(f"wrote {a.count} graphs to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
