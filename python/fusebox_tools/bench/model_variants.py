"""The torch.compile variants of a whole inference network (issue 36), shared by the models
checkers (fusebox_tools.models.resnet50_check, fusebox_tools.models.minilm_embed --torch-time): a user
serving a network compiles it for inference with Inductor's freezing (parameters folded in as
constants, torch._inductor.config.freezing, under torch.no_grad()), with and without CUDA graphs:

    compile             torch.compile(mode=MODE), MODE the bench's (max-autotune-no-cudagraphs)
    compile_cudagraphs  torch.compile(mode="reduce-overhead"): Inductor's CUDA graph trees

Each variant is compiled afresh (torch._dynamo.reset()), run once (the compile time, "compile_s"),
its output checked against the eager one by the caller's `check`, and only then timed. A variant
that raises or computes other values has "error" and no time: the bench lists the row as
incomplete (bench_report).
"""
import time

VARIANT_KEYS = ("compile", "compile_cudagraphs")
CUDAGRAPHS_MODE = "reduce-overhead"


def variant_modes(compile_mode):
    """[(key, torch.compile mode)]: the bench's mode, then reduce-overhead."""
    return [("compile", compile_mode), ("compile_cudagraphs", CUDAGRAPHS_MODE)]


def compile_variants(fn, compile_mode, timer, check, freezing=True):
    """{key: {"mode", "freezing", "compile_s", "check", "time"} or {"mode", "freezing", "error"}} for
    each variant of variant_modes(compile_mode). `fn()` runs the network on its fixed inputs and
    returns its output tensor; `timer(f)` times f() (the caller's CUDA-event timing); `check(out)`
    returns (ok, detail) for a variant's output (a copy, taken before any other run)."""
    import torch

    out = {}
    for key, mode in variant_modes(compile_mode):
        rec = {"mode": mode, "freezing": bool(freezing)}
        try:
            torch._dynamo.reset()
            with torch.no_grad(), torch._inductor.config.patch(freezing=bool(freezing)):
                t0 = time.perf_counter()
                cf = torch.compile(fn, mode=mode)
                cf()
                torch.cuda.synchronize()
                rec["compile_s"] = round(time.perf_counter() - t0, 1)
                got = cf().detach().clone()  # reduce-overhead: its next run overwrites the output
                torch.cuda.synchronize()
                ok, detail = check(got)
                rec["check"] = {"pass": bool(ok), "detail": detail}
                if not ok:
                    raise ValueError(f"outputs differ from torch eager's: {detail}")
                rec["time"] = timer(cf)
        except Exception as e:  # recorded: the row is incomplete, the other variants still run
            rec["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
        out[key] = rec
    return out


def rel_errors(got, ref):
    """(relative L2, max |difference| over max |ref|) of two tensors or arrays, in float64."""
    import numpy as np

    g = np.asarray(got.double().cpu().numpy() if hasattr(got, "double") else got, np.float64).ravel()
    r = np.asarray(ref.double().cpu().numpy() if hasattr(ref, "double") else ref, np.float64).ravel()
    d = g - r
    rel = float(np.linalg.norm(d) / max(np.linalg.norm(r), 1e-30))
    mx = float(np.abs(d).max() / max(np.abs(r).max(), 1e-30)) if d.size else 0.0
    return rel, mx


def within(got, ref, max_rel_l2, max_rel_max):
    """check() for compile_variants: (ok, detail) with relative L2 and max-error bounds."""
    rel, mx = rel_errors(got, ref)
    ok = rel <= max_rel_l2 and mx <= max_rel_max
    return ok, f"rel_l2 {rel:.1e} (<= {max_rel_l2:.0e}), max error {mx:.1e} of max|ref| (<= {max_rel_max:.0e})"
