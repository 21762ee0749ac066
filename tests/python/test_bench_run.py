"""fusebox_tools.bench.bench_run's choices that need no GPU, with torch stubbed out
(torch is not installed here): which part each example graph belongs to, and
which PyTorch kernels a norm graph is timed against."""
import importlib
import json
import os
import sys
import types
from unittest import mock

import numpy  # noqa: F401  (loaded once, before the torch stub re-imports bench_run: numpy cannot load twice)
import pytest

from fusebox_tools.core.graph import Graph, default_graphs


class _Stub(types.ModuleType):
    def __getattr__(self, name):
        return mock.MagicMock(name=f"{self.__name__}.{name}")


@pytest.fixture
def bench_run(monkeypatch):
    if "torch" in sys.modules and not isinstance(sys.modules["torch"], _Stub):
        import fusebox_tools.bench.bench_run as real  # torch is installed: the real thing
        yield real
        return
    torch, nn, fn = _Stub("torch"), _Stub("torch.nn"), _Stub("torch.nn.functional")
    torch.nn, nn.functional = nn, fn
    for name, mod in (("torch", torch), ("torch.nn", nn), ("torch.nn.functional", fn)):
        monkeypatch.setitem(sys.modules, name, mod)
    for name in [m for m in sys.modules if m.startswith("fusebox_tools.") and m != "fusebox_tools.core.graph"]:
        monkeypatch.delitem(sys.modules, name)
    before = set(sys.modules)
    yield importlib.import_module("fusebox_tools.bench.bench_run")
    for name in set(sys.modules) - before:  # nothing imported against the stub outlives the test
        del sys.modules[name]


def _examples(fusebox):
    return {p.rsplit("/", 1)[-1][:-5]: Graph.load(p, fusebox) for p in default_graphs()
            if p.rsplit("/", 2)[-2] == "graphs"}


def test_every_example_has_a_part(bench_run, fusebox):
    graphs = _examples(fusebox)
    fams = {name: bench_run.family(g) for name, g in graphs.items()}
    assert fams["conv_dgrad"] == fams["conv_wgrad"] == fams["conv_dgrad_drelu"] == "conv_bwd"
    assert fams["layernorm_train"] == fams["rmsnorm_bwd"] == "norm"
    assert fams["conv_bias_relu"] == "conv" and fams["sdpa_fwd_causal"] == "sdpa"
    assert set(fams.values()) <= set(bench_run.PARTS) - {"peaks"}


def test_norm_graphs_use_torchs_own_kernels(bench_run, fusebox):
    graphs = _examples(fusebox)
    expected = {"layernorm_train": ("native_layer_norm (y, mean, rstd)", ["y", "mean", "inv_variance"]),
                "layernorm_bwd": ("native_layer_norm_backward", ["dx", "dscale", "dbias"]),
                "rmsnorm_train": ("F.rms_norm returns no inv_variance", ["y"]),
                "rmsnorm_bwd": ("autograd.grad of a saved F.rms_norm", ["dx", "dscale"])}
    for name, (note, roles) in expected.items():
        notes = []
        g = graphs[name]
        fn, out_names, compile_fn = bench_run.norm_torch_fn(g, notes)
        assert callable(fn), name
        assert any(note in n for n in notes), (name, notes)
        op = next(o for o in g.ops if o["op"].startswith(("layernorm", "rmsnorm")))
        # each torch output names the graph output it is compared with (issue 36)
        assert out_names == [op["outputs"].get(r) for r in roles], (name, out_names)
        assert any(n in g.outputs() for n in out_names), name
        # every norm row has compile variants; the autograd backward compiles its forward
        assert compile_fn is True or (name == "rmsnorm_bwd" and callable(compile_fn)), name


def test_pool_and_batchnorm_parts(bench_run, fusebox):
    graphs = _examples(fusebox)
    fams = {name: bench_run.family(g) for name, g in graphs.items()}
    assert fams["max_pool_resnet_stem"] == fams["global_avg_pool"] == "pool"
    assert fams["batchnorm_train"] == fams["batchnorm_train_relu"] == fams["batchnorm_bwd"] == "norm"
    # batchnorm_inference + relu is refused by cuDNN 9.19 on the H200: an invalid_ example now
    refused = Graph.load(os.path.join(os.path.dirname(__file__), "..", "..", "examples", "graphs",
                                      "invalid_batchnorm_inference_relu.json"), fusebox)
    assert bench_run.family(refused) == "norm"
    assert "pool" in bench_run.PARTS


def test_pool_graphs_use_torchs_own_kernels(bench_run, fusebox):
    graphs = _examples(fusebox)
    for name, note in {"max_pool_resnet_stem": "F.max_pool2d", "global_avg_pool": "F.adaptive_avg_pool2d(x, 1)"}.items():
        notes = []
        fn = bench_run.pool_torch_fn(graphs[name], notes)
        assert callable(fn), name
        assert notes == [f"torch: {note}"], (name, notes)


def test_batchnorm_graphs_use_torchs_own_kernels(bench_run, fusebox):
    graphs = _examples(fusebox)
    graphs["batchnorm_inference_relu"] = Graph.load(os.path.join(
        os.path.dirname(__file__), "..", "..", "examples", "graphs", "invalid_batchnorm_inference_relu.json"), fusebox)
    expected = {"batchnorm_train": ("F.batch_norm(training=True)", False),
                "batchnorm_train_relu": ("F.batch_norm(training=True)", True),
                "batchnorm_inference_relu": ("1/inv_variance^2 - eps", True),
                "batchnorm_bwd": ("native_batch_norm_backward", False)}
    for name, (note, relu) in expected.items():
        g = graphs[name]
        op = next(o for o in g.ops if o["op"] in bench_run.BATCHNORM_OPS)
        notes = []
        fn, prepare, out_names = bench_run.batchnorm_torch_fn(g, op, notes)
        assert callable(fn) and callable(prepare), name
        # compared with the graph's output: the relu's y when a relu follows (issue 36)
        assert out_names[0] in g.outputs() or name == "batchnorm_inference_relu", (name, out_names)
        if relu:
            relu_y = next(o["outputs"]["y"] for o in g.ops if o["op"] == "relu")
            assert out_names == [relu_y], (name, out_names)
        assert len(notes) == 1 and note in notes[0], (name, notes)
        assert notes[0].endswith(" + F.relu") == relu, (name, notes)


def test_conv_backward_gets_real_tensors_never_the_zero_stride_helpers(bench_run, fusebox):
    """Issue 36: torch.nn.grad.conv*d_input / _weight hand aten an expanded zero-stride tensor, a
    slow path no autograd user takes; the bench gives aten.convolution_backward real tensors."""
    import re
    root = os.path.join(os.path.dirname(__file__), "..", "..", "python", "fusebox_tools")
    for f in ("core/torch_ops.py", "bench/bench_run.py", "bench/torch_compare.py"):
        assert not re.search(r"torch\.nn\.grad\.conv[123]d_", open(os.path.join(root, f)).read()), f
    graphs = _examples(fusebox)
    for name, role in (("conv_dgrad", "x"), ("conv_wgrad", "w"), ("conv_dgrad_drelu", "x")):
        g = graphs[name]
        op = next(o for o in g.ops if o["op"] in ("conv_dgrad", "conv_wgrad"))
        sets = [{op["inputs"]["dy"]: mock.MagicMock()} for _ in range(2)]
        notes = []
        bench_run.conv_bwd_operands(g, sets, notes)
        assert all(f"_{role}:{op['name']}" in st for st in sets), name
        assert notes == [f"torch: aten.convolution_backward with a real {role} tensor (channels_last, as autograd "
                         f"passes it), output mask {'dx' if role == 'x' else 'dw'} only"], (name, notes)


def test_bench_sh_accepts_every_bench_run_part():
    """scripts/bench.sh runs and merges the parts it lists: one that
    bench_run gained but bench.sh did not would be refused (it happened
    with conv_bwd and norm) or left out of the report."""
    import ast
    import re
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    sh = open(os.path.join(root, "scripts", "bench.sh")).read()
    listed = re.search(r'^BENCH_PARTS="([^"]*)"', sh, re.M).group(1).split()
    tree = ast.parse(open(os.path.join(root, "python", "fusebox_tools", "bench", "bench_run.py")).read())
    parts = next(ast.literal_eval(n.value) for n in tree.body
                 if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "PARTS")
    assert sorted(listed) == sorted(parts)


def test_runtime_part_finds_its_bench_binary(bench_run, monkeypatch):
    monkeypatch.delenv("FUSEBOX_RUNTIME_BENCH", raising=False)
    assert bench_run.runtime_bench_bin("/x/.gpu/fusebox") == "/x/.gpu/bound_execute_bench"
    monkeypatch.setenv("FUSEBOX_RUNTIME_BENCH", "/y/bench")
    assert bench_run.runtime_bench_bin("/x/.gpu/fusebox") == "/y/bench"
    assert "runtime" in bench_run.PARTS


def test_bench_graphs_check_and_belong_to_a_part(fusebox):
    """bench/graphs/*.json (benchmarked beside the examples) are valid graphs
    of a family some part benchmarks."""
    import ast
    import glob
    import subprocess
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    paths = sorted(glob.glob(os.path.join(root, "bench", "graphs", "*.json")))
    assert len(paths) >= 10
    src = open(os.path.join(root, "python", "fusebox_tools", "bench", "bench_run.py")).read()
    tree = ast.parse(src)
    parts = next(ast.literal_eval(n.value) for n in tree.body
                 if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "PARTS")
    for p in paths:
        r = subprocess.run([fusebox, "check", p, "--json"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (p, r.stderr)
        fams = [o["traits"]["bench_family"] for o in json.loads(r.stdout)["ops"]]
        assert any(f in parts for f in fams), (p, fams)


def test_symbolic_examples_are_benchmarked_by_part_shapes(bench_run, repo_root):
    """Every symbolic example has its sweep in part shapes (32 shapes each, issue 11)
    and is left out of the per-family parts, which would time it at its defaults only."""
    import os
    symbolic = {os.path.relpath(p, repo_root) for p in default_graphs(repo_root)
                if p.rsplit("/", 2)[-2] == "graphs" and bench_run.is_symbolic(p)}
    assert symbolic == set(bench_run.SHAPE_SWEEPS), symbolic
    assert "shapes" in bench_run.PARTS
    for path, sweeps in bench_run.SHAPE_SWEEPS.items():
        n = 1
        for s in sweeps:
            lo_hi, _, step = s.split("=", 1)[1].partition(":")
            lo, hi = (int(x) for x in lo_hi.split(".."))
            n *= len(range(lo, hi + 1, int(step or 1)))
        assert n == 32, (path, sweeps)
    assert not bench_run.is_symbolic(os.path.join(repo_root, "examples/graphs/conv_bias_relu.json"))


def test_reduction_and_fp8_examples_parts(bench_run, fusebox):
    graphs = _examples(fusebox)
    fams = {name: bench_run.family(g) for name, g in graphs.items()}
    assert fams["reduce_sum_bias_grad"] == "reduction"
    # an epilogue reduction stays with its GEMM
    assert fams["matmul_amax"] == fams["fp8_matmul_amax_fp8"] == fams["swiglu_up_mul"] == "matmul"


def test_fp8_matmul_plan(bench_run, fusebox):
    graphs = _examples(fusebox)
    plan = bench_run.fp8_matmul_plan(graphs["fp8_matmul_amax_fp8"])
    assert plan == {"a": "a", "b": "b", "descale_a": "descale_a", "descale_b": "descale_b", "scale_y": "scale_y",
                    "y": "y", "amax": "amax_y", "out_dtype": "fp8_e4m3"}
    plan = bench_run.fp8_matmul_plan(graphs["fp8_matmul_bf16"])
    assert plan["scale_y"] is None and plan["amax"] is None and plan["out_dtype"] == "bf16"
    assert bench_run.fp8_matmul_plan(graphs["matmul_bias_gelu"]) is None


def test_paged_decode_kv_bytes_count_the_lengths_not_the_pool(bench_run, fusebox):
    graphs = _examples(fusebox)
    g = graphs["sdpa_paged_decode"]
    op = g.sdpa_ops()[0]
    assert op["attrs"]["paged"] and op["attrs"]["max_seq_len_kv"] == 8192
    assert bench_run.family(g) == "sdpa"
    # B=64, Hkv=8, D=Dv=128, bf16: per key 8 heads * (128 + 128) * 2 bytes
    lkv = [100] * 32 + [8192] * 32
    assert bench_run.kv_read_bytes(g, op, lkv) == sum(lkv) * 8 * 256 * 2
    # without lengths: every sequence at max_seq_len_kv, which is the pools' size here
    full = bench_run.kv_read_bytes(g, op, None)
    assert full == 64 * 8192 * 8 * 256 * 2
    pools = sum(g.dims[op["inputs"][r]][0] * 8 * 64 * 128 * 2 for r in ("k", "v"))
    assert full == pools


def test_models_part_rows_from_the_checkers_json(bench_run):
    """Part models: a row from resnet50_check's and minilm_embed's --json-out (measured shapes)."""
    assert "models" in bench_run.PARTS
    assert set(bench_run.MODEL_DEFAULT) == {"minilm_b1_s32", "minilm_b32_s128", "minilm_b256_s128", "resnet50_b1",
                                            "resnet50_b32", "resnet50_b256"}
    assert set(bench_run.MODEL_DEFAULT) < set(bench_run.MODEL_RUNS)
    assert {"resnet50_b8", "minilm_b8_s128"} < set(bench_run.MODEL_RUNS)
    rn = {"ok": True, "fusebox_vs_fp32": {"rel_l2": 0.0119},
          "gpu_time_ms": {"torch_eager_bf16": {"median": 5.19}, "torch_cuda_graph_bf16": {"median": 1.145},
                          "torch_compile_bf16": {"median": 1.777}, "fusebox_pipeline_eager": {"median": 0.636},
                          "fusebox_pipeline_cuda_graph": {"median": 0.572}}}
    row = bench_run.model_row("resnet50_b8", rn)
    assert row["target"] == 1.1
    assert row["fusebox_ms"] == {"cuda_graph": 0.572, "eager": 0.636}
    assert row["torch_ms"] == {"eager": 5.19, "cuda_graph": 1.145, "compile": 1.777, "compile_cudagraphs": None}
    assert row["speedup"] == pytest.approx(1.145 / 0.572) and row["verified"]
    ml = {"ok": True, "checks": [{"against": "x", "pass": True}],
          "fusebox": {"cuda_graph": {"recording": "capture"}, "latency_ms": {"median": 0.335},
                      "eager_latency_ms": {"median": 0.343}},
          "torch_timing": {"eager": {"median": 2.84}, "cuda_graph": {"median": 0.388}, "compile": {"median": 2.32}}}
    row = bench_run.model_row("minilm_b8_s128", ml)
    assert row["fusebox_ms"] == {"cuda_graph": 0.335, "eager": 0.343}
    assert row["speedup"] == pytest.approx(0.388 / 0.335)
    # issue 36: both compile variants, frozen, with their compile times; a failed one is no baseline
    rn2 = dict(rn, torch_compile={"compile": {"mode": "max-autotune-no-cudagraphs", "freezing": True, "compile_s": 95.2},
                                  "compile_cudagraphs": {"mode": "reduce-overhead", "freezing": True,
                                                         "error": "ValueError: outputs differ"}},
               torch_failed={"compile_cudagraphs": "ValueError: outputs differ"})
    rn2["gpu_time_ms"] = dict(rn["gpu_time_ms"], torch_compile_cudagraphs_bf16={"median": 0.9})
    row = bench_run.model_row("resnet50_b32", rn2)
    assert row["torch_ms"]["compile_cudagraphs"] is None  # failed: its time is not a baseline
    assert row["torch_failed"] == {"compile_cudagraphs": "ValueError: outputs differ"}
    assert row["compile_s"] == {"compile": 95.2} and row["freezing"] is True
    assert row["speedup"] == pytest.approx(1.145 / 0.572)
    ml2 = dict(ml, torch_timing=dict(ml["torch_timing"], compile_cudagraphs={"median": 0.30}, failed={},
                                     variants={"compile": {"freezing": True, "compile_s": 40.0},
                                               "compile_cudagraphs": {"freezing": True, "compile_s": 20.0}}))
    row = bench_run.model_row("minilm_b8_s128", ml2)
    assert row["torch_ms"]["compile_cudagraphs"] == 0.30 and row["speedup"] == pytest.approx(0.30 / 0.335)
    assert row["compile_s"] == {"compile": 40.0, "compile_cudagraphs": 20.0} and "torch_failed" not in row
    # a failed fusebox run: no times, no speedup, not verified
    row = bench_run.model_row("minilm_b8_s128", {"ok": False, "fusebox": {}, "torch_timing": {}})
    assert row["speedup"] is None and not row["verified"]


def test_model_targets_and_selection(bench_run, monkeypatch):
    t = bench_run.model_target
    assert (t("minilm_b1_s32"), t("minilm_b32_s128"), t("minilm_b256_s128")) == (1.5, 1.2, 1.2)
    assert (t("resnet50_b1"), t("resnet50_b32"), t("resnet50_b256")) == (1.3, 1.1, 1.1)
    assert t("other_b1") is None and t("resnet50") is None
    monkeypatch.delenv("MODEL_SIZES", raising=False)
    assert bench_run.model_selection() == list(bench_run.MODEL_DEFAULT)
    assert bench_run.model_selection(" resnet50_b1, resnet50_b32 ") == ["resnet50_b1", "resnet50_b32"]
    monkeypatch.setenv("MODEL_SIZES", "minilm_b8_s128")
    assert bench_run.model_selection() == ["minilm_b8_s128"]
    with pytest.raises(ValueError, match="unknown resnet50_b7.*accepted: .*resnet50_b256"):
        bench_run.model_selection("resnet50_b7")


def test_model_commands(bench_run, monkeypatch):
    """Each row's checker at its size, torch.compile in the bench's mode (MODEL_COMPILE_MODE overrides)."""
    monkeypatch.delenv("MODEL_COMPILE_MODE", raising=False)
    cmd = bench_run.model_command("resnet50_b256", "/fb", "/tmp/run", "/tmp/r.json")
    assert cmd[1:3] == ["-m", "fusebox_tools.models.resnet50_check"]
    assert cmd[cmd.index("--batch") + 1] == "256" and "--no-verify" in cmd
    assert cmd[cmd.index("--compile-mode") + 1] == bench_run.COMPILE_MODE
    cmd = bench_run.model_command("resnet50_b1", "/fb", "/tmp/run", "/tmp/r.json")
    assert "--no-verify" not in cmd and cmd[cmd.index("--batch") + 1] == "1"
    monkeypatch.setenv("MODEL_COMPILE_MODE", "default")
    cmd = bench_run.model_command("minilm_b256_s128", "/fb", "/tmp/run", "/tmp/r.json")
    assert cmd[cmd.index("--batch") + 1] == "256" and cmd[cmd.index("--seq") + 1] == "128"
    assert cmd[cmd.index("--compile-mode") + 1] == "default" and "--torch-time" in cmd
    cmd = bench_run.model_command("minilm_b1_s32", "/fb", "/tmp/run", "/tmp/r.json")
    assert cmd[cmd.index("--batch") + 1] == "1" and cmd[cmd.index("--seq") + 1] == "32"
    assert "--batch" not in bench_run.model_command("minilm_b8_s128", "/fb", "/r", "/j")  # the 8 example sentences
    # MiniLM rows: the symbolic pipeline built for the shape; the _dyn rows with dynamic-shape plans.
    assert "--static-shapes" in bench_run.model_command("minilm_b32_s128", "/fb", "/r", "/j")
    dyn = bench_run.model_command("minilm_b32_s128_dyn", "/fb", "/r", "/j")
    assert "--static-shapes" not in dyn and dyn[dyn.index("--batch") + 1] == "32"
    # the runner fuses Q/K/V by default: the three-GEMM rows say --no-fused-qkv, the _fqkv rows --fused-qkv
    assert "--no-fused-qkv" in bench_run.model_command("minilm_b32_s128", "/fb", "/r", "/j")
    fq = bench_run.model_command("minilm_b32_s128_fqkv", "/fb", "/r", "/j")
    assert "--fused-qkv" in fq and "--no-fused-qkv" not in fq


def test_tuned_timing_runs_tune_first_and_times_its_winner(bench_run, monkeypatch, tmp_path):
    """BENCH_TUNE=1: `fusebox tune` into the part's plan cache, then `run --cache` of that cache (the
    winner is timed), the winner against the heuristics' choice in the notes; a failed tune times the
    heuristics' choice without a cache, and says so."""
    import types
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        if cmd[1] == "tune":
            out = {"winner": "eng6_a", "winner_median_ms": 0.0165, "heuristic_choice": "eng1",
                   "speedup_over_heuristic": 4.9, "cache": "stored"} if tune_ok else {"ok": False, "error": "no GPU"}
            return types.SimpleNamespace(returncode=0 if tune_ok else 1, stdout=json.dumps(out), stderr="")
        gpu = 0.015 if "--cuda-graph" in cmd else 0.017  # replayed as a CUDA graph: no gaps
        return types.SimpleNamespace(returncode=0, stdout=json.dumps(
            {"engine": "eng6_a", "gpu_time_ms": {"samples": [gpu]}, "host_latency_ms": {"samples": [0.03]}}),
            stderr="")

    monkeypatch.setattr(bench_run.subprocess, "run", fake_run)
    args = types.SimpleNamespace(fusebox="/fb", warmup=1, calls=2, samples=1, timeout=5, tune=True,
                                 tune_cache=str(tmp_path / "tuned.sqlite"))
    for tune_ok in (True, False):
        calls.clear()
        notes = []
        out = bench_run.time_fusebox(args, "/g.json", {}, notes)
        # timed back to back and as a CUDA graph, both from the same plan source
        assert [c[1] for c in calls] == ["tune", "run", "run"]
        assert "--cuda-graph" not in calls[1] and "--cuda-graph" in calls[2]
        assert calls[0][calls[0].index("--cache") + 1] == args.tune_cache
        for run_cmd in calls[1:]:
            if tune_ok:
                assert run_cmd[run_cmd.index("--cache") + 1] == args.tune_cache and out["tuned"]
            else:
                assert "--no-cache" in run_cmd and not out["tuned"]
        if tune_ok:
            assert "tuned: eng6_a" in notes[0] and "eng1 (4.90x)" in notes[0]
        else:
            assert "timed the heuristics' choice" in notes[0]
        # the faster way is the row's time, as torch's best variant is its
        assert out["gpu_ms"] == [0.015] and out["timed_as"] == "cuda_graph"
        assert out["eager_gpu_ms"] == [0.017] and "back-to-back runs 17.0 us, as a CUDA graph 15.0 us" in notes[-1]
    # --no-fusebox-graph: back to back only
    calls.clear()
    args.no_fusebox_graph = True
    out = bench_run.time_fusebox(args, "/g.json", {}, [])
    assert [c[1] for c in calls] == ["tune", "run"] and out["gpu_ms"] == [0.017] and out["timed_as"] == "eager"


def test_models_part_resumes_and_runs_a_subset(bench_run, monkeypatch, tmp_path):
    """Rows already in the part file are skipped; MODEL_SIZES picks the rows;
    each finished row is saved at once (a part cut off resumes)."""
    import subprocess as sp
    ran = []

    def fake_run(cmd, **kw):
        name = next(n for n in bench_run.MODEL_RUNS if bench_run.MODEL_RUNS[n][0] == cmd[2])
        batch = int(cmd[cmd.index("--batch") + 1])
        ran.append((cmd[2], batch))
        res = {"ok": True, "torch_compile_mode": "max-autotune-no-cudagraphs",
               "gpu_time_ms": {"torch_eager_bf16": {"median": 3.0}, "torch_cuda_graph_bf16": {"median": 1.2},
                               "torch_compile_bf16": {"median": 1.5}, "fusebox_pipeline_cuda_graph": {"median": 1.0},
                               "fusebox_pipeline_eager": {"median": 1.1}}}
        with open(cmd[cmd.index("--json-out") + 1], "w") as f:
            json.dump(res, f)
        assert name.startswith("resnet50")
        return sp.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(bench_run.subprocess, "run", fake_run)
    args = types.SimpleNamespace(force=False, fusebox="/fb", timeout=10, out=str(tmp_path / "models.json"))
    doc = {"models": [{"name": "resnet50_b1", "speedup": 1.4}]}
    monkeypatch.setenv("MODEL_SIZES", "resnet50_b1,resnet50_b32,resnet50_b256")
    assert bench_run.models_part(args, doc) == 0
    assert ran == [("fusebox_tools.models.resnet50_check", 32), ("fusebox_tools.models.resnet50_check", 256)]
    saved = json.load(open(args.out))
    assert [m["name"] for m in saved["models"]] == ["resnet50_b1", "resnet50_b32", "resnet50_b256"]
    row = saved["models"][1]
    assert row["speedup"] == pytest.approx(1.2) and row["target"] == 1.1 and row["verified"]
    assert row["compile_mode"] == "max-autotune-no-cudagraphs" and row["seconds"] >= 0
    # FORCE=1 redoes the selected row in place and keeps the others (no duplicate, none lost)
    args.force = True
    monkeypatch.setenv("MODEL_SIZES", "resnet50_b32")
    ran.clear()
    assert bench_run.models_part(args, doc) == 0 and ran == [("fusebox_tools.models.resnet50_check", 32)]
    saved = json.load(open(args.out))
    assert sorted(m["name"] for m in saved["models"]) == ["resnet50_b1", "resnet50_b256", "resnet50_b32"]
    args.force = False
    monkeypatch.setenv("MODEL_SIZES", "resnet50_b2")
    assert bench_run.models_part(args, doc) == 2
    # the MiniLM rows without the converted weights: counted as failed, nothing run
    monkeypatch.setattr(bench_run, "MINILM_DIR", str(tmp_path / "none"))
    monkeypatch.setitem(bench_run.MODEL_RUNS, "minilm_b1_s32", bench_run._minilm(1, 32))
    monkeypatch.setenv("MODEL_SIZES", "minilm_b1_s32")
    ran.clear()
    assert bench_run.models_part(args, doc) == 1 and ran == []


def _variant_fakes(bench_run, monkeypatch, compiled_outputs):
    """torch_variants with its timing and comparison replaced by plain values (no GPU): each compile
    mode's function returns compiled_outputs[mode] (an exception instance is raised instead)."""
    monkeypatch.setattr(bench_run, "gpu_samples", lambda fn, sets, *a: [fn(sets[0])[0]])
    monkeypatch.setattr(bench_run, "latency_samples", lambda fn, sets, *a: [2.0])
    monkeypatch.setattr(bench_run, "snapshot", lambda res: list(res))
    monkeypatch.setattr(bench_run, "compare_outputs",
                        lambda got, ref, tols, what="eager": (got == ref, f"{got} against {what} {ref}"))

    def fake_compile(fn, mode=None, dynamic=None):
        res = compiled_outputs[mode]
        if isinstance(res, Exception):
            raise res
        return lambda s: res

    monkeypatch.setattr(bench_run.torch, "compile", fake_compile)

    def fake_graph(fn, sets, calls, samples, warmup, prepare=None, check=None):
        check([1.0])
        return {"gpu_ms": [0.5], "latency_ms": [0.6]}

    monkeypatch.setattr(bench_run, "graph_variant", fake_graph)
    return types.SimpleNamespace(calls=1, samples=1, warmup=0, no_compile=False, verbose=False)


def test_torch_variants_time_only_variants_that_compute_eagers_values(bench_run, monkeypatch):
    """Issue 36: a variant that raises or computes other values is not timed; its error is in
    `failed` (the row's torch_failed), which makes the row incomplete in the report."""
    args = _variant_fakes(bench_run, monkeypatch, {bench_run.COMPILE_MODE: [1.5],  # other values
                                                   "reduce-overhead": RuntimeError("boom")})
    failed, notes = {}, []
    out = bench_run.torch_variants(lambda s: [1.0], [{}], args, notes, failed=failed,
                                   eager_check=lambda ref: (True, "same as fusebox"))
    assert set(out) == {"eager", "compile", "compile_cudagraphs", "cuda_graph"}
    assert out["eager"]["gpu_ms"] == [1.0]
    assert out["cuda_graph"]["gpu_ms"] == [0.5] and out["cuda_graph"]["check"]["pass"]
    assert out["compile"] is None and failed["compile"].startswith("VariantMismatch: [1.5] against eager [1.0]")
    assert out["compile_cudagraphs"] is None and failed["compile_cudagraphs"] == "RuntimeError: boom"
    assert "cuda_graph" not in failed and "eager" not in failed
    assert any("checked against fusebox" in n for n in notes)


def test_torch_variants_record_compile_time_and_mode(bench_run, monkeypatch):
    args = _variant_fakes(bench_run, monkeypatch, {bench_run.COMPILE_MODE: [1.0], "reduce-overhead": [1.0]})
    failed = {}
    out = bench_run.torch_variants(lambda s: [1.0], [{}], args, [], failed=failed)
    assert failed == {}
    for key, mode in (("compile", bench_run.COMPILE_MODE), ("compile_cudagraphs", "reduce-overhead")):
        assert out[key]["mode"] == mode and out[key]["compile_s"] >= 0 and out[key]["check"]["pass"]


def test_eager_that_differs_from_fusebox_fails_the_whole_row(bench_run, monkeypatch):
    args = _variant_fakes(bench_run, monkeypatch, {bench_run.COMPILE_MODE: [1.0], "reduce-overhead": [1.0]})
    failed = {}
    out = bench_run.torch_variants(lambda s: [1.0], [{}], args, [], failed=failed,
                                   eager_check=lambda ref: (False, "dx: rel_l2 3e-01"))
    assert all(v is None for v in out.values())
    assert "eager differs from fusebox" in failed["eager"]
    assert set(failed) == {"eager", "compile", "compile_cudagraphs", "cuda_graph"}
    # --no-compile: the compile variants are missing, with the reason
    args.no_compile = True
    failed = {}
    out = bench_run.torch_variants(lambda s: [1.0], [{}], args, [], failed=failed)
    assert out["compile"] is None and failed["compile"] == "not run: --no-compile"
