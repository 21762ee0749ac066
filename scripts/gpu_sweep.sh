#!/usr/bin/env bash
# Randomized sweep on the GPU machine (issue #29, item 5): generates COUNT valid graphs
# with fusebox_tools.crosscheck.graph_gen (seeds SEED .. SEED+COUNT-1, round robin over its families)
# and runs each with `BIN run G --verify --iters 0 --no-cache --json` under a per-graph
# timeout, then classifies it:
#
#   PASS      exit 0: built, ran, every output within tolerance of the reference
#   PASSREF   the same, but an op no cuDNN engine builds ran on fusebox's reference kernels
#             (PlanRequest::reference_fallback): correct and slow, counted apart
#   WRONG     ran, but verification failed (VerificationFailed, exit 1): wrong values served
#   REFUSED   the plan check refused every candidate (VerificationFailed naming the plan check):
#             no plan was served, nothing wrong reached the caller (docs/architecture.md)
#   NOENGINE  cuDNN refused the graph (NotSupported, exit 1)
#   UNVERIF   dropout without a declared dropout_mask output: the references cannot draw cuDNN's
#             Philox mask, so --verify refuses it (NotSupported) by design; the graph then ran
#             without --verify (exit 0). Counted apart: it ran, but nothing checked its values
#   ARCH      refused by design before cuDNN ran: the graph needs a newer GPU than the
#             target (block masks need Blackwell); not a gap on this GPU
#   ERROR     anything else: InvalidArgument (exit 2) of a graph `check` accepts, CudnnError,
#             CudaError, Internal, a crash (killed by a signal)
#   TIMEOUT   still running after PER_GRAPH_TIMEOUT seconds
#   SKIP      not started: the whole sweep passed DEADLINE_S (keeps the call under the
#             device tool's 10 minutes)
#
# Output, under $OUT (/tmp/out if unset):
#   sweep.log          one line per graph, in seed order: STATUS FAMILY FILE DETAIL
#                      (DETAIL: the verify summary, or the first line of the error)
#   sweep_tally.txt    counts per family and overall (also printed)
#   sweep_fail/        every graph that did not PASS, with its stderr (.err) and stdout (.json)
#                      and, for a WRONG one, its outputs (NAME_outputs/: `fusebox reference NAME.json --compare`)
#
# Usage (from the repository root; BIN is the fusebox binary, e.g. .gpu/fusebox):
#   bash scripts/gpu_sweep.sh BIN [COUNT=320] [SEED=0]
# Environment: JOBS (parallel runs, default 4), PER_GRAPH_TIMEOUT (60), DEADLINE_S (480),
# FAMILIES (comma-separated subset of graph_gen's families, default all).
# Graphs are small (at most 2e8 FLOPs, 64 MiB): COUNT=320 takes a few minutes on the H200.
# Needs python3 (the generator: standard library only). Exits 0 when every graph ran to a
# verdict other than WRONG, ERROR or TIMEOUT, else 1.
set -u

usage() { echo "usage: bash scripts/gpu_sweep.sh BIN [COUNT] [SEED]" >&2; exit 2; }
[ $# -ge 1 ] || usage
BIN=$1
COUNT=${2:-320}
SEED=${3:-0}
case "$COUNT$SEED" in *[!0-9]*) usage ;; esac
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
case "$BIN" in /*) ;; *) BIN="$PWD/$BIN" ;; esac
[ -x "$BIN" ] || { echo "gpu_sweep: $BIN is not an executable file" >&2; exit 2; }

OUT=${OUT:-/tmp/out}
JOBS=${JOBS:-4}
PER_GRAPH_TIMEOUT=${PER_GRAPH_TIMEOUT:-60}
DEADLINE_S=${DEADLINE_S:-480}
FAMILIES=${FAMILIES:-}
if [ -z "${LD_LIBRARY_PATH:-}" ]; then  # docs/gpu.md
  export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib
fi
# A bundle's own libraries (scripts/gpu_bundle.sh) next to the binary.
export LD_LIBRARY_PATH="$(dirname "$BIN"):$LD_LIBRARY_PATH"

mkdir -p "$OUT" "$OUT/sweep_fail"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_sweep.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/graphs" "$WORK/res"

gen_args=(--count "$COUNT" --seed "$SEED" --out "$WORK/graphs")
[ -n "$FAMILIES" ] && gen_args+=(--families "$FAMILIES")
if ! PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" python3 -m fusebox_tools.crosscheck.graph_gen "${gen_args[@]}"; then
  echo "gpu_sweep: the generator failed" >&2
  exit 2
fi

START=$(date +%s)
export BIN WORK OUT PER_GRAPH_TIMEOUT DEADLINE_S START

# One graph: run it, classify it, write WORK/res/<seed>.line.
run_one() {
  local g=$1 base fam seed rc status detail now
  base=$(basename "$g" .json)        # gen_<family>_<seed>
  seed=${base##*_}
  fam=${base#gen_}
  fam=${fam%_"$seed"}
  now=$(date +%s)
  if [ $((now - START)) -ge "$DEADLINE_S" ]; then
    printf 'SKIP %s %s not run: the sweep passed DEADLINE_S=%s\n' "$fam" "$base.json" "$DEADLINE_S" \
      > "$WORK/res/$seed.line"
    return 0
  fi
  timeout -k 5 "$PER_GRAPH_TIMEOUT" "$BIN" run "$g" --verify --iters 0 --no-cache --json \
    > "$WORK/res/$seed.json" 2> "$WORK/res/$seed.err"
  rc=$?
  detail=$(python3 - "$WORK/res/$seed.json" "$WORK/res/$seed.err" "$rc" <<'EOF'
import json, re, sys
out, err, rc = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    doc = json.load(open(out))
except Exception:
    doc = None
lines = [l.strip() for l in open(err, errors="replace") if l.strip()]
m = None
for l in lines:
    m = re.match(r"fusebox run: (\w+): ", l)
    if m:
        break
code = m.group(1) if m else ""
first = m.string if m else (lines[0] if lines else "")
first = first[:400]
def summary(entries, failing_only):
    parts = []
    for e in entries or []:
        if failing_only and e.get("pass"):
            continue
        parts.append("%s: rel_l2=%.3g max_abs_rel=%.3g non_finite=%s (tol %.3g/%.3g)" % (
            e.get("tensor"), e.get("rel_l2", float("nan")), e.get("max_abs_rel", float("nan")),
            e.get("non_finite"), e.get("tol_rel_l2", float("nan")), e.get("tol_max_abs_rel", float("nan"))))
    return "; ".join(parts)
if rc == 0:
    v = (doc or {}).get("verify") or []
    worst = max((e.get("rel_l2", 0.0) for e in v), default=0.0)
    # PASSREF: it ran and verified, but on fusebox's reference kernels (no cuDNN engine for an op).
    fallback = ((doc or {}).get("plan") or {}).get("reference_fallback") or []
    status = "PASSREF" if fallback or "fusebox_reference" in str((doc or {}).get("engine", "")) else "PASS"
    detail = "%d output(s) verified (%s reference), worst rel_l2 %.3g" % (
        len(v), (doc or {}).get("reference", "?"), worst)
    if fallback:
        detail += "; on the reference kernels: " + " / ".join(fallback)[:300]
elif rc in (124, 137) and not code:
    status, detail = "TIMEOUT", "no verdict after the per-graph timeout"
elif rc == 1 and code == "VerificationFailed" and "plan check" in first:
    # with every rejected plan and why (the lines after the first)
    rejected = [l for l in lines if l.startswith("rejected ")]
    status, detail = "REFUSED", " | ".join([first] + rejected)[:900]
elif rc == 1 and code == "VerificationFailed":
    # which engine served it (the next step of any WRONG is an engine rule or a reference fix)
    status, detail = "WRONG", (summary((doc or {}).get("verify"), True) or first) + \
        "; engine %s" % ((doc or {}).get("engine") or "?")
elif rc == 1 and code == "NotSupported" and "need a Blackwell GPU" in first:
    status, detail = "ARCH", first
elif rc == 1 and code == "NotSupported" and "declare a 'dropout_mask' output to verify" in first:
    status, detail = "UNVERIF", first
elif rc == 1 and code == "NotSupported":
    # every line: the last resort's reason follows cuDNN's ("and fusebox's reference kernels ...")
    status, detail = "NOENGINE", " | ".join(lines)[:900]
elif rc > 128 or rc < 0:
    status, detail = "ERROR", "killed by signal %d: %s" % (rc - 128 if rc > 128 else -rc, first)
else:
    status, detail = "ERROR", "exit %d: %s" % (rc, first or "(no error line)")
print(status, detail.replace("\n", " "))
EOF
)
  status=${detail%% *}
  detail=${detail#* }
  if [ "$status" = UNVERIF ]; then  # verification refused by design: does the graph run at all?
    if timeout -k 5 "$PER_GRAPH_TIMEOUT" "$BIN" run "$g" --iters 0 --no-cache > /dev/null 2> "$WORK/res/$seed.err2"; then
      detail="ran without --verify; $detail"
    else
      status=NOENGINE
      detail="without --verify too: $(grep -m1 'fusebox run: ' "$WORK/res/$seed.err2" | cut -c1-400)"
    fi
  fi
  printf '%s %s %s %s\n' "$status" "$fam" "$base.json" "$detail" > "$WORK/res/$seed.line"
  if [ "$status" != PASS ] && [ "$status" != PASSREF ]; then
    cp "$g" "$OUT/sweep_fail/"
    cp "$WORK/res/$seed.err" "$OUT/sweep_fail/$base.err" 2>/dev/null
    [ -s "$WORK/res/$seed.json" ] && cp "$WORK/res/$seed.json" "$OUT/sweep_fail/$base.out.json"
  fi
  # A wrong answer: its outputs (the same default seed) for `fusebox reference GRAPH --compare DIR`
  # on any machine, which names each output's worst element against the CPU reference.
  if [ "$status" = WRONG ]; then
    timeout -k 5 "$PER_GRAPH_TIMEOUT" "$BIN" run "$g" --iters 0 --no-cache \
      --save-outputs "$OUT/sweep_fail/${base}_outputs" > /dev/null 2>&1
  fi
  printf '%-8s %s\n' "$status" "$base" >&2
}
export -f run_one

echo "gpu_sweep: $COUNT graphs (seeds $SEED..$((SEED + COUNT - 1))), $JOBS at a time, ${PER_GRAPH_TIMEOUT}s each, deadline ${DEADLINE_S}s; $BIN" >&2
find "$WORK/graphs" -name 'gen_*.json' | sort | xargs -r -P "$JOBS" -I{} bash -c 'run_one "$1"' _ {}

# sweep.log in seed order
: > "$OUT/sweep.log"
for s in $(seq "$SEED" $((SEED + COUNT - 1))); do
  [ -f "$WORK/res/$s.line" ] && cat "$WORK/res/$s.line" >> "$OUT/sweep.log"
done

python3 - "$OUT/sweep.log" "$(( $(date +%s) - START ))" > "$OUT/sweep_tally.txt" <<'EOF'
import collections, sys
log, elapsed = sys.argv[1], sys.argv[2]
states = ["PASS", "PASSREF", "WRONG", "REFUSED", "NOENGINE", "UNVERIF", "ARCH", "ERROR", "TIMEOUT", "SKIP"]
per = collections.defaultdict(collections.Counter)
for line in open(log):
    parts = line.split(" ", 3)
    if len(parts) >= 2:
        per[parts[1]][parts[0]] += 1
total = collections.Counter()
print("%-22s %s %8s" % ("family", " ".join("%8s" % s for s in states), "total"))
for fam in sorted(per):
    c = per[fam]
    total.update(c)
    print("%-22s %s %8d" % (fam, " ".join("%8d" % c[s] for s in states), sum(c.values())))
print("%-22s %s %8d" % ("ALL", " ".join("%8d" % total[s] for s in states), sum(total.values())))
print("elapsed %s s" % elapsed)
EOF
cat "$OUT/sweep_tally.txt"
if grep -qE '^(WRONG|ERROR|TIMEOUT) ' "$OUT/sweep.log"; then
  exit 1
fi
exit 0
