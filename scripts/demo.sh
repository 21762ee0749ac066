#!/usr/bin/env bash
# The fusebox demo (`make demo`): for every valid example graph, check it, build
# a cuDNN plan for the H200 from the committed device file (no GPU needed),
# and run + verify it when this machine has a GPU. Then shows that a graph with
# mismatched shapes is rejected. Exits non-zero if anything unexpected fails.
#   usage: scripts/demo.sh BUILD_DIR
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

BUILD_DIR=${1:-build}
FB="$BUILD_DIR/fusebox"
DEVPROP=devices/h200-cudnn-9.27.devprop
if [ ! -x "$FB" ]; then
  echo "demo: $FB not found: build first (make build)" >&2
  exit 1
fi

FAILED=()
TMP_ERR=$(mktemp)
RN50_DIR=$(mktemp -d)
trap 'rm -f "$TMP_ERR"; rm -rf "$RN50_DIR"' EXIT
step() {
  echo
  echo "\$ fusebox $*"
  "$FB" "$@"
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "demo: FAILED (exit $rc): fusebox $*"
    FAILED+=("fusebox $*")
  fi
  return "$rc"
}

# A GPU is there if `info --json` says so (any of the usual keys, true or a count > 0).
HAVE_GPU=0
if info_json=$("$FB" info --json 2>/dev/null) && python3 -c '
import json, sys
r = json.loads(sys.argv[1])
def gpu(v):
    return bool(v) and (not isinstance(v, (list, dict)) or len(v) > 0)
keys = ("gpu", "gpus", "gpu_count", "devices", "device_count", "cuda_devices", "cuda_device_count", "has_gpu")
sys.exit(0 if any(gpu(r.get(k)) for k in keys) else 1)' "$info_json" 2>/dev/null; then
  HAVE_GPU=1
fi
step info
echo
if [ "$HAVE_GPU" -eq 1 ]; then
  echo "demo: a GPU is present: graphs are also run and verified"
else
  echo "demo: no GPU here: graphs are checked and built for the H200 from $DEVPROP (deviceless)"
fi

for g in examples/graphs/*.json examples/graphs/small/*.json; do
  [ -f "$g" ] || continue
  case "$(basename "$g")" in invalid_*) continue ;; esac
  echo
  echo "=================== $g"
  step check "$g" || continue
  echo
  echo "\$ fusebox build $g --device $DEVPROP"
  "$FB" build "$g" --device "$DEVPROP" 2> "$TMP_ERR"
  rc=$?
  if [ "$rc" -eq 1 ] && grep -q NotSupported "$TMP_ERR"; then
    # cuDNN 9.19 builds only precompiled engines without a driver (known limitation).
    head -n 1 "$TMP_ERR"
    echo "demo: cuDNN cannot build this graph deviceless (NotSupported, above): a known limitation, not a failure"
  elif [ "$rc" -ne 0 ]; then
    cat "$TMP_ERR"
    echo "demo: FAILED (exit $rc): fusebox build $g --device $DEVPROP"
    FAILED+=("fusebox build $g --device $DEVPROP")
    continue
  fi
  if [ "$HAVE_GPU" -eq 1 ]; then
    step run "$g" --verify --warmup 5 --iters 20
  fi
done

# ResNet-50 (torchvision's, bf16 NHWC, batch norm folded) as a pipeline of 56
# stages on 27 distinct graphs (docs/models.md): generated, checked, and every
# stage built for the H200 deviceless where cuDNN can.
echo
echo "=================== ResNet-50 pipeline (fusebox_tools.models.make_resnet50_pipeline)"
if python3 -c 'import numpy' 2>/dev/null; then
  echo "\$ PYTHONPATH=python python3 -m fusebox_tools.models.make_resnet50_pipeline --out $RN50_DIR --batch 8"
  if PYTHONPATH=python python3 -m fusebox_tools.models.make_resnet50_pipeline --out "$RN50_DIR" --batch 8; then
    RN50="$RN50_DIR/resnet50.json"
    echo
    echo "\$ fusebox pipeline check $RN50   (first and last lines)"
    "$FB" pipeline check "$RN50" > "$TMP_ERR" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ]; then
      head -n 6 "$TMP_ERR"; echo "  ..."; grep -E "^  [0-9]+\. (avgpool|fc) " "$TMP_ERR"
      grep -E "^  (layer1\.2|layer4\.2|avgpool|logits) " "$TMP_ERR"; tail -n 1 "$TMP_ERR"
    else
      cat "$TMP_ERR"
      echo "demo: FAILED (exit $rc): fusebox pipeline check $RN50"
      FAILED+=("fusebox pipeline check (resnet50)")
    fi
    echo
    echo "\$ fusebox pipeline build $RN50 --device $DEVPROP --keep-going"
    "$FB" pipeline build "$RN50" --device "$DEVPROP" --keep-going > "$TMP_ERR" 2>&1
    rc=$?
    grep -E "^  [0-9]+\. |stages built" "$TMP_ERR"
    failed_other=$(grep -E "^  [0-9]+\. .*: failed after" "$TMP_ERR" | grep -vc "NotSupported")
    if [ "$rc" -eq 0 ]; then
      echo "demo: ResNet-50: every stage built deviceless"
    elif [ "$rc" -eq 1 ] && [ "$failed_other" -eq 0 ] && grep -q "stages built" "$TMP_ERR"; then
      echo "demo: ResNet-50: the stages above marked NotSupported need the GPU (cuDNN 9.19 compiles conv+bias+add+relu and pooling at run time): a known limitation, not a failure"
    else
      cat "$TMP_ERR"
      echo "demo: FAILED (exit $rc): fusebox pipeline build $RN50 --device $DEVPROP --keep-going"
      FAILED+=("fusebox pipeline build (resnet50) --device $DEVPROP --keep-going")
    fi
    if [ "$HAVE_GPU" -eq 1 ]; then
      step pipeline run "$RN50" --verify --warmup 5 --iters 20
    fi
  else
    echo "demo: FAILED: fusebox_tools.models.make_resnet50_pipeline"
    FAILED+=("fusebox_tools.models.make_resnet50_pipeline")
  fi
else
  echo "demo: numpy is missing (scripts/setup.sh installs it): the ResNet-50 pipeline is skipped"
fi

# all-MiniLM-L6-v2 (docs/models.md): the pipeline at the real architecture (6 layers, hidden 384,
# 12 heads, FFN 1536; batch 8, 128 tokens) with random weights, checked. No stage builds without a
# GPU (cuDNN 9.19 compiles matmul epilogues, norms and attention at run time), so the deviceless
# build is not attempted. On a GPU with the real weights converted (scripts/fetch_minilm.sh, then
# python3 -m fusebox_tools.models.minilm convert), a few sentences are embedded and compared.
echo
echo "=================== all-MiniLM-L6-v2 pipeline (python3 -m fusebox_tools.models.minilm)"
ML_DIR="$RN50_DIR/minilm"
if python3 -c 'import numpy' 2>/dev/null; then
  echo "\$ python3 -m fusebox_tools.models.minilm random --out $ML_DIR --batch 8 --seq 128 --layers 6 --hidden 384 --heads 12 --ffn 1536"
  if PYTHONPATH=python python3 -m fusebox_tools.models.minilm random --out "$ML_DIR" --batch 8 --seq 128 --layers 6 \
      --hidden 384 --heads 12 --ffn 1536 --vocab 1000 > /dev/null; then
    echo "\$ fusebox pipeline check $ML_DIR/minilm_b8_s128.json   (first stages and the total)"
    if "$FB" pipeline check "$ML_DIR/minilm_b8_s128.json" > "$TMP_ERR" 2>&1; then
      head -n 12 "$TMP_ERR"; echo "  ..."; tail -n 1 "$TMP_ERR"
    else
      cat "$TMP_ERR"
      echo "demo: FAILED: fusebox pipeline check (minilm)"
      FAILED+=("fusebox pipeline check (minilm)")
    fi
    # One symbolic pipeline for every batch and sequence length (B, S and N = B*S given per run).
    for shape in B=8,S=128,N=1024 B=3,S=48,N=144; do
      echo "\$ fusebox pipeline check $ML_DIR/minilm.json --shape $shape   (the total)"
      if "$FB" pipeline check "$ML_DIR/minilm.json" --shape "$shape" > "$TMP_ERR" 2>&1; then
        tail -n 1 "$TMP_ERR"
      else
        cat "$TMP_ERR"
        echo "demo: FAILED: fusebox pipeline check --shape $shape (minilm.json)"
        FAILED+=("fusebox pipeline check --shape $shape (minilm)")
      fi
    done
    # Text in, embeddings out, from the CLI: the numpy reference of this random model (no GPU; its
    # tokenizer spells words letter by letter), so the numbers mean nothing but the path is real.
    echo "\$ fusebox model embed --model $ML_DIR --no-fusebox --text \"fusebox fuses\" --text \"cudnn graphs\"   (random weights, CPU reference)"
    if "$FB" model embed --model "$ML_DIR" --no-fusebox --text "fusebox fuses" --text "cudnn graphs" > "$TMP_ERR" 2>&1; then
      tail -n 4 "$TMP_ERR"
    elif python3 -c 'import tokenizers' 2>/dev/null; then
      cat "$TMP_ERR"
      echo "demo: FAILED: fusebox model embed --no-fusebox"
      FAILED+=("fusebox model embed --no-fusebox (random MiniLM)")
    else
      echo "demo: the tokenizers package is missing (scripts/fetch_minilm.sh installs it): model embed skipped"
    fi
    echo "\$ fusebox pipeline check $ML_DIR/minilm.json --shape B=3,S=48,N=145   (N is not B*S: refused, exit 2)"
    if "$FB" pipeline check "$ML_DIR/minilm.json" --shape B=3,S=48,N=145 > "$TMP_ERR" 2>&1; then
      echo "demo: FAILED: a wrong N was accepted"
      FAILED+=("fusebox pipeline check: wrong N accepted (minilm)")
    else
      cut -c1-240 "$TMP_ERR" | head -n 2
    fi
  else
    echo "demo: FAILED: python3 -m fusebox_tools.models.minilm random"
    FAILED+=("fusebox_tools.models.minilm random")
  fi
  if [ "$HAVE_GPU" -eq 1 ] && [ -f models/minilm/fusebox/minilm_config.json ]; then
    echo "\$ fusebox model embed --model models/minilm/fusebox --reference"
    "$FB" model embed --model models/minilm/fusebox --reference || FAILED+=("fusebox model embed")
  elif [ "$HAVE_GPU" -eq 1 ]; then
    echo "demo: the real MiniLM weights are not converted here (scripts/fetch_minilm.sh; docs/models.md): no sentences embedded"
  fi
else
  echo "demo: numpy is missing (scripts/setup.sh installs it): the MiniLM pipeline is skipped"
fi

echo
echo "=================== examples/graphs/invalid_shapes.json (expected to be rejected)"
echo "\$ fusebox check examples/graphs/invalid_shapes.json"
"$FB" check examples/graphs/invalid_shapes.json
rc=$?
if [ "$rc" -eq 2 ]; then
  echo "demo: rejected as expected (exit 2)"
else
  echo "demo: FAILED: expected exit 2 for invalid_shapes.json, got $rc"
  FAILED+=("check examples/graphs/invalid_shapes.json (exit $rc, expected 2)")
fi

echo
if [ "${#FAILED[@]}" -eq 0 ]; then
  echo "demo: all steps ok"
  exit 0
fi
echo "demo: ${#FAILED[@]} step(s) failed:"
printf '  %s\n' "${FAILED[@]}"
exit 1
