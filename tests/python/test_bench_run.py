"""fusebox_tools.bench_run's choices that need no GPU, with torch stubbed out
(torch is not installed here): which part each example graph belongs to, and
which PyTorch kernels a norm graph is timed against."""
import importlib
import os
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


def test_bench_sh_accepts_every_bench_run_part():
    """scripts/bench.sh runs and merges the parts it lists: one that
    bench_run gained but bench.sh did not would be refused (it happened
    with conv_bwd and norm) or left out of the report."""
    import ast
    import re
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    sh = open(os.path.join(root, "scripts", "bench.sh")).read()
    listed = re.search(r'^BENCH_PARTS="([^"]*)"', sh, re.M).group(1).split()
    tree = ast.parse(open(os.path.join(root, "python", "fusebox_tools", "bench_run.py")).read())
    parts = next(ast.literal_eval(n.value) for n in tree.body
                 if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "PARTS")
    assert sorted(listed) == sorted(parts)


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
