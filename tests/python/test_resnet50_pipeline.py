"""ResNet-50 as a fusebox pipeline (fusebox_tools.models.resnet50, docs/models.md):
generated at batch 2 into a temporary folder, then

* the wiring as `fusebox pipeline check --json` reads it: 56 stages (53
  convolutions, 2 pools, the fc), torchvision's shapes per buffer, bf16 NHWC;
* the batch-norm folding: folded conv == conv then batch norm, on random data
  and on the generated files;
* the pipeline's files run in numpy (conv, bias, add, relu, pools, read from
  the JSON and .npy the generator wrote) == the unfolded network from the
  torchvision-named state dict;
* the deviceless build for the H200 (`pipeline build --keep-going`): every
  conv+bias(+relu) stage builds; the ones cuDNN 9.19 refuses without a GPU
  (conv+bias+add+relu, the pools) fail cleanly with NotSupported.

Needs numpy and the fusebox binary; a few seconds."""
import json
import os
import subprocess

import numpy as np
import pytest

from fusebox_tools.models import resnet50 as rn
from fusebox_tools.core.graph import REPO_ROOT

DEVPROP = os.path.join(REPO_ROOT, "devices", "h200-cudnn-9.27.devprop")
BATCH = 2


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    out = tmp_path_factory.mktemp("resnet50")
    path = rn.write_resnet50(str(out), batch=BATCH, seed=7)
    return path


@pytest.fixture(scope="module")
def checked(model, fusebox):
    proc = subprocess.run([fusebox, "pipeline", "check", model, "--json"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"]
    return doc


def test_architecture_counts():
    convs, stem_hw, final_hw = rn.architecture()
    assert len(convs) == 53 and stem_hw == 112 and final_hw == 7
    kinds = [c.kind for c in convs]
    assert kinds.count("conv_bias_add_relu") == 16 and kinds.count("conv_bias") == 4
    shapes = dict(rn.state_dict_shapes())
    assert len(shapes) == 320  # torchvision resnet50().state_dict()
    assert shapes["conv1.weight"] == (64, 3, 7, 7)
    assert shapes["layer2.0.downsample.0.weight"] == (512, 256, 1, 1)
    assert shapes["layer4.2.conv2.weight"] == (512, 512, 3, 3)
    assert shapes["fc.weight"] == (1000, 2048)
    params = sum(int(np.prod(s)) for k, s in shapes.items()
                 if not k.endswith(("running_mean", "running_var", "num_batches_tracked")))
    assert params == 25_557_032  # torchvision's count for resnet50


def test_pipeline_check_wiring(checked):
    stages = [s["name"] for s in checked["stages"]]
    assert len(stages) == 56
    assert stages[:3] == ["conv1", "maxpool", "layer1.0.conv1"] and stages[-2:] == ["avgpool", "fc"]
    conv_stages = [s for s in checked["stages"] if "w" in s["bind"]]
    assert len(conv_stages) == 54  # 53 convolutions + the fc (a 1x1 conv)
    bufs = {b["name"]: b for b in checked["buffers"]}
    expect = {
        "image": [BATCH, 3, 224, 224], "stem": [BATCH, 64, 112, 112], "pool": [BATCH, 64, 56, 56],
        "layer1.2": [BATCH, 256, 56, 56], "layer2.3": [BATCH, 512, 28, 28], "layer3.5": [BATCH, 1024, 14, 14],
        "layer4.2": [BATCH, 2048, 7, 7], "avgpool": [BATCH, 1, 2048], "logits": [BATCH, 1000, 1, 1],
        "layer2.0.a2": [BATCH, 128, 28, 28], "layer2.0.down": [BATCH, 512, 28, 28],
        "conv1.w": [64, 3, 7, 7], "fc.w": [1000, 2048, 1, 1], "fc.b": [1, 1000, 1, 1],
    }
    for name, dims in expect.items():
        assert bufs[name]["dims"] == dims, name
    for b in checked["buffers"]:
        assert b["dtype"] == "bf16", b["name"]
        if b["kind"] != "constant" and len(b["dims"]) == 4 and b["dims"][2] > 1:  # activations NHWC
            assert b["strides"][1] == 1, b["name"]
    assert [b["name"] for b in checked["buffers"] if b["kind"] == "input"] == ["image"]
    assert [b["name"] for b in checked["buffers"] if b["kind"] == "output"] == ["logits"]
    assert sum(b["kind"] == "constant" for b in checked["buffers"]) == 2 * 54 + 1  # + avgpool.ones
    # The residual: conv3 of a first bottleneck adds the downsample branch, later ones the block input.
    by_stage = {s["name"]: s["bind"] for s in checked["stages"]}
    assert by_stage["layer3.0.conv3"]["r"] == "layer3.0.down" and by_stage["layer3.0.conv3"]["y"] == "layer3.0"
    assert by_stage["layer3.1.conv3"]["r"] == "layer3.0" and by_stage["layer3.1.conv1"]["x"] == "layer3.0"
    # The average pool as a GEMM over the last block's memory: reshape buffers on both sides.
    assert by_stage["avgpool"] == {"ones": "avgpool.ones", "x": "layer4.2", "y": "avgpool"}
    gap = next(s for s in checked["stages"] if s["name"] == "avgpool")
    assert os.path.basename(gap["graph_file"]) == f"gap_matmul_2048_7_n{BATCH}.json"
    assert bufs["layer3.0"]["writer"]["stage"] == "layer3.0.conv3"
    assert sorted(r["stage"] for r in bufs["layer3.0"]["readers"]) == ["layer3.1.conv1", "layer3.1.conv3"]
    # FLOPs: torchvision's ResNet-50 is 4.09 GMACs per 224x224 image.
    assert 8.0e9 * BATCH < checked["flops"] < 8.4e9 * BATCH


def test_graphs_deduplicated(model, checked):
    files = {s["graph_file"] for s in checked["stages"]}
    assert len(files) == 27
    assert sorted(os.listdir(os.path.join(os.path.dirname(model), "graphs"))) == sorted(
        os.path.basename(f) for f in files)


def test_fold_bn_equals_conv_then_bn():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 5, 7, 7))
    w = rng.standard_normal((6, 5, 3, 3))
    gamma, beta = rng.uniform(0.5, 1.5, 6), rng.normal(0, 0.3, 6)
    mean, var = rng.normal(0, 0.5, 6), rng.uniform(0.2, 3.0, 6)
    sd = {"bn.weight": gamma, "bn.bias": beta, "bn.running_mean": mean, "bn.running_var": var}
    want = rn.batch_norm(rn.conv2d(x, w, 2, 1), sd, "bn")
    wf, bf = rn.fold_bn(w, gamma, beta, mean, var)
    got = rn.conv2d(x, wf, 2, 1) + bf.reshape(1, -1, 1, 1)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_generated_weights_are_folded(model):
    folder = os.path.dirname(model)
    sd = dict(np.load(os.path.join(folder, rn.STATE_DICT_FILE)))
    assert sd["layer1.0.bn1.num_batches_tracked"].dtype == np.int64
    assert np.all(sd["layer2.0.bn2.running_var"] > 0)
    rng = np.random.default_rng(4)
    for stage, weight, bn, stride, pad, cin in (("layer2.0.conv2", "layer2.0.conv2.weight", "layer2.0.bn2", 2, 1, 128),
                                                ("layer3.0.downsample", "layer3.0.downsample.0.weight",
                                                 "layer3.0.downsample.1", 2, 0, 512)):
        x = rng.standard_normal((1, cin, 6, 6)).astype(np.float64)
        want = rn.batch_norm(rn.conv2d(x, sd[weight].astype(np.float64), stride, pad),
                             {k: v.astype(np.float64) for k, v in sd.items() if k.startswith(bn)}, bn)
        w = np.load(os.path.join(folder, "weights", f"{stage}.w.npy")).astype(np.float64)
        b = np.load(os.path.join(folder, "weights", f"{stage}.b.npy")).astype(np.float64)
        got = rn.conv2d(x, w, stride, pad) + b
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_pipeline_files_compute_the_unfolded_network(model, checked):
    folder = os.path.dirname(model)
    sd = dict(np.load(os.path.join(folder, rn.STATE_DICT_FILE)))
    x = np.random.default_rng(5).standard_normal((BATCH, 3, 224, 224)).astype(np.float32)
    want = rn.forward(sd, x)
    vals = rn.run_pipeline_numpy(model, {"image": x}, [s["name"] for s in checked["stages"]])
    got = vals["logits"].reshape(BATCH, -1)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-4
    # Activations stay O(1) through the 50 layers; the logits have a spread.
    for buf in ("stem", "layer1.2", "layer2.3", "layer3.5", "layer4.2", "avgpool"):
        rms = float(np.sqrt(np.mean(vals[buf] ** 2)))
        assert 0.1 < rms < 10, (buf, rms)
    assert 1 < float(want.std(axis=1).mean()) < 20


def test_gap_as_pool_or_gemm_computes_the_same(model, tmp_path):
    """gap="pool" (cuDNN's resample) and the default GEMM over reshape views
    give the same logits in the numpy run of their files; the views are the
    NHWC memory (a transposed reading would not match)."""
    pool = rn.write_resnet50(str(tmp_path), batch=BATCH, seed=7, gap="pool")
    with open(pool) as f:
        doc = json.load(f)
    assert "avgpool.ones" not in doc["buffers"] and "reshape" not in doc["buffers"]["layer4.2"]
    x = np.random.default_rng(6).standard_normal((BATCH, 3, 224, 224)).astype(np.float32)
    a = rn.run_pipeline_numpy(model, {"image": x})
    b = rn.run_pipeline_numpy(pool, {"image": x})
    assert a["avgpool"].shape == (BATCH, 1, 2048) and b["avgpool"].shape == (BATCH, 2048, 1, 1)
    np.testing.assert_allclose(a["avgpool"].reshape(BATCH, -1), b["avgpool"].reshape(BATCH, -1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a["logits"], b["logits"], rtol=1e-4, atol=1e-4)
    want = b["layer4.2"].mean(axis=(2, 3))
    np.testing.assert_allclose(a["avgpool"].reshape(BATCH, -1), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="gap must be one of matmul, pool"):
        rn.build(batch=1, gap="mean")


def test_numpy_views_follow_memory_order():
    v = np.arange(2 * 3 * 2 * 2, dtype=np.float32).reshape(2, 3, 2, 2)  # NCHW logical, NHWC memory
    flat = rn._to_memory(v, "nhwc")
    assert list(flat[:4]) == [v[0, 0, 0, 0], v[0, 1, 0, 0], v[0, 2, 0, 0], v[0, 0, 0, 1]]
    rows = rn._from_memory(flat, ["N", 4, 3], None)  # [N, H*W, C]
    np.testing.assert_array_equal(rows, v.transpose(0, 2, 3, 1).reshape(2, 4, 3))
    np.testing.assert_array_equal(rn._from_memory(flat, [2, 3, 2, 2], "nhwc"), v)


def test_generator_refuses_a_foreign_folder(tmp_path):
    (tmp_path / "mine.txt").write_text("not the generator's")
    with pytest.raises(FileExistsError, match="not made by make_resnet50_pipeline"):
        rn.write_resnet50(str(tmp_path), batch=1)
    assert (tmp_path / "mine.txt").read_text() == "not the generator's"


def test_symbolic_batch(fusebox, tmp_path):
    pipeline, graphs, _ = rn.build(batch=4, max_batch=32)
    g = graphs["graphs/cbar_64to256_k1s1_56_n4.json"]
    assert g["symbols"] == {"N": {"min": 1, "max": 32, "default": 4}}
    assert g["tensors"][0]["dims"] == ["N", 64, 56, 56]
    path = tmp_path / "cbar.json"
    path.write_text(json.dumps(g))
    for shape, dim in ((None, 4), ("N=17", 17)):
        cmd = [fusebox, "check", str(path), "--json"] + (["--shape", shape] if shape else [])
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        y = next(t for t in doc["tensors"] if t["name"] == "y")
        assert y["dims"] == [dim, 256, 56, 56]


def test_deviceless_build(model, fusebox):
    """`pipeline build --device --keep-going` for the H200: every conv+bias(+relu)
    stage builds (38 of 56); the ones cuDNN 9.19 refuses without a GPU
    (conv+bias+add+relu, the pools) fail cleanly with NotSupported."""
    proc = subprocess.run([fusebox, "pipeline", "build", model, "--device", DEVPROP, "--no-cache", "--keep-going",
                           "--json"], capture_output=True, text=True, timeout=300)
    doc = json.loads(proc.stdout)
    stages = doc["stages"]
    assert len(stages) == 56 and doc["target"]["deviceless"]
    refused = [s for s in stages if not s["ok"]]
    for s in refused:
        assert s["code"] == "NotSupported", (s["stage"], s.get("error"))
        assert os.path.basename(s["graph_file"]).startswith(("cbar_", "max_pool", "gap_matmul")), s["stage"]
    built = [s["stage"] for s in stages if s["ok"]]
    assert len(built) >= 38 and "conv1" in built and "fc" in built and "layer4.0.downsample" in built
    if refused:
        assert proc.returncode == 1 and not doc["ok"] and doc["code"] == "NotSupported"
        assert f"{len(refused)} of 56 stages failed to build" in doc["error"]
    else:  # a cuDNN that builds them all deviceless
        assert proc.returncode == 0 and doc["ok"]


def test_check_helpers_without_torch():
    """resnet50_check imports torch only to compute: its bf16 rounding and
    comparison are plain numpy."""
    from fusebox_tools.models import resnet50_check as chk
    x = np.array([1.0, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 1.0 + 2.0 ** -9, -3.14159265], np.float32)
    # bf16 keeps 8 significant bits: 1 + 2^-8 is a tie (to even: 1), 1 + 3*2^-8 ties up to 1 + 2^-6.
    np.testing.assert_array_equal(chk.round_bf16(x), np.array([1.0, 1.0, 1.0 + 2.0 ** -6, 1.0, -3.140625],
                                                              np.float32))
    ref = np.array([[0.0, 2.0, 1.0], [3.0, 0.0, 1.0]])
    c = chk.compare(ref + np.array([[0.0, 0.0, 0.5], [0.0, 0.0, 0.0]]), ref)
    assert c["top1_agree"] == 2 and c["n"] == 2
    assert abs(c["rel_l2"] - 0.5 / np.sqrt(15)) < 1e-12 and c["max_rel_to_max_ref"] == 0.5 / 3


def test_numpy_run_with_fewer_images_than_the_batch(model):
    """resnet50_check runs the numpy model on the first few images of a larger
    batch: the reshape views take the batch from the values."""
    x = np.random.default_rng(8).standard_normal((1, 3, 224, 224)).astype(np.float32)
    vals = rn.run_pipeline_numpy(model, {"image": x})
    assert vals["avgpool"].shape == (1, 1, 2048) and vals["logits"].shape == (1, 1000, 1, 1)
    np.testing.assert_allclose(vals["avgpool"].reshape(1, -1), vals["layer4.2"].mean(axis=(2, 3)), rtol=1e-5, atol=1e-6)
