"""bench_merge: a call's returned parts merged into the checkout's row by row (never a part
file replaced whole), and a hostile archive refused member by member without writing outside
the bench folder."""
import io
import json
import tarfile

import pytest

from fusebox_tools.bench import bench_merge


def _tgz(path, files, extra=None):
    with tarfile.open(path, "w:gz") as tf:
        for name, data in files.items():
            raw = data if isinstance(data, bytes) else json.dumps(data).encode()
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tf.addfile(info, io.BytesIO(raw))
        for info in extra or []:
            tf.addfile(info)
    return str(path)


def _part(rows, **kw):
    return {"schema": 1, "versions": {"fusebox": "old"}, "rows": rows, **kw}


def test_rows_replaced_by_name_others_kept(tmp_path):
    bench = tmp_path / ".bench"
    (bench / "R").mkdir(parents=True)
    local = _part([{"graph": "a.json", "v": 1}, {"graph": "b.json", "v": 1}],
                  models=[{"name": "m1", "v": 1}, {"name": "m2", "v": 1}])
    (bench / "R" / "conv.json").write_text(json.dumps(local))
    (bench / "R" / "conv.log").write_text("first call\n")
    incoming = _part([{"graph": "b.json", "v": 2}, {"graph": "c.json", "v": 2}],
                     models=[{"name": "m2", "v": 2}], versions={"fusebox": "new"})
    arc = _tgz(tmp_path / "p.tgz", {".bench/R/conv.json": incoming, ".bench/R/conv.log": b"second call\n",
                                    ".bench/R/norm.json": _part([{"graph": "n.json"}])})
    assert bench_merge.main([arc, "--bench-dir", str(bench)]) == 0
    got = json.loads((bench / "R" / "conv.json").read_text())
    assert [(r["graph"], r["v"]) for r in got["rows"]] == [("a.json", 1), ("b.json", 2), ("c.json", 2)]
    assert [(m["name"], m["v"]) for m in got["models"]] == [("m1", 1), ("m2", 2)]
    assert got["versions"] == {"fusebox": "new"}
    log = (bench / "R" / "conv.log").read_text()
    assert log.startswith("first call\n") and "second call" in log
    assert json.loads((bench / "R" / "norm.json").read_text())["rows"] == [{"graph": "n.json"}]  # a new part


def test_a_replaced_runtime_keeps_its_own_date(tmp_path):
    """The part file keeps its first date; the runtime object it takes says when it was measured."""
    bench = tmp_path / ".bench"
    (bench / "R").mkdir(parents=True)
    (bench / "R" / "runtime.json").write_text(json.dumps(_part([], date="2026-12-01T13:00:00Z",
                                                               runtime={"chain": [], "v": 1})))
    arc = _tgz(tmp_path / "p.tgz", {".bench/R/runtime.json": _part([], date="2026-12-01T23:53:59Z",
                                                                   runtime={"chain": [], "v": 2})})
    assert bench_merge.main([arc, "--bench-dir", str(bench)]) == 0
    got = json.loads((bench / "R" / "runtime.json").read_text())
    assert got["date"] == "2026-12-01T13:00:00Z"
    assert got["runtime"] == {"chain": [], "v": 2, "measured_utc": "2026-12-01T23:53:59Z"}


def test_hostile_members_refused_nothing_outside(tmp_path):
    bench = tmp_path / "b" / ".bench"
    link = tarfile.TarInfo(".bench/R/x.json")
    link.type = tarfile.SYMTYPE
    link.linkname = "/etc/passwd"
    arc = _tgz(tmp_path / "evil.tgz", {"../../escape.json": _part([]), "/abs/.bench/R/y.json": _part([]),
                                       ".bench/R/not_json.json": b"\xff\xfe{", ".bench/R/no_rows.json": {"a": 1},
                                       ".bench/../R/z.json": _part([])}, extra=[link])
    assert bench_merge.main([arc, "--bench-dir", str(bench)]) == 1
    assert not (tmp_path / "escape.json").exists() and not (tmp_path.parent / "escape.json").exists()
    written = sorted(p.name for p in bench.rglob("*") if p.is_file()) if bench.exists() else []
    assert written == []


def test_unreadable_archive_and_local_file_left_alone(tmp_path, capsys):
    bad = tmp_path / "x.tgz"
    bad.write_bytes(b"not an archive")
    assert bench_merge.main([str(bad), "--bench-dir", str(tmp_path / ".bench")]) == 2
    assert "not a readable tar archive" in capsys.readouterr().err
    bench = tmp_path / ".bench"
    (bench / "R").mkdir(parents=True)
    (bench / "R" / "conv.json").write_text("{broken")
    arc = _tgz(tmp_path / "p.tgz", {".bench/R/conv.json": _part([{"graph": "a"}])})
    assert bench_merge.main([arc, "--bench-dir", str(bench)]) == 1
    assert (bench / "R" / "conv.json").read_text() == "{broken"  # a user's file is never overwritten blindly


def test_member_size_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_merge, "MAX_MEMBER", 10)
    arc = _tgz(tmp_path / "p.tgz", {".bench/R/conv.json": _part([{"graph": "a"}])})
    assert bench_merge.main([arc, "--bench-dir", str(tmp_path / ".bench")]) == 1
    assert not (tmp_path / ".bench" / "R" / "conv.json").exists()


def test_other_files_of_the_run_folder_are_noted_not_refused(tmp_path, capsys):
    arc = _tgz(tmp_path / "p.tgz", {".bench/R/conv.json": _part([{"graph": "a"}]),
                                    ".bench/R/tuned_plans.sqlite": b"SQLite format 3\0"})
    assert bench_merge.main([arc, "--bench-dir", str(tmp_path / ".bench")]) == 0
    assert "tuned_plans.sqlite" in capsys.readouterr().out
    assert not (tmp_path / ".bench" / "R" / "tuned_plans.sqlite").exists()
