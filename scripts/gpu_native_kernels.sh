#!/usr/bin/env bash
# fusebox's own kernels (src/kernels: norm, pool, reduction, embedding and its backward, rope, cross_entropy; docs/architecture.md "Native ops") on the H200:
# their GPU tests, then each benchmark graph run verified eager and as a CUDA graph, timed
# against cuDNN's first supported engine pinned (fusebox engines --cudnn). Run from the bundle:
#   run(command="bash scripts/gpu_native_kernels.sh", carry=[".gpu"])  (docs/gpu.md)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
# FUSEBOX_GPU_CUDNN=pinned: the pinned cuDNN that scripts/gpu_cudnn.sh received; default torch's 9.19.
if [ "${FUSEBOX_GPU_CUDNN:-torch}" = pinned ]; then
  source scripts/gpu_cudnn.sh env || exit 1
else
  export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib
fi
export FUSEBOX_SOURCE_DIR=$PWD FUSEBOX_DEVPROP=$PWD/devices/h200-cudnn-9.27.devprop
[ -d .gpu ] && { bash scripts/gpu_unpack.sh .gpu || exit 1; }  # a PACK=1 bundle (scripts/gpu_bundle.sh)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
timeout 240 .gpu/fusebox_gpu_tests --gtest_filter='NativeKernelsGpu*:EmbeddingGpu*' --gtest_color=no > $OUT/native_tests.log 2>&1
echo "tests rc=$?"; grep -E "^\[  (FAILED|PASSED|  OK) |Failure|Expected|Which is|actual|rel_l2" $OUT/native_tests.log | head -40
for g in examples/graphs/layernorm_train.json examples/graphs/rmsnorm_train.json examples/graphs/global_avg_pool.json \
         bench/graphs/layernorm_infer_8192x4096.json bench/graphs/rmsnorm_infer_8192x4096.json \
         examples/graphs/small/global_avg_pool_small.json examples/graphs/small/layernorm_bsh_small.json \
         examples/graphs/max_pool_resnet_stem.json examples/graphs/reduce_sum_bias_grad.json \
         examples/graphs/rope.json examples/graphs/small/rope_decode_small.json examples/graphs/small/rope_bwd_small.json \
         examples/graphs/cross_entropy.json examples/graphs/small/cross_entropy_bwd_small.json \
         examples/graphs/small/embedding_bwd_small.json; do
  echo "== $g"
  timeout 60 .gpu/fusebox run $g --verify --iters 200 --cuda-graph --no-cache > $OUT/run_$(basename $g .json).txt 2>&1
  echo "rc=$?"; grep -iE "engine|median|verif|mismatch|error|rel_l2|time" $OUT/run_$(basename $g .json).txt | head -8
  eng=$(timeout 120 .gpu/fusebox engines $g --cudnn --json 2>/dev/null | "${PY:-python3}" -c 'import json,sys; d=json.load(sys.stdin); print(next((e["name"] for e in d["engines"] if e["supported"]), ""))' 2>/dev/null)
  [ -n "$eng" ] && { echo "-- cuDNN pinned: $eng"; timeout 60 .gpu/fusebox run $g --verify --iters 200 --cuda-graph --no-cache --engine "$eng" 2>&1 | grep -iE "median|verif|mismatch|error|time" | head -5; }
done
