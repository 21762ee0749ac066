"""Pipeline constants from safetensors files (docs/pipeline-format.md): the
example two_convs_st reads its weights from one checkpoint; every hostile file
is one clear error (exit 2) before any GPU work, never a crash."""
import json
import os
import shutil
import struct
import subprocess

import numpy as np
import pytest

from fusebox_tools.core import safetensors_np

GPU = os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")


def run(fusebox, *args):
    p = subprocess.run([fusebox, *args], capture_output=True, text=True, timeout=120)
    assert p.returncode >= 0, f"killed by signal {-p.returncode}: {p.stderr[-400:]}"
    return p


@pytest.fixture
def st_pipeline(tmp_path, repo_root):
    """two_convs_st copied into tmp_path with its graphs, so its weights file can be replaced."""
    ex = os.path.join(repo_root, "examples", "pipelines")
    doc = json.load(open(os.path.join(ex, "two_convs_st.json")))
    for stage, g in doc["graphs"].items():
        doc["graphs"][stage] = os.path.normpath(os.path.join(ex, g))
    (tmp_path / "weights").mkdir()
    shutil.copy(os.path.join(ex, "weights", "two_convs.safetensors"), tmp_path / "weights")

    def write(buffers=None, weights=None):
        d = json.loads(json.dumps(doc))
        d["buffers"].update(buffers or {})
        if weights is not None:
            with open(tmp_path / "weights" / "two_convs.safetensors", "wb") as f:
                f.write(weights)
        path = tmp_path / "p.json"
        path.write_text(json.dumps(d))
        return str(path)
    return write


def test_example_reads_the_checkpoint_names(fusebox, repo_root):
    path = os.path.join(repo_root, "examples", "pipelines", "two_convs_st.json")
    p = run(fusebox, "pipeline", "check", path, "--json")
    assert p.returncode == 0, p.stderr
    b = {x["name"]: x for x in json.loads(p.stdout)["buffers"]}
    assert b["w1"]["file"] == "weights/two_convs.safetensors" and b["w1"]["key"] == "conv1.weight"
    assert b["b2"]["key"] == "conv2.bias" and b["image"]["key"] is None
    # the checkpoint's biases are 1-D; the graph's are [1, 16, 1, 1]
    w = os.path.join(repo_root, "examples", "pipelines", "weights", "two_convs.safetensors")
    assert safetensors_np.read(w, "conv1.bias").shape == (16,) and b["b1"]["dims"] == [1, 16, 1, 1]
    # the same values as two_convs' .npy files, up to bf16 rounding of conv1's weight
    npy = np.load(os.path.join(repo_root, "examples", "pipelines", "weights", "two_convs_w2.npy"))
    assert np.array_equal(safetensors_np.read(w, "conv2.weight"), npy)


@pytest.mark.skipif(GPU, reason="this machine has a GPU: the no-GPU path is not reached")
def test_valid_checkpoint_loads_before_the_gpu_is_needed(fusebox, st_pipeline):
    p = run(fusebox, "pipeline", "run", st_pipeline(), "--no-cache")
    assert p.returncode == 1 and "NoDevice" in p.stderr, p.stderr  # weights read and checked first


def _file(header, data=b"", n=None):
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text) if n is None else n) + text + data


BAD = [
    ("missing key", {"w1": {"kind": "constant", "file": "weights/two_convs.safetensors", "key": "conv9.weight"}},
     None, r"no tensor named 'conv9.weight' \(the file holds 4 tensors"),
    ("wrong shape", {"w1": {"kind": "constant", "file": "weights/two_convs.safetensors", "key": "conv2.weight"}},
     None, r"shape \[16, 16, 3, 3\] does not match tensor 'w1' dims \[16, 8, 3, 3\]"),
    ("key on a .npy", {"w1": {"kind": "constant", "file": "weights/x.npy", "key": "a"}},
     None, r"'key' names a tensor in a .safetensors file"),
    ("key on an input", {"image": {"kind": "input", "key": "a"}}, None, r"only a constant takes 'file' and 'key'"),
    ("header over the limit", None, struct.pack("<Q", 1 << 40) + b"{}", r"header length 1099511627776 is over the limit"),
    ("truncated header", None, struct.pack("<Q", 4096) + b"{}", r"truncated safetensors file"),
    ("not JSON", None, _file({})[:8] + b"{not json", r"safetensors header is not a JSON object|truncated"),
    ("offsets past the end", None,
     _file({"conv1.weight": {"dtype": "F32", "shape": [16, 8, 3, 3], "data_offsets": [0, 4608]}}, b"\0" * 16),
     r"fall outside the file's 16 data bytes"),
    ("shape does not fill the offsets", None,
     _file({"conv1.weight": {"dtype": "F32", "shape": [16, 8, 3, 3], "data_offsets": [0, 8]}}, b"\0" * 8),
     r"does not fill data_offsets"),
    ("integer weights", None,
     _file({"conv1.weight": {"dtype": "I32", "shape": [16, 8, 3, 3], "data_offsets": [0, 4608]}}, b"\0" * 4608),
     r"I32 cannot feed tensor 'w1' of dtype bf16"),
    ("unknown dtype", None,
     _file({"conv1.weight": {"dtype": "U8", "shape": [16, 8, 3, 3], "data_offsets": [0, 1152]}}, b"\0" * 1152),
     r"dtype U8 is not read"),
    ("empty file", None, b"", r"shorter than its 8-byte header length"),
    # Issue #32 case 9: a deeply nested header was parsed whole (7.8 GB, 27 s for 100 MiB of it).
    ("deeply nested header", None,
     (lambda t: struct.pack("<Q", len(t)) + t)(b'{"__metadata__": ' + b"[" * 200000 + b"]" * 200000 +
                                               b', "conv1.weight": {"dtype": "F32", "shape": [16, 8, 3, 3], '
                                               b'"data_offsets": [0, 4608]}}') + b"\0" * 4608,
     r"safetensors header nests deeper than 8 levels"),
]


@pytest.mark.parametrize("name,buffers,weights,error", BAD, ids=[b[0] for b in BAD])
def test_hostile_checkpoint_is_one_clear_error(fusebox, st_pipeline, tmp_path, name, buffers, weights, error):
    import re
    (tmp_path / "weights" / "x.npy").write_bytes(b"")
    path = st_pipeline(buffers, weights)
    p = run(fusebox, "pipeline", "run", path, "--no-cache")
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert re.search(error, p.stderr), p.stderr
    assert "pipeline 'two_convs_st'" in p.stderr and p.stderr.count("\n") <= 2, p.stderr
