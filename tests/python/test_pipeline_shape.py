"""Symbolic pipelines (docs/pipeline-format.md, "Symbolic stages"): `--shape`
gives a symbol one value in every stage that declares it; buffers follow; a
value out of range, an unknown symbol or a shape for a static pipeline is one
error naming the pipeline (exit 2); deviceless builds at two shapes."""
import json
import os
import subprocess

import pytest

DEVPROP = "devices/h200-cudnn-9.27.devprop"


def run(fusebox, repo_root, *args):
    p = subprocess.run([fusebox, *args], capture_output=True, text=True, timeout=120, cwd=repo_root)
    assert p.returncode >= 0, f"killed by signal {-p.returncode}"
    return p


def test_shape_flows_through_every_stage(fusebox, repo_root):
    for n in (1, 5, 8):
        p = run(fusebox, repo_root, "pipeline", "check", "examples/pipelines/two_convs_dyn.json", "--shape", f"N={n}",
                "--json")
        assert p.returncode == 0, p.stderr
        d = json.loads(p.stdout)
        assert d["shape"] == {"N": n}
        dims = {b["name"]: b["dims"] for b in d["buffers"]}
        assert dims["image"] == [n, 8, 10, 10] and dims["hidden"] == [n, 16, 5, 5] and dims["out"] == [n, 16, 5, 5]
        assert dims["w2"] == [16, 16, 3, 3]  # constants keep their dims
    # no --shape: the graphs' defaults; a static pipeline reports {}
    d = json.loads(run(fusebox, repo_root, "pipeline", "check", "examples/pipelines/two_convs_dyn.json",
                       "--json").stdout)
    assert d["shape"] == {"N": 2}
    d = json.loads(run(fusebox, repo_root, "pipeline", "check", "examples/pipelines/two_convs.json", "--json").stdout)
    assert d["shape"] == {}
    text = run(fusebox, repo_root, "pipeline", "check", "examples/pipelines/two_convs_dyn.json", "--shape", "N=3").stdout
    assert "symbolic, at shape N=3" in text


@pytest.mark.parametrize("args,error", [
    (["examples/pipelines/two_convs_dyn.json", "--shape", "N=9"],
     r"pipeline 'two_convs_dyn': stage 'conv1' .*symbol 'N' \(dim 0 of 'x'\) = 9 is outside its range \[1, 8\]"),
    (["examples/pipelines/two_convs_dyn.json", "--shape", "B=2"],
     r"pipeline 'two_convs_dyn': unknown symbol 'B': the stages' graphs declare N"),
    (["examples/pipelines/two_convs.json", "--shape", "N=2"],
     r"pipeline 'two_convs': --shape N=2: no stage's graph declares symbols"),
    (["examples/pipelines/two_convs_dyn.json", "--shape", "N"], r"--shape: .*NAME=VALUE"),
])
def test_bad_shapes_are_one_error(fusebox, repo_root, args, error):
    import re
    for sub in ("check", "build"):
        p = run(fusebox, repo_root, "pipeline", sub, *args, *(["--device", DEVPROP] if sub == "build" else []))
        assert p.returncode == 2, (sub, p.returncode, p.stderr)
        assert re.search(error, p.stderr), p.stderr


def test_defaults_that_disagree_need_a_value(fusebox, repo_root, tmp_path):
    """Two stages whose graphs default N differently: the loader does not guess."""
    src = json.load(open(os.path.join(repo_root, "examples/pipelines/graphs/conv_bias_relu_16to16_dyn_small.json")))
    src["symbols"]["N"]["default"] = 3
    (tmp_path / "g2.json").write_text(json.dumps(src))
    p = json.load(open(os.path.join(repo_root, "examples/pipelines/two_convs_dyn.json")))
    p["graphs"] = {"conv1": os.path.join(repo_root, "examples/graphs/small/conv_bias_relu_dyn_small.json"),
                   "conv2": str(tmp_path / "g2.json")}
    for k, b in p["buffers"].items():
        if "file" in b:
            b["file"] = os.path.join(repo_root, "examples/pipelines", b["file"])
    (tmp_path / "p.json").write_text(json.dumps(p))
    r = run(fusebox, repo_root, "pipeline", "check", str(tmp_path / "p.json"))
    assert r.returncode == 2 and "symbol 'N' is 3 here but 2 in an earlier stage" in r.stderr, r.stderr
    r = run(fusebox, repo_root, "pipeline", "check", str(tmp_path / "p.json"), "--shape", "N=4")
    assert r.returncode == 0, r.stderr


def test_deviceless_build_at_two_shapes_shares_one_cache(fusebox, repo_root, tmp_path):
    cache = str(tmp_path / "c.sqlite")
    for n in (3, 6):
        p = run(fusebox, repo_root, "pipeline", "build", "examples/pipelines/two_convs_dyn.json", "--shape", f"N={n}",
                "--device", DEVPROP, "--cache", cache, "--json")
        assert p.returncode == 0, p.stderr
        d = json.loads(p.stdout)
        assert all(s["ok"] and s["engine"] for s in d["stages"])
    p = run(fusebox, repo_root, "cache", "ls", "--cache", cache, "--json")
    assert p.returncode == 0 and len(json.loads(p.stdout)["entries"]) == 4  # 2 stages x 2 shapes


@pytest.mark.parametrize("args,error", [
    (["examples/pipelines/two_convs.json", "--devices", "0,1"],
     r"pipeline 'two_convs' declares no symbols: a data-parallel run splits a symbolic batch"),
    (["examples/pipelines/two_convs_dyn.json", "--devices", "0,one"], r"--devices '0,one': 'one' is not a device id"),
    (["examples/pipelines/two_convs_dyn.json", "--devices", "0,1", "--shape", "N=1"],
     r"pipeline 'two_convs_dyn': N=1: a batch of 1 cannot be split over 2 devices"),
    (["examples/pipelines/two_convs_dyn.json", "--devices", "0,1", "--batch-symbol", "M"],
     r"pipeline 'two_convs_dyn' has no symbol 'M' to split; its symbols: N=2"),
    (["examples/pipelines/two_convs_dyn.json", "--batch-symbol", "N"], r"--batch-symbol goes with --devices"),
    (["examples/pipelines/two_convs_dyn.json", "--devices", "0,1", "--save-outputs", "examples/pipelines/two_convs.json"],
     r"--save-outputs 'examples/pipelines/two_convs.json' exists and is not a directory"),
])
def test_bad_data_parallel_runs_are_one_error_before_any_gpu_work(fusebox, repo_root, args, error):
    """pipeline run --devices: what cannot be split is refused before a session is made (exit 2, also on
    a machine without a GPU)."""
    import re
    p = run(fusebox, repo_root, "pipeline", "run", *args, "--no-cache")
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert re.search(error, p.stderr), p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_startup_checks_every_file_before_any_gpu_work(fusebox, repo_root):
    """pipeline startup A B: a bad second file is one error (exit 2) before a session is made."""
    p = run(fusebox, repo_root, "pipeline", "startup", "examples/pipelines/two_convs.json",
            "examples/pipelines/missing.json", "--no-cache")
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "missing.json" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
