"""fusebox.Graph: a checked graph (shapes, strides and dtypes inferred by
fusebox's own resolver, through the C API)."""
import ctypes
import json
import os
from dataclasses import dataclass
from typing import Dict, List, Tuple

from . import _lib, errors


@dataclass(frozen=True)
class TensorInfo:
    """One tensor the caller binds: virtual tensors and by-value scalars are not listed."""

    name: str
    kind: str  # "input" or "output"
    dtype: str  # fusebox's name: "bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2", "int32", "int64", "uint8"
    dims: Tuple[int, ...]
    strides: Tuple[int, ...]  # in elements
    bytes: int  # the device memory it spans

    @property
    def is_output(self):
        return self.kind == "output"


class _TensorLists:
    """inputs and outputs of anything with `tensors` (GraphInfo, Graph)."""

    @property
    def inputs(self) -> List[TensorInfo]:
        return [t for t in self.tensors if not t.is_output]

    @property
    def outputs(self) -> List[TensorInfo]:
        return [t for t in self.tensors if t.is_output]


@dataclass(frozen=True)
class GraphInfo(_TensorLists):
    """What graph.check() returns: the graph's name, its tensors to bind and `fusebox check`'s listing."""

    name: str
    tensors: Tuple[TensorInfo, ...]
    text: str

    def __getitem__(self, name) -> TensorInfo:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    def to_dict(self) -> Dict:
        return {"name": self.name,
                "tensors": [{"name": t.name, "kind": t.kind, "dtype": t.dtype, "dims": list(t.dims),
                             "strides": list(t.strides), "bytes": t.bytes} for t in self.tensors]}


def _tensor_info(ti: _lib.TensorInfo) -> TensorInfo:
    n = ti.rank
    return TensorInfo(name=_lib.text(ti.name), kind="output" if ti.kind == 1 else "input",
                      dtype=_lib.text(ti.dtype), dims=tuple(ti.dims[i] for i in range(n)),
                      strides=tuple(ti.strides[i] for i in range(n)), bytes=ti.bytes)


class Graph(_TensorLists):
    """A graph in fusebox's JSON format (docs/graph-format.md), checked when made.

    Graph.from_json(text or path), Graph.from_dict(dict), Graph.load(path).
    """

    def __init__(self, handle):
        # Use the constructors below; `handle` is a fusebox_graph*.
        self._h = handle
        self._tensors = None

    @classmethod
    def from_json(cls, source) -> "Graph":
        """A graph from JSON text (a str starting with '{') or from a file (a path or os.PathLike)."""
        if isinstance(source, (bytes, bytearray)):
            return cls._from_text(bytes(source))
        if isinstance(source, os.PathLike):
            return cls.load(source)
        if not isinstance(source, str):
            raise errors.InvalidArgument(f"Graph.from_json: expected JSON text or a path, got {type(source).__name__}")
        if source.lstrip().startswith("{"):
            return cls._from_text(source.encode("utf-8"))
        return cls.load(source)

    @classmethod
    def from_dict(cls, doc) -> "Graph":
        """A graph from the JSON document as Python objects (dicts, lists, numbers, strings)."""
        if not isinstance(doc, dict):
            raise errors.InvalidArgument(f"Graph.from_dict: expected a dict, got {type(doc).__name__}")
        try:
            text = json.dumps(doc, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise errors.InvalidArgument(f"Graph.from_dict: not a JSON document: {e}") from None
        return cls._from_text(text.encode("utf-8"))

    @classmethod
    def load(cls, path) -> "Graph":
        h = ctypes.c_void_p()
        _lib.check(_lib.lib().fusebox_graph_load(_lib.encode(path, "Graph.load: path"), ctypes.byref(h)))
        return cls(h)

    @classmethod
    def _from_text(cls, data: bytes) -> "Graph":
        h = ctypes.c_void_p()
        _lib.check(_lib.lib().fusebox_graph_from_json(data, len(data), ctypes.byref(h)))
        return cls(h)

    @classmethod
    def coerce(cls, g) -> "Graph":
        """A Graph as is; a dict, JSON text or path made into one."""
        if isinstance(g, Graph):
            return g
        if isinstance(g, dict):
            return cls.from_dict(g)
        return cls.from_json(g)

    def __del__(self):
        h, self._h = getattr(self, "_h", None), None
        if h and _lib._lib is not None:
            _lib._lib.fusebox_graph_free(h)

    @property
    def name(self) -> str:
        return _lib.text(_lib.lib().fusebox_graph_name(self._h))

    @property
    def tensors(self) -> Tuple[TensorInfo, ...]:
        """The tensors to bind, in the graph's order."""
        if self._tensors is None:
            lib = _lib.lib()
            out = []
            for i in range(lib.fusebox_graph_tensor_count(self._h)):
                ti = _lib.TensorInfo()
                _lib.check(lib.fusebox_graph_tensor(self._h, i, ctypes.byref(ti)))
                out.append(_tensor_info(ti))
            self._tensors = tuple(out)
        return self._tensors

    def tensor(self, name) -> TensorInfo:
        """One tensor by name; InvalidArgument names the ones there are."""
        ti = _lib.TensorInfo()
        _lib.check(_lib.lib().fusebox_graph_find_tensor(self._h, _lib.encode(name, "Graph.tensor: name"),
                                                         ctypes.byref(ti)))
        return _tensor_info(ti)

    def describe(self) -> str:
        """`fusebox check`'s listing of tensors and ops."""
        return _lib.text(_lib.lib().fusebox_graph_describe(self._h))

    def backward(self, wrt=None, seeds=None) -> "BackwardGraph":
        """The backward graph by the ops' gradient rules (docs/training.md): a Graph whose inputs
        are the seeds' gradients ("<y>.grad") and saved forward tensors, whose outputs are
        "<x>.grad"; `.bindings` says where each input comes from. `wrt` / `seeds`: names
        (a list or a comma-separated string), None for the defaults. NotSupported names an op
        without a rule."""
        def names(v, what):
            if v is None:
                return None
            if isinstance(v, str):
                v = [v]
            return _lib.encode(",".join(v), f"Graph.backward: {what}")
        h = ctypes.c_void_p()
        _lib.check(_lib.lib().fusebox_graph_backward(self._h, names(wrt, "wrt"), names(seeds, "seeds"),
                                                     ctypes.byref(h)))
        return BackwardGraph(h)

    def check(self) -> GraphInfo:
        """The graph as fusebox resolved it: every tensor to bind with dims, strides, dtype, kind, bytes."""
        return GraphInfo(name=self.name, tensors=self.tensors, text=self.describe())

    def check_tensors(self, tensors, device=None):
        """Checks {name: tensor} against the graph as a run does (names, device, dtype, shape, strides,
        pointer), without a plan: InvalidArgument names the tensor and what was expected.
        `device`: the CUDA device id they must be on (None: any)."""
        from ._tensors import check_all
        return check_all("fusebox.Graph", self.name, self.tensors, tensors, device)

    def empty(self, name, device=None):
        """A torch tensor laid out as the graph's tensor `name` (torch.empty_strided: dims, strides, dtype)."""
        from ._tensors import torch_dtype
        import torch
        t = self.tensor(name)
        return torch.empty_strided(t.dims, t.strides, dtype=torch_dtype(t.dtype),
                                   device=device if device is not None else "cuda")

    def __repr__(self):
        return f"fusebox.Graph({self.name!r}, tensors={[t.name for t in self.tensors]})"


class BackwardGraph(Graph):
    """A graph made by Graph.backward(): also its JSON text (`.json`, a graph file) and
    its bindings to the forward (`.bindings`, a dict: "inputs", "gradients", "seeds",
    "saved", "saved_bytes", "recomputed")."""

    @property
    def json(self) -> str:
        return _lib.text(_lib.lib().fusebox_graph_backward_json(self._h))

    @property
    def bindings(self) -> Dict:
        return json.loads(_lib.text(_lib.lib().fusebox_graph_backward_bindings(self._h)))
