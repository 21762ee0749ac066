"""Merges the bench parts a GPU-machine call returned (`$OUT/bench_parts.tgz`,
scripts/bench.sh) into this checkout's part files, row by row.

    python3 -m fusebox_tools.bench.bench_merge FILES_AT/bench_parts.tgz [--bench-dir .bench]

Unpacking the archive over the checkout (`tar xzf`) replaces each part file
whole: a call on a fresh machine (no `.bench` carried) with `GRAPHS=...` or
`MODEL_SIZES=...` returns part files holding only that call's rows, and the
checkout's other rows of those parts were lost that way. Here a returned row
replaces the row of the same graph (or model, or shape sweep) and every other
row stays; `peaks` and `runtime` are replaced when the call measured them;
`versions` become the call's (the newest rows'); each part's log gets the
call's log appended.

The archive is read, never unpacked: only regular files named
`BENCH/RUN/PART.json` or `.log` (one folder level for the run, a part name of
letters, digits and `_`) are taken, each at most 64 MiB, 512 MiB in all; other
files of the run folder (BENCH_TUNE's tuned_plans.sqlite) are noted and left; any
other member (absolute or `..` paths, links, devices) is refused with one
message and a non-zero exit, and nothing is written for a part whose JSON is
not a part file. Exit 0 when everything merged, 1 when something was refused,
2 when the archive cannot be read.
"""
import argparse
import json
import os
import re
import sys
import tarfile
import time

MAX_MEMBER = 64 << 20
MAX_TOTAL = 512 << 20
_NAME = re.compile(r"^(?:\./)?([^/]+)/([A-Za-z0-9][A-Za-z0-9._-]*)/([A-Za-z0-9_]+)\.(json|log)$")
# The lists of a part file and the key that names each entry.
_KEYED = {"rows": ("graph", "name"), "models": ("name",), "shapes": ("graph", "name")}
_REPLACED = ("peaks", "peaks_notes", "runtime")


class MergeError(Exception):
    pass


def _key(entry, fields):
    for f in fields:
        if isinstance(entry, dict) and entry.get(f) is not None:
            return str(entry[f])
    return None


def read_archive(path):
    """({(run, part, ext): bytes} of the archive's acceptable members, refusals, notes)."""
    out, refused, notes, total = {}, [], [], 0
    try:
        tf = tarfile.open(path, "r:*")
    except (OSError, tarfile.TarError) as e:
        raise MergeError(f"{path}: not a readable tar archive ({e})") from e
    with tf:
        try:
            members = tf.getmembers()
        except (OSError, tarfile.TarError, EOFError) as e:
            raise MergeError(f"{path}: a damaged tar archive ({e})") from e
        for m in members:
            if m.isdir():
                continue
            mm = _NAME.match(m.name)
            parts = m.name.split("/")
            if m.isreg() and not mm and len(parts) == 3 and ".." not in parts and parts[0] and parts[1]:
                notes.append(f"{m.name!r}: not a part (a part's JSON or log), not merged")  # e.g. tuned_plans.sqlite
                continue
            if not m.isreg() or not mm or ".." in parts:
                refused.append(f"{m.name!r}: not a part file (BENCH/RUN/PART.json or .log), skipped")
                continue
            if m.size > MAX_MEMBER or total + m.size > MAX_TOTAL:
                refused.append(f"{m.name!r}: {m.size} bytes, over the limit ({MAX_MEMBER >> 20} MiB a file, "
                               f"{MAX_TOTAL >> 20} MiB in all), skipped")
                continue
            total += m.size
            f = tf.extractfile(m)
            data = f.read(MAX_MEMBER + 1) if f else b""
            out[(mm.group(2), mm.group(3), mm.group(4))] = data
    return out, refused, notes


def merge_part(local, incoming):
    """local and incoming part documents -> (merged document, {list: (added, replaced)})."""
    merged = dict(local)
    counts = {}
    for name, fields in _KEYED.items():
        theirs = incoming.get(name)
        if not isinstance(theirs, list):
            continue
        ours = list(local.get(name) or [])
        index = {_key(e, fields): i for i, e in enumerate(ours) if _key(e, fields) is not None}
        added = replaced = 0
        for e in theirs:
            k = _key(e, fields)
            if k is not None and k in index:
                ours[index[k]] = e
                replaced += 1
            else:
                if k is not None:
                    index[k] = len(ours)
                ours.append(e)
                added += 1
        merged[name] = ours
        counts[name] = (added, replaced)
    for name in _REPLACED:
        if incoming.get(name):
            merged[name] = incoming[name]
    if isinstance(incoming.get("runtime"), dict) and incoming.get("date"):
        # the part file keeps its first date; the runtime object says when it was measured
        merged["runtime"] = dict(incoming["runtime"])
        merged["runtime"].setdefault("measured_utc", incoming["date"])
    for name in ("versions", "gpu", "schema", "method"):
        if name in incoming and (name == "versions" or name not in merged):
            merged[name] = incoming[name]
    return merged, counts


def _write(path, text):
    tmp = path + ".merge.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def merge_archive(path, bench_dir=".bench", log=print):
    """Merges the archive into bench_dir; returns the number of refusals (0: all merged)."""
    members, refused, notes = read_archive(path)
    for n in notes:
        log(f"bench_merge: {n}")
    for r in refused:
        log(f"bench_merge: {r}")
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for (run, part, ext), data in sorted(members.items()):
        folder = os.path.join(bench_dir, run)
        target = os.path.join(folder, f"{part}.{ext}")
        os.makedirs(folder, exist_ok=True)
        if ext == "log":
            with open(target, "a", encoding="utf-8") as f:
                f.write(f"\n== bench_merge: the log of {os.path.basename(path)}, merged {stamp}\n")
                f.write(data.decode("utf-8", errors="replace"))
            continue
        try:
            incoming = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            log(f"bench_merge: {run}/{part}.json in {path}: not JSON ({e}); nothing written for it")
            refused.append(part)
            continue
        if not isinstance(incoming, dict) or not isinstance(incoming.get("rows"), list):
            log(f"bench_merge: {run}/{part}.json in {path}: not a bench part file (no list 'rows'); "
                "nothing written for it")
            refused.append(part)
            continue
        local = None
        if os.path.exists(target):
            try:
                with open(target) as f:
                    local = json.load(f)
            except (OSError, ValueError) as e:
                log(f"bench_merge: {target}: unreadable ({e}); left as it is, the call's part not merged")
                refused.append(part)
                continue
            if not isinstance(local, dict) or not isinstance(local.get("rows"), list):
                log(f"bench_merge: {target} is not a bench part file; left as it is, the call's part not merged")
                refused.append(part)
                continue
        if local is None:
            _write(target, json.dumps(incoming, indent=1))
            log(f"bench_merge: {target}: new ({len(incoming['rows'])} rows)")
            continue
        merged, counts = merge_part(local, incoming)
        _write(target, json.dumps(merged, indent=1))
        said = ", ".join([f"{k} +{a} added, {r} replaced" for k, (a, r) in counts.items() if a or r] +
                         [f"{k} replaced" for k in _REPLACED if incoming.get(k)])
        log(f"bench_merge: {target}: {said or 'nothing new'}")
    return len(refused)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("archive", help="bench_parts.tgz from a bench.sh call's $OUT")
    ap.add_argument("--bench-dir", default=".bench", help="the part files' folder (BENCH_DIR, default .bench)")
    a = ap.parse_args(argv)
    try:
        bad = merge_archive(a.archive, a.bench_dir)
    except MergeError as e:
        print(f"bench_merge: {e}", file=sys.stderr)
        return 2
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
