"""fusebox_tools.crosscheck.pipeline_crosscheck without torch: the pipeline as fusebox
reads it, which buffers feed which stage, the chain driven by a stand-in for
the torch stage, depths and tolerances, and where `pipeline run
--save-outputs` puts each buffer. Needs only the fusebox binary."""
import os

import numpy as np
import pytest

from fusebox_tools.crosscheck import pipeline_crosscheck as pc
from fusebox_tools.core.graph import FuseboxError, Graph


@pytest.fixture(scope="module")
def two_convs(repo_root):
    return os.path.join(repo_root, "examples", "pipelines", "two_convs.json")


@pytest.fixture(scope="module")
def conv10(repo_root):
    return os.path.join(repo_root, "examples", "pipelines", "conv10.json")


def test_load_two_convs(fusebox, two_convs):
    p = pc.Pipeline.load(two_convs, fusebox)
    assert p.name == "two_convs"
    assert [s["name"] for s in p.stages] == ["conv1", "conv2"]
    assert p.inputs() == ["image"] and p.outputs() == ["out"]
    assert p.written() == ["hidden", "out"]
    assert p.depths() == {"hidden": 1, "out": 2}
    files = p.constant_files()
    assert sorted(files) == ["b1", "b2", "w1", "w2"]
    assert all(os.path.isfile(f) for f in files.values())
    assert os.path.isfile(p.graph_path(p.stages[0]))


def test_conv10_is_ten_layers_deep(fusebox, conv10):
    p = pc.Pipeline.load(conv10, fusebox)
    assert [s["name"] for s in p.stages] == [f"conv{i}" for i in range(1, 11)]
    assert p.depths()["out"] == 10
    assert p.depths()["act3"] == 3
    # The weights: exact in fp16 and bf16 (multiples of 2^-10 below 2^-3).
    w = np.load(p.constant_files()["w1"])
    assert w.shape == (64, 64, 3, 3) and w.dtype == np.float16
    k = w.astype(np.float64) * 1024
    assert np.all(k == np.round(k)) and np.abs(k).max() <= 127 and np.abs(k).max() > 0


def test_saved_files(fusebox, two_convs, tmp_path):
    p = pc.Pipeline.load(two_convs, fusebox)
    files = pc.saved_files(p, str(tmp_path))
    assert files == {"image": str(tmp_path / "inputs" / "image.npy"), "hidden": str(tmp_path / "hidden.npy"),
                     "out": str(tmp_path / "out.npy")}


def test_chain_feeds_each_stage_its_buffers(fusebox, two_convs):
    p = pc.Pipeline.load(two_convs, fusebox)
    graphs = {s["name"]: Graph.load(p.graph_path(s), fusebox) for s in p.stages}
    seen = []

    def stage(st, graph, inputs):
        seen.append((st["name"], sorted(inputs)))
        # A stand-in for the torch stage: y = x + 1 (scalars as numbers).
        return {"y": inputs["x"] + 1}

    values = {"image": 0.25, "w1": None, "b1": None, "w2": None, "b2": None}
    rounded = []
    produced = pc.run_chain(p, graphs, values, stage,
                            round_to=lambda v, dt: rounded.append(dt) or v + 100)
    assert seen == [("conv1", ["b", "w", "x"]), ("conv2", ["b", "w", "x"])]
    # conv2 read hidden as rounded (1.25 + 100), and the unrounded values are returned.
    assert produced == {"hidden": 1.25, "out": 102.25}
    assert rounded == ["bf16", "bf16"]


def test_stage_inputs_and_tolerance(fusebox, two_convs):
    p = pc.Pipeline.load(two_convs, fusebox)
    graphs = {s["name"]: Graph.load(p.graph_path(s), fusebox) for s in p.stages}
    assert pc.stage_inputs(p.stages[1], graphs["conv2"]) == {"x": "hidden", "w": "w2", "b": "b2"}
    one = pc.tolerance(p, graphs, "out")
    two = pc.tolerance(p, graphs, "out", p.depths()["out"])
    assert one == graphs["conv2"].tolerance("y")
    assert two == (2 * one[0], 2 * one[1])
    assert pc.judge({"rel_l2": one[0], "max_abs_rel": one[1]}, one)
    assert not pc.judge({"rel_l2": one[0] * 1.01, "max_abs_rel": 0}, one)


def test_version_mismatch_is_refused():
    with pytest.raises(FuseboxError, match="version"):
        pc.Pipeline({"version": 99, "pipeline": "p", "stages": [], "buffers": []}, "p.json")


def test_bad_pipeline_is_an_error(fusebox, tmp_path):
    bad = tmp_path / "p.json"
    bad.write_text('{"name": "p"}')
    with pytest.raises(FuseboxError, match="missing field"):
        pc.Pipeline.load(str(bad), fusebox)


def test_views_read_their_part_of_the_parent(fusebox, repo_root):
    """split_convs: conv1 writes hidden [2, 16, 5, 5] (NHWC); the views hidden_0 and hidden_1 are its
    two halves in memory, here each one image, which the batch-1 stages read."""
    p = pc.Pipeline.load(os.path.join(repo_root, "examples", "pipelines", "split_convs.json"), fusebox)
    assert p.buffers["hidden_1"]["view"] == {"of": "hidden", "part": 1, "parts": 2, "offset_elements": 400}
    assert p.buffers["hidden"]["view"] is None and p.written() == ["hidden", "out_0", "out_1"]
    graphs = {s["name"]: Graph.load(p.graph_path(s), fusebox) for s in p.stages}
    hidden = np.arange(2 * 16 * 5 * 5, dtype=np.float32).reshape(2, 16, 5, 5)
    seen = {}

    def stage(st, graph, inputs):
        seen[st["name"]] = inputs["x"]
        return {"y": hidden if st["name"] == "conv1" else inputs["x"] * 2}

    produced = pc.run_chain(p, graphs, {"image": None, "w1": None, "b1": None, "w2": None, "b2": None}, stage)
    np.testing.assert_array_equal(seen["conv2a"], hidden[:1])
    np.testing.assert_array_equal(seen["conv2b"], hidden[1:])
    np.testing.assert_array_equal(produced["out_1"], hidden[1:] * 2)
    # A view of a row-major [2, 6] buffer in three parts: the middle four elements in memory order.
    fake = pc.Pipeline({"version": pc.CHECK_JSON_VERSION, "pipeline": "f", "stages": [], "buffers": [
        {"name": "m", "dims": [2, 6], "strides": [6, 1], "kind": "intermediate", "writer": None, "view": None},
        {"name": "v", "dims": [2, 2], "strides": [2, 1], "kind": "intermediate", "writer": None,
         "view": {"of": "m", "part": 1, "parts": 3, "offset_elements": 4}}]}, "f.json")
    m = np.arange(12.0).reshape(2, 6)
    np.testing.assert_array_equal(pc.buffer_value(fake, {"m": m}, "v"), [[4, 5], [6, 7]])
