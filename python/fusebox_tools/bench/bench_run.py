"""Runs one part of the benchmark on the GPU machine and writes its results
file (the format fusebox_tools.bench.bench_report reads). scripts/bench.sh runs the
parts and the report; see docs/gpu.md, "Benchmarks".

Parts: conv, conv_bwd, matmul (FP8 matmul graphs against torch._scaled_mm),
norm (with batchnorm), pool, reduction, sdpa (the example graphs of each family,
examples/graphs/*.json; GRAPHS=... to choose others), peaks (dense bf16 and
FP8 matmul TFLOP/s, device copy GB/s) and runtime (build/bound_execute_bench
--json: host overhead of one bound execute and per execute replayed in a CUDA
graph; a chain of 10 conv+bias+relu 3x3 layers, eager launches against one
CUDA graph, beside the same network in PyTorch eager, torch.compile and a
torch.cuda.CUDAGraph; the part file's "runtime" object) and shapes (32 new
shapes of each symbolic example, built through the kernel cache and cold:
`fusebox shapes`). Symbolic examples are left out of the family parts.
Each finished row is written at once;
a part run again skips the rows its file already holds (--force: redo), so a
part cut off by a time limit resumes where it stopped.

Every row, both sides, the same two ways:
  GPU time   SAMPLES samples of CALLS back-to-back calls between two CUDA
             events (torch's CUDA-graph variant: a graph of CALLS calls,
             replayed between the events), divided by CALLS.
  latency    SAMPLES single calls, host clock from before the call until the
             GPU has finished it (synchronize): what an eager caller sees.
fusebox: `fusebox run GRAPH --json --warmup W --iters CALLS --samples SAMPLES`
(gpu_time_ms, host_latency_ms). torch, four variants (issue 36): eager ops of
the graph as a user calls them (fusebox_tools.bench.torch_compare's; conv backward
through aten.convolution_backward with the real x / w tensors in the graph's
layout, as autograd calls it; for sdpa F.scaled_dot_product_attention with
the fastest backend of cuDNN/flash/efficient; autograd.grad of a saved
forward for RMSNorm and attention backwards), torch.compile of them in mode
max-autotune-no-cudagraphs and in mode reduce-overhead (backwards: the forward
compiled, autograd.grad through it; the compile time in "compile_s"), and a
torch.cuda.CUDAGraph of the eager calls. Before a variant is timed its
outputs are compared with eager's, and eager's with fusebox's on the same
inputs (`fusebox run --inputs`), within twice fusebox's tolerance; a variant
that fails is in the row's "torch_failed" with its error, and the report
lists the row as incomplete. Inputs: uniform in fusebox's range for each
input on both sides ([-1, 1] for most), rotated through copies totalling
more than twice the L2 on both sides. The GPU clocks (nvidia-smi) are
recorded before and after each row.

    python3 -m fusebox_tools.bench.bench_run --part conv --out .bench/RUN/conv.json
"""
import argparse
import datetime
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np
import torch
import torch.nn.functional as F

from fusebox_tools.bench import sdpa_compare, torch_compare
from fusebox_tools.bench.bench_report import SCHEMA, model_target
from fusebox_tools.core.graph import REPO_ROOT, SDPA_BWD_OPS, FuseboxError, Graph, default_graphs, fusebox_bin
from fusebox_tools.core.torch_ops import BLOCK_TILE, block_tile_keep

PARTS = ("conv", "conv_bwd", "matmul", "norm", "pool", "reduction", "sdpa", "peaks", "runtime", "shapes", "models")
# Part "shapes" (issue 11): 32 new shapes of each symbolic example, through the
# kernel cache and cold, by `fusebox shapes --json`.
SHAPE_SWEEPS = {
    "examples/graphs/conv_bias_relu_dyn.json": ["N=1..32"],
    "examples/graphs/matmul_bias_gelu_dyn.json": ["M=64..2048:64"],
    "examples/graphs/sdpa_fwd_dyn.json": ["S=16..512:16"],
}
FP8_DTYPES = ("fp8_e4m3", "fp8_e5m2")
COMPILE_MODE = os.environ.get("BENCH_COMPILE_MODE", "max-autotune-no-cudagraphs")


def log(msg):
    print(f"bench_run {datetime.datetime.now(datetime.timezone.utc).strftime('%H:%M:%S')}: {msg}",
          file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the machine

def nvidia_smi(query):
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
        return [x.strip() for x in out.splitlines()[0].split(",")] if out else None
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return None


def clocks():
    """SM and memory clocks, temperature, power and throttle reasons now."""
    v = nvidia_smi("clocks.sm,clocks.mem,temperature.gpu,power.draw")
    if not v or len(v) < 4:
        return {"error": "nvidia-smi unavailable"}

    def num(x):
        try:
            return float(x)
        except ValueError:
            return x
    out = {"sm_mhz": num(v[0]), "mem_mhz": num(v[1]), "temp_c": num(v[2]), "power_w": num(v[3])}
    for field in ("clocks_event_reasons.active", "clocks_throttle_reasons.active"):  # newer, older name
        r = nvidia_smi(field)
        if r and r[0].startswith("0x"):
            out["throttle"] = r[0]
            break
    return out


def versions(fusebox):
    out = {"torch": torch.__version__, "torch_cudnn": str(torch.backends.cudnn.version()),
           "cuda": torch.version.cuda}
    v = nvidia_smi("driver_version")
    out["driver"] = v[0] if v else None
    try:
        text = subprocess.run([fusebox, "--version"], capture_output=True, text=True, timeout=60).stdout
        for line in text.splitlines():
            if line.startswith("fusebox "):
                out["fusebox"] = line.split(" ", 1)[1]
            elif line.startswith("cuDNN Frontend "):
                out["frontend"] = line.split()[2]
            elif line.startswith("cuDNN "):
                out["cudnn"] = line.split(",")[-1].strip().split()[0]  # the runtime's
    except (OSError, subprocess.TimeoutExpired):
        pass
    return out


# ---------------------------------------------------------------- timing (torch)

def gpu_samples(fn, sets, calls, samples, warmup):
    """Per-call GPU time of `calls` back-to-back calls, `samples` times (ms)."""
    n = len(sets)
    for k in range(warmup):
        fn(sets[k % n])
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out, k = [], 0
    for _ in range(samples):
        e0.record()
        for _ in range(calls):
            fn(sets[k % n])
            k += 1
        e1.record()
        e1.synchronize()
        out.append(e0.elapsed_time(e1) / calls)
    return out


def latency_samples(fn, sets, samples):
    """Host time of one call until the GPU has finished it (ms), `samples` times."""
    torch.cuda.synchronize()
    out = []
    for k in range(samples):
        t0 = time.perf_counter()
        fn(sets[k % len(sets)])
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def graph_variant(fn, sets, calls, samples, warmup, prepare=None, check=None):
    """A torch.cuda.CUDAGraph of `calls` calls over the rotated sets: GPU time
    per call (replays between events) and latency (one replay of a one-call
    graph, synchronized). `prepare` (autograd backwards) redoes the forward on
    the capture stream first: autograd runs a backward op on its forward's
    stream, so a forward left on the default stream breaks the capture.
    `check(outputs)`: the one-call graph's outputs on sets[0], after one replay and
    before any timing; it raises when they are not the eager ones."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        if prepare is not None:
            prepare()
        for k in range(max(3, warmup)):
            fn(sets[k % len(sets)])
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    many, one = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(many, stream=s):
        keep = [fn(sets[k % len(sets)]) for k in range(calls)]
    with torch.cuda.graph(one, stream=s):
        keep.append(fn(sets[0]))
    if check is not None:
        one.replay()
        torch.cuda.synchronize()
        check(keep[-1])
    for _ in range(3):
        many.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gpu = []
    for _ in range(samples):
        e0.record()
        many.replay()
        e1.record()
        e1.synchronize()
        gpu.append(e0.elapsed_time(e1) / calls)
    lat = []
    for _ in range(samples):
        t0 = time.perf_counter()
        one.replay()
        torch.cuda.synchronize()
        lat.append((time.perf_counter() - t0) * 1e3)
    del keep, many, one
    return {"gpu_ms": gpu, "latency_ms": lat}


# The torch.compile variants every row times (issue 36): Inductor without CUDA graphs (autotuned
# kernels; BENCH_COMPILE_MODE overrides its mode), and with them (reduce-overhead: Inductor's CUDA
# graph trees). bench_report.TORCH_VARIANTS lists them with eager and the manual CUDA graph.
COMPILE_VARIANTS = {"compile": COMPILE_MODE, "compile_cudagraphs": "reduce-overhead"}


class VariantMismatch(Exception):
    """A torch variant's outputs are not the eager ones (or eager's not fusebox's)."""


def output_list(res):
    """A function's outputs as a flat list of tensors (a tensor, a tuple or a list of them)."""
    if torch.is_tensor(res):
        return [res]
    out = []
    for r in res or []:
        out += output_list(r) if isinstance(r, (list, tuple)) else [r]
    return out


def snapshot(res):
    """Detached copies of the outputs (a CUDA graph or reduce-overhead rerun overwrites its own)."""
    return [t.detach().clone() if torch.is_tensor(t) else t for t in output_list(res)]


def compare_outputs(got, ref, tols, what="eager"):
    """Whether each output matches the reference within twice the graph's tolerance for it (both
    sides are each held to the tolerance against the exact result, so they may differ by twice
    it). `tols`: [(rel_l2, max_abs_rel)] per output (the last one repeats). Elements that are not
    finite must be so on both sides. Returns (ok, detail)."""
    got, ref = output_list(got), output_list(ref)
    if len(got) != len(ref):
        return False, f"{len(got)} outputs, {what} gave {len(ref)}"
    worst = []
    for i, (g, r) in enumerate(zip(got, ref)):
        if g is None or r is None:
            if (g is None) != (r is None):
                return False, f"output {i}: None on one side only"
            continue
        g64, r64 = g.detach().double().reshape(-1), r.detach().double().reshape(-1)
        if g64.numel() != r64.numel():
            return False, f"output {i}: {tuple(g.shape)} against {what}'s {tuple(r.shape)}"
        fg, fr = torch.isfinite(g64), torch.isfinite(r64)
        if not torch.equal(fg, fr):
            return False, f"output {i}: {int((fg != fr).sum())} elements finite on one side only"
        zero = torch.zeros((), dtype=torch.float64, device=g64.device)
        g64, r64 = torch.where(fr, g64, zero), torch.where(fr, r64, zero)
        d = g64 - r64
        rn, rmax = float(r64.norm()), float(r64.abs().max()) if r64.numel() else 0.0
        rel = float(d.norm()) / rn if rn > 0 else float(d.norm())
        mar = (float(d.abs().max()) / rmax if rmax > 0 else float(d.abs().max())) if d.numel() else 0.0
        rel_tol, max_tol = tols[min(i, len(tols) - 1)] if tols else (1e-2, 4e-2)
        ok = rel <= 2 * rel_tol and mar <= 2 * max_tol
        worst.append(f"output {i}: rel_l2 {rel:.1e} (<= {2 * rel_tol:.0e}), max_abs_rel {mar:.1e} "
                     f"(<= {2 * max_tol:.0e})")
        if not ok:
            return False, f"against {what}: " + worst[-1]
    return True, f"against {what}: " + "; ".join(worst)


def torch_variants(fn, sets, args, notes, compile_fn=True, graph_ok=True, prepare=None, failed=None,
                   tols=None, eager_check=None):
    """The four torch variants of fn (bench_report.TORCH_VARIANTS): eager, torch.compile in each
    COMPILE_VARIANTS mode (compile time in "compile_s") and a manual CUDA graph. Before a variant
    is timed its outputs on sets[0] are compared with eager's (compare_outputs, `tols`), and
    eager's with fusebox's where the caller gives `eager_check(outputs) -> (ok, detail)`.
    A variant that raises or computes other values is None, its error in `failed` (the row's
    "torch_failed") and the notes. `compile_fn`: True (torch.compile(fn)), or a callable
    mode -> compiled function (autograd backwards: the forward compiled, autograd.grad through
    it), or a string saying why the row cannot be compiled. `prepare`: see graph_variant."""
    out = {}
    failed = {} if failed is None else failed

    def fail(key, e):
        msg = f"{type(e).__name__}: {first_line(e)}" if isinstance(e, Exception) else str(e)
        failed[key] = msg
        notes.append(f"torch {key} failed: {msg}")
        if args.verbose and isinstance(e, Exception):
            traceback.print_exc()

    try:
        ref = snapshot(fn(sets[0]))
        torch.cuda.synchronize()
        if eager_check is not None:
            ok, detail = eager_check(ref)
            if ok is False:
                raise VariantMismatch(f"eager differs from fusebox on the same inputs: {detail}")
            if ok:
                notes.append(f"torch eager checked against fusebox's outputs ({detail})")
            else:
                notes.append(f"torch eager not checked against fusebox: {detail}")
        out["eager"] = {"gpu_ms": gpu_samples(fn, sets, args.calls, args.samples, args.warmup),
                        "latency_ms": latency_samples(fn, sets, args.samples)}
    except Exception as e:
        out["eager"] = None
        fail("eager", e)
        for key in (*COMPILE_VARIANTS, "cuda_graph"):
            out[key] = None
            failed[key] = "not run: torch eager, its reference, failed"
        return out

    def check(res, key):
        ok, detail = compare_outputs(res, ref, tols)
        if not ok:
            raise VariantMismatch(detail)
        return {"pass": True, "detail": detail}

    for key, mode in COMPILE_VARIANTS.items():
        out[key] = None
        if args.no_compile or isinstance(compile_fn, str) or compile_fn is False:
            fail(key, "not run: " + ("--no-compile" if args.no_compile else str(compile_fn)))
            continue
        # An autograd backward under CUDA graph trees: one input set (a forward's saved tensors live in
        # the tree's memory, which the next set's forward would overwrite); this favours torch.
        csets = sets[:1] if callable(compile_fn) and "reduce-overhead" in mode else sets
        try:
            torch._dynamo.reset()  # each mode compiles afresh (its compile time is its own)
            t0 = time.perf_counter()
            c = compile_fn(mode) if callable(compile_fn) else torch.compile(fn, mode=mode, dynamic=False)
            for k in range(len(csets)):  # compiles (and autotunes) outside the timed region
                c(csets[k])
            torch.cuda.synchronize()
            compile_s = time.perf_counter() - t0
            notes.append(f"torch.compile({mode}) took {compile_s:.0f} s"
                         + (" (timed on one input set)" if len(csets) < len(sets) else ""))
            chk = check(snapshot(c(csets[0])), key)
            out[key] = {"gpu_ms": gpu_samples(c, csets, args.calls, args.samples, args.warmup),
                        "latency_ms": latency_samples(c, csets, args.samples), "compile_s": round(compile_s, 1),
                        "mode": mode, "check": chk, "input_sets": len(csets)}
        except Exception as e:
            out[key] = None
            fail(key, e)
        torch.cuda.synchronize()
    out["cuda_graph"] = None
    if graph_ok:
        try:
            got = {}
            out["cuda_graph"] = graph_variant(fn, sets, args.calls, args.samples, args.warmup, prepare,
                                              check=lambda res: got.update(check=check(res, "cuda_graph")))
            out["cuda_graph"]["check"] = got.get("check")
        except Exception as e:
            fail("cuda_graph", e)
            torch.cuda.synchronize()
    else:
        fail("cuda_graph", "not run: not capturable here")
    torch.cuda.synchronize()
    return out


def first_line(e):
    msg = str(e).strip().splitlines()
    return msg[0][:300] if msg else ""


# ---------------------------------------------------------------- fusebox

def tune_fusebox(args, path, notes):
    """BENCH_TUNE=1 (--tune): `fusebox tune` into the part's own plan cache before the timing, so
    that `run` times the tuned winner (fusebox's autotuning, as torch.compile autotunes). The
    winner against the heuristics' choice goes into the row's notes. Returns the tune JSON or None."""
    cmd = [args.fusebox, "tune", path, "--json", "--cache", args.tune_cache, "--iters", "20"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        r = json.loads(proc.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError) as e:
        notes.append(f"fusebox tune failed ({type(e).__name__}); timed the heuristics' choice")
        return None
    if proc.returncode != 0 or not r.get("winner"):
        notes.append(f"fusebox tune: exit {proc.returncode} ({str(r.get('error', ''))[:200]}); timed the heuristics' choice")
        return None
    if r.get("heuristic_choice"):
        notes.append(f"tuned: {r['winner']} ({r['winner_median_ms']:.4f} ms in tune) against the heuristics' "
                     f"{r['heuristic_choice']} ({r.get('speedup_over_heuristic', 0):.2f}x)")
    else:
        notes.append(f"tuned: {r['winner']} (plan cache {r.get('cache')})")
    return r


def time_fusebox(args, path, input_files, notes):
    """fusebox's GPU time of the graph, timed the two ways torch's side is (its eager and its
    CUDA graph variants): back-to-back `run` calls, and `run --cuda-graph` (the plan in a CUDA
    graph, replayed back to back). gpu_ms holds the faster one's samples (`timed_as` says which),
    as torch's best is the fastest of its variants; both medians go into the notes."""
    tuned = None
    if getattr(args, "tune", False):
        tuned = tune_fusebox(args, path, notes)
    eager = _time_fusebox_once(args, path, input_files, notes, tuned, cuda_graph=False)
    if eager is None or getattr(args, "no_fusebox_graph", False):
        return eager
    graph_notes = []
    graph = _time_fusebox_once(args, path, input_files, graph_notes, tuned, cuda_graph=True)
    if graph is None or not graph.get("gpu_samples"):
        notes.append("fusebox as a CUDA graph: not timed (" + "; ".join(graph_notes)[:200] + ")")
        return eager
    med = lambda v: sorted(v)[len(v) // 2]
    e, g = med(eager["gpu_ms"]), med(graph["gpu_ms"])
    eager["eager_gpu_ms"], eager["cuda_graph_gpu_ms"] = eager["gpu_ms"], graph["gpu_ms"]
    notes.append(f"fusebox GPU time: back-to-back runs {e * 1e3:.1f} us, as a CUDA graph {g * 1e3:.1f} us")
    if g < e:
        eager["gpu_ms"], eager["timed_as"] = graph["gpu_ms"], "cuda_graph"
    return eager


def _time_fusebox_once(args, path, input_files, notes, tuned, cuda_graph):
    cmd = [args.fusebox, "run", path, "--json", "--warmup", str(args.warmup), "--iters", str(args.calls),
           "--samples", str(args.samples)]
    if input_files:
        cmd += ["--inputs", ",".join(f"{n}={p}" for n, p in input_files.items())]
    if getattr(args, "tune", False):
        cmd += ["--cache", args.tune_cache] if tuned else ["--no-cache"]
    if cuda_graph:
        cmd.append("--cuda-graph")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        notes.append(f"fusebox: {type(e).__name__}: {e}")
        return None
    if proc.returncode != 0:
        notes.append(f"fusebox: exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
        return None
    try:
        r = json.loads(proc.stdout)
    except ValueError as e:
        notes.append(f"fusebox: unreadable --json ({e})")
        return None
    out = {"engine": r.get("engine"), "workspace_bytes": r.get("workspace_bytes"), "plan_source": r.get("plan_source"),
           "per_call_events_ms": r.get("latency_ms"), "input_sets": r.get("input_sets"),
           "tuned": tuned is not None, "timed_as": "cuda_graph" if cuda_graph else "eager"}
    gpu = (r.get("gpu_time_ms") or {}).get("samples")
    lat = (r.get("host_latency_ms") or {}).get("samples")
    out["gpu_samples"] = bool(gpu)
    if gpu:
        out["gpu_ms"], out["latency_ms"] = gpu, lat
    else:  # a fusebox from before --samples: events around each call
        out["gpu_ms"] = [r["latency_ms"]["median"]]
        notes.append("fusebox without --samples: GPU time = median of events around each call")
    return out


# ---------------------------------------------------------------- rows

def family(graph):
    """The BENCHMARKS.md section a graph is timed in: the bench_family of its first op that is not
    pointwise (each op's traits in `fusebox check --json`, from src/graph/ops/traits.h), else
    "pointwise"."""
    fams = [op["traits"]["bench_family"] for op in graph.ops]
    return next((f for f in fams if f != "pointwise"), "pointwise")


def n_sets(graph):
    """Input copies to rotate through: fusebox's rule (input_rotation_sets, fusebox/runtime.h), read
    from `fusebox check --json`, so both sides read their inputs from beyond the L2 alike."""
    return graph.doc["rotation_sets"]


def output_tolerances(graph, out_names):
    """[(rel_l2, max_abs_rel)] fusebox's --verify allows for each named graph output (check --json);
    an output with no graph counterpart (None) gets the first named one's."""
    tols = [graph.tolerance(n) if n in graph.outputs() else None for n in out_names]
    first = next((t for t in tols if t), (1e-2, 4e-2))
    return [t or first for t in tols]


def fusebox_check(args, path, graph, s, out_names):
    """eager_check for torch_variants: `fusebox run --inputs` on the set `s` itself (its graph
    inputs saved as .npy, float tensors as float32: exact for bf16/fp16), --save-outputs, then
    each torch output that is a graph output (`out_names`, None: no counterpart) compared with
    fusebox's (compare_outputs: twice the graph's tolerance). Returns (True/False, detail), or
    (None, why) when the comparison could not be made."""
    def check(eager_outs):
        names = [n if n in graph.outputs() else None for n in out_names]
        if not any(names):
            return None, "none of torch's outputs is a graph output"
        work = tempfile.mkdtemp(prefix="bench_check_")
        try:
            files = {}
            for name in graph.inputs():
                t = s[name].detach()
                files[name] = os.path.join(work, f"in_{name}.npy")
                np.save(files[name], np.ascontiguousarray((t.float() if t.is_floating_point() else t).cpu().numpy()))
            out_dir = os.path.join(work, "out")
            cmd = [args.fusebox, "run", path, "--json", "--inputs", ",".join(f"{n}={p}" for n, p in files.items()),
                   "--save-outputs", out_dir]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            if proc.returncode != 0:
                return None, f"fusebox run --inputs exited {proc.returncode}: {proc.stderr.strip()[-200:]}"
            got, ref, tols, checked = [], [], [], []
            for t, name in zip(output_list(eager_outs), names):
                if name is None:
                    continue
                got.append(torch.from_numpy(np.load(os.path.join(out_dir, f"{name}.npy")).astype(np.float64)))
                ref.append(t.detach().double().cpu())
                tols.append(graph.tolerance(name))
                checked.append(name)
            ok, detail = compare_outputs(ref, got, tols, what="fusebox")
            return ok, f"{', '.join(checked)}: {detail}"
        except (OSError, ValueError, subprocess.TimeoutExpired) as e:
            return None, f"{type(e).__name__}: {first_line(e)}"
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return check


def conv_bwd_operands(graph, sets, notes):
    """The real tensor autograd would hand aten.convolution_backward beside dy: for conv_dgrad the
    forward's input x (dims x_dims, in the layout of the graph's dx: channels_last for NHWC), for
    conv_wgrad the weight (w_dims, in dw's layout), one per set under "_x:OP" / "_w:OP" (values
    not read by the kernel; zeros). torch_compare.make_eager_fn passes them to torch_ops."""
    for op in graph.ops:
        if op["op"] not in ("conv_dgrad", "conv_wgrad"):
            continue
        role, out, dims_key = ("x", "dx", "x_dims") if op["op"] == "conv_dgrad" else ("w", "dw", "w_dims")
        out_name = op["outputs"][out]
        strides = graph.strides(out_name)
        dtype = sets[0][op["inputs"]["dy"]].dtype
        for st in sets:
            st[f"_{role}:{op['name']}"] = torch.empty_strided(op["attrs"][dims_key], strides, dtype=dtype,
                                                              device="cuda").zero_()
        layout = "channels_last" if strides[1] == 1 and len(strides) > 3 else "contiguous"
        notes.append(f"torch: aten.convolution_backward with a real {role} tensor ({layout}, as autograd "
                     f"passes it), output mask {'dx' if role == 'x' else 'dw'} only")


def bench_plain(path, graph, args, row):
    notes = row["notes"]
    row["fusebox"] = time_fusebox(args, path, {}, notes)
    fn = torch_compare.make_eager_fn(graph)
    out_names = graph.outputs()
    with torch.no_grad():
        sets = torch_compare.make_input_sets(graph, n_sets(graph), "cuda")
        if family(graph) == "conv_bwd":
            conv_bwd_operands(graph, sets, notes)
        row["input_sets"] = len(sets)
        row["torch"] = torch_variants(fn, sets, args, notes, failed=row["torch_failed"],
                                      tols=output_tolerances(graph, out_names),
                                      eager_check=fusebox_check(args, path, graph, sets[0], out_names))
    del sets


BATCHNORM_OPS = ("batchnorm", "batchnorm_inference", "batchnorm_bwd")


def _relu_after(graph, op):
    """Whether a relu reads the op's "y" (the fused batchnorm + ReLU examples)."""
    y = op["outputs"].get("y")
    return any(o["op"] == "relu" and o["inputs"].get("x") == y for o in graph.ops)


def batchnorm_torch_fn(graph, op, notes):
    """The graph's batchnorm op with PyTorch's own kernels (channels_last
    inputs as the graph lays them out, fp32 per-channel tensors):
    F.batch_norm in training mode (it updates the running statistics in
    place, as fusebox writes next_running_*), F.batch_norm in eval mode from
    running_var = 1/inv_variance^2 - eps (computed once, outside the timing:
    cuDNN's op takes the inverse standard deviation, torch the variance), and
    aten.native_batch_norm_backward. A relu after the op is applied too (one
    more kernel in eager; torch.compile may fuse it). Returns (fn, prepare, the graph output
    each of fn's outputs is)."""
    kind, a, t = op["op"], op["attrs"], op["inputs"]
    eps, momentum = float(a.get("epsilon", 1e-5)), float(a.get("momentum", 0.1))
    relu = _relu_after(graph, op)
    y_name = op["outputs"].get("y")
    if relu:
        y_name = next(o["outputs"]["y"] for o in graph.ops if o["op"] == "relu" and o["inputs"].get("x") == y_name)

    def flat(x):
        return x.reshape(-1)

    def act(y):
        return F.relu(y) if relu else y

    if kind == "batchnorm":
        notes.append("torch: F.batch_norm(training=True) (y; running statistics updated in place)"
                     + (" + F.relu" if relu else ""))

        def fn(s):
            return [act(F.batch_norm(s[t["x"]], s["_rm"], s["_rv"], flat(s[t["scale"]]), flat(s[t["bias"]]),
                                     training=True, momentum=momentum, eps=eps))]

        def prepare(s):
            s["_rm"] = flat(s[t["running_mean"]]).float().clone()
            s["_rv"] = flat(s[t["running_var"]]).float().clone()
    elif kind == "batchnorm_inference":
        notes.append("torch: F.batch_norm(training=False), running_var = 1/inv_variance^2 - eps"
                     + (" + F.relu" if relu else ""))

        def fn(s):
            return [act(F.batch_norm(s[t["x"]], s["_rm"], s["_rv"], flat(s[t["scale"]]), flat(s[t["bias"]]),
                                     training=False, eps=eps))]

        def prepare(s):
            s["_rm"] = flat(s[t["mean"]]).float()
            s["_rv"] = flat(s[t["inv_variance"]]).float().pow(-2) - eps
    else:
        notes.append("torch: aten.native_batch_norm_backward (dx, dscale, dbias)")

        def fn(s):
            return list(torch.ops.aten.native_batch_norm_backward(
                s[t["dy"]], s[t["x"]], flat(s[t["scale"]]), None, None, flat(s[t["mean"]]),
                flat(s[t["inv_variance"]]), True, eps, [True, True, True]))

        def prepare(s):
            pass
        return fn, prepare, [op["outputs"].get("dx"), op["outputs"].get("dscale"), op["outputs"].get("dbias")]
    return fn, prepare, [y_name]


def pool_torch_fn(graph, notes):
    """The graph's pooling op with PyTorch's own kernels on the channels_last
    input: F.max_pool2d/3d, F.avg_pool2d/3d (count_include_pad as the graph
    says), and for global_avg_pool F.adaptive_avg_pool2d/3d(x, 1) (what
    torchvision's ResNet runs)."""
    op = next(o for o in graph.ops if o["op"] in ("max_pool", "avg_pool", "global_avg_pool"))
    if len(graph.ops) > 1:
        notes.append(f"graph has {len(graph.ops)} ops; torch times only '{op['name']}'")
    kind, a, x = op["op"], op["attrs"], op["inputs"]["x"]
    nsp = len(graph.dims[x]) - 2
    geometry = dict(kernel_size=tuple(a["window"]), stride=tuple(a["stride"]), padding=tuple(a["padding"]))
    if kind == "global_avg_pool":
        notes.append(f"torch: F.adaptive_avg_pool{nsp}d(x, 1)")
        pool = F.adaptive_avg_pool2d if nsp == 2 else F.adaptive_avg_pool3d
        return lambda s: [pool(s[x], 1)]
    if kind == "max_pool":
        notes.append(f"torch: F.max_pool{nsp}d")
        pool = F.max_pool2d if nsp == 2 else F.max_pool3d
        return lambda s: [pool(s[x], **geometry)]
    notes.append(f"torch: F.avg_pool{nsp}d(count_include_pad={bool(a['count_include_pad'])})")
    pool = F.avg_pool2d if nsp == 2 else F.avg_pool3d
    return lambda s: [pool(s[x], count_include_pad=bool(a["count_include_pad"]), **geometry)]


def bench_pool(path, graph, args, row):
    notes = row["notes"]
    row["fusebox"] = time_fusebox(args, path, {}, notes)
    fn = pool_torch_fn(graph, notes)
    op = next(o for o in graph.ops if o["op"] in ("max_pool", "avg_pool", "global_avg_pool"))
    out_names = [op["outputs"]["y"]]
    with torch.no_grad():
        sets = torch_compare.make_input_sets(graph, n_sets(graph), "cuda")
        row["input_sets"] = len(sets)
        row["torch"] = torch_variants(fn, sets, args, notes, failed=row["torch_failed"],
                                      tols=output_tolerances(graph, out_names),
                                      eager_check=fusebox_check(args, path, graph, sets[0], out_names))
    del sets


def norm_torch_fn(graph, notes):
    """The graph's norm op with PyTorch's own kernels, as a framework user runs it
    (torch_ops' versions are the float32 cross-check reference, not a speed
    baseline): native_layer_norm (training: y, mean, rstd) or F.layer_norm,
    F.rms_norm, native_layer_norm_backward; rmsnorm_bwd as autograd.grad of a
    saved F.rms_norm forward (torch has no public RMS-norm backward op).
    Returns (fn, the graph output each of fn's outputs is, compile: True, or for the backward
    through autograd mode -> fn with the forward compiled in that mode)."""
    op = next(o for o in graph.ops if o["op"] in ("layernorm", "rmsnorm", "layernorm_bwd", "rmsnorm_bwd"))
    if len(graph.ops) > 1:
        notes.append(f"graph has {len(graph.ops)} ops; torch times only '{op['name']}'")
    kind, a, t = op["op"], op["attrs"], op["inputs"]
    o = op["outputs"]
    dims, eps = a["normalized_dims"], float(a.get("epsilon", 1e-5))

    def shape(x):
        return tuple(x.shape[d] for d in dims)

    def param(s, role, x):
        # aten's layer norm wants its parameters in x's dtype (as a bf16 model
        # holds them): converted once per input set (the first call is a
        # warm-up), never inside the timing
        key = "_" + role
        if key not in s:
            s[key] = s[t[role]].reshape(shape(x)).to(x.dtype)
        return s[key]

    if kind == "layernorm":
        training = a["phase"] == "training"
        if training:
            notes.append("torch: aten.native_layer_norm (y, mean, rstd)")

        def fn(s):
            x = s[t["x"]]
            sh = shape(x)
            w, b = param(s, "scale", x), param(s, "bias", x)
            if training:
                return list(torch.ops.aten.native_layer_norm(x, list(sh), w, b, eps))
            return [F.layer_norm(x, sh, w, b, eps)]
        return fn, [o.get("y"), o.get("mean"), o.get("inv_variance")] if training else [o.get("y")], True
    if kind == "rmsnorm":
        if a["phase"] == "training":
            notes.append("torch: F.rms_norm returns no inv_variance (fusebox also writes it)")

        def fn(s):
            x = s[t["x"]]
            sh = shape(x)
            y = F.rms_norm(x, sh, s[t["scale"]].reshape(sh), eps)
            return [y + s[t["bias"]].reshape(sh)] if "bias" in t else [y]
        return fn, [o.get("y")], True
    if kind == "layernorm_bwd":
        notes.append("torch: aten.native_layer_norm_backward (dx, dscale, dbias)")

        def fn(s):
            x = s[t["x"]]
            sh = shape(x)
            w = param(s, "scale", x)
            if "_zero_bias" not in s:  # once per set, outside the timing (as param())
                s["_zero_bias"] = torch.zeros_like(w)
            return list(torch.ops.aten.native_layer_norm_backward(
                s[t["dy"]], x, list(sh), s[t["mean"]], s[t["inv_variance"]], w, s["_zero_bias"],
                [True, True, True]))
        return fn, [o.get("dx"), o.get("dscale"), o.get("dbias")], True
    notes.append("torch: autograd.grad of a saved F.rms_norm forward (dx, dscale); the compile variants "
                 "compile that forward and time autograd.grad through the compiled graph's backward")

    def forward(s):
        return F.rms_norm(s["_xg"], shape(s["_xg"]), s["_wg"], eps)

    def backward_of(fwd, key):
        def fn(s):
            if "_xg" not in s:
                s["_xg"] = s[t["x"]].detach().requires_grad_(True)
                s["_wg"] = s[t["scale"]].detach().reshape(shape(s["_xg"])).requires_grad_(True)
            if key not in s:  # the forward, once per input set (bench_norm does it before any timing)
                with torch.enable_grad():
                    s[key] = fwd(s)
            return torch.autograd.grad(s[key], (s["_xg"], s["_wg"]), s[t["dy"]], retain_graph=True)
        return fn

    def compiled(mode):
        return backward_of(torch.compile(forward, mode=mode, dynamic=False), "_y_" + mode)

    return backward_of(forward, "_y"), [o.get("dx"), o.get("dscale")], compiled


def bench_norm(path, graph, args, row):
    notes = row["notes"]
    row["fusebox"] = time_fusebox(args, path, {}, notes)
    bn = next((o for o in graph.ops if o["op"] in BATCHNORM_OPS), None)
    bn_prepare = None
    if bn is not None:
        fn, bn_prepare, out_names = batchnorm_torch_fn(graph, bn, notes)
        compile_fn = True
    else:
        fn, out_names, compile_fn = norm_torch_fn(graph, notes)
    autograd = callable(compile_fn)  # rmsnorm_bwd: autograd.grad of a saved forward
    sets = torch_compare.make_input_sets(graph, n_sets(graph), "cuda")
    row["input_sets"] = len(sets)
    rms_bwd = next((o for o in graph.ops if o["op"] == "rmsnorm_bwd"), None)
    if rms_bwd is not None and "inv_variance" in rms_bwd["inputs"]:
        # fusebox's op takes the forward's saved inv_variance; torch's autograd recomputes it from x:
        # give fusebox the forward's own (1/sqrt(mean(x^2) + eps) of each set's x) so both compute one thing
        dims = list(rms_bwd["attrs"]["normalized_dims"])
        eps = float(rms_bwd["attrs"].get("epsilon", 1e-5))
        with torch.no_grad():
            for s in sets:
                iv = s[rms_bwd["inputs"]["inv_variance"]]
                x = s[rms_bwd["inputs"]["x"]].float()
                iv.copy_(torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + eps).reshape(iv.shape))
        notes.append("inv_variance input: the forward's own for each set's x (torch's autograd recomputes it)")
    if bn_prepare is not None:  # torch's form of the statistics, outside the timing
        for s in sets:
            bn_prepare(s)
    for s in sets:  # the forward of rmsnorm_bwd, before any timing
        with torch.enable_grad():
            fn(s)
    torch.cuda.synchronize()

    def prepare():  # the saved forwards again, on the capturing stream (graph_variant)
        for s in sets:
            s.pop("_y", None)
            with torch.enable_grad():
                fn(s)

    # The fusebox check reads the set before torch's statistics are updated in place.
    check = fusebox_check(args, path, graph, sets[0], out_names)
    with torch.set_grad_enabled(autograd):
        row["torch"] = torch_variants(fn, sets, args, notes, compile_fn=compile_fn,
                                      prepare=prepare if autograd else None, failed=row["torch_failed"],
                                      tols=output_tolerances(graph, out_names), eager_check=check)
    del sets


def fp8_matmul_plan(graph):
    """The tensors of an FP8 matmul graph (docs/graph-format.md, "FP8 epilogues"),
    or None when the graph's matmul does not take FP8 inputs: a, b, the first two
    `scale` ops' factors (descale_a, descale_b), a third one (scale_y: the output
    scale), the output "y" and its dtype, and the reduce_amax output if any."""
    mm = next((o for o in graph.ops if o["op"] == "matmul"), None)
    if mm is None or graph.dtype(mm["inputs"]["a"]) not in FP8_DTYPES:
        return None
    scales = [o["inputs"]["scale"] for o in graph.ops if o["op"] == "scale"]
    amax = next((o["outputs"]["y"] for o in graph.ops if o["op"] == "reduce_amax"), None)
    outs = [n for n in graph.outputs() if n != amax]
    plan = {"a": mm["inputs"]["a"], "b": mm["inputs"]["b"], "descale_a": scales[0] if scales else None,
            "descale_b": scales[1] if len(scales) > 1 else None, "scale_y": scales[2] if len(scales) > 2 else None,
            "y": outs[0] if outs else None, "amax": amax}
    plan["out_dtype"] = graph.dtype(plan["y"]) if plan["y"] else None
    return plan


def bench_fp8_matmul(path, graph, args, row):
    """An FP8 matmul graph against torch._scaled_mm (cuBLASLt's FP8 GEMM) with the
    same per-tensor scales and output dtype: torch computes no amax (fusebox
    does, when the graph has a reduce_amax)."""
    notes = row["notes"]
    plan = fp8_matmul_plan(graph)
    row["fusebox"] = time_fusebox(args, path, {}, notes)
    tdt = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2, "bf16": torch.bfloat16,
           "fp16": torch.float16, "fp32": torch.float32}
    a_dims, b_dims = graph.dims[plan["a"]], graph.dims[plan["b"]]
    m, k, n = a_dims[-2], a_dims[-1], b_dims[-1]
    if any(d != 1 for d in a_dims[:-2] + b_dims[:-2]):
        notes.append("torch: _scaled_mm is 2-D only; batch dims not timed")
        row["torch"] = None
        row["torch_failed"]["eager"] = "torch._scaled_mm is 2-D only: this batched FP8 matmul has no torch baseline"
        return
    gen = torch.Generator(device="cuda").manual_seed(1234)

    def scalar(name, default=1.0):
        v = graph.values(name) if name else None
        return torch.tensor(float(v[0]) if v else default, dtype=torch.float32, device="cuda")

    sets = []
    for _ in range(n_sets(graph)):
        a = (torch.rand(m, k, generator=gen, device="cuda") * 2 - 1).to(tdt[graph.dtype(plan["a"])])
        b = (torch.rand(n, k, generator=gen, device="cuda") * 2 - 1).to(tdt[graph.dtype(plan["b"])]).t()
        sets.append({"a": a, "b": b, "sa": scalar(plan["descale_a"]), "sb": scalar(plan["descale_b"]),
                     "sy": scalar(plan["scale_y"])})
    row["input_sets"] = len(sets)
    out_dtype = tdt[plan["out_dtype"]]
    fp8_out = plan["out_dtype"] in FP8_DTYPES
    notes.append(f"torch: _scaled_mm({graph.dtype(plan['a'])} x {graph.dtype(plan['b'])} col-major -> "
                 f"{plan['out_dtype']}{', scale_result' if fp8_out else ''}, use_fast_accum=False)"
                 + ("; torch computes no amax, fusebox does" if plan["amax"] else ""))

    def make_fn(fast):
        def fn(s):
            kw = {"scale_result": s["sy"]} if fp8_out else {}
            return torch._scaled_mm(s["a"], s["b"], scale_a=s["sa"], scale_b=s["sb"], out_dtype=out_dtype,
                                    use_fast_accum=fast, **kw)
        return fn

    with torch.no_grad():
        try:
            fast_ms = gpu_samples(make_fn(True), sets, args.calls, args.samples, args.warmup)
            notes.append(f"torch _scaled_mm with use_fast_accum=True: {sorted(fast_ms)[len(fast_ms) // 2] * 1e3:.1f} us")
        except Exception as e:
            notes.append(f"torch use_fast_accum=True failed: {type(e).__name__}: {first_line(e)}")
        row["torch"] = torch_variants(make_fn(False), sets, args, notes, failed=row["torch_failed"],
                                      tols=output_tolerances(graph, [plan["y"]]))
    del sets


DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8_e4m3": 1, "fp8_e5m2": 1}


def kv_read_bytes(graph, op, lkv):
    """The K and V bytes a paged (or padded) attention must read: each
    sequence's lkv keys of every kv head, k and v rows once (the pool's unused
    pages are not read). `lkv`: per-batch key lengths, or None (all Skv)."""
    k, v = graph.dims[op["inputs"]["k"]], graph.dims[op["inputs"]["v"]]
    B = graph.dims[op["inputs"]["q"]][0]
    lkv = lkv or [sdpa_compare.kv_length(graph, op)] * B
    row = k[1] * (k[3] * DTYPE_BYTES[graph.dtype(op["inputs"]["k"])] + v[3] * DTYPE_BYTES[graph.dtype(op["inputs"]["v"])])
    return sum(int(x) for x in lkv) * row


def bench_sdpa(path, graph, args, row):
    """The graph's first sdpa op in torch: forward (no_grad, or requires_grad
    inputs when the graph writes stats, as training does) or the backward
    alone (autograd.grad on a forward done beforehand)."""
    notes = row["notes"]
    op = graph.sdpa_ops()[0]
    if len(graph.ops) > 1:
        notes.append(f"graph has {len(graph.ops)} ops; torch times only '{op['name']}'")
    kind = op["op"]
    lq, lkv, arrays = sdpa_compare.seq_lens(graph, op, args.seed)
    work = tempfile.mkdtemp(prefix="bench_sdpa_")
    files = {}
    for name, arr in arrays.items():
        files[name] = os.path.join(work, f"{name}.npy")
        np.save(files[name], arr)
    if files:
        row["flops"] = Graph.load(path, args.fusebox, files).flops
    row["fusebox"] = time_fusebox(args, path, files, notes)
    shutil.rmtree(work, ignore_errors=True)

    dtype = sdpa_compare.TORCH_DTYPES.get(graph.dtype(op["inputs"]["q"]), torch.bfloat16)
    if op["attrs"].get("paged"):
        # Effective KV bandwidth: bytes the sequences' keys and values hold / time (fusebox_gbps_kv in the report).
        row["kv_bytes"] = kv_read_bytes(graph, op, lkv)
        # The roofline's bytes: what is read and written (keys and values the lengths cover, q and o),
        # not the whole pools the graph declares.
        qd = graph.dims[op["inputs"]["q"]]
        row["bytes"] = row["kv_bytes"] + 2 * qd[0] * qd[1] * qd[2] * qd[3] * DTYPE_BYTES[graph.dtype(op["inputs"]["q"])]
        notes.append("paged K/V: torch gathers each sequence's pages into a contiguous cache (timed, part of "
                     "every call), then SDPA on it; kv_bytes counts the keys and values the lengths cover")
    if op["attrs"].get("sink"):
        notes.append("torch: no attention sinks (its SDPA has none): the same attention without the sink logits")
    if kind in ("sdpa_fp8_fwd", "sdpa_fp8_bwd"):
        dtype = torch.bfloat16
        notes.append("torch: bf16 SDPA of the same shape (torch's SDPA has no fp8 kernel)")
    gen = torch.Generator(device="cuda").manual_seed(99)
    kw, mask_note = sdpa_compare.torch_mask_kwargs(graph, op, lq, lkv, dtype, "cuda", gen,
                                                   blocks=sdpa_compare.block_mask_bytes(graph, op, arrays))
    notes.append(f"torch mask: {mask_note}")
    groups = graph.dims[op["inputs"]["q"]][1] // graph.dims[op["inputs"]["k"]][1]
    backward = kind in SDPA_BWD_OPS
    train = backward or "stats" in op["outputs"]
    extra = {"enable_gqa": True} if groups > 1 else {}
    sets = []
    for _ in range(n_sets(graph)):
        sets.append(sdpa_compare.make_qkv(graph, op, dtype, "cuda", gen, requires_grad=train))
    row["input_sets"] = len(sets)

    def fwd(s):
        with torch.set_grad_enabled(train):
            k, v = sdpa_compare.paged_kv(s)  # the gather of a paged op, timed with the attention
            return F.scaled_dot_product_attention(s["q"], k, v, **kw, **extra)

    def prepare():
        # the backward's kernel follows the forward's backend: redo the forward under it
        if backward:
            for s in sets:
                s["out"] = fwd(s)

    if backward:
        def fn(s):
            return torch.autograd.grad(s["out"], (s["q"], s["k"], s["v"]), s["do"], retain_graph=True)

        def compile_fn(mode):  # the forward compiled; autograd.grad through its compiled backward
            cf, key = torch.compile(fwd, mode=mode, dynamic=False), "out_" + mode

            def fnc(s):
                if key not in s:
                    s[key] = cf(s)
                return torch.autograd.grad(s[key], (s["q"], s["k"], s["v"]), s["do"], retain_graph=True)
            return fnc
        out_names = [op["outputs"].get(r) for r in ("dq", "dk", "dv")]
    else:
        fn, compile_fn = fwd, True
        out_names = [op["outputs"].get("o")]
    tols = output_tolerances(graph, out_names)
    notes.append("torch variants checked against torch eager (inputs: sdpa_compare's; eager SDPA against "
                 "fusebox: python3 -m fusebox_tools.bench.sdpa_compare / crosscheck)")

    # A block mask: torch's block-sparse attention is flex_attention with a BlockMask of the same
    # 128 x 128 tiles (its SDPA would compute every tile under a dense mask).
    if "block_mask" in op["inputs"] and not backward:
        flex = flex_block_fn(graph, op, sdpa_compare.block_mask_bytes(graph, op, arrays), kw, groups > 1, notes)
        if flex is not None:
            row["torch"] = torch_variants(flex, sets, args, notes, compile_fn=True, graph_ok=True,
                                          failed=row["torch_failed"], tols=tols)
            del sets
            return

    # The fastest backend for this shape (a short eager run each), then every variant under it.
    best, best_ms = None, None
    for b in ("cudnn", "flash", "efficient"):
        try:
            with sdpa_compare.backend_ctx(b):
                prepare()
                ms = min(gpu_samples(fn, sets, max(2, args.calls // 5), 3, 3))
            if best_ms is None or ms < best_ms:
                best, best_ms = b, ms
        except Exception as e:
            notes.append(f"torch {b} refused: {first_line(e)[:120]}")
    if best is None:
        row["torch"] = None
        row["torch_failed"]["eager"] = "every SDPA backend refused the shape"
        return
    notes.append(f"torch backend: {best} (fastest of those that accepted)")
    with sdpa_compare.backend_ctx(best):
        prepare()
        row["torch"] = torch_variants(fn, sets, args, notes, compile_fn=compile_fn, graph_ok=True,
                                      prepare=prepare if backward else None, failed=row["torch_failed"],
                                      tols=tols)
        if backward and row["torch"].get("eager") and row["torch"].get("cuda_graph") is None and best == "cudnn":
            direct_bwd_graph(sets, kw, extra, fn, args, row["torch"], notes)
            if row["torch"].get("cuda_graph"):
                row["torch_failed"].pop("cuda_graph", None)
    del sets


def flex_block_fn(graph, op, blocks, kw, gqa, notes):
    """fn(set) running torch's flex_attention with a BlockMask built from the
    op's block-mask bytes (bit (t % 8) of byte [b, h, r, t // 8] keeps key tile
    t for query tile r), or None (with a note) when the op has other masks,
    or flex_attention is missing or refuses; the caller then uses SDPA with
    the dense boolean mask."""
    opts = graph.sdpa_options(op)
    if (opts.right_bound is not None or opts.left_bound is not None or opts.padding or opts.bias or opts.alibi
            or opts.dropout or op["attrs"].get("paged")):
        notes.append("torch: SDPA with the block mask expanded (flex_attention is used for a block mask alone)")
        return None
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        B, Hq, Sq, _ = graph.dims[op["inputs"]["q"]]
        Skv = sdpa_compare.kv_length(graph, op)
        tile = BLOCK_TILE
        keep = block_tile_keep(torch.as_tensor(blocks, device="cuda"), Skv)  # [B, Hq, query tiles, key tiles]

        def mask_mod(b, h, q_idx, kv_idx):
            return keep[b, h, q_idx // tile, kv_idx // tile]

        block_mask = create_block_mask(mask_mod, B, Hq, Sq, Skv, device="cuda", BLOCK_SIZE=tile)
    except Exception as e:
        notes.append(f"torch flex_attention unavailable ({type(e).__name__}: {first_line(e)[:120]}): "
                     "SDPA with the block mask expanded")
        return None
    notes.append(f"torch: flex_attention with a BlockMask of the same {tile}x{tile} tiles "
                 f"(sparsity {1 - float(keep.float().mean()):.0%} of tiles dropped); compile is its fused kernel")

    def fn(s):
        return flex_attention(s["q"], s["k"], s["v"], block_mask=block_mask, scale=kw.get("scale"), enable_gqa=gqa)

    return fn


def direct_bwd_graph(sets, kw, extra, autograd_fn, args, torch_row, notes):
    """torch's cuDNN SDPA backward as one aten call (no autograd engine) in a
    CUDA graph, where autograd.grad would not capture: on the H200 the engine
    makes the legacy stream wait on the capturing one (cudaErrorStreamCaptureImplicit).
    The same kernel as the eager row; its gradients are checked against
    autograd's before it is timed."""
    if set(kw) - {"scale", "is_causal"} or extra or "page_table_k" in sets[0]:
        notes.append("no direct aten backward for this mask, GQA or paged K/V: CUDA graph not timed")
        return
    fwd_op = torch.ops.aten._scaled_dot_product_cudnn_attention
    bwd_op = torch.ops.aten._scaled_dot_product_cudnn_attention_backward
    causal, scale = bool(kw.get("is_causal", False)), kw.get("scale")
    try:
        with torch.no_grad():
            for s in sets:
                q, k, v = (s[n].detach() for n in ("q", "k", "v"))
                o, lse, cq, ck, mq, mk, seed, off, _ = fwd_op(q, k, v, None, True, 0.0, causal, False, scale=scale)
                s["_aten"] = (q, k, v, o, lse, seed, off, cq, ck, mq, mk)

        def fn(s):
            q, k, v, o, lse, seed, off, cq, ck, mq, mk = s["_aten"]
            return bwd_op(s["do"], q, k, v, o, lse, seed, off, None, cq, ck, mq, mk, 0.0, causal, scale=scale)

        with torch.no_grad():
            mine, ref = fn(sets[0]), autograd_fn(sets[0])
            worst = max(float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))
                        for a, b in zip(mine, ref))
        if not worst <= 1e-2:
            notes.append(f"direct aten backward differs from autograd's (rel_l2 {worst:.1e}): CUDA graph not timed")
            return
        torch_row["cuda_graph"] = graph_variant(fn, sets, args.calls, args.samples, args.warmup)
        torch_row["cuda_graph"]["check"] = {"pass": True, "detail": f"against autograd's: rel_l2 {worst:.1e}"}
        notes.append("torch CUDA graph: aten._scaled_dot_product_cudnn_attention_backward captured directly "
                     f"(the eager row's kernel; gradients equal autograd's to rel_l2 {worst:.1e})")
    except Exception as e:
        notes.append(f"direct aten backward: {type(e).__name__}: {first_line(e)}")
        if args.verbose:
            traceback.print_exc()
    finally:
        for s in sets:
            s.pop("_aten", None)


def bench_graph(path, args):
    graph = Graph.load(path, args.fusebox)
    q = graph.sdpa_ops()[0]["inputs"]["q"] if graph.sdpa_ops() else graph.inputs()[0]
    row = {"family": family(graph), "name": graph.name, "graph": os.path.relpath(path), "flops": graph.flops,
           "bytes": graph.bytes, "dtype": graph.dtype(q), "notes": [], "torch_failed": {},
           "clocks": {"before": clocks()}}
    t0 = time.perf_counter()
    try:
        if graph.sdpa_ops():
            bench_sdpa(path, graph, args, row)
        elif row["family"] == "norm":
            bench_norm(path, graph, args, row)
        elif row["family"] == "pool":
            bench_pool(path, graph, args, row)
        elif fp8_matmul_plan(graph):
            bench_fp8_matmul(path, graph, args, row)
        else:
            bench_plain(path, graph, args, row)
    except Exception as e:  # one graph must not stop the part
        row["notes"].append(f"error: {type(e).__name__}: {first_line(e)}")
        traceback.print_exc()
    torch.cuda.empty_cache()
    row["clocks"]["after"] = clocks()
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


# ---------------------------------------------------------------- peaks

def peaks(args):
    """Dense bf16 and FP8 matmul TFLOP/s and device copy GB/s (read + write)."""
    out, notes = {}, []
    n = 8192
    a = torch.rand(n, n, device="cuda", dtype=torch.bfloat16) * 2 - 1
    b = torch.rand(n, n, device="cuda", dtype=torch.bfloat16) * 2 - 1
    ms = gpu_samples(lambda s: torch.matmul(a, b), [None], 20, args.samples, 10)
    out["bf16_tflops"] = 2 * n ** 3 / (min(ms) * 1e-3) / 1e12
    out["bf16_tflops_median"] = 2 * n ** 3 / (sorted(ms)[len(ms) // 2] * 1e-3) / 1e12
    try:
        a8 = a.to(torch.float8_e4m3fn)
        b8 = b.t().contiguous().to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
        one = torch.tensor(1.0, device="cuda")
        for fast in (False, True):  # fast accumulation: the usual way to reach the FP8 peak
            ms = gpu_samples(lambda s: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                                        use_fast_accum=fast), [None], 20, args.samples, 10)
            tf = 2 * n ** 3 / (min(ms) * 1e-3) / 1e12
            out["fp8_tflops_fast_accum" if fast else "fp8_tflops_exact_accum"] = tf
            out["fp8_tflops"] = max(out.get("fp8_tflops", 0), tf)
    except Exception as e:
        notes.append(f"fp8 peak not measured: {type(e).__name__}: {first_line(e)}")
    nbytes = 1 << 30
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = gpu_samples(lambda s: dst.copy_(src), [None], 10, args.samples, 5)
    out["copy_gbps"] = 2 * nbytes / (min(ms) * 1e-3) / 1e9
    out["method"] = ("best of the samples: bf16 and FP8 (torch._scaled_mm, e4m3, unit scales, the faster of exact "
                     "and fast accumulation) 8192^3 matmuls, "
                     "20 back-to-back per sample; copy: 1 GiB device-to-device, bytes read + written")
    del a, b, src, dst
    torch.cuda.empty_cache()
    return out, notes


# ---------------------------------------------------------------- runtime

def runtime_bench_bin(fusebox):
    """bound_execute_bench: $FUSEBOX_RUNTIME_BENCH, else beside the fusebox binary."""
    env = os.environ.get("FUSEBOX_RUNTIME_BENCH")
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.abspath(fusebox)), "bound_execute_bench")


def conv_chain(batch, layers, channels, hw, seed=1234):
    """The bench's 10-layer network in torch: conv 3x3 (padding 1) + bias + relu,
    bf16 channels_last, inputs, weights and biases uniform in [-1, 1] as
    fusebox's random inputs. Returns (fn, x)."""
    g = torch.Generator(device="cuda").manual_seed(seed)

    def uniform(*shape):
        return torch.rand(*shape, generator=g, device="cuda", dtype=torch.float32).mul_(2).sub_(1)
    x = uniform(batch, channels, hw, hw).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    ws = [uniform(channels, channels, 3, 3).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
          for _ in range(layers)]
    bs = [uniform(channels).to(torch.bfloat16) for _ in range(layers)]

    def fn(inp):
        for w, b in zip(ws, bs):
            inp = F.relu(F.conv2d(inp, w, b, padding=1))
        return inp
    return fn, x


def replay_kernels(fusebox_bin, graph_path, engine, executes=100):
    """The kernels of one execute of `graph_path` with `engine`, as replayed inside a CUDA graph of
    `executes` executes: CUPTI's kernel time per execute (torch.profiler) and the replay's GPU
    time per execute (CUDA events) in the same process, so the GPU time a replayed execute
    spends beyond its own kernels is their difference. fusebox through its Python module on
    torch's stream (recorded by torch.cuda.graph, stream capture as fusebox's own CudaGraph)."""
    from torch.profiler import ProfilerActivity, profile
    if not os.environ.get("FUSEBOX_LIBRARY"):
        libs = sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(fusebox_bin)), "libfusebox.so*")))
        if libs:
            os.environ["FUSEBOX_LIBRARY"] = libs[0]
    import fusebox  # python/fusebox, beside fusebox_tools on the path that imported this module
    session = fusebox.Session(device=0)
    g = fusebox.Graph.from_json(graph_path)
    plan = session.build(g, engine=engine)
    gen = torch.Generator(device="cuda").manual_seed(1)
    ts = {}
    for t in g.tensors:
        ts[t.name] = g.empty(t.name)
        if not t.is_output:
            ts[t.name].copy_(torch.rand(ts[t.name].shape, generator=gen, device="cuda").mul_(2).sub_(1))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            plan(**ts)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    cg = torch.cuda.CUDAGraph()
    with torch.cuda.graph(cg):
        for _ in range(executes):
            plan(**ts)
    for _ in range(3):
        cg.replay()
    torch.cuda.synchronize()
    st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    replay = []
    for _ in range(10):
        st.record()
        cg.replay()
        en.record()
        en.synchronize()
        replay.append(st.elapsed_time(en) * 1e6 / executes)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        cg.replay()
        torch.cuda.synchronize()
    kernel_ns, launches, names = 0.0, 0, []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t and e.count:
            kernel_ns += t * 1e3
            launches += e.count
            names.append(e.key[:120])
    del cg
    session.close()
    replay.sort()
    return {"engine": engine, "executes_per_graph": executes,
            "replay_gpu_ns_per_execute": replay[len(replay) // 2],
            "kernel_ns_per_execute": kernel_ns / executes, "kernels_per_execute": launches / executes,
            "kernels": names, "how": "torch.profiler (CUPTI) over one replay of a torch.cuda.graph of the executes"}


def runtime_part(args):
    """The runtime part: fusebox's bench binary, then torch's side of each chain row."""
    exe = runtime_bench_bin(args.fusebox)
    notes = []
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "runtime.json")
        cmd = [exe, "--json", out, "--calls", str(args.calls), "--samples", str(args.samples)]
        log(" ".join(cmd))
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        sys.stderr.write(p.stdout + p.stderr)
        if not os.path.exists(out):
            raise FuseboxError(f"{exe} exited {p.returncode} without writing its results: {first_line(p.stderr)}")
        with open(out) as f:
            rt = json.load(f)
        if p.returncode != 0:
            notes.append(f"{os.path.basename(exe)} exited {p.returncode}: {first_line(p.stderr)}")
    h = rt.get("host_overhead") or {}
    graph_path = os.path.join(REPO_ROOT, "examples", "graphs", "small", "conv_bias_relu_small.json")
    engines = [h.get("engine"), (h.get("cuda_graph_tuned") or {}).get("engine")]
    h["replay_kernels"] = []
    for engine in dict.fromkeys(e for e in engines if e):
        try:
            h["replay_kernels"].append(replay_kernels(args.fusebox, graph_path, engine))
        except Exception as e:  # the row stays; the note says why the kernels are missing
            notes.append(f"kernel time of {engine} replayed: {first_line(e)}")
    for row in rt.get("chain", []):
        row["clocks"] = {"before": clocks()}
        fn, x = conv_chain(row["batch"], row["layers"], row["channels"], row["hw"])
        row_notes = []
        row["torch"] = torch_variants(fn, [x], args, row_notes, failed=row.setdefault("torch_failed", {}))
        row["clocks"]["after"] = clocks()
        row["notes"] = row.get("notes", []) + row_notes + [
            "no input rotation on either side: the chain's activations stay in the L2"]
        del fn, x
        torch.cuda.empty_cache()
    rt["notes"] = notes
    return rt


# ---------------------------------------------------------------- the part file

def load_part(path):
    try:
        with open(path) as f:
            doc = json.load(f)
        return doc if isinstance(doc, dict) and isinstance(doc.get("rows"), list) else None
    except (OSError, ValueError):
        return None


def save(path, doc):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


def bench_graphs():
    """Graphs benchmarked beside the examples (bench/graphs/*.json: e.g. the
    ResNet-50 convolution backward shapes), kept out of examples/ so the
    example-wide tests do not run them all."""
    return sorted(glob.glob(os.path.join(REPO_ROOT, "bench", "graphs", "*.json")))
def is_symbolic(path):
    """A graph that declares symbols: benchmarked by part shapes, not at its defaults."""
    try:
        with open(path) as f:
            return bool(json.load(f).get("symbols"))
    except (OSError, ValueError, AttributeError):
        return False


def shapes_part(args, doc):
    """`fusebox shapes --json` per symbolic example: per-shape build cost with
    the kernel cache and cold; doc["shapes"] keeps one entry per graph."""
    fails = 0
    done = {e["graph"] for e in doc.get("shapes", [])}
    sweeps = {p: v for p, v in SHAPE_SWEEPS.items()} if not args.graphs else {p: None for p in args.graphs}
    for path, sweep in sweeps.items():
        if sweep is None:
            log(f"{path}: part shapes takes the examples' sweeps only (SHAPE_SWEEPS); skipped")
            continue
        if os.path.relpath(path) in done and not args.force:
            log(f"{path}: already done, skipped (--force to redo)")
            continue
        cmd = [args.fusebox, "shapes", path, "--json"] + [a for s in sweep for a in ("--shapes", s)]
        log(" ".join(cmd))
        t0 = time.perf_counter()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout * 2)
            res = json.loads(p.stdout)
        except (subprocess.TimeoutExpired, ValueError) as e:
            log(f"{path}: fusebox shapes failed: {first_line(e)}")
            fails += 1
            continue
        summary = res.get("summary", {})
        doc["shapes"] = [e for e in doc.get("shapes", []) if e["graph"] != os.path.relpath(path)]
        doc["shapes"].append({
            "graph": os.path.relpath(path), "name": res.get("graph"), "sweeps": sweep, "summary": summary,
            "rows": [{k: r.get(k) for k in ("mode", "shape_text", "ok", "ms", "kernel_cache", "engine",
                                                     "engine_replayed", "static_policy", "steps", "behavior_notes")}
                     for r in res.get("rows", [])],
            "seconds": round(time.perf_counter() - t0, 1)})
        save(args.out, doc)
        log(f"{res.get('graph')}: {summary.get('shapes')} shapes, kernel cache {summary.get('kernel_cache_total_ms', 0):.0f} ms, "
            f"cold {summary.get('cold_total_ms', 0):.0f} ms: {summary.get('speedup', 0):.1f}x"
            + (f" (dynamic shapes refused: {summary['dynamic_fallback']})" if summary.get("dynamic_fallback") else ""))
        fails += p.returncode != 0
    return 1 if fails else 0


# Part "models" (issue 14): whole networks as pipelines, each timed against torch
# by its own checker in one process (docs/models.md). name -> (module, args).
# Issue 14's sizes: MiniLM 1 x 32, 32 x 128, 256 x 128 tokens; ResNet-50 batch
# 1, 32, 256 (the batch-8 rows of earlier runs stay selectable). MODEL_SIZES=a,b
# runs those rows only (a part call of ~9 minutes holds about three of them).
MINILM_DIR = os.path.join(REPO_ROOT, "models", "minilm", "fusebox")


def _resnet(batch, verify=True):
    return ("fusebox_tools.models.resnet50_check", ["--batch", str(batch)] + ([] if verify else ["--no-verify"]))


def _minilm(batch, seq, dynamic=False, fused_qkv=False, tune=False):
    # The symbolic pipeline (minilm.json) at B x S; plans built statically for the shape (kernels
    # fitted to it) unless `dynamic` (cuDNN's dynamic-shape kernels, the `_dyn` rows).
    return ("fusebox_tools.models.minilm_embed", ["--model", MINILM_DIR, "--seq", str(seq)]
            + (["--batch", str(batch)] if batch != 8 else [])
            + ([] if dynamic else ["--static-shapes"])
            + (["--fused-qkv"] if fused_qkv else ["--no-fused-qkv"])
            + (["--tune"] if tune else [])
            + ["--iters", "50", "--cuda-graph", "--torch", "--torch-time"])


MODEL_RUNS = {
    "minilm_b1_s32": _minilm(1, 32),
    "minilm_b32_s128": _minilm(32, 128),
    "minilm_b256_s128": _minilm(256, 128),
    # batch 256: no per-stage `--verify` (its references at 2 TFLOP would not fit a part call);
    # the logits are checked against torchvision's float32 all the same
    "resnet50_b1": _resnet(1),
    "resnet50_b32": _resnet(32),
    "resnet50_b256": _resnet(256, verify=False),
    "resnet50_b8": _resnet(8),
    "minilm_b8_s128": _minilm(8, 128),
    # The same sizes with dynamic-shape plans (one kernel set for every shape in the ranges).
    "minilm_b1_s32_dyn": _minilm(1, 32, dynamic=True),
    "minilm_b32_s128_dyn": _minilm(32, 128, dynamic=True),
    "minilm_b256_s128_dyn": _minilm(256, 128, dynamic=True),
    # One Q/K/V GEMM a layer (view buffers), 45 stages instead of 57.
    "minilm_b1_s32_fqkv": _minilm(1, 32, fused_qkv=True),
    "minilm_b32_s128_fqkv": _minilm(32, 128, fused_qkv=True),
    "minilm_b256_s128_fqkv": _minilm(256, 128, fused_qkv=True),
    # ... with `pipeline tune` first (each graph's fastest engine at the shape, from the plan cache;
    # torch.compile max-autotune tunes its side).
    "minilm_b1_s32_fqkv_tuned": _minilm(1, 32, fused_qkv=True, tune=True),
    "minilm_b32_s128_fqkv_tuned": _minilm(32, 128, fused_qkv=True, tune=True),
    "minilm_b256_s128_fqkv_tuned": _minilm(256, 128, fused_qkv=True, tune=True),
    "minilm_b256_s128_tuned": _minilm(256, 128, tune=True),
}
MODEL_DEFAULT = ("minilm_b1_s32", "minilm_b32_s128", "minilm_b256_s128", "resnet50_b1", "resnet50_b32",
                 "resnet50_b256")
def model_selection(env=None):
    """The MODEL_RUNS names to run: $MODEL_SIZES (comma list) or MODEL_DEFAULT.
    An unknown name is a ValueError naming the accepted ones."""
    raw = (os.environ.get("MODEL_SIZES", "") if env is None else env).strip()
    if not raw:
        return list(MODEL_DEFAULT)
    names = [n.strip() for n in raw.split(",") if n.strip()]
    bad = [n for n in names if n not in MODEL_RUNS]
    if bad:
        raise ValueError(f"MODEL_SIZES: unknown {', '.join(bad)}; accepted: {', '.join(MODEL_RUNS)}")
    return names


def model_row(name, res):
    """One models row from a checker's JSON: GPU ms (median) per variant, verified; the compiled
    variants' compile seconds ("compile_s"), whether they were frozen, and the variants that
    failed (errored, or computed other values) with their errors ("torch_failed")."""
    if "gpu_time_ms" in res:  # resnet50_check
        t = res["gpu_time_ms"]
        pick = lambda k: (t.get(k) or {}).get("median")  # noqa: E731
        fb = {"cuda_graph": pick("fusebox_pipeline_cuda_graph"), "eager": pick("fusebox_pipeline_eager")}
        torch_ms = {"eager": pick("torch_eager_bf16"), "cuda_graph": pick("torch_cuda_graph_bf16"),
                    "compile": pick("torch_compile_bf16"), "compile_cudagraphs": pick("torch_compile_cudagraphs_bf16")}
        verified = bool(res.get("ok"))
        check = res.get("fusebox_vs_fp32")
        compile_mode = res.get("torch_compile_mode")
        compile_error = res.get("torch_compile_error")
        stage_verify = (res.get("fusebox") or {}).get("stage_verify")
        variants = res.get("torch_compile") or {}
        failed = dict(res.get("torch_failed") or {})
    else:  # minilm_embed
        f = res.get("fusebox") or {}
        fb = {"cuda_graph": (f.get("latency_ms") or {}).get("median") if f.get("cuda_graph") else None,
              "eager": ((f.get("eager_latency_ms") or f.get("latency_ms")) or {}).get("median")}
        tt = res.get("torch_timing") or {}
        torch_ms = {k: (tt.get(k) or {}).get("median") for k in ("eager", "cuda_graph", "compile", "compile_cudagraphs")}
        verified = bool(res.get("ok"))
        check = (res.get("checks") or [None])[-1]
        compile_mode = tt.get("compile_mode")
        compile_error = tt.get("compile_error")
        stage_verify = None
        variants = tt.get("variants") or {}
        failed = dict(tt.get("failed") or {})
    for k in failed:  # a failed variant's time (if any) is no baseline
        torch_ms[k] = None
    best_fb = min([v for v in fb.values() if v] or [None]) if any(fb.values()) else None
    best_torch = min([v for v in torch_ms.values() if v] or [None]) if any(torch_ms.values()) else None
    row = {"name": name, "fusebox_ms": fb, "torch_ms": torch_ms, "verified": verified, "check": check,
           "speedup": best_torch / best_fb if best_fb and best_torch else None, "target": model_target(name)}
    if compile_mode:
        row["compile_mode"] = compile_mode
    if compile_error:
        row["compile_error"] = compile_error
    if failed:
        row["torch_failed"] = failed
    if variants:
        row["compile_s"] = {k: v.get("compile_s") for k, v in variants.items() if v.get("compile_s") is not None}
        row["freezing"] = all(v.get("freezing") for v in variants.values())
    if stage_verify is not None:
        row["stage_verify"] = stage_verify
    return row


def model_command(name, fusebox, out_dir, json_out, compile_mode=None):
    """The checker's command line of a MODEL_RUNS row."""
    module, extra = MODEL_RUNS[name]
    cmd = [sys.executable, "-m", module, "--fusebox", fusebox, "--out", out_dir, "--json-out", json_out] + extra
    mode = compile_mode if compile_mode is not None else os.environ.get("MODEL_COMPILE_MODE", COMPILE_MODE)
    return cmd + ["--compile-mode", mode]


def models_part(args, doc):
    """The MODEL_RUNS rows of model_selection() with --json-out; doc["models"]
    keeps one row per name; rows already there are skipped (--force: redone)."""
    fails = 0
    try:
        names = model_selection()
    except ValueError as e:
        log(str(e))
        return 2
    done = {m["name"] for m in doc.get("models", [])}
    for name in names:
        module, extra = MODEL_RUNS[name]
        if name in done and not args.force:
            log(f"{name}: already done, skipped (--force to redo)")
            continue
        if "--model" in extra and not os.path.exists(os.path.join(extra[extra.index("--model") + 1],
                                                                  "minilm_config.json")):
            log(f"{name}: the converted weights are not here (docs/models.md: carry models/minilm/fusebox); skipped")
            fails += 1
            continue
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix=f"bench_{name}_") as tmp:
            out = os.path.join(tmp, "result.json")
            cmd = model_command(name, args.fusebox, os.path.join(tmp, "run"), out)
            log(" ".join(cmd))
            p = None
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout * 4)
                with open(out) as f:
                    res = json.load(f)
            except (subprocess.TimeoutExpired, OSError, ValueError) as e:
                log(f"{name}: {first_line(e)}")
                tail = p.stderr if p is not None else getattr(e, "stderr", None)
                if tail:
                    log(f"{name}: stderr tail: {tail[-1500:] if isinstance(tail, str) else tail[-1500:].decode(errors='replace')}")
                fails += 1
                continue
        row = model_row(name, res)
        row["seconds"] = round(time.perf_counter() - t0, 1)
        doc["models"] = [m for m in doc.get("models", []) if m["name"] != name] + [row]
        save(args.out, doc)
        sp = f"{row['speedup']:.2f}x" if row["speedup"] else "-"
        log(f"{name}: fusebox {row['fusebox_ms']} ms, torch {row['torch_ms']} ms, best torch / fusebox {sp} "
            f"(target {row['target']}x), verified {row['verified']} ({row['seconds']} s)")
        if p.returncode != 0:
            log(f"{name}: checker exit {p.returncode}: {p.stdout.strip()[-1500:]}")
        fails += p.returncode != 0
    return 1 if fails else 0


def part_graphs(part, args):
    if args.graphs:
        paths = args.graphs
    else:
        paths = [p for p in default_graphs()
                 if os.path.basename(os.path.dirname(p)) == "graphs" and not is_symbolic(p)]
        paths += bench_graphs()
    out = []
    for p in paths:
        try:
            if family(Graph.load(p, args.fusebox)) == part or args.graphs:
                out.append(p)
        except FuseboxError as e:
            log(f"{p}: skipped: {e}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", required=True, choices=PARTS)
    ap.add_argument("--out", required=True, help="the part's results file (resumed when it exists)")
    ap.add_argument("graphs", nargs="*", help="graph files instead of the part's examples")
    ap.add_argument("--fusebox", help="fusebox binary (default: $FUSEBOX_BIN, else build/fusebox)")
    ap.add_argument("--calls", type=int, default=int(os.environ.get("BENCH_CALLS", 50)),
                    help="back-to-back calls per GPU-time sample")
    ap.add_argument("--samples", type=int, default=int(os.environ.get("BENCH_SAMPLES", 10)))
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=240, help="seconds per fusebox run")
    ap.add_argument("--seed", type=int, default=1234, help="padding lengths without fixed values")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--no-fusebox-graph", action="store_true",
                    help="time fusebox back to back only (default: also as a CUDA graph, the faster one kept)")
    ap.add_argument("--force", action="store_true", help="redo rows already in --out")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--tune", action="store_true", default=os.environ.get("BENCH_TUNE", "") == "1",
                    help="fusebox tune each graph first and time its winner (BENCH_TUNE=1)")
    args = ap.parse_args(argv)
    args.tune_cache = os.path.join(os.path.dirname(os.path.abspath(args.out)), "tuned_plans.sqlite")
    try:
        args.fusebox = fusebox_bin(args.fusebox)
    except FuseboxError as e:
        log(str(e))
        return 2
    if not torch.cuda.is_available():
        log("torch sees no GPU")
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    # --force redoes the rows this call selects; the part's other rows stay (a GRAPHS=... or
    # MODEL_SIZES=... call with FORCE=1 used to leave a part file holding only its own rows).
    doc = load_part(args.out)
    if doc is not None:
        doc["versions"] = versions(args.fusebox)  # the newest rows' fusebox and libraries
    if doc is None:
        doc = {"schema": SCHEMA, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
               "gpu": torch.cuda.get_device_name(0), "versions": versions(args.fusebox), "peaks": {},
               "method": {"calls_per_sample": args.calls, "samples": args.samples, "latency_samples": args.samples,
                          "warmup": args.warmup, "l2": "input copies > 2x the 60 MiB L2, both sides",
                          "compile_mode": COMPILE_MODE, "compile_modes": dict(COMPILE_VARIANTS),
                          "checks": "each torch variant against eager, eager against fusebox (issue 36)"},
               "rows": []}
    if args.part == "peaks":
        if doc.get("peaks") and not args.force:
            log(f"peaks already in {args.out}: {doc['peaks']}")
            return 0
        doc["peaks"], notes = peaks(args)
        doc["peaks_notes"] = notes
        save(args.out, doc)
        log(f"peaks: {doc['peaks']} {notes}")
        return 0
    if args.part == "runtime":
        if doc.get("runtime") and not args.force:
            log(f"runtime already in {args.out} (--force to redo)")
            return 0
        try:
            doc["runtime"] = runtime_part(args)
        except (FuseboxError, OSError, subprocess.TimeoutExpired, ValueError) as e:
            log(f"runtime: {e}")
            return 1
        save(args.out, doc)
        for row in doc["runtime"].get("chain", []):
            fb, t = row["fusebox"], row.get("torch") or {}
            med = lambda s: f"{sorted(s)[len(s) // 2] * 1e3:.1f}" if s else "-"  # noqa: E731
            log(f"{row['name']}: fusebox eager {med(fb['eager']['gpu_ms'])} us, CUDA graph "
                f"{med(fb['cuda_graph']['gpu_ms'])} us; "
                + ", ".join(f"torch {k} {med((v or {}).get('gpu_ms'))} us" for k, v in t.items()))
        return 0
    if args.part == "shapes":
        return shapes_part(args, doc)
    if args.part == "models":
        return models_part(args, doc)
    done = {r["graph"] for r in doc["rows"]}
    fails = 0
    for path in part_graphs(args.part, args):
        if os.path.relpath(path) in done and not args.force:
            log(f"{path}: already done, skipped (--force to redo)")
            continue
        log(f"{path} ...")
        row = bench_graph(path, args)
        # Each row names the cuDNN it was measured on: parts merged from calls on
        # different cuDNN versions (9.19, the pinned 9.27) never share a table unnoticed.
        row["cudnn"] = doc["versions"].get("cudnn")
        doc["rows"] = [r for r in doc["rows"] if r["graph"] != os.path.relpath(path)] + [row]
        save(args.out, doc)
        fb = row.get("fusebox") or {}
        t = row.get("torch") or {}
        med = lambda s: f"{sorted(s)[len(s) // 2] * 1e3:.1f}" if s else "-"  # noqa: E731
        log(f"{row['name']}: fusebox GPU {med(fb.get('gpu_ms'))} us, latency {med(fb.get('latency_ms'))} us; "
            + ", ".join(f"{k} GPU {med((v or {}).get('gpu_ms'))} us / latency {med((v or {}).get('latency_ms'))} us"
                        for k, v in t.items())
            + f" ({row['seconds']} s)")
        for n in row["notes"]:
            log(f"  note: {n}")
        fails += row.get("fusebox") is None or not t
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
