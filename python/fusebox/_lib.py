"""libfusebox.so through ctypes: finding it, its C API's prototypes, and its
status codes as exceptions. The module compiles nothing: any Python 3 that can
load the library works, whatever version the library was built next to.

Where the library is looked for, first found wins:
  1. $FUSEBOX_LIBRARY (a path to libfusebox.so),
  2. lib/libfusebox.so inside this package (the wheel `pip wheel .` builds),
  3. build/libfusebox.so of the checkout this package sits in (python/fusebox),
  4. the system's (ctypes.util.find_library("fusebox"), an installed prefix).
"""
import ctypes
import ctypes.util
import glob
import os
import sys
import threading

from . import errors

# The C API version this module needs: 2 added bind_with_workspace, tune,
# find_tensor, session_device_id and plan_cache_result; 3 tune_in_cuda_graph; 5 backward;
# 6 the language model's trainer and serving engine.
C_API_VERSION = 9

_HERE = os.path.dirname(os.path.abspath(__file__))
_lock = threading.Lock()
_lib = None
_path = None


class TensorInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("kind", ctypes.c_int), ("dtype", ctypes.c_char_p),
                ("rank", ctypes.c_int), ("dims", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("bytes", ctypes.c_int64)]


class PlanRequest(ctypes.Structure):
    _fields_ = [("plan_file", ctypes.c_char_p), ("engine", ctypes.c_char_p), ("heuristics", ctypes.c_char_p),
                ("max_workspace_bytes", ctypes.c_int64), ("use_tuned_cache", ctypes.c_int)]


class TuneRequest(ctypes.Structure):
    _fields_ = [("heuristics", ctypes.c_char_p), ("warmup", ctypes.c_int), ("iters", ctypes.c_int),
                ("max_workspace_bytes", ctypes.c_int64), ("top_k", ctypes.c_int), ("budget_ms", ctypes.c_double),
                ("deterministic_only", ctypes.c_int)]


class LmStep(ctypes.Structure):
    _fields_ = [("step", ctypes.c_int64), ("loss", ctypes.c_double), ("grad_norm", ctypes.c_double),
                ("lr", ctypes.c_double), ("seconds", ctypes.c_double), ("tokens", ctypes.c_int64),
                ("cuda_graph", ctypes.c_int)]


class LmToken(ctypes.Structure):
    _fields_ = [("request", ctypes.c_int64), ("token", ctypes.c_int32), ("finished", ctypes.c_int)]


def candidates():
    """The paths tried, in order (see the module's docstring)."""
    out = []
    env = os.environ.get("FUSEBOX_LIBRARY")
    if env:
        return [env]  # named explicitly: nothing else
    out += sorted(glob.glob(os.path.join(_HERE, "lib", "libfusebox.so*")))
    repo = os.path.dirname(os.path.dirname(_HERE))
    if os.path.isfile(os.path.join(repo, "CMakeLists.txt")):
        out.append(os.path.join(repo, "build", "libfusebox.so"))
    found = ctypes.util.find_library("fusebox")
    if found:
        out.append(found)
    return out


def _preload_pip_cudnn():
    # torch's wheels bring cuDNN as the nvidia-cudnn-* package; where it is
    # present and not loaded yet (torch not imported), load it first so
    # libfusebox.so's libcudnn.so.9 is that one rather than an older system
    # copy (the H200 machine has 9.14 in /usr/lib, which fusebox refuses).
    for base in sys.path:
        lib = os.path.join(base or ".", "nvidia", "cudnn", "lib", "libcudnn.so.9")
        if os.path.isfile(lib):
            try:
                ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
            except OSError:
                pass
            return


def _declare(lib):
    c = ctypes
    P = c.c_void_p
    S = c.c_int  # fusebox_status
    sigs = {
        "fusebox_version": (c.c_char_p, []),
        "fusebox_c_api_version": (c.c_int, []),
        "fusebox_status_name": (c.c_char_p, [S]),
        "fusebox_last_error": (c.c_char_p, []),
        "fusebox_last_status": (S, []),
        "fusebox_graph_from_json": (S, [c.c_char_p, c.c_size_t, c.POINTER(P)]),
        "fusebox_graph_load": (S, [c.c_char_p, c.POINTER(P)]),
        "fusebox_graph_free": (None, [P]),
        "fusebox_graph_name": (c.c_char_p, [P]),
        "fusebox_graph_describe": (c.c_char_p, [P]),
        "fusebox_graph_backward": (S, [P, c.c_char_p, c.c_char_p, c.POINTER(P)]),
        "fusebox_graph_backward_json": (c.c_char_p, [P]),
        "fusebox_graph_backward_bindings": (c.c_char_p, [P]),
        "fusebox_graph_tensor_count": (c.c_size_t, [P]),
        "fusebox_graph_tensor": (S, [P, c.c_size_t, c.POINTER(TensorInfo)]),
        "fusebox_graph_find_tensor": (S, [P, c.c_char_p, c.POINTER(TensorInfo)]),
        "fusebox_session_create": (S, [c.c_int, c.c_char_p, c.c_char_p, c.POINTER(P)]),
        "fusebox_session_free": (None, [P]),
        "fusebox_session_deviceless": (c.c_int, [P]),
        "fusebox_session_device_name": (c.c_char_p, [P]),
        "fusebox_session_device_id": (c.c_int, [P]),
        "fusebox_session_get_plan": (S, [P, P, c.POINTER(PlanRequest), c.POINTER(P)]),
        "fusebox_session_tune": (S, [P, P, c.POINTER(TuneRequest), c.POINTER(P)]),
        "fusebox_session_tune_in_cuda_graph": (S, [P, P, c.POINTER(TuneRequest), c.POINTER(P)]),
        "fusebox_plan_free": (None, [P]),
        "fusebox_plan_engine": (c.c_char_p, [P]),
        "fusebox_plan_workspace_bytes": (c.c_int64, [P]),
        "fusebox_plan_source": (c.c_char_p, [P]),
        "fusebox_plan_cache_result": (c.c_char_p, [P]),
        "fusebox_plan_report_json": (c.c_char_p, [P]),
        "fusebox_plan_save": (S, [P, c.c_char_p]),
        "fusebox_bind": (S, [P, P, c.c_size_t, c.POINTER(c.c_char_p), c.POINTER(P), c.POINTER(P)]),
        "fusebox_bind_with_workspace": (S, [P, P, c.c_size_t, c.POINTER(c.c_char_p), c.POINTER(P), P, c.c_int64,
                                            c.POINTER(P)]),
        "fusebox_bound_plan_free": (None, [P]),
        "fusebox_bound_plan_rebind": (S, [P, c.c_char_p, P]),
        "fusebox_execute": (S, [P, P]),
        "fusebox_lm_trainer_create": (S, [c.c_char_p, c.c_char_p, c.c_int64, c.c_char_p, c.c_char_p, c.POINTER(P)]),
        "fusebox_lm_trainer_free": (None, [P]),
        "fusebox_lm_trainer_tokens_per_step": (c.c_int64, [P]),
        "fusebox_lm_trainer_steps_done": (c.c_int64, [P]),
        "fusebox_lm_trainer_step": (S, [P, c.POINTER(c.c_int32), c.POINTER(c.c_int32), c.c_size_t,
                                        c.POINTER(LmStep)]),
        "fusebox_lm_trainer_save": (S, [P, c.c_char_p]),
        "fusebox_lm_trainer_load": (S, [P, c.c_char_p]),
        "fusebox_lm_engine_create": (S, [c.c_char_p, c.c_char_p, c.c_int64, c.c_int64, c.c_int64, c.POINTER(P)]),
        "fusebox_lm_engine_create_with_weights": (S, [c.c_char_p, c.c_char_p, c.c_char_p, c.c_int64, c.c_int64,
                                                      c.c_int64, c.POINTER(P)]),
        "fusebox_lm_engine_create_with_options": (S, [c.c_char_p, c.c_char_p, c.c_char_p, c.c_int64, c.c_int64,
                                                      c.c_int64, c.c_int, c.POINTER(P)]),
        "fusebox_lm_engine_create_with_kv_cache": (S, [c.c_char_p, c.c_char_p, c.c_char_p, c.c_char_p, c.c_int64,
                                                       c.c_int64, c.c_int64, c.c_int, c.POINTER(P)]),
        "fusebox_lm_engine_free": (None, [P]),
        "fusebox_lm_engine_add": (S, [P, c.POINTER(c.c_int32), c.c_size_t, c.c_int64, c.c_double, c.c_int64,
                                      c.c_double, c.c_uint64, c.c_int32, c.POINTER(c.c_int64)]),
        "fusebox_lm_engine_step": (S, [P, c.POINTER(LmToken), c.c_size_t, c.POINTER(c.c_size_t)]),
        "fusebox_lm_engine_idle": (c.c_int, [P]),
    }
    for name, (res, args) in sigs.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args


def lib():
    """The loaded library (loaded on first use); LibraryNotFound says where it looked."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in candidates():
            if os.sep in path and not os.path.isfile(path):
                tried.append(f"{path} (missing)")
                continue
            if "torch" not in sys.modules:
                _preload_pip_cudnn()
            try:
                handle = ctypes.CDLL(path)
            except OSError as e:
                tried.append(f"{path} ({e})")
                continue
            try:
                _declare(handle)
            except AttributeError as e:
                tried.append(f"{path} (not fusebox's, or older than C API {C_API_VERSION}: {e})")
                continue
            have = handle.fusebox_c_api_version()
            if have < C_API_VERSION:
                tried.append(f"{path} (C API {have}; this module needs {C_API_VERSION})")
                continue
            _lib, _path = handle, path
            return _lib
        raise errors.LibraryNotFound(
            "libfusebox.so not found or not loadable; tried: " + ("; ".join(tried) or "nothing") +
            ". Set FUSEBOX_LIBRARY=/path/to/libfusebox.so, build the checkout (make build), or install the "
            "wheel (`pip wheel .`, docs/python.md)")


def library_path():
    """The path of the libfusebox.so in use (loading it if needed)."""
    lib()
    return _path


def text(b):
    return b.decode("utf-8", "replace") if b is not None else None


def check(status):
    """Raises the exception for a failed call's status, with the library's message."""
    if status == 0:
        return
    cls = errors.BY_CODE.get(status, errors.Error)
    raise cls(text(lib().fusebox_last_error()))


def encode(s, what="argument"):
    """`s` as the bytes of a C string (None stays None). A NUL byte would cut the string short in C (a
    different path or tensor name than the one given): InvalidArgument (a ValueError) naming `what`."""
    if s is None:
        return None
    b = os.fsencode(s) if isinstance(s, os.PathLike) else bytes(s) if isinstance(s, bytes) else str(s).encode("utf-8")
    if b"\0" in b:
        raise errors.InvalidArgument(f"{what} {s!r} contains a NUL byte; C strings end there, so it would name "
                                     f"something else: give it without NUL bytes")
    return b
