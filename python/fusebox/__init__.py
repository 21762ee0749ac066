"""fusebox from Python: graphs, sessions and plans of libfusebox.so (its C API,
through ctypes), run on PyTorch tensors (or __cuda_array_interface__ objects)
with no copies. Guide: docs/python.md.

    import fusebox, torch
    g = fusebox.Graph.from_json("examples/graphs/small/conv_bias_relu_small.json")
    s = fusebox.Session(device=0)
    plan = s.build(g)
    y = g.empty("y")
    plan(x=x, w=w, b=b, y=y)           # on torch.cuda.current_stream()
"""
import os

from ._graph import BackwardGraph, Graph, GraphInfo, TensorInfo
from ._lib import C_API_VERSION, library_path
from ._lm import LmEngine, LmTrainer
from ._session import Plan, Session
from ._tensors import torch_dtype
from ._torch_op import torch_op
from .errors import (CudaError, CudnnError, Error, Internal, InvalidArgument, IoError, LibraryNotFound, NoDevice,
                     NotSupported, OutOfMemory, ParseError, VerificationFailed, VersionMismatch)

__version__ = "0.1.0"


def version():
    """The loaded libfusebox's version, e.g. "0.1.0"."""
    from . import _lib
    return _lib.text(_lib.lib().fusebox_version())


def devprop_path(name="h200-cudnn-9.27"):
    """A device-properties file shipped with fusebox (for Session(device_properties=...)): the
    wheel's copy, else the checkout's devices/ folder."""
    here = os.path.dirname(os.path.abspath(__file__))
    for d in (os.path.join(here, "devices"), os.path.join(os.path.dirname(os.path.dirname(here)), "devices")):
        p = os.path.join(d, name + ".devprop")
        if os.path.isfile(p):
            return p
    raise IoError(f"device-properties file {name}.devprop not found (looked in the package and the checkout)")


__all__ = ["LmTrainer", "LmEngine", "Graph", "BackwardGraph", "GraphInfo", "TensorInfo", "Session", "Plan", "torch_op", "torch_dtype", "version",
           "library_path", "devprop_path", "C_API_VERSION", "Error", "InvalidArgument", "ParseError", "NotSupported",
           "IoError", "CudnnError", "CudaError", "NoDevice", "VersionMismatch", "VerificationFailed", "Internal",
           "OutOfMemory", "LibraryNotFound"]
