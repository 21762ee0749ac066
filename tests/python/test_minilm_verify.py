"""Issue 14's MiniLM verification without a GPU: the sentence generator
(deterministic, pinned, lengths spread), the ranking check against a
brute-force reading of its definition, the verdict on synthetic embeddings,
and the whole minilm_verify flow on a tiny random model (--emulate against the
numpy reference; a stub fusebox for the batching)."""
import hashlib
import itertools
import json
import os

import numpy as np
import pytest

from fusebox_tools.models import minilm as m
from fusebox_tools.models import minilm_sentences as ms
from fusebox_tools.models import minilm_verify as mv

# sha256 of "\n".join(make_sentences(200, 14)): the H200 results are for these sentences.
EXPECTED_SHA256 = "1f3ad8bed7d364d403860244eab6e947a05ae61a79c40f8b94404545d429d82c"


def test_generator_is_deterministic_and_distinct():
    a, b = ms.make_sentences(200), ms.make_sentences(200)
    assert a == b and len(a) == 200 and len(set(a)) == 200
    assert a[:3] == ms.README
    assert ms.make_sentences(200, seed=15) != a
    assert ms.make_sentences(50) == ms.make_sentences(50)
    assert len(ms.make_sentences(1)) == 1 and len(ms.make_sentences(2)) == 2
    assert len(set(ms.make_sentences(256))) == 256
    for bad in (0, -3, 2.5, "10"):
        with pytest.raises(ValueError):
            ms.make_sentences(bad)


def test_generator_output_is_pinned():
    """A change of the word lists or the generator changes the sentences the H200
    numbers were measured on: update the hash (and say so) when that is meant."""
    digest = hashlib.sha256("\n".join(ms.make_sentences(200, 14)).encode()).hexdigest()
    assert digest == EXPECTED_SHA256, digest


def test_generator_length_spread():
    words = np.array([ms.word_count(s) for s in ms.make_sentences(200)])
    assert words.min() == 3 and words.max() == 100
    assert (words < 15).sum() >= 40          # many short sentences
    assert (words > 80).sum() >= 15          # and long ones
    assert 20 <= np.median(words) <= 45
    # every decade of lengths is present
    for lo in range(0, 100, 10):
        assert ((words >= max(lo, 3)) & (words < lo + 10)).any(), lo
    for s in ms.make_sentences(200):
        assert s[0].isupper() and s[-1] in ".!?" and "  " not in s, s


def test_generated_sentences_fit_128_tokens_with_the_real_tokenizer(repo_root):
    tok = os.path.join(repo_root, "models", "minilm", "fusebox", "host", "tokenizer.json")
    if not os.path.isfile(tok):
        pytest.skip("converted MiniLM not here (scripts/fetch_minilm.sh && python3 -m fusebox_tools.models.minilm convert)")
    pytest.importorskip("tokenizers", reason="tokenizers not installed (scripts/fetch_minilm.sh)")
    n = mv.token_counts(tok, ms.make_sentences(200))
    assert min(n) >= 5 and 100 <= max(n) <= 128  # S=128 truncates none of them


# ------------------------------------------------------------------ ranking

def brute_force(r, f, tie):
    """The definition, O(P^2): pairs q overtaken by some p below them by more than tie."""
    bad = set()
    for p, q in itertools.permutations(range(len(r)), 2):
        if r[q] - r[p] > tie and f[q] <= f[p]:
            bad.add(q)
    return bad


def test_average_ranks_and_spearman():
    assert ms.average_ranks([10, 20, 20, 5]).tolist() == [2.0, 3.5, 3.5, 1.0]
    assert ms.average_ranks([1, 1, 1]).tolist() == [2.0, 2.0, 2.0]
    assert ms.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert ms.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert ms.spearman([1, 2, 2, 3], [1, 2, 2, 3]) == pytest.approx(1.0)


def test_ranking_identical_and_monotone_changes_pass():
    rng = np.random.default_rng(0)
    r = rng.uniform(-0.2, 1, 300)
    res = ms.ranking_check(r, r, tie=0.0)
    assert res["ok"] and res["overtaken"] == 0 and res["spearman"] == pytest.approx(1.0) and res["first"] is None
    assert res["resolution"] == 0.0
    res = ms.ranking_check(r, 0.5 * r + 0.1, tie=0.0)  # any increasing map keeps the ranking
    assert res["ok"] and res["max_abs_change"] > 0.1


def test_ranking_swap_beyond_and_within_tie():
    r = np.array([0.10, 0.20, 0.30, 0.50, 0.505])
    f = r.copy()
    f[[1, 2]] = [0.31, 0.20]        # pairs 1 and 2 swapped: reference gap 0.1 > tie
    res = ms.ranking_check(r, f, tie=0.01, pairs=np.array([[0, 1], [0, 2], [0, 3], [1, 2], [1, 3]]),
                           sentences=["s0", "s1", "s2", "s3"])
    assert not res["ok"] and res["overtaken"] == 1
    first = res["first"]
    assert first["higher_in_reference"]["pair_index"] == 2 and first["lower_in_reference"]["pair_index"] == 1
    assert first["higher_in_reference"]["sentences"] == [0, 3] and first["lower_in_reference"]["text"] == ["s0", "s2"]
    assert first["reference_gap"] == pytest.approx(0.1)
    f = r.copy()
    f[[3, 4]] = [0.506, 0.504]      # swapped within the tie: accepted, counted strictly
    res = ms.ranking_check(r, f, tie=0.01)
    assert res["ok"] and res["overtaken"] == 0 and res["resolution"] == pytest.approx(0.005)
    # a tie in fusebox of two pairs the reference separates is a disagreement
    f = r.copy()
    f[2] = f[1]
    assert not ms.ranking_check(r, f, tie=0.01)["ok"]
    # equal reference similarities: any order
    r2 = np.array([0.3, 0.3, 0.7])
    assert ms.ranking_check(r2, np.array([0.31, 0.29, 0.7]), tie=0.0)["ok"]


@pytest.mark.parametrize("tie", [0.0, 0.01, 0.05])
def test_ranking_matches_brute_force(tie):
    rng = np.random.default_rng(int(tie * 1000) + 7)
    for _ in range(20):
        r = np.round(rng.uniform(0, 1, 40), 2)  # with exact ties
        f = r + rng.normal(0, 0.02, 40)
        res = ms.ranking_check(r, f, tie)
        bad = brute_force(r, f, tie)
        gaps = [r[q] - r[p] for p in range(len(r)) for q in range(len(r)) if r[q] > r[p] and f[p] >= f[q]]
        assert res["resolution"] == pytest.approx(max(gaps, default=0.0))
        assert res["ok"] == (res["resolution"] <= tie)
        assert res["overtaken"] == len(bad) and res["ok"] == (not bad)
        if bad:  # the first disagreement: the overtaken pair lowest in the reference's order
            q = res["first"]["higher_in_reference"]["pair_index"]
            assert q in bad and r[q] == min(r[i] for i in bad)
            p = res["first"]["lower_in_reference"]["pair_index"]
            assert r[q] - r[p] > tie and f[p] >= f[q]


def test_ranking_refuses_bad_input():
    with pytest.raises(ValueError):
        ms.ranking_check([0.1, 0.2], [0.1], 0.01)
    with pytest.raises(ValueError):
        ms.ranking_check([0.1, 0.2], [0.1, 0.2], -1)
    assert ms.ranking_check([], [], 0.01)["ok"]


def test_pair_similarities():
    e = np.array([[1.0, 0, 0], [0, 2.0, 0], [1.0, 1.0, 0]])
    pairs, sim = ms.pair_similarities(e)
    assert pairs.tolist() == [[0, 1], [0, 2], [1, 2]]
    np.testing.assert_allclose(sim, [0, 1 / np.sqrt(2), 1 / np.sqrt(2)])


# ------------------------------------------------------------------ verdict

def synthetic(n=60, d=32, noise=1e-3, seed=1):
    rng = np.random.default_rng(seed)
    ref = rng.normal(size=(n, d))
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    return ref, ref + rng.normal(0, noise / np.sqrt(d), size=(n, d))


def test_verdict_pass_and_fail():
    ref, got = synthetic()
    sentences = [f"sentence {i}" for i in range(len(ref))]
    tokens = [4] * len(ref)
    v = mv.verdict(sentences, tokens, got, ref, min_cos=0.999, tie=0.01, seq=128)
    assert v["ok"] and v["cosine"]["min"] > 0.9999 and v["ranking"]["pairs"] == 60 * 59 // 2
    assert len(v["per_sentence"]) == 60 and len(v["cosine"]["worst"]) == 5
    bad = got.copy()
    bad[17] = -bad[17]  # one sentence wrong: its cosine and the ranking of its pairs
    v = mv.verdict(sentences, tokens, bad, ref, min_cos=0.999, tie=0.01, seq=128)
    assert not v["ok"] and not v["cosine"]["ok"] and v["cosine"]["below"] == 1
    assert v["cosine"]["worst"][0]["sentence"] == 17 and not v["ranking"]["ok"]
    assert 17 in v["ranking"]["first"]["higher_in_reference"]["sentences"] + \
        v["ranking"]["first"]["lower_in_reference"]["sentences"]
    json.dumps(v)  # JSON-able


# ------------------------------------------------------------------ the flow, tiny model

TINY = m.check_config(dict(m.MINILM_CONFIG, layers=2, hidden=64, heads=2, ffn=128, vocab=400, max_pos=160))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A tiny random MiniLM with a WordPiece tokenizer over the generator's words."""
    tokenizers = pytest.importorskip("tokenizers", reason="tokenizers not installed (scripts/fetch_minilm.sh)")
    from tokenizers import models, normalizers, pre_tokenizers, processors

    out = str(tmp_path_factory.mktemp("minilm_verify"))
    m.write_weights(m.random_params(TINY, seed=5), TINY, out)
    words = sorted({w.strip(".!?,'").lower() for s in ms.make_sentences(200) for w in s.split()})
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3}
    for w in words[:TINY["vocab"] - 12]:
        vocab.setdefault(w, len(vocab))
    for p in ".!?,'-":
        vocab.setdefault(p, len(vocab))
    tok = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2),
                                                                                               ("[SEP]", 3)])
    tok.save(os.path.join(out, "host", "tokenizer.json"))
    return out


def test_emulated_flow_against_numpy_passes(tiny_model, tmp_path, capsys):
    js = str(tmp_path / "v.json")
    rc = mv.main(["--model", tiny_model, "--sentences", "24", "--batch", "10", "--seq", "128", "--emulate",
                  "--reference", "numpy", "--json-out", js])
    out = capsys.readouterr().out
    doc = json.load(open(js))
    assert rc == 0 and doc["ok"] and "minilm_verify: PASS" in out, out
    assert doc["reference"]["reference"] == "numpy" and doc["n"] == 24 and len(doc["verdict"]["per_sentence"]) == 24
    assert doc["verdict"]["ranking"]["pairs"] == 24 * 23 // 2 and doc["truncated"] == 0
    assert 0.999 < doc["verdict"]["cosine"]["min"] < 1.0  # bf16 stage outputs: close, not equal


def test_truncation_is_counted_and_a_failure_exits_1(tiny_model, tmp_path, capsys):
    js = str(tmp_path / "v.json")
    rc = mv.main(["--model", tiny_model, "--sentences", "12", "--batch", "12", "--seq", "16", "--emulate",
                  "--reference", "numpy", "--min-cos", "0.9999999", "--json-out", js])
    doc = json.load(open(js))
    assert rc == 1 and not doc["ok"] and not doc["verdict"]["cosine"]["ok"]
    assert doc["truncated"] == sum(t > 16 for t in mv.token_counts(os.path.join(tiny_model, "host", "tokenizer.json"),
                                                                   ms.make_sentences(12))) > 0
    assert "truncated" in capsys.readouterr().err


def test_fusebox_batches_with_a_stub_pipeline_run(tiny_model, monkeypatch, tmp_path):
    """The fusebox side: one pipeline run per batch of B, the last one filled up
    and cut back; here `pipeline run` is a stub writing the numpy model's pooled sums."""
    from fusebox_tools.models import minilm_embed as me

    p, cfg = m.load_converted(tiny_model)
    calls = []

    def fake_run(pipeline, inputs, out_dir, fusebox=None, verify=False, extra_args=(), **kw):
        B = inputs["seq_len_kv"].shape[0]
        S = inputs["ids"].shape[0] // B
        lengths = inputs["seq_len_kv"].reshape(-1)
        if static:
            assert os.path.basename(pipeline) == f"minilm_b{B}_s{S}.json" and os.path.isfile(pipeline)
            assert list(extra_args) == []
        else:  # one symbolic pipeline for every batch, the shape given
            assert os.path.basename(pipeline) == "minilm.json" and os.path.isfile(pipeline)
            assert list(extra_args) == ["--shape", f"B={B},S={S},N={B * S}"]
        seqs.append(S)
        x = m.lookup(p, inputs["ids"], inputs["pos_type"].reshape(S, -1)).reshape(B, S, -1)
        x = m.layernorm(x, p["emb_ln_g"], p["emb_ln_b"], cfg["eps"])
        for L in p["layers"]:
            x = m.encoder_layer(x, L, cfg, lengths)
        keep = (np.arange(S)[None, :] < lengths[:, None]).astype(np.float32)
        run_dir = os.path.join(out_dir, "run")
        os.makedirs(run_dir)
        np.save(os.path.join(run_dir, "pooled_sum.npy"), np.einsum("bs,bsh->bh", keep, x).reshape(1, B, -1))
        calls.append(B)
        return {"ok": True}, run_dir

    monkeypatch.setattr(me, "run_fusebox", fake_run)
    lengths = mv.token_counts(os.path.join(tiny_model, "host", "tokenizer.json"), ms.make_sentences(23))
    for static in (False, True):
        calls, seqs = [], []
        js = str(tmp_path / "v.json")
        flags = ["--fixed-seq", "--static-pipeline"] if static else []
        rc = mv.main(["--model", tiny_model, "--sentences", "23", "--batch", "10", "--seq", "64",
                      "--reference", "numpy", "--json-out", js, "--fusebox", "/nonexistent/fusebox", *flags])
        doc = json.load(open(js))
        assert calls == [10, 10, 10]
        assert [r["sentences"] for r in doc["fusebox"]["runs"]] == [[0, 10], [10, 20], [20, 23]]
        assert rc == 0 and doc["ok"] and doc["verdict"]["cosine"]["min"] > 0.99999  # float32 both sides
        if static:
            assert seqs == [64, 64, 64]
        else:  # sorted by length, each batch padded to its longest rounded up to 16 (at most --seq)
            srt = sorted(min(n, 64) for n in lengths)
            assert seqs == [me.seq_bucket(max(srt[a:a + 10]), 64) for a in (0, 10, 20)] == doc["fusebox"]["seqs"]
            assert seqs == sorted(seqs) and len(set(seqs)) > 1


def test_bad_arguments_exit_2(tiny_model, tmp_path, capsys):
    assert mv.main(["--model", str(tmp_path / "none"), "--emulate"]) == 2
    assert mv.main(["--model", tiny_model, "--sentences", "1", "--emulate"]) == 2
    assert mv.main(["--model", tiny_model, "--seq", "4096", "--emulate"]) == 2
    assert "exceeds" in capsys.readouterr().err


def test_st_max_seq_length(tmp_path):
    assert mv.st_max_seq_length(str(tmp_path))[0] == 256
    (tmp_path / "sentence_bert_config.json").write_text('{"max_seq_length": 384, "do_lower_case": false}')
    assert mv.st_max_seq_length(str(tmp_path)) == (384, str(tmp_path / "sentence_bert_config.json"))
    (tmp_path / "sentence_bert_config.json").write_text('[1, 2]')
    assert mv.st_max_seq_length(str(tmp_path))[0] == 256


def test_auto_reference_falls_back_and_says_why(tiny_model, monkeypatch, tmp_path, capsys):
    def st_broken(*a):
        raise TypeError("Transformer() got an unexpected keyword argument")

    def no_transformers(*a):
        raise ImportError("No module named 'transformers'")

    monkeypatch.setattr(mv, "_st_reference", st_broken)
    monkeypatch.setattr(mv, "_hf_reference", no_transformers)
    js = str(tmp_path / "v.json")
    assert mv.main(["--model", tiny_model, "--sentences", "6", "--batch", "6", "--seq", "64", "--emulate",
                    "--json-out", js]) == 0
    ref = json.load(open(js))["reference"]
    assert ref["reference"] == "numpy" and len(ref["not_used"]) == 2
    assert ref["not_used"][0].startswith("sentence-transformers: TypeError")
    assert "not used: sentence-transformers: TypeError" in capsys.readouterr().out
    # a reference asked for by name: its error, exit 1
    assert mv.main(["--model", tiny_model, "--sentences", "6", "--batch", "6", "--seq", "64", "--emulate",
                    "--reference", "transformers"]) == 1
