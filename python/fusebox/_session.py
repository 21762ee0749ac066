"""fusebox.Session and fusebox.Plan over the C API's session, plan and bound
plan handles (include/fusebox/fusebox.h)."""
import ctypes
import json
import os
import sys

from . import _lib, _tensors, errors
from ._graph import Graph


class Session:
    """One GPU (its own cuDNN handle), or deviceless: plans built for the GPU a
    device-properties file describes, on a machine without one (they can be
    saved, not run). `cache`: a SQLite plan cache path (created if missing),
    as `fusebox --cache`. One thread at a time."""

    def __init__(self, device=0, *, device_properties=None, cache=None):
        index = 0 if device_properties is not None and device in (None, 0) else _device_index(device)
        props = _lib.encode(device_properties, "Session: device_properties")
        cache_path = _lib.encode(cache, "Session: cache")
        h = ctypes.c_void_p()
        _lib.check(_lib.lib().fusebox_session_create(index, props, cache_path, ctypes.byref(h)))
        self._h = h
        self.cache = None if cache is None else os.fspath(cache)

    def __del__(self):
        h, self._h = getattr(self, "_h", None), None
        if h and _lib._lib is not None:
            _lib._lib.fusebox_session_free(h)

    def close(self):
        """Frees the session now (plans made from it keep what they need)."""
        self.__del__()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def deviceless(self) -> bool:
        return _lib.lib().fusebox_session_deviceless(self._h) == 1

    @property
    def device(self):
        """The CUDA device id, None for a deviceless session."""
        d = _lib.lib().fusebox_session_device_id(self._h)
        return None if d < 0 else d

    @property
    def device_name(self) -> str:
        return _lib.text(_lib.lib().fusebox_session_device_name(self._h))

    def build(self, graph, *, heuristics=None, engine=None, plan_file=None, max_workspace_bytes=None,
              use_tuned_cache=True) -> "Plan":
        """A plan for `graph` by the session's policy: a tuned cache entry, a heuristic cache entry,
        then a build trying heuristic modes a, b, fallback. `heuristics` ("a", "a,b") pins the modes,
        `engine` an engine by name, `plan_file` loads that plan file and nothing else."""
        graph = Graph.coerce(graph)
        req = _lib.PlanRequest(plan_file=_lib.encode(plan_file, "Session.build: plan_file"),
                               engine=_lib.encode(engine, "Session.build: engine"),
                               heuristics=_lib.encode(heuristics, "Session.build: heuristics"),
                               max_workspace_bytes=-1 if max_workspace_bytes is None else int(max_workspace_bytes),
                               use_tuned_cache=1 if use_tuned_cache else 0)
        h = ctypes.c_void_p()
        _lib.check(_lib.lib().fusebox_session_get_plan(self._h, graph._h, ctypes.byref(req), ctypes.byref(h)))
        return Plan(h, graph, self)

    get_plan = build

    def tune(self, graph, *, heuristics=None, warmup=5, iters=20, top_k=0, budget_ms=0.0,
             max_workspace_bytes=None, deterministic_only=False, cuda_graph=False) -> "Plan":
        """Times every admissible candidate on the session's GPU, verifies the fastest and stores it in
        the plan cache (a tuned entry already there is returned as is). NoDevice when deviceless.
        cuda_graph=True times each candidate per execute inside a CUDA graph (for plans replayed in
        CUDA graphs, e.g. under torch.cuda.graph); that winner is cached apart from the eager one."""
        graph = Graph.coerce(graph)
        req = _lib.TuneRequest(heuristics=_lib.encode(heuristics, "Session.tune: heuristics"), warmup=int(warmup), iters=int(iters),
                               max_workspace_bytes=-1 if max_workspace_bytes is None else int(max_workspace_bytes),
                               top_k=int(top_k), budget_ms=float(budget_ms),
                               deterministic_only=1 if deterministic_only else 0)
        h = ctypes.c_void_p()
        call = _lib.lib().fusebox_session_tune_in_cuda_graph if cuda_graph else _lib.lib().fusebox_session_tune
        _lib.check(call(self._h, graph._h, ctypes.byref(req), ctypes.byref(h)))
        return Plan(h, graph, self)

    def run(self, plan, tensors, stream=None):
        """Executes `plan` on {name: tensor} (every tensor of the graph, outputs included), in place,
        asynchronously on `stream` (default: torch's current stream on the session's device, else
        CUDA's default stream). Each tensor is checked first: device, dtype, shape, strides."""
        if not isinstance(plan, Plan):
            raise errors.InvalidArgument(f"Session.run: expected a fusebox.Plan, got {type(plan).__name__}")
        if plan.session is not self:
            raise errors.InvalidArgument("Session.run: the plan was made by another session; run it there "
                                         "(plan(**tensors)) or build it in this one")
        return plan._run(tensors, stream)

    def __repr__(self):
        where = "deviceless" if self.deviceless else f"cuda:{self.device}"
        return f"fusebox.Session({self.device_name!r}, {where})"


_MAX_DEVICE_ID = 2**31 - 1  # the C API's int


def _device_index(device):
    """The CUDA device id of an int, "cuda" / "cuda:N", or a torch.device (any object with
    .type == "cuda" and .index); InvalidArgument naming the device given otherwise."""
    accepted = 'accepted: an int >= 0, "cuda", "cuda:N" or a torch.device("cuda", N)'
    if isinstance(device, bool):
        raise errors.InvalidArgument(f"Session: device {device!r} is not a CUDA device id ({accepted})")
    if isinstance(device, int):
        idx = device
    elif isinstance(device, str):
        kind, colon, num = device.strip().partition(":")
        if kind != "cuda" or (colon and not num.strip().isdigit()):
            raise errors.InvalidArgument(f"Session: device {device!r} is not a CUDA device ({accepted})")
        idx = int(num) if colon else 0
    elif getattr(device, "type", None) == "cuda":
        idx = getattr(device, "index", None)
        idx = 0 if idx is None else idx
        if isinstance(idx, bool) or not isinstance(idx, int):
            raise errors.InvalidArgument(f"Session: device {device!r} has index {idx!r}, not an int ({accepted})")
    else:
        raise errors.InvalidArgument(f"Session: device {device!r} is not a CUDA device ({accepted})")
    if not 0 <= idx <= _MAX_DEVICE_ID:
        raise errors.InvalidArgument(f"Session: device {device!r}: no GPU with id {idx} (ids are 0 to the number "
                                     f"of GPUs - 1)")
    return idx


def _current_stream(torch, device):
    """torch's current cudaStream_t on `device`, as an int (its private raw getter where it has one:
    a fraction of a microsecond, against several for current_stream())."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(device) if raw is not None else torch.cuda.current_stream(device).cuda_stream


def _stream_handle(stream, device, uses_torch):
    """A cudaStream_t as an int: torch's current stream by default (for torch tensors)."""
    if stream is None:
        if uses_torch:
            return sys.modules["torch"].cuda.current_stream(device).cuda_stream
        cupy = sys.modules.get("cupy")
        if cupy is not None:
            return cupy.cuda.get_current_stream().ptr
        return 0
    for attr in ("cuda_stream", "ptr"):  # torch.cuda.Stream, cupy.cuda.Stream
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    return int(stream)


class Plan:
    """A plan for one graph, from Session.build or Session.tune. Call it with the tensors:
    plan(x=x, w=w, b=b, y=y)."""

    def __init__(self, handle, graph, session):
        self._h = handle
        self.graph = graph
        self.session = session
        self._bound = None  # (key, fusebox_bound_plan*): reused while the pointers stay the same
        # (signature, workspace pointer, workspace bytes): the last call's torch tensors, checked and
        # bound (no library call on the fast path). A call whose
        # tensors have the same signature (name, pointer, dtype, shape, strides, device: everything the
        # checks look at) skips the checks and the binding (_fast_run).
        self._fast = None

    def __del__(self):
        self._drop_bound()
        h, self._h = getattr(self, "_h", None), None
        if h and _lib._lib is not None:
            _lib._lib.fusebox_plan_free(h)

    def _drop_bound(self):
        self._fast = None
        b, self._bound = getattr(self, "_bound", None), None
        if b and _lib._lib is not None:
            _lib._lib.fusebox_bound_plan_free(b[1])

    @property
    def engine(self) -> str:
        return _lib.text(_lib.lib().fusebox_plan_engine(self._h))

    @property
    def workspace_bytes(self) -> int:
        return int(_lib.lib().fusebox_plan_workspace_bytes(self._h))

    @property
    def source(self) -> str:
        """"built now", "plan cache (tuned)", "plan file (built deviceless)", "tuned now (...)", ..."""
        return _lib.text(_lib.lib().fusebox_plan_source(self._h))

    @property
    def cache(self) -> str:
        """The plan cache's part: "hit", "miss" or "off"."""
        return _lib.text(_lib.lib().fusebox_plan_cache_result(self._h))

    def report(self) -> dict:
        """Where the plan came from and what it cost, as `fusebox build --json` prints it under
        "plan" (source, cache, plan check, partition, ...), with the serving build's five steps
        under "build": one serializer in the library for the CLI, the C API and Python."""
        return json.loads(_lib.text(_lib.lib().fusebox_plan_report_json(self._h)))

    def save(self, path):
        """Writes a plan file (as `fusebox build --plan-out`); Session.build(plan_file=path) reads it.
        Never over a file the plan came from (the graph file, the session's cache or device file):
        InvalidArgument."""
        _lib.check(_lib.lib().fusebox_plan_save(self._h, _lib.encode(path, "Plan.save: path")))

    def check_tensors(self, tensors, device=None):
        """Checks {name: tensor} as a run would, without running: InvalidArgument names the tensor and
        what was expected. `device`: the CUDA device they must be on (default: the session's)."""
        dev = self.session.device if device is None else device
        return _tensors.check_all("fusebox.Plan", self.graph.name, self.graph.tensors, tensors, dev)

    def __call__(self, **tensors):
        """Runs on torch's current stream: plan(x=x, w=w, b=b, y=y)."""
        return self._run(tensors, None)

    def run(self, tensors, stream=None):
        """Runs on {name: tensor} on `stream` (a torch.cuda.Stream, a cupy stream or a cudaStream_t
        as an int; default torch's current stream)."""
        return self._run(tensors, stream)

    def _fast_run(self, tensors):
        """The last call again on new data (same tensors, or tensors with the same pointers and
        layout): True when it ran. Host cost of a call is most of what this saves (docs/python.md)."""
        sig, ws_ptr, ws_bytes = self._fast
        torch = sys.modules.get("torch")
        if torch is None or len(tensors) != len(sig):
            return False
        tensor_type = torch.Tensor
        for (name, ptr, dtype, shape, stride, device), (n, t) in zip(sig, tensors.items()):
            if (n != name or type(t) is not tensor_type or t.data_ptr() != ptr or t.dtype != dtype
                    or t.shape != shape or t.stride() != stride or t.device != device):
                return False
        dev = self.session.device
        if torch.cuda.current_device() != dev:
            return False
        workspace = None
        if ws_ptr is not None:
            workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=sig[0][5])
            if workspace.data_ptr() != ws_ptr:
                return False
        _lib.check(_lib.lib().fusebox_execute(self._bound[1], _current_stream(torch, dev)))
        return True

    def _run(self, tensors, stream):
        if stream is None and self._fast is not None and self._fast_run(tensors):
            return None
        views = self.check_tensors(tensors)
        s = self.session
        if s.deviceless:
            raise errors.NoDevice(f"fusebox.Plan: the session is deviceless (built for {s.device_name}); "
                                  "create Session(device=N) to run plans")
        device = s.device
        torch = sys.modules.get("torch")
        uses_torch = torch is not None and any(v.kind == "torch" for _, v in views)
        workspace, ws_ptr, ws_bytes = None, None, self.workspace_bytes
        handle = _stream_handle(stream, device, uses_torch)
        if ws_bytes > 0:
            if uses_torch:
                workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=f"cuda:{device}")
                if stream is not None:  # allocated for the current stream, used on another one
                    workspace.record_stream(torch.cuda.ExternalStream(handle, device=f"cuda:{device}"))
                ws_ptr = workspace.data_ptr()
            elif sys.modules.get("cupy") is not None:
                cupy = sys.modules["cupy"]
                with cupy.cuda.Device(device):
                    workspace = cupy.empty(ws_bytes, dtype=cupy.uint8)
                ws_ptr = workspace.data.ptr
        key = (tuple(v.ptr for _, v in views), ws_ptr, ws_bytes if ws_ptr else None)
        if self._bound is None or self._bound[0] != key:
            self._drop_bound()
            n = len(views)
            names = (ctypes.c_char_p * n)(*[_lib.encode(name, "fusebox.Plan: tensor name") for name, _ in views])
            ptrs = (ctypes.c_void_p * n)(*[v.ptr for _, v in views])
            out = ctypes.c_void_p()
            lib = _lib.lib()
            if ws_ptr is None and ws_bytes > 0:  # no torch or cupy to allocate with: the session's arena
                _lib.check(lib.fusebox_bind(s._h, self._h, n, names, ptrs, ctypes.byref(out)))
            else:
                _lib.check(lib.fusebox_bind_with_workspace(s._h, self._h, n, names, ptrs, ws_ptr, ws_bytes if ws_ptr
                                                           else 0, ctypes.byref(out)))
            self._bound = (key, out)
        if uses_torch:
            with torch.cuda.device(device):
                _lib.check(_lib.lib().fusebox_execute(self._bound[1], handle))
            if stream is None and all(type(t) is torch.Tensor for t in tensors.values()) and \
                    (ws_bytes == 0 or workspace is not None):
                self._fast = (tuple((n, t.data_ptr(), t.dtype, t.shape, t.stride(), t.device)
                                    for n, t in tensors.items()), ws_ptr if ws_bytes > 0 else None, ws_bytes)
        else:
            _lib.check(_lib.lib().fusebox_execute(self._bound[1], handle))
        return None

    def __repr__(self):
        return (f"fusebox.Plan(graph={self.graph.name!r}, engine={self.engine!r}, "
                f"workspace_bytes={self.workspace_bytes}, source={self.source!r})")
