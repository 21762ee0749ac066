#!/usr/bin/env bash
# Issue 33 on the H200, from the slim carry of scripts/gpu_train_bundle.sh (docs/gpu.md,
# docs/lm-torch.md). One part per device call (each under the 10-minute limit):
#   PART=1  the GPU step against the reference backend (tests/gpu/train_gpu_test.cpp), and the
#           tiny model 20 steps on both backends (compare-losses);
#   PART=2  the 125M model's first 30 steps on the GPU (plans built cold into the plan cache,
#           tokens/s, memory, CUDA graph) and its step-0 gradients against plain torch;
#   PART=3  the 500-step comparison (limits FB_TIMEOUT 360, TORCH_TIMEOUT 200): fusebox and torch (torch.compile default) from the same
#           init.safetensors, compare-losses over the last 100 steps, validation losses, the plot;
#   PART=4  the speed table for the 125M config: fusebox's steady tokens/s and torch bench (eager,
#           default, reduce-overhead, max-autotune-no-cudagraphs); PART=5 the same for 350M.
#   PART=6  where the 125M step's time goes: `train lm --profile 20` after 3 steps (profile.json).
#   PART=7  the FP8 casts fused into pointwise stages: `run --verify` of the fused-cast examples,
#           then the FP8 step's gtests (unfused and fused) and the pointwise kernel tests.
#   SWIGLU=split|fused (PARTs 2-6): the config's train.swiglu set to it (docs/lm.md; the 125M and 350M
#           configs say "split" since 2026-12-06: SWIGLU=fused measures the other). SHARE=1: with
#           train.share_buffers (the backward's intermediates in one arena; docs/lm.md). FP8=1: with
#           train.fp8 (the blocks' GEMMs in FP8, docs/training.md "FP8 training"); PART=4 with FP8=1
#           is the FP8 step's speed beside PART=4's bf16 one, PART=3 its 500 steps; FUSE=1 with it sets
#           train.fp8_fuse_casts (the casts in the pointwise stages before them; the default since
#           2026-12-07), FUSE=0 (or unset) turns it off. TORCH=0 (PARTs 4
#           and 5): fusebox alone, no torch bench (a cold FP8 start-up needs FB_TIMEOUT=330).
# The plan cache: a machine's first call builds every plan cold (about 150 s at 125M). Each call
# leaves its cache in $OUT/plans_<GPU>.sqlite.xz; kept here under .gpu-plans/ (git-ignored) and
# carried, it seeds the next machine of that GPU model (the cache's key holds the device and cuDNN;
# a plan of fusebox's kernels is checked again when the kernels changed since; docs/gpu.md).
# Logs and CSVs under $OUT (tar them: $OUT returns at most 8 files). Run from the repository root:
#   run(command="PART=1 bash scripts/gpu_train_lm.sh", carry=[".gpu-train"])
set -u
PART=${PART:-1}
OUT=${OUT:-/tmp/out}
W=${W:-/tmp/train_work}
mkdir -p "$OUT" "$W"
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib
export FUSEBOX_SOURCE_DIR=$PWD FUSEBOX_DEVPROP=$PWD/devices/h200-cudnn-9.27.devprop
export PYTHONPATH=$PWD/python FUSEBOX_PYTHONPATH=$PWD/python FUSEBOX_CACHE=$W/plans.sqlite
PY=/opt/torch/.venv/bin/python3
[ -x "$PY" ] || PY=python3
# The data unpacked once per machine (it stays while the machine is held); the binaries every call.
for f in fusebox fusebox_gpu_tests; do
  xz -dc ".gpu-train/$f.xz" > "$W/$f" && chmod +x "$W/$f"  # every call: $W may hold older ones
done
[ -d "$W/lm" ] || tar -C "$W" -xJf .gpu-train/lm.tar.xz
[ -d "$W/lm-ci" ] || tar -C "$W" -xJf .gpu-train/lm-ci.tar.xz
FB=$W/fusebox
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
GPU_TAG=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1 | tr -c 'A-Za-z0-9\n' '_' | tr -d '\n')
SEED=.gpu-plans/plans_$GPU_TAG.sqlite.xz
if [ ! -f "$W/plans.sqlite" ] && [ -f "$SEED" ]; then
  xz -dc "$SEED" > "$W/plans.sqlite" && echo "plan cache seeded from $SEED" | tee -a "$OUT/gpu.txt"
fi
$PY -c 'import torch; print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version())' | tee -a "$OUT/gpu.txt"
summary() { echo "== $*" | tee -a "$OUT/summary.txt"; }
# SWIGLU=split|fused and SHARE=1 (PARTs 2 to 6): the config with train.swiglu, and
# train.share_buffers true, written under $W; its path.
with_swiglu() {
  if [ -z "${SWIGLU:-}" ] && [ -z "${SHARE:-}" ] && [ -z "${FP8:-}" ]; then echo "$1"; return; fi
  local out="$W/$(basename "$1" .json)_swiglu_${SWIGLU:-asis}_share_${SHARE:-0}_fp8_${FP8:-0}_fuse_${FUSE:-0}.json"
  $PY -c 'import json, sys
c = json.load(open(sys.argv[1]))
if sys.argv[2]: c["train"]["swiglu"] = sys.argv[2]
if sys.argv[3] == "1": c["train"]["share_buffers"] = True
if sys.argv[4] == "1": c["train"]["fp8"] = True
c["train"]["fp8_fuse_casts"] = sys.argv[5] == "1"
json.dump(c, open(sys.argv[6], "w"))' "$1" "${SWIGLU:-}" "${SHARE:-}" "${FP8:-}" "${FUSE:-}" "$out" && echo "$out"
}

case "$PART" in
1)
  summary "GPU step vs reference backend (gtest)"
  timeout 200 "$W/fusebox_gpu_tests" --gtest_filter='TrainGpu*' > "$OUT/train_gpu_test.txt" 2>&1
  echo "exit $?: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/train_gpu_test.txt" | tr '\n' ' ')" | tee -a "$OUT/summary.txt"
  summary "tiny model, 20 steps: reference vs gpu"
  rm -rf "$W/tiny_ref" "$W/tiny_gpu"
  timeout 60 "$FB" train lm --config examples/train/lm_tiny.json --data "$W/lm-ci" --steps 20 --out "$W/tiny_ref" \
    --no-plot > "$OUT/tiny_ref.txt" 2>&1
  timeout 180 "$FB" train lm --config examples/train/lm_tiny.json --data "$W/lm-ci" --steps 20 --out "$W/tiny_gpu" \
    --backend gpu --no-plot > "$OUT/tiny_gpu.txt" 2>&1
  echo "gpu exit $?" | tee -a "$OUT/summary.txt"
  $PY -m fusebox_tools.models.lm_torch compare-losses "$W/tiny_gpu/losses.csv" "$W/tiny_ref/losses.csv" --last 20 \
    --limit 0.05 2>&1 | tail -8 | tee -a "$OUT/summary.txt"
  cp "$W/tiny_ref/losses.csv" "$OUT/tiny_ref_losses.csv" 2>/dev/null
  cp "$W/tiny_gpu/losses.csv" "$OUT/tiny_gpu_losses.csv" 2>/dev/null
  ;;
2)
  summary "125M: 30 steps on the GPU, step-0 gradients vs torch"
  rm -rf "$W/m125"
  timeout 330 "$FB" train lm --config "$(with_swiglu examples/train/lm_125m.json)" --data "$W/lm" --steps 30 --out "$W/m125" \
    --backend gpu --dump-grads "$W/m125/fusebox_grads.safetensors" --generate 0 > "$OUT/m125.txt" 2>&1
  echo "exit $?" | tee -a "$OUT/summary.txt"
  grep -E "^model|^GPU|^saved|^validation" "$OUT/m125.txt" | tee -a "$OUT/summary.txt"
  tail -3 "$OUT/m125.txt" | tee -a "$OUT/summary.txt"
  [ -f "$W/m125/losses.csv" ] && tail -5 "$W/m125/losses.csv" | tee -a "$OUT/summary.txt"
  if [ -f "$W/m125/fusebox_grads.safetensors" ]; then
    timeout 180 $PY -m fusebox_tools.models.lm_torch grads --checkpoint "$W/m125/init.safetensors" --data "$W/lm" \
      --out "$W/m125/torch_grads.safetensors" > "$OUT/torch_grads.txt" 2>&1
    $PY -m fusebox_tools.models.lm_torch compare-grads "$W/m125/fusebox_grads.safetensors" \
      "$W/m125/torch_grads.safetensors" > "$OUT/compare_grads.txt" 2>&1
    echo "compare-grads exit $?: $(tail -1 "$OUT/compare_grads.txt")" | tee -a "$OUT/summary.txt"
  fi
  ;;
3)
  summary "125M: 500 steps, fusebox gpu vs torch.compile default, same init and batches"
  rm -rf "$W/m500"
  timeout "${FB_TIMEOUT:-360}" "$FB" train lm --config "$(with_swiglu examples/train/lm_125m.json)" --data "$W/lm" --steps 500 --out "$W/m500" \
    --backend gpu --save-every 100 > "$OUT/m500.txt" 2>&1
  echo "fusebox exit $?: $(grep -E '^validation' "$OUT/m500.txt")" | tee -a "$OUT/summary.txt"
  cp "$W/m500/losses.csv" "$OUT/fusebox_losses.csv" 2>/dev/null
  if [ -f "$W/m500/init.safetensors" ]; then
    timeout "${TORCH_TIMEOUT:-200}" $PY -m fusebox_tools.models.lm_torch train --checkpoint "$W/m500/init.safetensors" --data "$W/lm" \
      --steps 500 --csv "$OUT/torch_losses.csv" --summary "$OUT/torch_train.json" --compile default \
      > "$OUT/torch_train.txt" 2>&1
    echo "torch exit $?: $(cat "$OUT/torch_train.json" 2>/dev/null)" | tee -a "$OUT/summary.txt"
    $PY -m fusebox_tools.models.lm_torch compare-losses "$OUT/fusebox_losses.csv" "$OUT/torch_losses.csv" --last 100 \
      2>&1 | tail -12 | tee -a "$OUT/summary.txt"
    $PY -m fusebox_tools.models.lm_plot --out "$OUT/loss_500.png" --labels fusebox,torch \
      --title "125M, 500 steps, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1)" "$OUT/fusebox_losses.csv" "$OUT/torch_losses.csv" >> "$OUT/summary.txt" 2>&1
  fi
  ;;
4 | 5)
  cfg=examples/train/lm_125m.json
  [ "$PART" = 5 ] && cfg=examples/train/lm_350m.json
  cfg=$(with_swiglu "$cfg")
  summary "speed: $cfg"
  rm -rf "$W/speed"
  timeout "${FB_TIMEOUT:-240}" "$FB" train lm --config "$cfg" --data "$W/lm" --steps 40 --out "$W/speed" --backend gpu \
    --generate 0 --no-plot > "$OUT/speed_fusebox.txt" 2>&1
  echo "fusebox exit $?; steady tokens/s (median of steps 10-39):" | tee -a "$OUT/summary.txt"
  [ -f "$W/speed/losses.csv" ] && $PY - "$W/speed/losses.csv" <<'PYEOF' | tee -a "$OUT/summary.txt"
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print(statistics.median(float(r["tokens_per_s"]) for r in rows[10:]))
PYEOF
  grep -E "^GPU" "$OUT/speed_fusebox.txt" | tee -a "$OUT/summary.txt"
  if [ "${TORCH:-1}" = 0 ]; then  # fusebox alone (FP8=1 beside bf16 in calls of their own)
    echo "torch bench skipped (TORCH=0)" | tee -a "$OUT/summary.txt"
  else
    timeout "${TORCH_TIMEOUT:-330}" $PY -m fusebox_tools.models.lm_torch bench --config "$cfg" --data "$W/lm" \
      --modes "${TORCH_MODES:-eager,default,reduce-overhead,max-autotune-no-cudagraphs}" --json "$OUT/torch_bench.json" \
      > "$OUT/torch_bench.txt" 2>&1
    echo "torch bench exit $?" | tee -a "$OUT/summary.txt"
    tail -12 "$OUT/torch_bench.txt" | tee -a "$OUT/summary.txt"
  fi
  ;;
6)
  summary "profile: examples/train/lm_125m.json, 3 steps, then each stage alone (train lm --profile)"
  rm -rf "$W/profile"
  timeout "${FB_TIMEOUT:-300}" "$FB" train lm --config "$(with_swiglu examples/train/lm_125m.json)" --data "$W/lm" --steps 3 \
    --out "$W/profile" --backend gpu --generate 0 --no-plot --profile 20 > "$OUT/profile.txt" 2>&1
  echo "exit $?" | tee -a "$OUT/summary.txt"
  sed -n '/^profile (/,$p' "$OUT/profile.txt" | head -40 | tee -a "$OUT/summary.txt"
  cp "$W/profile/profile.json" "$OUT/profile.json" 2>/dev/null
  ;;
7)
  summary "the FP8 casts fused into pointwise stages (fusebox_pointwise_quantize): examples, then the FP8 step gtests"
  for g in small/swiglu_bwd_fp8_cast_small small/add_fp8_cast_small swiglu_fp8_cast swiglu_bwd_fp8_cast; do
    timeout 60 "$FB" run "examples/graphs/$g.json" --verify --iters 20 > "$OUT/verify_$(basename "$g").txt" 2>&1
    echo "$g: exit $? $(grep -E 'engine:|latency' "$OUT/verify_$(basename "$g").txt" | tr -s ' ' | tr '\n' ' ' | cut -c1-220)" \
      | tee -a "$OUT/summary.txt"
    grep -E 'verify .*(FAIL|PASS)' "$OUT/verify_$(basename "$g").txt" | cut -c1-150 | tee -a "$OUT/summary.txt"
  done
  timeout 200 "$W/fusebox_gpu_tests" --gtest_filter='TrainGpu.Fp8*:NativeKernelsGpu.Pointwise*' > "$OUT/fp8_gtest.txt" 2>&1
  echo "gtest exit $?: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/fp8_gtest.txt" | tr '\n' ' ')" | tee -a "$OUT/summary.txt"
  ;;
*) echo "PART must be 1 to 7" >&2; exit 2 ;;
esac
[ -f "$W/plans.sqlite" ] && xz -T4 -c "$W/plans.sqlite" > "$W/plans_$GPU_TAG.sqlite.xz" && mv "$W/plans_$GPU_TAG.sqlite.xz" "$OUT/"
# Written beside $OUT, then moved in: tar of a folder it writes into exits 1 ("file changed as we
# read it"), which made every part look failed in gpu_next.sh's summary (session 33).
tar czf "$W/logs.tgz" -C "$OUT" --exclude logs.tgz --exclude 'plans_*.sqlite.xz' . 2>/dev/null && mv "$W/logs.tgz" "$OUT/logs.tgz"
