#!/usr/bin/env bash
# Issue 14's verifications on the GPU machine, one command (docs/models.md, "Issue 14 on the H200"):
#  minilm   200 generated sentences of 3-100 words through the MiniLM pipeline (4 runs of 50 x 128
#           tokens) against sentence-transformers (else transformers' BertModel + mean + L2), same
#           weights: cosine >= 0.999 for every sentence, the similarity ranking of all 19900 pairs
#           unchanged (fusebox_tools.models.minilm_verify)
#  resnet50 256 seeded random images through the ResNet-50 pipeline (4 runs of batch 64, --verify on
#           the first) against torchvision float32 and bf16, same seeded weights, two heads
#           (fusebox_tools.models.resnet50_check --images 256; docs/models.md says why two):
#           - the seeded random head: logits within the bf16 tolerance; its top-1 lands on near ties
#             of random images, judged at 98% (torch's own bf16 reaches 98.4%);
#           - a nearest-prototype head (--head prototypes: 1000 seeded prototype images' float32
#             features), shown noisy views of random prototypes: top-1 agreement >= 99%
# JSON and logs in $OUT (default /tmp/models_verify). Exit 1 if either failed.
#   usage: [PARTS=minilm,resnet50] scripts/models_verify_gpu.sh [MINILM_MODEL]
#   (FUSEBOX_BIN default .gpu/fusebox; carry [".gpu/fusebox", "models/minilm/fusebox"], 59 MB)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
MODEL=${1:-models/minilm/fusebox}
OUT=${OUT:-/tmp/models_verify}
PARTS=${PARTS:-minilm,resnet50}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
[ -d .gpu ] && { bash scripts/gpu_unpack.sh .gpu || exit 1; }  # a PACK=1 bundle (scripts/gpu_bundle.sh)
export FUSEBOX_BIN=${FUSEBOX_BIN:-$PWD/.gpu/fusebox}
[ -x "$FUSEBOX_BIN" ] || FUSEBOX_BIN=$PWD/build/fusebox
# One plan cache for the runs of one pipeline: the later batches start warm.
export FUSEBOX_CACHE=${FUSEBOX_CACHE:-${TMPDIR:-/tmp}/models_verify_plans.sqlite}
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=python3
fail=0
part() {  # part NAME CMD...: runs CMD, log in $OUT/NAME.log, its summary printed
  local name=$1; shift
  echo "== $(date -u +%T) $name: $*"
  local t0=$SECONDS
  if "$@" >"$OUT/$name.log" 2>&1; then echo "   ok ($((SECONDS - t0)) s)"; else echo "   FAILED (exit $?, $((SECONDS - t0)) s)"; fail=1; fi
  tail -n 20 "$OUT/$name.log" | sed 's/^/   | /'
}

"$FUSEBOX_BIN" --version | head -3
"$PY" -c 'import torch, importlib.util as u; print("torch", torch.__version__, "| sentence-transformers:",
  "yes" if u.find_spec("sentence_transformers") else "no (reference: transformers BertModel + mean + L2)",
  "| torchvision:", "yes" if u.find_spec("torchvision") else "no")'
case ",$PARTS," in *,minilm,*)
  if [ -f "$MODEL/minilm_config.json" ]; then
    part minilm_verify "$PY" -m fusebox_tools.models.minilm_verify --model "$MODEL" --sentences 200 --batch 50 --seq 128 \
      --json-out "$OUT/minilm_verify.json"
  else
    echo "== minilm: $MODEL/minilm_config.json missing (carry models/minilm/fusebox: docs/models.md)"
    fail=1
  fi ;;
esac
case ",$PARTS," in *,resnet50,*)
  part resnet50_images "$PY" -m fusebox_tools.models.resnet50_check --images 256 --batch 64 --min-top1 0.98 \
    --out "${TMPDIR:-/tmp}/models_verify_rn50" --json-out "$OUT/resnet50_images.json"
  part resnet50_images_prototypes "$PY" -m fusebox_tools.models.resnet50_check --images 256 --batch 64 \
    --head prototypes --out "${TMPDIR:-/tmp}/models_verify_rn50p" \
    --json-out "$OUT/resnet50_images_prototypes.json" ;;
esac
echo "models_verify: $([ $fail = 0 ] && echo PASS || echo FAIL) (JSON and logs in $OUT)"
exit $fail
