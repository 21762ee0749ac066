"""fusebox_tools.core.graph.stage_profile: the per-stage table the network checkers print from
`fusebox pipeline run --profile --json` (issue 14: which stage costs the time)."""
from fusebox_tools.core.graph import stage_profile, stage_profile_lines


def test_slowest_first_with_shares_and_tflops():
    doc = {"stages": [
        {"stage": "conv1", "engine": "eng4", "flops": 2e9, "latency_ms": {"median": 0.010}},
        {"stage": "fc", "engine": "eng0", "flops": 1e9, "latency_ms": {"median": 0.030}},
        {"stage": "pool", "engine": "eng2", "flops": 0, "latency_ms": {"median": 0.0}},
    ]}
    prof = stage_profile(doc)
    assert [r[0] for r in prof] == ["fc", "conv1", "pool"]
    name, ms, share, tflops, engine = prof[0]
    assert ms == 0.030 and abs(share - 0.75) < 1e-12 and engine == "eng0"
    assert abs(tflops - 1e9 / 30e-6 / 1e12) < 1e-9
    assert prof[2][3] == 0.0  # no division by a zero time
    lines = stage_profile_lines(doc, top=2)
    assert lines[0].startswith("per stage, each alone (slowest 2 of 3")
    assert "fc" in lines[1] and "75.0%" in lines[1]


def test_unprofiled_runs_give_nothing():
    assert stage_profile({"stages": [{"stage": "a", "latency_ms": None}]}) == []
    assert stage_profile({}) == []
    assert stage_profile_lines({"stages": []}) == []
