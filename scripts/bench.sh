#!/usr/bin/env bash
# The benchmark on the GPU machine (issue 16): fusebox against PyTorch eager,
# a manual CUDA graph, torch.compile max-autotune-no-cudagraphs and torch.compile
# reduce-overhead (issue 36: every variant's outputs checked before it is timed; a row
# missing one is "incomplete" and kept out of the means), GPU time and
# per-call latency on both sides, the measured peaks for the roofline, then
# bench/results/RUN.json, BENCHMARKS.md and bench/plots/*.png.
#
#   [PARTS=peaks,conv,conv_bwd,matmul,norm,pool,reduction,sdpa,runtime,shapes,models,report] [RUN=2026-12-01-H200] scripts/bench.sh [BUNDLE_DIR]
#
# Parts (run one per device-tool call: each fits in its 10 minutes):
#   peaks    bf16 / FP8 matmul TFLOP/s and copy GB/s (about 1 min)
#   conv     examples/graphs conv graphs (2-4 min: torch.compile max-autotune)
#   conv_bwd examples/graphs conv_dgrad / conv_wgrad graphs (torch: aten.convolution_backward with the
#            real x / w tensor in the graph's layout, channels_last for NHWC, as autograd calls it)
#   matmul   examples/graphs matmul graphs (2-4 min)
#   norm     examples/graphs layernorm / rmsnorm / batchnorm graphs (torch: its native norm kernels)
#   pool     examples/graphs max_pool / avg_pool / global_avg_pool graphs (torch: F.max_pool2d, F.adaptive_avg_pool2d)
#   reduction examples/graphs standalone reduce_* graphs (torch: eager sum/amax/..., compile, CUDA graph) and the embedding lookup (F.embedding + add)
#   sdpa     examples/graphs sdpa graphs (4-7 min)
#   runtime  build/bound_execute_bench --json (bound execute vs bare cuDNN, per execute replayed
#            in a CUDA graph; 10-layer conv+bias+relu chain at batch 1 and 8, eager vs CUDA graph)
#            and the same chain in PyTorch eager, torch.compile and torch.cuda.CUDAGraph (2-4 min)
#   models   issue 14's sizes: all-MiniLM-L6-v2 1 x 32, 32 x 128, 256 x 128 tokens (needs
#            models/minilm/fusebox) and ResNet-50 batch 1, 32, 256 as pipelines against torch eager,
#            CUDA graph and compile (docs/models.md; 1-3 min per row): MODEL_SIZES=minilm_b1_s32,...
#            runs some rows (split the part over calls), MODEL_COMPILE_MODE=default compiles faster
#   shapes   32 new shapes of each symbolic example (conv, matmul, sdpa), kernel cache
#            against cold builds: `fusebox shapes` (issue 11; a few minutes)
#   st       (not in the default PARTS) `fusebox model embed` against sentence-transformers on this
#            GPU: cosine per sentence on examples/sentences/mixed.txt (>= 0.9999) and embeddings/s,
#            cold and warm, on 1,000 sentences (fusebox_tools.bench.st_compare; needs
#            models/minilm/fusebox; $OUT/st_compare.json; a few minutes)
#   report   merges the parts into bench/results/RUN.json, regenerates BENCHMARKS.md
#            (and plots where matplotlib is installed), compares with the previous results file
# A part keeps its rows in $BENCH_DIR/RUN/PART.json (BENCH_DIR=.bench, git-ignored) as
# each row finishes: run again, it skips the rows done (FORCE=1 redoes them). On a
# fresh machine carry .bench to resume. Everything written is also copied to $OUT
# (the parts as $OUT/bench_parts.tgz: `python3 -m fusebox_tools.bench.bench_merge FILES_AT/bench_parts.tgz`
# in the repository root here merges them into .bench/RUN/ row by row before the next call;
# `tar xzf` would replace each part file whole, losing the rows this call did not run).
# FORCE=1 redoes the rows the call selects (GRAPHS, MODEL_SIZES) and keeps the part's others.
# BENCH_TUNE=1: `fusebox tune` every graph first and time its winner (notes say which, against the
# heuristics' choice). BENCH_CALLS (50) calls per GPU-time sample, BENCH_SAMPLES (10) samples; GRAPHS="a.json
# b.json" benchmarks those graphs in the part instead of the examples.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
BUNDLE=${1:-.gpu}
bash scripts/gpu_unpack.sh "$BUNDLE" || exit 1  # a PACK=1 bundle (scripts/gpu_bundle.sh)
OUT=${OUT:-/tmp/out}
BENCH_DIR=${BENCH_DIR:-.bench}
# The parts of fusebox_tools.bench.bench_run (its PARTS), in the order the report merges them.
BENCH_PARTS="peaks conv conv_bwd matmul norm pool reduction sdpa runtime shapes models"
PARTS=${PARTS:-${BENCH_PARTS// /,},report}
mkdir -p "$OUT"

FB=${FUSEBOX_BIN:-$BUNDLE/fusebox}
[ -x "$FB" ] || FB=build/fusebox
# The runtime part's binary: beside fusebox in the bundle, else in build/.
if [ -z "${FUSEBOX_RUNTIME_BENCH:-}" ]; then
  FUSEBOX_RUNTIME_BENCH="$(dirname "$FB")/bound_execute_bench"
  [ -x "$FUSEBOX_RUNTIME_BENCH" ] || FUSEBOX_RUNTIME_BENCH=build/bound_execute_bench
fi
export FUSEBOX_RUNTIME_BENCH
# FUSEBOX_GPU_CUDNN=pinned: the pinned cuDNN that scripts/gpu_cudnn.sh received; default torch's 9.19.
# Each row records the cuDNN it ran on; bench_report refuses to merge rows of two versions.
if [ "${FUSEBOX_GPU_CUDNN:-torch}" = pinned ]; then
  source scripts/gpu_cudnn.sh env || exit 1
else
  export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" FUSEBOX_BIN="$FB"
# torch.compile's autotuning results survive between calls on a warm machine; outside
# .bench, which stays small enough to carry (JSON only).
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/fusebox_bench_inductor}
PY=/opt/torch/.venv/bin/python3
[ -x "$PY" ] || PY=python3

if [ -z "${RUN:-}" ]; then
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 2>/dev/null | head -n1 | awk '{print $NF}' | tr -cd 'A-Za-z0-9_-')
  RUN="$(date -u +%F)-${gpu:-GPU}"
fi
WORK="$BENCH_DIR/$RUN"
mkdir -p "$WORK" bench/results
echo "bench: run $RUN, parts $PARTS, fusebox $FB, python $PY, work $WORK, $(date -u)"
if [ ! -x "$FB" ]; then
  echo "bench: no fusebox binary ($BUNDLE/fusebox or build/fusebox): make gpu-bundle here and carry .gpu" >&2
  exit 1
fi
"$FB" --version
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv 2>/dev/null

fails=0
IFS=, read -r -a parts <<< "$PARTS"
for part in "${parts[@]}"; do
  T0=$SECONDS
  case " $BENCH_PARTS " in *" $part "*) is_bench=1 ;; *) is_bench=0 ;; esac
  [ "$part" = report ] && is_bench=report
  [ "$part" = st ] && is_bench=st
  case "$is_bench" in
    1)
      echo "== $(date -u +%T) part $part"
      args=(--part "$part" --out "$WORK/$part.json")
      [ -n "${FORCE:-}" ] && args+=(--force)
      # shellcheck disable=SC2086
      timeout "${PART_TIMEOUT:-570}" "$PY" -m fusebox_tools.bench.bench_run "${args[@]}" ${GRAPHS:-} 2>&1 | tee "$WORK/$part.log"
      rc=${PIPESTATUS[0]}
      [ "$rc" -eq 0 ] || { echo "bench: part $part exited $rc (rows done so far are kept; run it again to resume)"; fails=$((fails + 1)); }
      ;;
    report)
      echo "== $(date -u +%T) report"
      have=()
      for p in $BENCH_PARTS; do [ -f "$WORK/$p.json" ] && have+=("$WORK/$p.json"); done
      if [ "${#have[@]}" -eq 0 ]; then echo "bench: no part results in $WORK"; fails=$((fails + 1)); continue; fi
      "$PY" -m fusebox_tools.bench.bench_report --merge "${have[@]}" --out "bench/results/$RUN.json" || { fails=$((fails + 1)); continue; }
      "$PY" -m fusebox_tools.bench.bench_report "bench/results/$RUN.json" --update BENCHMARKS.md --plots-dir bench/plots \
        --markdown-out "$OUT/bench_report.md" || { fails=$((fails + 1)); continue; }
      cat "$OUT/bench_report.md"
      mkdir -p "$OUT/bench/results" "$OUT/bench/plots"
      cp "bench/results/$RUN.json" "$OUT/bench/results/" && cp BENCHMARKS.md "$OUT/"
      cp bench/plots/*.png "$OUT/bench/plots/" 2>/dev/null || true
      ;;
    st)
      echo "== $(date -u +%T) part st (fusebox model embed against sentence-transformers)"
      timeout "${PART_TIMEOUT:-570}" "$PY" -m fusebox_tools.bench.st_compare --fusebox "$FB" \
        --json-out "$OUT/st_compare.json" 2>&1 | tee "$WORK/st.log"
      rc=${PIPESTATUS[0]}
      [ "$rc" -eq 0 ] || { echo "bench: part st exited $rc"; fails=$((fails + 1)); }
      ;;
    *)
      echo "bench: unknown part '$part': accepted parts are ${BENCH_PARTS// /, }, st, report" >&2
      exit 2
      ;;
  esac
  echo "bench: $part took $((SECONDS - T0)) s"
  # What the parts have so far comes back with every call, as one file (the device
  # tool returns a limited number of files; twelve part files did not all come back).
  tar czf "$OUT/bench_parts.tgz" "$WORK" 2>/dev/null
done
echo "bench: $fails failed parts"
[ "$fails" -eq 0 ]
