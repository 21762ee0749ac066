"""Issue #32 case 10: `fusebox model embed --file FIFO` and a FIFO in place of the model's
tokenizer.json or one of its weight files blocked forever (no writer ever comes). Files the runner
reads must be regular files: each case is one error, exit 2, at once. No `tokenizers` needed."""
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from fusebox_tools.models import minilm as m
from fusebox_tools.models import minilm_embed as me


class Blocked(BaseException):
    """Raised by the alarm: not an OSError, so the code under test cannot take it for a read error."""


@pytest.fixture
def no_blocking():
    """Fails the test (instead of hanging the suite) when a read blocks for 20 s."""
    def alarm(*_):
        raise Blocked("the read blocked for 20 s")
    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("minilm_random"))
    assert m.main(["random", "--out", out, "--seq", "64"]) == 0
    return out


def test_file_fifo_is_exit_2(no_blocking, capsys, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    rc = me.main(["--model", str(tmp_path), "--no-fusebox", "--file", str(fifo)])
    err = capsys.readouterr().err
    assert rc == 2 and "--file" in err and "FIFO" in err, err


def test_tokenizer_fifo_is_refused(tmp_path):
    """In a child process with a timeout: with the `tokenizers` package installed, its own open of
    a FIFO blocks in native code, where no_blocking's alarm cannot interrupt it (seen on the code
    before the fix: the test hung instead of failing)."""
    fifo = tmp_path / "tokenizer.json"
    os.mkfifo(fifo)
    code = ("import sys\n"
            "from fusebox_tools.models import minilm as m, minilm_embed as me\n"
            "try:\n"
            "    me.tokenize(sys.argv[1], ['hello'], 16)\n"
            "except m.MiniLMError as e:\n"
            "    print(e)\n"
            "    sys.exit(3)\n")
    python_dir = os.path.join(os.path.dirname(__file__), "..", "..", "python")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([python_dir, os.environ.get("PYTHONPATH", "")]))
    try:
        p = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, timeout=60, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("tokenize() blocked on a FIFO tokenizer.json for 60 s")
    assert p.returncode == 3 and re.search(r"tokenizer .* is a FIFO", p.stdout), (p.returncode, p.stdout, p.stderr)


def test_model_file_fifo_is_exit_2(no_blocking, model, capsys, tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(model, copy)
    weight = sorted((copy / "weights").glob("*.npy"))[0]
    weight.unlink()
    os.mkfifo(weight)
    rc = me.main(["--model", str(copy), "--no-fusebox", "--text", "hello there"])
    err = capsys.readouterr().err
    assert rc == 2 and "FIFO" in err and weight.name in err, err


def test_cli_file_fifo_returns(tmp_path):
    """Through `fusebox model embed` (the runner in a child process): it returns, exit 2."""
    fusebox = os.environ.get("FUSEBOX_BIN")
    if not fusebox:
        pytest.skip("FUSEBOX_BIN not set (ctest sets it)")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    p = subprocess.run([fusebox, "model", "embed", "--model", str(tmp_path), "--no-fusebox", "--file", str(fifo)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "FIFO" in p.stderr, p.stderr
