"""A graph no engine runs whole (two convolutions) through the CLI, deviceless:
`build` reports the partition and why it was cut (text and --json), and
`build --dot` draws one cluster per part with the temporary between them
(docs/cli.md, "build"; docs/architecture.md, "The partitioner")."""
import json
import os
import shutil
import subprocess

import pytest

from fusebox_tools.core.graph import REPO_ROOT

DEVPROP = os.path.join(REPO_ROOT, "devices", "h200-cudnn-9.27.devprop")
GRAPH = os.path.join(REPO_ROOT, "tests", "cases", "partitioned", "two_convs_one_graph.json")


def build(fusebox, *extra):
    return subprocess.run([fusebox, "build", GRAPH, "--device", DEVPROP, "--no-cache", *extra],
                          capture_output=True, text=True, timeout=300)


def test_build_reports_the_partition_and_the_cut(fusebox):
    p = build(fusebox)
    assert p.returncode == 0, p.stderr
    assert ("partitioned (no engine runs the whole graph): 2 parts: [conv_fprop 'conv1', bias_add 'bias1', "
            "relu 'act1'] | [conv_fprop 'conv2', bias_add 'bias2', relu 'act2']") in p.stdout
    assert "cut: [relu 'act1'] and [conv_fprop 'conv2'] have no engine together" in p.stdout


def test_build_json_lists_the_parts(fusebox):
    p = build(fusebox, "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    part = doc[0]["plan"]["partition"] if isinstance(doc, list) else doc["plan"]["partition"]
    assert [(x["first_op"], x["op_count"]) for x in part["parts"]] == [(0, 3), (3, 3)]
    assert part["temporary_bytes"] in (2 * 32 * 12 * 12 * 4, 2 * 32 * 12 * 12 * 2)  # fp32, else bf16
    assert len(part["cuts"]) == 1


def test_build_dot_draws_one_cluster_per_part(fusebox, tmp_path):
    out = tmp_path / "g.dot"
    p = build(fusebox, "--dot", str(out))
    assert p.returncode == 0, p.stderr
    text = out.read_text()
    assert "subgraph cluster_part0" in text and "subgraph cluster_part1" in text
    assert "cluster_plan" not in text
    assert "temporary between parts (in the workspace)" in text
    if shutil.which("dot"):
        r = subprocess.run(["dot", "-Tsvg", str(out)], capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr


def test_no_partition_when_the_whole_graph_has_an_engine(fusebox):
    g = os.path.join(REPO_ROOT, "examples", "graphs", "small", "conv_bias_relu_small.json")
    p = subprocess.run([fusebox, "build", g, "--device", DEVPROP, "--no-cache"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    assert "partitioned" not in p.stdout
