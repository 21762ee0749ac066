"""which kernels fusebox (cuDNN) and torch launch for the two
near-tie benchmark rows of issue 12, with their GPU time, in one process under torch.profiler
(fusebox through its Python module, python/fusebox). BENCHMARKS.md, "Issue 12's near-ties", quotes
its output. On the GPU machine, from the repository root with the bundle (docs/gpu.md):
    FUSEBOX_LIBRARY=$PWD/.gpu/libfusebox.so.0.1 PYTHONPATH=python /opt/torch/.venv/bin/python3 -m fusebox_tools.bench.profile_near_ties
"""
import os, statistics, sys
import torch
import fusebox
from torch.profiler import ProfilerActivity, profile

N = 50

def kernels(fn, label):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(N):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t and e.count:
            rows.append((t / N, e.count // N if e.count >= N else e.count, e.key))
    rows.sort(reverse=True)
    print(f"--- {label}: kernels per call (us per call, launches per call, name)")
    for t, c, k in rows[:6]:
        print(f"  {t:9.2f} us  x{c}  {k[:150]}")
    # events timing too
    st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for _ in range(7):
        st.record(); [fn() for _ in range(20)]; en.record(); en.synchronize(); ms.append(st.elapsed_time(en) / 20)
    print(f"  median back-to-back: {1000 * statistics.median(ms):.1f} us")

def filled(g, name):
    t = g.empty(name)
    src = torch.randn(t.shape, device="cuda")
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        src = (src * 0.5).to(t.dtype)
    t.copy_(src.to(t.dtype))
    return t

s = fusebox.Session(device=0)
# 1. ResNet res2 1x1 expand wgrad
g = fusebox.Graph.from_json("bench/graphs/resnet50_res2_1x1_expand_wgrad.json")
plan = s.build(g)
print("fusebox engine:", plan.engine)
dy, x, dw = filled(g, "dy"), filled(g, "x"), g.empty("dw")
kernels(lambda: plan(dy=dy, x=x, dw=dw), "fusebox 1x1 wgrad " + plan.engine)
w = torch.empty_like(dw)
aten = torch.ops.aten.convolution_backward
kernels(lambda: aten(dy, x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [False, True, False]),
        "torch aten.convolution_backward (weight), channels_last bf16")
# 2. FP8 matmuls
for name, out_dtype in (("fp8_matmul_amax_fp8", torch.float8_e4m3fn), ("fp8_matmul_bf16", torch.bfloat16)):
    g = fusebox.Graph.from_json(f"examples/graphs/{name}.json")
    plan = s.build(g)
    ts = {n: (filled(g, n) if n in ("a", "b") else g.empty(n)) for n in [t.name for t in g.tensors]}
    kernels(lambda: plan(**ts), f"fusebox {name} {plan.engine}")
    a2, b2 = ts["a"][0], ts["b"][0]
    one = torch.ones((), device="cuda")
    kernels(lambda: torch._scaled_mm(a2, b2, scale_a=one, scale_b=one, out_dtype=out_dtype),
            f"torch._scaled_mm -> {out_dtype}")
    if name == "fp8_matmul_amax_fp8":
        def sm_amax():
            y = torch._scaled_mm(a2, b2, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
            return y.abs().amax(), y.to(torch.float8_e4m3fn)
        kernels(sm_amax, "torch._scaled_mm bf16 + amax + cast (the same work as fusebox's graph)")
