"""`fusebox run --samples` (the benchmark's timing, docs/cli.md) where no GPU
is needed: the option is parsed and validated before any GPU work."""
import os
import subprocess

from fusebox_tools.core.graph import REPO_ROOT

GRAPH = os.path.join(REPO_ROOT, "examples", "graphs", "small", "conv_bias_relu_small.json")


def run(fusebox, *args):
    return subprocess.run([fusebox, "run", GRAPH, *args], capture_output=True, text=True, timeout=120)


def test_samples_needs_timed_runs(fusebox):
    p = run(fusebox, "--samples", "3", "--iters", "0")
    assert p.returncode == 2, p.stderr
    assert "--samples needs --iters >= 1" in p.stderr


def test_samples_must_not_be_negative(fusebox):
    p = run(fusebox, "--samples", "-1")
    assert p.returncode == 2 and "--samples" in p.stderr, p.stderr


def test_samples_in_help(fusebox):
    p = subprocess.run([fusebox, "run", "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "--samples" in p.stdout and "back-to-back" in p.stdout
