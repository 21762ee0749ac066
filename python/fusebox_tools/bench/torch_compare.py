"""Times fusebox against the same computation done the framework way in PyTorch.

For each graph: `fusebox run GRAPH --warmup W --iters N --json` (its
latency_ms.median / min), then the graph's ops as separate eager PyTorch ops in
the graph's dtypes and memory layouts (its strides: NHWC conv inputs are
channels_last, as a model moved to channels_last would run), then the same function under torch.compile (skipped,
with the reason, if it fails). Torch is timed with CUDA events: W warm-up
calls, then N calls timed one by one; median and min. Prints a markdown table.

Shapes, strides, dtypes and the FLOP count are fusebox's (`fusebox check
--json`). Graphs with an sdpa op go to fusebox_tools.bench.sdpa_compare instead: torch's scaled_dot_product_attention with the
cuDNN and flash backends, inference/training forward or backward only, one
FLOP count for everyone; they get their own table.

    python3 -m fusebox_tools.bench.torch_compare [GRAPH.json ...] [--fusebox build/fusebox]
                                           [--markdown-out FILE] [--json-out FILE]
"""
import argparse
import datetime
import json
import os
import sys
import traceback

import torch

from fusebox_tools.bench import sdpa_compare
from fusebox_tools.core.graph import FuseboxError, Graph, fusebox_bin
from fusebox_tools.core.torch_ops import apply_op

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def default_graphs():
    """examples/graphs/*.json (not small/, not invalid_*)."""
    from fusebox_tools.core.graph import default_graphs as all_graphs
    return [p for p in all_graphs() if os.path.basename(os.path.dirname(p)) == "graphs"]


def make_input_sets(graph, n_sets, device):
    """Random inputs in each tensor's dtype with the graph's strides, drawn from the range fusebox
    draws them from (`check --json` random_lo/random_hi: [-1, 1] for most tensors, positive for
    variances and scales, [lo, hi] integers for int tensors), so that both sides compute on inputs
    alike and bench_run can hand a set to `fusebox run --inputs` to compare outputs."""
    from fusebox_tools.core.graph import INT_DTYPES

    int_types = {"int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8}
    sets = []
    gen = torch.Generator(device=device).manual_seed(1234)
    for _ in range(n_sets):
        s = {}
        for name in graph.inputs():
            dt_name = graph.dtype(name)
            lo, hi = graph.random_range(name)
            if dt_name in INT_DTYPES:
                t = torch.empty_strided(graph.dims[name], graph.strides(name), dtype=int_types[dt_name], device=device)
                t.copy_(torch.randint(int(lo), int(hi) + 1, graph.dims[name], generator=gen, device=device))
            else:
                dt = TORCH_DTYPES.get(dt_name, torch.float32)
                t = torch.empty_strided(graph.dims[name], graph.strides(name), dtype=dt, device=device)
                t.copy_(torch.rand(graph.dims[name], generator=gen, device=device) * (hi - lo) + lo)
            s[name] = t
        sets.append(s)
    return sets


def make_eager_fn(graph):
    """fn(inputs) running the graph's ops as separate eager ops; returns the outputs."""
    scalars = {n: float(graph.scalar_value(n)) for n in graph.tensors if graph.is_scalar(n)}
    outputs = graph.outputs()
    ops = graph.ops

    def fn(inputs):
        vals = dict(inputs)
        vals.update(scalars)
        for op in ops:
            i = {role: vals[t] for role, t in op["inputs"].items()}
            # conv backward: the real tensor of the other operand (bench_run puts one per set under
            # "_x:OP" / "_w:OP", in the graph's layout), as autograd hands it to aten
            for role in ("x", "w"):
                if f"_{role}:{op['name']}" in vals:
                    i.setdefault(role, vals[f"_{role}:{op['name']}"])
            res = apply_op(op, i)
            if not isinstance(res, dict):
                res = {"y": res}
            for role, name in op["outputs"].items():
                vals[name] = res[role]
        return [vals[o] for o in outputs]

    return fn


# Per-call latencies in ms, CUDA events around each call, inputs rotated.
time_cuda = sdpa_compare.time_cuda


def time_fusebox(fusebox, path, warmup, iters, timeout_s):
    """`fusebox run --json` latency of a graph with fusebox's own inputs."""
    return sdpa_compare.time_fusebox(fusebox, path, {}, warmup, iters, timeout_s)


def fmt_us(t):
    return f"{t['median'] * 1e3:.1f} ({t['min'] * 1e3:.1f})" if t else "-"


def fmt_tflops(flops, t):
    return f"{flops / (t['median'] * 1e-3) / 1e12:.1f}" if t else "-"


def fmt_ratio(num, den):
    return f"{num['median'] / den['median']:.2f}x" if num and den else "-"


def bench_graph(path, args, graph):
    row = {"graph": graph.name, "path": path, "flops": graph.flops, "bytes": graph.bytes, "notes": []}
    row["fusebox"], err = time_fusebox(args.fusebox, path, args.warmup, args.iters, args.timeout)
    if err:
        row["notes"].append(f"fusebox: {err}")

    n_sets = args.rotate or graph.doc["rotation_sets"]  # fusebox's rule (input_rotation_sets)
    row["input_sets"] = n_sets
    fn = make_eager_fn(graph)
    row["eager"] = row["compiled"] = None
    try:
        with torch.no_grad():
            sets = make_input_sets(graph, n_sets, "cuda")
            row["eager"] = time_cuda(fn, sets, args.warmup, args.iters)
    except Exception as e:
        row["notes"].append(f"eager: {type(e).__name__}: {e}")
        sets = None
    if sets is not None and not args.no_compile:
        try:
            with torch.no_grad():
                compiled = torch.compile(fn, dynamic=False)
                compiled(sets[0])  # compile outside the timed region
                row["compiled"] = time_cuda(compiled, sets, args.warmup, args.iters)
        except Exception as e:
            msg = str(e).strip().splitlines()
            row["notes"].append(f"torch.compile skipped: {type(e).__name__}: "
                                f"{msg[0] if msg else ''}")
            if args.verbose:
                traceback.print_exc()
    del sets
    torch.cuda.empty_cache()
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("graphs", nargs="*", help="graph JSON files (default: examples/graphs/*.json)")
    ap.add_argument("--fusebox", help="fusebox binary (default: $FUSEBOX_BIN, else build/fusebox)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--rotate", type=int, default=0,
                    help="input sets rotated for torch (default: enough to overflow L2)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per fusebox run")
    ap.add_argument("--markdown-out", help="also write the report to this file")
    ap.add_argument("--json-out", help="write all numbers to this file")
    ap.add_argument("--verbose", action="store_true")
    sdpa_compare.add_args(ap)
    args = ap.parse_args()
    try:
        args.fusebox = fusebox_bin(args.fusebox)
    except FuseboxError as e:
        print(f"torch_compare: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("torch_compare: torch sees no GPU", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True  # the framework's own autotuning, as a model would use
    graphs = args.graphs or default_graphs()

    rows, sdpa_rows = [], []
    for path in graphs:
        print(f"torch_compare: {os.path.basename(path)} ...", file=sys.stderr, flush=True)
        try:
            graph = Graph.load(path, args.fusebox)
            if sdpa_compare.is_sdpa_graph(graph):
                sdpa_rows.extend(sdpa_compare.bench_sdpa_graph(path, args, graph))
                continue
            rows.append(bench_graph(path, args, graph))
        except Exception as e:  # one broken graph must not stop the others
            traceback.print_exc()
            rows.append({"graph": os.path.basename(path), "path": path, "flops": 0, "bytes": 0,
                         "fusebox": None, "eager": None, "compiled": None, "input_sets": 0,
                         "notes": [f"error: {type(e).__name__}: {e}"]})

    cudnn_v = torch.backends.cudnn.version()
    lines = [
        "# fusebox vs PyTorch",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- GPU: {torch.cuda.get_device_name(0)}",
        f"- torch {torch.__version__}, cuDNN {cudnn_v} (torch's), CUDA {torch.version.cuda}",
        f"- {args.warmup} warm-up calls, then {args.iters} timed one by one (CUDA events for torch; "
        f"fusebox's own timing); times are median (min) in microseconds",
        "- torch: the graph's ops as separate eager ops in the io dtype, conv tensors channels_last, "
        "cudnn.benchmark on, TF32 off; torch.compile default mode",
        "",
        "| graph | GFLOP | fusebox us | torch eager us | torch.compile us | speedup vs eager "
        "| speedup vs compile | fusebox TFLOP/s | eager TFLOP/s | compile TFLOP/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        fb, ea, co = r["fusebox"], r["eager"], r["compiled"]
        lines.append(f"| {r['graph']} | {r['flops'] / 1e9:.1f} | {fmt_us(fb)} | {fmt_us(ea)} | "
                     f"{fmt_us(co)} | {fmt_ratio(ea, fb)} | {fmt_ratio(co, fb)} | "
                     f"{fmt_tflops(r['flops'], fb)} | {fmt_tflops(r['flops'], ea)} | "
                     f"{fmt_tflops(r['flops'], co)} |")
    lines.append("")
    for r in rows:
        extra = [f"torch input sets rotated: {r['input_sets']}"]
        if r["fusebox"] and r["fusebox"].get("engine"):
            extra.append(f"fusebox engine: {r['fusebox']['engine']}")
        lines.append(f"- {r['graph']}: " + "; ".join(extra + r["notes"]))
    if sdpa_rows:
        lines += ["", "## SDPA: fusebox vs torch scaled_dot_product_attention", ""]
        lines += sdpa_compare.report_lines(sdpa_rows)
    report = "\n".join(lines) + "\n"
    print(report)
    if args.markdown_out:
        with open(args.markdown_out, "w", encoding="utf-8") as f:
            f.write(report)
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump({"torch": torch.__version__, "cudnn": cudnn_v,
                       "gpu": torch.cuda.get_device_name(0), "rows": rows, "sdpa_rows": sdpa_rows},
                      f, indent=2)
    return 1 if (any(r["fusebox"] is None or r["eager"] is None for r in rows)
                 or any(r.get("fusebox") is None for r in sdpa_rows)) else 0


if __name__ == "__main__":
    sys.exit(main())
