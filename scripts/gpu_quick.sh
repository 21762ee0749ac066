#!/usr/bin/env bash
# A targeted GPU-machine pass (a subset of scripts/gpu_check.sh) for when the
# device budget is short: GPU tests matching GTEST_FILTER, `fusebox run
# --verify` of the graphs matching GRAPH_FILTER, the PyTorch cross-check of the
# small ones, the SDPA benchmark against torch and the plan-cache start-up;
# with PIPELINES=1, `pipeline run --verify` of every example pipeline and its
# PyTorch cross-check (GRAPH_FILTER=none skips the graphs).
#   OUT=DIR GTEST_FILTER='*Sdpa*' GRAPH_FILTER=sdpa [CUDA_GRAPH=1] [PIPELINES=1] scripts/gpu_quick.sh [BUNDLE_DIR]
# CUDA_GRAPH=1 also runs each graph with --cuda-graph (bit-identical to eager, verified).
# Every step writes its own log under $OUT as it goes, so a timeout keeps what ran.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
BUNDLE=${1:-.gpu}
bash scripts/gpu_unpack.sh "$BUNDLE" || exit 1  # a PACK=1 bundle (scripts/gpu_bundle.sh)
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
FB="$BUNDLE/fusebox"
# FUSEBOX_GPU_CUDNN=pinned: the pinned cuDNN that scripts/gpu_cudnn.sh received; default torch's 9.19.
if [ "${FUSEBOX_GPU_CUDNN:-torch}" = pinned ]; then
  source scripts/gpu_cudnn.sh env || exit 1
else
  export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib
fi
export FUSEBOX_SOURCE_DIR="$PWD" FUSEBOX_DEVPROP="$PWD/devices/h200-cudnn-9.27.devprop"
# The Python tools (python/fusebox_tools) read graphs through this fusebox.
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" FUSEBOX_BIN="$FB"
PY=/opt/torch/.venv/bin/python3
[ -x "$PY" ] || PY=python3
GRAPH_FILTER=${GRAPH_FILTER:-.}
fails=0
step() { echo "== $(date -u +%T) $*"; }

step gpu_tests "${GTEST_FILTER:-*}"
GTEST_FILTER=${GTEST_FILTER:-*} timeout "${GTEST_TIMEOUT:-240}" "$BUNDLE/fusebox_gpu_tests" > "$OUT/gpu_tests.log" 2>&1 || fails=$((fails + 1))
tail -n 3 "$OUT/gpu_tests.log"

mkdir -p "$OUT/run"
for g in examples/graphs/small/*.json examples/graphs/*.json; do
  case "$(basename "$g")" in invalid_*) continue ;; esac
  [[ "$g" =~ $GRAPH_FILTER ]] || continue
  name=$(basename "$g" .json)
  step run "$name"
  if ! timeout 120 "$FB" run "$g" --verify --warmup 5 --iters 20 > "$OUT/run/$name.txt" 2>&1; then
    # refused for this GPU's architecture by design (block masks: Blackwell only in cuDNN 9.19)
    if grep -q "need a Blackwell GPU (sm_100" "$OUT/run/$name.txt"; then echo "SKIP $name: refused on this GPU by design"; continue; fi
    echo "FAIL run $name"; fails=$((fails + 1))
  fi
  grep -E "verify|latency|plan:|first execution" "$OUT/run/$name.txt" | cut -c1-220
  if [ -n "${CUDA_GRAPH:-}" ]; then
    # CUDA_GRAPH=1: also as a CUDA graph, outputs bit-identical to eager (issue #11).
    step run --cuda-graph "$name"
    timeout 120 "$FB" run "$g" --cuda-graph --verify --warmup 5 --iters 20 > "$OUT/run/$name.cuda_graph.txt" 2>&1 \
      || { echo "FAIL run --cuda-graph $name"; fails=$((fails + 1)); }
    grep -E "CUDA graph|verify|latency|rror" "$OUT/run/$name.cuda_graph.txt" | cut -c1-220
  fi
done

SMALL=()
for g in examples/graphs/small/*.json; do
  case "$(basename "$g")" in invalid_*) continue ;; esac  # refused by design: not cross-checked
  [[ "$g" =~ $GRAPH_FILTER ]] && SMALL+=("$g")
done
if [ "${#SMALL[@]}" -gt 0 ]; then
  step torch_crosscheck
  timeout 200 "$PY" -m fusebox_tools.crosscheck.crosscheck --fusebox "$FB" --json-out "$OUT/crosscheck.json" "${SMALL[@]}" > "$OUT/crosscheck.log" 2>&1 || fails=$((fails + 1))
  tail -n 25 "$OUT/crosscheck.log"
fi

# TUNE_GRAPHS: tune each (and, for an sdpa forward, its training-mode variant
# with a stats output, as fusebox_tools.bench.sdpa_compare times it) into $FUSEBOX_CACHE,
# so the benchmark below runs the tuned plans.
if [ -n "${TUNE_GRAPHS:-}" ]; then
  export FUSEBOX_CACHE=${FUSEBOX_CACHE:-/tmp/fusebox_tuned.sqlite}
  mkdir -p "$OUT/tune"
  for g in $TUNE_GRAPHS; do
    for v in $("$PY" -c 'import sys; from fusebox_tools import sdpa_compare as s; from fusebox_tools.core.graph import Graph
g = sys.argv[1]; ops = [o for o in Graph.load(g).ops if o["op"] == "sdpa_fwd"]
print(g); [print(s.stats_variant(g, o["name"], "/tmp", True)) for o in ops[:1]]' "$g" 2>/dev/null || echo "$g"); do
      name=$(basename "$v" .json)
      step tune "$name"
      timeout "${TUNE_TIMEOUT:-150}" "$FB" tune "$v" --warmup 5 --iters 20 > "$OUT/tune/$name.txt" 2>&1 || { echo "FAIL tune $name"; fails=$((fails + 1)); }
      head -n 14 "$OUT/tune/$name.txt" | cut -c1-200
    done
  done
fi

if [ -n "${PIPELINES:-}" ]; then
  mkdir -p "$OUT/pipelines"
  for p in examples/pipelines/*.json; do
    name=$(basename "$p" .json)
    step pipeline_run "$name"
    timeout 240 "$FB" pipeline run "$p" --verify --warmup 5 --iters 20 --no-cache > "$OUT/pipelines/$name.txt" 2>&1 \
      || { echo "FAIL pipeline run $name"; fails=$((fails + 1)); }
    cut -c1-220 "$OUT/pipelines/$name.txt"
    step pipeline_crosscheck "$name"
    timeout 300 "$PY" -m fusebox_tools.crosscheck.pipeline_crosscheck "$p" --fusebox "$FB" --out "$OUT/pipelines/$name.out" \
      --json-out "$OUT/pipelines/$name.crosscheck.json" > "$OUT/pipelines/$name.crosscheck.log" 2>&1 \
      || { echo "FAIL pipeline_crosscheck $name"; fails=$((fails + 1)); }
    tail -n 14 "$OUT/pipelines/$name.crosscheck.log"
    rm -rf "$OUT/pipelines/$name.out"  # conv10's saved buffers are 60 MiB
  done
fi

if [ -n "${BENCH_GRAPHS:-}" ]; then
  step sdpa_bench
  # shellcheck disable=SC2086
  timeout "${BENCH_TIMEOUT:-240}" "$PY" -m fusebox_tools.bench.sdpa_compare --fusebox "$FB" --warmup 5 --iters 30 \
    --json-out "$OUT/sdpa_bench.json" --markdown-out "$OUT/sdpa_bench.md" $BENCH_GRAPHS > "$OUT/sdpa_bench.log" 2>&1 || fails=$((fails + 1))
  cat "$OUT/sdpa_bench.md" 2>/dev/null || tail -n 30 "$OUT/sdpa_bench.log"
fi

if [ -n "${CACHE:-}" ]; then
  step plan_cache
  SECTIONS=plan_cache OUT="$OUT/cache" bash scripts/gpu_check.sh "$BUNDLE" > "$OUT/plan_cache.log" 2>&1 || fails=$((fails + 1))
  grep -E "cold|FAIL|aot|cache hit" "$OUT/plan_cache.log" | cut -c1-600
fi
echo "gpu_quick: $fails failed steps"
[ "$fails" -eq 0 ]
