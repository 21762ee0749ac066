"""CPU checks of fusebox_tools.core.torch_ops' attention math (the torch side of the
cross-check) and of the crosscheck / sdpa_compare helpers on the small
examples. Needs torch (skipped without it: CI has none) and numpy; the tests
on examples also need the fusebox binary.

    python3 -m pytest tests/python/test_sdpa_torch_ops.py
"""
import json
import math
import os
import random
import tempfile

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (CPU torch is enough: pip install torch)")
np = pytest.importorskip("numpy")
import torch.nn.functional as F  # noqa: E402

from fusebox_tools.crosscheck import crosscheck as xc
from fusebox_tools.bench import sdpa_compare
from fusebox_tools.core import torch_ops
from fusebox_tools.core.graph import Graph, SdpaOptions, default_graphs  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False
SMALL_SDPA = [p for p in default_graphs() if "/small/" in p and "sdpa" in os.path.basename(p)]


def _plain_forward(path):
    """Only picks tests: a one-op sdpa_fwd file without dropout (fusebox resolves it in the test)."""
    with open(path, encoding="utf-8") as f:
        ops = json.load(f)["ops"]
    # torch's SDPA has no attention sinks
    return (len(ops) == 1 and ops[0]["op"] == "sdpa_fwd" and not ops[0].get("dropout")
            and "sink_token" not in ops[0]["inputs"])


def slopes(heads):
    """ALiBi-like slopes for hand-built ops (fusebox gives the real ones; the
    tests only need both sides to use the same)."""
    return [2.0 ** (-(h + 1) / 2) for h in range(heads)]


def sdpa_op(kind, inputs, head_dim, causal=False, right_bound=None, left_bound=None, alignment="top_left",
            alibi_heads=None, dropout=None, outputs=None):
    """An sdpa op in the form of check --json, its attrs resolved by hand
    (attn_scale 1/sqrt(D), causal sets right_bound 0): what the torch math
    reads. The resolution itself is fusebox's, tested in test_check_json."""
    roles = {r: r for r in inputs} if not isinstance(inputs, dict) else inputs
    if causal and right_bound is None:
        right_bound = 0
    attrs = {"attn_scale": 1.0 / math.sqrt(head_dim), "causal": causal, "alignment": alignment,
             "left_bound": left_bound, "right_bound": right_bound, "padding": "seq_len_q" in roles,
             "bias": "bias" in roles, "alibi": alibi_heads is not None,
             "alibi_slopes": slopes(alibi_heads) if alibi_heads else None, "dropout": dropout,
             "dump_dropout_mask": False}
    return {"name": "attn", "op": kind, "inputs": roles, "outputs": outputs or {}, "attrs": attrs}


def rand(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, generator=g) * 2 - 1


def brute_force(q, k, v, op, lq=None, lkv=None, bias=None):
    """Element-by-element reference in float64 from graph.h's rules."""
    B, Hq, Sq, D = q.shape
    Hk, Skv = k.shape[1], k.shape[2]
    opts = SdpaOptions.from_attrs(op["attrs"])
    o = torch.zeros(B, Hq, Sq, v.shape[3], dtype=torch.float64)
    st = torch.full((B, Hq, Sq, 1), float("-inf"), dtype=torch.float64)
    for b in range(B):
        a = lq[b] if lq is not None else Sq
        c = lkv[b] if lkv is not None else Skv
        for h in range(Hq):
            hk = h // (Hq // Hk)
            for i in range(Sq):
                cols = [j for j in range(Skv) if opts.keeps(i, j, a, c)]
                if not cols:
                    continue
                s = torch.tensor([opts.attn_scale * float(q[b, h, i].double() @ k[b, hk, j].double())
                                  + (float(bias[b if bias.shape[0] > 1 else 0, h if bias.shape[1] > 1 else 0, i, j])
                                     if bias is not None else 0.0)
                                  + (opts.alibi_slopes[h] * (j - i) if opts.alibi else 0.0) for j in cols],
                                 dtype=torch.float64)
                p = torch.softmax(s, 0)
                o[b, h, i] = p @ v[b, hk, cols].double()
                st[b, h, i, 0] = torch.logsumexp(s, 0)
    return o, st


def check_close(a, b, tol=1e-5):
    a, b = a.double(), b.double()
    fin = torch.isfinite(b)
    assert torch.equal(fin, torch.isfinite(a)), "non-finite pattern differs"
    err = (a[fin] - b[fin]).abs().max().item() if fin.any() else 0.0
    assert err <= tol, err


def test_gather_pages_reads_through_the_table():
    pool = rand(6, 2, 4, 8, seed=3)
    table = torch.tensor([[5, 0, 3], [1, 4, 2]]).reshape(2, 1, 3, 1)
    dense = torch_ops.gather_pages(pool, table, 10)
    assert dense.shape == (2, 2, 10, 8)
    for b in range(2):
        for j in range(10):
            assert torch.equal(dense[b, :, j], pool[table[b, 0, j // 4, 0], :, j % 4])
    # sdpa_forward on a paged op equals the dense op on the gathered cache
    op = sdpa_op("sdpa_fwd", ["q", "k", "v", "seq_len_q", "seq_len_kv", "page_table_k", "page_table_v"], 8,
                 causal=True, alignment="bottom_right")
    op["attrs"].update(paged=True, max_seq_len_kv=10)
    q = rand(2, 4, 3, 8, seed=4)
    lens = {"seq_len_q": torch.tensor([3, 2]).reshape(2, 1, 1, 1), "seq_len_kv": torch.tensor([10, 6]).reshape(2, 1, 1, 1)}
    paged = torch_ops.sdpa_forward(dict(q=q, k=pool, v=pool * 2, page_table_k=table, page_table_v=table.flip(2),
                                        **lens), op)
    dense_op = sdpa_op("sdpa_fwd", ["q", "k", "v", "seq_len_q", "seq_len_kv"], 8, causal=True,
                       alignment="bottom_right")
    want = torch_ops.sdpa_forward(dict(q=q, k=dense, v=torch_ops.gather_pages(pool * 2, table.flip(2), 10), **lens),
                                  dense_op)
    check_close(paged["o"], want["o"], 0)


def test_sink_tokens_join_the_softmax():
    q, k, v = rand(1, 2, 3, 8, seed=5), rand(1, 1, 5, 8, seed=6), rand(1, 1, 5, 8, seed=7)
    sink = torch.tensor([0.5, -1.0]).reshape(1, 2, 1, 1)
    op = sdpa_op("sdpa_fwd", ["q", "k", "v", "sink_token"], 8, causal=True)
    out = torch_ops.sdpa_forward(dict(q=q, k=k, v=v, sink_token=sink), op)
    for h in range(2):
        for i in range(3):
            s = torch.tensor([float(q[0, h, i].double() @ k[0, 0, j].double()) / math.sqrt(8) for j in range(i + 1)],
                             dtype=torch.float64)
            z = torch.logsumexp(torch.cat([s, torch.tensor([float(sink[0, h, 0, 0])], dtype=torch.float64)]), 0)
            p = torch.exp(s - z)
            assert abs(float(out["stats"][0, h, i, 0]) - float(z)) < 1e-5
            check_close(out["o"][0, h, i], (p @ v[0, 0, :i + 1].double()).float())


def test_sink_backward_matches_the_analytic_gradient():
    """dsink[h] = -sum_{b,i} exp(sink[h] - stats[b,h,i]) * (do . o)[b,h,i], with o and stats the
    forward's (the formula of include/fusebox/ops/sdpa.h and the CPU reference); dq, dk, dv through
    the sink-including softmax agree with a direct autograd of the same math."""
    q, k, v, do = rand(2, 4, 9, 8, seed=31), rand(2, 2, 9, 8, seed=32), rand(2, 2, 9, 8, seed=33), rand(2, 4, 9, 8, seed=34)
    sink = torch.tensor([0.5, -1.0, 2.0, 0.0]).reshape(1, 4, 1, 1)
    fwd = torch_ops.sdpa_forward(dict(q=q, k=k, v=v, sink_token=sink),
                                 sdpa_op("sdpa_fwd", ["q", "k", "v", "sink_token"], 8, causal=True))
    op = sdpa_op("sdpa_bwd", ["q", "k", "v", "o", "do", "stats", "sink_token"], 8, causal=True,
                 outputs={"dq": "dq", "dk": "dk", "dv": "dv", "dsink_token": "ds"})
    got = torch_ops.sdpa_backward(dict(q=q, k=k, v=v, do=do, sink_token=sink), op)
    di = (do * fwd["o"]).sum(-1, keepdim=True)
    want = -(torch.exp(sink - fwd["stats"]) * di).sum(dim=(0, 2), keepdim=True)
    assert got["dsink_token"].shape == (1, 4, 1, 1)
    check_close(got["dsink_token"], want.reshape(1, 4, 1, 1), 1e-5)
    # brute force: the whole attention with the sink as a column, by autograd
    qq, kk, vv, ss = (t.clone().requires_grad_(True) for t in (q, k, v, sink))
    s = torch.matmul(qq, kk.repeat_interleave(2, 1).transpose(-2, -1)) / math.sqrt(8)
    s = s.masked_fill(~torch.ones(9, 9, dtype=torch.bool).tril(), float("-inf"))
    s = torch.cat([s, ss.expand(2, 4, 9, 1)], dim=-1)
    o = torch.matmul(torch.softmax(s, -1)[..., :-1], vv.repeat_interleave(2, 1))
    o.backward(do)
    check_close(got["dq"], qq.grad, 1e-5)
    check_close(got["dk"], kk.grad, 1e-5)
    check_close(got["dv"], vv.grad, 1e-5)
    check_close(got["dsink_token"], ss.grad, 1e-5)


def test_causal_matches_torch_sdpa():
    q, k, v = rand(2, 4, 33, 16, seed=1), rand(2, 2, 33, 16, seed=2), rand(2, 2, 33, 16, seed=3)
    op = sdpa_op("sdpa_fwd", ("q", "k", "v"), 16, causal=True, outputs={"o": "o", "stats": "s"})
    out = torch_ops.sdpa_forward({"q": q, "k": k, "v": v}, op)
    want = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                          is_causal=True)
    check_close(out["o"], want, 1e-5)
    s = (q @ k.repeat_interleave(2, 1).transpose(-2, -1)) / math.sqrt(16)
    s = s.masked_fill(~torch.ones(33, 33, dtype=torch.bool).tril(), float("-inf"))
    check_close(out["stats"], torch.logsumexp(s, -1, keepdim=True), 1e-5)


def test_masks_against_brute_force():
    rnd = random.Random(1)
    for trial in range(12):
        B, Hk, g = 2, rnd.choice([1, 2]), rnd.choice([1, 3])
        Hq, Sq, Skv, D = Hk * g, rnd.randint(1, 9), rnd.randint(1, 11), 8
        q, k, v = rand(B, Hq, Sq, D, seed=trial), rand(B, Hk, Skv, D, seed=100 + trial), rand(B, Hk, Skv, D, seed=200 + trial)
        roles = ["q", "k", "v"]
        ins = {"q": q, "k": k, "v": v}
        opt = {}
        if rnd.random() < .6:
            opt["causal"] = True
            if rnd.random() < .4:
                opt["alibi_heads"] = Hq
        if rnd.random() < .5:
            opt["left_bound"] = rnd.randint(1, 5)
        if rnd.random() < .5:
            opt["alignment"] = "bottom_right"
        lq = lkv = bias = None
        if rnd.random() < .5:
            lq = [rnd.randint(1, Sq) for _ in range(B)]
            lkv = [rnd.randint(1, Skv) for _ in range(B)]
            roles += ["seq_len_q", "seq_len_kv"]
            ins["seq_len_q"] = torch.tensor(lq, dtype=torch.int64).reshape(B, 1, 1, 1)
            ins["seq_len_kv"] = torch.tensor(lkv, dtype=torch.int64).reshape(B, 1, 1, 1)
        if rnd.random() < .4:
            bias = rand(rnd.choice([1, B]), rnd.choice([1, Hq]), Sq, Skv, seed=300 + trial)
            roles.append("bias")
            ins["bias"] = bias
        op = sdpa_op("sdpa_fwd", roles, D, **opt)
        out = torch_ops.sdpa_forward(ins, op)
        o, st = brute_force(q, k, v, op, lq, lkv, bias)
        check_close(out["o"], o, 1e-5)
        check_close(out["stats"], st, 1e-5)
        # care mask: exactly the rows with a finite brute-force stats
        care = torch_ops.sdpa_care_masks(op, ins, None)["o"]
        assert torch.equal(torch.broadcast_to(care, st.shape), torch.isfinite(st)), op


def test_small_row_blocks():
    """Splitting rows into blocks gives the same result."""
    q, k, v = rand(1, 2, 40, 8, seed=5), rand(1, 1, 50, 8, seed=6), rand(1, 1, 50, 8, seed=7)
    op = sdpa_op("sdpa_fwd", ("q", "k", "v"), 8, causal=True, alignment="bottom_right", left_bound=7)
    full = torch_ops.sdpa_forward({"q": q, "k": k, "v": v}, op)
    old = torch_ops.SCORE_BLOCK_ELEMS
    torch_ops.SCORE_BLOCK_ELEMS = 2 * 50 * 3
    try:
        blk = torch_ops.sdpa_forward({"q": q, "k": k, "v": v}, op)
        bwd_op = dict(op, op="sdpa_bwd")
        do = rand(1, 2, 40, 8, seed=8)
        g_blk = torch_ops.sdpa_backward({"q": q, "k": k, "v": v, "do": do}, bwd_op)
    finally:
        torch_ops.SCORE_BLOCK_ELEMS = old
    g_full = torch_ops.sdpa_backward({"q": q, "k": k, "v": v, "do": do}, bwd_op)
    check_close(blk["o"], full["o"], 1e-6)
    check_close(blk["stats"], full["stats"], 1e-6)
    for r in ("dq", "dk", "dv"):
        check_close(g_blk[r], g_full[r], 1e-5)


def test_backward_matches_torch_autograd_gqa():
    q, k, v = rand(2, 4, 24, 16, seed=11), rand(2, 2, 30, 16, seed=12), rand(2, 2, 30, 16, seed=13)
    do = rand(2, 4, 24, 16, seed=14)
    op = sdpa_op("sdpa_bwd", ("q", "k", "v", "o", "do", "stats"), 16, causal=True, alignment="bottom_right")
    got = torch_ops.sdpa_backward({"q": q, "k": k, "v": v, "do": do}, op)
    qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
    mask = torch.ones(24, 30, dtype=torch.bool).tril(diagonal=30 - 24)
    out = F.scaled_dot_product_attention(qq, kk.repeat_interleave(2, 1), vv.repeat_interleave(2, 1),
                                         attn_mask=mask)
    out.backward(do)
    check_close(got["dq"], qq.grad, 1e-5)
    check_close(got["dk"], kk.grad, 1e-5)
    check_close(got["dv"], vv.grad, 1e-5)


def test_backward_padding_rows_zero():
    q, k, v, do = rand(2, 2, 10, 8, seed=21), rand(2, 2, 12, 8, seed=22), rand(2, 2, 12, 8, seed=23), rand(2, 2, 10, 8, seed=24)
    ins = {"q": q, "k": k, "v": v, "do": do,
           "seq_len_q": torch.tensor([10, 4]).reshape(2, 1, 1, 1),
           "seq_len_kv": torch.tensor([12, 5]).reshape(2, 1, 1, 1)}
    op = sdpa_op("sdpa_bwd", list(ins), 8)
    got = torch_ops.sdpa_backward(ins, op)
    assert got["dq"][1, :, 4:].abs().max() == 0
    assert got["dk"][1, :, 5:].abs().max() == 0 and got["dv"][1, :, 5:].abs().max() == 0
    care = torch_ops.sdpa_care_masks(op, ins, None)
    assert care["dk"][1, 0, :, 0].tolist() == [True] * 5 + [False] * 7
    assert care["dq"][1, 0, :, 0].tolist() == [True] * 4 + [False] * 6


def test_fp8_emulation():
    q, k, v = (torch_ops.round_fp8(rand(1, 2, 16, 16, seed=s)) for s in (31, 32, 33))
    sc = {"descale_q": 1.0, "descale_k": 1.0, "descale_v": 1.0, "descale_s": 1 / 448, "scale_s": 448.0,
          "scale_o": 16.0}
    ins = {"q": q, "k": k, "v": v}
    ins.update({r: torch.tensor([x]).reshape(1, 1, 1, 1) for r, x in sc.items()})
    op = sdpa_op("sdpa_fp8_fwd", list(ins), 16, causal=True)
    out = torch_ops.sdpa_forward(ins, op, fp8=True)
    ref = torch_ops.sdpa_forward({"q": q, "k": k, "v": v}, dict(op, op="sdpa_fwd"))
    # o is fp8 (values exactly representable), about ref * scale_o
    assert torch.equal(torch_ops.round_fp8(out["o"]), out["o"])
    rel = (out["o"] / 16 - ref["o"]).norm() / ref["o"].norm()
    assert rel < 0.1, rel
    assert out["amax_s"].item() == 1.0  # row 0 of a causal mask has one key: P = 1
    big_o = out["o"] / 16
    assert abs(out["amax_o"].item() - big_o.abs().max().item()) / out["amax_o"].item() < 0.07
    assert torch_ops.round_fp8(torch.tensor([1000.0, -1000.0])).tolist() == [448.0, -448.0]


FP8_BWD_SCALES = {"descale_q": 0.5, "descale_k": 1.25, "descale_v": 0.75, "descale_o": 0.0625,
                  "descale_do": 1.5, "descale_s": 1 / 448, "descale_dp": 1 / 64, "scale_s": 448.0,
                  "scale_dq": 64.0, "scale_dk": 64.0, "scale_dv": 32.0, "scale_dp": 64.0}


def fp8_round64(x, dtype):
    """float64 -> fp8 value of `dtype` (saturating, nearest even) -> float64."""
    mx = {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}[dtype]
    t = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}[dtype]
    return x.clamp(-mx, mx).to(torch.float32).to(t).to(torch.float64)


def fp8_bwd_brute_force(ins, op, sc, p_dtype, ds_dtype):
    """sdpa_fp8_bwd in float64, one (batch, head) at a time, unblocked, with
    the mask from SdpaOptions.keeps and cuDNN's two roundings
    (P8, dS8). dq, dk, dv after the output scales, unrounded; amax values."""
    q, k, v, o, do, st = (ins[r].double() for r in ("q", "k", "v", "o", "do", "stats"))
    B, Hq, Sq, D = q.shape
    Hk, Skv, Dv = k.shape[1], k.shape[2], v.shape[3]
    opts = SdpaOptions.from_attrs(op["attrs"])
    lq = ins["seq_len_q"].reshape(-1).tolist() if "seq_len_q" in ins else [Sq] * B
    lkv = ins["seq_len_kv"].reshape(-1).tolist() if "seq_len_kv" in ins else [Skv] * B
    dq = torch.zeros(B, Hq, Sq, D, dtype=torch.float64)
    dk = torch.zeros(B, Hk, Skv, D, dtype=torch.float64)
    dv = torch.zeros(B, Hk, Skv, Dv, dtype=torch.float64)
    amax_dp = 0.0
    for b in range(B):
        keep = torch.tensor([[opts.keeps(i, j, lq[b], lkv[b]) for j in range(Skv)] for i in range(Sq)])
        for h in range(Hq):
            hk = h // (Hq // Hk)
            s = (q[b, h] @ k[b, hk].T) * (opts.attn_scale * sc["descale_q"] * sc["descale_k"])
            p = torch.where(keep, torch.exp(s - st[b, h]), torch.zeros(()).double())
            p8 = fp8_round64(p * sc["scale_s"], p_dtype)
            dv[b, hk] += (p8.T @ do[b, h]) * sc["descale_s"] * sc["descale_do"]
            di = (do[b, h] * o[b, h]).sum(-1, keepdim=True) * sc["descale_do"] * sc["descale_o"]
            dp = (do[b, h] @ v[b, hk].T) * sc["descale_do"] * sc["descale_v"]
            ds = torch.where(keep, p * (dp - di) * opts.attn_scale, torch.zeros(()).double())
            amax_dp = max(amax_dp, ds.abs().max().item())
            ds8 = fp8_round64(ds * sc["scale_dp"], ds_dtype)
            dq[b, h] = (ds8 @ k[b, hk]) * sc["descale_dp"] * sc["descale_k"]
            dk[b, hk] += (ds8.T @ q[b, h]) * sc["descale_dp"] * sc["descale_q"]
    amax = {"amax_dq": dq.abs().max().item(), "amax_dk": dk.abs().max().item(),
            "amax_dv": dv.abs().max().item(), "amax_dp": amax_dp}
    return {"dq": dq * sc["scale_dq"], "dk": dk * sc["scale_dk"], "dv": dv * sc["scale_dv"]}, amax


def fp8_bwd_case(do_dtype="fp8_e4m3", padding=True, seed=40, **scale_overrides):
    B, Hq, Hk, Sq, Skv, D = 2, 4, 2, 7, 9, 8
    rd = {"fp8_e4m3": torch_ops.round_fp8, "fp8_e5m2": torch_ops.round_fp8_e5m2}
    q = torch_ops.round_fp8(rand(B, Hq, Sq, D, seed=seed) * 2)
    k = torch_ops.round_fp8(rand(B, Hk, Skv, D, seed=seed + 1) * 2)
    v = torch_ops.round_fp8(rand(B, Hk, Skv, D, seed=seed + 2) * 2)
    o = torch_ops.round_fp8(rand(B, Hq, Sq, D, seed=seed + 3) * 8)
    do = rd[do_dtype](rand(B, Hq, Sq, D, seed=seed + 4) * 2)
    roles = ["q", "k", "v", "o", "do", "stats", *torch_ops.FP8_BWD_SCALE_ROLES]
    if padding:
        roles += ["seq_len_q", "seq_len_kv"]
    op = sdpa_op("sdpa_fp8_bwd", roles, D, causal=True, alignment="bottom_right")
    sc = dict(FP8_BWD_SCALES, **scale_overrides)
    ins = {"q": q, "k": k, "v": v, "o": o, "do": do}
    ins.update({r: torch.tensor([x]).reshape(1, 1, 1, 1) for r, x in sc.items()})
    if padding:
        ins["seq_len_q"] = torch.tensor([7, 5]).reshape(B, 1, 1, 1)
        ins["seq_len_kv"] = torch.tensor([9, 3]).reshape(B, 1, 1, 1)
    # stats: the float64 logsumexp of the kept scores (0 for rows keeping none)
    opts = SdpaOptions.from_attrs(op["attrs"])
    lq = [7, 5] if padding else [Sq] * B
    lkv = [9, 3] if padding else [Skv] * B
    st = torch.zeros(B, Hq, Sq, 1, dtype=torch.float64)
    for b in range(B):
        keep = torch.tensor([[opts.keeps(i, j, lq[b], lkv[b]) for j in range(Skv)] for i in range(Sq)])
        for h in range(Hq):
            s = (q[b, h].double() @ k[b, h // 2].double().T) * opts.attn_scale * sc["descale_q"] * sc["descale_k"]
            s = s.masked_fill(~keep, float("-inf"))
            l = torch.logsumexp(s, -1)
            st[b, h, :, 0] = torch.where(torch.isfinite(l), l, torch.zeros_like(l))
    ins["stats"] = st.float()
    return ins, op, sc


def test_fp8_backward_against_brute_force():
    for do_dtype, padding in (("fp8_e4m3", True), ("fp8_e5m2", True), ("fp8_e4m3", False)):
        ins, op, sc = fp8_bwd_case(do_dtype, padding)
        want, want_amax = fp8_bwd_brute_force(ins, op, sc, "fp8_e4m3", do_dtype)
        # fp32 outputs: no output rounding, so the values before it
        raw = torch_ops.sdpa_fp8_backward(ins, op, {"do": do_dtype, "dq": "fp32", "dk": "fp32", "dv": "fp32"})
        for r in ("dq", "dk", "dv"):
            err = (raw[r].double() - want[r]).abs().max().item() / want[r].abs().max().item()
            assert err < 1e-4, (do_dtype, padding, r, err)
        for r, x in want_amax.items():
            assert abs(raw[r].item() - x) <= 1e-5 * x, (r, raw[r].item(), x)
            assert list(raw[r].shape) == [1, 1, 1, 1]
        # fp8 outputs (default e4m3; e5m2 where asked): the same values, rounded
        out = torch_ops.sdpa_fp8_backward(ins, op, {"do": do_dtype, "dk": "fp8_e5m2"})
        assert torch.equal(out["dq"], torch_ops.round_fp8(raw["dq"]))
        assert torch.equal(out["dk"], torch_ops.round_fp8_e5m2(raw["dk"]))
        assert torch.equal(out["dv"], torch_ops.round_fp8(raw["dv"]))
        for r in ("dq", "dv"):
            ref8 = torch_ops.round_fp8(want[r].float()).double()
            m = (out[r].double() - ref8).abs().max().item() / ref8.abs().max().item()
            assert m <= 0.13, (r, m)  # at most one e4m3 step where fp32 and fp64 straddle a boundary
        if padding:  # padding rows / keys are zero
            assert raw["dq"][1, :, 5:].abs().max() == 0
            assert raw["dk"][1, :, 3:].abs().max() == 0 and raw["dv"][1, :, 3:].abs().max() == 0
            care = torch_ops.sdpa_care_masks(op, ins, None)
            # bottom-right causal, lq 5, lkv 3: row i keeps j <= i - 2 (rows 0, 1 keep none)
            assert care["dq"][1, 0, :, 0].tolist() == [False] * 2 + [True] * 3 + [False] * 2
            assert care["dk"][1, 0, :, 0].tolist() == [True] * 3 + [False] * 6
            assert "amax_dq" not in care


def test_fp8_backward_scales_move_result():
    f32 = {"dq": "fp32", "dk": "fp32", "dv": "fp32"}
    ins, op, sc = fp8_bwd_case()
    base = torch_ops.sdpa_fp8_backward(ins, op, f32)
    # the output scale scales its output only (power of two: exactly)
    ins2, _, _ = fp8_bwd_case(scale_dv=64.0)
    out = torch_ops.sdpa_fp8_backward(ins2, op, f32)
    assert torch.equal(out["dv"], 2 * base["dv"]) and torch.equal(out["dq"], base["dq"])
    assert out["amax_dv"].item() == base["amax_dv"].item()
    # descale_do doubles dP and Di, so dS, and every gradient (up to dS8 rounding)
    ins2, _, sc2 = fp8_bwd_case(descale_do=3.0)
    out = torch_ops.sdpa_fp8_backward(ins2, op, f32)
    for r in ("dq", "dk", "dv"):
        rel = (out[r] - 2 * base[r]).norm() / (2 * base[r]).norm()
        assert rel < 0.05, (r, rel)
    assert abs(out["amax_dp"].item() / base["amax_dp"].item() - 2) < 1e-5
    # a coarser scale_dp moves dq through dS8's rounding (and the brute force agrees)
    ins2, _, sc2 = fp8_bwd_case(scale_dp=16.0, descale_dp=1 / 16)
    out = torch_ops.sdpa_fp8_backward(ins2, op, f32)
    assert not torch.equal(out["dq"], base["dq"])
    want, _ = fp8_bwd_brute_force(ins2, op, sc2, "fp8_e4m3", "fp8_e4m3")
    err = (out["dq"].double() - want["dq"]).abs().max().item() / want["dq"].abs().max().item()
    assert err < 1e-4, err
    # blocks of rows give the same result
    old = torch_ops.SCORE_BLOCK_ELEMS
    torch_ops.SCORE_BLOCK_ELEMS = 2 * 9 * 2
    try:
        blk = torch_ops.sdpa_fp8_backward(ins, op, f32)
    finally:
        torch_ops.SCORE_BLOCK_ELEMS = old
    for r in base:
        check_close(blk[r], base[r], 1e-4)


@pytest.mark.parametrize("path", SMALL_SDPA, ids=os.path.basename)
def test_crosscheck_inputs_and_reference_small_examples(fusebox, path):
    """make_inputs + torch_reference on every small sdpa example (CPU)."""
    g = Graph.load(path, fusebox)
    ins = xc.make_inputs(g, 1234, "cpu")
    assert set(ins) == set(g.inputs()), path
    for name, t in ins.items():
        dt = g.dtype(name)
        vals = g.values(name)
        if vals:
            want = torch.tensor(vals, dtype=torch.float64)
            want = want.to(torch.int64) if dt in ("int32", "int64") else want.to(torch.float32)
            assert torch.equal(t.reshape(-1), want), (path, name)
        if dt == "fp8_e4m3":
            assert torch.equal(torch_ops.round_fp8(t), t)
        lo, hi = g.random_range(name)
        if not vals and xc.bwd_forward_role(g, name) is None:
            assert lo <= t.min().item() and t.max().item() <= hi, (path, name)
        if not vals and (name.startswith("descale") or name.startswith("scale")):
            assert 0.5 <= float(t.reshape(-1)[0]) <= 2
        with tempfile.TemporaryDirectory() as d:
            f = os.path.join(d, "x.npy")
            xc.save_input(f, t, dt)
            arr = np.load(f)
            assert arr.dtype == {"int32": np.int32, "int64": np.int64}.get(dt, np.float32)
            assert list(arr.shape) == g.dims[name]
    ref_ins = dict(ins)
    for name in xc.dropout_mask_outputs(g):  # stands in for cuDNN's dumped keep-mask
        ref_ins[name] = (torch.rand(g.dims[name], generator=torch.Generator().manual_seed(5)) > 0.2).float()
    vals, care = xc.torch_reference(g, ref_ins, "cpu")
    for name in g.outputs():
        assert list(vals[name].shape) == g.dims[name], (path, name)
        m = xc.compare(vals[name], vals[name], care.get(name))
        assert m["rel_l2"] == 0.0
    if any(op["op"] == "sdpa_bwd" for op in g.ops):
        op = xc.without_dropout(g.ops[0])
        roles = [r for r in ("q", "k", "v", "sink_token") if r in op["inputs"]]  # o comes with the sinks
        fwd = torch_ops.sdpa_forward({r: ins[op["inputs"][r]] for r in roles}, op)
        assert torch.equal(ins[op["inputs"]["o"]], xc.round_to(fwd["o"], g.dtype(op["inputs"]["o"])))
    if any(op["op"] == "sdpa_fp8_bwd" for op in g.ops):
        # o and stats: the FP8 forward with scale_o = 1 / descale_o
        op = g.ops[0]
        fins = {r: ins[op["inputs"][r]] for r in ("q", "k", "v", "descale_q", "descale_k", "descale_v",
                                                   "descale_s", "scale_s")}
        fins["scale_o"] = 1 / ins[op["inputs"]["descale_o"]]
        fwd = torch_ops.sdpa_forward(fins, xc.without_dropout(op, op="sdpa_fp8_fwd"), fp8=True)
        assert torch.equal(ins[op["inputs"]["o"]], fwd["o"]), path
        st = fwd["stats"]
        assert torch.equal(ins[op["inputs"]["stats"]], torch.where(torch.isfinite(st), st, 0.0)), path
        for name in g.outputs():
            role = next(r for r, t in op["outputs"].items() if t == name)
            if role in ("dq", "dk", "dv"):
                assert torch.equal(vals[name], torch_ops.round_fp8(vals[name])), (path, name)
                assert vals[name].abs().max() > 0, (path, name)
                assert care[name] is not None
            else:
                assert vals[name].item() > 0, (path, name)
                assert g.tolerance(name) == ((2e-2, 2e-2) if role == "amax_dp" else (2.5e-1, 2.5e-1))


@pytest.mark.parametrize("path", [p for p in SMALL_SDPA if _plain_forward(p)], ids=os.path.basename)
def test_bench_mask_kwargs_match_reference(fusebox, path):
    """sdpa_compare's torch mask arguments give the same attention as
    torch_ops' explicit math (CPU, float32)."""
    g = Graph.load(path, fusebox)
    op = g.ops[0]
    assert op["op"] == "sdpa_fwd" and not op["attrs"]["dropout"]
    lq, lkv, arrays = sdpa_compare.seq_lens(g, op, 5)
    gen = torch.Generator().manual_seed(3)
    kw, note = sdpa_compare.torch_mask_kwargs(g, op, lq, lkv, torch.float32, "cpu", gen)
    qkv = sdpa_compare.make_qkv(g, op, torch.float32, "cpu", torch.Generator().manual_seed(4))
    k, v = sdpa_compare.paged_kv(qkv)  # paged: gathered through the shuffled tables
    Hq, Hk = qkv["q"].shape[1], k.shape[1]
    got = F.scaled_dot_product_attention(qkv["q"], k, v,
                                         **({"enable_gqa": True} if Hq != Hk else {}), **kw)
    ins = {r: t for r, t in qkv.items() if r != "max_seq_len_kv"}
    if lq is not None:
        ins["seq_len_q"] = torch.tensor(lq).reshape(-1, 1, 1, 1)
        ins["seq_len_kv"] = torch.tensor(lkv).reshape(-1, 1, 1, 1)
    if "bias" in op["inputs"]:
        # the bench draws its own bias: recover it from the additive mask (finite part)
        m = kw["attn_mask"]
        ins["bias"] = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    want = torch_ops.sdpa_forward(ins, op)["o"]
    care = torch.broadcast_to(torch_ops.sdpa_care_masks(op, ins, None)["o"], want.shape)
    err = (torch.where(care, got, 0.0) - torch.where(care, want, 0.0)).abs().max().item()
    assert err < 1e-5, (path, note, err)



def fake_fusebox_run(graph, factor=1.0):
    """Stands in for `fusebox run ... --save-outputs DIR`: writes the torch
    reference of the given inputs (times `factor`) as fusebox's outputs, and a
    keep-mask drawn here for dropout_mask outputs."""

    def run(fusebox, path, files, out_dir, timeout_s, verify=True):
        ins = {}
        for name, f in files.items():
            t = torch.from_numpy(np.load(f))
            ins[name] = t.to(torch.int64) if graph.dtype(name) in ("int32", "int64") else t.to(torch.float32)
        masks = {}
        for name in xc.dropout_mask_outputs(graph):
            p = next(op["attrs"]["dropout"] for op in graph.sdpa_ops() if op["outputs"].get("dropout_mask") == name)
            masks[name] = (torch.rand(graph.dims[name], generator=torch.Generator().manual_seed(5)) >= p).float()
        vals, _ = xc.torch_reference(graph, dict(ins, **masks), "cpu")
        for name in graph.outputs():
            y = masks[name] if name in masks else vals[name] * factor
            np.save(os.path.join(out_dir, f"{name}.npy"), y.numpy())
        report = {"ok": True, "verify": [{"tensor": n, "pass": True} for n in graph.outputs()]}
        return ["fusebox", "run", path], 0, "", report

    return run


SMALL = [p for p in default_graphs() if "/small/" in p]


@pytest.mark.parametrize("path", SMALL, ids=os.path.basename)
def test_crosscheck_check_graph_on_cpu(fusebox, path, monkeypatch):
    """crosscheck.check_graph end to end on the CPU, fusebox's run replaced by
    the torch reference itself: every small example passes, and fails once the
    outputs are off by 30%."""
    import types
    g = Graph.load(path, fusebox)
    args = types.SimpleNamespace(fusebox=fusebox, seed=1234, timeout=60, keep=False)
    monkeypatch.setattr(xc, "run_fusebox", fake_fusebox_run(g))
    r = xc.check_graph(path, args, "cpu")
    assert r["pass"] and "error" not in r, r
    if r.get("skipped"):
        assert xc.has_dropout(g), r
        return
    compared = [o["tensor"] for o in r["outputs"]]
    assert compared and set(compared) == set(g.outputs()) - set(xc.dropout_mask_outputs(g))
    for o in r["outputs"]:
        assert (o["tol_rel_l2"], o["tol_max_abs_rel"]) == g.tolerance(o["tensor"])
    monkeypatch.setattr(xc, "run_fusebox", fake_fusebox_run(g, factor=1.3))
    r = xc.check_graph(path, args, "cpu")
    assert not r["pass"] and not any(o["pass"] for o in r["outputs"]), r


@pytest.mark.parametrize("path", [p for p in SMALL if "sdpa" not in os.path.basename(p)], ids=os.path.basename)
def test_torch_compare_eager_fn(fusebox, path):
    """torch_compare's eager graph on the CPU: inputs with the graph's strides
    and dtypes, outputs matching the float32 reference within bf16 rounding."""
    from fusebox_tools.bench import torch_compare
    g = Graph.load(path, fusebox)
    (ins,) = torch_compare.make_input_sets(g, 1, "cpu")
    for name, t in ins.items():
        assert list(t.shape) == g.dims[name] and list(t.stride()) == g.strides(name), name
    outs = torch_compare.make_eager_fn(g)(ins)
    ref, _ = xc.torch_reference(g, {n: t.float() for n, t in ins.items()}, "cpu")
    for name, y in zip(g.outputs(), outs):
        assert list(y.shape) == g.dims[name], name
        m = xc.compare(y.float(), ref[name])
        assert m["rel_l2"] < 2e-2, (name, m)
