"""fusebox_tools.bench.bench_report on CPU with two results files in the format
bench_run writes (tests/python/data/bench: made up for these tests from the
shapes of the 2026-11-29 H200 numbers; the later one has conv_bias_relu 10%
slower). Statistics, headline ratio, geometric means, roofline, the
regression flag, the Markdown and the plots (skipped without matplotlib)."""
import builtins
import json
import math
import os

import pytest

from fusebox_tools.bench import bench_report as br

DATA = os.path.join(os.path.dirname(__file__), "data", "bench")
OLD = os.path.join(DATA, "2026-11-30-H200.json")
NEW = os.path.join(DATA, "2026-12-01-H200.json")


def test_quantile_matches_linear_interpolation():
    xs = [4, 1, 3, 2, 5]
    assert br.quantile(xs, 0.5) == 3
    assert br.quantile(xs, 0.0) == 1 and br.quantile(xs, 1.0) == 5
    assert br.quantile(xs, 0.25) == 2
    assert br.quantile([1, 2, 3, 4], 0.5) == 2.5
    assert br.quantile([1, 2, 3, 4], 0.1) == pytest.approx(1.3)
    with pytest.raises(ValueError):
        br.quantile([], 0.5)


def test_summarize():
    s = br.summarize([10, 20, 30, 40, 50, None, float("nan")])
    assert s["n"] == 5 and s["median"] == 30 and s["min"] == 10
    assert s["q1"] == 20 and s["q3"] == 40 and s["iqr"] == 20
    assert s["p10"] == pytest.approx(14) and s["p90"] == pytest.approx(46)
    assert s["spread"] == pytest.approx(20 / 30)
    assert br.summarize([]) is None and br.summarize(None) is None


def test_geomean():
    assert br.geomean([2, 8]) == pytest.approx(4)
    assert br.geomean([1.0, None, 4.0]) == pytest.approx(2)
    assert br.geomean([None]) is None


def row(fb_gpu, eager=None, compile_=None, graph=None, flops=2e12, nbytes=1e9, dtype="bf16"):
    t = {}
    for k, v in (("eager", eager), ("compile", compile_), ("cuda_graph", graph)):
        t[k] = {"gpu_ms": v, "latency_ms": [x * 2 for x in v]} if v else None
    return {"family": "f", "name": "r", "flops": flops, "bytes": nbytes, "dtype": dtype,
            "fusebox": {"gpu_ms": fb_gpu, "latency_ms": [x * 3 for x in fb_gpu]}, "torch": t}


def test_headline_is_against_the_best_torch_gpu_time():
    st = br.row_stats(row([1.0, 1.0, 1.2], eager=[3.0], compile_=[2.0, 2.0, 2.2], graph=[2.5]))
    assert st["best_torch"] == "compile"
    assert st["speedup"] == pytest.approx(2.0)
    # latencies: fusebox 3.0, compile 4.0 (best), so 4/3 and never mixed with GPU time
    assert st["best_torch_latency"] == "compile"
    assert st["latency_speedup"] == pytest.approx(4.0 / 3.0)


def full_row(name, family, fb, eager, compile_, compile_cg, graph, compile_s=(30.0, 12.0)):
    """A row with all four torch variants timed (the shape bench_run writes since issue 36)."""
    r = row(fb, eager=eager, compile_=compile_, graph=graph)
    r["name"], r["family"] = name, family
    r["torch"]["compile"]["compile_s"] = compile_s[0]
    r["torch"]["compile_cudagraphs"] = {"gpu_ms": compile_cg, "latency_ms": [x * 2 for x in compile_cg],
                                        "compile_s": compile_s[1]}
    return r


def test_failed_variant_makes_the_row_incomplete_and_keeps_it_out_of_the_means():
    good = full_row("conv_a", "conv", [1.0], [3.0], [2.0], [1.5], [2.5])
    bad = full_row("conv_b", "conv", [1.0], [9.0], [9.0], [9.0], [9.0])
    bad["torch"]["compile_cudagraphs"] = None
    bad["torch_failed"] = {"compile_cudagraphs": "RuntimeError: CUDA graphs: accessing overwritten output"}
    rows = [good, bad]
    stats = [br.row_stats(r) for r in rows]
    assert stats[0]["complete"] and stats[0]["incomplete"] == []
    assert stats[0]["best_torch"] == "compile_cudagraphs" and stats[0]["speedup"] == pytest.approx(1.5)
    assert not stats[1]["complete"]
    assert stats[1]["incomplete"] == [("compile_cudagraphs",
                                       "failed: RuntimeError: CUDA graphs: accessing overwritten output")]
    fams = br.family_geomeans(rows, stats)
    # the mean is the complete row's alone (with the bad one it would be sqrt(1.5 * 9))
    assert fams["conv"] == {"speedup": pytest.approx(1.5), "latency_speedup": pytest.approx(1.0), "rows": 1,
                            "incomplete": 1}
    doc = {"date": "2026-12-05T00:00:00Z", "gpu": "NVIDIA H200", "rows": rows}
    text = br.markdown(doc, stats)
    lines = text.splitlines()
    start = lines.index("### Incomplete rows (not in the means)")
    table = lines[start:lines.index("", start + 2)]
    assert any(ln.startswith("| conv | conv_b | compile (CG): failed: RuntimeError") for ln in table), table
    assert not any("conv_a" in ln for ln in table)
    assert "| conv | 1 | 1 | 1.50x |" in text
    # a complete row alone: included, and nothing listed as incomplete
    st = [br.row_stats(good)]
    assert br.family_geomeans([good], st)["conv"]["rows"] == 1
    assert "All rows are complete." in br.markdown({"rows": [good]}, st)


def test_missing_variant_or_mismatched_outputs_make_the_row_incomplete():
    r = row([1.0], eager=[2.0], compile_=[1.5], graph=[1.8])  # no reduce-overhead variant recorded
    assert br.row_stats(r)["incomplete"] == [("compile_cudagraphs", "not timed (no result recorded)")]
    r = full_row("x", "f", [1.0], [2.0], [1.5], [1.2], [1.8])
    r["torch"]["cuda_graph"]["check"] = {"pass": False, "detail": "y: rel_l2 3.0e-01 > 2.0e-02"}
    assert br.row_stats(r)["incomplete"] == [("cuda_graph", "outputs differ: y: rel_l2 3.0e-01 > 2.0e-02")]
    r = full_row("x", "f", [1.0], [2.0], [1.5], [1.2], [1.8])
    r["fusebox"] = None
    assert br.row_stats(r)["incomplete"] == [("fusebox", "not timed")]


def test_failed_variant_is_never_the_best_torch():
    r = full_row("x", "f", [1.0], [2.0], [1.5], [0.1], [1.8])  # samples left behind by a failed variant
    r["torch_failed"] = {"compile_cudagraphs": "outputs differ"}
    st = br.row_stats(r)
    assert st["best_torch"] == "compile" and st["speedup"] == pytest.approx(1.5)


def test_compile_time_is_shown_beside_the_speed():
    r = full_row("mm", "matmul", [1.0], [2.0], [1.5], [1.2], [1.8], compile_s=(95.4, 20.2))
    lines = br.compile_time_markdown([r], [br.row_stats(r)])
    assert "| mm | 95 s | 1500.0 | 20 s | 1200.0 |" in lines
    # rows from before the compile time was recorded: no table
    old = row([1.0], eager=[2.0], compile_=[1.5], graph=[1.8])
    assert br.compile_time_markdown([old], [br.row_stats(old)]) == []


def test_model_row_with_failed_variant_is_listed_incomplete():
    m = {"name": "resnet50_b32", "fusebox_ms": {"cuda_graph": 10.0, "eager": 11.0},
         "torch_ms": {"eager": 20.0, "cuda_graph": 14.0, "compile": 13.0, "compile_cudagraphs": None},
         "torch_failed": {"compile_cudagraphs": "outputs differ from eager: rel_l2 1e-1"}, "verified": True,
         "speedup": 1.3}
    assert br.model_incomplete_reasons(m) == [("compile_cudagraphs",
                                               "failed: outputs differ from eager: rel_l2 1e-1")]
    lines = br.incomplete_markdown([], [], [m])
    assert any(ln.startswith("| models | resnet50_b32 | compile (CG): failed: outputs differ") for ln in lines)
    row_line = next(ln for ln in br.models_markdown([m]) if ln.startswith("| resnet50_b32"))
    assert "| failed |" in row_line and "| incomplete |" in row_line


def test_missing_sides_give_no_ratio():
    st = br.row_stats(row([1.0]))
    assert st["best_torch"] is None and st["speedup"] is None
    r = row([1.0], eager=[2.0])
    r["fusebox"] = None
    st = br.row_stats(r)
    assert st["speedup"] is None and st["roofline"] is None


def test_roofline_compute_and_memory_bound():
    peaks = {"bf16_tflops": 800.0, "fp8_tflops": 1600.0, "copy_gbps": 4000.0}
    # 2 TFLOP in 4 ms = 500 TFLOP/s; intensity 2000 FLOP/B: compute bound, 500/800
    r = br.roofline(row([4.0]), 4.0, peaks)
    assert r["tflops"] == pytest.approx(500) and r["bound"] == "compute"
    assert r["frac"] == pytest.approx(500 / 800) and r["compute_frac"] == pytest.approx(500 / 800)
    assert r["gbps"] == pytest.approx(250) and r["bandwidth_frac"] == pytest.approx(250 / 4000)
    # 1 GFLOP, 1 GB in 0.5 ms: 2000 GB/s; intensity 1: roof 4 TFLOP/s: memory bound at 50%
    r = br.roofline(row([0.5], flops=1e9, nbytes=1e9), 0.5, peaks)
    assert r["bound"] == "memory" and r["frac"] == pytest.approx(0.5)
    # fp8 rows against the fp8 peak
    r = br.roofline(row([4.0], dtype="fp8_e4m3"), 4.0, peaks)
    assert r["peak"] == "fp8" and r["frac"] == pytest.approx(500 / 1600)
    assert br.roofline(row([1.0]), 1.0, None)["frac"] is None


def test_family_geomeans_and_regressions_on_fixtures():
    new, old = br.load(NEW), br.load(OLD)
    stats = [br.row_stats(r, new["peaks"]) for r in new["rows"]]
    fams = br.family_geomeans(new["rows"], stats)
    assert set(fams) == {"conv", "matmul", "sdpa"} and fams["conv"]["rows"] == 2
    # sdpa_fp8_fwd's compile variants failed: incomplete, so its family has no mean
    assert fams["sdpa"] == {"speedup": None, "latency_speedup": None, "rows": 0, "incomplete": 1}
    conv = [s["speedup"] for r, s in zip(new["rows"], stats) if r["family"] == "conv"]
    assert fams["conv"]["speedup"] == pytest.approx(math.sqrt(conv[0] * conv[1]))
    flagged, changes = br.regressions(new["rows"], stats, old)
    assert [f[0] for f in flagged] == ["conv_bias_relu"]
    assert 0.05 < flagged[0][3] < 0.2
    assert set(changes) == {r["name"] for r in new["rows"]}
    # the same file against itself: nothing flagged
    assert br.regressions(new["rows"], stats, new)[0] == []


def test_previous_results_is_the_newest_older_file(tmp_path):
    for n in ("2026-11-01-H200.json", "2026-11-30-H200.json", "2026-12-01-H200.json", "2026-12-02-H200.json"):
        (tmp_path / n).write_text("{}")
    assert os.path.basename(br.previous_results(str(tmp_path / "2026-12-01-H200.json"))) == "2026-11-30-H200.json"
    assert br.previous_results(str(tmp_path / "2026-11-01-H200.json")) is None


def test_markdown_report(tmp_path):
    bm = tmp_path / "BENCHMARKS.md"
    bm.write_text("# Benchmarks\n\nintro\n\n## Older, hand-written\n\nkept\n")
    section = br.report(NEW, OLD, update=str(bm))
    text = bm.read_text()
    assert text.count(br.BEGIN) == 1 and text.count(br.END) == 1
    assert text.index("# Benchmarks") < text.index(br.BEGIN) < text.index("## Older, hand-written")
    assert "kept" in text
    for want in ("NVIDIA H200", "580.159.04", "cuDNN 9.19.0", "Frontend 1.32.0", "PyTorch 2.11.0+cu130",
                 "max-autotune-no-cudagraphs", "| conv | 2 |", "**SLOWER** conv_bias_relu",
                 "Speedup = best PyTorch variant's GPU time / fusebox's GPU time", "sdpa_fp8_fwd",
                 "torch.compile skipped: Unsupported"):
        assert want in section, want
    # GPU-time table: fusebox median and [p10-p90] in µs, the best variant named
    line = next(ln for ln in section.splitlines() if ln.startswith("| conv | conv_bias_relu |"))
    s = br.summarize(br.load(NEW)["rows"][0]["fusebox"]["gpu_ms"])
    assert f"{s['median'] * 1e3:.1f} [{s['p10'] * 1e3:.1f}-{s['p90'] * 1e3:.1f}]" in line
    assert "torch.compile" in line
    # a second update replaces the section instead of adding one
    br.report(NEW, None, update=str(bm))
    text = bm.read_text()
    assert text.count(br.BEGIN) == 1 and "No previous results file" in text and "kept" in text


def test_names_cannot_break_the_table(tmp_path):
    doc = br.load(NEW)
    doc["rows"][0]["name"] = "evil | name\nnext"
    p = tmp_path / "r.json"
    p.write_text(json.dumps(doc))
    section = br.report(str(p))
    assert "evil \\| name next" in section


def test_bad_documents(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text("[1, 2]")
    with pytest.raises(br.ReportError, match="not a results document"):
        br.load(str(p))
    p.write_text(json.dumps({"schema": 99, "rows": []}))
    with pytest.raises(br.ReportError, match="schema 99"):
        br.load(str(p))
    assert br.main([str(tmp_path / "missing.json")]) == 2


def test_merge_parts(tmp_path):
    a, b = br.load(OLD), br.load(NEW)
    a["rows"], b["rows"] = a["rows"][:2], b["rows"][1:]
    b["peaks"] = {"fp8_tflops": 1500.0}
    pa, pb = tmp_path / "conv.json", tmp_path / "rest.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    out = tmp_path / "all.json"
    assert br.main(["--merge", str(pa), str(pb), "--out", str(out)]) == 0
    m = br.load(str(out))
    assert [r["name"] for r in m["rows"]] == ["conv_bias_relu", "conv_bias_add_relu", "matmul_bias_gelu",
                                              "sdpa_fp8_fwd"]
    # conv_bias_add_relu from the later part wins; peaks merged key by key
    assert m["rows"][1] == {**b["rows"][0], "cudnn": "9.19.0"}  # each row names its cuDNN
    assert m["peaks"]["fp8_tflops"] == 1500.0 and m["peaks"]["bf16_tflops"] == a["peaks"]["bf16_tflops"]


def test_plots_skip_without_matplotlib(monkeypatch, tmp_path, capsys):
    real_import = builtins.__import__

    def no_mpl(name, *a, **kw):
        if name.startswith("matplotlib"):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_mpl)
    doc = br.load(NEW)
    stats = [br.row_stats(r, doc["peaks"]) for r in doc["rows"]]
    assert br.plots(doc, stats, str(tmp_path / "plots")) == []
    assert "matplotlib is not installed" in capsys.readouterr().err


def test_plots_written(tmp_path):
    pytest.importorskip("matplotlib")
    bm = tmp_path / "BENCHMARKS.md"
    br.report(NEW, OLD, update=str(bm), plots_dir=str(tmp_path / "plots"))
    for p in ("speedup.png", "roofline.png"):
        data = (tmp_path / "plots" / p).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"(plots/{p})" in bm.read_text()


def test_cli_writes_markdown(tmp_path):
    out = tmp_path / "r.md"
    assert br.main([NEW, "--markdown-out", str(out)]) == 0  # previous found beside it
    assert "2026-11-30-H200.json" in out.read_text()


# ---------------------------------------------------------------- runtime part

RUNTIME = os.path.join(os.path.dirname(__file__), "data", "bench_runtime", "runtime_part.json")


def test_chain_stats_ratios():
    doc = br.load(RUNTIME)
    b1, b8 = (br.chain_stats(r) for r in doc["runtime"]["chain"])
    # batch 1: eager 0.120 ms, graph 0.050 ms; torch best (CUDA graph) 0.070 ms
    assert b1["replay_speedup"] == pytest.approx(0.120 / 0.050)
    assert b1["best_torch"] == "cuda_graph"
    assert b1["vs_torch"] == pytest.approx(0.070 / 0.050)
    # latency medians: eager 0.240, graph 0.075
    assert b1["replay_latency_speedup"] == pytest.approx(0.240 / 0.075)
    assert b8["replay_speedup"] == pytest.approx(0.300 / 0.240)
    assert br.chain_stats({"fusebox": {}})["replay_speedup"] is None


def test_runtime_tables_in_the_report(tmp_path):
    doc = br.load(RUNTIME)
    out = tmp_path / "r.md"
    section = br.report(RUNTIME, markdown_out=str(out))
    assert out.read_text() == section
    assert "### Runtime: host cost of one execute" in section
    assert "| BoundPlan::execute | 2100 |" in section
    assert "Bound / bare: **1.050** (target ≤ 1.2: yes)" in section
    assert "**1800 ns** on the GPU per execute replayed, its kernel included" in section
    assert "10 conv+bias+relu 3x3 layers, 64 channels, 56x56, bf16 nhwc" in section
    # batch 1 meets the 2x target, batch 8 (1.25x) does not, and it says so
    assert "| GPU time | 1 | 120.0 [" in section and "**2.40x** (yes)" in section
    assert "**1.25x** (**no**)" in section
    assert "CUDA graph recording: native" in section
    assert len(doc["runtime"]["chain"]) == 2


def test_merge_carries_the_runtime_part_and_reports_without_it(tmp_path):
    merged = br.merge([NEW, RUNTIME])
    assert merged["runtime"]["host_overhead"]["bound_over_bare"] == 1.05
    # the runtime part's own date goes with it (the run's date may be another part's)
    assert merged["runtime"]["measured_utc"] == br.load(RUNTIME)["date"]
    text = "\n".join(br.runtime_markdown(merged["runtime"]))
    assert f"Measured {br.load(RUNTIME)['date']} (the runtime part's own run)." in text
    assert len(merged["rows"]) == len(br.load(NEW)["rows"])  # the runtime part adds no graph rows
    path = tmp_path / "2026-12-02-H200.json"
    path.write_text(json.dumps(merged))
    section = br.report(str(path))
    assert "### Runtime: host cost" in section and "### GPU time" in section
    # a run without the part: no runtime section
    assert "### Runtime" not in br.report(NEW)


def test_one_step_graph_launch_line():
    rt = {"host_overhead": {"bound_over_bare": 1.02, "rows": [
        {"call": "BoundPlan::execute", "host_ns": 5300}, {"call": "cudnnBackendExecute (bare)", "host_ns": 5200},
        {"call": "CudaGraph::launch (one execute)", "host_ns": 2600}]}}
    text = "\n".join(br.runtime_markdown(rt))
    assert "| CudaGraph::launch (one execute) | 2600 |" in text
    assert "launched: 2600 ns on the host, 0.50x the bare cuDNN call." in text
    assert "launched:" not in "\n".join(br.runtime_markdown({"host_overhead": {"rows": [
        {"call": "CudaGraph::launch (one execute)", "host_ns": 2600}]}}))


def test_replay_overhead_and_tuned_in_graph_lines():
    """The 2 us target is checked on what a replayed execute costs beyond its kernels (and the
    host's launch share), not on the kernel's own duration; tuned-in-graph engines are listed."""
    rt = {"host_overhead": {
        "rows": [], "cuda_graph": {"executes_per_graph": 100, "recording": "capture",
                                   "launch_host_ns_per_execute": 36, "replay_gpu_ns_per_execute": 6648,
                                   "eager_gpu_ns_per_execute": 7569},
        "cuda_graph_tuned": {"engine": "eng10_k2=2", "tune_ms": 900, "replay_gpu_ns_per_execute": 4290},
        "replay_kernels": [
            {"engine": "eng11_k2=4", "executes_per_graph": 100, "replay_gpu_ns_per_execute": 6760,
             "kernel_ns_per_execute": 6610, "kernels_per_execute": 1.0, "kernels": ["convolve_common"], "how": "cupti"},
            {"engine": "slow", "executes_per_graph": 100, "replay_gpu_ns_per_execute": 9000,
             "kernel_ns_per_execute": 6000, "kernels_per_execute": 2.0, "kernels": ["a", "b"], "how": "cupti"}]},
        "chain": [{"batch": 1, "fusebox": {"eager": {"gpu_ms": [0.076], "latency_ms": [0.099]}},
                   "tuned_in_graph": {"engine": "eng10_k2=5", "same_as_heuristic": True}},
                  {"batch": 8, "fusebox": {"eager": {"gpu_ms": [0.110], "latency_ms": [0.125]}},
                   "tuned_in_graph": {"engine": "eng41_k2=1", "same_as_heuristic": False, "bit_identical": True,
                                      "cuda_graph": {"gpu_ms": [0.050], "latency_ms": [0.06]}}},
                  {"batch": 16, "fusebox": {}, "tuned_in_graph": {"error": "NotSupported: no candidate"}}]}
    text = "\n".join(br.runtime_markdown(rt))
    assert "engine `eng10_k2=2`, **4290 ns** on the GPU per execute replayed" in text
    assert "its kernels 6610 ns (1.00 per execute: convolve_common): **150 ns beyond the kernels**" in text
    assert "36 ns of launch on the host (overhead per graph replayed, target ≤ 2000 ns: yes)" in text
    assert "**3000 ns beyond the kernels**" in text and "target ≤ 2000 ns: **no**" in text
    assert "Batch 1, tuned inside CUDA graphs (`tune --cuda-graph`): `eng10_k2=5`, the heuristics' engine." in text
    assert "`eng41_k2=1`, CUDA graph 50.0 [50.0-50.0] µs, **2.20x** the eager launches (yes)" in text
    assert "Batch 16, tuned inside CUDA graphs: failed (NotSupported: no candidate)." in text


def test_runtime_section_tolerates_missing_pieces():
    assert br.runtime_markdown(None) == []
    assert br.runtime_markdown({}) == []
    lines = br.runtime_markdown({"host_overhead": {"rows": [{"call": "x", "host_ns": 5}]},
                                 "chain": [{"name": "c", "batch": 1, "fusebox": {"eager": None}}]})
    text = "\n".join(lines)
    assert "| x | 5 |" in text and "| GPU time | 1 | - | - | **-** (-)" in text
def _shapes_entry(graph, kc_ms, cold_ms, fallback=""):
    rows = [{"mode": "kernel_cache", "shape_text": f"N={i + 1}", "ok": True, "ms": v, "kernel_cache": "warm" if i else "cold"}
            for i, v in enumerate(kc_ms)]
    rows += [{"mode": "cold", "shape_text": f"N={i + 1}", "ok": True, "ms": v, "kernel_cache": "off"}
             for i, v in enumerate(cold_ms)]
    return {"graph": graph, "name": graph.rsplit("/", 1)[-1][:-5], "sweeps": ["N=1..3"], "rows": rows,
            "summary": {"shapes": len(kc_ms), "failed": 0, "kernel_cache_total_ms": sum(kc_ms),
                        "cold_total_ms": sum(cold_ms), "speedup": sum(cold_ms) / sum(kc_ms),
                        "target_speedup": 10, "meets_target": sum(cold_ms) >= 10 * sum(kc_ms),
                        "dynamic_fallback": fallback}}


def test_shapes_part_merges_and_reports(tmp_path):
    """Part shapes (fusebox shapes): merged per graph (later wins) and one table row each."""
    a, b = br.load(OLD), br.load(NEW)
    a["shapes"] = [_shapes_entry("examples/graphs/conv_bias_relu_dyn.json", [500, 10, 10], [480, 470, 490]),
                   _shapes_entry("examples/graphs/sdpa_fwd_dyn.json", [900, 800, 800], [850, 800, 810], "refused")]
    b["rows"] = []
    b["shapes"] = [_shapes_entry("examples/graphs/conv_bias_relu_dyn.json", [400, 8, 12], [480, 470, 490])]
    pa, pb = tmp_path / "a.json", tmp_path / "shapes.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    m = br.merge([str(pa), str(pb)])
    assert [e["graph"] for e in m["shapes"]] == ["examples/graphs/conv_bias_relu_dyn.json",
                                                 "examples/graphs/sdpa_fwd_dyn.json"]
    assert m["shapes"][0]["summary"]["kernel_cache_total_ms"] == 420  # the later part's
    lines = br.shapes_markdown(m["shapes"])
    conv = next(line for line in lines if line.startswith("| conv_bias_relu_dyn"))
    # total 420, first build 400, median later 12, (no step times: "-"), dynamic with the cache,
    # cold total 1440, cold median 480, 1440/420
    assert "| 420.0 | 400.0 | 12.0 | - | dynamic, kernel cache | 1440.0 | 480.0 | **3.43x** |" in conv, conv
    # step times of the later builds (median per step, steps under 0.5 ms left out) and the policy
    e = _shapes_entry("examples/graphs/conv_bias_relu_dyn.json", [400, 8, 12, 9], [480, 470, 490, 500])
    for r, bp in zip(e["rows"][1:4], (5.0, 9.0, 7.0)):
        r.update({"steps": {"build_plans": bp, "create_execution_plans": 2.0, "validate": 0.1},
                  "static_policy": "a static build takes engine eng10, which has precompiled kernels",
                  "kernel_cache": "off"})
    line = next(x for x in br.shapes_markdown([e]) if x.startswith("| conv_bias_relu_dyn"))
    assert "| build_plans 7.0, create_execution_plans 2.0 | static (precompiled) |" in line, line
    sdpa = next(line for line in lines if line.startswith("| sdpa_fwd_dyn"))
    assert "dynamic shapes refused: refused" in sdpa
    assert br.shapes_markdown(None) == [] and br.shapes_markdown([]) == []


def test_models_part_merges_and_reports(tmp_path):
    a, b = br.load(OLD), br.load(NEW)
    a["models"] = [{"name": "resnet50_b8", "fusebox_ms": {"cuda_graph": 0.6, "eager": 0.7},
                    "torch_ms": {"eager": 5.0, "cuda_graph": 1.2, "compile": 1.8, "compile_cudagraphs": 1.1},
                    "verified": True, "speedup": 2.0}]
    b["rows"] = []
    b["models"] = [{"name": "resnet50_b8", "fusebox_ms": {"cuda_graph": 0.572, "eager": 0.636},
                    "torch_ms": {"eager": 5.19, "cuda_graph": 1.145, "compile": 1.3, "compile_cudagraphs": 1.2},
                    "compile_s": {"compile": 95.0, "compile_cudagraphs": 40.4}, "freezing": True, "verified": False,
                    "speedup": 1.145 / 0.572},
                   {"name": "minilm_b8_s128", "fusebox_ms": {}, "torch_ms": {}, "verified": True, "speedup": None}]
    pa, pb = tmp_path / "a.json", tmp_path / "models.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    m = br.merge([str(pa), str(pb)])
    assert [x["name"] for x in m["models"]] == ["resnet50_b8", "minilm_b8_s128"]
    assert m["models"][0]["fusebox_ms"]["cuda_graph"] == 0.572  # the later part's row
    lines = br.models_markdown(m["models"])
    rn = next(line for line in lines if line.startswith("| resnet50_b8"))
    assert ("| 0.572 | 0.636 | 5.190 | 1.145 | 1.300 (95 s) | 1.200 (40 s) | yes | **2.00x** | 1.1x | yes | **no** |"
            in rn), rn  # target by name
    assert "| minilm_b8_s128 | - | - | - | - | - | - | - | - | 1.2x | incomplete | yes |" in lines
    assert br.models_markdown(None) == [] and br.models_markdown([]) == []


# Issue 14's size sweep: three sizes per network, made up in the shape of the 2026-12-01 numbers.
SWEEP = [
    {"name": "resnet50_b256", "fusebox_ms": {"cuda_graph": 16.0, "eager": 16.2},
     "torch_ms": {"eager": 20.0, "cuda_graph": 19.0, "compile": 17.0, "compile_cudagraphs": 17.5}, "verified": True, "speedup": 17.0 / 16.0,
     "target": 1.1, "compile_mode": "max-autotune-no-cudagraphs"},
    {"name": "minilm_b1_s32", "fusebox_ms": {"cuda_graph": 0.2, "eager": 0.25},
     "torch_ms": {"eager": 2.5, "cuda_graph": 0.35, "compile": 1.9, "compile_cudagraphs": 0.36}, "verified": True, "speedup": 1.75,
     "target": 1.5, "compile_mode": "max-autotune-no-cudagraphs"},
    {"name": "resnet50_b1", "fusebox_ms": {"cuda_graph": 0.4, "eager": 0.5},
     "torch_ms": {"eager": 4.0, "cuda_graph": 0.6, "compile": None}, "verified": True, "speedup": 1.5,
     "target": 1.3, "compile_error": "RuntimeError: x"},
    {"name": "minilm_b256_s128", "fusebox_ms": {"cuda_graph": 5.0, "eager": 5.1},
     "torch_ms": {"eager": 7.0, "cuda_graph": 5.5, "compile": 5.4, "compile_cudagraphs": 5.6}, "verified": False, "speedup": 1.08,
     "target": 1.2},
    {"name": "minilm_b32_s128", "fusebox_ms": {"cuda_graph": 0.9, "eager": 1.0},
     "torch_ms": {"eager": 3.0, "cuda_graph": 1.2, "compile": 1.3, "compile_cudagraphs": 1.25}, "verified": True, "speedup": 1.2 / 0.9,
     "target": 1.2},
]


def test_models_table_targets_and_order():
    lines = br.models_markdown(SWEEP)
    names = [ln.split("|")[1].strip() for ln in lines if ln.startswith("| ") and "_b" in ln.split("|")[1]]
    assert names == ["minilm_b1_s32", "minilm_b32_s128", "minilm_b256_s128", "resnet50_b1", "resnet50_b256"]
    row = {ln.split("|")[1].strip(): ln for ln in lines if ln.startswith("| ")}
    assert row["minilm_b1_s32"].endswith("| **1.75x** | 1.5x | yes | yes |")
    assert row["minilm_b256_s128"].endswith("| **1.08x** | 1.2x | **no** (10% short) | **no** |")
    assert row["resnet50_b256"].endswith("| **1.06x** | 1.1x | **no** (3% short) | yes |")
    assert "| failed |" in row["resnet50_b1"]  # torch.compile raised
    assert row["resnet50_b1"].endswith("| **1.50x** | 1.3x | incomplete | yes |")  # so: not judged
    assert "`max-autotune-no-cudagraphs`" in "\n".join(lines) and "1.5x at batch 1" in "\n".join(lines)
    # rows measured before the mode was recorded do not inherit the others' mode
    assert "| 1.300 (mode not recorded) |" in row["minilm_b32_s128"]
    assert "| 1.900 (max-autotune-no-cudagraphs) |" in row["minilm_b1_s32"]
    one = br.models_markdown([SWEEP[0], SWEEP[1]])  # one mode, every row recorded: said once, above
    assert not any("(max-autotune" in ln for ln in one if ln.startswith("| "))


def test_models_plot_and_report(tmp_path):
    pytest.importorskip("matplotlib")
    doc = br.load(NEW)
    doc["models"] = SWEEP
    path = tmp_path / "run.json"
    path.write_text(json.dumps(doc))
    bm = tmp_path / "BENCHMARKS.md"
    br.report(str(path), None, update=str(bm), plots_dir=str(tmp_path / "plots"))
    data = (tmp_path / "plots" / "models.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    text = bm.read_text()
    assert "(plots/models.png)" in text and "| minilm_b32_s128 |" in text
    # rows without fusebox times give no plot; one network alone gives one panel
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    assert br.models_plot([{"name": "resnet50_b1", "fusebox_ms": {}, "torch_ms": {}}], str(tmp_path), plt) is None
    (tmp_path / "one").mkdir()
    assert br.models_plot(SWEEP[:1], str(tmp_path / "one"), plt) == str(tmp_path / "one" / "models.png")


def test_merge_refuses_rows_measured_on_two_cudnn_versions(tmp_path):
    """Issue 35: numbers from cuDNN 9.19 and 9.27 never share one table; rows name their cuDNN."""
    a, b = br.load(OLD), br.load(NEW)
    b["versions"]["cudnn"] = "9.27.0"
    for r in b["rows"]:
        r["name"] += "_other"  # distinct rows, so both versions would reach the table
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    with pytest.raises(br.ReportError, match=r"cuDNN 9\.19\.0 and 9\.27\.0"):
        br.merge([str(pa), str(pb)])
    # the same version: merged, and every row names it (taken from its part when the row lacks it)
    b["versions"]["cudnn"] = "9.19.0"
    pb.write_text(json.dumps(b))
    m = br.merge([str(pa), str(pb)])
    assert {r["cudnn"] for r in m["rows"]} == {"9.19.0"}
