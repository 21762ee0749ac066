"""The Python module on a GPU with torch: plans run on torch tensors (no
copies, torch's current stream, workspace from torch's allocator) against
torch's own math; the custom op under torch.compile(fullgraph=True) and in a
torch.cuda.CUDAGraph; wrong-device, wrong-dtype and non-contiguous errors.
Skipped without torch and a CUDA GPU. On the H200 (docs/python.md):
  FUSEBOX_LIBRARY=.gpu/libfusebox.so.0.1 /opt/torch/.venv/bin/python3 -m pytest tests/python/test_pymod_gpu.py"""
import os

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the GPU tests of the Python module skip")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible to torch: the GPU tests of the Python module skip", allow_module_level=True)

import torch.nn.functional as F  # noqa: E402

import fusebox  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = os.path.join(REPO, "examples", "graphs", "small")


def small(name):
    return fusebox.Graph.from_json(os.path.join(SMALL, name + ".json"))


@pytest.fixture(scope="module")
def session():
    return fusebox.Session(device=torch.cuda.current_device())


def rand(graph, name, gen):
    """Uniform in [-1, 1], laid out as the graph says (torch.empty_strided), on the GPU."""
    t = graph.empty(name)
    t.copy_(torch.rand(t.shape, generator=gen, device="cuda") * 2 - 1)
    return t


def rel_l2(a, r):
    a, r = a.float(), r.float()
    return ((a - r).norm() / r.norm().clamp_min(1e-30)).item()


def poison(t):
    return t.fill_(float("nan"))


def cbr_reference(x, w, b):
    y = F.conv2d(x.float(), w.float(), stride=2, padding=1) + b.float()
    return torch.relu(y)


@pytest.fixture(scope="module")
def cbr(session):
    g = small("conv_bias_relu_small")
    gen = torch.Generator(device="cuda").manual_seed(1)
    x, w, b = rand(g, "x", gen), rand(g, "w", gen), rand(g, "b", gen)
    return g, session.build(g), x, w, b


def test_conv_bias_relu(cbr):
    g, plan, x, w, b = cbr
    assert x.is_contiguous(memory_format=torch.channels_last)
    y = poison(g.empty("y"))
    ptrs = (x.data_ptr(), y.data_ptr())
    plan(x=x, w=w, b=b, y=y)  # torch's current stream
    torch.cuda.synchronize()
    assert (x.data_ptr(), y.data_ptr()) == ptrs  # in place, no copies
    err = rel_l2(y, cbr_reference(x, w, b))
    print(f"conv_bias_relu_small: engine {plan.engine}, {plan.workspace_bytes} B workspace, rel_l2 {err:.2e}")
    assert err < 1e-2
    # on a side stream, through Session.run
    s = torch.cuda.Stream()
    y2 = poison(g.empty("y"))
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        plan.session.run(plan, {"x": x, "w": w, "b": b, "y": y2})
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    assert torch.equal(y, y2)


def test_matmul_bias_gelu(session):
    g = small("matmul_bias_gelu_small")
    gen = torch.Generator(device="cuda").manual_seed(2)
    a, b, bias = rand(g, "a", gen), rand(g, "b", gen), rand(g, "bias", gen)
    y = poison(g.empty("y"))
    plan = session.build(g)
    plan(a=a, b=b, bias=bias, y=y)
    ref = F.gelu(a.float() @ b.float() + bias.float(), approximate="none")
    torch.cuda.synchronize()
    err = rel_l2(y, ref)
    print(f"matmul_bias_gelu_small: engine {plan.engine}, rel_l2 {err:.2e}")
    assert err < 1e-2


def test_sdpa_fwd(session):
    g = small("sdpa_fwd_small")  # q [2, 4, 64, 64], k, v [2, 2, 64, 64] (GQA), causal, scale 0.125
    gen = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = rand(g, "q", gen), rand(g, "k", gen), rand(g, "v", gen)
    o, stats = poison(g.empty("o")), poison(g.empty("stats"))
    plan = session.build(g)
    plan(q=q, k=k, v=v, o=o, stats=stats)
    rep = q.shape[1] // k.shape[1]
    kf, vf = k.float().repeat_interleave(rep, 1), v.float().repeat_interleave(rep, 1)
    ref = F.scaled_dot_product_attention(q.float(), kf, vf, is_causal=True, scale=0.125)
    torch.cuda.synchronize()
    err = rel_l2(o, ref)
    print(f"sdpa_fwd_small: engine {plan.engine}, rel_l2 {err:.2e}")
    assert err < 1e-2


def test_torch_compile_fullgraph(cbr, session):
    g, plan, x, w, b = cbr
    op = fusebox.torch_op(g, name="fusebox_test::cbr_compiled", outputs=["y"], plan=plan)

    def f(x, w, b):
        return op(x, w, b) * 2.0 + 1.0

    compiled = torch.compile(f, fullgraph=True)
    out = compiled(x, w, b)
    torch.cuda.synchronize()
    assert out.shape == (2, 16, 5, 5)
    err = rel_l2(out, cbr_reference(x, w, b) * 2.0 + 1.0)
    print(f"torch.compile(fullgraph=True) around the fusebox op: rel_l2 {err:.2e}")
    assert err < 1e-2
    assert torch.ops.fusebox_test.cbr_compiled.default is not None


def test_cuda_graph_capture_and_replay(cbr, session):
    g, plan, x, w, b = cbr
    op = fusebox.torch_op(g, name="fusebox_test::cbr_graphed", plan=plan)
    xs = x.clone(memory_format=torch.channels_last)
    # warm up on a side stream (kernels loaded, allocator primed), as torch's docs do before capture
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            op(xs, w, b)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ys = op(xs, w, b)
    for seed in (4, 5):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        xs.copy_(torch.rand(xs.shape, generator=gen, device="cuda") * 2 - 1)
        graph.replay()
        torch.cuda.synchronize()
        err = rel_l2(ys, cbr_reference(xs, w, b))
        print(f"CUDA graph replay (seed {seed}): rel_l2 {err:.2e}")
        assert err < 1e-2


def test_repeated_calls_skip_checks_but_never_a_change(cbr):
    """The second call with the same tensors takes the fast path (no checks, no rebinding);
    new data in them is computed, and any change the checks would see goes through the checks."""
    g, plan, x, w, b = cbr
    y = poison(g.empty("y"))
    plan(x=x, w=w, b=b, y=y)
    assert plan._fast is not None  # the signature of this call is kept
    x2 = x.clone(memory_format=torch.channels_last)
    x.mul_(-0.5)  # new values in the same tensor: the fast path computes them
    plan(x=x, w=w, b=b, y=y)
    torch.cuda.synchronize()
    assert rel_l2(y, cbr_reference(x, w, b)) < 1e-2
    x.copy_(x2)
    y2 = poison(g.empty("y"))  # another output pointer: checked and bound again
    plan(x=x, w=w, b=b, y=y2)
    torch.cuda.synchronize()
    assert rel_l2(y2, cbr_reference(x, w, b)) < 1e-2
    with pytest.raises(fusebox.InvalidArgument, match=r"tensor 'b' has dtype torch.float32; expected bf16"):
        plan(x=x, w=w, b=b.float(), y=y2)  # right after a fast-path-eligible call
    with pytest.raises(fusebox.InvalidArgument, match=r"tensor 'x' has strides .*channels_last"):
        plan(x=x.contiguous(), w=w, b=b, y=y2)
    with pytest.raises(fusebox.InvalidArgument, match="no tensor given for 'y'"):
        plan(x=x, w=w, b=b)


def test_errors_on_gpu(cbr):
    g, plan, x, w, b = cbr
    y = g.empty("y")
    with pytest.raises(fusebox.InvalidArgument, match=r"tensor 'x' is on cpu; expected a CUDA tensor on cuda:"):
        plan(x=x.cpu(), w=w, b=b, y=y)
    if torch.cuda.device_count() > 1:
        other = (plan.session.device + 1) % torch.cuda.device_count()
        with pytest.raises(fusebox.InvalidArgument, match=rf"tensor 'w' is on cuda:{other}; the session runs on"):
            plan(x=x, w=w.to(f"cuda:{other}"), b=b, y=y)
    with pytest.raises(fusebox.InvalidArgument, match=r"tensor 'b' has dtype torch.float32; expected bf16"):
        plan(x=x, w=w, b=b.float(), y=y)
    with pytest.raises(fusebox.InvalidArgument, match=r"tensor 'x' has strides .*channels_last"):
        plan(x=x.contiguous(), w=w, b=b, y=y)
    gm = small("matmul_bias_gelu_small")
    pm = plan.session.build(gm)
    a = torch.empty(1, 48, 64, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
    with pytest.raises(fusebox.InvalidArgument, match=r"tensor 'a' has strides .*\(not contiguous\).*contiguous\(\)"):
        pm(a=a, b=gm.empty("b"), bias=gm.empty("bias"), y=gm.empty("y"))
    with pytest.raises(fusebox.InvalidArgument, match="no tensor given for 'y'"):
        plan(x=x, w=w, b=b)
    op = fusebox.torch_op(g, name="fusebox_test::cbr_errors", plan=plan)
    # (the dispatcher hands the Python exception back as it was raised)
    with pytest.raises(fusebox.InvalidArgument, match="tensor 'b' has dtype torch.float32"):
        op(x, w, b.float())


def test_tune_then_cache(tmp_path):
    g = small("conv_bias_relu_small")
    s = fusebox.Session(device=torch.cuda.current_device(), cache=tmp_path / "plans.sqlite")
    tuned = s.tune(g, warmup=2, iters=5)  # the default policy: what build() looks up
    print(f"tune: {tuned.engine}: {tuned.source}")
    assert tuned.source.startswith("tuned now"), tuned.source
    again = s.build(g)
    assert again.source == "plan cache (tuned)" and again.cache == "hit", again.source
    assert again.engine == tuned.engine
    assert s.tune(g, warmup=1, iters=3).source == "plan cache (tuned)"


def test_tune_in_cuda_graph_is_cached_apart_and_replays(tmp_path):
    """tune(cuda_graph=True): timed inside CUDA graphs, its own cache entry; the plan replays under
    torch.cuda.graph with the eager run's bytes."""
    g = small("conv_bias_relu_small")
    s = fusebox.Session(device=torch.cuda.current_device(), cache=tmp_path / "plans.sqlite")
    tuned = s.tune(g, warmup=2, iters=10, cuda_graph=True)
    print(f"tune in a CUDA graph: {tuned.engine}: {tuned.source}")
    assert tuned.source.startswith("tuned now") and "in CUDA graphs" in tuned.source, tuned.source
    again = s.tune(g, warmup=1, iters=3, cuda_graph=True)
    assert again.source == "plan cache (tuned in a CUDA graph)" and again.engine == tuned.engine, again.source
    assert s.build(g).source != "plan cache (tuned)", "build must not take the CUDA-graph winner as eager-tuned"
    ts = {t.name: g.empty(t.name) for t in g.tensors}
    for t in g.tensors:
        if not t.is_output:
            ts[t.name].copy_(torch.rand(ts[t.name].shape, device=ts[t.name].device) * 2 - 1)
    again(**ts)
    torch.cuda.synchronize()
    eager = ts["y"].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        again(**ts)
    torch.cuda.current_stream().wait_stream(side)
    cg = torch.cuda.CUDAGraph()
    with torch.cuda.graph(cg):
        again(**ts)
    ts["y"].fill_(float("nan"))
    cg.replay()
    torch.cuda.synchronize()
    assert torch.equal(ts["y"], eager)


def test_deviceless_plan_file_runs(cbr, tmp_path):
    g, plan, x, w, b = cbr
    offline = fusebox.Session(device_properties=fusebox.devprop_path()).build(g)
    offline.save(tmp_path / "cbr.plan")
    loaded = plan.session.build(g, plan_file=tmp_path / "cbr.plan")
    assert loaded.source == "plan file (built deviceless)" and loaded.engine == offline.engine
    y = poison(g.empty("y"))
    loaded(x=x, w=w, b=b, y=y)
    torch.cuda.synchronize()
    assert rel_l2(y, cbr_reference(x, w, b)) < 1e-2
