#!/usr/bin/env bash
# The all-MiniLM-L6-v2 pipeline on the GPU machine (docs/models.md, "all-MiniLM-L6-v2"):
#  1. a tiny random-weights MiniLM pipeline: fusebox's per-stage verification and the torch
#     cross-check of every stage (python/fusebox_tools/crosscheck/pipeline_crosscheck.py);
#  2. the real model (converted weights carried in MODEL, default models/minilm/fusebox):
#     8 sentences, S=32 (a small CPU reference), `pipeline run --verify`, against the numpy float32 reference and
#     transformers' BertModel in torch with the same weights;
#  3. the same at S=128 timed (pipeline run --iters 50 --cuda-graph), with the same checks.
# Logs and JSON under $OUT (default /tmp/minilm_gpu). Exit 1 if any part failed.
#   usage: scripts/minilm_gpu.sh [MODEL]        (FUSEBOX_BIN default .gpu/fusebox)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
MODEL=${1:-models/minilm/fusebox}
OUT=${OUT:-/tmp/minilm_gpu}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
[ -d .gpu ] && { bash scripts/gpu_unpack.sh .gpu || exit 1; }  # a PACK=1 bundle (scripts/gpu_bundle.sh)
export FUSEBOX_BIN=${FUSEBOX_BIN:-$PWD/.gpu/fusebox}
export FUSEBOX_CACHE=${FUSEBOX_CACHE:-${TMPDIR:-/tmp}/minilm_plans.sqlite}
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=python3
fail=0
part() {  # part NAME CMD...: runs CMD, log in $OUT/NAME.log
  local name=$1; shift
  echo "== $name: $*"
  if "$@" >"$OUT/$name.log" 2>&1; then echo "   ok"; else echo "   FAILED (exit $?)"; fail=1; fi
  tail -n 25 "$OUT/$name.log" | sed 's/^/   | /'
}

"$FUSEBOX_BIN" --version | head -3
part tiny_generate "$PY" -m fusebox_tools.models.minilm random --out "$OUT/tiny" --batch 2 --seq 64 --layers 2 \
  --hidden 128 --heads 4 --ffn 256
part tiny_check "$FUSEBOX_BIN" pipeline check "$OUT/tiny/minilm_b2_s64.json"
part tiny_run_verify "$FUSEBOX_BIN" pipeline run "$OUT/tiny/minilm_b2_s64.json" --verify --iters 10
part tiny_torch_crosscheck "$PY" -m fusebox_tools.crosscheck.pipeline_crosscheck "$OUT/tiny/minilm_b2_s64.json" \
  --out "$OUT/tiny_saved" --json-out "$OUT/tiny_crosscheck.json"
# The symbolic pipeline (minilm.json) at two shapes, dynamic-shape plans, and the same in torch.
part tiny_dyn_verify "$FUSEBOX_BIN" pipeline run "$OUT/tiny/minilm.json" --shape B=3,S=24,N=72 --verify --cuda-graph --iters 10
part tiny_dyn_torch_crosscheck "$PY" -m fusebox_tools.crosscheck.pipeline_crosscheck "$OUT/tiny/minilm.json" --shape B=5,S=40,N=200 \
  --out "$OUT/tiny_dyn_saved" --json-out "$OUT/tiny_dyn_crosscheck.json"
if [ -f "$MODEL/minilm_config.json" ]; then
  part real_auto_seq "$PY" -m fusebox_tools.models.minilm_embed --model "$MODEL" --reference --torch \
    --out "$OUT/real_auto" --json-out "$OUT/real_auto.json"
  part real_s32_verify "$PY" -m fusebox_tools.models.minilm_embed --model "$MODEL" --seq 32 --verify --reference \
    --torch --out "$OUT/real_s32" --json-out "$OUT/real_s32.json"
  part real_s128_timed "$PY" -m fusebox_tools.models.minilm_embed --model "$MODEL" --seq 128 --iters 50 --cuda-graph --reference \
    --torch --torch-time --out "$OUT/real_s128" --json-out "$OUT/real_s128.json"
else
  echo "== real model: $MODEL/minilm_config.json missing (carry models/minilm/fusebox: docs/models.md)"
  fail=1
fi
rm -rf "$OUT/tiny_saved" "$OUT/real_s32/run" "$OUT/real_s128/run"  # large saved buffers; the logs stay
echo "minilm_gpu: $([ $fail = 0 ] && echo PASS || echo FAIL) (logs in $OUT)"
exit $fail
