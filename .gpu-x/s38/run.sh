#!/usr/bin/env bash
# Session 38's last call: the engine's attention shapes standalone; the GPU tests the session's
# changes touch.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib
bash scripts/gpu_unpack.sh .gpu || exit 1
FB=$PWD/.gpu/fusebox
S=$OUT/summary.txt
for g in engine_fp8 engine_fp8_b1 engine_bf16; do
  timeout 25 "$FB" run .gpu-x/s38/$g.json --verify --cuda-graph --iters 50 --engine fusebox_sdpa_decode > "$OUT/$g.txt" 2>&1
  echo "$g exit $?: $(grep -E 'verify|latency' "$OUT/$g.txt" | cut -c1-220 | tr '\n' ' ')" | tee -a "$S"
done
timeout 25 "$FB" run examples/graphs/sdpa_paged_decode.json --verify --cuda-graph --iters 50 --engine fusebox_sdpa_decode > "$OUT/d128.txt" 2>&1
echo "sdpa_paged_decode (D 128, CUDA cores) exit $?: $(grep -E "verify|latency" "$OUT/d128.txt" | cut -c1-220 | tr "\n" " ")" | tee -a "$S"
timeout 110 .gpu/fusebox_gpu_tests --gtest_filter='NativeKernelsGpu.PagedDecode*:GpuTune.*' > "$OUT/gtest.txt" 2>&1
echo "gtests exit $?: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/gtest.txt" | tr '\n' ' ')" | tee -a "$S"
grep -E '^\[  FAILED  \]|Failure' "$OUT/gtest.txt" | head -10 | tee -a "$S"
