"""The language model of docs/lm.md from Python: LmTrainer (one optimizer step per call, on the
caller's token batches) and LmEngine (the serving engine), over libfusebox.so's C API (v6).
Guide: docs/training.md and docs/serving.md.

    t = fusebox.LmTrainer("examples/train/lm_tiny.json", work_dir="runs/py", total_steps=20)
    ids, labels = ...  # t.tokens_per_step int32 values each (accum x batch x context)
    r = t.step(ids, labels)           # {"step", "loss", "grad_norm", "lr", "seconds", "tokens", "cuda_graph"}
    t.save("runs/py/checkpoint.safetensors")

    e = fusebox.LmEngine("runs/py/checkpoint.safetensors", page_size=16, pool_pages=256, max_batch=8)
    rid = e.add([1, 2, 3], max_new_tokens=8)
    while not e.idle:
        for request, token, finished in e.step(): ...
"""
import ctypes

from . import _lib


def _int32_array(values, what):
    """A ctypes int32 array of `values` (a list, or anything with tolist(), e.g. a numpy array)."""
    if hasattr(values, "tolist"):
        values = values.tolist()
    values = list(values)
    # ctypes wraps out-of-range integers silently (2**32 + 5 would become 5): check first.
    if not all(isinstance(v, int) and -2**31 <= v < 2**31 for v in values):
        from .errors import InvalidArgument
        raise InvalidArgument(f"{what} must be 32-bit integers")
    return (ctypes.c_int32 * len(values))(*values), len(values)


class LmTrainer:
    """fusebox/train.h's LmTrainer: the model of a config JSON, its derived backward and AdamW."""

    def __init__(self, config, work_dir, total_steps, backend="reference", plan_cache=None):
        lib = _lib.lib()
        h = ctypes.c_void_p()
        _lib.check(lib.fusebox_lm_trainer_create(_lib.encode(config, "config"), _lib.encode(work_dir, "work_dir"),
                                                 int(total_steps), _lib.encode(backend, "backend"),
                                                 _lib.encode(plan_cache, "plan_cache"), ctypes.byref(h)))
        self._h = h

    def __del__(self):
        h = getattr(self, "_h", None)
        if h:
            _lib.lib().fusebox_lm_trainer_free(h)
            self._h = None

    @property
    def tokens_per_step(self):
        """How many ids (and labels) one step takes: accum x batch x context."""
        return _lib.lib().fusebox_lm_trainer_tokens_per_step(self._h)

    @property
    def steps_done(self):
        return _lib.lib().fusebox_lm_trainer_steps_done(self._h)

    def step(self, ids, labels):
        """One optimizer step; a dict of its loss, gradient norm, learning rate and timing."""
        a, n = _int32_array(ids, "ids")
        b, m = _int32_array(labels, "labels")
        if n != m:
            from .errors import InvalidArgument
            raise InvalidArgument(f"{n} ids and {m} labels: give as many of each")
        r = _lib.LmStep()
        _lib.check(_lib.lib().fusebox_lm_trainer_step(self._h, a, b, n, ctypes.byref(r)))
        return {"step": r.step, "loss": r.loss, "grad_norm": r.grad_norm, "lr": r.lr, "seconds": r.seconds,
                "tokens": r.tokens, "cuda_graph": bool(r.cuda_graph)}

    def save(self, path):
        _lib.check(_lib.lib().fusebox_lm_trainer_save(self._h, _lib.encode(path, "path")))

    def load(self, path):
        _lib.check(_lib.lib().fusebox_lm_trainer_load(self._h, _lib.encode(path, "path")))


class LmEngine:
    """fusebox/serve.h's LmEngine over a checkpoint: continuous batching over a paged KV pool."""

    def __init__(self, checkpoint, backend="reference", page_size=16, pool_pages=256, max_batch=8, weights="bf16",
                 deterministic=False, kv_cache="bf16"):
        """weights: "bf16", "fp8" (e4m3, a scale per output channel) or "fp8-tensor" (docs/serving.md).
        deterministic: a request's tokens do not depend on the requests beside it, bit for bit (slower).
        kv_cache: "bf16" or "fp8" (e4m3 with a descale per token and KV head, docs/serving.md)."""
        h = ctypes.c_void_p()
        _lib.check(_lib.lib().fusebox_lm_engine_create_with_kv_cache(
            _lib.encode(checkpoint, "checkpoint"), _lib.encode(backend, "backend"), _lib.encode(weights, "weights"),
            _lib.encode(kv_cache, "kv_cache"), int(page_size), int(pool_pages), int(max_batch),
            1 if deterministic else 0, ctypes.byref(h)))
        self._h = h
        self._max_batch = int(max_batch)

    def __del__(self):
        h = getattr(self, "_h", None)
        if h:
            _lib.lib().fusebox_lm_engine_free(h)
            self._h = None

    def add(self, prompt, max_new_tokens=16, temperature=0.0, top_k=0, top_p=1.0, seed=0, stop_token=-1):
        """Queues a request; its id."""
        a, n = _int32_array(prompt, "prompt")
        rid = ctypes.c_int64()
        _lib.check(_lib.lib().fusebox_lm_engine_add(self._h, a, n, int(max_new_tokens), float(temperature),
                                                    int(top_k), float(top_p), int(seed), int(stop_token),
                                                    ctypes.byref(rid)))
        return rid.value

    def step(self):
        """One engine step: a list of (request, token, finished)."""
        buf = (_lib.LmToken * self._max_batch)()
        count = ctypes.c_size_t()
        _lib.check(_lib.lib().fusebox_lm_engine_step(self._h, buf, self._max_batch, ctypes.byref(count)))
        return [(buf[i].request, buf[i].token, bool(buf[i].finished)) for i in range(count.value)]

    @property
    def idle(self):
        return bool(_lib.lib().fusebox_lm_engine_idle(self._h))

    def generate(self, prompts, **sampling):
        """Serves `prompts` (lists of ids) together; their new tokens, in order."""
        ids = [self.add(p, **sampling) for p in prompts]
        out = {i: [] for i in ids}
        while not self.idle:
            for request, token, _ in self.step():
                out[request].append(token)
        return [out[i] for i in ids]
