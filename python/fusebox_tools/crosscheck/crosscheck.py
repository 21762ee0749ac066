"""Cross-checks fusebox's outputs against the same graph computed in PyTorch.

For each graph: inputs made here (fixed seed), `fusebox run --inputs ...
--save-outputs DIR --verify --json`, then the graph recomputed op by op in
float32 on the GPU (TF32 off) from the same inputs. One line per output; exit
1 if any graph fails.

The graph (shapes, dtypes, roles, resolved attributes, input ranges,
tolerances) is fusebox's own resolution of it, `fusebox check --json`.

Inputs: a tensor with "values" in the graph gets them; other inputs are
random in fusebox's range for them (random_lo/random_hi: sequence lengths
[1, S], dropout seed/offset [0, 2^31), FP8 scale factors [0.5, 2], others
[-1, 1]), integers for int32/int64/uint8 tensors, otherwise uniform and rounded to
the tensor's dtype (fp8 saved as float32 .npy, which fusebox reads into fp8
exactly). For sdpa_bwd, "o" and "stats" are the forward's, computed here from
q, k, v (o rounded to its dtype); for sdpa_fp8_bwd, the FP8 forward's (the
bwd op's descale_q/k/v, descale_s, scale_s and scale_o = 1 / descale_o, o
rounded to fp8_e4m3), as fusebox makes them itself. "Don't care" elements of sdpa outputs
(padding rows, rows with no kept key; dk/dv rows past seq_len_kv) are zeroed on
both sides before comparing; each output must be within the tolerance
fusebox's own --verify allows it (check --json "tolerances"). Graphs with
dropout and no dumped "dropout_mask" are run through fusebox but not compared
(SKIP: torch cannot reproduce cuDNN's Philox mask).

    python3 -m fusebox_tools.crosscheck.crosscheck [GRAPH.json ...] [--fusebox build/fusebox]
                                        [--seed 1234] [--json-out results.json]
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

from fusebox_tools.core.graph import ARCH_REFUSAL, INT_DTYPES, SDPA_BWD_OPS, SDPA_OPS, FuseboxError, Graph, default_graphs, fusebox_bin
from fusebox_tools.core.torch_ops import SdpaSkip, apply_op, round_fp8, round_fp8_e5m2, sdpa_care_masks, sdpa_forward

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
NPY_DTYPES = {"int32": np.int32, "int64": np.int64, "uint8": np.uint8}


def round_to(t, dtype):
    """float32 tensor rounded to `dtype` and back (exact in float32)."""
    if dtype in ("bf16", "fp16"):
        return t.to(TORCH_DTYPES[dtype]).to(torch.float32)
    if dtype == "fp8_e4m3":
        return round_fp8(t)
    if dtype == "fp8_e5m2":
        return round_fp8_e5m2(t)
    return t


def bwd_forward_role(graph, name):
    """The role ("o" or "stats") for which `name` feeds an sdpa backward op
    (its forward's output, computed here), else None."""
    for op, role in graph.consumers(name):
        if op["op"] in SDPA_BWD_OPS and role in ("o", "stats"):
            return role
    return None


def without_dropout(src, **changes):
    """A copy of op `src` with no dropout (and the given top-level changes, e.g. op="sdpa_fp8_fwd")."""
    return dict(src, attrs=dict(src["attrs"], dropout=None), **changes)


def page_table_pool(graph, name):
    """The pool (k or v tensor name) that page table `name` indexes, or None
    when `name` is not a page table of a paged sdpa op."""
    for op, role in graph.consumers(name):
        if role in ("page_table_k", "page_table_v"):
            return op["inputs"]["k" if role == "page_table_k" else "v"]
    return None


def make_inputs(graph, seed, device):
    """Input name -> tensor on `device`: float32 (values exact in the tensor's
    dtype) or, for int32/int64 tensors, int64."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    inputs, bwd_pending = {}, []
    for name in graph.inputs():
        dims = graph.dims[name]
        dt = graph.dtype(name)
        lo, hi = graph.random_range(name)
        if graph.values(name):
            t = torch.tensor(graph.values(name), dtype=torch.float64).reshape(dims)
            t = t.to(torch.int64) if dt in INT_DTYPES else round_to(t.to(torch.float32), dt)
        elif bwd_forward_role(graph, name):
            bwd_pending.append(name)
            continue
        elif page_table_pool(graph, name) is not None:
            # a shuffled permutation of the pool's pages, as fusebox makes them
            pages = graph.dims[page_table_pool(graph, name)][0]
            perm = torch.randperm(pages, generator=gen)
            n = math.prod(dims)
            t = perm[torch.arange(n) % pages].reshape(dims).to(torch.int64)
        elif dt in INT_DTYPES:
            t = torch.randint(int(lo), int(hi) + 1, dims, generator=gen, dtype=torch.int64)
        else:
            t = torch.rand(dims, generator=gen, dtype=torch.float64) * (hi - lo) + lo
            t = round_to(t.to(torch.float32), dt)
        inputs[name] = t.to(device)
    # sdpa_bwd's / sdpa_fp8_bwd's o and stats: the forward of the same q, k, v (and masks).
    done = set()
    for name in bwd_pending:
        if name in done:
            continue
        op = next(o for o, r in graph.consumers(name) if o["op"] in SDPA_BWD_OPS and r in ("o", "stats"))
        ins = {r: inputs[t] for r, t in op["inputs"].items() if t in inputs}
        # o and stats of the forward without dropout (fusebox's choice too:
        # the mask is unknown before cuDNN runs; the backward takes o only
        # through rowsum(do * o), so both sides compute the same function).
        fwd_op = without_dropout(op)
        if op["op"] == "sdpa_fp8_bwd":
            # The FP8 forward with the bwd's descale_q/k/v, descale_s, scale_s
            # and scale_o = 1 / descale_o, so that descale_o * o8 is O
            # (fusebox's sdpa_fp8_bwd_forward_of); o comes back rounded to e4m3.
            descale_o = inputs.get(op["inputs"]["descale_o"])
            if descale_o is None:  # a by-value scalar
                descale_o = torch.tensor(float(graph.scalar_value(op["inputs"]["descale_o"])))
            for r in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s"):
                if r not in ins:  # a by-value scalar
                    ins[r] = torch.tensor(float(graph.scalar_value(op["inputs"][r])))
            ins["scale_o"] = 1.0 / descale_o.float().reshape(1, 1, 1, 1)
            fwd_op = without_dropout(op, op="sdpa_fp8_fwd")
            fwd = sdpa_forward(ins, fwd_op, fp8=True)
        else:
            fwd = sdpa_forward(ins, fwd_op)
        for role in ("o", "stats"):
            t_name = op["inputs"][role]
            if t_name not in bwd_pending or t_name in done:
                continue
            t = fwd[role]
            if role == "o":
                t = round_to(t, graph.dtype(t_name))
            else:
                # Rows that kept no key have stats -inf; a finite 0 keeps the
                # kernel's exp(s - stats) at 0 for their (masked) scores
                # instead of exp(-inf + inf) = NaN. Those rows are don't-care.
                t = torch.where(torch.isfinite(t), t, torch.zeros_like(t))
            inputs[t_name] = t.to(device)
            done.add(t_name)
    return inputs


def save_input(path, t, dtype):
    arr = t.cpu().numpy()
    np.save(path, arr.astype(NPY_DTYPES.get(dtype, np.float32)))


def has_dropout(graph):
    """Dropout without a dumped mask: neither fusebox nor torch can verify it."""
    return any(op["attrs"]["dropout"] and "dropout_mask" not in op["outputs"] for op in graph.sdpa_ops())


def dropout_mask_outputs(graph):
    return [op["outputs"]["dropout_mask"] for op in graph.sdpa_ops() if "dropout_mask" in op["outputs"]]


def torch_reference(graph, inputs, device):
    """Every tensor of the graph computed in float32; intermediates whose dtype
    is not fp32 are rounded to it, as fusebox stores them."""
    vals = dict(inputs)
    for name in graph.tensors:
        if graph.is_scalar(name):
            vals[name] = torch.full(graph.dims[name], float(graph.scalar_value(name)),
                                    dtype=torch.float32, device=device)
    care = {}
    for op in graph.ops:
        ins = {role: vals[t] for role, t in op["inputs"].items()}
        if op["op"] in SDPA_OPS and op["outputs"].get("dropout_mask") in vals:
            ins["dropout_mask"] = vals[op["outputs"]["dropout_mask"]]  # cuDNN's dump, an input here
        roles = dict(op["inputs"], **op["outputs"])
        res = apply_op(op, ins, dtypes={role: graph.dtype(t) for role, t in roles.items()})
        if not isinstance(res, dict):
            res = {"y": res}
        masks = sdpa_care_masks(op, ins, None) if op["op"] in SDPA_OPS else {}
        for role, out in op["outputs"].items():
            if role not in res:
                continue  # the dropout mask: cuDNN's, not computed here
            y = res[role]
            if out not in graph.outputs():
                y = round_to(y, graph.dtype(out))
            vals[out] = y
            if role in masks:
                care[out] = masks[role]
    return vals, care


def compare(got, ref, care=None):
    got64, ref64 = got.double(), ref.double()
    if care is not None:
        # Don't-care elements zeroed on both sides (whatever either side holds there).
        zero = torch.zeros((), dtype=torch.float64, device=got64.device)
        got64 = torch.where(care, got64, zero)
        ref64 = torch.where(care, ref64, zero)
    diff = got64 - ref64
    ref_norm = ref64.norm().item()
    ref_max = ref64.abs().max().item() if ref64.numel() else 0.0
    max_abs = diff.abs().max().item() if diff.numel() else 0.0
    return {
        "rel_l2": diff.norm().item() / ref_norm if ref_norm > 0 else diff.norm().item(),
        "max_abs": max_abs,
        "max_abs_rel": max_abs / ref_max if ref_max > 0 else max_abs,
    }


def run_fusebox(fusebox, graph_path, input_files, out_dir, timeout_s, verify=True):
    cmd = [fusebox, "run", graph_path, "--save-outputs", out_dir] + (["--verify"] if verify else []) \
        + ["--json"]
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


def dropout_backward_ops(graph):
    return [op for op in graph.ops
            if op["op"] == "sdpa_bwd" and op["attrs"]["dropout"] and "dropout_mask" in op["outputs"]]


def forward_with_mask(graph, op, inputs, mask, device):
    """o of the dropout forward that drew `mask` (cuDNN's dump), rounded to o's dtype."""
    ins = {r: inputs[t] for r, t in op["inputs"].items() if t in inputs}
    ins["dropout_mask"] = mask
    o = sdpa_forward(ins, op)["o"]
    return round_to(o, graph.dtype(op["inputs"]["o"]))


def check_graph(path, args, device):
    try:
        graph = Graph.load(path, args.fusebox)
    except FuseboxError as e:
        return {"graph": os.path.basename(path), "path": path, "outputs": [], "pass": False, "error": str(e)}
    result = {"graph": graph.name, "path": path, "outputs": [], "pass": False}
    work = tempfile.mkdtemp(prefix=f"xcheck_{graph.name}_")
    try:
        inputs = make_inputs(graph, args.seed, device)
        files = {}
        for name, t in inputs.items():
            files[name] = os.path.join(work, f"in_{name}.npy")
            save_input(files[name], t, graph.dtype(name))
        out_dir = os.path.join(work, "out")
        os.makedirs(out_dir)
        dropout = has_dropout(graph)  # fusebox's reference cannot verify dropout either
        cmd, rc, stderr, report = run_fusebox(args.fusebox, path, files, out_dir, args.timeout,
                                              verify=not dropout)
        if rc == 0 and dropout_backward_ops(graph):
            # The backward takes o through rowsum(do * o); torch autograd uses
            # the dropout forward's o. The mask is known only after a run
            # (cuDNN draws it from seed and offset), so: run, rebuild o with
            # the dumped mask, run again on that o (same seed: same mask).
            for op in dropout_backward_ops(graph):
                mask_name = op["outputs"]["dropout_mask"]
                mask = torch.from_numpy(np.load(os.path.join(out_dir, f"{mask_name}.npy"))).float().to(device)
                o_name = op["inputs"]["o"]
                inputs[o_name] = forward_with_mask(graph, op, inputs, mask, device)
                save_input(files[o_name], inputs[o_name], graph.dtype(o_name))
            cmd, rc, stderr, report = run_fusebox(args.fusebox, path, files, out_dir, args.timeout,
                                                  verify=not dropout)
        result["command"] = " ".join(cmd)
        result["fusebox_rc"] = rc
        result["fusebox_report"] = report
        verify = (report or {}).get("verify") or []
        result["fusebox_verify"] = bool(verify) and all(v.get("pass") for v in verify) \
            and bool((report or {}).get("ok"))
        if rc != 0 and ARCH_REFUSAL in stderr:
            result["skipped"] = "refused on this GPU by design: " + stderr.strip().splitlines()[0][:300]
            result["pass"] = True
            return result
        if rc != 0:
            result["error"] = f"fusebox exited {rc}: {stderr.strip()}"
            return result
        if dropout:
            result["skipped"] = ("dropout: cuDNN's Philox dropout mask is not reproduced in torch; "
                                 "fusebox ran (exit 0) but its outputs are not compared")
            result["pass"] = True
            return result
        masks = dropout_mask_outputs(graph)
        ref_inputs = dict(inputs)
        for name in masks:  # cuDNN's dumped keep-masks feed the torch computation
            ref_inputs[name] = torch.from_numpy(np.load(os.path.join(out_dir, f"{name}.npy"))).float().to(device)
        try:
            ref, care = torch_reference(graph, ref_inputs, device)
        except SdpaSkip as e:
            result["skipped"] = str(e)
            result["pass"] = True
            return result
        ok = True
        for name in graph.outputs():
            if name in masks:
                continue  # an input of the comparison above, checked by fusebox's --verify
            dt = graph.dtype(name)
            rel_tol, max_tol = graph.tolerance(name)
            out_file = os.path.join(out_dir, f"{name}.npy")
            entry = {"tensor": name, "dtype": dt}
            if not os.path.exists(out_file):
                entry.update(error=f"fusebox wrote no {out_file}", pass_=False)
                ok = False
            else:
                got = torch.from_numpy(np.load(out_file).astype(np.float32)).to(device)
                want = ref[name]
                sat = graph.saturation(name)
                if sat > 0:  # an fp8 output saturates: torch's value beyond it, as fusebox's --verify
                    want = want.clamp(-sat, sat)
                if tuple(got.shape) != tuple(want.shape):
                    entry.update(error=f"shape {tuple(got.shape)} != torch {tuple(want.shape)}",
                                 pass_=False)
                    ok = False
                else:
                    mask = care.get(name)
                    m = compare(got, want, mask)
                    if mask is not None:
                        entry["dont_care"] = int(want.numel() - torch.broadcast_to(mask, want.shape).sum().item())
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
    ap.add_argument("--fusebox", help="fusebox binary (default: $FUSEBOX_BIN, else build/fusebox)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--timeout", type=float, default=300, help="seconds per fusebox run")
    ap.add_argument("--json-out", help="write all results to this file")
    ap.add_argument("--keep", action="store_true", help="keep the temp dirs (inputs, outputs)")
    args = ap.parse_args()
    try:
        args.fusebox = fusebox_bin(args.fusebox)
    except FuseboxError as e:
        print(f"crosscheck: {e}", file=sys.stderr)
        return 2

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        print("crosscheck: warning: torch sees no GPU, the reference runs on the CPU",
              file=sys.stderr)
    graphs = args.graphs or default_graphs()
    if not graphs:
        print("crosscheck: no graphs given or found", file=sys.stderr)
        return 2

    results, failed = [], 0
    for path in graphs:
        r = check_graph(path, args, device)
        results.append(r)
        failed += not r["pass"]
        own = "pass" if r.get("fusebox_verify") else "FAIL"
        if r.get("skipped"):
            print(f"{r['graph']:<32} SKIP: {r['skipped']}")
        elif r["outputs"]:
            for o in r["outputs"]:
                if "rel_l2" in o:
                    print(f"{r['graph']:<32} {o['tensor']:<8} {o['dtype']:<8} "
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

    skipped = sum(1 for r in results if r.get("skipped"))
    print(f"crosscheck: {len(results) - failed - skipped} passed, {failed} failed, "
          f"{skipped} skipped")
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump({"seed": args.seed, "torch": torch.__version__, "device": device,
                       "results": results}, f, indent=2)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
