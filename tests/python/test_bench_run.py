"""fusebox_tools.bench_run's choices that need no GPU, with torch stubbed out
(torch is not installed here): which part each example graph belongs to, and
which PyTorch kernels a norm graph is timed against."""
import importlib
import sys
import types
from unittest import mock

import pytest

from fusebox_tools.graph import Graph, default_graphs


class _Stub(types.ModuleType):
    def __getattr__(self, name):
        return mock.MagicMock(name=f"{self.__name__}.{name}")


@pytest.fixture
def bench_run(monkeypatch):
    if "torch" in sys.modules and not isinstance(sys.modules["torch"], _Stub):
        import fusebox_tools.bench_run as real  # torch is installed: the real thing
        yield real
        return
    torch, nn, fn = _Stub("torch"), _Stub("torch.nn"), _Stub("torch.nn.functional")
    torch.nn, nn.functional = nn, fn
    for name, mod in (("torch", torch), ("torch.nn", nn), ("torch.nn.functional", fn)):
        monkeypatch.setitem(sys.modules, name, mod)
    for name in [m for m in sys.modules if m.startswith("fusebox_tools.") and m != "fusebox_tools.graph"]:
        monkeypatch.delitem(sys.modules, name)
    before = set(sys.modules)
    yield importlib.import_module("fusebox_tools.bench_run")
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
    expected = {"layernorm_train": ("native_layer_norm (y, mean, rstd)", True),
                "layernorm_bwd": ("native_layer_norm_backward", True),
                "rmsnorm_train": ("F.rms_norm returns no inv_variance", True),
                "rmsnorm_bwd": ("autograd.grad of a saved F.rms_norm", False)}
    for name, (note, compiles) in expected.items():
        notes = []
        fn, compile_ok = bench_run.norm_torch_fn(graphs[name], notes)
        assert callable(fn) and compile_ok == compiles, name
        assert any(note in n for n in notes), (name, notes)


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
