"""Split-KV / chunked prefill recombined from sdpa_fwd's statistics, checked
against the one-shot attention (issue #13, item 3). Needs a GPU and the
fusebox binary; numpy only (no torch).

    python3 -m fusebox_tools.crosscheck.sdpa_chunks [--fusebox build/fusebox] [--split 384] [--keep DIR]

For each case (non-causal: split-KV decode and prefill; causal prefill) it
writes three graphs: the one-shot attention over all S keys, chunk A over keys
[0, split) and chunk B over keys [split, S), each with its `stats` output (the
per-row logsumexp of the scaled, masked scores, natural log). It runs all three
on the same q, k, v (`fusebox run --inputs ... --save-outputs ... --verify`,
so each is also checked against fusebox's reference) and recombines the chunks:

    lse = logaddexp(lse_A, lse_B)
    o   = exp(lse_A - lse) * o_A + exp(lse_B - lse) * o_B

(a chunk whose row keeps no key contributes nothing: its weight is 0). The
recombined o and lse must match the one-shot o (the io dtype's tolerance,
twice: both sides are rounded) and stats (1e-3 absolute, fp32). A negative
control (equal weights, ignoring the stats) must fail, so the check can fail.

Causal chunks: chunk A is top-left causal (row i keeps keys j <= i of the first
`split`); chunk B is bottom-right causal with padding, seq_len_q = S and
seq_len_kv = S - split, so row i keeps chunk keys j' <= i - split: exactly the
one-shot's keys split + j' <= i. Rows i < split keep no key of chunk B.

Exit status 0 when every case passes, 1 otherwise, 2 on bad arguments. Prints
one line per case and, with --json, one JSON document.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from fusebox_tools.core.graph import fusebox_bin

# rel_l2, max|a-r|/max|r| of the recombined o against the one-shot o: each side
# is rounded to the io dtype once more than the reference is (docs/architecture.md).
TOLERANCE = {"bf16": (2e-2, 8e-2), "fp16": (6e-3, 2e-2)}
STATS_ATOL = 1e-3


def chunk_graphs(B, Hq, Hk, S, D, split, dtype, causal):
    """The one-shot graph and the two chunk graphs (dicts, graph JSON), and
    the fixed inputs the chunk-B graph needs besides q, k, v."""
    if not 0 < split < S:
        raise ValueError(f"split {split} must be in (0, {S})")

    def graph(name, skv, mask, padding=None):
        tensors = [{"name": "q", "dims": [B, Hq, S, D]}, {"name": "k", "dims": [B, Hk, skv, D]},
                   {"name": "v", "dims": [B, Hk, skv, D]}, {"name": "o"}, {"name": "stats", "dtype": "fp32"}]
        inputs = {"q": "q", "k": "k", "v": "v"}
        if padding:
            lq, lkv = padding
            tensors += [{"name": "seq_len_q", "dims": [B, 1, 1, 1], "dtype": "int32", "values": [lq] * B},
                        {"name": "seq_len_kv", "dims": [B, 1, 1, 1], "dtype": "int32", "values": [lkv] * B}]
            inputs.update(seq_len_q="seq_len_q", seq_len_kv="seq_len_kv")
        op = {"op": "sdpa_fwd", "name": "attn", "inputs": inputs, "outputs": {"o": "o", "stats": "stats"},
              "attn_scale": 1.0 / np.sqrt(D)}
        op.update(mask)
        return {"name": name, "io_dtype": dtype, "intermediate_dtype": "fp32", "compute_dtype": "fp32",
                "tensors": tensors, "ops": [op]}

    causal_tl = {"causal": True} if causal else {}
    tag = "causal" if causal else "full"
    full = graph(f"chunks_{tag}_oneshot", S, causal_tl)
    a = graph(f"chunks_{tag}_a", split, causal_tl)
    if causal:
        b = graph(f"chunks_{tag}_b", S - split, {"causal": True, "alignment": "bottom_right"}, (S, S - split))
    else:
        b = graph(f"chunks_{tag}_b", S - split, {})
    return full, a, b


def chunk_row_kept(S, split, causal):
    """Per query row: whether chunk A and chunk B keep at least one key."""
    i = np.arange(S)
    kept_a = np.ones(S, dtype=bool)  # causal: key 0 <= i always
    kept_b = i >= split if causal else np.ones(S, dtype=bool)
    return kept_a, kept_b


def recombine(o_a, lse_a, o_b, lse_b, kept_a, kept_b):
    """The attention over both chunks from each chunk's o [B,H,S,D] and
    logsumexp [B,H,S,1]; rows a chunk keeps nothing of (kept_* False, [S])
    take nothing from it, whatever values it left there."""
    la = np.where(kept_a.reshape(1, 1, -1, 1), lse_a.astype(np.float64), -np.inf)
    lb = np.where(kept_b.reshape(1, 1, -1, 1), lse_b.astype(np.float64), -np.inf)
    lse = np.logaddexp(la, lb)
    wa, wb = np.exp(la - lse), np.exp(lb - lse)
    o = wa * np.where(kept_a.reshape(1, 1, -1, 1), o_a, 0.0) + wb * np.where(kept_b.reshape(1, 1, -1, 1), o_b, 0.0)
    return o, lse


def compare(actual, ref):
    """(rel_l2, max|a-r|/max|r|)."""
    a, r = np.asarray(actual, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(a - r) / np.linalg.norm(r)), float(np.abs(a - r).max() / np.abs(r).max())


def run_graph(fusebox, graph, work, inputs, seed):
    """fusebox run with --verify; returns {output: array} or raises RuntimeError."""
    path = os.path.join(work, graph["name"] + ".json")
    with open(path, "w") as f:
        json.dump(graph, f)
    out_dir = os.path.join(work, graph["name"] + ".out")
    cmd = [fusebox, "run", path, "--inputs", ",".join(f"{n}={p}" for n, p in inputs.items()),
           "--save-outputs", out_dir, "--verify", "--iters", "0", "--seed", str(seed), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[:800]}")
    return {n: np.load(os.path.join(out_dir, f"{n}.npy")) for n in ("o", "stats")}


def check_case(fusebox, work, B, Hq, Hk, S, D, split, dtype, causal, seed):
    full, a, b = chunk_graphs(B, Hq, Hk, S, D, split, dtype, causal)
    rng = np.random.default_rng(seed)
    q = rng.uniform(-1, 1, (B, Hq, S, D)).astype(np.float32)
    k = rng.uniform(-1, 1, (B, Hk, S, D)).astype(np.float32)
    v = rng.uniform(-1, 1, (B, Hk, S, D)).astype(np.float32)
    files = {}
    for name, arr in (("q", q), ("k", k), ("v", v), ("k_a", k[:, :, :split]), ("v_a", v[:, :, :split]),
                      ("k_b", k[:, :, split:]), ("v_b", v[:, :, split:])):
        files[name] = os.path.join(work, f"{full['name']}.{name}.npy")
        np.save(files[name], np.ascontiguousarray(arr))
    one = run_graph(fusebox, full, work, {"q": files["q"], "k": files["k"], "v": files["v"]}, seed)
    ra = run_graph(fusebox, a, work, {"q": files["q"], "k": files["k_a"], "v": files["v_a"]}, seed)
    rb = run_graph(fusebox, b, work, {"q": files["q"], "k": files["k_b"], "v": files["v_b"]}, seed)
    kept_a, kept_b = chunk_row_kept(S, split, causal)
    o, lse = recombine(ra["o"], ra["stats"], rb["o"], rb["stats"], kept_a, kept_b)
    tol = TOLERANCE[dtype]
    o_rel, o_max = compare(o, one["o"])
    stats_err = float(np.abs(lse - one["stats"]).max())
    # negative control: equal weights where both chunks keep keys
    both = (kept_a & kept_b).reshape(1, 1, -1, 1)
    naive = np.where(both, 0.5 * (ra["o"] + rb["o"]), o)
    n_rel, n_max = compare(naive, one["o"])
    ok = o_rel <= tol[0] and o_max <= tol[1] and stats_err <= STATS_ATOL
    control_fails = not (n_rel <= tol[0] and n_max <= tol[1])
    return {"case": "causal prefill" if causal else "split-KV", "B": B, "Hq": Hq, "Hk": Hk, "S": S, "D": D,
            "split": split, "dtype": dtype, "o_rel_l2": o_rel, "o_max_abs_rel": o_max, "stats_max_abs": stats_err,
            "tolerance": {"rel_l2": tol[0], "max_abs_rel": tol[1], "stats_abs": STATS_ATOL},
            "control_rel_l2": n_rel, "control_fails": control_fails, "pass": bool(ok and control_fails)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fusebox", help="fusebox binary (default: $FUSEBOX_BIN, else build/fusebox)")
    p.add_argument("--B", type=int, default=2)
    p.add_argument("--Hq", type=int, default=8)
    p.add_argument("--Hk", type=int, default=2)
    p.add_argument("--S", type=int, default=1024)
    p.add_argument("--D", type=int, default=128)
    p.add_argument("--split", type=int, default=384)
    p.add_argument("--dtype", choices=sorted(TOLERANCE), default="bf16")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--keep", metavar="DIR", help="write the graphs, inputs and outputs here and keep them")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if not 0 < args.split < args.S or args.Hq % args.Hk:
        p.error("need 0 < split < S and Hq a multiple of Hk")
    fusebox = fusebox_bin(args.fusebox)
    work = args.keep or tempfile.mkdtemp(prefix="sdpa_chunks_")
    os.makedirs(work, exist_ok=True)
    results = []
    try:
        for causal in (False, True):
            try:
                r = check_case(fusebox, work, args.B, args.Hq, args.Hk, args.S, args.D, args.split, args.dtype,
                               causal, args.seed)
            except RuntimeError as e:
                r = {"case": "causal prefill" if causal else "split-KV", "pass": False, "error": str(e)}
            results.append(r)
            if not args.json:
                if "error" in r:
                    print(f"{r['case']}: FAIL: {r['error']}")
                else:
                    print(f"{r['case']} (B{r['B']} Hq{r['Hq']} Hk{r['Hk']} S{r['S']} D{r['D']} split {r['split']} "
                          f"{r['dtype']}): o rel_l2={r['o_rel_l2']:.2e} max_abs_rel={r['o_max_abs_rel']:.2e}, "
                          f"stats max_abs={r['stats_max_abs']:.2e}; equal-weights control rel_l2="
                          f"{r['control_rel_l2']:.2e} ({'fails as it must' if r['control_fails'] else 'PASSES?!'})"
                          f" -> {'PASS' if r['pass'] else 'FAIL'}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps({"pass": all(r["pass"] for r in results), "cases": results}, indent=1))
    return 0 if all(r["pass"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
