"""The language model's trainer and serving engine from Python (fusebox.LmTrainer, fusebox.LmEngine:
libfusebox.so's C API v6), on the reference backend: steps on the caller's own batches (numpy
arrays), the loss falls, a checkpoint resumes exactly, the engine serves the checkpoint and
agrees with the `fusebox serve lm` command, and bad input raises the module's exceptions."""
import os
import subprocess

import numpy as np
import pytest

import fusebox

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(REPO, "examples", "train", "lm_tiny.json")  # vocab 512, context 32, batch 4


def batches(step, n, seed=0):
    """Step `step`'s ids and labels: n tokens of a learnable stream (runs of a stride mod 512)."""
    rng = np.random.default_rng(seed + step)
    seqs = []
    for _ in range(n // 32):
        start, stride = rng.integers(0, 512), rng.integers(1, 4)
        seqs.append((start + stride * np.arange(33)) % 512)
    s = np.stack(seqs).astype(np.int32)
    return s[:, :-1].reshape(-1), s[:, 1:].reshape(-1)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("lm_py")
    t = fusebox.LmTrainer(CONFIG, work_dir=str(d / "work"), total_steps=12)
    assert t.tokens_per_step == 4 * 32
    losses = []
    for s in range(12):
        ids, labels = batches(s, t.tokens_per_step)
        r = t.step(ids, labels)
        assert r["step"] == s and r["tokens"] == 128 and not r["cuda_graph"]
        losses.append(r["loss"])
        if s == 5:
            t.save(str(d / "six.safetensors"))
    t.save(str(d / "ck.safetensors"))
    return d, losses


def test_the_loss_falls_and_a_resume_is_exact(trained):
    d, losses = trained
    assert abs(losses[0] - np.log(512)) < 0.1
    assert np.mean(losses[-3:]) < losses[0] - 0.15, losses
    u = fusebox.LmTrainer(CONFIG, work_dir=str(d / "work2"), total_steps=12)
    u.load(str(d / "six.safetensors"))
    assert u.steps_done == 6
    again = [u.step(*batches(s, u.tokens_per_step))["loss"] for s in range(6, 12)]
    assert again == losses[6:]


def test_the_engine_serves_the_checkpoint_as_the_command_does(trained):
    d, _ = trained
    e = fusebox.LmEngine(str(d / "ck.safetensors"), page_size=4, pool_pages=64, max_batch=4)
    prompts = [[1, 4, 7, 10, 13], [100, 102, 104], [1, 4, 7, 10, 13, 16, 19]]
    out = e.generate(prompts, max_new_tokens=6)
    assert [len(o) for o in out] == [6, 6, 6]
    assert out[0] == [16, 19, 22, 25, 28, 31] or len(set(out[0])) > 1  # learnt the stride, or at least not stuck
    exe = os.environ.get("FUSEBOX_BIN", os.path.join(REPO, "build", "fusebox"))
    p = subprocess.run([exe, "serve", "lm", "--model", str(d / "ck.safetensors"), "--prompt-ids", "1,4,7,10,13",
                        "--max-new", "6"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "".join(f"[{t}]" for t in [1, 4, 7, 10, 13] + out[0])
    assert e.idle
    # FP8 weights: the same tokens as the command with --weights fp8.
    f = fusebox.LmEngine(str(d / "ck.safetensors"), page_size=4, pool_pages=64, max_batch=4, weights="fp8")
    fp8 = f.generate(prompts[:1], max_new_tokens=6)[0]
    p = subprocess.run([exe, "serve", "lm", "--model", str(d / "ck.safetensors"), "--prompt-ids", "1,4,7,10,13",
                        "--max-new", "6", "--weights", "fp8"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "".join(f"[{t}]" for t in [1, 4, 7, 10, 13] + fp8)
    # The deterministic mode: the same tokens from Python and the command (--deterministic).
    g = fusebox.LmEngine(str(d / "ck.safetensors"), page_size=4, pool_pages=64, max_batch=4, deterministic=True)
    det = g.generate(prompts, max_new_tokens=6)
    p = subprocess.run([exe, "serve", "lm", "--model", str(d / "ck.safetensors"), "--prompt-ids", "1,4,7,10,13",
                        "--max-new", "6", "--deterministic"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "".join(f"[{t}]" for t in [1, 4, 7, 10, 13] + det[0])
    with pytest.raises(fusebox.InvalidArgument, match="deterministic mode takes bf16 weights"):
        fusebox.LmEngine(str(d / "ck.safetensors"), weights="fp8", deterministic=True)
    # An FP8 KV cache: the same tokens from Python and the command (--kv-cache fp8).
    k = fusebox.LmEngine(str(d / "ck.safetensors"), page_size=4, pool_pages=64, max_batch=4, kv_cache="fp8")
    kv8 = k.generate(prompts[:1], max_new_tokens=6)[0]
    p = subprocess.run([exe, "serve", "lm", "--model", str(d / "ck.safetensors"), "--prompt-ids", "1,4,7,10,13",
                        "--max-new", "6", "--kv-cache", "fp8"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "".join(f"[{t}]" for t in [1, 4, 7, 10, 13] + kv8)
    with pytest.raises(fusebox.InvalidArgument, match="kv_cache 'fp4'"):
        fusebox.LmEngine(str(d / "ck.safetensors"), kv_cache="fp4")


def test_bad_input_raises(trained, tmp_path):
    d, _ = trained
    t = fusebox.LmTrainer(CONFIG, work_dir=str(tmp_path / "w"), total_steps=3)
    with pytest.raises(fusebox.InvalidArgument, match="accum x batch x context"):
        t.step([1, 2, 3], [2, 3, 4])
    ids, labels = batches(0, t.tokens_per_step)
    labels[5] = 999
    with pytest.raises(fusebox.InvalidArgument, match="outside the vocabulary"):
        t.step(ids, labels)
    with pytest.raises(fusebox.InvalidArgument, match="unknown key"):
        bad = tmp_path / "bad.json"
        bad.write_text('{"model": {"vocab": 16, "widht": 3}}')
        fusebox.LmTrainer(str(bad), work_dir=str(tmp_path / "w2"), total_steps=3)
    with pytest.raises(fusebox.Error):
        t.load(str(tmp_path / "missing.safetensors"))
    e = fusebox.LmEngine(str(d / "ck.safetensors"))
    with pytest.raises(fusebox.InvalidArgument, match="outside the vocabulary"):
        e.add([1, 600])
    with pytest.raises(fusebox.InvalidArgument, match="32-bit integers"):
        e.add([1, 2**32 + 5])  # would wrap to 5 in ctypes
    with pytest.raises(fusebox.InvalidArgument, match="accepted: bf16, fp8, fp8-tensor"):
        fusebox.LmEngine(str(d / "ck.safetensors"), weights="int4")
    try:  # builds on a GPU; refused by name without one
        fusebox.LmEngine(str(d / "ck.safetensors"), backend="gpu")
    except fusebox.NotSupported as err:
        assert "the GPU backend needs a GPU" in str(err)
