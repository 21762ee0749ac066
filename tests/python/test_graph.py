"""fusebox_tools.core.graph: the package's view of each example graph agrees with
`fusebox check --json`, and its mask rule (SdpaOptions.keeps, which the torch
cross-check applies) counts the same kept pairs as fusebox's FLOP count.
Needs the fusebox binary and numpy (no torch)."""
import os

import pytest

from fusebox_tools.core.graph import (SDPA_BWD_OPS, SDPA_OPS, FuseboxError, Graph, SdpaOptions, check_json,
                                 default_graphs)

np = pytest.importorskip("numpy", reason="numpy is installed by scripts/setup.sh")

EXAMPLES = default_graphs()


def name_of(path):
    return os.path.relpath(path, os.path.join(os.path.dirname(path), ".."))


@pytest.mark.parametrize("path", EXAMPLES, ids=name_of)
def test_view_matches_check_json(fusebox, path):
    doc = check_json(path, fusebox)
    g = Graph.load(path, fusebox)
    assert g.name == doc["graph"] and g.fingerprint == doc["fingerprint"]
    assert (g.flops, g.bytes) == (doc["flops"], doc["bytes"])
    assert [t["name"] for t in doc["tensors"]] == list(g.tensors)
    assert g.inputs() == [t["name"] for t in doc["tensors"] if t["kind"] == "input"]
    assert g.outputs() == [t["name"] for t in doc["tensors"] if t["kind"] == "output"]
    assert g.outputs(), path
    for t in doc["tensors"]:
        n = t["name"]
        assert (g.dims[n], g.strides(n), g.dtype(n), g.kind(n)) == (t["dims"], t["strides"], t["dtype"], t["kind"])
        assert g.is_scalar(n) == (t["kind"] == "scalar")
    for name in g.outputs():
        op, role = g.output_role(name)
        assert op["outputs"][role] == name
        rel, mx = g.tolerance(name)
        assert (rel, mx, g.saturation(name)) == tuple(op["tolerances"][role].values())
    for op in g.ops:
        for role, name in op["inputs"].items():
            assert (op, role) in g.consumers(name)
    for op in g.sdpa_ops():
        o = g.sdpa_options(op)
        a = op["attrs"]
        assert (o.attn_scale, o.right_bound, o.left_bound, o.alibi, o.dropout) == \
            (a["attn_scale"], a["right_bound"], a["left_bound"], a["alibi"], a["dropout"])
        assert o.padding == ("seq_len_q" in op["inputs"]) and o.bias == ("bias" in op["inputs"])
    with pytest.raises(KeyError):
        g.tolerance(g.inputs()[0])


def test_load_errors(fusebox, repo_root, tmp_path):
    with pytest.raises(FuseboxError) as e:
        Graph.load(os.path.join(repo_root, "examples/graphs/invalid_shapes.json"), fusebox)
    assert e.value.code == "InvalidArgument" and e.value.returncode == 2
    with pytest.raises(FuseboxError) as e:
        Graph.load(str(tmp_path / "none.json"), fusebox)
    assert e.value.code == "IoError"
    with pytest.raises(FuseboxError) as e:
        Graph.load(os.path.join(repo_root, "examples/graphs/conv_bias_relu.json"), str(tmp_path / "no-fusebox"))
    assert "--fusebox=" in str(e.value) and "no-fusebox" in str(e.value)
    not_fusebox = tmp_path / "not-fusebox"
    not_fusebox.write_text("#!/bin/sh\necho oops\n")
    not_fusebox.chmod(0o755)
    with pytest.raises(FuseboxError) as e:
        Graph.load(os.path.join(repo_root, "examples/graphs/conv_bias_relu.json"), str(not_fusebox))
    assert "without a JSON document" in str(e.value) and "oops" in str(e.value)


def test_fusebox_bin_from_env(fusebox, repo_root, monkeypatch, tmp_path):
    monkeypatch.setenv("FUSEBOX_BIN", str(tmp_path / "elsewhere"))
    with pytest.raises(FuseboxError) as e:
        Graph.load(os.path.join(repo_root, "examples/graphs/conv_bias_relu.json"))
    assert "elsewhere" in str(e.value)
    monkeypatch.setenv("FUSEBOX_BIN", fusebox)
    assert Graph.load(os.path.join(repo_root, "examples/graphs/conv_bias_relu.json")).name == "conv_bias_relu"


def kept_pairs(opts, lq, lkv, sq, skv, block_bytes=None):
    """Pairs kept by SdpaOptions.keeps over the full [sq, skv] grid, with numpy
    (rows in blocks to bound memory); with `block_bytes` (one head's block mask,
    [query tiles, bytes]) also by its bit of each pair's 128 x 128 tile."""
    j = np.arange(skv).reshape(1, -1)
    total = 0
    for r0 in range(0, sq, 1024):
        i = np.arange(r0, min(sq, r0 + 1024)).reshape(-1, 1)
        keep = np.broadcast_to(opts.keeps(i, j, lq, lkv), (i.shape[0], skv))
        if block_bytes is not None:
            keep = keep & (((block_bytes[i // 128, j // 128 // 8] >> ((j // 128) % 8)) & 1) == 1)
        if not opts.padding:  # without padding the lengths are the full ones
            assert lq == sq and lkv == skv
        total += int(np.count_nonzero(keep))
    return total


def sdpa_flops_from_mask(g, op, lengths):
    """2*Hq*(D+Dv) per kept pair and batch (2.5x backward): graph.h's count,
    with the pairs from the Python mask rule."""
    q, k, v = (g.dims[op["inputs"][r]] for r in ("q", "k", "v"))
    opts = g.sdpa_options(op)
    lq, lkv = lengths
    skv = op["attrs"]["max_seq_len_kv"] if op["attrs"].get("paged") else k[2]  # paged: k is a page pool
    name = op["inputs"].get("block_mask")
    blocks = g.values(name) if name else None
    if blocks:  # fixed block-mask bytes: only the kept tiles count, per query head
        bytes_ = np.asarray(blocks, dtype=np.int64).reshape(g.dims[name])
        pairs = sum(kept_pairs(opts, lq[b], lkv[b], q[2], skv, bytes_[b, h]) for b in range(q[0]) for h in range(q[1]))
        f = 2 * pairs * (q[3] + v[3])
    else:
        pairs = sum(kept_pairs(opts, lq[b], lkv[b], q[2], skv) for b in range(q[0]))
        f = 2 * q[1] * pairs * (q[3] + v[3])
    return f * 2.5 if op["op"] in SDPA_BWD_OPS else f


def fixed_lengths(g, op):
    out = []
    for role, src in (("seq_len_q", "q"), ("seq_len_kv", "k")):
        name = op["inputs"].get(role)
        full = g.dims[op["inputs"][src]][2]
        if src == "k" and op["attrs"].get("paged"):
            full = op["attrs"]["max_seq_len_kv"]
        vals = g.values(name) if name else None
        out.append([int(x) for x in vals] if vals else [full] * g.dims[op["inputs"]["q"]][0])
    return out


SDPA_EXAMPLES = [p for p in EXAMPLES if "sdpa" in os.path.basename(p)]


@pytest.mark.parametrize("path", SDPA_EXAMPLES, ids=name_of)
def test_mask_rule_counts_fusebox_flops(fusebox, path):
    g = Graph.load(path, fusebox)
    assert all(op["op"] in SDPA_OPS for op in g.ops), "one-op sdpa graphs: flops are the op's"
    want = sum(sdpa_flops_from_mask(g, op, fixed_lengths(g, op)) for op in g.ops)
    assert g.flops == pytest.approx(want, rel=1e-12), (g.flops, want)


def test_mask_rule_with_given_lengths(fusebox, repo_root, tmp_path):
    """Random lengths passed with --inputs: fusebox's count and the Python
    rule agree, and differ from the full-length count."""
    rng = np.random.default_rng(7)
    for name in ("sdpa_gqa_padding.json", "small/sdpa_padding_small.json",
                 "small/sdpa_bottom_right_window_small.json"):
        path = os.path.join(repo_root, "examples/graphs", name)
        g = Graph.load(path, fusebox)
        op = g.ops[0]
        if not g.sdpa_options(op).padding:
            continue
        files, lengths = {}, []
        for role, src in (("seq_len_q", "q"), ("seq_len_kv", "k")):
            t = op["inputs"][role]
            lo, hi = g.random_range(t)
            arr = rng.integers(int(lo), int(hi) + 1, size=g.dims[t]).astype(np.int32)
            files[t] = str(tmp_path / f"{role}.npy")
            np.save(files[t], arr)
            lengths.append([int(x) for x in arr.reshape(-1)])
        given = Graph.load(path, fusebox, inputs=files)
        want = sdpa_flops_from_mask(g, op, lengths)
        assert given.flops == pytest.approx(want, rel=1e-12), name
        assert given.flops != g.flops


def test_keeps_rule():
    """graph.h's rule on a few hand-checked cases, for ints and arrays."""
    causal = SdpaOptions(attn_scale=0.125, right_bound=0)
    assert causal.keeps(3, 3, 8, 8) and not causal.keeps(3, 4, 8, 8)
    br = SdpaOptions(attn_scale=0.125, right_bound=0, bottom_right=True)
    assert br.keeps(0, 4, 4, 8) and not br.keeps(0, 5, 4, 8)  # offset lkv - lq = 4
    window = SdpaOptions(attn_scale=0.125, right_bound=0, left_bound=2)
    assert [j for j in range(8) if window.keeps(5, j, 8, 8)] == [4, 5]
    pad = SdpaOptions(attn_scale=0.125, padding=True)
    assert pad.keeps(2, 4, 3, 5) and not pad.keeps(3, 0, 3, 5) and not pad.keeps(0, 5, 3, 5)
    rows = np.arange(8).reshape(-1, 1)
    cols = np.arange(8).reshape(1, -1)
    assert np.array_equal(causal.keeps(rows, cols, 8, 8), np.tril(np.ones((8, 8), dtype=bool)))
    assert np.count_nonzero(np.broadcast_to(SdpaOptions(0.1).keeps(rows, cols, 8, 8), (8, 8))) == 64
