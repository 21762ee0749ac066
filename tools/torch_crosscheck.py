#!/usr/bin/env python3
"""Cross-checks fusebox's outputs against the same graph computed in PyTorch.

For each graph: random inputs (fixed seed, uniform in [-1, 1], rounded to the
tensor's dtype), `fusebox run --inputs ... --save-outputs DIR --verify --json`,
then the graph recomputed op by op in float32 on the GPU (TF32 off) from the
same rounded inputs. One line per graph; exit 1 if any graph fails.

    python3 tools/torch_crosscheck.py [GRAPH.json ...] [--fusebox build/fusebox]
                                      [--seed 1234] [--json-out results.json]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from graph_json import Graph, default_graphs  # noqa: E402
from torch_ops import apply_op  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Per output dtype: (rel_l2, max_abs / max|ref|).
TOLERANCES = {"bf16": (1e-2, 4e-2), "fp16": (3e-3, 1e-2), "fp32": (3e-3, 1e-2)}
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def round_to(t, dtype):
    """float32 tensor rounded to `dtype` and back (exact in float32)."""
    return t.to(TORCH_DTYPES[dtype]).to(torch.float32) if dtype in ("bf16", "fp16") else t


def make_inputs(graph, seed, device):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    inputs = {}
    for name in graph.inputs():
        dims = graph.dims[name]
        t = torch.rand(dims, generator=gen, dtype=torch.float32) * 2 - 1
        inputs[name] = round_to(t, graph.dtype(name)).to(device)
    return inputs


def torch_reference(graph, inputs, device):
    """Every tensor of the graph computed in float32; intermediates whose dtype
    is not fp32 are rounded to it, as fusebox stores them."""
    vals = dict(inputs)
    for name, t in graph.declared.items():
        if "scalar" in t:
            vals[name] = torch.full(graph.dims[name] or [], float(t["scalar"]),
                                    dtype=torch.float32, device=device)
    for op in graph.ops:
        ins = {role: vals[t] for role, t in op["inputs"].items()}
        res = apply_op(op, ins)
        if not isinstance(res, dict):
            res = {"y": res}
        for role, out in op["outputs"].items():
            y = res[role]
            if out not in graph.outputs():
                y = round_to(y, graph.dtype(out))
            vals[out] = y
    return vals


def compare(got, ref):
    got64, ref64 = got.double(), ref.double()
    diff = got64 - ref64
    ref_norm = ref64.norm().item()
    ref_max = ref64.abs().max().item() if ref64.numel() else 0.0
    max_abs = diff.abs().max().item() if diff.numel() else 0.0
    return {
        "rel_l2": diff.norm().item() / ref_norm if ref_norm > 0 else diff.norm().item(),
        "max_abs": max_abs,
        "max_abs_rel": max_abs / ref_max if ref_max > 0 else max_abs,
    }


def run_fusebox(fusebox, graph_path, input_files, out_dir, timeout_s):
    cmd = [fusebox, "run", graph_path, "--save-outputs", out_dir, "--verify", "--json"]
    if input_files:
        cmd += ["--inputs", ",".join(f"{n}={p}" for n, p in input_files.items())]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return cmd, None, f"timed out after {timeout_s} s", None
    report = None
    try:
        report = json.loads(proc.stdout) if proc.stdout.strip() else None
    except json.JSONDecodeError:
        pass
    return cmd, proc.returncode, proc.stderr, report


def check_graph(path, args, device):
    graph = Graph(path)
    result = {"graph": graph.name, "path": path, "outputs": [], "pass": False}
    work = tempfile.mkdtemp(prefix=f"xcheck_{graph.name}_")
    try:
        inputs = make_inputs(graph, args.seed, device)
        files = {}
        for name, t in inputs.items():
            files[name] = os.path.join(work, f"in_{name}.npy")
            np.save(files[name], t.cpu().numpy().astype(np.float32))
        out_dir = os.path.join(work, "out")
        os.makedirs(out_dir)
        cmd, rc, stderr, report = run_fusebox(args.fusebox, path, files, out_dir, args.timeout)
        result["command"] = " ".join(cmd)
        result["fusebox_rc"] = rc
        result["fusebox_report"] = report
        verify = (report or {}).get("verify") or []
        result["fusebox_verify"] = bool(verify) and all(v.get("pass") for v in verify) \
            and bool((report or {}).get("ok"))
        if rc != 0:
            result["error"] = f"fusebox exited {rc}: {stderr.strip()}"
            return result
        ref = torch_reference(graph, inputs, device)
        ok = True
        for name in graph.outputs():
            dt = graph.dtype(name)
            rel_tol, max_tol = TOLERANCES.get(dt, TOLERANCES["fp32"])
            out_file = os.path.join(out_dir, f"{name}.npy")
            entry = {"tensor": name, "dtype": dt}
            if not os.path.exists(out_file):
                entry.update(error=f"fusebox wrote no {out_file}", pass_=False)
                ok = False
            else:
                got = torch.from_numpy(np.load(out_file).astype(np.float32)).to(device)
                want = ref[name]
                if tuple(got.shape) != tuple(want.shape):
                    entry.update(error=f"shape {tuple(got.shape)} != torch {tuple(want.shape)}",
                                 pass_=False)
                    ok = False
                else:
                    m = compare(got, want)
                    passed = m["rel_l2"] <= rel_tol and m["max_abs_rel"] <= max_tol
                    entry.update(m, tol_rel_l2=rel_tol, tol_max_abs_rel=max_tol, pass_=passed)
                    ok = ok and passed
            entry["pass"] = entry.pop("pass_")
            result["outputs"].append(entry)
        result["pass"] = ok and result["fusebox_verify"]
        if ok and not result["fusebox_verify"]:
            result["error"] = "fusebox's own --verify did not pass"
        return result
    except Exception as e:  # one broken graph must not stop the others
        result["error"] = f"{type(e).__name__}: {e}"
        return result
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            result["work_dir"] = work


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("graphs", nargs="*", help="graph JSON files (default: the valid examples)")
    ap.add_argument("--fusebox", default=os.path.join(REPO_ROOT, "build", "fusebox"))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--timeout", type=float, default=300, help="seconds per fusebox run")
    ap.add_argument("--json-out", help="write all results to this file")
    ap.add_argument("--keep", action="store_true", help="keep the temp dirs (inputs, outputs)")
    args = ap.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        print("torch_crosscheck: warning: torch sees no GPU, the reference runs on the CPU",
              file=sys.stderr)
    graphs = args.graphs or default_graphs(REPO_ROOT)
    if not graphs:
        print("torch_crosscheck: no graphs given or found", file=sys.stderr)
        return 2

    results, failed = [], 0
    for path in graphs:
        r = check_graph(path, args, device)
        results.append(r)
        failed += not r["pass"]
        own = "pass" if r.get("fusebox_verify") else "FAIL"
        if r["outputs"]:
            for o in r["outputs"]:
                if "rel_l2" in o:
                    print(f"{r['graph']:<32} {o['tensor']:<8} {o['dtype']:<5} "
                          f"rel_l2 {o['rel_l2']:.3e} max_abs {o['max_abs']:.3e} "
                          f"(rel {o['max_abs_rel']:.3e})  fusebox-verify {own}  "
                          f"{'PASS' if r['pass'] else 'FAIL'}")
                else:
                    print(f"{r['graph']:<32} {o['tensor']:<8} {o['error']}  FAIL")
        else:
            print(f"{r['graph']:<32} FAIL")
        if r.get("error"):
            print(f"  {r['graph']}: {r['error']}")
            if r.get("command"):
                print(f"  reproduce: {r['command']}" + ("" if args.keep else "  (--keep keeps these files)"))
        sys.stdout.flush()

    print(f"torch_crosscheck: {len(results) - failed} passed, {failed} failed")
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump({"seed": args.seed, "torch": torch.__version__, "device": device,
                       "results": results}, f, indent=2)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
