"""The Python module `fusebox` against the CLI on the GPU (issue 15's "done when").

    python3 -m fusebox_tools.crosscheck.pymod_check [--fusebox BIN] [--json-out F] [--no-overhead | --overhead-only] [GRAPH ...]

For every example graph (default: examples/graphs and examples/graphs/small,
not invalid_*): one plan built through `fusebox.Session` and saved as a plan
file; the same random inputs (fusebox_tools.crosscheck.crosscheck.make_inputs, seeded)
fed to `fusebox run GRAPH --plan FILE --inputs ... --save-outputs DIR` and to
`plan(**tensors)` on torch tensors laid out as the graph declares them; every
output compared bit for bit (NaN equal to NaN). Graphs whose outputs are not
bit-reproducible run to run by design (SDPA backward without its
deterministic algorithm, reductions: docs/graph-format.md) are compared
within their tolerance instead, and say so; graphs with dropout but no
dumped mask are skipped (no two runs agree).

Then the host cost of one call from Python (time.perf_counter around N calls
with no synchronization in between, then one synchronize; per call), on
conv_bias_relu_small: `plan(**tensors)`, the `fusebox.torch_op` custom op,
and PyTorch's own ops for the same work (F.conv2d + bias + relu).
Exit 0 when every compared graph matches.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from fusebox_tools.crosscheck.crosscheck import has_dropout, make_inputs, save_input
from fusebox_tools.core.graph import Graph as ToolsGraph
from fusebox_tools.core.graph import fusebox_bin

REPO = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
NOT_BIT_REPRODUCIBLE = ("reduce_sum", "reduce_max", "reduce_min", "reduce_amax", "reduce_mean")


def default_graphs():
    paths = sorted(glob.glob(os.path.join(REPO, "examples", "graphs", "*.json")))
    paths += sorted(glob.glob(os.path.join(REPO, "examples", "graphs", "small", "*.json")))
    return [p for p in paths if not os.path.basename(p).startswith("invalid_")]


def reproducible(tg):
    for op in tg.ops:
        if op["op"] in NOT_BIT_REPRODUCIBLE:
            return False, f"{op['op']} adds partial sums in no fixed order"
        if op["op"] in ("sdpa_bwd", "sdpa_fp8_bwd") and not op["attrs"].get("deterministic"):
            return False, f"{op['op']} accumulates dq with atomics"
    return True, ""


def check_graph(fusebox, path, seed, work):
    import torch

    import fusebox as fb
    from fusebox._tensors import torch_dtype

    name = os.path.basename(path)[:-5]
    row = {"graph": name}
    tg = ToolsGraph.load(path, fusebox)
    if has_dropout(tg):
        row.update(status="skipped", why="dropout without a dumped mask: no two runs agree")
        return row
    inputs = make_inputs(tg, seed, "cuda")
    d = os.path.join(work, name)
    os.makedirs(os.path.join(d, "in"), exist_ok=True)
    files = {}
    for n, t in inputs.items():
        files[n] = os.path.join(d, "in", f"{n}.npy")
        save_input(files[n], t, tg.dtype(n))
    g = fb.Graph.from_json(path)
    session = check_graph.session
    plan = session.build(g)
    plan_file = os.path.join(d, "plan.fbplan")
    plan.save(plan_file)
    row.update(engine=plan.engine, plan_source=plan.source)
    cmd = [fusebox, "run", path, "--plan", plan_file, "--iters", "0", "--save-outputs", os.path.join(d, "out"),
           "--inputs", ",".join(f"{n}={f}" for n, f in files.items())]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        row.update(status="fail", why=f"fusebox run exited {p.returncode}: {p.stderr.strip()[-400:]}")
        return row
    tensors = {}
    for t in g.inputs:
        x = g.empty(t.name)
        x.copy_(inputs[t.name].to(x.dtype))  # copy_ lays the logical values out in the graph's strides
        tensors[t.name] = x
    for t in g.outputs:
        y = g.empty(t.name)
        try:  # poisoned, so an output the plan does not write cannot match by accident
            y.fill_(float("nan") if torch_dtype(t.dtype).is_floating_point else -1)
        except RuntimeError:
            y.view(torch.uint8).fill_(0xFF)
        tensors[t.name] = y
    plan(**tensors)
    torch.cuda.synchronize()
    exact, why = reproducible(tg)
    row["compared"] = "bit for bit" if exact else f"within tolerance ({why})"
    ok, worst = True, []
    for t in g.outputs:
        f = os.path.join(d, "out", f"{t.name}.npy")
        if not os.path.exists(f):
            continue  # e.g. a dropout mask fusebox run does not save
        cli = np.load(f)
        mod = tensors[t.name].to(torch.float32 if tensors[t.name].is_floating_point() else torch.int64).cpu().numpy()
        cli = cli.astype(mod.dtype).reshape(mod.shape)
        if exact:
            same = np.array_equal(cli, mod, equal_nan=True)
            if not same:
                differ = int(np.sum(~((cli == mod) | (np.isnan(cli) & np.isnan(mod)))))
                worst.append(f"{t.name}: {differ} of {cli.size} elements differ")
            ok &= same
        else:
            ref = cli.astype(np.float64)
            rel = float(np.linalg.norm(mod.astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-30))
            worst.append(f"{t.name}: rel_l2 {rel:.1e}")
            ok &= rel <= 1e-2
    row.update(status="pass" if ok else "fail", outputs=[t.name for t in g.outputs], details=worst)
    return row


def host_overhead(fusebox, calls=2000):
    """Host µs per call, conv_bias_relu_small: the module's plan call, the custom op, PyTorch's ops."""
    import torch
    import torch.nn.functional as F

    import fusebox as fb

    path = os.path.join(REPO, "examples", "graphs", "small", "conv_bias_relu_small.json")
    g = fb.Graph.from_json(path)
    plan = check_graph.session.build(g)
    t = {n.name: g.empty(n.name).normal_() if n.name != "y" else g.empty(n.name) for n in g.tensors}
    op = fb.torch_op(g, name="fusebox_check::conv_bias_relu_small", plan=plan)
    x, w, b = t["x"], t["w"], t["b"]
    # torch's own ops on the same data (NCHW logical, channels_last memory, like the graph)
    xs = x.to(torch.bfloat16)
    ws = w.to(torch.bfloat16)
    bs = b.reshape(-1).to(torch.bfloat16)
    spec = json.load(open(path))
    conv = next(o for o in spec["ops"] if o["op"] == "conv_fprop")
    pad, stride = conv.get("padding", [1, 1]), conv.get("stride", [1, 1])

    def torch_call():
        return F.relu(F.conv2d(xs, ws, bs, stride=stride, padding=pad))

    args = [t[n.name] for n in g.inputs]
    variants = {"fusebox plan(**tensors)": lambda: plan(**t), "fusebox torch_op (custom op)": lambda: op(*args),
                "torch F.conv2d + bias + F.relu": torch_call}
    out = {}
    with torch.inference_mode():
        for label, fn in variants.items():
            for _ in range(50):
                fn()
            torch.cuda.synchronize()
            samples = []
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                samples.append((t1 - t0) / calls * 1e6)
            out[label] = {"host_us_per_call_median": float(np.median(samples)), "samples": samples}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("graphs", nargs="*")
    ap.add_argument("--fusebox", help="fusebox binary (default: $FUSEBOX_BIN, else build/fusebox)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json-out")
    ap.add_argument("--no-overhead", action="store_true", help="check the graphs only")
    ap.add_argument("--overhead-only", action="store_true",
                    help="measure the host cost only (on a quiet GPU: run it apart from other work)")
    a = ap.parse_args(argv)
    import fusebox as fb

    fusebox = fusebox_bin(a.fusebox)
    check_graph.session = fb.Session(device=0)
    rows = []
    with tempfile.TemporaryDirectory(prefix="pymod_check_") as work:
        for path in [] if a.overhead_only else a.graphs or default_graphs():
            try:
                row = check_graph(fusebox, path, a.seed, work)
            except Exception as e:  # one graph's failure is reported, the others still run
                row = {"graph": os.path.basename(path), "status": "fail", "why": f"{type(e).__name__}: {e}"}
            rows.append(row)
            if a.json_out:  # after every graph, so a run cut off by a time limit keeps what it did
                with open(a.json_out, "w") as f:
                    json.dump({"rows": rows}, f, indent=1)
            print(f"{row['status']:<8} {row['graph']:<34} {row.get('compared', '')} "
                  f"{'; '.join(row.get('details', [])) if row['status'] == 'fail' else ''}{row.get('why', '')}"[:300],
                  flush=True)
    doc = {"rows": rows}
    if not a.no_overhead:
        doc["host_overhead"] = host_overhead(fusebox)
        for k, v in doc["host_overhead"].items():
            print(f"host cost per call: {k:<32} {v['host_us_per_call_median']:.2f} us")
    counts = {s: sum(r["status"] == s for r in rows) for s in ("pass", "fail", "skipped")}
    print(f"pymod_check: {counts['pass']} match, {counts['fail']} failed, {counts['skipped']} skipped")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(doc, f, indent=1)
    return 1 if counts["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
