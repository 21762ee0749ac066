"""The references for docs/lm.md's language model (issue 33): the numpy model
(fusebox_tools.models.lm_numpy) on a tiny random config, through properties that a wrong forward
fails (causality, RoPE's relative positions and half layout, the GQA head mapping, the uniform
loss), the batching rule, the LR schedule and its gradients against finite differences; and,
where torch is importable, the plain-torch model (fusebox_tools.models.lm_torch) against it:
loss, gradients and optimizer steps in fp32, and its CLI. CPU only, a few seconds."""
import csv
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from fusebox_tools.core import safetensors_np
from fusebox_tools.models import lm_numpy as L

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
CFG = {"model": {"vocab": 37, "dim": 16, "layers": 2, "heads": 4, "kv_heads": 2, "head_dim": 4, "ffn_dim": 24,
                 "context": 8, "init_std": 0.3},
       "train": {"batch": 3, "accum": 2, "lr": 1e-2, "min_lr": 1e-3, "warmup": 2, "clip": 0.5, "val_batches": 2}}


def random_params(seed=0):
    """Init with a large std and norm gains away from 1, so every term matters."""
    m, _ = L.load_config(CFG)
    P = L.init_params(m, seed)
    rng = np.random.default_rng(seed + 100)
    for k in P:
        if P[k].ndim == 1:
            P[k] = (1 + 0.3 * rng.standard_normal(P[k].shape)).astype(np.float32)
    return m, P


def run_module(mod, *args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(ROOT, "python")] + ([os.environ["PYTHONPATH"]] if "PYTHONPATH" in os.environ else [])))
    return subprocess.run([sys.executable, "-m", mod, *map(str, args)], capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.fixture
def files(tmp_path):
    """A step-0 checkpoint of CFG (config in its metadata) and a data folder."""
    m, P = random_params()
    zeros = {k: np.zeros_like(v) for k, v in P.items()}
    ck = str(tmp_path / "init.safetensors")
    L.save_checkpoint(ck, P, zeros, zeros, 0, 0, CFG)
    rng = np.random.default_rng(7)
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "train.npy", rng.integers(0, 37, 8 * 20 + 5).astype("<u2"))
    np.save(data / "val.npy", rng.integers(0, 37, 8 * 7 + 1).astype("<u2"))
    with open(tmp_path / "cfg.json", "w") as f:
        json.dump(CFG, f)
    return {"ck": ck, "data": str(data), "cfg": str(tmp_path / "cfg.json"), "P": P, "m": m, "tmp": tmp_path}


def test_causal_a_later_token_changes_no_earlier_logit():
    m, P = random_params()
    ids = np.random.default_rng(1).integers(0, 37, (2, 8))
    base = L.forward(P, m, ids)
    for t in range(7):
        other = ids.copy()
        other[:, t + 1] = (other[:, t + 1] + 5) % 37
        out = L.forward(P, m, other)
        np.testing.assert_allclose(out[:, :t + 1], base[:, :t + 1], rtol=0, atol=1e-12)
        assert np.abs(out[:, t + 1] - base[:, t + 1]).max() > 1e-6  # and it does reach position t+1


def test_rope_dot_products_depend_on_the_position_difference_only():
    D, S = 8, 12
    cos, sin = L.rope_tables(S, D, 10000.0)
    rng = np.random.default_rng(2)
    q, k = rng.standard_normal(D), rng.standard_normal(D)
    qr = L.rope(np.broadcast_to(q, (1, S, 1, D)).copy(), cos, sin)[0, :, 0]
    kr = L.rope(np.broadcast_to(k, (1, S, 1, D)).copy(), cos, sin)[0, :, 0]
    for d in range(0, 5):
        dots = [qr[p + d] @ kr[p] for p in range(S - d)]
        np.testing.assert_allclose(dots, dots[0], rtol=1e-12, atol=1e-12)
    assert abs(qr[3] @ kr[0] - qr[1] @ kr[0]) > 1e-6  # it does depend on the difference
    # norm kept; position 0 unchanged
    np.testing.assert_allclose(np.linalg.norm(qr, axis=-1), np.linalg.norm(q), rtol=1e-12)
    np.testing.assert_allclose(qr[0], q, atol=1e-15)


def test_rope_half_layout_pairs_i_with_i_plus_half():
    D, theta = 8, 10000.0
    cos, sin = L.rope_tables(4, D, theta)
    x = np.zeros((1, 4, 1, D))
    x[0, :, 0, 1] = 1.0  # pair i=1: x1 = x[1], x2 = x[5]
    y = L.rope(x, cos, sin)[0, 3, 0]
    ang = 3 * theta ** (-2 * 1 / D)
    expect = np.zeros(D)
    expect[1], expect[5] = math.cos(ang), math.sin(ang)  # y1 = x1 cos, y2 = x1 sin
    np.testing.assert_allclose(y, expect, atol=1e-15)
    back = L.rope(L.rope(x, cos, sin), cos, sin, inverse=True)
    np.testing.assert_allclose(back, x, atol=1e-15)


def test_gqa_query_head_j_reads_kv_head_j_div_group():
    rng = np.random.default_rng(3)
    B, S, H, KV, D = 2, 5, 6, 2, 4
    q, k, v = rng.standard_normal((B, S, H, D)), rng.standard_normal((B, S, KV, D)), rng.standard_normal((B, S, KV, D))
    o = L.attention(q, k, v)[0]
    for j in range(H):
        kv = j // (H // KV)
        sc = np.einsum("bsd,btd->bst", q[:, :, j], k[:, :, kv]) / math.sqrt(D)
        sc = np.where(np.triu(np.ones((S, S), bool), 1), -np.inf, sc)
        p = np.exp(sc - sc.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        np.testing.assert_allclose(o[:, :, j], np.einsum("bst,btd->bsd", p, v[:, :, kv]), rtol=1e-12, atol=1e-12)
    o_mod = L.attention(q, k[:, :, [1, 0]], v[:, :, [1, 0]])[0]  # j % KV would not see this swap like this
    assert np.abs(o_mod[:, :, 0] - o[:, :, 0]).max() > 1e-6


def test_zero_output_weights_give_log_vocab():
    m, P = random_params()
    P["output"] = np.zeros_like(P["output"])
    ids = np.random.default_rng(4).integers(0, 37, (3, 8))
    assert L.loss(P, m, ids, np.roll(ids, 1, axis=1)) == pytest.approx(math.log(37), abs=1e-12)


def test_batching_rule():
    tokens = np.arange(50)
    # n_seq = (50 - 1) // 8 = 6; micro-batch 1 of 4 holds sequences 4..7 -> m = 4, 5, 0, 1
    ids, labels = L.micro_batch(tokens, 8, 4, 1)
    assert [int(r[0]) for r in ids] == [32, 40, 0, 8]
    np.testing.assert_array_equal(labels, ids + 1)
    assert ids.shape == (4, 8) and labels.max() == 48  # the last label used is token 48 (n - 2)
    ids, _ = L.micro_batch(np.arange(49), 8, 4, 1)  # 48 tokens after the first: still n_seq = 6
    assert [int(r[0]) for r in ids] == [32, 40, 0, 8]
    ids, _ = L.micro_batch(np.arange(48), 8, 4, 1)  # n_seq = 5: 4, 0, 1, 2
    assert [int(r[0]) for r in ids] == [32, 0, 8, 16]
    with pytest.raises(ValueError):
        L.micro_batch(np.arange(8), 8, 1, 0)


def test_lr_schedule():
    t = {"lr": 1e-3, "min_lr": 1e-4, "warmup": 10}
    assert L.lr_at(0, 110, t) == pytest.approx(1e-4)
    assert L.lr_at(4, 110, t) == pytest.approx(5e-4)
    assert L.lr_at(9, 110, t) == pytest.approx(1e-3)
    assert L.lr_at(10, 110, t) == pytest.approx(1e-3)  # cosine starts at lr
    assert L.lr_at(60, 110, t) == pytest.approx(5.5e-4)  # midpoint: (lr + min_lr) / 2
    assert L.lr_at(35, 110, t) == pytest.approx(1e-4 + 9e-4 * (1 + math.cos(math.pi / 4)) / 2)
    assert L.lr_at(110, 110, t) == pytest.approx(1e-4)
    assert L.lr_at(500, 110, t) == pytest.approx(1e-4)  # past the end: min_lr
    assert L.lr_at(10, 10, t) == pytest.approx(1e-3)  # T == warmup: max(1, T - warmup)


def test_numpy_gradients_match_finite_differences():
    m, P = random_params()
    rng = np.random.default_rng(5)
    ids, labels = rng.integers(0, 37, (2, 8)), rng.integers(0, 37, (2, 8))
    value, G = L.loss_and_grads(P, m, ids, labels)
    assert value == pytest.approx(L.loss(P, m, ids, labels))
    _, G1 = L.loss_and_grads(P, m, ids, labels, rows=1)  # row chunks sum to the same
    for k in G:
        np.testing.assert_allclose(G1[k], G[k], rtol=1e-10, atol=1e-14)
    Pd = {k: v.astype(np.float64) for k, v in P.items()}
    for k, g in G.items():
        assert g.shape == P[k].shape
        for _ in range(3):
            idx = tuple(int(rng.integers(0, s)) for s in g.shape)
            if k == "tok_embeddings":
                idx = (int(ids[1, 3]), idx[1])  # a row that is used
            e = 1e-5
            plus, minus = dict(Pd), dict(Pd)
            plus[k], minus[k] = Pd[k].copy(), Pd[k].copy()
            plus[k][idx] += e
            minus[k][idx] -= e
            fd = (L.loss(plus, m, ids, labels, rows=2) - L.loss(minus, m, ids, labels, rows=2)) / (2 * e)
            assert g[idx] == pytest.approx(fd, rel=1e-5, abs=1e-9), (k, idx)


def test_bf16_rounding_is_nearest_even():
    a = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -7, -2.5, 0.0], np.float32)
    np.testing.assert_array_equal(L.round_bf16(a), [1.0, 1.0, 1 + 2 ** -6, 1 + 2 ** -7, -2.5, 0.0])


def test_safetensors_metadata_round_trip(tmp_path):
    p = str(tmp_path / "x.safetensors")
    safetensors_np.write(p, {"a": np.ones(3, np.float32)}, metadata={"step": 3, "config": '{"x": 1}'})
    assert safetensors_np.metadata(p) == {"step": "3", "config": '{"x": 1}'}
    safetensors_np.write(p, {"a": np.ones(3, np.float32)})
    assert safetensors_np.metadata(p) == {}


def test_numpy_cli_loss_train_and_checkpoint(files):
    p = run_module("fusebox_tools.models.lm_numpy", "loss", "--checkpoint", files["ck"], "--data",
                   os.path.join(files["data"], "train.npy"), "--batch-index", 2)
    assert p.returncode == 0, p.stderr
    ids, labels = L.micro_batch(np.load(os.path.join(files["data"], "train.npy")), 8, 3, 2)
    assert json.loads(p.stdout)["loss"] == pytest.approx(L.loss(files["P"], files["m"], ids, labels), rel=1e-12)
    p = run_module("fusebox_tools.models.lm_numpy", "loss", "--config", files["cfg"], "--checkpoint", files["ck"],
                   "--data", files["data"], "--batch-index", 2, "--bf16-weights")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["loss"] == pytest.approx(L.loss(files["P"], files["m"], ids, labels), rel=2e-2)
    out = files["tmp"] / "np"
    p = run_module("fusebox_tools.models.lm_numpy", "train", "--checkpoint", files["ck"], "--data", files["data"],
                   "--steps", 3, "--total-steps", 6, "--csv", f"{out}.csv", "--save", f"{out}.safetensors")
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    rows = list(csv.DictReader(open(f"{out}.csv")))
    assert [r["step"] for r in rows] == ["0", "1", "2"] and "val_loss" in summary
    assert float(rows[0]["lr"]) == pytest.approx(5e-3) and float(rows[2]["lr"]) == pytest.approx(1e-2)
    meta = safetensors_np.metadata(f"{out}.safetensors")
    assert meta["format"] == "fusebox-lm/1" and meta["step"] == "3" and meta["sequences"] == str(3 * 2 * 3)
    # resuming from step 3 gives the same steps 3..5 as one run of 6
    p = run_module("fusebox_tools.models.lm_numpy", "train", "--checkpoint", f"{out}.safetensors", "--data",
                   files["data"], "--steps", 3, "--total-steps", 6, "--csv", f"{out}_b.csv")
    assert p.returncode == 0, p.stderr
    m, t = L.load_config(CFG)
    _, _, _, whole = L.train(files["P"], m, t, np.load(os.path.join(files["data"], "train.npy")), 6)
    resumed = [float(r["loss"]) for r in csv.DictReader(open(f"{out}_b.csv"))]
    np.testing.assert_allclose(resumed, [r[1] for r in whole[3:]], rtol=1e-5)


# ---------------------------------------------------------------- torch, where importable

def _torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        pytest.skip("torch is not installed: the plain-torch reference (lm_torch) is not checked here")
    from fusebox_tools.models import lm_torch
    return lm_torch


def test_torch_loss_and_gradients_equal_numpy_in_fp32(files):
    T = _torch()
    import torch
    ids, labels = L.micro_batch(np.load(os.path.join(files["data"], "train.npy")), 8, 3, 1)
    want, G = L.loss_and_grads(files["P"], files["m"], ids, labels)
    for gqa in ("repeat", "enable_gqa") if T._has_enable_gqa() else ("repeat",):
        model = T.load(CFG, files["ck"], "cpu", gqa)
        assert sorted(n for n, _ in model.named_parameters()) == sorted(L.param_shapes(files["m"]))
        got = model(torch.from_numpy(ids), torch.from_numpy(labels))
        got.backward()
        assert got.item() == pytest.approx(want, rel=1e-4)
        for n, p in model.named_parameters():
            rel = np.linalg.norm(p.grad.numpy() - G[n]) / np.linalg.norm(G[n])
            assert rel < 1e-4, (gqa, n, rel)
    assert T.count_params(files["m"]) == sum(p.numel() for p in model.parameters())
    assert T.flops_per_token(files["m"]) == 6 * (T.count_params(files["m"]) - 37 * 16) + 6 * 2 * 8 * 16


def test_torch_schedule_and_batching_equal_numpy(files):
    T = _torch()
    t = {"lr": 1e-3, "min_lr": 1e-4, "warmup": 10}
    for s in (0, 5, 9, 10, 37, 60, 109, 110, 200):
        assert T.learning_rate(s, 110, t) == pytest.approx(L.lr_at(s, 110, t), rel=1e-12)
    path = os.path.join(files["data"], "train.npy")
    tok = T.Tokens(path, 8)
    for k in range(9):
        i, l = tok.micro_batch(k, 3)
        ni, nl = L.micro_batch(np.load(path), 8, 3, k)
        np.testing.assert_array_equal(i.numpy(), ni)
        np.testing.assert_array_equal(l.numpy(), nl)


def test_torch_adamw_steps_equal_numpy(files):
    """accum 2, clipping active (clip 0.5), warmup then cosine, weight decay on 2-D only."""
    T = _torch()
    m, t = L.load_config(CFG)
    tokens = np.load(os.path.join(files["data"], "train.npy"))
    P, _, seq, rows = L.train(files["P"], m, t, tokens, 4, total=5)
    assert any(r[3] > t["clip"] for r in rows)  # clipping engaged
    model = T.load(CFG, files["ck"], "cpu")
    opt = T.make_optimizer(model, T.config(CFG)[1], fused=False)
    trows, tseq = T.train_steps(model, opt, T.Tokens(os.path.join(files["data"], "train.npy"), 8), m, t, 0, 4, 5,
                                0, "cpu", "fp32")
    assert tseq == seq == 4 * 2 * 3
    for a, b in zip(trows, rows):
        assert a[0] == b[0] and a[2] == pytest.approx(b[2], rel=1e-12)
        assert a[1] == pytest.approx(b[1], rel=1e-4) and a[3] == pytest.approx(b[3], rel=1e-4)
    for n, p in model.named_parameters():
        np.testing.assert_allclose(p.detach().numpy(), P[n], rtol=1e-3, atol=1e-5, err_msg=n)


def _cli(capsys, main, *args):
    capsys.readouterr()
    code = main([str(a) for a in args])
    return code, capsys.readouterr().out


def test_compare_grads_and_losses_need_numpy_only(files, capsys):
    """lm_torch's compare-grads and compare-losses on numpy outputs: they run where torch is missing."""
    from fusebox_tools.models import lm_torch as T
    tmp = files["tmp"]
    ng = str(tmp / "ng.safetensors")
    assert _cli(capsys, L.main, "grads", "--checkpoint", files["ck"], "--data", files["data"], "--out", ng)[0] == 0
    code, out = _cli(capsys, T.main, "compare-grads", ng, ng)
    assert code == 0 and "PASS" in out and "grad.layers.1.wq" in out, out
    g = {k: safetensors_np.read(ng, k) for k in safetensors_np.keys(ng)}
    assert sorted(g) == sorted("grad." + k for k in L.param_shapes(files["m"]))
    # 4% off in one tensor fails; 2% passes; a 4% loss difference fails; a missing tensor fails
    for scale, loss_scale, ok in ((1.04, 1.0, False), (1.02, 1.0, True), (1.0, 1.04, False)):
        bad = dict(g, **{"grad.layers.0.wk": g["grad.layers.0.wk"] * scale})
        meta = safetensors_np.metadata(ng)
        meta["loss"] = repr(float(meta["loss"]) * loss_scale)
        safetensors_np.write(str(tmp / "bad.safetensors"), bad, metadata=meta)
        code, out = _cli(capsys, T.main, "compare-grads", tmp / "bad.safetensors", ng)
        assert (code == 0) == ok, out
        if scale != 1.0 and not ok:
            assert "FAIL" in [ln for ln in out.splitlines() if ln.startswith("grad.layers.0.wk")][0]
    del bad["grad.norm"]
    safetensors_np.write(str(tmp / "bad.safetensors"), bad, metadata=safetensors_np.metadata(ng))
    code, out = _cli(capsys, T.main, "compare-grads", tmp / "bad.safetensors", ng)
    assert code == 1 and "missing" in out
    # losses
    with open(tmp / "a.csv", "w") as f:
        f.write("step,loss,lr,grad_norm\n" + "".join(f"{s},{5 - s * 0.01},1e-3,1.0\n" for s in range(300)))
    with open(tmp / "b.csv", "w") as f:
        f.write("step,loss,lr,grad_norm\n" + "".join(f"{s},{5 - s * 0.01 + (0.01 if s >= 200 else 0.5)},1e-3,1\n"
                                                     for s in range(301)))
    code, out = _cli(capsys, T.main, "compare-losses", tmp / "a.csv", tmp / "b.csv", "--last", 100)
    res = json.loads(out)
    assert code == 0 and res["steps_compared"] == 100 and res["from_step"] == 200
    assert res["mean_abs_diff"] == pytest.approx(0.01) and res["only_in_b"] == 1
    # (100 * 0.01 + 10 * 0.5) / 110
    code, out = _cli(capsys, T.main, "compare-losses", tmp / "a.csv", tmp / "b.csv", "--last", 110)
    assert code == 1 and json.loads(out)["mean_abs_diff"] > 0.02


def test_bench_table_reports_failed_modes():
    from fusebox_tools.models import lm_torch as T
    rows = T.markdown_rows({"modes": [
        {"mode": "eager", "status": "ok", "tokens_per_s": 123456.0, "ms_per_step": 265.4, "mfu": 0.41,
         "peak_mem_gib": 30.5, "compile_s": 0.2, "step0_loss": 9.71},
        {"mode": "reduce-overhead", "status": "failed", "error": "step-0 loss 9.9 vs eager 9.71 | x",
         "step0_loss": 9.9}]}).splitlines()
    assert rows[2] == "| eager | ok | 123,456 | 265.40 | 41.0% | 30.50 | 0.2 | 9.7100 |"
    assert rows[3].startswith("| reduce-overhead | failed: step-0 loss 9.9 vs eager 9.71 / x |")
    m, _ = L.load_config(CFG)
    n = sum(int(np.prod(s)) for s in L.param_shapes(m).values())
    assert T.count_params(m) == n
    assert T.flops_per_token(m) == 6 * (n - 37 * 16) + 6 * 2 * 8 * 16


def test_torch_cli_grads_train_resume_and_bench_message(files, capsys):
    """In process (importing torch in each subprocess would take seconds)."""
    T = _torch()
    tmp = files["tmp"]
    tg, ng = str(tmp / "tg.safetensors"), str(tmp / "ng.safetensors")
    assert _cli(capsys, T.main, "grads", "--checkpoint", files["ck"], "--data", files["data"], "--out", tg)[0] == 0
    assert _cli(capsys, L.main, "grads", "--checkpoint", files["ck"], "--data", files["data"], "--out", ng)[0] == 0
    code, out = _cli(capsys, T.main, "compare-grads", tg, ng, "--tol-grad", 1e-4, "--tol-loss", 1e-5)
    assert code == 0, out
    # 6 steps in one run == 3 steps, a checkpoint, 3 more (optimizer state and data position resumed)
    code, out = _cli(capsys, T.main, "train", "--checkpoint", files["ck"], "--data", files["data"], "--steps", 6,
                     "--csv", tmp / "t6.csv")
    assert code == 0 and "val_loss" in json.loads(out.splitlines()[-1])
    code, out = _cli(capsys, T.main, "train", "--checkpoint", files["ck"], "--data", files["data"], "--steps", 3,
                     "--total-steps", 6, "--csv", tmp / "t3.csv", "--save", tmp / "t3.safetensors")
    assert code == 0
    meta = safetensors_np.metadata(str(tmp / "t3.safetensors"))
    assert meta["step"] == "3" and meta["sequences"] == str(3 * 2 * 3) and meta["format"] == "fusebox-lm/1"
    code, out = _cli(capsys, T.main, "train", "--checkpoint", tmp / "t3.safetensors", "--data", files["data"],
                     "--steps", 3, "--total-steps", 6, "--csv", tmp / "t3b.csv")
    assert code == 0 and json.loads(out.splitlines()[-1])["resumed_optimizer"]
    whole = list(csv.DictReader(open(tmp / "t6.csv")))
    parts = list(csv.DictReader(open(tmp / "t3.csv"))) + list(csv.DictReader(open(tmp / "t3b.csv")))
    assert [r["step"] for r in parts] == [r["step"] for r in whole]
    for a, b in zip(parts, whole):
        assert float(a["loss"]) == pytest.approx(float(b["loss"]), rel=1e-5)
        assert float(a["lr"]) == pytest.approx(float(b["lr"]), rel=1e-6)
    # against numpy
    assert _cli(capsys, L.main, "train", "--checkpoint", files["ck"], "--data", files["data"], "--steps", 6,
                "--csv", tmp / "n6.csv")[0] == 0
    code, out = _cli(capsys, T.main, "compare-losses", tmp / "t6.csv", tmp / "n6.csv", "--last", 6)
    assert code == 0 and json.loads(out)["mean_abs_diff"] < 1e-4
    import torch
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="needs a CUDA device"):
            T.main(["bench", "--config", files["cfg"]])
