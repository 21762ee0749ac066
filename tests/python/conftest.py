"""Shared fixtures: the fusebox binary ($FUSEBOX_BIN, else build/fusebox: ctest
sets FUSEBOX_BIN) and helpers to run it."""
import json
import os
import subprocess
import sys

import pytest

from fusebox_tools.core.graph import REPO_ROOT, FuseboxError, fusebox_bin


@pytest.fixture(scope="session")
def fusebox():
    try:
        exe = fusebox_bin()
    except FuseboxError as e:
        pytest.fail(str(e))
    if not os.access(exe, os.X_OK):
        pytest.fail(f"fusebox binary {exe} is missing or not executable (make build, or set FUSEBOX_BIN)")
    return exe


@pytest.fixture(scope="session")
def repo_root():
    return REPO_ROOT


@pytest.fixture
def run_check(fusebox):
    """run_check(path, *extra) -> (exit code, parsed stdout, stderr) of
    `fusebox check PATH --json EXTRA...`."""

    def run(path, *extra):
        proc = subprocess.run([fusebox, "check", str(path), "--json", *extra], capture_output=True,
                              text=True, timeout=120)
        return proc.returncode, json.loads(proc.stdout), proc.stderr

    return run


@pytest.fixture
def write_graph(tmp_path):
    """write_graph(doc, name="g.json") -> path of `doc` written as JSON under tmp_path."""

    def write(doc, name="g.json"):
        path = tmp_path / name
        path.write_text(json.dumps(doc))
        return str(path)

    return write


@pytest.fixture(scope="session")
def lm_docs_data(tmp_path_factory):
    """The repository's docs tokenized at vocabulary 512 (fusebox_tools.models.lm_data prepare), made once
    for every language-model test that reads it (read-only)."""
    pytest.importorskip("tokenizers", reason="the tokenizers package is missing (scripts/setup.sh installs it)")
    out = tmp_path_factory.mktemp("lm_docs") / "data"
    docs = sorted(os.path.join(REPO_ROOT, "docs", f) for f in os.listdir(os.path.join(REPO_ROOT, "docs"))
                  if f.endswith(".md"))
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO_ROOT, "python"))
    p = subprocess.run([sys.executable, "-m", "fusebox_tools.models.lm_data", "prepare", "--text", *docs, "--vocab",
                        "512", "--out", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    return out
