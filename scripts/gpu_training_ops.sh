#!/usr/bin/env bash
# What session 16 (2026-12-05) built for training but could not run on a GPU, in one
# device call (docs/training.md, issue 33; issue 29 for the matmul fold):
#   1. the backward pointwise modes (gelu_tanh_bwd, gelu_erf_bwd, silu_bwd, sigmoid_bwd,
#      tanh_bwd, and relu_bwd beside them), each after a matmul (an epilogue) and alone,
#      bf16 and fp32, `fusebox run --verify`;
#   2. embedding_bwd, fusebox's kernel: atomic and deterministic, bit-identical runs in
#      deterministic mode;
#   3. the derived backward graph of small examples (`fusebox backward`, then `run --verify`
#      of the result: it may be refused with a reason, never wrong);
#   4. the rank-4 matmul case lowered with its batch dims folded
#      (tests/cases/no-engine/matmul_two_batch_dims_col_major.json).
# Logs under $OUT; a summary line per step. Run from the repository root with the bundle:
#   run(command="bash scripts/gpu_training_ops.sh", carry=[".gpu"])
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
[ -d .gpu ] && { bash scripts/gpu_unpack.sh .gpu || exit 1; }  # a PACK=1 bundle (scripts/gpu_bundle.sh)
FB=${FB:-.gpu/fusebox}
if [ "${FUSEBOX_GPU_CUDNN:-torch}" = pinned ]; then
  source scripts/gpu_cudnn.sh env || exit 1
else
  export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib
fi
export FUSEBOX_SOURCE_DIR=$PWD FUSEBOX_DEVPROP=$PWD/devices/h200-cudnn-9.27.devprop
TMP=$(mktemp -d)
pass=0 fail=0 refused=0
# verdict NAME LOG RC: PASS (verified), REFUSED (NotSupported before anything ran), FAIL (anything else).
verdict() {
  if [ "$3" -eq 0 ]; then pass=$((pass + 1)); echo "PASS     $1"
  elif [ "$3" -eq 1 ] && grep -q "NotSupported" "$2" && ! grep -q "VerificationFailed" "$2"; then
    refused=$((refused + 1)); echo "REFUSED  $1: $(grep -m1 NotSupported "$2" | cut -c1-200)"
  else fail=$((fail + 1)); echo "FAIL     $1 (exit $3): $(grep -m1 -iE "error|mismatch|FAIL" "$2" | cut -c1-200)"
  fi
}
run_verify() {  # NAME GRAPH [extra run args]
  local name=$1 g=$2
  shift 2
  timeout 120 "$FB" run "$g" --verify --iters 20 --no-cache "$@" > "$OUT/$name.txt" 2>&1
  verdict "$name" "$OUT/$name.txt" $?
}

echo "== 1. backward pointwise modes"
for dt in bf16 fp32; do
  for mode in relu_bwd gelu_tanh_bwd gelu_erf_bwd silu_bwd sigmoid_bwd tanh_bwd; do
    cat > "$TMP/${mode}_${dt}_alone.json" <<EOF
{"name": "${mode}_${dt}_alone", "io_dtype": "$dt", "tensors": [
  {"name": "dy", "dims": [4, 256, 512]}, {"name": "x", "dims": [4, 256, 512]}, {"name": "dx", "dims": [4, 256, 512]}],
 "ops": [{"op": "$mode", "name": "f", "inputs": {"dy": "dy", "x": "x"}, "outputs": {"y": "dx"}}]}
EOF
    run_verify "${mode}_${dt}_alone" "$TMP/${mode}_${dt}_alone.json"
    cat > "$TMP/${mode}_${dt}_after_matmul.json" <<EOF
{"name": "${mode}_${dt}_after_matmul", "io_dtype": "$dt", "tensors": [
  {"name": "a", "dims": [1, 512, 256]}, {"name": "b", "dims": [1, 256, 512]}, {"name": "x", "dims": [1, 512, 512]},
  {"name": "dx", "dims": [1, 512, 512]}],
 "ops": [{"op": "matmul", "name": "mm", "inputs": {"a": "a", "b": "b"}, "outputs": {"y": "dy"}},
         {"op": "$mode", "name": "f", "inputs": {"dy": "dy", "x": "x"}, "outputs": {"y": "dx"}}]}
EOF
    run_verify "${mode}_${dt}_after_matmul" "$TMP/${mode}_${dt}_after_matmul.json"
  done
done

echo "== 2. embedding_bwd"
run_verify embedding_bwd_small examples/graphs/small/embedding_bwd_small.json
for det in false true; do
  cat > "$TMP/embedding_bwd_large_$det.json" <<EOF
{"name": "embedding_bwd_large_$det", "io_dtype": "bf16", "tensors": [
  {"name": "ids", "dims": [32768, 1, 1, 1], "dtype": "int32"}, {"name": "dy", "dims": [32768, 768, 1, 1], "layout": "nhwc"},
  {"name": "dtable", "dims": [16384, 768, 1, 1], "layout": "nhwc", "dtype": "fp32"}],
 "ops": [{"op": "embedding_bwd", "name": "d", "inputs": {"ids": "ids", "dy": "dy"}, "outputs": {"dtable": "dtable"},
          "rows": 16384, "deterministic": $det}]}
EOF
  run_verify "embedding_bwd_large_deterministic_$det" "$TMP/embedding_bwd_large_$det.json" --cuda-graph
done

echo "== 3. derived backward graphs"
for g in examples/graphs/small/matmul_bias_gelu_small.json examples/graphs/small/conv_bias_relu_small.json \
         examples/graphs/small/swiglu_gate_small.json examples/graphs/small/rope_small.json \
         examples/graphs/small/embedding_small.json examples/graphs/small/cross_entropy_small.json; do
  name=bwd_$(basename "$g" .json)
  if timeout 60 "$FB" backward "$g" --out "$TMP/$name.json" > "$OUT/$name.derive.txt" 2>&1; then
    run_verify "$name" "$TMP/$name.json"
  else
    refused=$((refused + 1)); echo "REFUSED  $name (derive): $(head -1 "$OUT/$name.derive.txt" | cut -c1-200)"
  fi
done

echo "== 4. rank-4 matmul, batch dims folded"
run_verify matmul_two_batch_dims_col_major tests/cases/no-engine/matmul_two_batch_dims_col_major.json

echo "gpu_training_ops: $pass passed, $refused refused (with a reason), $fail failed"
rm -rf "$TMP"
[ "$fail" -eq 0 ]
