"""fusebox_tools.bench.st_compare's parts that need no GPU (issue 36): the skip without torch, the
per-sentence verdict, the sentence-transformers folder laid out from fetch_minilm's flattened
files, and the shipped sentence file's mix."""
import json
import os

import numpy as np
import pytest

from fusebox_tools.bench import st_compare as sc


def test_skips_cleanly_without_torch(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sc, "skip_reason", lambda: "torch is not installed")
    out = tmp_path / "r.json"
    assert sc.main(["--json-out", str(out)]) == 0
    assert "SKIP: torch is not installed" in capsys.readouterr().out
    assert json.loads(out.read_text()) == {"skipped": "torch is not installed"}


def test_skip_reason_here_matches_what_is_installed():
    try:
        import torch  # noqa: F401
    except ImportError:
        assert sc.skip_reason() == "torch is not installed"


def test_verdict_needs_every_sentence_at_the_threshold():
    rng = np.random.default_rng(0)
    st = rng.standard_normal((3, 8))
    fb = st.copy()
    fb[1] += 0.05 * rng.standard_normal(8)  # one sentence a little off: cosine about 0.999
    v = sc.accuracy_verdict(["a", "b" * 100, "c"], fb * 3.0, st)  # scale does not matter
    assert not v["pass"] and [r["pass"] for r in v["rows"]] == [True, False, True]
    assert v["rows"][0]["cos"] == pytest.approx(1.0) and v["min_cos"] < 0.9999
    assert v["rows"][1]["sentence"].endswith("...") and len(v["rows"][1]["sentence"]) == 80
    assert sc.accuracy_verdict(["a", "b", "c"], st, st)["pass"]
    with pytest.raises(ValueError, match="shape"):
        sc.cosines(st, st[:2])


def test_st_folder_lays_out_the_flattened_files(tmp_path):
    hf = tmp_path / "minilm" / "hf"
    hf.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "sentence_bert_config.json"):
        (hf / name).write_text("{}")
    (hf / "1_Pooling_config.json").write_text('{"pooling_mode_mean_tokens": true}')
    (hf / "modules.json").write_text(json.dumps([{"idx": 0, "path": ""}, {"idx": 1, "path": "1_Pooling"},
                                                 {"idx": 2, "path": "2_Normalize"}]))
    work = tmp_path / "work"
    work.mkdir()
    # the default: the unpacked model beside --model
    folder, src = sc.st_folder(None, str(tmp_path / "minilm" / "fusebox"), str(work))
    assert src == str(hf)
    assert json.loads(open(os.path.join(folder, "1_Pooling", "config.json")).read())["pooling_mode_mean_tokens"]
    assert os.path.isdir(os.path.join(folder, "2_Normalize"))
    assert os.path.isfile(os.path.join(folder, "model.safetensors"))


def test_shipped_sentences_mix_long_short_and_non_english():
    from fusebox_tools.models.minilm_embed import read_sentence_file

    lines = read_sentence_file(sc.DEFAULT_SENTENCES)
    # a paragraph beyond max_seq_length (256 tokens: every word is at least one token)
    assert max(len(s.split()) for s in lines) > 256
    assert sum(len(s.split()) <= 2 for s in lines) >= 3
    non_ascii = [s for s in lines if any(ord(ch) > 0x2FF for ch in s)]
    assert len(non_ascii) >= 5  # Cyrillic, Greek, CJK, Hangul, Arabic, Devanagari
