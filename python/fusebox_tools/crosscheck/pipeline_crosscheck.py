"""Cross-checks a whole fusebox pipeline against the same stages in PyTorch.

Runs `fusebox pipeline run PIPELINE --verify --save-outputs DIR --json`
(which saves every buffer a stage writes as DIR/<buffer>.npy and every input
as DIR/inputs/<buffer>.npy), then, with the same inputs and the pipeline's
own weights files:

* per stage: the stage's graph in torch on the inputs fusebox's previous
  stages actually produced (the saved .npy), against that stage's saved
  outputs, so a mismatch names the first stage that diverges;
* whole chain: every stage in torch on torch's own outputs (rounded to each
  buffer's dtype between stages, as fusebox stores them), against fusebox's
  final outputs, within the producing op's tolerance times the stage depth
  (as `pipeline run --verify` allows its reference chain).

A buffer marked "reshape" is seen by each stage through its graph tensor's
dims and strides (the same memory): values are reinterpreted accordingly.

The pipeline's stage order, bindings and buffer shapes come from `fusebox
pipeline check --json`; each graph from `fusebox check --json` (graph.py).
One line per comparison; exit 1 if any fails.

    python3 -m fusebox_tools.crosscheck.pipeline_crosscheck PIPELINE.json [--fusebox build/fusebox]
        [--seed 1] [--out DIR] [--json-out results.json]

torch is imported only by the parts that compute (torch_stage, main); the
orchestration (stage order, depths, which buffers feed which stage) is plain
Python and tested without it (tests/python/test_pipeline_crosscheck.py).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from fusebox_tools.core import safetensors_np
from fusebox_tools.core.graph import FuseboxError, Graph, fusebox_bin

# The "version" of `fusebox pipeline check --json` and `pipeline run --json` this module reads.
CHECK_JSON_VERSION = 1
RUN_JSON_VERSION = 1


def graph_shape(graph_path, shape):
    """The part of a pipeline's --shape ("B=2,S=16,N=32") that one graph file declares, for
    `fusebox check --shape` of that graph alone; None when it declares none of them."""
    if not shape:
        return None
    with open(graph_path) as f:
        declared = json.load(f).get("symbols", {})
    vals = dict(kv.split("=", 1) for kv in shape.split(","))
    return ",".join(f"{k}={vals[k]}" for k in declared if k in vals) or None


class Pipeline:
    """A pipeline as `fusebox pipeline check --json` gives it."""

    def __init__(self, doc, path):
        if doc.get("version") != CHECK_JSON_VERSION:
            raise FuseboxError(f"pipeline check --json version {doc.get('version')}, this module reads "
                               f"{CHECK_JSON_VERSION}: rebuild fusebox or update fusebox_tools")
        self.doc = doc
        self.path = path
        self.name = doc["pipeline"]
        self.stages = doc["stages"]  # in run order: name, graph_file, bind {tensor: buffer}
        self.buffers = {b["name"]: b for b in doc["buffers"]}

    @classmethod
    def load(cls, path, fusebox=None, timeout_s=120, shape=None):
        """`pipeline check --json` of `path` (its symbolic stages at `shape`, "B=2,S=16")."""
        cmd = [fusebox_bin(fusebox), "pipeline", "check", path, "--json"] + (["--shape", shape] if shape else [])
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        try:
            doc = json.loads(proc.stdout)
        except json.JSONDecodeError as e:
            raise FuseboxError(f"{' '.join(cmd)} exited {proc.returncode} without JSON: {proc.stderr.strip()[-400:]}",
                               returncode=proc.returncode) from e
        if not doc.get("ok"):
            raise FuseboxError(f"{doc.get('code', 'error')}: {doc.get('error')}", code=doc.get("code"),
                               returncode=proc.returncode)
        return cls(doc, path)

    def folder(self):
        return os.path.dirname(os.path.abspath(self.path))

    def graph_path(self, stage):
        f = stage["graph_file"]
        return f if os.path.isabs(f) else os.path.join(self.folder(), f)

    def kind(self, buffer):
        return self.buffers[buffer]["kind"]

    def constant_files(self):
        """Constant buffer -> its weights file (resolved against the pipeline's folder)."""
        out = {}
        for name, b in self.buffers.items():
            if b["kind"] == "constant":
                f = b["file"]
                out[name] = f if os.path.isabs(f) else os.path.join(self.folder(), f)
        return out

    def constant(self, name):
        """A constant's values as float32 (int64 for integers) in the buffer's dims,
        from its .npy or its tensor ("key") in a .safetensors file."""
        f, b = self.constant_files()[name], self.buffers[name]
        a = safetensors_np.read(f, b["key"]) if b.get("key") else np.load(f)
        a = a.reshape(b["dims"])  # a safetensors tensor may drop the dims of 1
        return a.astype(np.int64 if a.dtype.kind in "iu" else np.float32)

    def inputs(self):
        return [n for n, b in self.buffers.items() if b["kind"] == "input"]

    def outputs(self):
        return [n for n, b in self.buffers.items() if b["kind"] == "output"]

    def written(self):
        """Buffers a stage writes (intermediates and outputs), in buffer order."""
        return [n for n, b in self.buffers.items() if b["writer"] is not None]

    def depths(self):
        """Buffer written by a stage -> the number of stages on the longest
        path from the pipeline's inputs to it (the chain tolerance's factor)."""
        stage_depth, out = {}, {}
        for st in self.stages:
            d = 0
            for buf in st["bind"].values():
                w = self.buffers[buf]["writer"]
                if w is not None and w["stage"] != st["name"]:
                    d = max(d, stage_depth[w["stage"]])
            stage_depth[st["name"]] = d + 1
        for name, b in self.buffers.items():
            if b["writer"] is not None:
                out[name] = stage_depth[b["writer"]["stage"]]
        return out


def reinterpret(x, src_dims, src_strides, dst_dims, dst_strides):
    """A logical array laid out with (src_dims, src_strides), read back through
    (dst_dims, dst_strides) over the same memory: a "reshape" buffer's value as
    another stage's graph tensor sees it. numpy arrays or torch tensors."""
    if list(src_dims) == list(dst_dims) and list(src_strides) == list(dst_strides):
        return x
    span = 1 + sum((d - 1) * s for d, s in zip(src_dims, src_strides))
    if hasattr(x, "as_strided"):  # torch
        flat = x.new_zeros(span)
        flat.as_strided(list(src_dims), list(src_strides)).copy_(x.reshape(list(src_dims)))
        return flat.as_strided(list(dst_dims), list(dst_strides)).clone()
    x = np.asarray(x)
    flat = np.zeros(span, dtype=x.dtype)
    isz = flat.itemsize
    np.lib.stride_tricks.as_strided(flat, tuple(src_dims), tuple(s * isz for s in src_strides))[...] = \
        x.reshape(tuple(src_dims))
    return np.lib.stride_tricks.as_strided(flat, tuple(dst_dims), tuple(s * isz for s in dst_strides)).copy()


def buffer_value(pipeline, values, buffer):
    """A buffer's logical value from `values` (buffer -> value); a view's (part k of n of its
    parent, docs/pipeline-format.md) taken from its parent's memory. numpy or torch."""
    b = pipeline.buffers[buffer]
    v = b.get("view")
    if not v:
        return values[buffer]
    parent = pipeline.buffers[v["of"]]
    n = 1
    for d in parent["dims"]:
        n *= d
    flat = reinterpret(values[v["of"]], parent["dims"], parent["strides"], [n], [1])
    count = n // v["parts"]
    part = flat[v["offset_elements"]:v["offset_elements"] + count]
    return reinterpret(part, [count], [1], b["dims"], b["strides"])


def to_tensor_view(pipeline, graph, tensor, buffer, value):
    """`value` (the buffer's logical value) as graph tensor `tensor` sees it."""
    b = pipeline.buffers[buffer]
    return reinterpret(value, b["dims"], b["strides"], graph.dims[tensor], graph.strides(tensor))


def to_buffer_view(pipeline, graph, tensor, buffer, value):
    """A stage's output (tensor's logical value) as the buffer's logical value."""
    b = pipeline.buffers[buffer]
    return reinterpret(value, graph.dims[tensor], graph.strides(tensor), b["dims"], b["strides"])


def saved_files(pipeline, out_dir):
    """Buffer -> the .npy `pipeline run --save-outputs DIR` wrote for it:
    DIR/inputs/<buffer>.npy for inputs, DIR/<buffer>.npy for written buffers."""
    files = {n: os.path.join(out_dir, "inputs", f"{n}.npy") for n in pipeline.inputs()}
    files.update({n: os.path.join(out_dir, f"{n}.npy") for n in pipeline.written()})
    return files


def run_chain(pipeline, graphs, values, run_stage, round_to=None):
    """Every stage in order on `values` (buffer -> value; inputs and constants
    at least): run_stage(stage, graph, {tensor: value}) -> {tensor: value}.
    Each written buffer's value is round_to(value, dtype) when given (what
    later stages read) and kept unrounded in the returned dict of written
    buffers, which is compared with fusebox's."""
    values = dict(values)
    produced = {}
    for st in pipeline.stages:
        g = graphs[st["name"]]
        outs_of = set(g.outputs())
        ins = {t: to_tensor_view(pipeline, g, t, buf, buffer_value(pipeline, values, buf))
               for t, buf in st["bind"].items() if t not in outs_of}
        res = run_stage(st, g, ins)
        for t, buf in st["bind"].items():
            if t in outs_of:
                y = to_buffer_view(pipeline, g, t, buf, res[t])
                produced[buf] = y
                values[buf] = round_to(y, g.dtype(t)) if round_to else y
    return produced


def stage_inputs(stage, graph):
    """{tensor: buffer} of the stage's graph inputs (fed from fusebox's saved or constant files)."""
    outs_of = set(graph.outputs())
    return {t: buf for t, buf in stage["bind"].items() if t not in outs_of}


def tolerance(pipeline, graphs, buffer, depth=1):
    """(rel_l2, max_abs_rel) allowed for a written buffer, times `depth`."""
    w = pipeline.buffers[buffer]["writer"]
    rel, mx = graphs[w["stage"]].tolerance(w["tensor"])
    return rel * depth, mx * depth


def judge(metrics, tol):
    return metrics["rel_l2"] <= tol[0] and metrics["max_abs_rel"] <= tol[1]


def torch_stage(device):
    """run_stage for run_chain: the stage's graph op by op in torch (crosscheck.torch_reference)."""
    from fusebox_tools.crosscheck.crosscheck import torch_reference

    def run(stage, graph, inputs):
        vals, _ = torch_reference(graph, inputs, device)
        return {t: vals[t] for t in graph.outputs()}

    return run


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pipeline")
    ap.add_argument("--fusebox", help="fusebox binary (default: $FUSEBOX_BIN, else build/fusebox)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", help="keep fusebox's saved buffers here (default: a temporary folder)")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--shape", help="a symbolic pipeline's values, SYM=N,... (pipeline run --shape)")
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)

    import torch
    from fusebox_tools.crosscheck.crosscheck import compare, round_to

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    p = Pipeline.load(args.pipeline, args.fusebox, shape=args.shape)
    graphs = {st["name"]: Graph.load(p.graph_path(st), args.fusebox, shape=graph_shape(p.graph_path(st), args.shape))
              for st in p.stages}
    out_dir = args.out or tempfile.mkdtemp(prefix=f"xcheck_{p.name}_")
    cmd = [fusebox_bin(args.fusebox), "pipeline", "run", args.pipeline, "--verify", "--iters", "0", "--seed",
           str(args.seed), "--save-outputs", out_dir, "--json"] + (["--shape", args.shape] if args.shape else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        report = {}
    if proc.returncode != 0 or report.get("version") != RUN_JSON_VERSION:
        print(f"FAIL {p.name}: {' '.join(cmd)} exited {proc.returncode} (json version {report.get('version')}): "
              f"{proc.stderr.strip()[-600:]}")
        return 1

    load = lambda f: torch.from_numpy(np.load(f).astype(np.float32)).to(device)  # noqa: E731
    files = saved_files(p, out_dir)
    # As fusebox reads them: rounded to the buffer's dtype.
    constants = {n: round_to(torch.from_numpy(p.constant(n)).to(device), p.buffers[n]["dtype"])
                 for n in p.constant_files()}
    saved = {n: load(f) for n, f in files.items()}
    results, ok = [], True
    run = torch_stage(device)

    # Per stage, on fusebox's own inputs.
    for st in p.stages:
        g = graphs[st["name"]]
        known = dict(saved, **constants)
        ins = {t: to_tensor_view(p, g, t, b, buffer_value(p, known, b)) for t, b in stage_inputs(st, g).items()}
        outs = run(st, g, ins)
        for t, buf in st["bind"].items():
            if t not in outs:
                continue
            m = compare(saved[buf], to_buffer_view(p, g, t, buf, outs[t]))
            tol = tolerance(p, graphs, buf)
            passed = judge(m, tol)
            ok = ok and passed
            results.append(dict(m, check="stage", stage=st["name"], buffer=buf, tol=tol, passed=passed))
            print(f"{'ok  ' if passed else 'FAIL'} stage {st['name']:<10} {buf:<12} rel_l2 {m['rel_l2']:.3e} "
                  f"max_abs_rel {m['max_abs_rel']:.3e} (tol {tol[0]:.1e}, {tol[1]:.1e})")
        if not ok:
            break  # later stages read a diverged input: the first failure is the one to look at

    # The whole chain in torch on its own outputs.
    values = dict(constants)
    values.update({n: saved[n] for n in p.inputs()})
    produced = run_chain(p, graphs, values, run, round_to=round_to)
    depths = p.depths()
    for buf in p.outputs():
        m = compare(saved[buf], produced[buf])
        tol = tolerance(p, graphs, buf, depths[buf])
        passed = judge(m, tol)
        ok = ok and passed
        results.append(dict(m, check="chain", buffer=buf, tol=tol, passed=passed))
        print(f"{'ok  ' if passed else 'FAIL'} chain ({depths[buf]} stages) {buf:<12} rel_l2 {m['rel_l2']:.3e} "
              f"max_abs_rel {m['max_abs_rel']:.3e} (tol {tol[0]:.1e}, {tol[1]:.1e})")
    print(f"{p.name}: {'PASS' if ok else 'FAIL'} (fusebox's own --verify passed; torch on {device})")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"pipeline": p.name, "pass": ok, "results": results, "fusebox": report}, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
