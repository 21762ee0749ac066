#!/usr/bin/env bash
# Issue 35 part 3 on the GPU machine, from the slim carry of scripts/gpu_train_bundle.sh
# (.gpu-train): execute-time shape override against the kernel cache and cold builds, on torch's
# cuDNN 9.19 (no override shapes: the kernel cache serves) and, where scripts/gpu_cudnn.sh has
# received the pinned 9.27 JIT set into /tmp/fusebox-cudnn, on that one too. Per cuDNN version:
# the GPU tests of dynamic and override shapes, and `fusebox shapes` of the three symbolic
# examples (32 new shapes each: override / kernel cache, then cold), as JSON.
#   run(command="bash scripts/gpu_cudnn.sh receive .gpu-cudnn/jit.tar.xz", carry=[".gpu-cudnn/jit.tar.xz", ".gpu-cudnn/MANIFEST"])
#   run(command="bash scripts/gpu_override_shapes.sh", carry=[".gpu-train"])
# Results under $OUT: summary.txt, gtests_<ver>.txt, shapes_<ver>_<graph>.json/.txt.
set -u
OUT=${OUT:-/tmp/out}
W=${W:-/tmp/train_work}
VERSIONS=${VERSIONS:-"9.19 9.27"}
GRAPHS=${GRAPHS:-"matmul_bias_gelu_dyn conv_bias_relu_dyn sdpa_fwd_dyn"}
mkdir -p "$OUT" "$W"
export FUSEBOX_SOURCE_DIR=$PWD
for f in fusebox fusebox_gpu_tests; do
  [ -x "$W/$f" ] || { xz -dc ".gpu-train/$f.xz" > "$W/$f" && chmod +x "$W/$f"; }
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/summary.txt"
sweep_of() {
  case "$1" in
    matmul_bias_gelu_dyn) echo "--shapes B=2 --shapes M=64..1986:62" ;;  # 32 values of M
    conv_bias_relu_dyn) echo "--shapes N=1..32" ;;
    sdpa_fwd_dyn) echo "--shapes B=1 --shapes S=32..497:15" ;;          # 32 values of S
  esac
}
for ver in $VERSIONS; do
  if [ "$ver" = 9.19 ]; then
    export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib
  else
    # shellcheck disable=SC1091
    source scripts/gpu_cudnn.sh env > /dev/null || { echo "== $ver: not received (skipped)" | tee -a "$OUT/summary.txt"; continue; }
  fi
  echo "== cuDNN $ver: $("$W/fusebox" info 2>&1 | grep -E '^cuDNN  ' | head -1)" | tee -a "$OUT/summary.txt"
  timeout "${GTEST_S:-150}" "$W/fusebox_gpu_tests" --gtest_filter='*OverrideShapeGpu*:*DynamicShapeGpu*' \
    > "$OUT/gtests_$ver.txt" 2>&1
  echo "gtests exit $?: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/gtests_$ver.txt" | tr '\n' ' ')" | tee -a "$OUT/summary.txt"
  grep -E '^\[ note \]|^\[  FAILED  \]|Failure' "$OUT/gtests_$ver.txt" | cut -c1-400 >> "$OUT/summary.txt"
  for g in $GRAPHS; do
    # shellcheck disable=SC2046
    timeout "${SWEEP_S:-100}" "$W/fusebox" shapes "examples/graphs/$g.json" $(sweep_of "$g") \
      > "$OUT/shapes_${ver}_$g.txt" 2> "$OUT/shapes_${ver}_$g.err"
    echo "-- shapes $g on $ver: exit $?" | tee -a "$OUT/summary.txt"
    grep -E "total:|refused|not used|warm-up|failed" "$OUT/shapes_${ver}_$g.txt" | cut -c1-400 >> "$OUT/summary.txt"
    head -8 "$OUT/shapes_${ver}_$g.txt" >> "$OUT/summary.txt"
  done
done
# Written beside $OUT and moved in: tar into the folder it reads exits 1 ("file changed").
tar czf "$OUT.logs.tgz" -C "$OUT" --exclude=logs.tgz --exclude=summary.txt . && mv "$OUT.logs.tgz" "$OUT/logs.tgz"
