"""Times fusebox's SDPA graphs against PyTorch's scaled_dot_product_attention.

For each graph with an sdpa op (sdpa_fwd, sdpa_bwd, sdpa_fp8_fwd, sdpa_fp8_bwd;
written generically from fusebox's resolution of the graph, `fusebox check
--json`: shapes, strides, GQA, masks, padding lengths, bias, ALiBi):

  fusebox   `fusebox run GRAPH --warmup W --iters N --json` (latency_ms).
            A forward without a "stats" output is also timed as a variant
            with one (training mode), written to a temp file.
  torch     F.scaled_dot_product_attention under
            torch.nn.attention.sdpa_kernel(SDPBackend.CUDNN_ATTENTION) and
            (FLASH_ATTENTION), with EFFICIENT_ATTENTION when flash refuses
            (--all-backends: always). Inputs in the graph's dtype and memory
            memory layout (the graph's strides: bshd stays [B,S,H,D] in memory). GQA: enable_gqa=True,
            else kv heads expanded beforehand (noted). Masks: is_causal for
            top-left causal, causal_lower_right for bottom-right causal, else
            an explicit boolean mask / additive bias (padding lengths,
            sliding window, bias, ALiBi) built from the same rules as
            fusebox_tools.core.torch_ops.
  modes     forward: "inference" (torch.no_grad; fusebox without stats) and
            "training" (requires_grad inputs, so torch's forward saves the
            logsumexp; fusebox with stats). sdpa_bwd: only the backward is
            timed: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
            on a forward computed beforehand (no gradient accumulation).
            sdpa_fp8_fwd: torch fp8 inputs are tried; torch has no fp8 SDPA
            kernel in most builds, so the bf16 SDPA of the same shape is
            timed instead and marked as such.

Everyone's TFLOP/s uses the same count, fusebox's (check --json with the
padding lengths actually used): 4*B*Hq*D*(kept query/key pairs) forward
(2*B*Hq*(D+Dv) per pair), 2.5x for backward. Torch is timed with CUDA events (W warm-up calls, then N calls
timed one by one, inputs rotated to overflow L2); median (min). A backend
that refuses a configuration is reported with its reason; the run goes on.

    python3 -m fusebox_tools.bench.sdpa_compare [GRAPH.json ...] [--fusebox build/fusebox]
                                          [--json-out FILE] [--markdown-out FILE]
fusebox_tools.bench.torch_compare calls this for its sdpa graphs.
"""
import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import traceback
import warnings

import numpy as np
import torch
import torch.nn.functional as F

from fusebox_tools.core.graph import SDPA_BWD_OPS, FuseboxError, Graph, default_graphs, fusebox_bin
from fusebox_tools.core.torch_ops import alibi_slopes_tensor, block_keep_mask, gather_pages, sdpa_keep_mask

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DEVICE = "cuda"  # tests/python runs the logic on "cpu"


def is_sdpa_graph(graph):
    return bool(graph.sdpa_ops())


# ---------------------------------------------------------------- timing

def time_cuda(fn, input_sets, warmup, iters):
    """Per-call latencies in ms, CUDA events around each call, inputs rotated."""
    if DEVICE != "cuda":
        return _time_wall(fn, input_sets, warmup, iters)
    n = len(input_sets)
    for k in range(warmup):
        fn(input_sets[k % n])
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for k in range(iters):
        starts[k].record()
        fn(input_sets[k % n])
        ends[k].record()
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    return {"median": statistics.median(times), "min": min(times), "iters": iters}


def time_fusebox(fusebox, path, input_files, warmup, iters, timeout_s):
    cmd = [fusebox, "run", path, "--warmup", str(warmup), "--iters", str(iters), "--json"]
    if input_files:
        cmd += ["--inputs", ",".join(f"{n}={p}" for n, p in input_files.items())]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout_s} s: {' '.join(cmd)}"
    except OSError as e:
        return None, f"cannot run {fusebox}: {e}"
    if proc.returncode != 0:
        return None, f"exit {proc.returncode}: {proc.stderr.strip()[-400:]} ({' '.join(cmd)})"
    try:
        report = json.loads(proc.stdout)
        lat = report["latency_ms"]
        return {"median": float(lat["median"]), "min": float(lat["min"]),
                "engine": report.get("engine"), "flops_reported": report.get("flops"),
                "tflops_reported": report.get("tflops")}, None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        return None, f"unreadable --json output ({e}): {proc.stdout[:200]!r}"


def _time_wall(fn, input_sets, warmup, iters):
    import time
    for k in range(warmup):
        fn(input_sets[k % len(input_sets)])
    times = []
    for k in range(iters):
        t0 = time.perf_counter()
        fn(input_sets[k % len(input_sets)])
        times.append((time.perf_counter() - t0) * 1e3)
    return {"median": statistics.median(times), "min": min(times), "iters": iters}


# ---------------------------------------------------------------- inputs and masks

def kv_length(graph, op):
    """The op's logical key length Skv: max_seq_len_kv for a paged K/V cache
    (k is then a page pool), else k's S."""
    if op["attrs"].get("paged"):
        return int(op["attrs"]["max_seq_len_kv"])
    return graph.dims[op["inputs"]["k"]][2]


def seq_lens(graph, op, seed):
    """Per-batch lengths used by everyone: the graph's "values", else random in
    [1, S] (fixed seed; passed to fusebox with --inputs). Returns (lq, lkv, files
    to write: name -> int32 array) ; lq/lkv None without padding."""
    ins = op["inputs"]
    rng = np.random.default_rng(seed)
    if "seq_len_q" not in ins and "seq_len_kv" not in ins:
        return None, None, block_mask_arrays(graph, op, rng)
    q = graph.dims[ins["q"]]
    out, arrays = [], {}
    for role, full in (("seq_len_q", q[2]), ("seq_len_kv", kv_length(graph, op))):
        name = ins.get(role)
        if name is None:
            out.append([full] * q[0])
            continue
        vals = graph.values(name)
        if vals:
            out.append([int(x) for x in vals])
        else:
            lo, hi = graph.random_range(name)  # [1, S]
            arr = rng.integers(int(lo), int(hi) + 1, size=graph.dims[name], dtype=np.int64).astype(np.int32)
            arrays[name] = arr
            out.append([int(x) for x in arr.reshape(-1)])
    arrays.update(block_mask_arrays(graph, op, rng))
    return out[0], out[1], arrays


def block_mask_arrays(graph, op, rng):
    """{name: uint8 array} of the op's block mask when fusebox would draw it at
    random (bytes in its random range, [1, 255]), so that fusebox (--inputs)
    and torch use the same tiles; {} without one or with fixed values."""
    name = op["inputs"].get("block_mask")
    if name is None or graph.values(name):
        return {}
    lo, hi = graph.random_range(name)
    return {name: rng.integers(int(lo), int(hi) + 1, size=graph.dims[name], dtype=np.int64).astype(np.uint8)}


def block_mask_bytes(graph, op, arrays):
    """The op's block mask as a uint8 array (its fixed values, else the drawn
    ones in `arrays`), or None without one."""
    name = op["inputs"].get("block_mask")
    if name is None:
        return None
    vals = graph.values(name)
    if vals:
        return np.asarray(vals, dtype=np.uint8).reshape(graph.dims[name])
    return arrays[name]


def make_qkv(graph, op, dtype, device, gen, requires_grad=False):
    """q, k, v (and do for the backwards) as torch [B,H,S,D] tensors with the
    graph's strides (bshd: [B,S,H,D] storage). For a paged op, k and v are the
    page pools and "page_table_k", "page_table_v" shuffled int32 tables (a
    random permutation of each pool's pages)."""
    out = {}
    if op["attrs"].get("paged"):
        for role, pool in (("page_table_k", "k"), ("page_table_v", "v")):
            dims = graph.dims[op["inputs"][role]]
            pages = graph.dims[op["inputs"][pool]][0]
            perm = torch.randperm(pages, generator=gen, device=device)
            n = dims[0] * dims[2]
            out[role] = perm[torch.arange(n, device=device) % pages].reshape(dims).to(torch.int32)
        out["max_seq_len_kv"] = kv_length(graph, op)
    roles = ["q", "k", "v"] + (["do"] if op["op"] in SDPA_BWD_OPS else [])
    for role in roles:
        name = op["inputs"][role]
        t = torch.empty_strided(graph.dims[name], graph.strides(name), dtype=dtype, device=device)
        t.copy_(torch.rand(graph.dims[name], generator=gen, device=device) * 2 - 1)
        if requires_grad and role != "do":
            t.requires_grad_(True)
        out[role] = t
    return out


def torch_mask_kwargs(graph, op, lq, lkv, dtype, device, gen, blocks=None):
    """kwargs for F.scaled_dot_product_attention expressing the op's mask, and a
    note. Raises NotImplementedError for what torch cannot express (dropout
    with cuDNN's Philox stream is expressible only as dropout_p; we pass it).
    `blocks`: the block mask's bytes (block_mask_bytes), expanded into a dense
    boolean mask [B, Hq, Sq, Skv] (torch's SDPA has no block-sparse form)."""
    opts = graph.sdpa_options(op)
    q = graph.dims[op["inputs"]["q"]]
    B, Hq, Sq, _ = q
    Skv = kv_length(graph, op)
    kw = {"scale": opts.attn_scale}
    if opts.dropout:
        kw["dropout_p"] = float(opts.dropout)
    plain_causal = (opts.right_bound == 0 and opts.left_bound is None and not opts.padding
                    and not opts.bias and not opts.alibi)
    if opts.right_bound is None and opts.left_bound is None and not opts.padding \
            and not opts.bias and not opts.alibi and blocks is None:
        return kw, "no mask"
    plain_causal = plain_causal and blocks is None
    if plain_causal and (not opts.bottom_right or Sq == Skv):
        kw["is_causal"] = True
        return kw, "is_causal (top-left)"
    if plain_causal and opts.bottom_right:
        from torch.nn.attention.bias import causal_lower_right
        kw["attn_mask"] = causal_lower_right(Sq, Skv)
        return kw, "causal_lower_right"
    # Dense: boolean keep mask [B or 1, 1, Sq, Skv], plus an additive bias when needed.
    rows = torch.arange(Sq, device=device)
    lq = lq or [Sq] * B
    lkv = lkv or [Skv] * B
    per_batch = opts.padding
    keep = torch.stack([sdpa_keep_mask(opts, rows, Skv, lq[b], lkv[b])
                        for b in range(B if per_batch else 1)]).unsqueeze(1)
    notes = ["explicit boolean mask" + (" per batch (padding)" if per_batch else "")]
    if blocks is not None:
        bm = torch.as_tensor(blocks, device=device)
        keep = keep & torch.stack([block_keep_mask(bm, b, range(Hq), rows, Skv) for b in range(B)])
        notes.append("block mask expanded per tile")
    if not opts.bias and not opts.alibi:
        kw["attn_mask"] = keep
        return kw, "; ".join(notes)
    add = torch.zeros(1, 1, Sq, Skv, dtype=torch.float32, device=device)
    if opts.bias:
        bdims = graph.dims[op["inputs"]["bias"]]
        add = add + (torch.rand(bdims, generator=gen, device=device) * 2 - 1)
        notes.append("bias")
    if opts.alibi:
        slopes = alibi_slopes_tensor(opts, device).view(1, Hq, 1, 1)
        j = torch.arange(Skv, device=device, dtype=torch.float32).view(1, 1, 1, -1)
        i = rows.to(torch.float32).view(1, 1, -1, 1)
        add = add + slopes * (j - i)
        notes.append("ALiBi as an additive bias")
    add = add.masked_fill(~keep, float("-inf")).to(dtype)
    kw["attn_mask"] = add
    return kw, "; ".join(notes) + f" ({tuple(add.shape)} {str(dtype).replace('torch.', '')})"


# ---------------------------------------------------------------- torch runs

BACKENDS = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}


def backend_ctx(name):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel(getattr(SDPBackend, BACKENDS[name]))


def paged_kv(qkv):
    """k and v of make_qkv's dict as contiguous [B, H, Skv, D] caches: gathered
    through the page tables when paged (the gather is part of what is timed:
    torch's SDPA has no paged form), else as they are."""
    if "page_table_k" not in qkv:
        return qkv["k"], qkv["v"]
    skv = qkv["max_seq_len_kv"]
    return (gather_pages(qkv["k"], qkv["page_table_k"], skv), gather_pages(qkv["v"], qkv["page_table_v"], skv))


def _call(qkv, kw, gqa):
    q = qkv["q"]
    k, v = paged_kv(qkv)
    if gqa == "enable_gqa":
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)
    return F.scaled_dot_product_attention(q, k, v, **kw)


def _expand_kv(qkv, g):
    out = dict(qkv)
    for r in ("k", "v"):
        t = qkv[r].detach().repeat_interleave(g, dim=1)
        out[r] = t.requires_grad_(qkv[r].requires_grad)
    return out


def time_torch(backend, mode, graph, op, dtype, kw, n_sets, args, gqa_groups):
    """One torch configuration. Returns (timing dict or None, reason/note)."""
    dev = DEVICE
    gen = torch.Generator(device=dev).manual_seed(1234)
    train = mode in ("training", "backward")
    gqa_variants = ["enable_gqa", "expanded"] if gqa_groups > 1 else ["none"]
    reasons = []
    for gqa in gqa_variants:
        sets = None
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with backend_ctx(backend):
                    sets = []
                    for _ in range(n_sets):
                        s = make_qkv(graph, op, dtype, dev, gen, requires_grad=train)
                        if gqa == "expanded":
                            s = _expand_kv(s, gqa_groups)
                        sets.append(s)
                    if mode == "inference":
                        def fn(s):
                            with torch.no_grad():
                                return _call(s, kw, gqa)
                    elif mode == "training":
                        def fn(s):
                            with torch.enable_grad():
                                return _call(s, kw, gqa)
                    else:  # backward: forward once per set, time autograd.grad only
                        for s in sets:
                            with torch.enable_grad():
                                s["out"] = _call(s, kw, gqa)

                        def fn(s):
                            return torch.autograd.grad(s["out"], (s["q"], s["k"], s["v"]), s["do"],
                                                       retain_graph=True)
                    t = time_cuda(fn, sets, args.warmup, args.iters)
            note = "kv heads expanded (enable_gqa refused)" if gqa == "expanded" else ""
            return t, note
        except Exception as e:  # a refused backend must not stop the run
            msg = str(e).strip().splitlines()
            why = [str(w.message).strip().splitlines()[0] for w in caught
                   if "attention" in str(w.message).lower() or "kernel" in str(w.message).lower()]
            reasons.append(f"[{gqa}] {type(e).__name__}: {msg[0] if msg else ''}"
                           + (f" ({'; '.join(dict.fromkeys(why))})" if why else ""))
            if args.verbose:
                traceback.print_exc()
        finally:
            del sets
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
    return None, " / ".join(reasons)


# ---------------------------------------------------------------- one graph

def stats_variant(graph_path, op_name, out_dir, want_stats):
    """The graph file itself if its forward op `op_name` already writes "stats"
    exactly when `want_stats`; else a copy with a "stats" output added or
    removed, written under out_dir."""
    with open(graph_path, encoding="utf-8") as f:
        doc = json.load(f)
    doc = copy.deepcopy(doc)
    for op in doc["ops"]:
        if op["name"] != op_name:
            continue
        outs = op.setdefault("outputs", {})
        if ("stats" in outs) == want_stats:
            return graph_path
        if want_stats:
            name = op_name + "_bench_stats"
            outs["stats"] = name
            doc["tensors"].append({"name": name, "dtype": "fp32"})
        else:
            name = outs.pop("stats")
            doc["tensors"] = [t for t in doc["tensors"] if t["name"] != name]
    suffix = "_stats" if want_stats else "_nostats"
    doc["name"] = (doc.get("name") or "graph") + suffix
    path = os.path.join(out_dir, os.path.basename(graph_path).replace(".json", suffix + ".json"))
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    return path


def bench_sdpa_graph(path, args, graph=None):
    """Rows (one per mode) for an sdpa graph: fusebox and torch timings."""
    graph = graph or Graph.load(path, args.fusebox)
    op = graph.sdpa_ops()[0]
    notes = []
    if len(graph.ops) > 1:
        notes.append(f"graph has {len(graph.ops)} ops; torch side times only '{op['name']}'")
    kind = op["op"]
    q, k, v = (graph.dims[op["inputs"][r]] for r in ("q", "k", "v"))
    B, Hq, Sq, D = q
    Hk, Skv, Dv = k[1], kv_length(graph, op), v[3]
    lq, lkv, seq_arrays = seq_lens(graph, op, args.seed)
    work = tempfile.mkdtemp(prefix="sdpa_bench_")
    files = {}
    for name, arr in seq_arrays.items():
        files[name] = os.path.join(work, f"{name}.npy")
        np.save(files[name], arr)
    # fusebox's count with the lengths everyone uses (the whole graph's; notes say when it has more ops)
    flops = Graph.load(path, args.fusebox, files).flops if files else graph.flops
    shape = (f"B{B} Hq{Hq}" + (f" Hk{Hk}" if Hk != Hq else "") + f" Sq{Sq}"
             + (f" Skv{Skv}" if Skv != Sq else "") + f" D{D}" + (f" Dv{Dv}" if Dv != D else "")
             + f" {graph.dtype(op['inputs']['q'])}")
    opts = graph.sdpa_options(op)
    mask_desc = []
    if opts.right_bound is not None:
        mask_desc.append("causal" if opts.right_bound == 0 else f"right_bound {opts.right_bound}")
        if opts.bottom_right:
            mask_desc.append("bottom-right")
    if opts.left_bound is not None:
        mask_desc.append(f"window {opts.left_bound}")
    if opts.padding:
        mask_desc.append(f"padding lq={lq} lkv={lkv}")
    if opts.bias:
        mask_desc.append("bias")
    if opts.alibi:
        mask_desc.append("alibi")
    if opts.dropout:
        mask_desc.append(f"dropout {opts.dropout}")

    # fusebox: the graph as given, and for forwards its stats/no-stats counterpart
    has_stats = "stats" in op["outputs"]
    fb_modes = {}
    if kind in SDPA_BWD_OPS:
        fb_modes["backward"] = path
    elif args.no_stats_variant:
        fb_modes["training" if has_stats else "inference"] = path
    else:
        # inference: no stats output; training: with one (variants written to a temp dir)
        fb_modes["inference"] = stats_variant(path, op["name"], work, False)
        fb_modes["training"] = stats_variant(path, op["name"], work, True)
    rows = []
    torch_dtype = TORCH_DTYPES.get(graph.dtype(op["inputs"]["q"]))
    torch_note = ""
    if kind in ("sdpa_fp8_fwd", "sdpa_fp8_bwd"):
        torch_dtype = torch.bfloat16
        torch_note = "torch: bf16 SDPA of the same shape (torch's SDPA has no fp8 kernel)"
    n_sets = args.rotate or graph.doc["rotation_sets"]  # fusebox's rule (input_rotation_sets)
    dev_gen = torch.Generator(device=DEVICE).manual_seed(99)
    try:
        kw, mask_note = torch_mask_kwargs(graph, op, lq, lkv, torch_dtype, DEVICE, dev_gen,
                                          blocks=block_mask_bytes(graph, op, seq_arrays))
    except Exception as e:
        kw, mask_note = None, f"torch mask: {type(e).__name__}: {e}"
    modes = ["backward"] if kind in SDPA_BWD_OPS else ["inference", "training"]
    fp8_note = ""
    if kind == "sdpa_fp8_fwd" and kw is not None:
        fp8_note = try_torch_fp8(graph, op, kw, Hq // Hk)
    for mode in modes:
        row = {"graph": graph.name, "path": path, "op": kind, "mode": mode, "shape": shape,
               "mask": ", ".join(mask_desc) or "none", "flops": flops, "torch_mask": mask_note,
               "input_sets": n_sets, "notes": list(notes)}
        if torch_note:
            row["notes"].append(torch_note)
        if fp8_note:
            row["notes"].append(fp8_note)
        fb_path = fb_modes.get(mode)
        row["fusebox"] = None
        if fb_path:
            row["fusebox_graph"] = fb_path if fb_path == path else f"{path} ({mode} variant)"
            row["fusebox"], err = time_fusebox(args.fusebox, fb_path, files, args.warmup, args.iters,
                                               args.timeout)
            if err:
                row["notes"].append(f"fusebox: {err}")
        else:
            row["notes"].append("fusebox: no graph for this mode")
        for backend in ("cudnn", "flash", "efficient"):
            row[backend] = None
            if backend == "efficient" and row["flash"] is not None and not args.all_backends:
                continue
            if kw is None:
                row["notes"].append(f"torch {backend}: {mask_note}")
                continue
            print(f"sdpa_compare: {graph.name} {mode} torch {backend} ...", file=sys.stderr, flush=True)
            t, why = time_torch(backend, mode, graph, op, torch_dtype, kw, n_sets, args, Hq // Hk)
            row[backend] = t
            if why:
                row["notes"].append(f"torch {backend}: {why}" if t else f"torch {backend} refused: {why}")
                if t is None:
                    print(f"sdpa_compare: {graph.name} {mode} torch {backend} refused: {why}",
                          file=sys.stderr, flush=True)
        rows.append(row)
    if not args.keep:
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    return rows


def try_torch_fp8(graph, op, kw, groups):
    """Whether torch's SDPA takes fp8_e4m3 q, k, v (cuDNN backend), as a note."""
    try:
        dims = [graph.dims[op["inputs"][r]] for r in ("q", "k", "v")]
        qkv = [torch.zeros(d, device=DEVICE).to(torch.float8_e4m3fn) for d in dims]
        with backend_ctx("cudnn"), torch.no_grad():
            extra = {"enable_gqa": True} if groups > 1 else {}
            F.scaled_dot_product_attention(*qkv, **kw, **extra)
        return "fp8: torch's SDPA accepted fp8 inputs, but this bench times bf16 (no fp8 scales in the torch API)"
    except Exception as e:
        msg = str(e).strip().splitlines()
        return f"fp8: torch SDPA refuses fp8_e4m3 inputs ({type(e).__name__}: {msg[0] if msg else ''})"


# ---------------------------------------------------------------- report

def _tflops(flops, t):
    return flops / (t["median"] * 1e-3) / 1e12 if t else None


def report_lines(rows):
    lines = [
        "| graph | mode | shape | mask | GFLOP | fusebox us | torch cuDNN us | torch flash us "
        "| torch efficient us | fusebox TFLOP/s | cuDNN TFLOP/s | flash TFLOP/s | efficient TFLOP/s "
        "| speedup vs torch-cuDNN | speedup vs torch-flash |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def us(t):
        return f"{t['median'] * 1e3:.1f} ({t['min'] * 1e3:.1f})" if t else "-"

    def tf(r, key):
        x = _tflops(r["flops"], r.get(key))
        return f"{x:.1f}" if x is not None else "-"

    def ratio(num, den):
        return f"{num['median'] / den['median']:.2f}x" if num and den else "-"

    for r in rows:
        fb = r.get("fusebox")
        flash = r.get("flash") or r.get("efficient")
        lines.append(f"| {r['graph']} | {r['mode']} | {r['shape']} | {r['mask']} | {r['flops'] / 1e9:.4g} "
                     f"| {us(fb)} | {us(r.get('cudnn'))} | {us(r.get('flash'))} | {us(r.get('efficient'))} "
                     f"| {tf(r, 'fusebox')} | {tf(r, 'cudnn')} | {tf(r, 'flash')} | {tf(r, 'efficient')} "
                     f"| {ratio(r.get('cudnn'), fb)} | {ratio(flash, fb)}"
                     + ("" if r.get("flash") or not r.get("efficient") else " (efficient)") + " |")
    lines.append("")
    lines.append("speedup = torch median / fusebox median (> 1: fusebox faster); TFLOP/s from the same "
                 "FLOP count for everyone (4*B*Hq*D per kept query/key pair forward, 2.5x backward).")
    lines.append("")
    for r in rows:
        extra = [f"torch mask: {r['torch_mask']}", f"torch input sets: {r['input_sets']}"]
        if r.get("fusebox") and r["fusebox"].get("engine"):
            extra.append(f"fusebox engine: {r['fusebox']['engine']}")
        lines.append(f"- {r['graph']} {r['mode']}: " + "; ".join(extra + r["notes"]))
    return lines


def add_args(ap):
    ap.add_argument("--all-backends", action="store_true",
                    help="also time EFFICIENT_ATTENTION when flash works")
    ap.add_argument("--no-stats-variant", action="store_true",
                    help="time fusebox forwards only as written (by default a forward is timed "
                         "without stats for inference and with stats for training, through temp copies)")
    ap.add_argument("--seed", type=int, default=1234, help="seed for padding lengths without values")
    ap.add_argument("--keep", action="store_true", help="keep temp files (stats variants, lengths)")


def default_sdpa_graphs():
    """examples/graphs/sdpa_*.json (not small/, not invalid_*)."""
    return [p for p in default_graphs()
            if os.path.basename(p).startswith("sdpa_") and os.path.basename(os.path.dirname(p)) == "graphs"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("graphs", nargs="*", help="graph JSON files (default: examples/graphs/sdpa_*.json)")
    ap.add_argument("--fusebox", help="fusebox binary (default: $FUSEBOX_BIN, else build/fusebox)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--rotate", type=int, default=0, help="input sets rotated for torch (default: overflow L2)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per fusebox run")
    ap.add_argument("--json-out")
    ap.add_argument("--markdown-out")
    ap.add_argument("--verbose", action="store_true")
    add_args(ap)
    args = ap.parse_args()
    try:
        args.fusebox = fusebox_bin(args.fusebox)
    except FuseboxError as e:
        print(f"sdpa_compare: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("sdpa_compare: torch sees no GPU", file=sys.stderr)
        return 1
    rows = []
    for path in args.graphs or default_sdpa_graphs():
        print(f"sdpa_compare: {os.path.basename(path)} ...", file=sys.stderr, flush=True)
        try:
            rows.extend(bench_sdpa_graph(path, args))
        except Exception as e:
            print(f"sdpa_compare: {path}: {type(e).__name__}: {e}", file=sys.stderr)
            traceback.print_exc()
            rows.append({"graph": os.path.basename(path), "path": path, "mode": "-", "shape": "-",
                         "mask": "-", "flops": 0, "torch_mask": "-", "input_sets": 0,
                         "fusebox": None, "cudnn": None, "flash": None, "efficient": None,
                         "notes": [f"error: {type(e).__name__}: {e}"]})
    header = ["# fusebox SDPA vs PyTorch scaled_dot_product_attention", "",
              f"- GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}, cuDNN "
              f"{torch.backends.cudnn.version()}, CUDA {torch.version.cuda}",
              f"- {args.warmup} warm-up calls, then {args.iters} timed; median (min) in microseconds", ""]
    report = "\n".join(header + report_lines(rows)) + "\n"
    print(report)
    if args.markdown_out:
        with open(args.markdown_out, "w", encoding="utf-8") as f:
            f.write(report)
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump({"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                       "gpu": torch.cuda.get_device_name(0), "rows": rows}, f, indent=2)
    return 1 if any(r.get("fusebox") is None for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
