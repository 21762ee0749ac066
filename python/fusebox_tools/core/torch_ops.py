"""One graph op computed with PyTorch: shared by fusebox_tools.crosscheck.crosscheck (the
float32 reference) and fusebox_tools.bench.torch_compare (the framework path; its
SDPA comparison uses torch's own scaled_dot_product_attention instead, see
fusebox_tools.bench.sdpa_compare).

`op` is an op of `fusebox check --json` (fusebox_tools.core.graph.Graph.ops): its
"attrs" are resolved (defaults applied), so nothing here re-derives them."""

import torch
import torch.nn.functional as F

from fusebox_tools.core.graph import SDPA_BWD_OPS, SdpaOptions


def _conv_geometry(op):
    a = op["attrs"]
    return dict(padding=tuple(a["padding"]), stride=tuple(a["stride"]), dilation=tuple(a["dilation"]))


def conv(x, w, op):
    nsp = x.dim() - 2
    fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nsp]
    groups = x.shape[1] // w.shape[1]  # grouped convolution: w holds C/groups channels
    return fn(x, w, groups=groups, **_conv_geometry(op))


def _like_memory_format(t):
    """channels_last(_3d) when t is laid out so (an NHWC graph), else contiguous."""
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous():
        return torch.channels_last
    if t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d) and not t.is_contiguous():
        return torch.channels_last_3d
    return torch.contiguous_format


def _conv_backward(dy, x, w, op, mask):
    """aten.convolution_backward as autograd calls it: real x and w tensors in their layouts
    (torch.nn.grad.conv*d_input/_weight hand aten a zero-stride expanded tensor instead, for which
    torch picks a slow path: issue 36)."""
    a = op["attrs"]
    groups = x.shape[1] // w.shape[1]
    nsp = dy.dim() - 2
    return torch.ops.aten.convolution_backward(dy, x, w, None, list(a["stride"]), list(a["padding"]),
                                               list(a["dilation"]), False, [0] * nsp, groups, mask)


def conv_dgrad(dy, w, op, x=None):
    """dL/dx of conv(x, w) given dy = dL/dy; x's dims are the op's "x_dims". `x`: a real tensor of
    those dims in the layout dx should have (its values are not read); default one in dy's layout."""
    if x is None:
        x = torch.zeros(op["attrs"]["x_dims"], dtype=dy.dtype, device=dy.device).contiguous(
            memory_format=_like_memory_format(dy))
    return _conv_backward(dy, x, w, op, [True, False, False])[0]


def conv_wgrad(dy, x, op, w=None):
    """dL/dw of conv(x, w) given dy = dL/dy; w's dims are the op's "w_dims". `w`: a real tensor of
    those dims in the layout dw should have (values not read); default one in x's layout."""
    if w is None:
        w = torch.zeros(op["attrs"]["w_dims"], dtype=dy.dtype, device=dy.device).contiguous(
            memory_format=_like_memory_format(x))
    return _conv_backward(dy, x, w, op, [False, True, False])[1]


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
    "relu_bwd": lambda i: torch.where(i["x"] > 0, i["dy"], torch.zeros_like(i["dy"])),
    # The other activations' backward, through torch's autograd of the forward.
    "gelu_tanh_bwd": lambda i: _activation_grad(lambda x: F.gelu(x, approximate="tanh"), i),
    "gelu_erf_bwd": lambda i: _activation_grad(F.gelu, i),
    "silu_bwd": lambda i: _activation_grad(F.silu, i),
    "sigmoid_bwd": lambda i: _activation_grad(torch.sigmoid, i),
    "tanh_bwd": lambda i: _activation_grad(torch.tanh, i),
}


def _activation_grad(f, i):
    """dy * f'(x) by autograd, in fp32."""
    with torch.enable_grad():
        x = i["x"].detach().float().requires_grad_(True)
        (g,) = torch.autograd.grad(f(x), x, grad_outputs=i["dy"].float().expand_as(x))
    return g


# ---------------------------------------------------------------- reductions
#
# include/fusebox/ops/reduction.h: y keeps x's rank with 1 on the reduced dims
# ("reduce_dims", resolved by check --json: every dim when the graph gives none).

REDUCTION_OPS = ("reduce_sum", "reduce_max", "reduce_min", "reduce_amax", "reduce_mean")


def reduction(x, op):
    dims = tuple(op["attrs"]["reduce_dims"])
    x = x.float()
    kind = op["op"]
    if kind == "reduce_sum":
        return x.sum(dim=dims, keepdim=True)
    if kind == "reduce_mean":
        return x.mean(dim=dims, keepdim=True)
    if kind == "reduce_max":
        return x.amax(dim=dims, keepdim=True)
    if kind == "reduce_min":
        return x.amin(dim=dims, keepdim=True)
    if kind == "reduce_amax":
        return x.abs().amax(dim=dims, keepdim=True)
    raise ValueError(f"op {op['name']!r}: no torch version of {kind!r}")


# ---------------------------------------------------------------- normalization
#
# From the rules in include/fusebox/ops/norm.h, through torch's own
# F.layer_norm for y (an implementation independent of fusebox's), and the
# statistics written out explicitly (biased variance, float32). The
# normalized dims come resolved from check --json ("normalized_dims": the
# trailing dims of x that scale covers).

NORM_OPS = ("layernorm", "rmsnorm", "layernorm_bwd", "rmsnorm_bwd")


def _norm_shape(x, op):
    dims = op["attrs"]["normalized_dims"]
    return tuple(x.shape[d] for d in dims), tuple(dims)


def layernorm(ins, op):
    """layernorm outputs by role: "y" and, in the training phase, "mean" and "inv_variance"."""
    x = ins["x"].float()
    eps = float(op["attrs"]["epsilon"])
    shape, dims = _norm_shape(x, op)
    y = F.layer_norm(x, shape, ins["scale"].float().reshape(shape), ins["bias"].float().reshape(shape), eps)
    out = {"y": y}
    if op["attrs"]["phase"] == "training":
        mean = x.mean(dim=dims, keepdim=True)
        var = ((x - mean) ** 2).mean(dim=dims, keepdim=True)
        out["mean"] = mean
        out["inv_variance"] = torch.rsqrt(var + eps)
    return {r: out[r] for r in op["outputs"] if r in out}


def rmsnorm(ins, op):
    """rmsnorm outputs by role: "y" and, in the training phase, "inv_variance"."""
    x = ins["x"].float()
    eps = float(op["attrs"]["epsilon"])
    shape, dims = _norm_shape(x, op)
    inv = torch.rsqrt((x * x).mean(dim=dims, keepdim=True) + eps)
    y = x * inv * ins["scale"].float()
    if "bias" in ins:
        y = y + ins["bias"].float()
    out = {"y": y, "inv_variance": inv}
    return {r: out[r] for r in op["outputs"] if r in out}


def norm_backward(ins, op):
    """layernorm_bwd / rmsnorm_bwd outputs by role: "dx", "dscale" (and
    "dbias"), from the given statistics (norm.h: the backward does not
    recompute them from x), by norm.h's formulas. When the statistics are x's
    own, this is autograd's gradient of F.layer_norm / the RMS norm
    (tests/python/test_norm_torch_ops.py checks that)."""
    x = ins["x"].float()
    dy = ins["dy"].float()
    g = ins["scale"].float()
    shape, dims = _norm_shape(x, op)
    inv = ins["inv_variance"].float()
    mean = ins["mean"].float() if op["op"] == "layernorm_bwd" else None
    xhat = (x - mean) * inv if mean is not None else x * inv
    gdy = g * dy
    c2 = (gdy * xhat).mean(dim=dims, keepdim=True)
    c1 = gdy.mean(dim=dims, keepdim=True) if mean is not None else 0.0
    row_dims = tuple(d for d in range(x.dim()) if d not in dims)
    out = {"dx": inv * (gdy - c1 - xhat * c2),
           "dscale": (dy * xhat).sum(dim=row_dims, keepdim=True),
           "dbias": dy.sum(dim=row_dims, keepdim=True)}
    return {r: out[r] for r in op["outputs"] if r in out}


# ---------------------------------------------------------------- pooling
#
# From include/fusebox/ops/pool.h, through torch's own pooling functions (the
# window, stride and padding come resolved from check --json; global_avg_pool
# is avg_pool with the window the whole spatial extent).

POOL_OPS = ("max_pool", "avg_pool", "global_avg_pool")


def pool(ins, op):
    """max_pool / avg_pool / global_avg_pool: y."""
    x = ins["x"].float()
    a = op["attrs"]
    nsp = x.dim() - 2
    geometry = dict(kernel_size=tuple(a["window"]), stride=tuple(a["stride"]), padding=tuple(a["padding"]))
    if a["mode"] == "max":
        return {2: F.max_pool2d, 3: F.max_pool3d}[nsp](x, **geometry)
    fn = {2: F.avg_pool2d, 3: F.avg_pool3d}[nsp]
    return fn(x, count_include_pad=bool(a["count_include_pad"]), **geometry)


# ---------------------------------------------------------------- batch normalization
#
# From include/fusebox/ops/batchnorm.h: y through torch's F.batch_norm (in
# training mode it also updates the running statistics, with the unbiased
# batch variance, as batchnorm.h says cuDNN does), the saved statistics
# written out (biased variance, float32). Per-channel tensors are [1, C, 1, 1].

BATCHNORM_OPS = ("batchnorm", "batchnorm_inference", "batchnorm_bwd")


def _channel(t):
    return t.float().reshape(-1)


def batchnorm(ins, op):
    """batchnorm (training forward): y, mean, inv_variance, next_running_mean, next_running_var."""
    x = ins["x"].float()
    a = op["attrs"]
    eps, momentum = float(a["epsilon"]), float(a["momentum"])
    run_mean = _channel(ins["running_mean"]).clone()
    run_var = _channel(ins["running_var"]).clone()
    dims = tuple(d for d in range(x.dim()) if d != 1)
    mean = x.mean(dim=dims, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=dims, keepdim=True)
    shape = mean.shape
    if eps > 0:
        y = F.batch_norm(x, run_mean, run_var, _channel(ins["scale"]), _channel(ins["bias"]), training=True,
                         momentum=momentum, eps=eps)
    else:  # fusebox accepts epsilon 0; torch >= 2.11 refuses it ("batch_norm eps must be positive")
        n = x.numel() // x.shape[1]
        y = (x - mean) * torch.rsqrt(var) * ins["scale"].float().reshape(shape) + ins["bias"].float().reshape(shape)
        run_mean = (1 - momentum) * run_mean + momentum * mean.reshape(-1)
        run_var = (1 - momentum) * run_var + momentum * var.reshape(-1) * (n / max(n - 1, 1))
    out = {"y": y, "mean": mean, "inv_variance": torch.rsqrt(var + eps),
           "next_running_mean": run_mean.reshape(shape), "next_running_var": run_var.reshape(shape)}
    return {r: out[r] for r in op["outputs"] if r in out}


def batchnorm_inference(ins, op):
    """batchnorm_inference: y = (x - mean) * inv_variance * scale + bias."""
    x = ins["x"].float()
    return {"y": (x - ins["mean"].float()) * ins["inv_variance"].float() * ins["scale"].float() + ins["bias"].float()}


def batchnorm_backward(ins, op):
    """batchnorm_bwd: dx, dscale, dbias from the given statistics, by
    batchnorm.h's formulas (autograd's gradient of F.batch_norm in training
    mode when the statistics are x's own: tests/python/test_norm_torch_ops.py)."""
    x = ins["x"].float()
    dy = ins["dy"].float()
    g = ins["scale"].float()
    inv = ins["inv_variance"].float()
    xhat = (x - ins["mean"].float()) * inv
    dims = tuple(d for d in range(x.dim()) if d != 1)
    c1 = dy.mean(dim=dims, keepdim=True)
    c2 = (dy * xhat).mean(dim=dims, keepdim=True)
    out = {"dx": g * inv * (dy - c1 - xhat * c2),
           "dscale": (dy * xhat).sum(dim=dims, keepdim=True),
           "dbias": dy.sum(dim=dims, keepdim=True)}
    return {r: out[r] for r in op["outputs"] if r in out}


# ---------------------------------------------------------------- attention
#
# Written from the rules in include/fusebox/graph.h (not from fusebox's C++
# reference): explicit scores, an explicit boolean mask, bias, ALiBi, a
# masked softmax, stats = logsumexp. All math in float32 (callers turn TF32
# off). Work is split per (batch, kv head) and into blocks of query rows so
# that the [rows, Skv] score blocks stay around SCORE_BLOCK_ELEMS elements
# (the 8192-long examples would need 17 GB of fp32 scores at once).

SCORE_BLOCK_ELEMS = 1 << 28  # 1 GiB of fp32 scores per block

FP8_E4M3_MAX = 448.0


class SdpaSkip(Exception):
    """The op cannot be cross-checked in torch (e.g. dropout: Philox bits)."""


def _sdpa_config(op):
    """The op's resolved options (fusebox_tools.core.graph.SdpaOptions)."""
    return SdpaOptions.from_attrs(op["attrs"])


def gather_pages(pool, table, max_seq_len_kv):
    """A paged K/V cache as the dense [B, H, Skv, D] tensor each sequence
    sees: key j of sequence b is row j % page_size of page
    table[b, 0, j // page_size, 0] of `pool` [num_pages, H, page_size, D]
    (SdpaOptions::paged, include/fusebox/ops/sdpa.h). An explicit gather:
    what a contiguous-cache attention (torch SDPA) needs first."""
    idx = table.reshape(table.shape[0], -1).to(device=pool.device, dtype=torch.long)  # [B, P]
    pages = pool[idx]  # [B, P, H, page_size, D]
    B, P, H, ps, D = pages.shape
    dense = pages.permute(0, 2, 1, 3, 4).reshape(B, H, P * ps, D)
    return dense[:, :, :max_seq_len_kv]


def unpage(ins, op):
    """`ins` with k and v gathered through the page tables when the op is
    paged (attrs "paged"), else `ins` itself."""
    attrs = op["attrs"]
    if not attrs.get("paged"):
        return ins
    out = dict(ins)
    skv = int(attrs["max_seq_len_kv"])
    out["k"] = gather_pages(ins["k"], ins["page_table_k"], skv)
    out["v"] = gather_pages(ins["v"], ins["page_table_v"], skv)
    return out


def _lengths(ins, role, batch, full, device):
    t = ins.get(role)
    if t is None:
        return torch.full((batch,), full, dtype=torch.long, device=device)
    return t.reshape(-1).to(device=device, dtype=torch.long)


def sdpa_keep_mask(opts, rows, skv, lq, lkv):
    """Boolean [len(rows), skv]: score (i, j) kept for query rows `rows` (a 1-D
    long tensor) with this batch's lengths lq, lkv (Python ints), by
    SdpaOptions.keeps (the rule of graph.h)."""
    i = rows.view(-1, 1)
    j = torch.arange(skv, device=rows.device).view(1, -1)
    return torch.broadcast_to(opts.keeps(i, j, int(lq), int(lkv)), (rows.numel(), skv))


BLOCK_TILE = 128  # a block mask's tile: 128 x 128 scores (graph.h, SdpaOptions::block_mask)


def block_tile_keep(mask, skv):
    """Boolean [B, Hq, query tiles, key tiles] of block mask `mask` (uint8 [B, Hq,
    ceil(Sq/128), ceil(ceil(Skv/128)/8)]): key tile t is kept by bit t % 8,
    least significant first, of byte [b, h, r, t // 8] (graph.h)."""
    tiles = torch.arange(-(-skv // BLOCK_TILE), device=mask.device)
    return ((mask.to(torch.int64)[..., tiles // 8] >> (tiles % 8)) & 1).bool()


def block_keep_mask(mask, b, heads, rows, skv):
    """Boolean [len(heads), len(rows), skv]: what block mask `mask` keeps of
    query rows `rows` of heads `heads` (a range) of batch entry b."""
    keep = block_tile_keep(mask[b:b + 1, heads.start:heads.stop], skv)[0]
    key_tile = torch.arange(skv, device=rows.device) // BLOCK_TILE
    return keep[:, rows // BLOCK_TILE][:, :, key_tile]


def alibi_slopes_tensor(opts, device):
    """cuDNN's ALiBi slope per query head, as fusebox gives it (attrs "alibi_slopes")."""
    return torch.tensor(opts.alibi_slopes, dtype=torch.float32, device=device)


def _masked_softmax(s, keep):
    """P, row logsumexp (natural log) and row max of scores `s` [..., rows, skv]
    under `keep` (broadcast). Rows with no kept score give P = 0, stats = -inf.
    Differentiable (no NaN gradients from empty rows)."""
    s = s.masked_fill(~keep, float("-inf"))
    m = s.amax(dim=-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    l = e.sum(dim=-1, keepdim=True)
    p = e / torch.where(l > 0, l, torch.ones_like(l))
    stats = m + torch.log(l)  # -inf where the row kept nothing
    return p, stats


def _score_block(q_blk, k_h, opts, rows, heads, b, lq, lkv, ins, slopes, qk_scale):
    """Scores [g, rows, Skv] of query heads `heads` (a range) against kv head
    k_h [Skv, D], with bias and ALiBi added, and the keep mask [rows, Skv]."""
    s = torch.matmul(q_blk, k_h.transpose(-2, -1)) * qk_scale
    if "bias" in ins:
        bias = ins["bias"]
        bb = bias[b if bias.shape[0] > 1 else 0]
        bh = bb[heads.start:heads.stop] if bb.shape[0] > 1 else bb
        s = s + bh[:, rows[0].item():rows[-1].item() + 1, :].float()
    if opts.alibi:
        j = torch.arange(s.shape[-1], device=s.device, dtype=torch.float32).view(1, 1, -1)
        i = rows.to(torch.float32).view(1, -1, 1)
        s = s + slopes[heads.start:heads.stop].view(-1, 1, 1) * (j - i)
    keep = sdpa_keep_mask(opts, rows, s.shape[-1], lq, lkv)
    if "block_mask" in ins:
        keep = keep & block_keep_mask(ins["block_mask"], b, heads, rows, s.shape[-1])
    return s, keep


def _row_blocks(sq, g, skv):
    step = max(1, min(sq, SCORE_BLOCK_ELEMS // max(1, g * skv)))
    for r0 in range(0, sq, step):
        yield r0, min(sq, r0 + step)


def _dropout_keep(ins, opts):
    """With dropout: the keep-mask cuDNN drew (its dumped "dropout_mask"
    output, passed in `ins` under that role) times 1/(1-p); None without
    dropout. Without the dump, cuDNN's Philox bits cannot be reproduced."""
    if not opts.dropout:
        return None
    mask = ins.get("dropout_mask")
    if mask is None:
        raise SdpaSkip(f"dropout {opts.dropout}: no 'dropout_mask' output to reproduce cuDNN's Philox mask")
    return mask.float() / (1.0 - opts.dropout)


def _sdpa_setup(ins, op):
    """What every sdpa computation here starts from: the options, the shapes
    (B, Hq, Sq, D, Hk, Skv, Dv, g = Hq // Hk), the device, the per-batch
    lengths, the ALiBi slopes (or None) and the dropout factors (or None)."""
    q, k, v = ins["q"], ins["k"], ins["v"]
    opts = _sdpa_config(op)
    B, Hq, Sq, D = q.shape
    Hk, Skv, Dv = k.shape[1], k.shape[2], v.shape[3]
    dev = q.device
    lq_all = _lengths(ins, "seq_len_q", B, Sq, dev).tolist()
    lkv_all = _lengths(ins, "seq_len_kv", B, Skv, dev).tolist()
    slopes = alibi_slopes_tensor(opts, dev) if opts.alibi else None
    return (opts, (B, Hq, Sq, D, Hk, Skv, Dv, Hq // Hk), dev, lq_all, lkv_all, slopes,
            _dropout_keep(ins, opts))


def sdpa_forward(ins, op, fp8=False):
    """sdpa_fwd / sdpa_fp8_fwd outputs by role (float32 tensors): "o", "stats",
    and for fp8 "amax_s", "amax_o" (o already rounded to fp8_e4m3 values)."""
    ins = unpage(ins, op)
    q, k, v = (ins[r].float() for r in ("q", "k", "v"))
    opts, (B, Hq, Sq, D, Hk, Skv, Dv, g), dev, lq_all, lkv_all, slopes, keep_scale = _sdpa_setup(ins, op)
    qk_scale = opts.attn_scale
    if fp8:
        sc = {r: float(ins[r].reshape(-1)[0]) for r in
              ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")}
        qk_scale = opts.attn_scale * sc["descale_q"] * sc["descale_k"]
    # attention sinks: one fp32 logit per query head ("sink_token" [1, Hq, 1, 1])
    sink = ins["sink_token"].reshape(-1).float() if "sink_token" in ins else None
    o = torch.zeros(B, Hq, Sq, Dv, dtype=torch.float32, device=dev)
    stats = torch.full((B, Hq, Sq, 1), float("-inf"), dtype=torch.float32, device=dev)
    amax_s = torch.zeros((), dtype=torch.float32, device=dev)
    amax_o = torch.zeros((), dtype=torch.float32, device=dev)
    for b in range(B):
        lq, lkv = int(lq_all[b]), int(lkv_all[b])
        for hk in range(Hk):
            heads = range(hk * g, (hk + 1) * g)
            for r0, r1 in _row_blocks(Sq, g, Skv):
                rows = torch.arange(r0, r1, device=dev)
                s, keep = _score_block(q[b, heads.start:heads.stop, r0:r1], k[b, hk], opts, rows, heads,
                                       b, lq, lkv, ins, slopes, qk_scale)
                if sink is not None:  # one more logit per row, always kept, with no value
                    col = sink[heads.start:heads.stop].view(-1, 1, 1).expand(-1, s.shape[1], 1)
                    s = torch.cat([s, col], dim=-1)
                    keep = torch.cat([torch.broadcast_to(keep, s.shape[:-1] + (s.shape[-1] - 1,)),
                                      torch.ones(s.shape[:-1] + (1,), dtype=torch.bool, device=dev)], dim=-1)
                p, st = _masked_softmax(s, keep)
                if sink is not None:
                    p = p[..., :-1]
                stats[b, heads.start:heads.stop, r0:r1] = st
                if keep_scale is not None:  # dropout after the softmax (stats are before it)
                    p = p * keep_scale[b, heads.start:heads.stop, r0:r1]
                if not fp8:
                    o[b, heads.start:heads.stop, r0:r1] = torch.matmul(p, v[b, hk])
                    continue
                # amax over the rows that are not padding ("don't care" rows excluded)
                valid = (rows < lq) if opts.padding else torch.ones_like(rows, dtype=torch.bool)
                if valid.any():
                    amax_s = torch.maximum(amax_s, p[:, valid].amax())
                p8 = round_fp8(p * sc["scale_s"])
                big_o = sc["descale_s"] * sc["descale_v"] * torch.matmul(p8, v[b, hk])
                if valid.any():
                    amax_o = torch.maximum(amax_o, big_o[:, valid].abs().amax())
                o[b, heads.start:heads.stop, r0:r1] = round_fp8(big_o * sc["scale_o"])
    out = {"o": o, "stats": stats}
    if fp8:
        out["amax_s"] = amax_s.reshape(1, 1, 1, 1)
        out["amax_o"] = amax_o.reshape(1, 1, 1, 1)
    return out


def sdpa_backward(ins, op):
    """sdpa_bwd outputs "dq", "dk", "dv" (float32): torch autograd through the
    forward math above, from q, k, v and the given "do". The given o and stats
    are not used (cuDNN's backward reads them; they must be the forward's).
    GQA: each kv head's block is used by its g query heads through matmul
    broadcasting, so autograd sums their gradients into dk, dv. With attention
    sinks ("sink_token") the sink logit joins every row's softmax as in
    sdpa_forward, and with a "dsink_token" output its gradient comes back too."""
    q, k, v, do = (ins[r].float() for r in ("q", "k", "v", "do"))
    opts, (B, Hq, Sq, D, Hk, Skv, Dv, g), dev, lq_all, lkv_all, slopes, keep_scale = _sdpa_setup(ins, op)
    dq = torch.zeros_like(q)
    dk = torch.zeros_like(k)
    dv = torch.zeros_like(v)
    sink = None
    if "sink_token" in ins:
        sink = ins["sink_token"].reshape(-1).float().detach().clone().requires_grad_(True)
    with torch.enable_grad():
        for b in range(B):
            lq, lkv = int(lq_all[b]), int(lkv_all[b])
            for hk in range(Hk):
                heads = range(hk * g, (hk + 1) * g)
                k_h = k[b, hk].detach().clone().requires_grad_(True)
                v_h = v[b, hk].detach().clone().requires_grad_(True)
                for r0, r1 in _row_blocks(Sq, g, Skv):
                    rows = torch.arange(r0, r1, device=dev)
                    q_blk = q[b, heads.start:heads.stop, r0:r1].detach().clone().requires_grad_(True)
                    s, keep = _score_block(q_blk, k_h, opts, rows, heads, b, lq, lkv, ins, slopes,
                                           opts.attn_scale)
                    if sink is not None:  # one more logit per row, always kept, with no value
                        col = sink[heads.start:heads.stop].view(-1, 1, 1).expand(-1, s.shape[1], 1)
                        s = torch.cat([s, col], dim=-1)
                        keep = torch.cat([torch.broadcast_to(keep, s.shape[:-1] + (s.shape[-1] - 1,)),
                                          torch.ones(s.shape[:-1] + (1,), dtype=torch.bool, device=dev)], dim=-1)
                    p, _ = _masked_softmax(s, keep)
                    if sink is not None:
                        p = p[..., :-1]
                    if keep_scale is not None:
                        p = p * keep_scale[b, heads.start:heads.stop, r0:r1]
                    o_blk = torch.matmul(p, v_h)
                    o_blk.backward(do[b, heads.start:heads.stop, r0:r1])
                    dq[b, heads.start:heads.stop, r0:r1] = q_blk.grad
                dk[b, hk] = k_h.grad
                dv[b, hk] = v_h.grad
    out = {"dq": dq, "dk": dk, "dv": dv}
    if sink is not None and "dsink_token" in op.get("outputs", {}):
        grad = sink.grad if sink.grad is not None else torch.zeros_like(sink)
        out["dsink_token"] = grad.detach().reshape(1, Hq, 1, 1)
    return out


FP8_E5M2_MAX = 57344.0

FP8_BWD_SCALE_ROLES = ("descale_q", "descale_k", "descale_v", "descale_o", "descale_do", "descale_s",
                       "descale_dp", "scale_s", "scale_dq", "scale_dk", "scale_dv", "scale_dp")


def sdpa_fp8_backward(ins, op, dtypes=None):
    """sdpa_fp8_bwd outputs by role (float32 tensors): "dq", "dk", "dv" (the
    values after the output scales, rounded to the outputs' dtypes: fp8_e4m3
    unless `dtypes` says otherwise) and "amax_dq", "amax_dk", "amax_dv",
    "amax_dp" ([1,1,1,1]). `dtypes` maps roles to dtype names ("q" and "do"
    pick the two internal roundings, "dq"/"dk"/"dv" the output roundings);
    absent: fp8_e4m3 (non-fp8 "q"/"do" also round to e4m3 inside, as fusebox).

    cuDNN's per-tensor-scaled FP8 backward (the frontend's SDPAFP8BackwardNode,
    line references in src/reference/ops/sdpa_fp8_bwd.h), with q8, k8, v8, o8,
    do8 the fp8 inputs as given and F = keep-mask / (1 - p) with dropout:
      Di   = rowsum(do8 * o8) * descale_do * descale_o
      s    = (q8 @ k8^T) * attn_scale * descale_q * descale_k, masked
      P    = exp(s - stats)                 (0 where masked)
      P8   = fp8[q's dtype](P * F * scale_s)
      dV'  = (P8^T @ do8) * descale_s * descale_do      amax_dv = max|dV'|
      dP   = (do8 @ v8^T) * descale_do * descale_v
      dS   = P * (F * dP - Di) * attn_scale             amax_dp = max|dS|
      dS8  = fp8[do's dtype](dS * scale_dp)
      dQ'  = (dS8 @ k8) * descale_dp * descale_k        amax_dq = max|dQ'|
      dK'  = (dS8^T @ q8) * descale_dp * descale_q      amax_dk = max|dK'|
      dq, dk, dv = fp8[output dtype](dQ' * scale_dq, dK' * scale_dk, dV' * scale_dv)
    dK', dV' are summed over the query heads sharing a kv head (GQA). Every
    rounding saturates and rounds to nearest even. No bias, no ALiBi."""
    dtypes = dtypes or {}
    q, k, v, o, do, stats = (ins[r].float() for r in ("q", "k", "v", "o", "do", "stats"))
    if _sdpa_config(op).alibi or "bias" in ins:
        raise SdpaSkip("sdpa_fp8_bwd with bias or ALiBi: not supported (cuDNN's FP8 backward has neither)")
    opts, (B, Hq, Sq, D, Hk, Skv, Dv, g), dev, lq_all, lkv_all, _, keep_scale = _sdpa_setup(ins, op)
    sc = {r: float(ins[r].reshape(-1)[0]) for r in FP8_BWD_SCALE_ROLES}
    p_round = lambda t: round_to_dtype(t, "fp8_e5m2" if dtypes.get("q") == "fp8_e5m2" else "fp8_e4m3")
    ds_round = lambda t: round_to_dtype(t, "fp8_e5m2" if dtypes.get("do") == "fp8_e5m2" else "fp8_e4m3")
    attn_scale = opts.attn_scale
    qk_scale = attn_scale * sc["descale_q"] * sc["descale_k"]
    # Di per query row, [B, Hq, Sq, 1]
    di = (do * o).sum(dim=-1, keepdim=True) * (sc["descale_do"] * sc["descale_o"])
    big_dq = torch.zeros(B, Hq, Sq, D, dtype=torch.float32, device=dev)
    big_dk = torch.zeros(B, Hk, Skv, D, dtype=torch.float32, device=dev)
    big_dv = torch.zeros(B, Hk, Skv, Dv, dtype=torch.float32, device=dev)
    amax_dp = torch.zeros((), dtype=torch.float32, device=dev)
    zero = torch.zeros((), dtype=torch.float32, device=dev)
    for b in range(B):
        lq, lkv = int(lq_all[b]), int(lkv_all[b])
        for hk in range(Hk):
            heads = range(hk * g, (hk + 1) * g)
            hs = slice(heads.start, heads.stop)
            for r0, r1 in _row_blocks(Sq, g, Skv):
                rows = torch.arange(r0, r1, device=dev)
                q_blk = q[b, hs, r0:r1]                                     # [g, rows, D]
                s, keep = _score_block(q_blk, k[b, hk], opts, rows, heads, b, lq, lkv, ins, None, qk_scale)
                p = torch.where(keep, torch.exp(s - stats[b, hs, r0:r1]), zero)  # [g, rows, Skv]
                f = keep_scale[b, hs, r0:r1] if keep_scale is not None else None
                pf = p * f if f is not None else p
                p8 = p_round(pf * sc["scale_s"])
                do_blk = do[b, hs, r0:r1]                                   # [g, rows, Dv]
                big_dv[b, hk] += torch.matmul(p8.transpose(-2, -1), do_blk).sum(dim=0) \
                    * (sc["descale_s"] * sc["descale_do"])
                dp = torch.matmul(do_blk, v[b, hk].transpose(-2, -1)) * (sc["descale_do"] * sc["descale_v"])
                fdp = dp * f if f is not None else dp
                ds = torch.where(keep, p * (fdp - di[b, hs, r0:r1]) * attn_scale, zero)
                if ds.numel():
                    amax_dp = torch.maximum(amax_dp, ds.abs().amax())
                ds8 = ds_round(ds * sc["scale_dp"])
                big_dq[b, hs, r0:r1] = torch.matmul(ds8, k[b, hk]) * (sc["descale_dp"] * sc["descale_k"])
                big_dk[b, hk] += torch.matmul(ds8.transpose(-2, -1), q_blk).sum(dim=0) \
                    * (sc["descale_dp"] * sc["descale_q"])

    def amax(t):
        return (t.abs().amax() if t.numel() else zero).reshape(1, 1, 1, 1)

    out = {"amax_dq": amax(big_dq), "amax_dk": amax(big_dk), "amax_dv": amax(big_dv),
           "amax_dp": amax_dp.reshape(1, 1, 1, 1)}
    for role, big in (("dq", big_dq), ("dk", big_dk), ("dv", big_dv)):
        out[role] = round_to_dtype(big * sc["scale_" + role], dtypes.get(role, "fp8_e4m3"))
    return out


def round_fp8_e5m2(t):
    """float32 -> nearest fp8_e5m2 value (saturating at +-57344) -> float32."""
    return t.clamp(-FP8_E5M2_MAX, FP8_E5M2_MAX).to(torch.float8_e5m2).to(torch.float32)


def round_to_dtype(t, dtype):
    """float32 tensor rounded to graph dtype `dtype` and back (fp32, ints: unchanged)."""
    if dtype == "fp8_e4m3":
        return round_fp8(t)
    if dtype == "fp8_e5m2":
        return round_fp8_e5m2(t)
    if dtype == "bf16":
        return t.to(torch.bfloat16).to(torch.float32)
    if dtype == "fp16":
        return t.to(torch.float16).to(torch.float32)
    return t


def round_fp8(t):
    """float32 -> nearest fp8_e4m3 value (saturating at +-448, as cuDNN's
    conversions do; torch's own cast would give NaN past the range) -> float32."""
    return t.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)


def sdpa_care_masks(op, ins, out_dims):
    """Per output role, a boolean tensor broadcastable to the output: False
    where the value is "don't care" (graph.h): query rows i >= seq_len_q[b],
    rows with no kept key at all (their softmax is empty), and for sdpa_bwd
    and sdpa_fp8_bwd dk/dv rows j >= seq_len_kv[b]. Roles absent from the result have no
    don't-care elements."""
    q = ins["q"]
    opts = _sdpa_config(op)
    B, Hq, Sq, _ = q.shape
    Skv = int(op["attrs"]["max_seq_len_kv"]) if op["attrs"].get("paged") else ins["k"].shape[2]
    dev = q.device
    lq_all = _lengths(ins, "seq_len_q", B, Sq, dev).tolist()
    lkv_all = _lengths(ins, "seq_len_kv", B, Skv, dev).tolist()
    blocks = ins.get("block_mask")
    rows_ok = torch.zeros(B, Hq if blocks is not None else 1, Sq, 1, dtype=torch.bool, device=dev)
    keys_ok = torch.zeros(B, 1, Skv, 1, dtype=torch.bool, device=dev)
    rows = torch.arange(Sq, device=dev)
    for b in range(B):
        lq, lkv = int(lq_all[b]), int(lkv_all[b])
        # a row is cared for if it keeps at least one key (for padding, this also needs i < lq;
        # with a block mask, per head: its tiles may drop every key of a row)
        any_kept = torch.zeros(rows_ok.shape[1], Sq, dtype=torch.bool, device=dev)
        for r0, r1 in _row_blocks(Sq, rows_ok.shape[1], Skv):
            keep = sdpa_keep_mask(opts, rows[r0:r1], Skv, lq, lkv)
            if blocks is not None:
                keep = keep & block_keep_mask(blocks, b, range(Hq), rows[r0:r1], Skv)
            any_kept[:, r0:r1] = keep.any(dim=-1)
        if opts.padding:
            any_kept &= rows < lq
        rows_ok[b, :, :, 0] = any_kept
        keys_ok[b, 0, :, 0] = torch.arange(Skv, device=dev) < (lkv if opts.padding else Skv)
    if op["op"] in SDPA_BWD_OPS:
        # sdpa_fp8_bwd's amax_* outputs have no don't-care elements
        return {"dq": rows_ok, "dk": keys_ok, "dv": keys_ok}
    return {"o": rows_ok, "stats": rows_ok}


def embedding(ins):
    """fusebox's embedding op: y[n] = table[ids[n]] + add[n % P], rows of H; in the
    inputs' dtype (torch adds bf16 in fp32 and rounds once, as fusebox's kernel)."""
    ids = ins["ids"].reshape(-1)
    if ids.dtype not in (torch.int32, torch.int64):  # F.embedding takes either: no cast kernel for them
        ids = ids.long()
    table = ins["table"].reshape(ins["table"].shape[0], -1)
    y = torch.nn.functional.embedding(ids, table)
    if "add" in ins:
        add = ins["add"].reshape(ins["add"].shape[0], -1)
        p, h = add.shape
        y = (y.view(-1, p, h) + add.to(y.dtype)[None]).view(-1, h)
    return y.reshape(ids.numel(), -1, 1, 1)


def embedding_backward(ins, op):
    """fusebox's embedding_bwd: dtable[v] = sum of dy[n] over ids[n] = v, in fp32
    (index_add_, as autograd's embedding backward sums)."""
    ids = ins["ids"].reshape(-1).long()
    dy = ins["dy"].reshape(ids.numel(), -1).float()
    rows = op["attrs"]["vocab"]
    keep = (ids >= 0) & (ids < rows)
    dtable = torch.zeros(rows, dy.shape[1], dtype=torch.float32, device=dy.device)
    dtable.index_add_(0, ids[keep], dy[keep])
    return {"dtable": dtable.reshape(rows, -1, 1, 1)}


def rope_forward(x, freqs, offset, layout, rope_dim, scale):
    """Rotary position embedding the way model code writes it (not fusebox's
    formulas): x [B, H, S, D]; freqs [1, 1, P, R/2] angles; the trailing R
    values of the head dim rotate, the leading D - R pass through; "half"
    rotates with rotate_half (Hugging Face's Llama), "interleaved" multiplies
    consecutive pairs as complex numbers (Meta's Llama). Returns float32."""
    x = x.float()
    b, _, s, d = x.shape
    r = rope_dim or d
    pos = torch.arange(s, device=x.device)[None, :]
    if offset is not None:
        pos = pos + offset.reshape(b, 1).long()
    theta = freqs.float().reshape(freqs.shape[2], -1)[pos]  # [B, S, R/2]
    theta = theta[:, None]  # [B, 1, S, R/2]
    keep, rot = x[..., :d - r], x[..., d - r:]
    if layout == "interleaved":
        z = torch.view_as_complex(rot.double().reshape(*rot.shape[:-1], r // 2, 2).contiguous())
        rot = torch.view_as_real(z * torch.polar(torch.ones_like(theta.double()), theta.double()))
        rot = rot.reshape(*x.shape[:-1], r).float()
    else:
        cos, sin = torch.cos(theta).repeat(1, 1, 1, 2), torch.sin(theta).repeat(1, 1, 1, 2)
        half = torch.cat((-rot[..., r // 2:], rot[..., :r // 2]), dim=-1)
        rot = rot * cos + half * sin
    return scale * torch.cat((keep, rot), dim=-1)


def rope(ins, op):
    """rope: y; rope_bwd: dx, the gradient autograd takes through rope_forward."""
    a = op["attrs"]
    args = (ins["freqs"], ins.get("offset"), a["layout"], a["rope_dim"], float(a["scale"]))
    if op["op"] == "rope":
        return {"y": rope_forward(ins["x"], *args)}
    dy = ins["dy"].float()
    x = torch.zeros_like(dy, requires_grad=True)  # rope is linear in x: any x gives the same gradient
    (dx,) = torch.autograd.grad(rope_forward(x, *args), x, dy)
    return {"dx": dx}


def cross_entropy(ins, op):
    """cross_entropy: loss (and lse) per row by F.cross_entropy (no reduction) and torch.logsumexp.
    cross_entropy_bwd: dlogits = (exp(logits - lse) - one_hot(labels)) * dloss with the lse it is
    given (an input, as the op defines it: random in a cross-check); when lse is the forward's, this
    is autograd's gradient of sum(dloss * F.cross_entropy), which it is checked against then."""
    a = op["attrs"]
    logits = ins["logits"].float().reshape(ins["logits"].shape[0], -1)
    labels = ins["labels"].reshape(-1).long()
    ignore = int(a["ignore_index"])
    shape = (logits.shape[0], 1, 1, 1)
    if op["op"] == "cross_entropy":
        loss = F.cross_entropy(logits, labels, reduction="none", ignore_index=ignore)
        return {"loss": loss.reshape(shape), "lse": torch.logsumexp(logits, dim=1).reshape(shape)}
    lse, dloss = ins["lse"].float().reshape(-1, 1), ins["dloss"].float().reshape(-1, 1)
    kept = labels != ignore
    onehot = F.one_hot(torch.where(kept, labels, 0), logits.shape[1]).float()
    dx = (torch.exp(logits - lse) - onehot) * dloss * kept[:, None]
    own = torch.logsumexp(logits, dim=1, keepdim=True)
    if torch.allclose(lse, own, rtol=1e-5, atol=1e-5):  # the forward's lse: autograd must agree
        x = logits.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(F.cross_entropy(x, labels, reduction="none", ignore_index=ignore), x,
                                   dloss.reshape(-1))
        assert torch.allclose(dx, g, rtol=1e-4, atol=1e-6), "cross_entropy_bwd: formula and autograd disagree"
    return {"dlogits": dx.reshape(ins["logits"].shape)}


def quantize(ins, op, dtypes):
    """quantize: y = fp8(x * scale), the product in fp32, saturated to the format's largest finite
    value (torch's own cast turns an overflow into NaN, so clamp first), rounded to nearest even by
    torch's float8 cast; y2 (a second copy in its own layout) holds the same values; amax = max |x|
    (of x, not of the scaled values)."""
    x = ins["x"].float()
    e5m2 = (dtypes or {}).get("y") == "fp8_e5m2"
    fmt, top = (torch.float8_e5m2, 57344.0) if e5m2 else (torch.float8_e4m3fn, 448.0)
    y = (x * ins["scale"].float().reshape(-1)[0]).clamp(-top, top).to(fmt).float()
    return {"y": y, "y2": y, "amax": x.abs().amax().reshape([1] * x.dim())}


def _outputs_of(res, op):
    return {r: res[r] for r in op["outputs"] if r in res}


# The torch version of every op type `fusebox ops --json` lists, keyed by the same names:
# fn(op, ins, dtypes) -> a tensor (the "y" output) or a dict output role -> tensor.
# tests/python/test_torch_ops_table.py checks that the two lists agree.
TORCH_OPS = {
    "sdpa_fwd": lambda op, ins, dtypes: _outputs_of(sdpa_forward(ins, op), op),
    "sdpa_fp8_fwd": lambda op, ins, dtypes: _outputs_of(sdpa_forward(ins, op, fp8=True), op),
    "sdpa_bwd": lambda op, ins, dtypes: sdpa_backward(ins, op),
    "sdpa_fp8_bwd": lambda op, ins, dtypes: _outputs_of(sdpa_fp8_backward(ins, op, dtypes), op),
    "layernorm": lambda op, ins, dtypes: layernorm(ins, op),
    "rmsnorm": lambda op, ins, dtypes: rmsnorm(ins, op),
    "layernorm_bwd": lambda op, ins, dtypes: norm_backward(ins, op),
    "rmsnorm_bwd": lambda op, ins, dtypes: norm_backward(ins, op),
    "batchnorm": lambda op, ins, dtypes: batchnorm(ins, op),
    "batchnorm_inference": lambda op, ins, dtypes: batchnorm_inference(ins, op),
    "batchnorm_bwd": lambda op, ins, dtypes: batchnorm_backward(ins, op),
    "embedding": lambda op, ins, dtypes: embedding(ins),
    "embedding_bwd": lambda op, ins, dtypes: embedding_backward(ins, op),
    "rope": lambda op, ins, dtypes: rope(ins, op),
    "rope_bwd": lambda op, ins, dtypes: rope(ins, op),
    "cross_entropy": lambda op, ins, dtypes: _outputs_of(cross_entropy(ins, op), op),
    "cross_entropy_bwd": lambda op, ins, dtypes: cross_entropy(ins, op),
    "conv_fprop": lambda op, ins, dtypes: conv(ins["x"], ins["w"], op),
    "conv_dgrad": lambda op, ins, dtypes: {"dx": conv_dgrad(ins["dy"], ins["w"], op, ins.get("x"))},
    "conv_wgrad": lambda op, ins, dtypes: {"dw": conv_wgrad(ins["dy"], ins["x"], op, ins.get("w"))},
    "matmul": lambda op, ins, dtypes: torch.matmul(ins["a"], ins["b"]),
    "transpose": lambda op, ins, dtypes: ins["x"].permute(*op["attrs"]["permutation"]).contiguous(),
    "quantize": lambda op, ins, dtypes: _outputs_of(quantize(ins, op, dtypes), op),
    **{kind: (lambda op, ins, dtypes: pool(ins, op)) for kind in POOL_OPS},
    **{kind: (lambda op, ins, dtypes: reduction(ins["x"], op)) for kind in REDUCTION_OPS},
    **{kind: (lambda op, ins, dtypes, f=f: f(ins)) for kind, f in _POINTWISE.items()},
}


def apply_op(op, ins, dtypes=None):
    """`op` is an op of check --json, `ins` maps its input roles to tensors;
    `dtypes` (optional) maps its input and output roles to dtype names (used
    by sdpa_fp8_bwd: its internal and output fp8 roundings).
    Returns a tensor (the "y" output), or for the sdpa, norm and batchnorm ops a dict
    output role -> float32 tensor. Raises SdpaSkip for what torch cannot reproduce
    (dropout), ValueError naming an op type with no torch version."""
    fn = TORCH_OPS.get(op["op"])
    if fn is None:
        raise ValueError(f"op {op['name']!r}: no torch version of {op['op']!r} (fusebox_tools.core.torch_ops.TORCH_OPS "
                         f"has {len(TORCH_OPS)} op types; add one)")
    return fn(op, ins, dtypes)
