#!/usr/bin/env bash
# The GPU evidence the open issues still need, in one device call per STEP, each cut to a deadline
# so that its output comes back (docs/gpu.md "One carry for everything"). Build here first:
#   make build && bash scripts/gpu_train_bundle.sh && PACK=1 bash scripts/gpu_bundle.sh build
#   run(command="STEP=checks bash scripts/gpu_next.sh", carry=[".gpu", ".gpu-train", ".gpu-plans"])
# STEP:
#   checks  issue 30's done-when: gpu_check.sh PART=8 (info, C API, the three GPU test shards) and
#           PART=3 (every example, run --verify) side by side (about 7-9 minutes on an H100)
#   fp8     issue 33's FP8 step: gpu_train_lm.sh PART=7 (the fused-cast examples and the FP8
#           gtests), then the 125M step's speed with train.fp8 and its casts fused, in bf16, and
#           with train.fp8 unfused (fusebox alone, TORCH=0), as far as the deadline allows
#   train   issue 33's tables: PART=3 (500 steps against torch.compile) and PART=4 (speed against
#           every torch mode) for the 125M model, as far as the deadline allows
#   sweep   never a wrong answer: scripts/gpu_never_wrong.sh (the case graphs cold and warm, the
#           open cases, COUNT (320) random valid graphs from SEED (random; the summary says which)),
#           the sweep cut to the deadline (about 2.5 minutes on an H100 for 320)
# DEADLINE (seconds, default 560): when the last step must end; each step's limits are cut to what
# is left, and a step with under a minute left is skipped (and says so).
# $OUT gets at most three files: all.tgz (every log), the plan cache plans_<GPU>.sqlite.xz (keep it
# under .gpu-plans/ here: it seeds the next machine of that GPU, scripts/gpu_train_lm.sh) and
# summary.txt.
set -u
cd "$(dirname "$0")/.." || exit 2
O=${OUT:-/tmp/out}
mkdir -p "$O"
STEP=${STEP:-fp8}
DEADLINE=${DEADLINE:-560}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1)
echo "GPU: $GPU; step $STEP; deadline ${DEADLINE}s" | tee "$O/summary.txt"
[ -d .gpu ] && { bash scripts/gpu_unpack.sh .gpu || exit 1; }
left() { echo $((DEADLINE - SECONDS)); }
# train NAME FB_LIMIT TORCH_LIMIT VAR=VALUE...: one gpu_train_lm.sh part; fusebox's limit, then
# torch's (PARTs 3-5; 0 where the part runs no torch), cut to what is left.
train() {
  local name=$1 t=$2 tt=$3 l
  l=$(left)
  [ "$l" -lt $((t + tt)) ] && t=$((l * t / (t + tt))) && tt=$((l - t - 10))
  if [ "$t" -lt 60 ]; then echo "$name: skipped, ${l}s left" | tee -a "$O/summary.txt"; return; fi
  env "${@:4}" FB_TIMEOUT="$t" TORCH_TIMEOUT="$tt" OUT="$O/$name" bash scripts/gpu_train_lm.sh > "$O/$name.log" 2>&1
  echo "== $name (exit $?, ${SECONDS}s in)" >> "$O/summary.txt"
  cat "$O/$name/summary.txt" >> "$O/summary.txt" 2>/dev/null
  grep -hE 'start-up|casts fused' "$O/$name"/speed_fusebox.txt "$O/$name"/m500.txt 2>/dev/null | cut -c1-700 >> "$O/summary.txt"
}
case "$STEP" in
checks)
  t=$(($(left) - 10))
  (OUT=$O/part3 PART=3 timeout "$t" bash scripts/gpu_check.sh .gpu > "$O/part3.log" 2>&1; echo "PART=3 exit $?" > "$O/part3.rc") &
  OUT=$O/part8 PART=8 timeout "$t" bash scripts/gpu_check.sh .gpu > "$O/part8.log" 2>&1
  echo "PART=8 exit $?" >> "$O/summary.txt"
  wait
  cat "$O/part3.rc" >> "$O/summary.txt"
  tail -15 "$O/part8.log" >> "$O/summary.txt"
  tail -8 "$O/part3.log" >> "$O/summary.txt"
  ;;
fp8)
  train part7 200 0 PART=7
  train fp8_fused 230 0 FP8=1 FUSE=1 PART=4 TORCH=0
  train bf16 170 0 PART=4 TORCH=0
  train fp8 150 0 FP8=1 PART=4 TORCH=0
  ;;
train)
  train part3 200 200 PART=3
  train part4 150 330 PART=4
  ;;
sweep)
  # Never a wrong answer: scripts/gpu_never_wrong.sh (every tests/cases graph cold and warm, the
  # open cases, then COUNT random valid graphs from SEED with --verify), cut to the deadline.
  seed=${SEED:-$((RANDOM % 9000 + 1000))}
  echo "sweep: $((${COUNT:-320})) graphs from seed $seed" >> "$O/summary.txt"
  OUT=$O/never_wrong DEADLINE_S=$(($(left) - 150)) timeout $(($(left) - 10)) \
    bash scripts/gpu_never_wrong.sh "${COUNT:-320}" "$seed" > "$O/never_wrong.log" 2>&1
  echo "gpu_never_wrong exit $?" >> "$O/summary.txt"
  grep -vE '^\[ (cold|warm) ' "$O/never_wrong/summary.txt" | grep -vE '^(PASSREF|UNVERIF) ' >> "$O/summary.txt"
  ;;
*) echo "gpu_next: STEP must be checks, fp8, train or sweep" >&2; exit 2 ;;
esac
# Back: the newest plan cache, the summary, every log in one archive.
plans=$(find "$O" -name 'plans_*.sqlite.xz' -printf '%T@ %p\n' 2>/dev/null | sort -n | tail -n1 | cut -d' ' -f2-)
[ -n "$plans" ] && mv "$plans" /tmp/ && plans=/tmp/$(basename "$plans")
find "$O" -name 'plans_*.sqlite.xz' -delete
tar czf /tmp/gpu_next_all.tgz -C "$O" --exclude summary.txt . 2>/dev/null
find "$O" -mindepth 1 ! -name summary.txt -exec rm -rf {} + 2>/dev/null
mv /tmp/gpu_next_all.tgz "$O/all.tgz"
[ -n "$plans" ] && mv "$plans" "$O/"
cat "$O/summary.txt"
