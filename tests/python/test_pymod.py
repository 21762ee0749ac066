"""The Python module `fusebox` (python/fusebox) without torch or a GPU: graphs
loaded and checked through libfusebox.so, deviceless builds for the H200
through a Session, the plan cache and plan files, and every check a run makes
before binding, driven by a fake tensor that quacks like a torch tensor.
libfusebox.so: $FUSEBOX_LIBRARY (ctest sets it), else build/libfusebox.so."""
import glob
import json
import os
import types

import pytest

import fusebox

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = os.path.join(REPO, "examples", "graphs", "small")
CBR = os.path.join(SMALL, "conv_bias_relu_small.json")
MATMUL = os.path.join(SMALL, "matmul_bias_gelu_small.json")
DEVPROP = os.path.join(REPO, "devices", "h200-cudnn-9.27.devprop")


@pytest.fixture(scope="module", autouse=True)
def library():
    try:
        return fusebox.library_path()
    except fusebox.LibraryNotFound as e:
        pytest.fail(f"{e} (make build, or set FUSEBOX_LIBRARY)")


@pytest.fixture(scope="module")
def deviceless():
    return fusebox.Session(device_properties=DEVPROP)


@pytest.fixture(scope="module")
def cbr_plan(deviceless):
    return deviceless.build(fusebox.Graph.from_json(CBR))


class FakeDType:
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return "torch." + self.name


class FakeTensor:
    """dtype, shape, stride(), device, data_ptr(): what fusebox reads of a torch tensor."""

    def __init__(self, shape, dtype="bfloat16", strides=None, device="cuda:0", ptr=1 << 20):
        self.shape = tuple(shape)
        self.dtype = FakeDType(dtype)
        if strides is None:
            strides, acc = [], 1
            for d in reversed(self.shape):
                strides.insert(0, acc)
                acc *= d
        self._strides = tuple(strides)
        typ, _, idx = device.partition(":")
        self.device = types.SimpleNamespace(type=typ, index=int(idx) if idx else None)
        self._ptr = ptr

    def stride(self):
        return self._strides

    def data_ptr(self):
        return self._ptr


class FakeCai:
    """An object with __cuda_array_interface__ (as cupy's arrays), on device 0."""

    def __init__(self, shape, typestr="<f2", strides=None, ptr=1 << 20, device=0):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr, "data": (ptr, False),
                                         "strides": strides, "version": 3}
        self.device = types.SimpleNamespace(id=device)


def like_graph(graph, **overrides):
    """A FakeTensor per tensor of the graph, laid out as the graph says; overrides replace some."""
    out = {}
    for i, t in enumerate(graph.tensors):
        out[t.name] = FakeTensor(t.dims, dtype={"bf16": "bfloat16", "fp32": "float32"}[t.dtype], strides=t.strides,
                                 ptr=(i + 1) << 20)
    out.update(overrides)
    return out


# ---------------------------------------------------------------- graphs

def test_version_and_library(library):
    assert fusebox.version() == "0.1.0"
    assert os.path.isfile(library)
    assert fusebox.C_API_VERSION == 9


def test_graph_from_path_check_info():
    g = fusebox.Graph.from_json(CBR)
    info = g.check()
    assert info.name == g.name == "conv_bias_relu_small"
    assert [t.name for t in info.tensors] == ["x", "w", "b", "y"]
    assert [t.name for t in info.inputs] == ["x", "w", "b"] and [t.name for t in info.outputs] == ["y"]
    y = info["y"]
    assert y.kind == "output" and y.dtype == "bf16"
    assert y.dims == (2, 16, 5, 5)
    assert y.strides == (16 * 5 * 5, 1, 5 * 16, 16)  # nhwc
    assert y.bytes == 2 * 16 * 5 * 5 * 2
    assert "conv_fprop" in info.text
    assert g.tensor("w").dims == (16, 8, 3, 3)
    assert info.to_dict()["tensors"][0]["name"] == "x"


def test_graph_from_text_dict_and_pathlike(tmp_path):
    import pathlib
    text = open(MATMUL).read()
    doc = json.loads(text)
    for g in (fusebox.Graph.from_json(text), fusebox.Graph.from_dict(doc), fusebox.Graph.from_json(pathlib.Path(MATMUL)),
              fusebox.Graph.load(MATMUL), fusebox.Graph.from_json(text.encode())):
        assert g.name == "matmul_bias_gelu_small"
        assert g.tensor("y").dims == (1, 64, 40)
        assert g.tensor("a").strides == (64 * 48, 48, 1)


def test_graph_backward():
    """Graph.backward(): the derived backward graph (docs/training.md) with its JSON and bindings."""
    g = fusebox.Graph.from_json(MATMUL)
    b = g.backward()
    assert isinstance(b, fusebox.BackwardGraph)
    names = {t.name: t for t in b.tensors}
    assert {"y.grad", "a", "b.T", "a.grad", "b.grad", "bias.grad"} <= set(names)
    assert names["a.grad"].is_output and names["y.grad"].kind == "input"
    assert names["a.grad"].dims == g.tensor("a").dims
    bind = b.bindings
    assert bind["inputs"]["y.grad"] == {"kind": "gradient", "forward_tensor": "y"}
    assert bind["inputs"]["b.T"]["transposed"] is True
    assert bind["gradients"] == {"a": "a.grad", "b": "b.grad", "bias": "bias.grad"}
    assert bind["recomputed"] and bind["saved_bytes"] > 0
    again = fusebox.Graph.from_json(b.json)  # a graph file
    assert {t.name for t in again.tensors} == set(names)
    only_a = g.backward(wrt="a")
    assert only_a.bindings["gradients"] == {"a": "a.grad"}
    with pytest.raises(fusebox.InvalidArgument, match="wrt 'nosuch' is not an input"):
        g.backward(wrt=["nosuch"])
    ln = fusebox.Graph.from_json(os.path.join(SMALL, "layernorm_small.json"))
    with pytest.raises(fusebox.NotSupported, match="declare the outputs 'mean' and 'inv_variance'"):
        ln.backward()


def test_graph_errors(tmp_path):
    with pytest.raises(fusebox.ParseError, match="fusebox_graph_from_json"):
        fusebox.Graph.from_json('{"name": "broken", "tensors": [')
    with pytest.raises(fusebox.InvalidArgument, match=r"\[conv_fprop"):
        fusebox.Graph.from_json(os.path.join(REPO, "examples", "graphs", "invalid_shapes.json"))
    with pytest.raises(fusebox.IoError):
        fusebox.Graph.from_json(str(tmp_path / "no_such.json"))
    with pytest.raises(fusebox.InvalidArgument, match="expected a dict"):
        fusebox.Graph.from_dict([1, 2])
    with pytest.raises(fusebox.InvalidArgument, match="not a JSON document"):
        fusebox.Graph.from_dict({"name": float("nan")})
    with pytest.raises(fusebox.InvalidArgument, match="expected JSON text or a path"):
        fusebox.Graph.from_json(42)
    g = fusebox.Graph.from_json(CBR)
    with pytest.raises(fusebox.InvalidArgument, match="binds no tensor 'conv_out'; it binds x, w, b, y"):
        g.tensor("conv_out")
    assert issubclass(fusebox.InvalidArgument, fusebox.Error) and issubclass(fusebox.InvalidArgument, ValueError)


# ---------------------------------------------------------------- deviceless sessions and plans

def conv_bias_relu_graphs():
    found = sorted(glob.glob(os.path.join(REPO, "examples", "graphs", "conv_bias_relu*.json")) +
                   glob.glob(os.path.join(SMALL, "conv_bias_relu*.json")))
    assert found
    return found


@pytest.mark.parametrize("path", conv_bias_relu_graphs(), ids=os.path.basename)
def test_deviceless_build(deviceless, path):
    plan = deviceless.build(fusebox.Graph.from_json(path))
    assert plan.engine.startswith("eng"), plan.engine
    assert plan.workspace_bytes >= 0
    assert plan.source.startswith("built now")  # a symbolic (_dyn) graph adds its shape in brackets
    assert plan.cache == "off"


def test_session_properties(deviceless):
    assert deviceless.deviceless
    assert deviceless.device is None
    assert deviceless.device_name == "NVIDIA H200"
    assert "deviceless" in repr(deviceless)


def test_build_options_and_plan_file(deviceless, cbr_plan, tmp_path):
    g = cbr_plan.graph
    pinned = deviceless.build(g, engine=cbr_plan.engine)
    assert pinned.engine == cbr_plan.engine
    assert deviceless.build(g, heuristics="a").engine.startswith("eng")
    with pytest.raises(fusebox.InvalidArgument):
        deviceless.build(g, heuristics="z")
    path = tmp_path / "cbr.plan"
    cbr_plan.save(path)
    again = deviceless.build(g, plan_file=path)
    assert again.engine == cbr_plan.engine
    assert again.source == "plan file (built deviceless)"
    with pytest.raises(fusebox.IoError):
        deviceless.build(g, plan_file=tmp_path / "missing.plan")


def test_plan_report_is_the_cli_document(deviceless):
    """Plan.report() is the library's serializer (fusebox/report_json.h), the one `fusebox build
    --json` prints: the same keys under "plan", the same build steps under "build" (issue 30)."""
    import subprocess

    from fusebox_tools.core.graph import fusebox_bin
    fusebox_exe = fusebox_bin()
    plan = deviceless.build(fusebox.Graph.from_json(CBR))
    rep = plan.report()
    cli = json.loads(subprocess.run([fusebox_exe, "build", CBR, "--device", DEVPROP, "--json", "--no-cache"],
                                    capture_output=True, text=True, check=True, timeout=120).stdout)
    assert set(rep) - {"build"} == set(cli["plan"]), set(rep) ^ set(cli["plan"])
    assert rep["source"] == cli["plan"]["source"] == "built"
    assert rep["engine"] == cli["plan"]["engine"] == plan.engine
    assert [s["name"] for s in rep["build"]["steps"]] == [s["name"] for s in cli["steps"]]
    assert rep["build"]["device"] == cli["device"]
    assert rep["plan_check"]["state"] == "deviceless"


def test_plan_cache_miss_then_hit(tmp_path):
    cache = tmp_path / "plans.sqlite"
    g = fusebox.Graph.from_json(CBR)
    first = fusebox.Session(device_properties=DEVPROP, cache=cache).build(g)
    assert first.cache == "miss" and first.source == "built now"
    second = fusebox.Session(device_properties=DEVPROP, cache=str(cache)).build(g)
    assert second.cache == "hit", second.source
    assert second.source.startswith("plan cache")
    assert second.engine == first.engine


def test_session_errors(deviceless, cbr_plan, tmp_path):
    with pytest.raises(fusebox.IoError):
        fusebox.Session(device_properties=tmp_path / "no.devprop")
    with pytest.raises(fusebox.NoDevice, match="deviceless"):
        deviceless.tune(cbr_plan.graph)
    other = fusebox.Session(device_properties=DEVPROP)
    with pytest.raises(fusebox.InvalidArgument, match="another session"):
        other.run(cbr_plan, {})


def test_session_device_forms():
    """Issue #32 case 13: "cuda:0" raised TypeError (str.index was taken for a torch index); a
    torch.device-like object and an int work alike; an id beyond the C int named id 0."""
    from fusebox._session import _device_index
    assert _device_index(0) == 0 and _device_index(3) == 3
    assert _device_index("cuda") == 0 and _device_index("cuda:2") == 2
    assert _device_index(types.SimpleNamespace(type="cuda", index=1)) == 1
    assert _device_index(types.SimpleNamespace(type="cuda", index=None)) == 0
    for bad in ("cpu", "cuda:x", "cuda:-1", -1, True, 1.5, types.SimpleNamespace(type="cpu", index=0)):
        with pytest.raises(fusebox.InvalidArgument, match="Session: device"):
            _device_index(bad)
    # A real Session on this machine: a GPU, or NoDevice; never a TypeError.
    for form in ("cuda:0", types.SimpleNamespace(type="cuda", index=0), 0):
        try:
            fusebox.Session(form).close()
        except fusebox.NoDevice as e:
            assert "0" in str(e), str(e)


def test_session_device_out_of_range_names_the_id():
    with pytest.raises(fusebox.InvalidArgument, match="no GPU with id 1099511627776"):
        fusebox.Session(2**40)
    with pytest.raises(fusebox.InvalidArgument, match="no GPU with id 4294967296"):
        fusebox.Session("cuda:4294967296")


def test_nul_bytes_are_refused_not_cut(deviceless, cbr_plan, tmp_path):
    """A NUL byte ended the C string: "x\\0junk" named tensor "x", a path its prefix."""
    with pytest.raises(ValueError, match="Graph.tensor: name .* contains a NUL byte"):
        cbr_plan.graph.tensor("x\0junk")
    with pytest.raises(ValueError, match="Session: cache .* NUL"):
        fusebox.Session(device_properties=DEVPROP, cache=str(tmp_path / "c.sqlite") + "\0.bak")
    assert not (tmp_path / "c.sqlite").exists()
    with pytest.raises(ValueError, match="Plan.save: path .* NUL"):
        cbr_plan.save(str(tmp_path / "p.plan") + "\0x")
    assert not (tmp_path / "p.plan").exists()
    with pytest.raises(ValueError, match="NUL"):
        fusebox.Graph.load(CBR + "\0x")
    with open(CBR) as f:
        text = f.read()
    with pytest.raises(fusebox.InvalidArgument, match="NUL byte"):
        fusebox.Graph.from_json(text + "\0 trailing text")


def test_plan_save_refuses_the_files_it_came_from(tmp_path):
    """Issue #32 case 13: plan.save(path) overwrote the graph file the plan was loaded from."""
    graph_path = tmp_path / "g.json"
    with open(CBR) as f:
        graph_text = f.read()
    graph_path.write_text(graph_text)
    cache = tmp_path / "plans.sqlite"
    s = fusebox.Session(device_properties=DEVPROP, cache=cache)
    plan = s.build(fusebox.Graph.load(graph_path))
    with pytest.raises(fusebox.InvalidArgument, match="graph file"):
        plan.save(graph_path)
    with pytest.raises(fusebox.InvalidArgument, match="graph file"):
        plan.save(str(tmp_path / "." / "g.json"))
    assert graph_path.read_text() == graph_text
    cache_bytes = cache.read_bytes()
    with pytest.raises(fusebox.InvalidArgument, match="plan cache"):
        plan.save(cache)
    assert cache.read_bytes() == cache_bytes
    plan.save(tmp_path / "g.plan")
    assert (tmp_path / "g.plan").stat().st_size > 0


def test_cache_export_onto_a_live_session_cache_is_refused(tmp_path):
    """Issue #32 case 4: `cache export T` while a Session had T open said "wrote T", but the
    session never saw the exported entries. Now refused while it is open; fine once closed."""
    import subprocess
    from fusebox_tools.core.graph import fusebox_bin
    exe = fusebox_bin()
    g = fusebox.Graph.from_json(CBR)
    live_path, other = tmp_path / "live.sqlite", tmp_path / "other.sqlite"
    live = fusebox.Session(device_properties=DEVPROP, cache=live_path)  # opened (and read) now
    fusebox.Session(device_properties=DEVPROP, cache=other).build(g)
    p = subprocess.run([exe, "cache", "export", str(live_path), "--cache", str(other)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "open in another connection or process" in p.stderr, p.stderr
    assert live.build(g).cache == "miss", "the live session's cache was replaced under it"
    live.close()
    p = subprocess.run([exe, "cache", "export", str(live_path), "--cache", str(other)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    again = fusebox.Session(device_properties=DEVPROP, cache=live_path)
    assert again.build(g).cache == "hit"


# ---------------------------------------------------------------- the checks before binding

def test_valid_tensors_reach_the_device_check(cbr_plan):
    tensors = like_graph(cbr_plan.graph)
    checked = cbr_plan.check_tensors(tensors, device=0)
    assert [n for n, _ in checked] == ["x", "w", "b", "y"]
    with pytest.raises(fusebox.NoDevice, match="deviceless"):
        cbr_plan(**tensors)
    # A size-1 dimension's stride does not matter: a contiguous bias [1, 16, 1, 1] is fine.
    ok = like_graph(cbr_plan.graph, b=FakeTensor((1, 16, 1, 1)))
    cbr_plan.check_tensors(ok, device=0)


def expect(plan, tensors, pattern, device=0):
    with pytest.raises(fusebox.InvalidArgument, match=pattern) as e:
        plan.check_tensors(tensors, device=device)
    return str(e.value)


def test_unknown_and_missing_names(cbr_plan):
    g = cbr_plan.graph
    t = like_graph(g, q=FakeTensor((1,)))
    expect(cbr_plan, t, r"graph 'conv_bias_relu_small' has no tensor 'q' to bind; it binds x, w, b, y")
    t = like_graph(g)
    del t["y"], t["b"]
    expect(cbr_plan, t, r"no tensor given for 'b', 'y' of graph 'conv_bias_relu_small' \(it binds x, w, b, y\)")
    # Through the call as well, before the deviceless session says NoDevice.
    with pytest.raises(fusebox.InvalidArgument, match="no tensor given for 'b', 'y'"):
        cbr_plan(**t)


def test_wrong_device(cbr_plan):
    g = cbr_plan.graph
    expect(cbr_plan, like_graph(g, x=FakeTensor((2, 8, 10, 10), device="cpu")),
           r"tensor 'x' is on cpu; expected a CUDA tensor on cuda:0")
    expect(cbr_plan, like_graph(g, w=FakeTensor((16, 8, 3, 3), strides=g.tensor("w").strides, device="cuda:1")),
           r"tensor 'w' is on cuda:1; the session runs on cuda:0")


def test_wrong_dtype(cbr_plan):
    g = cbr_plan.graph
    msg = expect(cbr_plan, like_graph(g, b=FakeTensor((1, 16, 1, 1), dtype="float32")),
                 r"tensor 'b' has dtype torch.float32; expected bf16 \(torch.bfloat16\)")
    assert msg.startswith("fusebox.Plan: ")
    expect(cbr_plan, like_graph(g, y=FakeTensor((2, 16, 5, 5), dtype="float64", strides=g.tensor("y").strides)),
           r"tensor 'y' has dtype torch.float64; expected bf16")


def test_wrong_shape(cbr_plan):
    g = cbr_plan.graph
    expect(cbr_plan, like_graph(g, y=FakeTensor((2, 16, 5, 4))), r"tensor 'y' has shape \[2, 16, 5, 4\]; "
           r"expected \[2, 16, 5, 5\]")
    expect(cbr_plan, like_graph(g, b=FakeTensor((16,))), r"tensor 'b' has shape \[16\]; expected \[1, 16, 1, 1\]")


def test_wrong_strides(cbr_plan):
    g = cbr_plan.graph
    # NCHW-contiguous where the graph lays x out NHWC: the hint names channels_last.
    msg = expect(cbr_plan, like_graph(g, x=FakeTensor((2, 8, 10, 10))),
                 r"tensor 'x' has strides \[800, 100, 10, 1\]; expected strides \[800, 1, 80, 8\]")
    assert "channels_last" in msg


def test_non_contiguous_where_graph_is_contiguous():
    g = fusebox.Graph.from_json(MATMUL)  # checked by the graph: no plan needed
    # a transposed view: shape [1, 64, 48], strides of a [1, 48, 64] tensor swapped
    with pytest.raises(fusebox.InvalidArgument,
                       match=r"fusebox.Graph: tensor 'a' has strides \[3072, 1, 64\] \(not "
                             r"contiguous\); expected strides \[3072, 48, 1\]: the graph declares it contiguous; "
                             r"pass tensor.contiguous\(\)"):
        g.check_tensors(like_graph(g, a=FakeTensor((1, 64, 48), strides=(3072, 1, 64))), device=0)
    assert [n for n, _ in g.check_tensors(like_graph(g), device=0)] == ["a", "b", "bias", "y"]


def test_not_a_tensor_null_and_misaligned(cbr_plan):
    g = cbr_plan.graph
    expect(cbr_plan, like_graph(g, x=[1, 2, 3]), r"tensor 'x': a builtins.list is not a device tensor")
    expect(cbr_plan, like_graph(g, y=FakeTensor((2, 16, 5, 5), strides=g.tensor("y").strides, ptr=0)),
           r"tensor 'y' has a NULL data pointer")
    expect(cbr_plan, like_graph(g, y=FakeTensor((2, 16, 5, 5), strides=g.tensor("y").strides, ptr=(1 << 20) + 1)),
           r"tensor 'y': data pointer 0x100001 is not aligned to its 2-byte elements")


def test_cuda_array_interface(deviceless):
    # The interface cannot spell bf16: an fp16 copy of the graphs binds cupy-like objects.
    g = fusebox.Graph.from_json(MATMUL)
    t = {n: FakeCai(g.tensor(n).dims, typestr="<f2", ptr=(i + 1) << 20) for i, n in enumerate(["a", "b", "bias", "y"])}
    with pytest.raises(fusebox.InvalidArgument, match=r"tensor 'a' has dtype typestr '<f2'; expected bf16$"):
        g.check_tensors(t, device=0)
    doc = json.load(open(MATMUL))
    doc["io_dtype"] = "fp16"
    g16 = fusebox.Graph.from_dict(doc)
    g16.check_tensors(t, device=0)

    def bad(pattern, **over):
        with pytest.raises(fusebox.InvalidArgument, match=pattern):
            g16.check_tensors(dict(t, **over), device=0)

    bad(r"tensor 'a' has strides \[3072, 1, 64\] \(not contiguous\)",
        a=FakeCai((1, 64, 48), typestr="<f2", strides=(6144, 2, 128)))
    bad(r"tensor 'a' has strides that are not whole elements", a=FakeCai((1, 64, 48), strides=(6144, 96, 3)))
    bad(r"tensor 'y' is on cuda:1; the session runs on cuda:0", y=FakeCai((1, 64, 40), device=1))
    bad(r"tensor 'y' has dtype typestr '<f4'; expected fp16$", y=FakeCai((1, 64, 40), typestr="<f4"))
    # Through a deviceless plan: the checks, then NoDevice.
    doc = json.load(open(CBR))
    doc["io_dtype"] = "fp16"
    plan16 = deviceless.build(fusebox.Graph.from_dict(doc))
    tc = {x.name: FakeCai(x.dims, strides=tuple(s * 2 for s in x.strides), ptr=(i + 1) << 20)
          for i, x in enumerate(plan16.graph.tensors)}
    plan16.check_tensors(tc, device=0)
    with pytest.raises(fusebox.NoDevice):
        plan16.run(tc, stream=0)


def test_torch_op_needs_torch():
    # With torch, tests/python/test_pymod_gpu.py covers torch_op (no skip here: the GPU section
    # of scripts/gpu_check.sh fails on any skip).
    try:
        import torch  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError):
            fusebox.torch_op(CBR, name="fusebox_test::no_torch")


def test_torch_op_schema_and_fake_kernel(monkeypatch, cbr_plan):
    """torch_op's registration and fake kernel against a stub of torch.library (the real one is
    exercised by test_pymod_gpu.py; with torch installed this test leaves torch alone)."""
    try:
        import torch  # noqa: F401
        return
    except ImportError:
        pass
    registered = {}

    def custom_op(name, fn, mutates_args, schema):
        op = types.SimpleNamespace(name=name, schema=schema, fn=fn, mutates_args=mutates_args)
        op.register_fake = lambda f: setattr(op, "fake", f)
        registered[name] = op
        return op

    stub = types.SimpleNamespace(
        library=types.SimpleNamespace(custom_op=custom_op), bfloat16="torch.bfloat16",
        device=lambda t, i: types.SimpleNamespace(type=t, index=i),
        empty_strided=lambda dims, strides, dtype, device: FakeTensor(dims, strides=strides),
        cuda=types.SimpleNamespace(current_device=lambda: 0))
    monkeypatch.setitem(__import__("sys").modules, "torch", stub)
    g = cbr_plan.graph
    op = fusebox.torch_op(g, name="fusebox_test::stub_cbr", plan=cbr_plan)
    assert op.schema == "(Tensor x, Tensor w, Tensor b) -> Tensor" and op.mutates_args == ()
    args = [FakeTensor(t.dims, strides=t.strides) for t in g.inputs]
    y = op.fake(*args)
    assert y.shape == (2, 16, 5, 5) and y.stride() == (400, 1, 80, 16)
    with pytest.raises(fusebox.InvalidArgument, match=r"fusebox op 'fusebox_test::stub_cbr': takes 3 tensors "
                                                      r"\(x, w, b\); given 2"):
        op.fake(*args[:2])
    with pytest.raises(fusebox.InvalidArgument, match=r"tensor 'b' has dtype torch.float32; expected bf16"):
        op.fake(args[0], args[1], FakeTensor((1, 16, 1, 1), dtype="float32"))
    # The real kernel: outputs from torch.empty_strided, then the run's checks; deviceless: NoDevice.
    with pytest.raises(fusebox.NoDevice):
        op.fn(*args)
    with pytest.raises(fusebox.InvalidArgument, match="registered already"):
        fusebox.torch_op(g, name="fusebox_test::stub_cbr", plan=cbr_plan)
    with pytest.raises(fusebox.InvalidArgument, match="'zz' is not an output of graph 'conv_bias_relu_small'"):
        fusebox.torch_op(g, name="fusebox_test::stub_zz", plan=cbr_plan, outputs=["zz"])
    doc = json.load(open(CBR))
    doc["tensors"][1]["name"] = "float"  # a name the schema cannot take as is
    for op_ in doc["ops"]:
        op_["inputs"] = {k: ("float" if v == "w" else v) for k, v in op_["inputs"].items()}
    g2 = fusebox.Graph.from_dict(doc)
    op2 = fusebox.torch_op(g2, name="fusebox_test::stub_renamed", plan=cbr_plan.session.build(g2))
    assert op2.schema == "(Tensor x, Tensor t1_float, Tensor b) -> Tensor"
