"""minilm_embed.run_fusebox(tune=True): `fusebox pipeline tune` at the run's shape first, then
`pipeline run` (from the plan cache the tune filled); a failed tune is the run's error."""
import json
import os
import stat
import sys

import numpy as np

from fusebox_tools.models import minilm_embed

FAKE = """#!{python}
import json, os, sys
a = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps(a) + "\\n")
if a[:2] == ["pipeline", "tune"]:
    if os.environ.get("FAKE_TUNE_FAIL"):
        sys.stderr.write("pipeline tune: NoDevice: no CUDA GPU\\n")
        sys.exit(1)
    print(json.dumps({{"ok": True}}))
    sys.exit(0)
print(json.dumps({{"ok": True, "stages": []}}))
"""


def _fake(tmp_path, monkeypatch):
    path = tmp_path / "fusebox"
    path.write_text(FAKE.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "log"))
    return str(path)


def _calls(tmp_path):
    return [json.loads(line) for line in open(tmp_path / "log")]


def test_tune_runs_first_at_the_runs_shape(tmp_path, monkeypatch):
    fb = _fake(tmp_path, monkeypatch)
    extra = ["--shape", "B=2,S=16,N=32", "--static-shapes"]
    report, _ = minilm_embed.run_fusebox("p.json", {"emb": np.zeros((32, 4, 1, 1), np.float32)}, str(tmp_path / "o"),
                                         fusebox=fb, iters=3, extra_args=extra, tune=True)
    assert report["ok"]
    tune, run = _calls(tmp_path)
    assert tune == ["pipeline", "tune", "p.json", "--json", "--shape", "B=2,S=16,N=32"]
    assert run[:3] == ["pipeline", "run", "p.json"] and "--static-shapes" in run
    assert run[run.index("--shape") + 1] == "B=2,S=16,N=32"


def test_no_tune_by_default_and_a_failed_tune_is_the_error(tmp_path, monkeypatch):
    fb = _fake(tmp_path, monkeypatch)
    minilm_embed.run_fusebox("p.json", {}, str(tmp_path / "o"), fusebox=fb)
    assert [c[1] for c in _calls(tmp_path)] == ["run"]
    os.remove(tmp_path / "log")
    monkeypatch.setenv("FAKE_TUNE_FAIL", "1")
    report, _ = minilm_embed.run_fusebox("p.json", {}, str(tmp_path / "o2"), fusebox=fb, tune=True)
    assert not report["ok"] and "pipeline tune" in report["error"] and "NoDevice" in report["error"]
    assert [c[1] for c in _calls(tmp_path)] == ["tune"]  # no run after a failed tune


def test_runner_fuses_qkv_unless_told_not_to(tmp_path, monkeypatch):
    """The runner's default pipeline is the fused Q/K/V one (minilm_fqkv.json); --no-fused-qkv
    runs the three-GEMM minilm.json."""
    pytest = __import__("pytest")
    pytest.importorskip("tokenizers")
    from fusebox_tools.models import minilm as m
    model = str(tmp_path / "model")
    assert m.main(["random", "--out", model, "--seq", "64"]) == 0
    fb = _fake(tmp_path, monkeypatch)
    for flag, expect in (([], "minilm_fqkv.json"), (["--no-fused-qkv"], "minilm.json")):
        log = tmp_path / "log"
        if log.exists():
            os.remove(log)
        # the stub saves no outputs: the runner says so (exit 1), no traceback
        assert minilm_embed.main(["--model", model, "--fusebox", fb, "--text", "a b", *flag]) == 1
        run = next(c for c in _calls(tmp_path) if c[:2] == ["pipeline", "run"])
        assert os.path.basename(run[2]) == expect, run[2]
