"""ResNet-50 inference (torchvision's architecture) as a fusebox pipeline,
bf16 NHWC (docs/models.md).

`write_resnet50(out_dir, batch=8, seed=50)` writes into `out_dir`:

* `resnet50.json`: the pipeline, one stage per torchvision module that does
  work: `conv1` (the stem 7x7/2 with bn1 and relu), `maxpool` (3x3/2 pad 1),
  `layerL.B.conv1`, `.conv2`, `.conv3` and `.downsample` for each bottleneck,
  `avgpool` (global average pool), `fc`: 53 convolutions + 2 pools + fc.
  The average pool is by default one GEMM, `ones [1, 1, H*W] @ x [N, H*W, C]`
  times 1/(H*W), on the NHWC activation's memory read as rows of C
  (`gap="matmul"`, reshape buffers): cuDNN 9.19's resample engine took
  206 us for it at batch 32 on the H200, the GEMM 6.6 us. `gap="pool"` keeps
  the `global_avg_pool` op.
* `graphs/*.json`: one graph per distinct layer shape (stages share them):
  conv+bias+relu for conv1/conv2 of a bottleneck and the stem, conv+bias+
  residual add+relu for conv3, conv+bias for the downsample branch, the pools,
  and the fc as a 1x1 conv+bias on the pooled [N, 2048, 1, 1] (the same GEMM
  as a matmul; the conv engines are precompiled, so the fc builds deviceless).
* `weights/*.npy`: each conv's weights and bias with its batch norm folded in,
  w' = w * gamma / sqrt(var + eps), b' = beta - mean * gamma / sqrt(var + eps)
  (float32; fusebox rounds them to bf16).
* `resnet50_state_dict.npz`: the unfolded weights in torchvision's
  state_dict names and shapes (conv1.weight, bn1.running_var, ...,
  fc.bias), what `torchvision.models.resnet50().load_state_dict()` takes
  (resnet50_check does that on the GPU).

The weights are seeded random: He-normal convolutions; batch-norm statistics
calibrated by a float32 numpy forward pass on random images (the running
mean and variance are those the layer sees, as after training), gamma near 1
(bn3, closing each residual branch, 0.15 to 0.35: see BN3_GAMMA), beta
small, so activations stay O(1) through the 50 layers; the fc is scaled
so that the logits have a spread of a few units.

numpy only. `PYTHONPATH=python python3 -m fusebox_tools.models.make_resnet50_pipeline --help`.
"""
import json
import os

import numpy as np

BLOCKS = (3, 4, 6, 3)          # bottlenecks per layer (ResNet-50)
WIDTHS = (64, 128, 256, 512)   # bottleneck widths; outputs are 4x
EXPANSION = 4
NUM_CLASSES = 1000
IMAGE = 224
BN_EPS = 1e-5
PIPELINE_FILE = "resnet50.json"
STATE_DICT_FILE = "resnet50_state_dict.npz"
MARKER_FILE = ".fusebox-resnet50"
# bn3's gamma (the residual branch's last batch norm), as in trained ResNets
# (and torchvision's zero_init_residual, in the limit): each bottleneck stays
# close to the identity, so a rounding error is not amplified block after
# block. With gamma near 1 everywhere, random weights make the network
# chaotic: bf16 rounding grows about 10% per layer, to 40% of the features
# after 50 layers (measured with numpy), and no bf16 result could be checked.
BN3_GAMMA = (0.15, 0.35)  # says the folder is this generator's to overwrite


# ---------------------------------------------------------------------------
# The architecture: one entry per convolution, in torchvision's order.

class Conv:
    """One convolution of the network with its batch norm (or the fc's bias)."""

    def __init__(self, name, weight, bn, cin, cout, k, stride, pad, hw, kind, x, y, r=None):
        self.name = name        # stage name (torchvision module path)
        self.weight = weight    # state_dict key of the conv weight
        self.bn = bn            # state_dict prefix of its batch norm (None: the fc)
        self.cin, self.cout, self.k, self.stride, self.pad = cin, cout, k, stride, pad
        self.hw = hw            # input height = width
        self.kind = kind        # "conv_bias_relu", "conv_bias", "conv_bias_add_relu"
        self.x, self.y, self.r = x, y, r  # buffers: input, output, residual

    @property
    def out_hw(self):
        return (self.hw + 2 * self.pad - self.k) // self.stride + 1


def architecture(image=IMAGE):
    """(convs, stem_pool_hw, final_hw): the 53 convolutions in run order with
    their buffers; the max pool reads buffer 'stem' and writes 'pool'."""
    convs = [Conv("conv1", "conv1.weight", "bn1", 3, 64, 7, 2, 3, image, "conv_bias_relu", "image", "stem")]
    hw = (convs[0].out_hw + 2 - 3) // 2 + 1  # after the max pool
    cin, prev = 64, "pool"
    for li, (blocks, width) in enumerate(zip(BLOCKS, WIDTHS), start=1):
        for bi in range(blocks):
            p = f"layer{li}.{bi}"
            stride = 2 if (bi == 0 and li > 1) else 1
            cout = width * EXPANSION
            convs.append(Conv(f"{p}.conv1", f"{p}.conv1.weight", f"{p}.bn1", cin, width, 1, 1, 0, hw,
                              "conv_bias_relu", prev, f"{p}.a1"))
            convs.append(Conv(f"{p}.conv2", f"{p}.conv2.weight", f"{p}.bn2", width, width, 3, stride, 1, hw,
                              "conv_bias_relu", f"{p}.a1", f"{p}.a2"))
            out_hw = (hw + 2 - 3) // stride + 1
            residual = prev
            if bi == 0:
                convs.append(Conv(f"{p}.downsample", f"{p}.downsample.0.weight", f"{p}.downsample.1", cin, cout,
                                  1, stride, 0, hw, "conv_bias", prev, f"{p}.down"))
                residual = f"{p}.down"
            convs.append(Conv(f"{p}.conv3", f"{p}.conv3.weight", f"{p}.bn3", width, cout, 1, 1, 0, out_hw,
                              "conv_bias_add_relu", f"{p}.a2", p, r=residual))
            cin, prev, hw = cout, p, out_hw
    return convs, convs[0].out_hw, hw


def state_dict_shapes():
    """[(key, shape)] of torchvision's resnet50().state_dict(), in its order."""
    out = []

    def conv_bn(weight, bn, cin, cout, k):
        out.append((weight, (cout, cin, k, k)))
        for s in ("weight", "bias", "running_mean", "running_var"):
            out.append((f"{bn}.{s}", (cout,)))
        out.append((f"{bn}.num_batches_tracked", ()))

    convs, _, _ = architecture()
    order = {"conv1": 0, "conv2": 1, "conv3": 2, "downsample": 3}
    blocks = {}
    for c in convs[1:]:
        block, part = c.name.rsplit(".", 1)
        blocks.setdefault(block, []).append((order[part], c))
    conv_bn(convs[0].weight, convs[0].bn, convs[0].cin, convs[0].cout, convs[0].k)
    for block in blocks.values():  # torchvision's order: conv1, bn1, ..., bn3, downsample
        for _, c in sorted(block, key=lambda t: t[0]):
            conv_bn(c.weight, c.bn, c.cin, c.cout, c.k)
    out.append(("fc.weight", (NUM_CLASSES, 512 * EXPANSION)))
    out.append(("fc.bias", (NUM_CLASSES,)))
    return out


# ---------------------------------------------------------------------------
# numpy reference pieces (float32 or float64, NCHW): the calibration and the tests.

def conv2d(x, w, stride=1, pad=0):
    """Cross-correlation as torch's conv2d: x [N,C,H,W], w [K,C,R,S] -> [N,K,P,Q]."""
    k, c, r, s = w.shape
    if pad:
        x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    if r == 1 and s == 1:
        xs = x[:, :, ::stride, ::stride]
        return np.einsum("nchw,kc->nkhw", xs, w[:, :, 0, 0], optimize=True)
    win = np.lib.stride_tricks.sliding_window_view(x, (r, s), axis=(2, 3))[:, :, ::stride, ::stride]
    y = np.tensordot(win, w, axes=([1, 4, 5], [1, 2, 3]))  # [N, P, Q, K]
    return np.ascontiguousarray(y.transpose(0, 3, 1, 2))


def max_pool(x, window=3, stride=2, pad=1):
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=-np.inf)
    win = np.lib.stride_tricks.sliding_window_view(x, (window, window), axis=(2, 3))[:, :, ::stride, ::stride]
    return win.max(axis=(4, 5))


def batch_norm(x, sd, bn, eps=BN_EPS):
    """Eval-mode batch norm with the running statistics of `bn` in `sd`."""
    shape = (1, -1, 1, 1)
    inv = sd[f"{bn}.weight"] / np.sqrt(sd[f"{bn}.running_var"] + eps)
    return (x - sd[f"{bn}.running_mean"].reshape(shape)) * inv.reshape(shape) + sd[f"{bn}.bias"].reshape(shape)


def fold_bn(w, gamma, beta, mean, var, eps=BN_EPS):
    """(w', b') with conv(x, w') + b' == batch_norm(conv(x, w)) in eval mode:
    w' = w * gamma / sqrt(var + eps), b' = beta - mean * gamma / sqrt(var + eps)."""
    scale = gamma / np.sqrt(var + eps)
    return w * scale.reshape(-1, 1, 1, 1), beta - mean * scale


def folded(sd, conv, eps=BN_EPS):
    """(w [K,C,R,S], b [1,K,1,1]) float32 of one convolution of the pipeline."""
    if conv.bn is None:  # the fc as a 1x1 conv
        return (sd["fc.weight"].reshape(NUM_CLASSES, -1, 1, 1).astype(np.float32),
                sd["fc.bias"].reshape(1, -1, 1, 1).astype(np.float32))
    bn = conv.bn
    w, b = fold_bn(sd[conv.weight].astype(np.float64), sd[f"{bn}.weight"].astype(np.float64),
                   sd[f"{bn}.bias"].astype(np.float64), sd[f"{bn}.running_mean"].astype(np.float64),
                   sd[f"{bn}.running_var"].astype(np.float64), eps)
    return w.astype(np.float32), b.reshape(1, -1, 1, 1).astype(np.float32)


def _finish_conv(c, y, vals):
    """The numpy forwards' step after conv + batch norm: the residual, the ReLU (not
    after a conv_bias), and the stem's max pool after conv1; stores the result in vals."""
    if c.r is not None:
        y = y + vals[c.r]
    vals[c.y] = np.maximum(y, 0) if c.kind != "conv_bias" else y
    if c.name == "conv1":
        vals["pool"] = max_pool(vals["stem"])


def forward(sd, x):
    """The unfolded network in numpy (eval mode): x [N,3,H,W] -> logits [N,1000]."""
    convs, _, _ = architecture()
    vals = {"image": x}
    for c in convs:
        y = batch_norm(conv2d(vals[c.x], sd[c.weight], c.stride, c.pad), sd, c.bn)
        _finish_conv(c, y, vals)
    pooled = vals[convs[-1].y].mean(axis=(2, 3))
    return pooled @ sd["fc.weight"].T + sd["fc.bias"]


def round_bf16(x):
    """float32 -> the nearest bf16 (ties to even), as float32."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    b = (b + (((b >> 16) & 1) + 0x7FFF)) & np.uint32(0xFFFF0000)
    return b.view(np.float32)


def _to_memory(value, layout):
    """A tensor's logical value as its bytes' order: NHWC for "nhwc", else row-major."""
    return (value.transpose(0, 2, 3, 1) if layout == "nhwc" else value).ravel()


def _from_memory(flat, dims, layout):
    """The inverse of _to_memory for a tensor of `dims` (a symbol, e.g. "N",
    takes what the element count leaves)."""
    known = int(np.prod([d for d in dims if isinstance(d, int)]))
    dims = [d if isinstance(d, int) else flat.size // known for d in dims]
    if layout == "nhwc":
        n, c, h, w = dims
        return flat.reshape(n, h, w, c).transpose(0, 3, 1, 2)
    return flat.reshape(dims)


def run_pipeline_numpy(pipeline_path, inputs, stage_order=None, round_fn=None):
    """Runs a pipeline of conv_fprop / bias_add / add / relu / max_pool /
    global_avg_pool / matmul / scale graphs in numpy from its files (the
    pipeline JSON, its graphs and .npy weights; logical values, NCHW for the
    NHWC tensors), as fusebox would; a "reshape" buffer is read through each
    stage's own dims and layout over the writer's memory order:
    round_fn(value) on every constant and every stage output (round_bf16 for
    fusebox's bf16 buffers; None keeps float32). `inputs`: buffer -> array;
    `stage_order`: stage names (`pipeline check --json`'s order), default the
    file's. Returns buffer -> value of every buffer."""
    rnd = round_fn or (lambda a: a)
    folder = os.path.dirname(os.path.abspath(pipeline_path))
    with open(pipeline_path) as f:
        doc = json.load(f)
    vals = {k: rnd(np.asarray(v, np.float32)) for k, v in inputs.items()}
    layouts = {}  # buffer -> its writer's layout (None: row-major); inputs and constants are NCHW-logical
    for name, b in doc["buffers"].items():
        if b["kind"] == "constant":
            vals[name] = rnd(np.load(os.path.join(folder, b["file"])).astype(np.float32))
    graphs = {}
    for stage in stage_order or list(doc["graphs"]):
        gfile = os.path.join(folder, doc["graphs"][stage])
        if gfile not in graphs:
            with open(gfile) as f:
                graphs[gfile] = json.load(f)
        g, binding = graphs[gfile], doc["bind"][stage]
        specs = {ts["name"]: ts for ts in g["tensors"]}
        t = {}
        for tensor, buf in binding.items():
            if buf not in vals:
                continue
            v, spec = vals[buf], specs[tensor]
            if doc["buffers"].get(buf, {}).get("reshape") and "dims" in spec:
                # The batch is the value's (fewer images than the graph's N is fine).
                dims = [v.shape[0]] + list(spec["dims"][1:])
                v = _from_memory(_to_memory(v, layouts.get(buf)), dims, spec.get("layout"))
            t[tensor] = v
        t.update({name: ts["scalar"] for name, ts in specs.items() if "scalar" in ts})
        for op in g["ops"]:  # the generator writes ops in order
            i = {role: t[name] for role, name in op["inputs"].items()}
            kind = op["op"]
            if kind == "conv_fprop":
                assert op.get("dilation", [1, 1]) == [1, 1]
                y = conv2d(i["x"], i["w"], op["stride"][0], op["padding"][0])
            elif kind == "bias_add":
                y = i["x"] + i["bias"]
            elif kind == "add":
                y = i["a"] + i["b"]
            elif kind == "relu":
                y = np.maximum(i["x"], 0)
            elif kind == "max_pool":
                y = max_pool(i["x"], op["window"][0], op["stride"][0], op["padding"][0])
            elif kind == "global_avg_pool":
                y = i["x"].mean(axis=(2, 3), keepdims=True)
            elif kind == "matmul":
                y = np.matmul(i["a"], i["b"])
            elif kind == "scale":
                y = i["x"] * np.float32(i["scale"])
            else:
                raise ValueError(f"{gfile}: op {kind} is not one run_pipeline_numpy knows")
            t[op["outputs"]["y"]] = y.astype(np.float32)
        for tensor, buf in binding.items():
            if buf not in vals:
                vals[buf] = rnd(t[tensor])
                layouts[buf] = specs[tensor].get("layout")
    return vals


# ---------------------------------------------------------------------------
# Seeded weights.

def make_state_dict(seed=50, calib_batch=2, calib_image=96):
    """Seeded random weights in torchvision's names and shapes (float32;
    num_batches_tracked int64). Batch-norm running statistics are calibrated
    on `calib_batch` random images of `calib_image` pixels (numpy float32)."""
    rng = np.random.default_rng(seed)
    sd = {}
    for key, shape in state_dict_shapes():
        if key.endswith("num_batches_tracked"):
            sd[key] = np.array(0, dtype=np.int64)
        elif len(shape) == 4:
            fan_in = shape[1] * shape[2] * shape[3]
            sd[key] = (rng.standard_normal(shape, dtype=np.float32) * np.float32(np.sqrt(2.0 / fan_in)))
        elif key.endswith(".bn3.weight"):  # gamma closing a residual branch: small
            sd[key] = rng.uniform(*BN3_GAMMA, shape).astype(np.float32)
        elif key.endswith(".weight") and key != "fc.weight":  # gamma
            sd[key] = rng.uniform(0.8, 1.2, shape).astype(np.float32)
        elif key.endswith(".bias") and key != "fc.bias":  # beta
            sd[key] = rng.normal(0.0, 0.1, shape).astype(np.float32)
        elif key.endswith("running_mean"):
            sd[key] = np.zeros(shape, np.float32)
        elif key.endswith("running_var"):
            sd[key] = np.ones(shape, np.float32)
    # Running statistics: what each batch norm sees on random images, per
    # channel, times a small random factor (kept positive, never tiny).
    convs, _, _ = architecture()
    vals = {"image": rng.standard_normal((calib_batch, 3, calib_image, calib_image), dtype=np.float32)}
    for c in convs:
        z = conv2d(vals[c.x], sd[c.weight], c.stride, c.pad)
        mean = z.mean(axis=(0, 2, 3))
        var = z.var(axis=(0, 2, 3))
        var = np.clip(var, 0.25 * var.mean(), 4.0 * var.mean())
        sd[f"{c.bn}.running_mean"] = (mean + rng.normal(0, 0.05, mean.shape) * np.sqrt(var)).astype(np.float32)
        sd[f"{c.bn}.running_var"] = (var * rng.uniform(0.9, 1.1, var.shape)).astype(np.float32)
        y = batch_norm(z, sd, c.bn)
        _finish_conv(c, y, vals)
    pooled = vals[convs[-1].y].mean(axis=(2, 3))
    # fc: logits with a spread of a few units (about 5 at 224 pixels, where
    # the pooled features are larger than at the calibration's size).
    rms = float(np.sqrt((pooled.astype(np.float64) ** 2).mean()))
    std = 4.0 / (np.sqrt(pooled.shape[1]) * max(rms, 1e-6))
    sd["fc.weight"] = rng.normal(0.0, std, (NUM_CLASSES, pooled.shape[1])).astype(np.float32)
    sd["fc.bias"] = rng.normal(0.0, 0.1, (NUM_CLASSES,)).astype(np.float32)
    return sd


# ---------------------------------------------------------------------------
# Graphs and the pipeline.

def _dims(batch, c, hw, max_batch):
    n = "N" if max_batch else batch
    return [n, c, hw, hw]


def _graph(name, batch, max_batch, tensors, ops):
    g = {"name": name, "io_dtype": "bf16", "intermediate_dtype": "fp32", "compute_dtype": "fp32"}
    if max_batch:
        g["symbols"] = {"N": {"min": 1, "max": max_batch, "default": batch}}
    g["tensors"] = tensors
    g["ops"] = ops
    return g


def conv_graph(c, batch, max_batch=None):
    """(file name, graph) of a convolution stage."""
    tag = {"conv_bias_relu": "cbr", "conv_bias": "cb", "conv_bias_add_relu": "cbar"}[c.kind]
    name = f"{tag}_{c.cin}to{c.cout}_k{c.k}s{c.stride}_{c.hw}_n{batch}"
    tensors = [
        {"name": "x", "dims": _dims(batch, c.cin, c.hw, max_batch), "layout": "nhwc"},
        {"name": "w", "dims": [c.cout, c.cin, c.k, c.k], "layout": "nhwc"},
        {"name": "b", "dims": [1, c.cout, 1, 1], "layout": "nhwc"},
    ]
    if c.r is not None:
        tensors.append({"name": "r", "dims": _dims(batch, c.cout, c.out_hw, max_batch), "layout": "nhwc"})
    tensors.append({"name": "y", "layout": "nhwc"})
    ops = [{"op": "conv_fprop", "name": "conv", "inputs": {"x": "x", "w": "w"}, "outputs": {"y": "conv_out"},
            "padding": [c.pad, c.pad], "stride": [c.stride, c.stride], "dilation": [1, 1]}]
    last = "conv_out"
    steps = [("bias_add", "bias", {"x": last, "bias": "b"})]
    if c.kind == "conv_bias_add_relu":
        steps.append(("add", "residual", {"a": None, "b": "r"}))
    if c.kind != "conv_bias":
        steps.append(("relu", "act", {"x": None}))
    for i, (op, opname, inputs) in enumerate(steps):
        inputs = {k: (last if v is None else v) for k, v in inputs.items()}
        out = "y" if i == len(steps) - 1 else f"{opname}_out"
        ops.append({"op": op, "name": opname, "inputs": inputs, "outputs": {"y": out}})
        last = out
    return name + ".json", _graph(name, batch, max_batch, tensors, ops)


GAP_KINDS = ("matmul", "pool")


def gap_matmul_graph(batch, c, hw, max_batch=None):
    """(file name, graph) of the global average pool as one GEMM: `ones`
    [1, 1, hw*hw] @ `x` [N, hw*hw, c] (an NHWC [N, c, hw, hw] activation's
    memory, read as rows of c channels) summed in fp32, times 1/(hw*hw),
    into `y` [N, 1, c] (the pooled [N, c, 1, 1] NHWC's memory)."""
    name = f"gap_matmul_{c}_{hw}_n{batch}"
    n = "N" if max_batch else batch
    tensors = [{"name": "ones", "dims": [1, 1, hw * hw]},
               {"name": "x", "dims": [n, hw * hw, c]},
               {"name": "inv_hw", "scalar": 1.0 / (hw * hw), "dtype": "fp32"},
               {"name": "y"}]
    ops = [{"op": "matmul", "name": "sum_hw", "inputs": {"a": "ones", "b": "x"}, "outputs": {"y": "sum_hw"}},
           {"op": "scale", "name": "mean", "inputs": {"x": "sum_hw", "scale": "inv_hw"}, "outputs": {"y": "y"}}]
    return name + ".json", _graph(name, batch, max_batch, tensors, ops)


def pool_graph(kind, batch, c, hw, max_batch=None):
    if kind == "max_pool":
        name = f"max_pool_3s2p1_{c}_{hw}_n{batch}"
        op = {"op": "max_pool", "name": "pool", "window": [3, 3], "stride": [2, 2], "padding": [1, 1]}
    else:
        name = f"global_avg_pool_{c}_{hw}_n{batch}"
        op = {"op": "global_avg_pool", "name": "gap"}
    op.update({"inputs": {"x": "x"}, "outputs": {"y": "y"}})
    tensors = [{"name": "x", "dims": _dims(batch, c, hw, max_batch), "layout": "nhwc"},
               {"name": "y", "layout": "nhwc"}]
    return name + ".json", _graph(name, batch, max_batch, tensors, [op])


def fc_conv(channels=512 * EXPANSION):
    """The fc as a 1x1 convolution on the pooled [N, 2048, 1, 1]."""
    return Conv("fc", "fc.weight", None, channels, NUM_CLASSES, 1, 1, 0, 1, "conv_bias", "avgpool", "logits")


def build(batch=8, max_batch=None, image=IMAGE, gap="matmul"):
    """(pipeline dict, {graph file: graph dict}, [(Conv, weight buffer, bias buffer)]).
    `gap`: "matmul" (the average pool as a GEMM; buffer `avgpool.ones`, a
    constant [1, 1, 49] of ones, file weights/avgpool.ones.npy) or "pool"."""
    if gap not in GAP_KINDS:
        raise ValueError(f"gap must be one of {', '.join(GAP_KINDS)}, got {gap!r}")
    convs, stem_hw, final_hw = architecture(image)
    stages, graphs, buffers, bind, weights = {}, {}, {"image": {"kind": "input"}}, {}, []

    def add_stage(name, gfile, gdoc, binding):
        graphs["graphs/" + gfile] = gdoc
        stages[name] = "graphs/" + gfile
        bind[name] = binding
        for t, buf in binding.items():
            if buf not in buffers:
                buffers[buf] = {"kind": "intermediate"}

    def add_conv(c):
        gfile, gdoc = conv_graph(c, batch, max_batch)
        wb, bb = f"{c.name}.w", f"{c.name}.b"
        buffers[wb] = {"kind": "constant", "file": f"weights/{wb}.npy"}
        buffers[bb] = {"kind": "constant", "file": f"weights/{bb}.npy"}
        binding = {"x": c.x, "w": wb, "b": bb}
        if c.r is not None:
            binding["r"] = c.r
        binding["y"] = c.y
        add_stage(c.name, gfile, gdoc, binding)
        weights.append((c, wb, bb))

    add_conv(convs[0])
    add_stage("maxpool", *pool_graph("max_pool", batch, 64, stem_hw, max_batch), {"x": "stem", "y": "pool"})
    for c in convs[1:]:
        add_conv(c)
    if gap == "matmul":
        buffers["avgpool.ones"] = {"kind": "constant", "file": "weights/avgpool.ones.npy"}
        add_stage("avgpool", *gap_matmul_graph(batch, 512 * EXPANSION, final_hw, max_batch),
                  {"ones": "avgpool.ones", "x": convs[-1].y, "y": "avgpool"})
        # The conv writes [N, 2048, 7, 7] NHWC, the GEMM reads [N, 49, 2048]; the GEMM
        # writes [N, 1, 2048], the fc reads [N, 2048, 1, 1] NHWC: the same memory.
        buffers[convs[-1].y]["reshape"] = True
        buffers["avgpool"]["reshape"] = True
    else:
        add_stage("avgpool", *pool_graph("global_avg_pool", batch, 512 * EXPANSION, final_hw, max_batch),
                  {"x": convs[-1].y, "y": "avgpool"})
    buffers["logits"] = {"kind": "output"}
    add_conv(fc_conv())
    pipeline = {"name": "resnet50", "graphs": stages, "buffers": buffers, "bind": bind}
    return pipeline, graphs, weights


def _prepare_folder(out_dir):
    """Creates out_dir, or accepts it if empty or made by this generator;
    refuses to write into anyone else's folder."""
    if os.path.isdir(out_dir) and os.listdir(out_dir) and not os.path.isfile(os.path.join(out_dir, MARKER_FILE)):
        raise FileExistsError(f"{out_dir} is not empty and was not made by make_resnet50_pipeline "
                              f"(no {MARKER_FILE}): give an empty or new folder")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise FileExistsError(f"{out_dir} exists and is not a folder")
    for sub in ("", "graphs", "weights"):
        os.makedirs(os.path.join(out_dir, sub), exist_ok=True)
    with open(os.path.join(out_dir, MARKER_FILE), "w") as f:
        f.write("made by fusebox_tools.models.make_resnet50_pipeline (python/fusebox_tools/models/resnet50.py); "
                "its files are rewritten on each run\n")


def write_resnet50(out_dir, batch=8, seed=50, max_batch=None, state_dict=None, gap="matmul"):
    """Writes the pipeline, its graphs, the folded weights and the unfolded
    state dict into out_dir; returns the pipeline file's path."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if max_batch is not None and max_batch < batch:
        raise ValueError(f"max batch {max_batch} is below the batch {batch}")
    _prepare_folder(out_dir)
    sd = make_state_dict(seed) if state_dict is None else state_dict
    pipeline, graphs, weights = build(batch, max_batch, gap=gap)
    for gfile, gdoc in graphs.items():
        with open(os.path.join(out_dir, gfile), "w") as f:
            json.dump(gdoc, f, indent=1)
            f.write("\n")
    for c, wb, bb in weights:
        w, b = folded(sd, c)
        np.save(os.path.join(out_dir, "weights", wb + ".npy"), w)
        np.save(os.path.join(out_dir, "weights", bb + ".npy"), b)
    if "avgpool.ones" in pipeline["buffers"]:
        _, _, final_hw = architecture()
        np.save(os.path.join(out_dir, "weights", "avgpool.ones.npy"), np.ones((1, 1, final_hw * final_hw), np.float32))
    np.savez(os.path.join(out_dir, STATE_DICT_FILE), **sd)
    path = os.path.join(out_dir, PIPELINE_FILE)
    with open(path, "w") as f:
        json.dump(pipeline, f, indent=1)
        f.write("\n")
    return path
