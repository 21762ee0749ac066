#!/usr/bin/env bash
# Issue 34 on the GPU machine: the serving engine's GPU backend against the reference backend and
# the PyTorch baseline (python3 -m fusebox_tools.models.lm_torch serve-bench), from the .gpu bundle
# (scripts/gpu_bundle.sh; fusebox_deviceless_tests may be left out):
#   run(command="PART=1 bash scripts/gpu_serve.sh", carry=[".gpu"])  # tests; tiny model: CLI, trace vs torch
#   run(command="PART=2 bash scripts/gpu_serve.sh", carry=[".gpu"])  # 125M config, random weights: trace vs
#                                                                      # torch; teacher-forced logits vs torch
#   run(command="PART=3 bash scripts/gpu_serve.sh", carry=[".gpu"])  # Llama-3.2-1B shapes: the decode step's
#                                                                      # profile (bf16, FP8), a trace at batch 1
#   PART=4: the Llama-3.2-1B shapes at batch 64 against torch; PART=5: their teacher-forced logits up to 4096;
#   PART=6: the 125M decode profile cold and warm on one plan cache
#   PART=8: the FP8 KV cache: its GPU tests, the 1B decode profile with an FP8 and a bf16 cache
#   PART=9: fusebox_sdpa_decode's tensor-core form: its tests, graphs against cuDNN, both 1B profiles
#   PART=10: the FP8 cache's attention at the engine's shapes standalone, and its profile unchecked
#   PART=7: fusebox's decode kernels (paged attention, few-row matmul): their GPU tests, each example
#           against cuDNN's first supported engine (run --cuda-graph), the 1B bf16 decode profile
#   FB_REPORT=PATH: bench() takes fusebox's report from PATH (an earlier call's, carried in .gpu)
#   instead of serving the trace again, so a call can spend its time on the torch side;
#   MODES="eager compile" (the default): the torch modes bench() runs.
#   The plan cache: .gpu/plans.sqlite (an earlier call's $OUT/plans.sqlite, carried back) seeds
#   $W/plans.sqlite on a fresh machine, so the engine's warm-up reads plans instead of building and
#   checking them; every call leaves the cache in $OUT/plans.sqlite.
# Results under $OUT: summary.txt (the lines to read), serve.tgz (the reports (*.json), their plots
# and every run's output), plans.sqlite.
# Random weights come from `lm_torch init` (docs/lm.md's init), prompts from random token ids:
# timing and agreement only, no text.
set -u
OUT=${OUT:-/tmp/out}
W=${W:-/tmp/serve_work}
mkdir -p "$OUT" "$W"
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib
export FUSEBOX_SOURCE_DIR=$PWD PYTHONPATH=$PWD/python FUSEBOX_CACHE=$W/plans.sqlite
PY=/opt/torch/.venv/bin/python3
[ -x "$PY" ] || PY=python3
bash scripts/gpu_unpack.sh .gpu || exit 1  # a PACK=1 bundle (scripts/gpu_bundle.sh)
FB=$PWD/.gpu/fusebox
S="$OUT/summary.txt"
[ -f .gpu/plans.sqlite ] && [ ! -f "$W/plans.sqlite" ] && cp .gpu/plans.sqlite "$W/plans.sqlite"
# Every run's files go to $D and leave as one archive (the device tool returns 8 files at most: a
# ninth, summary.txt among them, was left out on 2026-12-06).
D="$OUT/serve"
mkdir -p "$D"
trap 'cp "$W/plans.sqlite" "$OUT/plans.sqlite" 2>/dev/null; tar czf "$OUT/serve.tgz" -C "$OUT" serve && rm -rf "$D"' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  "$FB" info 2>&1 | grep -iE "cudnn|gpu" | head -4
  $PY -c 'import torch; print("torch", torch.__version__)'; } | tee -a "$S"

# summary TITLE FILE: the file's last lines under a title.
summary() { { echo "== $1"; tail -n "${3:-6}" "$2" | cut -c1-400; } | tee -a "$S"; }
# tokens FILE VOCAB: 200k random ids (the traces' prompt source).
tokens() { $PY -c 'import numpy as np, sys; np.save(sys.argv[1], np.random.default_rng(0).integers(0, int(sys.argv[2]), 200000).astype(np.int32))' "$1" "$2"; }
# init CONFIG CK: random weights as a checkpoint (once per machine).
init() { [ -f "$2" ] || timeout 300 $PY -m fusebox_tools.models.lm_torch init --config "$1" --out "$2" --seed 1 > "$2.log" 2>&1 || { cat "$2.log"; return 1; }; }
# compare NAME A B: the greedy tokens of two reports, request by request; each difference judged
# by the torch model in bf16 (bench's $ck and $trace): allowed only after a near-tie (issue 34).
compare() {
  timeout 300 $PY -m fusebox_tools.models.lm_torch compare-serve "$2" "$3" --checkpoint "$ck" --trace "$trace" \
    --device cuda > "$D/compare_$1.txt" 2>&1
  summary "tokens: $1" "$D/compare_$1.txt" 4
}
# bench NAME CK TRACE MAX_BATCH [fusebox args...]: fusebox's GPU engine, then torch eager and compiled,
# on one trace; their tokens compared with fusebox's.
bench() {
  local name=$1 ck=$2 trace=$3 mb=$4
  shift 4
  if [ -n "${FB_REPORT:-}" ]; then
    cp "$FB_REPORT" "$D/${name}_fusebox.json"
    echo "== $name: fusebox's report from $FB_REPORT (an earlier call's)" | tee -a "$S"
  else
    timeout 400 "$FB" serve lm --model "$ck" --bench "$trace" --backend gpu --max-batch "$mb" --report "$D/${name}_fusebox.json" "$@" \
      > "$D/${name}_fusebox.txt" 2>&1
    summary "$name: fusebox --backend gpu (exit $?)" "$D/${name}_fusebox.txt" 5
    grep -m1 "^engine:" "$D/${name}_fusebox.txt" | cut -c1-400 | tee -a "$S"
  fi
  for mode in ${MODES:-eager compile}; do
    timeout 400 $PY -m fusebox_tools.models.lm_torch serve-bench --checkpoint "$ck" --trace "$trace" --max-batch "$mb" \
      --device cuda --mode "$mode" --report "$D/${name}_torch_$mode.json" > "$D/${name}_torch_$mode.txt" 2>&1
    summary "$name: torch $mode (exit $?)" "$D/${name}_torch_$mode.txt" 4
    compare "${name}_$mode" "$D/${name}_fusebox.json" "$D/${name}_torch_$mode.json"
  done
}

# forced NAME CK TOKENS MAX_BATCH LENGTHS...: teacher forcing (issue 34's verification): one request
# per prompt length, 16 forced tokens each, all at once through the GPU engine; every forced
# position's logits against lm_torch's bf16 full forward (rel-L2 <= 2e-2).
forced() {
  local name=$1 ck=$2 toks=$3 mb=$4
  shift 4
  $PY - "$toks" "$W/${name}_forced.json" "$@" <<'PYEOF'
import json, sys
import numpy as np
t = np.load(sys.argv[1])
reqs = [{"prompt": [int(x) for x in t[1000 * i:1000 * i + int(n)]],
         "forced": [int(x) for x in t[500000 // 4 + 16 * i:500000 // 4 + 16 * i + 16]]} for i, n in enumerate(sys.argv[3:])]
json.dump({"requests": reqs}, open(sys.argv[2], "w"))
PYEOF
  rm -rf "$W/${name}_logits"
  timeout 400 "$FB" serve lm --model "$ck" --backend gpu --max-batch "$mb" --pool-pages $((mb * 272)) \
    --forced "$W/${name}_forced.json" --logits-out "$W/${name}_logits" > "$D/${name}_forced.txt" 2>&1
  summary "$name teacher forcing: fusebox --backend gpu (exit $?)" "$D/${name}_forced.txt" 2
  timeout 300 $PY -m fusebox_tools.models.lm_torch teacher-forced --checkpoint "$ck" --forced "$W/${name}_forced.json" \
    --logits "$W/${name}_logits" --device cuda --floor --json "$D/${name}_teacher_forced.json" > "$D/${name}_tf.txt" 2>&1
  summary "$name teacher forcing: against torch bf16 (exit $?)" "$D/${name}_tf.txt" 8
}

# profile NAME CK MAX_BATCH CONTEXT [fusebox args...]: the decode step stage by stage (serve lm
# --profile-decode) at batch 1 and MAX_BATCH.
profile() {
  local name=$1 ck=$2 mb=$3 ctx=$4
  shift 4
  timeout 400 "$FB" serve lm --model "$ck" --backend gpu --max-batch "$mb" --profile-decode "$ctx" "$@" \
    > "$D/${name}_profile.txt" 2> "$D/${name}_profile.err"
  { echo "== $name: decode profile (exit $?)"; grep -m1 "^engine:" "$D/${name}_profile.err" | cut -c1-300
    head -c 6000 "$D/${name}_profile.txt"; tail -3 "$D/${name}_profile.err"; } | tee -a "$S"
}
# l1b_trace B: B requests of 2048-token prompts at once, 64 new tokens each, fusebox against torch.
l1b_trace() {
  tokens "$W/l1b_tokens.npy" 128256
  timeout 60 $PY -m fusebox_tools.models.lm_trace make --data "$W/l1b_tokens.npy" --requests "$1" --rate 1e6 \
    --prompt-len 2048 --prompt-spread 0 --new-tokens 64 --context 4096 --out "$W/l1b_trace_$1.json" > /dev/null
  bench "l1b_b$1" "$W/l1b.safetensors" "$W/l1b_trace_$1.json" "$1" --pool-pages $(($1 * 136))  # 2112 tokens each
}

# decode_graph KV B MAX_PAGES POOL_PAGES Q_ROW: a paged decode attention graph of the 1B shapes (32
# heads over 8, head dim 64, 16-token pages), every sequence 2048 tokens on pages of its own, KV bf16
# or fp8 (a descale a row), q packed or rows Q_ROW values apart (the engine's fused rows: 2560).
decode_graph() {
  $PY - "$@" <<'PYEOF'
import json, sys
kv, B, MP, PP, QR = sys.argv[1], *map(int, sys.argv[2:6])
fp8 = kv == "fp8"
H, KVH, D, P = 32, 8, 64, 16
pool = {"dims": [PP, KVH, P, D]}
if fp8:
    pool["dtype"] = "fp8_e4m3"
q = {"name": "q", "dims": [B, H, 1, D]}
q.update({"strides": [QR, D, QR, 1]} if QR else {"layout": "bshd"})
t = [q, dict(name="k", **pool), dict(name="v", **pool),
     {"name": "table", "dims": [B, 1, MP, 1], "dtype": "int32", "values": [(b * MP + i) % PP for b in range(B) for i in range(MP)]},
     {"name": "lq", "dims": [B, 1, 1, 1], "dtype": "int32", "values": [1] * B},
     {"name": "lkv", "dims": [B, 1, 1, 1], "dtype": "int32", "values": [2048] * B},
     {"name": "o", "layout": "bshd"}]
inputs = {"q": "q", "k": "k", "v": "v", "seq_len_q": "lq", "seq_len_kv": "lkv",
          "page_table_k": "table", "page_table_v": "table"}
if fp8:
    t[3:3] = [{"name": n, "dtype": "fp32", "dims": [PP, KVH, P, 1]} for n in ("dk", "dv")]
    inputs.update(descale_k="dk", descale_v="dv")
print(json.dumps({"name": "decode_%s_b%d_mp%d" % (kv, B, MP), "io_dtype": "bf16", "intermediate_dtype": "fp32",
                  "compute_dtype": "fp32", "tensors": t,
                  "ops": [{"op": "sdpa_fwd", "name": "attn", "causal": True, "alignment": "bottom_right",
                           "max_seq_len_kv": MP * P, "inputs": inputs, "outputs": {"o": "o"}}]}))
PYEOF
}

case "${PART:-1}" in
  1)
    timeout 240 .gpu/fusebox_gpu_tests --gtest_filter='NativeKernelsGpu.FewRow*:NativeKernelsGpu.PagedDecode*:ServeGpu.*:SamplingGpu.*:KvPagesGpu.*:QuantizeGpu.*' > "$D/gtest.txt" 2>&1
    echo "gtests exit $?" | tee -a "$S"
    grep -E "^\[ serve|^\[  (PASSED|FAILED)|^\[  FAILED  \]" "$D/gtest.txt" | cut -c1-400 | tee -a "$S"
    init examples/train/lm_tiny.json "$W/tiny.safetensors" || exit 1
    for b in gpu reference; do
      timeout 120 "$FB" serve lm --model "$W/tiny.safetensors" --prompt-ids 5,3,1,4,1,5,9,2,6 --max-new 20 --backend $b \
        > "$D/tiny_$b.txt" 2> "$D/tiny_$b.err"
      echo "tiny --backend $b exit $?: $(cut -c1-300 "$D/tiny_$b.txt")" | tee -a "$S"
    done
    cmp -s "$D/tiny_gpu.txt" "$D/tiny_reference.txt" && echo "tiny: the same 20 greedy tokens on both backends" | tee -a "$S"
    tokens "$W/tiny_tokens.npy" 512
    timeout 60 $PY -m fusebox_tools.models.lm_trace make --data "$W/tiny_tokens.npy" --requests 48 --rate 400 \
      --prompt-len 10 --new-tokens 12 --shared-prefix 8 --context 32 --out "$W/tiny_trace.json" > /dev/null
    bench tiny "$W/tiny.safetensors" "$W/tiny_trace.json" 8 --page-size 4 --pool-pages 128
    ;;
  2)
    init examples/train/lm_125m.json "$W/m125.safetensors" || exit 1
    tokens "$W/m125_tokens.npy" 16384
    timeout 60 $PY -m fusebox_tools.models.lm_trace make --data "$W/m125_tokens.npy" --requests 128 --rate 64 \
      --prompt-len 200 --new-tokens 64 --shared-prefix 64 --context 1024 --out "$W/m125_trace.json" > /dev/null
    # 32 running x 64 pages (1024 tokens) and as many again for prefix pages. (pool_pages 0 would
    # take 4 full contexts per request; the attention plans' checks fill the pool with random values.)
    bench m125 "$W/m125.safetensors" "$W/m125_trace.json" 32 --pool-pages 4096
    profile m125 "$W/m125.safetensors" 32 1024 --pool-pages 4096
    forced m125 "$W/m125.safetensors" "$W/m125_tokens.npy" 8 1 7 64 200 500 900 1000 1008
    # Batch 64: 64 prompts of 1 to 946 tokens, all at once (issue 34: batches of 1-64).
    forced m125_b64 "$W/m125.safetensors" "$W/m125_tokens.npy" 64 $(seq 1 15 1008 | head -64)
    ;;
  3)
    # Llama-3.2-1B shapes (issue 34's speed table): the decode step at 2k-token contexts, batch 1
    # and 64, stage by stage against the copy peak, bf16 and FP8 weights; then a trace at batch 1.
    init examples/serve/llama32_1b_shapes.json "$W/l1b.safetensors" || exit 1
    profile l1b "$W/l1b.safetensors" 64 2048 --pool-pages $((64 * 136))
    profile l1b_fp8 "$W/l1b.safetensors" 64 2048 --pool-pages $((64 * 136)) --weights fp8
    # Pages of 64 tokens: cuDNN's paged attention was 30% of the batch-64 step with 16.
    profile l1b_p64 "$W/l1b.safetensors" 64 2048 --pool-pages $((64 * 34)) --page-size 64
    l1b_trace 1
    ;;
  4)
    # Decode at batch 64 with 2k-token contexts against torch (all requests arrive at once; after
    # their prefills the steps are pure decode).
    init examples/serve/llama32_1b_shapes.json "$W/l1b.safetensors" || exit 1
    l1b_trace "${B:-64}"
    ;;
  5)
    init examples/serve/llama32_1b_shapes.json "$W/l1b.safetensors" || exit 1
    tokens "$W/l1b_tokens.npy" 128256
    forced l1b "$W/l1b.safetensors" "$W/l1b_tokens.npy" 8 1 15 300 1024 2048 3000 4000 4080
    ;;
  6)
    # The 125M config's decode profile twice on one plan cache: the second engine's warm-up reads
    # every plan (fusebox's kernels too) from the cache, checks nothing again.
    init examples/train/lm_125m.json "$W/m125.safetensors" || exit 1
    rm -f "$W/plans_m125.sqlite"
    for start in cold warm; do
      FUSEBOX_CACHE="$W/plans_m125.sqlite" profile "m125_$start" "$W/m125.safetensors" 32 1024 --pool-pages 2048
    done
    ;;
  7)
    timeout 300 .gpu/fusebox_gpu_tests --gtest_filter='NativeKernelsGpu.*:ServeGpu.*' > "$D/gtest.txt" 2>&1
    echo "gtests exit $?: $(grep -E '^\[  (PASSED|FAILED) ' "$D/gtest.txt" | tr '\n' ' ')" | tee -a "$S"
    grep -E '^\[  FAILED  \]|Failure|^\[ serve' "$D/gtest.txt" | cut -c1-300 | head -20 | tee -a "$S"
    # Each example by default, then pinned to the other side: cuDNN's first supported engine where
    # fusebox's kernel is the default, fusebox's paged decode attention where cuDNN is.
    for g in sdpa_paged_decode sdpa_paged_decode_b1 matmul_decode_silu; do
      e=$("$FB" engines "examples/graphs/$g.json" --cudnn 2>/dev/null | awk '$3 == "yes" {print $2; exit}')
      case $g in sdpa_paged_decode*) e=fusebox_sdpa_decode ;; esac
      for pin in default "$e"; do
        [ -n "$pin" ] || continue
        timeout 120 "$FB" run "examples/graphs/$g.json" --verify --cuda-graph --iters 200 \
          $([ "$pin" = default ] || echo --engine "$pin") > "$D/run_${g}_$pin.txt" 2>&1
        echo "$g [$pin] exit $?: $(grep -m1 -E '^  plan:' "$D/run_${g}_$pin.txt" | cut -c1-80) |" \
          "$(grep -E 'verify|latency' "$D/run_${g}_$pin.txt" | cut -c1-200 | tr '\n' ' ')" | tee -a "$S"
      done
    done
    init examples/serve/llama32_1b_shapes.json "$W/l1b.safetensors" || exit 1
    profile l1b "$W/l1b.safetensors" 64 2048 --pool-pages $((64 * 136))
    ;;
  8)
    # The FP8 KV cache (docs/serving.md): its kernel and engine tests, then the 1B decode profile with
    # an FP8 cache and with a bf16 one, batch 1 and 64 at 2048 tokens, in one call.
    timeout 240 .gpu/fusebox_gpu_tests \
      --gtest_filter='NativeKernelsGpu.PagedDecodeAttentionOverAnFp8Cache*:NativeKernelsGpu.Skinny*:KvPagesGpu.*:ServeGpu.*' \
      > "$D/gtest.txt" 2>&1
    echo "gtests exit $?: $(grep -E '^\[  (PASSED|FAILED) ' "$D/gtest.txt" | tr '\n' ' ')" | tee -a "$S"
    grep -E '^\[  FAILED  \]|Failure|^\[ serve' "$D/gtest.txt" | cut -c1-300 | head -20 | tee -a "$S"
    init examples/serve/llama32_1b_shapes.json "$W/l1b.safetensors" || exit 1
    profile l1b_fp8kv "$W/l1b.safetensors" 64 2048 --pool-pages $((64 * 136)) --kv-cache fp8
    profile l1b "$W/l1b.safetensors" 64 2048 --pool-pages $((64 * 136))
    ;;
  9)
    # fusebox_sdpa_decode's tensor-core form (session 38, src/kernels/sdpa_decode.cu): the decode
    # attention GPU tests; each decode attention graph pinned to it and on cuDNN's first engine (an
    # FP8 cache has no cuDNN engine); the 1B decode profile with an FP8 and a bf16 cache.
    timeout 240 .gpu/fusebox_gpu_tests \
      --gtest_filter='NativeKernelsGpu.PagedDecode*:KvPagesGpu.*:ServeGpu.Fp8KvCache*:ServeGpu.Deterministic*' \
      > "$D/gtest.txt" 2>&1
    echo "gtests exit $?: $(grep -E '^\[  (PASSED|FAILED) ' "$D/gtest.txt" | tr '\n' ' ')" | tee -a "$S"
    grep -E '^\[  FAILED  \]|Failure|^\[ serve' "$D/gtest.txt" | cut -c1-300 | head -20 | tee -a "$S"
    # The 1B shapes at batch 64, every sequence 2048 tokens, bf16 and FP8 (descales a row).
    for kv in bf16 fp8; do decode_graph "$kv" 64 128 8192 0 > "$W/decode_b64_$kv.json"; done
    for g in examples/graphs/sdpa_paged_decode.json examples/graphs/sdpa_paged_decode_b1.json \
      "$W/decode_b64_bf16.json" "$W/decode_b64_fp8.json"; do
      n=$(basename "$g" .json)
      e=$("$FB" engines "$g" --cudnn 2>/dev/null | awk '$3 == "yes" {print $2; exit}')
      for pin in fusebox_sdpa_decode $e; do
        timeout 120 "$FB" run "$g" --verify --cuda-graph --iters 200 --engine "$pin" > "$D/run_${n}_$pin.txt" 2>&1
        echo "$n [$pin] exit $?: $(grep -E 'verify|latency' "$D/run_${n}_$pin.txt" | cut -c1-200 | tr '\n' ' ')" | tee -a "$S"
      done
    done
    init examples/serve/llama32_1b_shapes.json "$W/l1b.safetensors" || exit 1
    profile l1b_fp8kv "$W/l1b.safetensors" 64 2048 --pool-pages $((64 * 136)) --kv-cache fp8
    # The bf16 cache with every decode graph tuned (cuDNN's first 4 and fusebox's kernel), then as
    # the session chooses.
    profile l1b_tuned "$W/l1b.safetensors" 64 2048 --pool-pages $((64 * 136)) --tune-decode
    profile l1b "$W/l1b.safetensors" 64 2048 --pool-pages $((64 * 136))
    ;;
  10)
    # Why the FP8 cache's attention took 7x longer in the engine's decode profile than on its
    # standalone graph (session 38, docs/serving.md): the engine's shapes standalone (a pool of 8704
    # pages, 256 table slots: 32 chunks, half of them empty at 2048 tokens; q rows 2560 values
    # apart), against the 128-slot graph; then the engine's profile again.
    for spec in "fp8 64 256 8704 2560" "fp8 64 128 8704 2560" "fp8 64 128 8192 0" "fp8 1 256 8704 2560" \
      "bf16 64 256 8704 2560"; do
      set -- $spec
      g="$W/engine_$1_b$2_mp$3_q$5.json"
      decode_graph "$@" > "$g"
      n=$(basename "$g" .json)
      timeout 60 "$FB" run "$g" --verify --cuda-graph --iters 100 --engine fusebox_sdpa_decode > "$D/run_$n.txt" 2>&1
      echo "$n exit $?: $(grep -E 'verify|latency' "$D/run_$n.txt" | cut -c1-200 | tr '\n' ' ')" | tee -a "$S"
    done
    init examples/serve/llama32_1b_shapes.json "$W/l1b.safetensors" || exit 1
    profile l1b_fp8kv "$W/l1b.safetensors" 64 2048 --pool-pages $((64 * 136)) --kv-cache fp8
    ;;
  *) echo "gpu_serve: PART must be 1 to 10" >&2; exit 2 ;;
esac
echo "gpu_serve: done; $S" | tee -a "$S"
