"""`fusebox serve lm` on the CPU (the serving engine's reference backend, issue 34): prompts as
text (the data folder's tokenizer) streamed back, several prompts served together with shared
prefix pages, a Poisson request trace replayed with latency statistics and a plot, teacher forcing writing
each forced token's logits, and bad input as one clear error. The engine's numbers are checked in tests/deviceless/serve_test.cpp (every
sampled token's logits against the training pipeline's full forward)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from fusebox_tools.core.graph import REPO_ROOT

pytest.importorskip("tokenizers", reason="the tokenizers package is missing (scripts/setup.sh installs it)")


def _py(*args):
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO_ROOT, "python"))
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, env=env, timeout=300)


def _fb(fusebox, *args):
    # Tokens are byte-level pieces: a continuation may end inside a UTF-8 character.
    return subprocess.run([fusebox, *args], capture_output=True, encoding="utf-8", errors="replace", timeout=300)


@pytest.fixture(scope="module")
def model(fusebox, lm_docs_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    (root / "data").symlink_to(lm_docs_data, target_is_directory=True)
    p = _fb(fusebox, "train", "lm", "--config", os.path.join(REPO_ROOT, "examples", "train", "lm_tiny.json"),
            "--data", str(root / "data"), "--steps", "10", "--out", str(root / "run"), "--no-plot", "--generate", "0")
    assert p.returncode == 0, p.stderr
    return root


def test_a_prompt_is_streamed_back_as_text(fusebox, model):
    p = _fb(fusebox, "serve", "lm", "--model", str(model / "run"), "--data", str(model / "data"),
            "--prompt", "The graph of a convolution", "--max-new", "12")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("The graph of a convolution"), p.stdout
    assert len(p.stdout.strip()) > len("The graph of a convolution")
    assert "12 decoded" not in p.stderr and "decoded" in p.stderr  # 1 from the prefill, 11 decoded
    # Greedy is deterministic.
    again = _fb(fusebox, "serve", "lm", "--model", str(model / "run"), "--data", str(model / "data"),
                "--prompt", "The graph of a convolution", "--max-new", "12")
    assert again.stdout == p.stdout


def test_prompts_served_together_share_prefix_pages(fusebox, model):
    p = _fb(fusebox, "serve", "lm", "--model", str(model / "run" / "checkpoint.safetensors"), "--data",
            str(model / "data"), "--prompt", "The graph of a convolution with a bias", "--prompt",
            "The graph of a convolution with a relu", "--prompt", "fusebox run", "--max-new", "6",
            "--page-size", "4", "--temperature", "0.8", "--top-k", "20", "--seed", "3")
    assert p.returncode == 0, p.stderr
    lines = [l for l in p.stdout.splitlines() if l.startswith("[")]
    assert len(lines) == 3 and lines[2].startswith("[2] fusebox run|"), p.stdout
    assert "from shared prefix pages" in p.stderr and "(0 from shared" not in p.stderr, p.stderr


def test_a_trace_is_replayed_with_latencies(fusebox, model, tmp_path):
    p = _py("fusebox_tools.models.lm_trace", "make", "--data", str(model / "data"), "--requests", "16", "--rate",
            "40", "--prompt-len", "8", "--new-tokens", "5", "--shared-prefix", "8", "--context", "32",
            "--out", str(tmp_path / "trace.json"))
    assert p.returncode == 0, p.stderr
    p = _fb(fusebox, "serve", "lm", "--model", str(model / "run"), "--bench", str(tmp_path / "trace.json"),
            "--report", str(tmp_path / "report.json"), "--page-size", "4", "--pool-pages", "24", "--max-batch", "4")
    assert p.returncode == 0, p.stderr
    r = json.loads((tmp_path / "report.json").read_text())
    assert r["requests"] == 16 and r["tokens"] == 16 * 5
    assert 0 < r["ttft_s"]["p50"] <= r["ttft_s"]["p99"]
    assert 0 < r["itl_s"]["p50"] <= r["itl_s"]["p99"]
    assert 0 < r["kv_pages"]["max_used"] <= 24
    assert r["cached_prompt_tokens"] > 0, "the shared prefix came from the cache"
    assert (tmp_path / "report.png").is_file()
    # The tokens by trace index (the torch baseline's key, for lm_torch compare-serve): each request
    # alone with the same seed gives the same tokens.
    assert sorted(r["tokens_by_request"], key=int) == [str(i) for i in range(16)]
    assert all(len(t) == 5 and all(0 <= x < 512 for x in t) for t in r["tokens_by_request"].values())
    trace = json.loads((tmp_path / "trace.json").read_text())["requests"]
    p = _fb(fusebox, "serve", "lm", "--model", str(model / "run"), "--prompt-ids",
            ",".join(map(str, trace[3]["prompt"])), "--max-new", "5", "--seed", "3")
    assert p.returncode == 0, p.stderr
    alone = [int(x) for x in p.stdout.strip().strip("[]").split("][")][len(trace[3]["prompt"]):]
    assert alone == r["tokens_by_request"]["3"], (alone, r["tokens_by_request"]["3"])


def test_teacher_forcing_writes_each_forced_tokens_logits(fusebox, model, tmp_path):
    forced = tmp_path / "forced.json"
    forced.write_text(json.dumps({"requests": [{"prompt": [1, 2, 3], "forced": [7, 8, 9, 10]},
                                               {"prompt": [5], "forced": [500, 3]}]}))
    out = tmp_path / "logits"
    p = _fb(fusebox, "serve", "lm", "--model", str(model / "run"), "--forced", str(forced), "--logits-out", str(out))
    assert p.returncode == 0, p.stderr
    assert "2 requests, 6 forced tokens" in p.stdout, p.stdout
    a, b = np.load(out / "logits_0.npy"), np.load(out / "logits_1.npy")
    assert a.shape == (4, 512) and b.shape == (2, 512) and a.dtype == np.float32
    assert np.isfinite(a).all() and np.isfinite(b).all()
    # Row 0 of request 1 is the logits after its prompt alone: what a greedy run samples from.
    p = _fb(fusebox, "serve", "lm", "--model", str(model / "run"), "--prompt-ids", "5", "--max-new", "1")
    assert p.returncode == 0, p.stderr
    assert int(p.stdout.strip().strip("[]").split("][")[-1]) == int(b[0].argmax())
    # Nothing is overwritten; the file's errors name the request.
    p = _fb(fusebox, "serve", "lm", "--model", str(model / "run"), "--forced", str(forced), "--logits-out", str(out))
    assert p.returncode != 0 and "exists and is not empty" in p.stderr, p.stderr
    p = _fb(fusebox, "serve", "lm", "--model", str(model / "run"), "--forced", str(forced))
    assert p.returncode != 0 and "--forced needs --logits-out" in p.stderr, p.stderr
    forced.write_text(json.dumps({"requests": [{"prompt": [1], "forced": [512]}]}))
    p = _fb(fusebox, "serve", "lm", "--model", str(model / "run"), "--forced", str(forced), "--logits-out",
            str(tmp_path / "l2"))
    assert p.returncode != 0 and "request 0: forced ids must be integers in [0, 512)" in p.stderr, p.stderr


def test_bad_input_is_one_clear_error(fusebox, model, tmp_path):
    bad = tmp_path / "trace.json"
    bad.write_text(json.dumps({"requests": [{"arrival_s": 0, "prompt": [1, 9999], "max_new_tokens": 2}]}))
    p = _fb(fusebox, "serve", "lm", "--model", str(model / "run"), "--bench", str(bad))
    assert p.returncode != 0 and "prompt ids must be integers in [0, 512)" in p.stderr, p.stderr
    bad.write_text("[1, 2, 3]")
    p = _fb(fusebox, "serve", "lm", "--model", str(model / "run"), "--bench", str(bad))
    assert p.returncode != 0 and "expected {\"requests\"" in p.stderr, p.stderr
    (tmp_path / "ck.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    p = _fb(fusebox, "serve", "lm", "--model", str(tmp_path / "ck.safetensors"), "--prompt-ids", "1,2")
    assert p.returncode != 0 and "not a fusebox language-model checkpoint" in p.stderr, p.stderr
    p = _fb(fusebox, "serve", "lm", "--model", str(model / "run"), "--prompt-ids", "1,2,x")
    assert p.returncode != 0 and "'x' is not a token id" in p.stderr, p.stderr
    p = _fb(fusebox, "serve", "lm", "--model", str(model / "run"), "--prompt-ids", "1,2", "--max-new", "40")
    assert p.returncode != 0 and "over the context of 32" in p.stderr, p.stderr
    p = _fb(fusebox, "serve", "lm", "--model", str(model / "run"), "--prompt-ids", "1,2", "--backend", "gpu")
    if p.returncode != 0:  # no GPU here: refused by name (on a GPU it serves)
        assert "the GPU backend needs a GPU" in p.stderr, p.stderr


def test_fp8_weights_serve_and_profiling_is_for_the_gpu(fusebox, model):
    # FP8 weights on the reference backend: it serves (the numbers: tests/deviceless/serve_test.cpp).
    p = _fb(fusebox, "serve", "lm", "--model", str(model / "run"), "--prompt-ids", "1,2,3", "--max-new", "4",
            "--weights", "fp8")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("[1][2][3]") and p.stdout.count("[") == 3 + 4, p.stdout  # ids without --data
    p = _fb(fusebox, "serve", "lm", "--model", str(model / "run"), "--prompt-ids", "1,2", "--weights", "int4")
    assert p.returncode != 0 and "--weights" in p.stderr, p.stderr
    p = _fb(fusebox, "serve", "lm", "--model", str(model / "run"), "--profile-decode", "16")
    assert p.returncode != 0 and "profiling is for the GPU backend" in p.stderr, p.stderr
