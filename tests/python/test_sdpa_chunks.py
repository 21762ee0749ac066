"""fusebox_tools.crosscheck.sdpa_chunks without a GPU: its chunk graphs resolve (fusebox
check), and its recombination of two chunks' o and logsumexp equals the
one-shot attention computed here in numpy (split-KV and causal prefill), while
equal weights do not. The GPU run itself: python3 -m fusebox_tools.crosscheck.sdpa_chunks."""
import json
import os

import numpy as np
import pytest

from fusebox_tools.crosscheck import sdpa_chunks


def attention(q, k, v, keep):
    """o [B,H,S,D] and logsumexp [B,H,S,1] in float64; keep [S, Skv] (rows with no key: o 0, lse -inf)."""
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = np.einsum("bhid,bhjd->bhij", q, k) / np.sqrt(q.shape[-1])
    s = np.where(keep, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    l = e.sum(axis=-1, keepdims=True)
    o = np.einsum("bhij,bhjd->bhid", e / np.where(l > 0, l, 1.0), v)
    with np.errstate(divide="ignore"):
        return o, m + np.log(l)


@pytest.mark.parametrize("causal", [False, True])
def test_recombination_equals_one_shot(causal):
    rng = np.random.default_rng(1)
    B, Hq, Hk, S, D, split = 2, 4, 2, 48, 16, 20
    q, k, v = (rng.uniform(-1, 1, (B, h, S, D)) for h in (Hq, Hk, Hk))
    i, j = np.arange(S)[:, None], np.arange(S)[None, :]
    full_keep = j <= i if causal else np.ones((S, S), bool)
    o, lse = attention(q, k, v, full_keep)
    # the chunks exactly as the chunk graphs mask them (sdpa.h: top-left / bottom-right with padding)
    jb = np.arange(S - split)[None, :]
    keep_a = j[:, :split] <= i if causal else np.ones((S, split), bool)
    keep_b = jb <= i + (S - split) - S if causal else np.ones((S, S - split), bool)
    oa, la = attention(q, k[:, :, :split], v[:, :, :split], keep_a)
    ob, lb = attention(q, k[:, :, split:], v[:, :, split:], keep_b)
    kept_a, kept_b = sdpa_chunks.chunk_row_kept(S, split, causal)
    assert (kept_a == keep_a.any(axis=1)).all() and (kept_b == keep_b.any(axis=1)).all()
    # what a kernel leaves in rows that keep nothing must not matter
    ob = np.where(kept_b.reshape(1, 1, -1, 1), ob, np.nan)
    lb = np.where(kept_b.reshape(1, 1, -1, 1), lb, 123.0)
    ro, rl = sdpa_chunks.recombine(oa, la, ob, lb, kept_a, kept_b)
    assert np.allclose(ro, o, atol=1e-12) and np.allclose(rl, lse, atol=1e-12)
    naive = np.where((kept_a & kept_b).reshape(1, 1, -1, 1), 0.5 * (oa + ob), ro)
    rel, _ = sdpa_chunks.compare(naive, o)
    assert rel > sdpa_chunks.TOLERANCE["bf16"][0]


@pytest.mark.parametrize("causal", [False, True])
def test_chunk_graphs_resolve(run_check, tmp_path, causal):
    graphs = sdpa_chunks.chunk_graphs(2, 8, 2, 1024, 128, 384, "bf16", causal)
    for g in graphs:
        path = tmp_path / (g["name"] + ".json")
        path.write_text(json.dumps(g))
        rc, doc, err = run_check(path)
        assert rc == 0, err
        op = doc["ops"][0]
        assert op["outputs"]["stats"] == "stats"
    b = graphs[2]["ops"][0]
    if causal:
        assert b["alignment"] == "bottom_right" and "seq_len_kv" in b["inputs"]
    with pytest.raises(ValueError):
        sdpa_chunks.chunk_graphs(1, 1, 1, 8, 64, 8, "bf16", False)
