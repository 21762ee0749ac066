"""fusebox_tools.models.lm_data (docs/lm-data.md): the data folder of docs/lm.md from real English
text (the repository's docs/*.md), its decoding by vocab_bytes.json, the train/validation split,
atomic writes, refusals and hostile inputs. CPU only; the tokenizer tests skip without
`tokenizers` (scripts/setup.sh installs it)."""
import glob
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from fusebox_tools.core.graph import REPO_ROOT
from fusebox_tools.models import lm_data

try:
    import tokenizers
except ImportError:
    tokenizers = None

needs_tokenizers = pytest.mark.skipif(tokenizers is None,
                                      reason="the tokenizers package is missing (scripts/setup.sh installs it)")
VOCAB = 512
MARK = "Qz7Vk"      # a word the docs never use, for the text only the validation part holds


def quiet(*_):
    """A log function that prints nothing."""


def docs_text():
    """The repository's docs, concatenated: real English, a few hundred kB."""
    paths = sorted(glob.glob(os.path.join(REPO_ROOT, "docs", "*.md")))
    text = "".join(open(p, encoding="utf-8").read().rstrip("\n") + "\n" for p in paths)
    assert len(text) > 50_000 and MARK not in text
    return text


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(path, text) of the docs as one text file."""
    path = tmp_path_factory.mktemp("text") / "docs.txt"
    text = docs_text()
    path.write_text(text, encoding="utf-8")
    return str(path), text


@pytest.fixture(scope="module")
def folder(corpus, tmp_path_factory):
    """(data folder, data.json) prepared from the docs at vocab 512."""
    out = str(tmp_path_factory.mktemp("data") / "lm")
    info = lm_data.prepare([corpus[0]], VOCAB, out, val_fraction=0.05, log=quiet)
    return out, info


def load_table(out):
    """vocab_bytes.json's tokens as bytes."""
    doc = json.load(open(os.path.join(out, "vocab_bytes.json")))
    assert doc["vocab"] == len(doc["tokens"])
    return [bytes.fromhex(h) for h in doc["tokens"]]


def run_main(capsys, *argv):
    """(exit status, stdout, stderr) of lm_data.main(argv)."""
    rc = lm_data.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


# ---- the data folder ----

@needs_tokenizers
def test_prepare_writes_exactly_the_five_files_with_their_dtypes(folder, corpus):
    out, info = folder
    assert sorted(os.listdir(out)) == sorted(lm_data.DATA_FILES)
    train, val = np.load(os.path.join(out, "train.npy")), np.load(os.path.join(out, "val.npy"))
    assert train.dtype.str == "<u2" and val.dtype.str == "<u2" and train.ndim == val.ndim == 1
    assert int(train.max()) < VOCAB and int(val.max()) < VOCAB
    # ~4 bytes a token at vocab 512: far fewer tokens than bytes, far more than words/4
    assert len(corpus[1]) / 8 < len(train) + len(val) < len(corpus[1]) / 1.5
    data = json.load(open(os.path.join(out, "data.json")))
    assert data == info
    assert data["vocab"] == VOCAB and data["dtype"] == "<u2" and data["source"] is None
    assert data["tokens"] == {"train": len(train), "val": len(val)}
    raw = open(corpus[0], "rb").read()
    assert data["texts"] == [{"name": "docs.txt", "bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}]
    assert data["tokenizers"] == tokenizers.__version__
    assert tokenizers.Tokenizer.from_file(os.path.join(out, "tokenizer.json")).get_vocab_size() == VOCAB


@needs_tokenizers
def test_vocab_bytes_decoding_is_the_text_and_the_tokenizers_decoding(folder, corpus):
    out, info = folder
    table = load_table(out)
    assert len(table) == VOCAB and len(set(table)) == VOCAB
    assert {t for t in table if len(t) == 1} == {bytes([b]) for b in range(256)}
    train_text, val_text = lm_data.split_text(corpus[1], 0.05)
    tok = tokenizers.Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    for name, text in (("train.npy", train_text), ("val.npy", val_text)):
        ids = np.load(os.path.join(out, name)).tolist()
        assert b"".join(table[i] for i in ids) == text.encode("utf-8")
        assert tok.decode(ids) == text
    # a multi-byte character the docs hold (the em dash or an arrow) decodes too
    sample = "Ranks — 3 → 4: “quoted”, naïve.\n"
    ids = tok.encode(sample).ids
    assert b"".join(table[i] for i in ids).decode("utf-8") == sample == tok.decode(ids)


@needs_tokenizers
def test_decode_command_prints_the_text_of_ids(folder, capsys):
    out, _ = folder
    val = np.load(os.path.join(out, "val.npy"))[:30].tolist()
    rc, text, err = run_main(capsys, "decode", "--data", out, "--ids", ",".join(map(str, val)))
    assert rc == 0 and err == ""
    assert text.encode("utf-8") == b"".join(load_table(out)[i] for i in val) + b"\n"
    rc, _, err = run_main(capsys, "decode", "--data", out, "--ids", f"1,{VOCAB}")
    assert rc == 2 and f"token id {VOCAB} is out of range" in err
    rc, _, err = run_main(capsys, "decode", "--data", out, "--ids", "1,x")
    assert rc == 2 and "not a comma-separated list" in err


# ---- the split ----

def test_split_is_at_a_line_start_and_keeps_every_character():
    text = "".join(f"line {i} of the text\n" for i in range(1000))
    train, val = lm_data.split_text(text, 0.1)
    assert train + val == text
    assert train.endswith("\n") and val.startswith("line ")
    assert abs(len(val) - len(text) * 0.1) < len("line 999 of the text\n")


@needs_tokenizers
def test_validation_text_is_never_seen_by_the_tokenizer(corpus, tmp_path):
    """A word repeated only in the validation tail gets no merged token; the same lines at the
    head (training) do get one: the check can fail."""
    tail = "".join(f"{MARK}{MARK} {MARK}.\n" for _ in range(400))
    text = corpus[1] + tail
    fraction = 0.9 * len(tail) / len(text)
    (tmp_path / "tail.txt").write_text(text, encoding="utf-8")
    (tmp_path / "head.txt").write_text(tail + corpus[1], encoding="utf-8")
    lm_data.prepare([str(tmp_path / "tail.txt")], VOCAB, str(tmp_path / "tail"), fraction, log=quiet)
    lm_data.prepare([str(tmp_path / "head.txt")], VOCAB, str(tmp_path / "head"), fraction, log=quiet)
    mark = MARK.encode()
    assert not [t for t in load_table(str(tmp_path / "tail")) if len(t) >= 3 and t in mark * 2]
    assert [t for t in load_table(str(tmp_path / "head")) if len(t) >= 3 and t in mark * 2]
    val = np.load(str(tmp_path / "tail" / "val.npy")).tolist()
    assert b"".join(load_table(str(tmp_path / "tail"))[i] for i in val).decode() == tail[len(tail) - len(
        lm_data.split_text(text, fraction)[1]):]


# ---- the folder: refusal and atomic writes ----

@needs_tokenizers
def test_refuses_a_folder_with_a_foreign_file_and_leaves_it_alone(corpus, tmp_path, capsys):
    out = tmp_path / "lm"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    rc, _, err = run_main(capsys, "prepare", "--text", corpus[0], "--vocab", "300", "--out", str(out))
    assert rc == 2 and "notes.txt" in err and "refusing" in err and "Traceback" not in err
    assert os.listdir(out) == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"
    (tmp_path / "file").write_text("x")
    rc, _, err = run_main(capsys, "prepare", "--text", corpus[0], "--vocab", "300", "--out", str(tmp_path / "file"))
    assert rc == 2 and "not a folder" in err


@needs_tokenizers
def test_rewrites_its_own_folder_and_creates_a_missing_one(corpus, tmp_path, capsys):
    out = tmp_path / "a" / "b"
    for vocab in (300, 320):
        rc, text, err = run_main(capsys, "prepare", "--text", corpus[0], "--vocab", str(vocab), "--out", str(out))
        assert rc == 0, err
        assert f"vocab {vocab}" in text
    assert sorted(os.listdir(out)) == sorted(lm_data.DATA_FILES)
    assert json.load(open(out / "data.json"))["vocab"] == 320 and len(load_table(str(out))) == 320


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    (tmp_path / "val.npy").write_bytes(b"old")

    def fail(f):
        f.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        lm_data.write_atomic(str(tmp_path), "val.npy", fail)
    assert os.listdir(tmp_path) == ["val.npy"] and (tmp_path / "val.npy").read_bytes() == b"old"
    lm_data.write_atomic(str(tmp_path), "val.npy", lambda f: f.write(b"new"))
    assert os.listdir(tmp_path) == ["val.npy"] and (tmp_path / "val.npy").read_bytes() == b"new"


def test_dtype_is_uint16_up_to_65536_then_int32():
    assert lm_data.stream_dtype(256).str == "<u2" and lm_data.stream_dtype(65536).str == "<u2"
    assert lm_data.stream_dtype(65537).str == "<i4" and lm_data.stream_dtype(2 ** 31).str == "<i4"


# ---- hostile input: one line and status 2, never a traceback ----

@pytest.mark.parametrize("content, message", [
    (b"some text\x00\x01\x02 binary\n" * 20, "NUL byte at offset 9"),
    (b"caf\xe9 au lait\n" * 20, "not UTF-8 text: bad byte at offset 3"),
])
def test_binary_text_is_refused(tmp_path, capsys, content, message):
    (tmp_path / "t.bin").write_bytes(content)
    rc, _, err = run_main(capsys, "prepare", "--text", str(tmp_path / "t.bin"), "--vocab", "300",
                          "--out", str(tmp_path / "out"))
    assert rc == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err


@needs_tokenizers
@pytest.mark.parametrize("text, message", [
    ("hi\n", "too short"),
    ("", "too short"),
    ("one line of text without a second line to validate on", "too short"),
    ("".join(f"the quick brown fox {i}\n" for i in range(200)), "gives only"),
])
def test_too_little_text_is_refused(tmp_path, capsys, text, message):
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    rc, _, err = run_main(capsys, "prepare", "--text", str(tmp_path / "t.txt"), "--vocab", "2000",
                          "--val-fraction", "0.5", "--out", str(tmp_path / "out"))
    assert rc == 2 and message in err and "Traceback" not in err
    assert not os.path.exists(tmp_path / "out" / "data.json")


@pytest.mark.parametrize("args, message", [
    (["--vocab", "255"], "--vocab 255 is out of range"),
    (["--vocab", str(2 ** 31 + 1)], "out of range"),
    (["--vocab", "512", "--val-fraction", "1"], "--val-fraction 1.0 must be between"),
    (["--vocab", "512", "--source-json", "/nonexistent/source.json"], "cannot read --source-json"),
])
def test_bad_arguments_are_refused(corpus, tmp_path, capsys, args, message):
    rc, _, err = run_main(capsys, "prepare", "--text", corpus[0], "--out", str(tmp_path / "out"), *args)
    assert rc == 2 and message in err


def test_missing_files_are_refused(tmp_path, capsys):
    rc, _, err = run_main(capsys, "prepare", "--text", str(tmp_path / "none.txt"), "--vocab", "300",
                          "--out", str(tmp_path / "out"))
    assert rc == 2 and "cannot read text file" in err and "No such file" in err
    rc, _, err = run_main(capsys, "decode", "--data", str(tmp_path / "none"), "--ids", "1")
    assert rc == 2 and "cannot read" in err and "vocab_bytes.json" in err


def test_the_module_runs_and_reports_without_a_traceback(tmp_path):
    (tmp_path / "t.bin").write_bytes(b"\x00\x00\x00")
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO_ROOT, "python"))
    proc = subprocess.run([sys.executable, "-m", "fusebox_tools.models.lm_data", "prepare", "--text",
                           str(tmp_path / "t.bin"), "--vocab", "300", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("lm_data: ") and "Traceback" not in proc.stderr


# ---- the corpus from HTML pages ----

PAGE = """<html><head><title>T</title><script>var x = 1;</script></head><body>
<nav>Menu</nav><div role="main" class="document"><section>
<h1>Locking<a class="headerlink" href="#l">&para;</a></h1>
<p>A spinlock &amp; a mutex
   are not   the same.</p>
<pre>if (x)
    lock();</pre>
<ul><li><p>one</p></li><li><p>two</p></li></ul>
</section></div><footer>Copyright</footer></body></html>"""


def test_html_text_is_the_main_part_one_paragraph_a_line():
    assert lm_data.html_to_text(PAGE) == ("Locking\nA spinlock & a mutex are not the same.\n"
                                          "if (x)\n    lock();\none\ntwo")


def test_corpus_command_joins_pages_in_order_less_the_excluded(tmp_path, capsys):
    (tmp_path / "html" / "b").mkdir(parents=True)
    (tmp_path / "html" / "a.html").write_text(PAGE)
    (tmp_path / "html" / "b" / "c.html").write_text("<body><p>Second page.</p></body>")
    (tmp_path / "html" / "genindex.html").write_text("<body><p>Index</p></body>")
    out = tmp_path / "corpus.txt"
    rc, text, _ = run_main(capsys, "corpus", "--html", str(tmp_path / "html"), "--exclude", "genindex*",
                           "--out", str(out))
    assert rc == 0 and "2 pages" in text
    assert out.read_text() == lm_data.html_to_text(PAGE) + "\n\nSecond page.\n"
