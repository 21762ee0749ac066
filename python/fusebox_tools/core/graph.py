"""A fusebox graph as fusebox's own resolver gives it (stdlib only).

`Graph.load(path)` runs `fusebox check PATH --json` and wraps what it prints:
tensors with dims, strides, dtypes, kinds, fixed values and random-input
ranges; ops in topological order with their roles, primary output, resolved
attributes and verification tolerances; FLOPs, bytes and the fingerprint.
Nothing here infers a shape, sorts ops or counts FLOPs: the C++ resolver is
the one definition (docs/cli.md, "check --json").

The fusebox binary: the `fusebox` argument, else $FUSEBOX_BIN, else
build/fusebox of this checkout, else `fusebox` on PATH.
"""
import glob
import json
import os
import shutil
import subprocess

# The "version" of `fusebox check --json` this module reads.
CHECK_JSON_VERSION = 1

# python/fusebox_tools/core/graph.py -> the checkout's root (when run from a checkout).
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# What fusebox's error says when a graph needs a newer GPU architecture than the
# target (src/cudnn/ops/sdpa_lowering.cpp: block masks): such a run is refused
# by design, a skip in the GPU scripts, not a failure.
ARCH_REFUSAL = "need a Blackwell GPU (sm_100"
SDPA_OPS = ("sdpa_fwd", "sdpa_bwd", "sdpa_fp8_fwd", "sdpa_fp8_bwd")
SDPA_BWD_OPS = ("sdpa_bwd", "sdpa_fp8_bwd")
INT_DTYPES = ("int32", "int64", "uint8")


class FuseboxError(Exception):
    """fusebox refused the graph or could not be run. `code` is fusebox's
    status code name (e.g. "InvalidArgument") when it reported one."""

    def __init__(self, message, code=None, returncode=None):
        super().__init__(message)
        self.code = code
        self.returncode = returncode


def fusebox_bin(fusebox=None):
    """Path of the fusebox binary (see the module doc for the search order)."""
    for given, what in ((fusebox, "--fusebox"), (os.environ.get("FUSEBOX_BIN"), "FUSEBOX_BIN")):
        if given:
            if not (os.path.isfile(given) and os.access(given, os.X_OK)):
                raise FuseboxError(f"{what}={given} is not an executable file (build it with make build)")
            return given
    local = os.path.join(REPO_ROOT, "build", "fusebox")
    if os.path.exists(local):
        return local
    found = shutil.which("fusebox")
    if found:
        return found
    raise FuseboxError(f"no fusebox binary: set FUSEBOX_BIN, build {local} (make build), "
                       "or put fusebox on PATH")


def check_json(path, fusebox=None, inputs=None, timeout_s=120, shape=None):
    """The document `fusebox check PATH --json [--inputs ...] [--shape ...]` prints, as a dict.
    `inputs`: tensor name -> .npy file (sequence lengths for the FLOP count); `shape`: a symbolic
    graph's values, "B=2,S=16" (default: the symbols' defaults).
    Raises FuseboxError when fusebox rejects the graph or cannot run."""
    exe = fusebox_bin(fusebox)
    cmd = [exe, "check", path, "--json"]
    if inputs:
        cmd += ["--inputs", ",".join(f"{n}={p}" for n, p in inputs.items())]
    if shape:
        cmd += ["--shape", shape]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise FuseboxError(f"cannot run {' '.join(cmd)}: {e}") from e
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        raise FuseboxError(f"{' '.join(cmd)} exited {proc.returncode} without a JSON document "
                           f"({e}); stdout: {proc.stdout.strip()[:200]!r}; stderr: {proc.stderr.strip()[-400:]!r}",
                           returncode=proc.returncode) from e
    if not doc.get("ok"):
        # fusebox's message already names the file
        raise FuseboxError(f"{doc.get('code', 'error')}: {doc.get('error')}", code=doc.get("code"),
                           returncode=proc.returncode)
    if doc.get("version") != CHECK_JSON_VERSION:
        raise FuseboxError(f"{exe} prints check --json version {doc.get('version')}, this module reads "
                           f"version {CHECK_JSON_VERSION}: rebuild fusebox or update fusebox_tools")
    return doc


def default_graphs(repo_root=REPO_ROOT):
    """Valid example graphs: examples/graphs/*.json and small/*.json, no invalid_*."""
    paths = sorted(glob.glob(os.path.join(repo_root, "examples", "graphs", "*.json")))
    paths += sorted(glob.glob(os.path.join(repo_root, "examples", "graphs", "small", "*.json")))
    return [p for p in paths if not os.path.basename(p).startswith("invalid_")]


class SdpaOptions:
    """An sdpa op's options as resolve() left them (the op's "attrs" in check
    --json): attn_scale is set, causal already turned into right_bound 0.
    keeps() is the mask rule of include/fusebox/graph.h."""

    def __init__(self, attn_scale, right_bound=None, left_bound=None, bottom_right=False, padding=False,
                 bias=False, alibi=False, alibi_slopes=None, dropout=None, causal=False):
        self.attn_scale = attn_scale
        self.right_bound = right_bound
        self.left_bound = left_bound
        self.bottom_right = bottom_right
        self.padding = padding
        self.bias = bias
        self.alibi = alibi
        self.alibi_slopes = alibi_slopes
        self.dropout = dropout
        self.causal = causal

    @classmethod
    def from_attrs(cls, attrs):
        return cls(attn_scale=attrs["attn_scale"], right_bound=attrs["right_bound"],
                   left_bound=attrs["left_bound"], bottom_right=attrs["alignment"] == "bottom_right",
                   padding=attrs["padding"], bias=attrs["bias"], alibi=attrs["alibi"],
                   alibi_slopes=attrs["alibi_slopes"], dropout=attrs["dropout"], causal=attrs["causal"])

    def offset(self, lq, lkv):
        return lkv - lq if self.bottom_right else 0

    def keeps(self, i, j, lq, lkv):
        """Whether score (i, j) is kept, with actual lengths lq, lkv (Sq, Skv
        without padding). i and j may be ints or broadcasting arrays / tensors
        (numpy, torch): the result is then a boolean array."""
        keep = j >= 0
        if self.padding:
            keep = keep & (j < lkv) & (i < lq)
        off = self.offset(lq, lkv)
        if self.right_bound is not None:
            keep = keep & (j <= i + off + self.right_bound)
        if self.left_bound is not None:
            keep = keep & (j > i + off - self.left_bound)
        return keep


class Graph:
    """A resolved graph (see the module doc). `tensors` maps names to the
    tensor objects of check --json, in its order; `ops` is its op list
    (topological order); `dims` maps names to dims."""

    def __init__(self, doc, path=None):
        self.path = path
        self.doc = doc
        self.name = doc["graph"]
        self.io_dtype = doc["io_dtype"]
        self.intermediate_dtype = doc["intermediate_dtype"]
        self.compute_dtype = doc["compute_dtype"]
        self.fingerprint = doc["fingerprint"]
        self.flops = doc["flops"]
        self.bytes = doc["bytes"]
        self.tensors = {t["name"]: t for t in doc["tensors"]}
        self.ops = doc["ops"]
        self.dims = {n: t["dims"] for n, t in self.tensors.items()}
        self._producer = {}
        for op in self.ops:
            for role, name in op["outputs"].items():
                self._producer[name] = (op, role)

    @classmethod
    def load(cls, path, fusebox=None, inputs=None, shape=None):
        """Resolves the graph file `path` with fusebox (a symbolic one at `shape`, "B=2,S=16").
        `inputs` (name -> .npy file) only changes the FLOP count (sequence lengths)."""
        return cls(check_json(path, fusebox, inputs, shape=shape), path)

    def kind(self, name):
        """"input", "output", "virtual" or "scalar"."""
        return self.tensors[name]["kind"]

    def dtype(self, name):
        return self.tensors[name]["dtype"]

    def strides(self, name):
        return self.tensors[name]["strides"]

    def is_scalar(self, name):
        return self.kind(name) == "scalar"

    def scalar_value(self, name):
        return self.tensors[name]["scalar"]

    def values(self, name):
        """A graph input's fixed contents (logical row-major), else None."""
        return self.tensors[name]["values"]

    def random_range(self, name):
        """(lo, hi): the range fusebox draws this input's random values from."""
        t = self.tensors[name]
        return t["random_lo"], t["random_hi"]

    def inputs(self):
        """Graph inputs the caller supplies (not scalars), in fusebox's order."""
        return [n for n, t in self.tensors.items() if t["kind"] == "input"]

    def outputs(self):
        return [n for n, t in self.tensors.items() if t["kind"] == "output"]

    def consumers(self, name):
        """(op, role) pairs reading tensor `name`."""
        return [(op, role) for op in self.ops for role, t in op["inputs"].items() if t == name]

    def output_role(self, name):
        """(op, role) producing tensor `name`, or (None, None)."""
        return self._producer.get(name, (None, None))

    def tolerance(self, name):
        """(rel_l2, max_abs_rel) fusebox's --verify allows for output `name`."""
        op, role = self.output_role(name)
        if op is None or role not in op["tolerances"]:
            raise KeyError(f"{self.name}: '{name}' is not a graph output")
        t = op["tolerances"][role]
        return t["rel_l2"], t["max_abs_rel"]

    def saturation(self, name):
        """Where output `name`'s dtype saturates (fp8: 448 or 57344), else 0: fusebox's --verify
        compares a reference beyond it as the clamp (the output's own cast)."""
        op, role = self.output_role(name)
        if op is None or role not in op["tolerances"]:
            raise KeyError(f"{self.name}: '{name}' is not a graph output")
        return float(op["tolerances"][role].get("saturate_at", 0.0))

    def sdpa_options(self, op):
        return SdpaOptions.from_attrs(op["attrs"])

    def sdpa_ops(self):
        return [op for op in self.ops if op["op"] in SDPA_OPS]


def stage_profile(doc):
    """From `fusebox pipeline run --profile --json`: [(stage, ms, share of the stages' sum, TFLOP/s,
    engine)] by time, slowest first; [] when the run was not profiled."""
    rows = []
    for st in doc.get("stages") or []:
        lat = st.get("latency_ms") or {}
        if lat.get("median") is None:
            continue
        ms = float(lat["median"])
        tflops = float(st.get("flops") or 0) / (ms * 1e-3) / 1e12 if ms > 0 else 0.0
        rows.append((st.get("name") or st.get("stage") or "?", ms, tflops, st.get("engine", "")))
    total = sum(r[1] for r in rows)
    out = [(name, ms, ms / total if total > 0 else 0.0, tflops, engine) for name, ms, tflops, engine in rows]
    return sorted(out, key=lambda r: -r[1])


def stage_profile_lines(doc, top=12):
    """The slowest `top` stages of stage_profile() as text lines (empty when not profiled)."""
    prof = stage_profile(doc)
    if not prof:
        return []
    lines = [f"per stage, each alone (slowest {min(top, len(prof))} of {len(prof)}; "
             f"sum {sum(r[1] for r in prof):.4f} ms):"]
    for name, ms, share, tflops, engine in prof[:top]:
        lines.append(f"  {name:<20} {ms:9.4f} ms {100 * share:5.1f}% {tflops:7.1f} TFLOP/s  {engine}")
    return lines
