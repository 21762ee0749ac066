"""fusebox_tools.models.minilm (all-MiniLM-L6-v2 as a pipeline) without real weights,
network or GPU: the safetensors reader, the generated pipeline as `fusebox
pipeline check` reads it (random weights, tiny sizes), the numpy reference
against straightforward second implementations, and a numpy interpreter of
the generated pipeline (its wiring and views) against the reference."""
import json
import math
import os
import struct
import subprocess

import numpy as np
import pytest

from fusebox_tools.models import minilm as m
from fusebox_tools.models import minilm_embed as me
from fusebox_tools.crosscheck import pipeline_crosscheck as pc
from fusebox_tools.core.graph import Graph

TINY = m.check_config(dict(m.MINILM_CONFIG, layers=2, hidden=64, heads=2, ffn=128, vocab=50, max_pos=32))
B, S = 2, 16


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random tiny MiniLM converted into a folder, with its B=2, S=16 pipeline."""
    out = str(tmp_path_factory.mktemp("minilm"))
    p = m.random_params(TINY, seed=3)
    m.write_weights(p, TINY, out)
    path = m.write_pipeline(out, B, S)
    return out, path, p


def ids_and_lengths(rng, lengths, S, vocab):
    ids = np.zeros((len(lengths), S), dtype=np.int64)
    for b, n in enumerate(lengths):
        ids[b, :n] = rng.integers(1, vocab, n)
    return ids, np.array(lengths)


# ------------------------------------------------------------------ safetensors

def write_safetensors(path, tensors, header_extra=None):
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    header.update(header_extra or {})
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def test_safetensors_reader(tmp_path):
    a = np.arange(6, dtype="<f4").reshape(2, 3) - 2.5
    bf = (a.view(np.uint32) >> 16).astype("<u2")  # exact: these values have short mantissas
    path = str(tmp_path / "t.safetensors")
    write_safetensors(path, {"a": ("F32", [2, 3], a.tobytes()), "h": ("F16", [3], np.array([1, 2, 3], "<f2").tobytes()),
                             "b": ("BF16", [2, 3], bf.tobytes()), "i": ("I64", [1, 2], np.array([[7, 8]], "<i8").tobytes())})
    t = m.read_safetensors(path)
    assert sorted(t) == ["a", "b", "h", "i"]
    np.testing.assert_array_equal(t["a"], a)
    np.testing.assert_array_equal(t["b"], a)
    np.testing.assert_array_equal(t["h"], [1, 2, 3])
    assert t["i"].tolist() == [[7, 8]]


@pytest.mark.parametrize("case", ["short", "header_too_long", "not_json", "bad_offsets", "bad_dtype"])
def test_safetensors_refuses_broken_files(tmp_path, case):
    path = str(tmp_path / "bad.safetensors")
    raw = np.zeros(4, "<f4").tobytes()
    if case == "short":
        open(path, "wb").write(b"\x01\x02")
    elif case == "header_too_long":
        open(path, "wb").write(struct.pack("<Q", 1 << 40) + b"{}")
    elif case == "not_json":
        open(path, "wb").write(struct.pack("<Q", 3) + b"{{{")
    elif case == "bad_offsets":
        write_safetensors(path, {"a": ("F32", [4], raw)}, {"b": {"dtype": "F32", "shape": [4], "data_offsets": [0, 99]}})
    else:
        write_safetensors(path, {"a": ("Q7", [4], raw)})
    with pytest.raises(m.MiniLMError, match="bad.safetensors"):
        m.read_safetensors(path)


def test_params_from_hf_transposes_and_checks_shapes():
    rng = np.random.default_rng(0)
    H, F = TINY["hidden"], TINY["ffn"]
    hf = {"embeddings.word_embeddings.weight": rng.normal(size=(TINY["vocab"], H)),
          "embeddings.position_embeddings.weight": rng.normal(size=(TINY["max_pos"], H)),
          "embeddings.token_type_embeddings.weight": rng.normal(size=(2, H)),
          "embeddings.LayerNorm.weight": np.ones(H), "embeddings.LayerNorm.bias": np.zeros(H)}
    for l in range(TINY["layers"]):
        pre = f"encoder.layer.{l}."
        for n in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            hf[pre + n + ".weight"], hf[pre + n + ".bias"] = rng.normal(size=(H, H)), rng.normal(size=H)
        for n in ("attention.output.LayerNorm", "output.LayerNorm"):
            hf[pre + n + ".weight"], hf[pre + n + ".bias"] = np.ones(H), np.zeros(H)
        hf[pre + "intermediate.dense.weight"], hf[pre + "intermediate.dense.bias"] = rng.normal(size=(F, H)), np.zeros(F)
        hf[pre + "output.dense.weight"], hf[pre + "output.dense.bias"] = rng.normal(size=(H, F)), np.zeros(H)
    p = m.params_from_hf(hf, TINY)
    # torch's Linear computes x @ W^T: the converted weight is W^T.
    np.testing.assert_array_equal(p["layers"][1]["wq"], hf["encoder.layer.1.attention.self.query.weight"].T.astype(np.float32))
    np.testing.assert_array_equal(p["layers"][0]["w2"], hf["encoder.layer.0.output.dense.weight"].T.astype(np.float32))
    hf["encoder.layer.1.output.dense.weight"] = rng.normal(size=(F, H))
    with pytest.raises(m.MiniLMError, match=r"'encoder.layer.1.output.dense.weight' has shape \[128, 64\]"):
        m.params_from_hf(hf, TINY)
    del hf["embeddings.LayerNorm.bias"]
    with pytest.raises(m.MiniLMError, match="missing"):
        m.params_from_hf(hf, TINY)


def test_round_bf16_and_f16_storage():
    x = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -7 + 2 ** -8 + 2 ** -10, -3.14159, 1e-20, np.inf], np.float32)
    r = m.round_bf16(x)
    # ties to even: 1 + 2^-8 -> 1, 1 + 3*2^-8 -> 1 + 2^-6; above the tie rounds up.
    assert r[:4].tolist() == [1.0, 1.0, 1 + 2 ** -6, 1 + 2 ** -6]
    assert r[4] == np.float32(-3.140625) and r[6] == np.inf
    assert (r.view(np.uint32) & 0xFFFF).max() == 0
    # bf16 values with |v| >= 2^-17 are exact in float16 (how the weights are stored).
    v = m.round_bf16(np.random.default_rng(1).normal(0, 0.05, 100000).astype(np.float32))
    big = np.abs(v) >= 2 ** -17
    np.testing.assert_array_equal(m.f16_exact(v)[big], v[big])


def test_config_is_checked():
    with pytest.raises(m.MiniLMError, match="head dim 12"):
        m.check_config(dict(TINY, hidden=24, heads=2))
    with pytest.raises(m.MiniLMError, match="not a multiple"):
        m.check_config(dict(TINY, hidden=65))
    with pytest.raises(m.MiniLMError, match="batch 0"):
        m.write_pipeline("/nonexistent", 0, 16, TINY)


# ------------------------------------------------------------------ the generated pipeline

def test_pipeline_check(fusebox, tiny):
    out, path, _ = tiny
    proc = subprocess.run([fusebox, "pipeline", "check", path, "--json"], capture_output=True, text=True,
                          timeout=120)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0 and doc["ok"], proc.stderr
    stages = [s["name"] for s in doc["stages"]]
    assert len(stages) == m.stage_count(TINY) == 21
    assert stages[:12] == ["embed", "emb_ln", "q0", "k0", "v0", "attn0", "out0", "ln1_0", "up0", "down0", "ln2_0",
                           "q1"]
    assert stages[-1] == "pool"
    # The layers share 7 graph files; the embedding lookup has its own.
    assert len({s["graph_file"] for s in doc["stages"]}) == 8
    bufs = {b["name"]: b for b in doc["buffers"]}
    N, H = B * S, TINY["hidden"]
    # The embed stage (fusebox's own kernel) reads the ids and the position + type rows, writes emb.
    assert bufs["ids"] == dict(bufs["ids"], kind="input", dtype="int32", dims=[N, 1, 1, 1])
    assert bufs["pos_type"]["dims"] == [S, H, 1, 1] and bufs["pos_type"]["kind"] == "input"
    assert bufs["word_emb"]["kind"] == "constant" and bufs["word_emb"]["dims"] == [TINY["vocab"], H, 1, 1]
    assert bufs["emb"]["dims"] == [N, H, 1, 1] and bufs["emb"]["kind"] == "intermediate"
    assert bufs["seq_len_kv"]["dims"] == [B, 1, 1, 1] and bufs["seq_len_kv"]["dtype"] == "int32"
    assert bufs["pool_mask"]["dims"] == [1, B, N]
    # Views: q written [1, N, H] by its GEMM, read [B, heads, S, d] bshd by the attention.
    assert bufs["q0"]["reshape"] and bufs["q0"]["dims"] == [1, N, H]
    assert [r["stage"] for r in bufs["q0"]["readers"]] == ["attn0"]
    assert bufs["h1"]["dims"] == [N, H, 1, 1] and bufs["h1"]["strides"] == [H, 1, H, H]
    assert bufs["ffn0"]["dims"] == [1, N, TINY["ffn"]] and not bufs["ffn0"]["reshape"]
    assert bufs["pooled_sum"] == dict(bufs["pooled_sum"], kind="output", dtype="fp32", dims=[1, B, H])
    assert bufs["l1_w1"]["file"] == "weights/l1_w1.npy" and bufs["l1_w1"]["dims"] == [1, H, TINY["ffn"]]
    attn = Graph.load(os.path.join(out, doc["stages"][5]["graph_file"]), fusebox)
    assert attn.dims["q"] == [B, TINY["heads"], S, 32] and attn.strides("q") == [S * H, 32, H, 1]
    assert attn.ops[0]["attrs"]["padding"] and attn.ops[0]["attrs"]["attn_scale"] == 1 / math.sqrt(32)


def test_pipeline_without_reshape_is_refused(fusebox, tiny, tmp_path):
    """The views are what the format's "reshape" flag allows; without it fusebox says so."""
    out, path, _ = tiny
    doc = json.load(open(path))
    del doc["buffers"]["q0"]["reshape"]
    bad = os.path.join(out, "no_reshape.json")
    json.dump(doc, open(bad, "w"))
    proc = subprocess.run([fusebox, "pipeline", "check", bad], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "stage 'attn0': graph tensor 'q'" in proc.stderr and '"reshape": true' in proc.stderr


def test_graphs_pass_cudnn_operation_graph_deviceless(fusebox, tiny, repo_root):
    """No stage builds without a GPU (matmul, layernorm and sdpa engines are
    runtime-compiled in cuDNN 9.19), but cuDNN's frontend validates every graph
    and builds its operation graph for the H200 here: the shapes, layouts and
    attributes are ones cuDNN takes; only engine creation needs the driver."""
    out, _, _ = tiny
    devprop = os.path.join(repo_root, "devices", "h200-cudnn-9.27.devprop")
    folder = os.path.join(out, f"graphs/b{B}_s{S}")
    for name in sorted(os.listdir(folder)):
        proc = subprocess.run([fusebox, "build", os.path.join(folder, name), "--device", devprop, "--no-cache",
                               "--json"], capture_output=True, text=True, timeout=120)
        doc = json.loads(proc.stdout)
        steps = {st["name"]: st["ok"] for st in doc.get("steps", [])}
        if name == "embed.json":  # fusebox's own kernel: no cuDNN steps, built deviceless too
            assert doc["ok"] and doc["engine"] == "fusebox_embedding" and list(steps) == ["validate"], doc
            continue
        assert steps.get("validate") and steps.get("build_operation_graph"), (name, doc)
        # Where a build does stop deviceless, it is at engine creation or the support check (no driver:
        # the runtime-compiled engines are left out), with exit 1 (NotSupported).
        assert doc["ok"] or (proc.returncode == 1 and (steps.get("create_execution_plans") is False
                                                       or steps.get("check_support") is False)), (name, doc)


def test_weights_files(tiny):
    out, _, p = tiny
    q, cfg = m.load_converted(out)
    assert cfg == TINY
    w = np.load(os.path.join(out, "weights", "l0_wq.npy"))
    assert w.dtype == np.float16 and w.shape == (1, 64, 64)
    np.testing.assert_array_equal(q["layers"][0]["wq"], m.f16_exact(m.round_bf16(p["layers"][0]["wq"])))
    # bf16 values (cuDNN's fast LayerNorm engines need a bf16 gain and bias), stored as float32
    np.testing.assert_array_equal(q["layers"][1]["ln2_g"], m.round_bf16(p["layers"][1]["ln2_g"]))
    assert not np.array_equal(p["layers"][1]["ln2_g"], m.round_bf16(p["layers"][1]["ln2_g"]))
    assert np.load(os.path.join(out, "weights", "l0_ln1_g.npy")).dtype == np.float32


# ------------------------------------------------------------------ the numpy reference

def test_attention_padding_matches_unpadded():
    rng = np.random.default_rng(2)
    q, k, v = (rng.normal(size=(3, 2, 12, 8)).astype(np.float32) for _ in range(3))
    lengths = [12, 5, 1]
    o = m.attention(q, k, v, lengths)
    for b, n in enumerate(lengths):
        # Per sequence, unpadded: only its n keys exist. Every query row (padded ones too) sees them.
        s = q[b].astype(np.float64) @ k[b, :, :n].astype(np.float64).transpose(0, 2, 1) / math.sqrt(8)
        p = np.exp(s - s.max(-1, keepdims=True))
        want = (p / p.sum(-1, keepdims=True)) @ v[b, :, :n]
        np.testing.assert_allclose(o[b], want, rtol=1e-5, atol=1e-6)


def loop_layer(x, L, cfg, n):
    """One BERT layer on one unpadded sequence x [n, H], token by token and head by head."""
    H, nh = cfg["hidden"], cfg["heads"]
    d = H // nh
    x = x.astype(np.float64)

    def ln(v, g, b):
        mu = sum(v) / len(v)
        var = sum((t - mu) ** 2 for t in v) / len(v)
        return np.array([(t - mu) / math.sqrt(var + cfg["eps"]) * gg + bb for t, gg, bb in zip(v, g, b)])

    q = [x[i] @ L["wq"] + L["bq"] for i in range(n)]
    k = [x[i] @ L["wk"] + L["bk"] for i in range(n)]
    v = [x[i] @ L["wv"] + L["bv"] for i in range(n)]
    out = []
    for i in range(n):
        ctx = np.zeros(H)
        for h in range(nh):
            sl = slice(h * d, (h + 1) * d)
            scores = [float(q[i][sl] @ k[j][sl]) / math.sqrt(d) for j in range(n)]
            mx = max(scores)
            e = [math.exp(s - mx) for s in scores]
            ctx[sl] = sum(e[j] / sum(e) * v[j][sl] for j in range(n))
        a = ln(ctx @ L["wo"] + L["bo"] + x[i], L["ln1_g"], L["ln1_b"])
        f = a @ L["w1"] + L["b1"]
        f = np.array([0.5 * t * (1 + math.erf(t / math.sqrt(2))) for t in f])
        out.append(ln(f @ L["w2"] + L["b2"] + a, L["ln2_g"], L["ln2_b"]))
    return np.array(out)


def test_reference_layer_matches_a_loop_implementation():
    cfg = m.check_config(dict(TINY, hidden=32, heads=2, ffn=48, layers=1))
    p = m.random_params(cfg, seed=5)
    rng = np.random.default_rng(6)
    x = rng.normal(size=(2, 7, 32)).astype(np.float32)
    lengths = [7, 3]
    y = m.encoder_layer(x, p["layers"][0], cfg, lengths)
    for b, n in enumerate(lengths):
        np.testing.assert_allclose(y[b, :n], loop_layer(x[b, :n], p["layers"][0], cfg, n), rtol=1e-4, atol=1e-4)


def test_reference_model_padding_invariance():
    """Padded batch == each sequence alone, unpadded (embeddings and real tokens' states)."""
    p = m.random_params(TINY, seed=7)
    rng = np.random.default_rng(8)
    ids, lengths = ids_and_lengths(rng, [5, 16, 1], 16, TINY["vocab"])
    emb, hidden, _ = m.reference(p, TINY, ids, lengths, 16)
    assert emb.shape == (3, 64)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-6)
    for b, n in enumerate(lengths):
        e1, h1, _ = m.reference(p, TINY, ids[b:b + 1, :n], lengths[b:b + 1], int(n))
        np.testing.assert_allclose(emb[b], e1[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(hidden[b, :n], h1[0], rtol=1e-4, atol=1e-5)


def test_erf_accuracy():
    x = np.linspace(-6, 6, 2001)
    assert np.abs(m.erf(x) - np.array([math.erf(t) for t in x])).max() < 2e-7


def test_pipeline_inputs_and_finish():
    p = m.random_params(TINY, seed=9)
    ids, lengths = ids_and_lengths(np.random.default_rng(10), [3, 16], 16, TINY["vocab"])
    ins = m.pipeline_inputs(p, ids, lengths, 16)
    assert ins["ids"].shape == (32, 1, 1, 1) and ins["ids"].dtype == np.int32
    assert ins["ids"].ravel().tolist() == np.asarray(ids).ravel().tolist()
    assert ins["pos_type"].shape == (16, 64, 1, 1)
    # The embed stage's lookup is the reference's embedding sum.
    emb = m.lookup(p, ins["ids"], ins["pos_type"].reshape(16, 64))
    np.testing.assert_allclose(emb.reshape(2, 16, 64), m.embed(p, ids, lengths, 16), rtol=1e-6, atol=1e-6)
    assert ins["seq_len_q"].ravel().tolist() == [16, 16] and ins["seq_len_kv"].ravel().tolist() == [3, 16]
    assert ins["pool_mask"].sum() == 19 and ins["pool_mask"][0, 0, :3].tolist() == [1, 1, 1]
    assert ins["pool_mask"][0, 1, :16].sum() == 0
    _, hidden, pooled = m.reference(p, TINY, ids, lengths, 16)
    # The pool stage's GEMM in numpy: mask [1, B, N] @ h [1, N, H].
    np.testing.assert_allclose(ins["pool_mask"][0] @ hidden.reshape(32, 64), pooled, rtol=1e-5, atol=1e-5)
    with pytest.raises(m.MiniLMError, match="lengths"):
        m.pipeline_inputs(p, ids, [0, 16], 16)


# ------------------------------------------------------------------ the pipeline, interpreted in numpy

def run_op(op, vals, g):
    ins = {r: vals[t] for r, t in op["inputs"].items()}
    kind = op["op"]
    if kind == "matmul":
        return ins["a"] @ ins["b"]
    if kind in ("bias_add", "add"):
        a, b = (ins["x"], ins["bias"]) if kind == "bias_add" else (ins["a"], ins["b"])
        return a + b
    if kind == "gelu_erf":
        return 0.5 * ins["x"] * (1 + m.erf(ins["x"] / math.sqrt(2)))
    if kind == "layernorm":
        x = ins["x"]  # [N, H, 1, 1]: rows over dim 0
        axes = tuple(range(1, x.ndim))
        mu = x.mean(axes, keepdims=True)
        var = ((x - mu) ** 2).mean(axes, keepdims=True)
        return (x - mu) / np.sqrt(var + op["attrs"]["epsilon"]) * ins["scale"] + ins["bias"]
    if kind == "embedding":  # fusebox's own kernel: word rows plus the repeating position + type rows
        p = ins["add"].shape[0]
        rows = ins["table"].reshape(ins["table"].shape[0], -1)[ins["ids"].reshape(-1).astype(np.int64)]
        return (rows + np.tile(ins["add"].reshape(p, -1), (rows.shape[0] // p, 1))).reshape(rows.shape[0], -1, 1, 1)
    if kind == "sdpa_fwd":
        assert op["attrs"]["padding"] and ins["seq_len_q"].ravel().tolist() == [ins["q"].shape[2]] * len(ins["q"])
        return m.attention(ins["q"], ins["k"], ins["v"], ins["seq_len_kv"].ravel()).astype(np.float64)
    raise AssertionError(f"unexpected op {kind}")


@pytest.mark.parametrize("shape,fused", [(None, False), ((2, 16), False), ((3, 8), False), (None, True), ((3, 8), True)],
                         ids=["static", "symbolic_b2_s16", "symbolic_b3_s8", "static_fqkv", "symbolic_b3_s8_fqkv"])
def test_pipeline_interpreted_in_numpy_matches_the_reference(fusebox, tiny, shape, fused):
    """Each stage's graph (as `fusebox check --json` resolves it) run op by op in
    float64 on its buffers seen through its own views: the wiring (which weight,
    which residual, which view) gives the reference model's output. The same for the
    symbolic pipeline (minilm.json) at two shapes given with --shape."""
    out, path, _ = tiny
    B, S, at = 2, 16, None
    if fused:
        path = m.write_pipeline(out, B, S, fused_qkv=True)
    if shape:
        B, S = shape
        path = m.write_dynamic_pipeline(out, max_batch=4, fused_qkv=fused)
        at = m.dynamic_shape_args(B, S)[1]
    pl = pc.Pipeline.load(path, fusebox, shape=at)
    graphs = {}
    for st in pl.stages:
        if st["graph_file"] not in graphs:
            graphs[st["graph_file"]] = Graph.load(pl.graph_path(st), fusebox, shape=pc.graph_shape(pl.graph_path(st), at))
    p, cfg = m.load_converted(out)
    ids, lengths = ids_and_lengths(np.random.default_rng(11), [9, S, 5][:B] if S >= 9 else [S, 3, 1][:B], S,
                                   cfg["vocab"])
    values = {n: np.load(f).astype(np.float64) for n, f in pl.constant_files().items()}
    values.update({k: v.astype(np.float64) for k, v in m.pipeline_inputs(p, ids, lengths, S).items()})
    for st in pl.stages:
        g = graphs[st["graph_file"]]
        vals = {t: pc.to_tensor_view(pl, g, t, buf, pc.buffer_value(pl, values, buf)) for t, buf in st["bind"].items()
                if t in g.inputs()}
        for op in g.ops:
            vals[op["outputs"][op["primary_output"]]] = run_op(op, vals, g)
        for t, buf in st["bind"].items():
            if t in g.outputs():
                values[buf] = pc.to_buffer_view(pl, g, t, buf, vals[t])
    # Every file `pipeline run` reads has its buffer's shape (what the loader checks before the GPU work).
    for name, f in pl.constant_files().items():
        assert list(np.load(f).shape) == pl.buffers[name]["dims"], name
    for name, arr in m.pipeline_inputs(p, ids, lengths, S).items():
        assert list(arr.shape) == pl.buffers[name]["dims"], name
        assert (arr.dtype.kind == "i") == (pl.buffers[name]["dtype"] == "int32"), name
    if fused:  # one Q/K/V stage a layer, its parts read as views
        assert len(pl.stages) == 3 + 7 * cfg["layers"]
        assert pl.buffers["k1"]["view"]["of"] == "qkv1" and pl.buffers["k1"]["view"]["part"] == 1
    emb = m.finish(values["pooled_sum"], lengths)
    ref, hidden, pooled = m.reference(p, cfg, ids, lengths, S)
    np.testing.assert_allclose(values["pooled_sum"].reshape(B, -1), pooled, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(emb, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(values[f"h{cfg['layers']}"].reshape(B, S, -1), hidden, rtol=1e-4, atol=1e-4)


def test_symbolic_pipeline_checks_every_shape_and_refuses_bad_ones(fusebox, tiny):
    """minilm.json: one file for every (B, S); `pipeline check --shape` resolves it; N other than
    B*S breaks the reshape views (named), a batch beyond the range is refused naming the symbol."""
    out, _, _ = tiny
    path = m.write_dynamic_pipeline(out, max_batch=4)
    H = TINY["hidden"]
    for B, S in ((1, 1), (2, 16), (4, 32), (3, 7)):
        proc = subprocess.run([fusebox, "pipeline", "check", path, "--json", *m.dynamic_shape_args(B, S)],
                              capture_output=True, text=True, timeout=120)
        doc = json.loads(proc.stdout)
        assert proc.returncode == 0 and doc["ok"], proc.stderr
        bufs = {b["name"]: b for b in doc["buffers"]}
        assert bufs["emb"]["dims"] == [B * S, H, 1, 1] and bufs["pooled_sum"]["dims"] == [1, B, H]
        assert bufs["ids"]["dims"] == [B * S, 1, 1, 1] and bufs["pos_type"]["dims"] == [S, H, 1, 1]
        assert bufs["seq_len_q"]["dims"] == [B, 1, 1, 1] and bufs["pool_mask"]["dims"] == [1, B, B * S]
    with open(os.path.join(out, "graphs", "dyn", "attn.json")) as f:
        attn = json.load(f)
    assert attn["symbols"]["S"]["max"] == TINY["max_pos"] and "values" not in attn["tensors"][3]
    bad = subprocess.run([fusebox, "pipeline", "check", path, "--shape", "B=2,S=16,N=48"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and '"reshape" buffer' in bad.stderr, bad.stderr
    # N not a multiple of S: the embed stage cannot repeat the position rows (named first)
    odd = subprocess.run([fusebox, "pipeline", "check", path, "--shape", "B=2,S=16,N=33"], capture_output=True,
                         text=True, timeout=120)
    assert odd.returncode == 2 and "stage 'embed'" in odd.stderr and "do not divide the 33 ids" in odd.stderr, odd.stderr
    big = subprocess.run([fusebox, "pipeline", "check", path, *m.dynamic_shape_args(5, 8)], capture_output=True,
                         text=True, timeout=120)
    assert big.returncode == 2 and "symbol 'B'" in big.stderr and "[1, 4]" in big.stderr, big.stderr
    long = subprocess.run([fusebox, "pipeline", "check", path, *m.dynamic_shape_args(1, TINY["max_pos"] + 1)],
                          capture_output=True, text=True, timeout=120)
    assert long.returncode == 2 and "symbol 'S'" in long.stderr, long.stderr


def test_reinterpret_is_a_transpose_view():
    x = np.arange(12.0).reshape(1, 3, 4)  # row-major [1, 3, 4]
    y = pc.reinterpret(x, [1, 3, 4], [12, 4, 1], [1, 4, 3], [12, 1, 4])  # the same memory, column-major [1, 4, 3]
    np.testing.assert_array_equal(y[0], x[0].T)
    # bshd: [B*S, heads*d] row-major seen as [B, heads, S, d].
    z = np.arange(2 * 3 * 4.0).reshape(1, 6, 4)
    v = pc.reinterpret(z, [1, 6, 4], [24, 4, 1], [2, 2, 3, 2], [12, 2, 4, 1])
    np.testing.assert_array_equal(v, z.reshape(2, 3, 2, 2).transpose(0, 2, 1, 3))
    assert pc.reinterpret(x, [1, 3, 4], [12, 4, 1], [1, 3, 4], [12, 4, 1]) is x


def test_compare_embeddings():
    a = np.eye(3, 8)
    r = me.compare_embeddings("x", a, a + 1e-4, [1, 2, 3])
    assert r["pass"] and r["min_cos"] > 0.9999
    r = me.compare_embeddings("x", a, np.roll(a, 1, axis=1), [1, 2, 3])
    assert not r["pass"]


def test_tokenize_when_tokenizers_is_installed(tmp_path):
    tokenizers = pytest.importorskip("tokenizers", reason="tokenizers not installed (scripts/fetch_minilm.sh)")
    from tokenizers import models, pre_tokenizers, processors

    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "a": 4, "man": 5, "eats": 6}
    tok = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2),
                                                                                               ("[SEP]", 3)])
    path = str(tmp_path / "tokenizer.json")
    tok.save(path)
    ids, lengths = me.tokenize(path, ["a man eats", "a dog"], 8)
    assert ids.tolist() == [[2, 4, 5, 6, 3, 0, 0, 0], [2, 4, 1, 3, 0, 0, 0, 0]]
    assert lengths.tolist() == [5, 4]
    # longer than S: cut to S (the [SEP] included, as the tokenizer truncates), one warning per sentence
    warnings = []
    ids, lengths = me.tokenize(path, ["a man eats a man eats", "a man"], 5, warn=warnings.append)
    assert lengths.tolist() == [5, 4] and ids.shape == (2, 5)
    assert len(warnings) == 1 and "sentence 0 has 8 tokens; truncated to S=5" in warnings[0]
    with pytest.raises(ValueError, match="sentence 1 is empty"):
        me.tokenize(path, ["a man", "   "], 8)
    with pytest.raises(ValueError, match="exceeds the model's 512 positions"):
        me.tokenize(path, ["a man"], 1024)


def test_real_weights_reproduce_the_model_card(repo_root):
    """With the real weights (scripts/fetch_minilm.sh; absent in CI): the numpy
    reference gives sentence-transformers' README similarities."""
    hf = os.path.join(repo_root, "models", "minilm", "hf")
    if not os.path.isfile(os.path.join(hf, "model.safetensors")):
        pytest.skip("real weights not fetched (scripts/fetch_minilm.sh)")
    pytest.importorskip("tokenizers", reason="tokenizers not installed (scripts/fetch_minilm.sh)")
    p, cfg = m.load_hf(hf)
    ids, lengths = me.tokenize(os.path.join(hf, "tokenizer.json"), me.DEFAULT_SENTENCES[:3], 32)
    emb, _, _ = m.reference(p, cfg, ids, lengths, 32)
    c = m.cosine_matrix(emb)
    np.testing.assert_allclose([c[0, 1], c[0, 2], c[1, 2]], [0.6660, 0.1046, 0.1411], atol=6e-5)


def test_runner_refuses_a_batch_beyond_the_symbolic_range(tiny):
    """A batch larger than the symbolic pipeline's declared range is one clear error before any run
    (issue 14's bad input), naming the symbol and the range; within it, the --shape arguments."""
    out, _, _ = tiny
    m.write_dynamic_pipeline(out, max_batch=4)
    assert m.dynamic_range(out) == {"B": (1, 4), "S": (1, TINY["max_pos"]), "N": (1, 4 * TINY["max_pos"])}
    path, extra = me.pipeline_for(out, 4, 16)
    assert os.path.basename(path) == "minilm.json" and extra == ["--shape", "B=4,S=16,N=64"]
    with pytest.raises(m.MiniLMError, match=r"batch 5 is outside the pipeline's range \[1, 4\] \(symbol B"):
        me.pipeline_for(out, 5, 16)
    with pytest.raises(m.MiniLMError, match=r"sequence length 33 is outside .*\[1, 32\]"):
        me.pipeline_for(out, 1, 33)
    broken = os.path.join(out, "graphs", "dyn", "zz_broken.json")
    with open(broken, "w") as f:
        f.write('{"symbols": {"B": {"max": 4}}')  # truncated, and no "min"
    try:
        with pytest.raises(m.MiniLMError, match="zz_broken.json: not a graph file with symbol ranges"):
            me.pipeline_for(out, 2, 16)
    finally:
        os.remove(broken)
    assert me.seq_bucket(1) == 16 and me.seq_bucket(16) == 16 and me.seq_bucket(17) == 32
    assert me.seq_bucket(500) == 512 and me.seq_bucket(600) == 512 and me.seq_bucket(20, 24) == 24
