"""resnet50_check --images N (issue 14: top-1 agreement on 256 images) without
a GPU: the verdict on synthetic logits, and the batching through a stub
`fusebox pipeline run` (a script writing logits from the image) with torch's
side stubbed too."""
import json
import os
import stat
import sys

import numpy as np
import pytest

from fusebox_tools.models import resnet50_check as rc

FAKE = """#!{python}
import json, os, sys
import numpy as np
a = sys.argv[1:]
assert a[:2] == ["pipeline", "run"], a
image = np.load(a[a.index("--input") + 1].split("=", 1)[1])
out = a[a.index("--save-outputs") + 1]
os.makedirs(out)
log = os.environ["FAKE_LOG"]
with open(log, "a") as f:
    f.write(json.dumps({{"batch": int(image.shape[0]), "verify": "--verify" in a}}) + "\\n")
logits = image.reshape(image.shape[0], -1)[:, :1000].astype(np.float32) * 3
flip = int(os.environ.get("FAKE_FLIP", "0"))
if flip:  # move the top class of every image
    idx = np.arange(image.shape[0])
    logits[idx, (logits.argmax(1) + 1) % 1000] = logits.max(1) + 1
np.save(os.path.join(out, "logits.npy"), logits.reshape(image.shape[0], 1000, 1, 1))
print(json.dumps({{"ok": True, "verified": "--verify" in a}}))
"""


def logits_of(images):
    return images.reshape(len(images), -1)[:, :1000].astype(np.float64) * 3


@pytest.fixture
def fake_fusebox(tmp_path, monkeypatch):
    path = tmp_path / "fusebox"
    path.write_text(FAKE.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "calls.log"))

    def torch_logits(sd_file, images, chunk, results):
        assert os.path.isfile(sd_file)
        results["torch_model"] = "stub"
        ref = logits_of(images)
        return ref, ref + np.random.default_rng(0).normal(0, 1e-3, ref.shape)

    monkeypatch.setattr(rc, "torch_logits", torch_logits)
    return str(path)


def calls(tmp_path):
    return [json.loads(line) for line in open(tmp_path / "calls.log")]


def test_images_batches_and_pass(fake_fusebox, tmp_path, capsys):
    out = str(tmp_path / "rn50")
    js = str(tmp_path / "r.json")
    rcode = rc.main(["--fusebox", fake_fusebox, "--out", out, "--images", "5", "--batch", "2", "--json-out", js])
    doc = json.load(open(js))
    assert rcode == 0 and doc["ok"], capsys.readouterr().out
    # three runs of the batch-2 pipeline (the last filled up with a copy), --verify on the first only
    assert calls(tmp_path) == [{"batch": 2, "verify": True}, {"batch": 2, "verify": False},
                               {"batch": 2, "verify": False}]
    assert [r["images"] for r in doc["runs"]] == [[0, 2], [2, 4], [4, 5]]
    assert doc["fusebox_vs_fp32"]["n"] == 5 and doc["fusebox_vs_fp32"]["top1_agree"] == 5
    assert doc["fusebox_vs_fp32"]["rel_l2"] < 1e-6 and doc["top1_needed"] == 5
    assert "resnet50_check: PASS" in capsys.readouterr().out
    assert not os.path.exists(os.path.join(out, "run_images"))  # the saved buffers are removed


def test_images_top1_failure(fake_fusebox, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_FLIP", "1")
    js = str(tmp_path / "r.json")
    assert rc.main(["--fusebox", fake_fusebox, "--out", str(tmp_path / "rn50"), "--images", "3", "--batch", "3",
                    "--no-verify", "--json-out", js]) == 1
    doc = json.load(open(js))
    assert not doc["ok"] and not doc["top1_ok"] and doc["fusebox_vs_fp32"]["top1_agree"] == 0
    assert len(doc["fusebox_disagreements"]) == 3 and calls(tmp_path) == [{"batch": 3, "verify": False}]


def test_images_verdict_thresholds():
    rng = np.random.default_rng(3)
    ref = rng.normal(size=(256, 1000))
    second = np.argsort(ref, axis=1)[:, -2]
    for i in range(3):  # near ties in the first three images: the ones bf16 may flip
        ref[i, second[i]] = ref[i].max() - 0.01
    fb = ref + rng.normal(0, 1e-3, ref.shape)
    v = rc.images_verdict(fb, ref, ref.copy(), 0.99)
    assert v["ok"] and v["top1_needed"] == 254 and v["fusebox_vs_fp32"]["top1_agree"] == 256
    # two images off: 254/256 = 99.2% still passes, three do not
    for wrong, ok in ((2, True), (3, False)):
        bad = fb.copy()
        for i in range(wrong):
            bad[i, second[i]] = ref[i].max() + 0.01
        v = rc.images_verdict(bad, ref, None, 0.99)
        assert v["ok"] == ok and v["fusebox_vs_fp32"]["top1_agree"] == 256 - wrong
        assert [d["image"] for d in v["fusebox_disagreements"]] == list(range(wrong))
        assert v["fusebox_disagreements"][0]["reference_top2_gap"] == pytest.approx(0.01)
    # logits far off but the classes right: the tolerance fails
    v = rc.images_verdict(ref * 1.2, ref, None, 0.99)
    assert v["top1_ok"] and not v["within_tolerance"] and not v["ok"]
    assert not rc.images_verdict(None, ref, ref, 0.99)["ok"]
    json.dumps(rc.images_verdict(fb, ref, ref, 0.99))


def test_images_bad_arguments(tmp_path, fake_fusebox):
    assert rc.main(["--fusebox", fake_fusebox, "--out", str(tmp_path / "x"), "--images", "-1"]) == 2
    assert rc.main(["--fusebox", fake_fusebox, "--out", str(tmp_path / "x"), "--images", "4", "--batch", "0"]) == 2


def test_prototype_head_picks_the_nearest_prototype():
    rng = np.random.default_rng(3)
    feats = 0.7 + 0.1 * rng.standard_normal((6, 32))  # a large common part, as pooled ReLU features have
    w, b = rc.prototype_head(feats, classes=10)
    assert w.shape == (10, 32) and b.shape == (10,) and w.dtype == np.float32
    noisy = feats + 0.02 * rng.standard_normal(feats.shape)
    logits = noisy @ w.T.astype(np.float64) + b
    assert list(logits.argmax(1)) == list(range(6))
    assert np.all(logits[:, 6:] == -100)  # classes without a prototype never win
    with pytest.raises(ValueError):
        rc.prototype_head(feats[:1], classes=10)
    with pytest.raises(ValueError):
        rc.prototype_head(np.ones((3, 4)), classes=10)


def test_images_prototype_head(fake_fusebox, tmp_path, monkeypatch, capsys):
    # torch's backbone stubbed: features from the image's first pixels (distinct per prototype).
    monkeypatch.setattr(rc, "prototype_features",
                        lambda sd, images: images.reshape(len(images), -1)[:, :2048].astype(np.float64))
    js = str(tmp_path / "r.json")
    rcode = rc.main(["--fusebox", fake_fusebox, "--out", str(tmp_path / "rn50"), "--images", "4", "--batch", "2",
                     "--head", "prototypes", "--prototypes", "8", "--noise", "0.3", "--json-out", js])
    doc = json.load(open(js))
    out = capsys.readouterr().out
    assert rcode == 0 and doc["ok"], out
    assert doc["head"] == "prototypes" and doc["prototypes"] == 8 and len(doc["classes"]) == 4
    assert all(0 <= c < 8 for c in doc["classes"])
    assert doc["tolerance"]["rel_l2"] is None  # centred logits: reported, not judged
    assert "--head prototypes" in out and "float32 puts" in out
    sd = np.load(str(tmp_path / "rn50" / "resnet50_state_dict.npz"))
    assert np.all(sd["fc.bias"][8:] == -100)  # the pipeline's weights carry the head


def test_images_prototype_head_refuses_bad_options(fake_fusebox, tmp_path):
    for bad in (["--prototypes", "1"], ["--prototypes", "1001"], ["--noise", "1.0"]):
        assert rc.main(["--fusebox", fake_fusebox, "--out", str(tmp_path / "x"), "--images", "2",
                        "--head", "prototypes", *bad]) == 2
