#!/usr/bin/env bash
# Issue 35, "no example graph more than 5% slower on the newest cuDNN than on 9.19": every valid
# example graph timed under torch's cuDNN 9.19 and under the pinned cuDNN that
# scripts/gpu_cudnn.sh received (the JIT set, or the full set once every part is in), one graph
# at a time, the two versions back to back per graph (so clock drift hits both alike). Each side
# builds its own plan (its heuristics' first engine, no plan cache) and is timed by
# `fusebox run --samples` (GPU time per call, back to back, median of the samples).
#   run(command="bash scripts/gpu_cudnn_compare.sh", carry=[".gpu"])
# GRAPHS_GLOB (default: top-level examples, then small/), DEADLINE (s, default 540): graphs
# not reached are listed as such. Writes $OUT/compare.json and $OUT/compare.txt (the table). The
# graphs more than 5% slower are then tuned on both sides (TUNE_TOP candidates, default 6): the
# table's second part says which stay slower with each version's fastest engine.
set -u
cd "$(dirname "$0")/.." || exit 2
O=${OUT:-/tmp/out}
mkdir -p "$O/cmp"
DEADLINE=${DEADLINE:-540}
[ -d .gpu ] && { bash scripts/gpu_unpack.sh .gpu || exit 1; }
FB=${FUSEBOX_BIN:-.gpu/fusebox}
PINNED=${FUSEBOX_GPU_CUDNN_DIR:-/tmp/fusebox-cudnn}
[ -f "$PINNED/lib/libcudnn.so.9" ] || { echo "gpu_cudnn_compare: nothing in $PINNED: scripts/gpu_cudnn.sh receive first" >&2; exit 2; }
CUDA_LIB=/usr/local/cuda-13.0/targets/x86_64-linux/lib
TORCH_NV=/opt/torch/.venv/lib/python3.12/site-packages/nvidia
declare -A LIBS=([old]="$TORCH_NV/cudnn/lib:$CUDA_LIB" [new]="$PINNED/lib:$TORCH_NV/cu13/lib:$CUDA_LIB")
if [ -x /opt/torch/.venv/bin/python3 ]; then PY=/opt/torch/.venv/bin/python3; else PY=python3; fi
for side in old new; do
  LD_LIBRARY_PATH=${LIBS[$side]} "$FB" info --json > "$O/cmp/info_$side.json" 2>&1
done
ls "$PINNED/lib" > "$O/cmp/pinned_libs.txt"
n=0
for g in ${GRAPHS_GLOB:-examples/graphs/*.json examples/graphs/small/*.json}; do
  case "$(basename "$g")" in invalid_*) continue ;; esac
  name=$(basename "$g" .json)
  echo "$name $g" >> "$O/cmp/paths.txt"
  if [ "$SECONDS" -ge "$DEADLINE" ]; then echo "$g" >> "$O/cmp/not_reached.txt"; continue; fi
  for side in old new; do
    LD_LIBRARY_PATH=${LIBS[$side]} timeout 60 "$FB" run "$g" --no-cache --warmup 10 --iters 20 --samples 7 \
      --json > "$O/cmp/${name}_$side.json" 2> "$O/cmp/${name}_$side.err"
    echo $? > "$O/cmp/${name}_$side.rc"
  done
  n=$((n + 1))
done
"$PY" - "$O/cmp" "$O/compare.json" > "$O/compare.txt" <<'PYEOF'
import glob, json, os, statistics, sys
d, out = sys.argv[1], sys.argv[2]
def version(side):
    try:
        j = json.load(open(f"{d}/info_{side}.json"))
        return j.get("cudnn", {}).get("runtime") or j.get("cudnn_runtime") or "?"
    except (OSError, ValueError):
        return "?"
rows = []
for rc in sorted(glob.glob(f"{d}/*_old.rc")):
    name = os.path.basename(rc)[:-len("_old.rc")]
    row = {"graph": name}
    for side in ("old", "new"):
        try:
            j = json.load(open(f"{d}/{name}_{side}.json"))
            s = j.get("gpu_time_ms", {}).get("samples") or []
            row[side] = {"engine": j.get("engine"), "ms": statistics.median(s) if s else None,
                         "verified": all(v.get("pass") for v in j.get("verify") or [])}
        except (OSError, ValueError):
            err = open(f"{d}/{name}_{side}.err", errors="replace").read().strip().splitlines()
            row[side] = {"error": (err[-1] if err else "no output")[:200]}
    o, n = row["old"].get("ms"), row["new"].get("ms")
    row["ratio"] = (n / o) if o and n else None
    rows.append(row)
json.dump({"old": version("old"), "new": version("new"), "rows": rows}, open(out, "w"), indent=1)
print(f"cuDNN old {version('old')} | new {version('new')}; GPU time per call, median of 7 samples of 20 calls")
print(f"{'graph':40s} {'old ms':>9s} {'new ms':>9s} {'new/old':>8s}  engines (old | new)")
slower = []
for r in rows:
    o, n = r["old"], r["new"]
    fmt = lambda s: f"{s['ms']:9.4f}" if s.get("ms") is not None else f"{'-':>9s}"
    ratio = f"{r['ratio']:8.3f}" if r["ratio"] else f"{'-':>8s}"
    flag = "  SLOWER" if r["ratio"] and r["ratio"] > 1.05 else ""
    if flag: slower.append(r["graph"])
    note = " | ".join(s.get("engine") or ("ERR " + s.get("error", "")) for s in (o, n))
    print(f"{r['graph']:40s} {fmt(o)} {fmt(n)} {ratio}  {note}{flag}")
both = [r["ratio"] for r in rows if r["ratio"]]
if both:
    import math
    print(f"{len(both)} graphs timed on both; geometric mean new/old {math.exp(sum(map(math.log, both)) / len(both)):.3f}; "
          f"more than 5% slower on new: {len(slower)} ({', '.join(slower)})")
open(f"{d}/slower.txt", "w").write("".join(g + "\n" for g in slower))
PYEOF
# The graphs more than 5% slower, tuned on each side (`fusebox tune`: the fastest of the first
# TUNE_TOP candidates, the winner verified): a heuristics ranking that changed between versions
# shows as a tuned ratio near 1; an engine that is slower on the new version stays slower.
while read -r name; do
  g=$(awk -v n="$name" '$1 == n {print $2; exit}' "$O/cmp/paths.txt")
  [ -n "$g" ] || continue
  if [ "$SECONDS" -ge "$DEADLINE" ]; then echo "$name" >> "$O/cmp/not_tuned.txt"; continue; fi
  for side in old new; do
    LD_LIBRARY_PATH=${LIBS[$side]} timeout 40 "$FB" tune "$g" --top "${TUNE_TOP:-6}" --iters 30 \
      > "$O/cmp/${name}_tuned_$side.txt" 2>&1
  done
done < "$O/cmp/slower.txt"
"$PY" - "$O/cmp" >> "$O/compare.txt" <<'PYEOF'
import os, re, sys
d = sys.argv[1]
names = [l.strip() for l in open(f"{d}/slower.txt") if l.strip()]
if names:
    print()
    print("the slower graphs tuned on each side (fastest verified engine of the first candidates):")
    print(f"{'graph':40s} {'old ms':>9s} {'new ms':>9s} {'new/old':>8s}  winners (old | new)")
still = []
for name in names:
    got = {}
    for side in ("old", "new"):
        try:
            text = open(f"{d}/{name}_tuned_{side}.txt", errors="replace").read()
        except OSError:
            text = ""
        m = re.search(r"^winner: (\S+), ([0-9.]+) ms", text, re.M)
        got[side] = (m.group(1), float(m.group(2))) if m else None
    o, n = got["old"], got["new"]
    if o and n:
        ratio = n[1] / o[1]
        flag = "  SLOWER TUNED" if ratio > 1.05 else ""
        if flag: still.append(name)
        print(f"{name:40s} {o[1]:9.4f} {n[1]:9.4f} {ratio:8.3f}  {o[0]} | {n[0]}{flag}")
    else:
        print(f"{name:40s} {'-':>9s} {'-':>9s} {'-':>8s}  not tuned on both (see cmp/{name}_tuned_*.txt)")
if names:
    print(f"tuned: {len(still)} of {len(names)} still more than 5% slower on new ({', '.join(still)})")
PYEOF
cat "$O/compare.txt"
[ -f "$O/cmp/not_tuned.txt" ] && echo "not tuned by the deadline: $(wc -l < "$O/cmp/not_tuned.txt") graphs"
[ -f "$O/cmp/not_reached.txt" ] && echo "not reached by the deadline: $(wc -l < "$O/cmp/not_reached.txt") graphs"
tar czf /tmp/cmp.tgz -C "$O" cmp && rm -rf "$O/cmp" && mv /tmp/cmp.tgz "$O/cmp.tgz"
