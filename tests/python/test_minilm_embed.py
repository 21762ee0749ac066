"""minilm_embed's text inputs and JSON output (`fusebox model embed`, issue 14):
--text, --file, --json on a random tiny model with the letter-by-letter
tokenizer `minilm random` writes, through the numpy reference (--no-fusebox:
no GPU); hostile --file inputs are one error line and exit 2."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from fusebox_tools.models import minilm as m
from fusebox_tools.models import minilm_embed as me

pytest.importorskip("tokenizers", reason="tokenizers not installed (scripts/fetch_minilm.sh)")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """`python3 -m fusebox_tools.models.minilm random --seq 64`: weights, pipelines and host/tokenizer.json."""
    out = str(tmp_path_factory.mktemp("minilm_random"))
    assert m.main(["random", "--out", out, "--seq", "64"]) == 0
    assert os.path.isfile(os.path.join(out, "host", "tokenizer.json"))
    return out


def embed(model, capsys, *args):
    """(exit code, stdout, stderr) of the runner with --no-fusebox, in this process."""
    rc = me.main(["--model", model, "--no-fusebox", *args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def check_doc(d, sentences, hidden=64):
    assert d["ok"] and d["sentences"] == sentences
    assert d["computed_by"].startswith("numpy float32 reference")
    assert len(d["lengths"]) == len(sentences) and all(2 < n <= d["seq"] for n in d["lengths"])
    e = np.array(d["embeddings"])
    assert e.shape == (len(sentences), hidden) and d["hidden"] == hidden
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-6)
    c = np.array(d["cosine"])
    assert c.shape == (len(sentences),) * 2
    np.testing.assert_allclose(c, c.T, atol=1e-12)
    np.testing.assert_allclose(np.diag(c), 1.0, atol=1e-6)
    np.testing.assert_allclose(c, e @ e.T, atol=1e-6)


def test_random_model_tokenizer_covers_text(model):
    ids, lengths = me.tokenize(os.path.join(model, "host", "tokenizer.json"), ["Hi, you!", "ab"], 16)
    assert lengths.tolist() == [9, 4]  # [CLS] h ##i , y ##o ##u ! [SEP]; [CLS] a ##b [SEP]
    assert (ids < m.load_config(model)["vocab"]).all() and 1 not in ids[1]  # no [UNK] for letters


def test_json_from_positional_text_and_file_in_order(model, capsys, tmp_path):
    f = tmp_path / "s.txt"
    f.write_bytes("\ufeffa man eats bread\n\n   \r\n  the sky is blue  \r\nlast line".encode())
    rc, out, err = embed(model, capsys, "first one", "--text", "second", "--file", str(f), "--text", "third", "--json")
    assert rc == 0, err
    d = json.loads(out)  # stdout is the JSON document alone; the human text is on stderr
    check_doc(d, ["first one", "second", "third", "a man eats bread", "the sky is blue", "last line"])
    assert d["model"] == os.path.abspath(model) and d["seq"] % 16 == 0
    assert "cosine similarities" in err


def test_same_sentence_twice_is_cosine_one(model, capsys):
    rc, out, _ = embed(model, capsys, "--text", "same words", "--text", "same words", "--text", "other", "--json")
    assert rc == 0
    c = np.array(json.loads(out)["cosine"])
    assert c[0, 1] == pytest.approx(1.0, abs=1e-9) and c[0, 2] < 1 - 1e-6


def test_text_mode_prints_the_table_on_stdout(model, capsys):
    rc, out, _ = embed(model, capsys, "--text", "one", "--text", "two")
    assert rc == 0 and "cosine similarities" in out and "[1] two" in out


def test_json_out_keeps_its_document(model, capsys, tmp_path):
    path = tmp_path / "r.json"
    rc, _, _ = embed(model, capsys, "--text", "one", "--json-out", str(path))
    assert rc == 0 and json.loads(path.read_text())["sentences"] == ["one"]


def hostile_files(tmp_path):
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:
        f.truncate(me.MAX_FILE_BYTES + 1)
    many = tmp_path / "many.txt"
    many.write_text("".join(f"s {i}\n" for i in range(me.MAX_SENTENCES + 1)))
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    (tmp_path / "blank.txt").write_text("\n  \n\t\n")
    (tmp_path / "nul.txt").write_bytes(b"a\x00b\n")
    (tmp_path / "folder").mkdir()
    return {"missing": (str(tmp_path / "nope.txt"), "cannot read it"),
            "folder": (str(tmp_path / "folder"), "is a folder"),
            "not_utf8": (str(tmp_path / "latin1.txt"), "is not UTF-8 text"),
            "too_large": (str(big), "larger than 16 MiB"),
            "too_many": (str(many), f"more than {me.MAX_SENTENCES}"),
            "blank": (str(tmp_path / "blank.txt"), "has no sentences"),
            "nul": (str(tmp_path / "nul.txt"), "NUL byte")}


@pytest.mark.parametrize("case", ["missing", "folder", "not_utf8", "too_large", "too_many", "blank", "nul"])
def test_hostile_file_is_one_error_and_exit_2(model, capsys, tmp_path, case):
    path, words = hostile_files(tmp_path)[case]
    rc, out, err = embed(model, capsys, "--file", path, "--json")
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minilm_embed: --file ") and words in lines[0], err
    assert json.loads(out) == {"ok": False, "error": lines[0][len("minilm_embed: "):]}


@pytest.mark.parametrize("args, words", [
    (["--text", ""], "sentence 0 is empty"),
    (["--text", "a", "--text", "  "], "sentence 1 is empty"),
    (["--text", "a", "--batch", "2"], "--batch B takes a positive B and no sentences"),
])
def test_bad_text_is_exit_2(model, capsys, args, words):
    rc, _, err = embed(model, capsys, *args)
    assert rc == 2 and words in err and len(err.strip().splitlines()) == 1


def test_missing_model_folder_is_exit_2(capsys, tmp_path):
    rc = me.main(["--model", str(tmp_path / "none"), "--no-fusebox", "--text", "hi"])
    err = capsys.readouterr().err
    assert rc == 2 and "no minilm_config.json there" in err and "minilm convert" in err


def test_hostile_file_in_a_process_has_no_traceback(model, tmp_path):
    """The whole path as `fusebox model embed` starts it: exit 2, one line, no traceback."""
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe\x00broken")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(os.path.dirname(me.__file__)))] +
                                                      ([os.environ["PYTHONPATH"]] if "PYTHONPATH" in os.environ
                                                       else [])))
    proc = subprocess.run([sys.executable, "-m", "fusebox_tools.models.minilm_embed", "--model", model, "--no-fusebox",
                           "--file", str(bad)], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
    assert "is not UTF-8 text" in proc.stderr


def test_read_sentence_file_strips_and_skips_blank_lines(tmp_path):
    f = tmp_path / "s.txt"
    f.write_text("  one  \n\ntwo\r\n\t\nthree")
    assert me.read_sentence_file(str(f)) == ["one", "two", "three"]


SENTENCES_MIXED = ["a very long sentence with many many words in it to make it long", "hi", "medium length one",
                   "x y", "another fairly long line of text here", "ok"]


def test_batches_by_length_give_the_one_batch_embeddings_in_input_order(model, capsys):
    """Without --seq: sorted by token count, batches of --batch-size padded to their own longest,
    results put back in input order; the same embeddings as one batch padded to 64 (issue 36)."""
    rc, out, err = embed(model, capsys, *SENTENCES_MIXED, "--batch-size", "2", "--json")
    assert rc == 0, err
    d = json.loads(out)
    check_doc(d, SENTENCES_MIXED)
    assert [b["size"] for b in d["batches"]] == [2, 2, 2]
    # each batch holds sentences of similar length and is padded only to its own longest
    seqs = [b["seq"] for b in d["batches"]]
    assert seqs == sorted(seqs, reverse=True) and seqs[-1] < seqs[0]
    for b in d["batches"]:
        assert max(d["lengths"][i] for i in b["indices"]) <= b["seq"] < max(d["lengths"][i] for i in b["indices"]) + 16
    rc, out, err = embed(model, capsys, *SENTENCES_MIXED, "--seq", "64", "--json")
    assert rc == 0, err
    one = json.loads(out)
    assert one["lengths"] == d["lengths"] and len(one["batches"]) == 1
    np.testing.assert_allclose(np.array(d["embeddings"]), np.array(one["embeddings"]), atol=1e-5)


def test_cut_follows_the_models_max_seq_length(model, capsys, tmp_path):
    import shutil

    folder = str(tmp_path / "m")
    shutil.copytree(model, folder)
    long = "word " * 40
    rc, out, _ = embed(folder, capsys, long, "--json")
    d = json.loads(out)
    assert rc == 0 and d["max_seq_length"] == 64 and "max_position_embeddings" in d["max_seq_length_from"]
    assert d["lengths"] == [64]  # without sentence_bert_config.json: the model's positions
    with open(os.path.join(folder, "host", me.SBERT_CONFIG), "w") as f:
        json.dump({"max_seq_length": 12, "do_lower_case": False}, f)
    rc, out, err = embed(folder, capsys, long, "short", "--json")
    d = json.loads(out)
    assert rc == 0 and d["max_seq_length"] == 12 and d["max_seq_length_from"].endswith(me.SBERT_CONFIG)
    assert d["lengths"][0] == 12 and "truncated to 12" in err
