#!/usr/bin/env bash
# CLI contract tests, no GPU needed (ctest's cli_bad_input):
#   tests/cli/run_cli_tests.sh FUSEBOX_BIN SOURCE_DIR
# Bad input must exit 2 with one clear error line on stderr (never a crash);
# valid examples must check and build deviceless for the H200; `run` without a
# GPU must fail plainly; --help must work for every command.
# Ends with the line "N passed, M failed" and exits 1 if M > 0.
set -uo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 FUSEBOX_BIN SOURCE_DIR" >&2
  exit 2
fi
FB=$1
SRC=$2
DEVPROP="$SRC/devices/h200-cudnn-9.27.devprop"
PY=python3
if [ ! -x "$FB" ]; then
  echo "cli tests: $FB is not an executable" >&2
  echo "0 passed, 1 failed"
  exit 1
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/fusebox_cli.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
# The default plan cache lives in the test's own folder, never in ~/.cache.
export FUSEBOX_CACHE="$TMP/default-cache.sqlite"
PASS=0
FAIL=0
RC=0

pass() { PASS=$((PASS + 1)); echo "PASS  $1"; }
# fail NAME WHY: WHY is what was expected; then the last command, its exit code and output.
fail() {
  FAIL=$((FAIL + 1))
  echo "FAIL  $1: $2"
  echo "      command: $FB ${CMD[*]}"
  echo "      exit code: $RC"
  local f
  for f in stderr stdout; do
    if [ -s "$TMP/$f" ]; then
      sed -n "1,12s/^/      $f| /p" "$TMP/$f"
      [ "$(wc -l < "$TMP/$f")" -le 12 ] || echo "      $f| ... ($(wc -l < "$TMP/$f") lines)"
    else
      echo "      $f: (empty)"
    fi
  done
}

# json_check EXPR [ARGS...]: true when the last stdout is JSON `d` and the Python
# expression EXPR holds (ARGS are sys.argv[2:]); otherwise false with the reason in $WHY.
json_check() {
  WHY=$("$PY" - "$TMP/stdout" "$@" 2>&1 <<'PYEOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except ValueError as e:
    sys.exit(f"stdout is not JSON ({e})")
expr, args = sys.argv[2], sys.argv[3:]
try:
    ok = eval(expr)
except Exception as e:
    sys.exit(f"{expr} raised {type(e).__name__}: {e}")
sys.exit(0 if ok else f"expected {expr}" + (f" with {args}" if args else ""))
PYEOF
  )
}

# run_fb ARGS...: runs fusebox (2 minutes at most), sets RC, CMD, $TMP/stdout, $TMP/stderr.
run_fb() {
  CMD=("$@")
  timeout 120 "$FB" "$@" > "$TMP/stdout" 2> "$TMP/stderr" < /dev/null
  RC=$?
}

# Prints why the last command looks like a crash or hang; nothing if it does not.
crash_reason() {
  if [ "$RC" -eq 124 ]; then echo "timed out (120 s)"
  elif [ "$RC" -ge 128 ]; then echo "killed by signal $((RC - 128)) (exit $RC)"
  elif grep -qE "terminate called|Segmentation fault|Aborted|core dumped|AddressSanitizer|runtime error:" \
      "$TMP/stdout" "$TMP/stderr"; then echo "crash text in the output"
  fi
}

# expect_bad NAME PATTERN ARGS...: exit 2 (bad input) and one error line on stderr
# matching PATTERN (extended regex), which should quote the words that name the
# problem; a second line may only point at --help.
# EXPECT_RC=1 expect_bad ...: the same for a graph the backend refuses (exit 1).
expect_bad() {
  local name=$1 pattern=$2 want_rc=${EXPECT_RC:-2}
  shift 2
  run_fb "$@"
  local why lines hints
  why=$(crash_reason)
  if [ -n "$why" ]; then fail "$name" "$why"; return; fi
  if [ "$RC" -ne "$want_rc" ]; then fail "$name" "exit $RC, expected $want_rc"; return; fi
  lines=$(grep -cv '^[[:space:]]*$' "$TMP/stderr")
  hints=$(grep -c -- '--help' "$TMP/stderr")
  if [ "$lines" -eq 0 ]; then fail "$name" "no error message on stderr"; return; fi
  if [ $((lines - hints)) -gt 1 ] || [ "$lines" -gt 2 ]; then
    fail "$name" "$lines lines on stderr, expected one error line"; return
  fi
  if ! grep -qE -- "$pattern" "$TMP/stderr"; then
    fail "$name" "the error does not match /$pattern/"; return
  fi
  pass "$name"
}

# ---------------------------------------------------------------- bad graphs
SMALL_CONV="$SRC/examples/graphs/small/conv_bias_relu_small.json"
[ -f "$SMALL_CONV" ] || SMALL_CONV="$SRC/examples/graphs/conv_bias_relu.json"

# conv_graph X_DIMS [EXTRA_X_FIELD] [OP] [DTYPE]: a small conv graph with one thing changed.
conv_graph() {
  local xdims=$1 xextra=${2:-} op=${3:-relu} dtype=${4:-bf16}
  cat <<EOF
{
  "name": "bad", "io_dtype": "$dtype", "intermediate_dtype": "fp32", "compute_dtype": "fp32",
  "tensors": [
    {"name": "x", "dims": $xdims, "layout": "nhwc"$xextra},
    {"name": "w", "dims": [16, 8, 3, 3], "layout": "nhwc"},
    {"name": "y", "layout": "nhwc"}
  ],
  "ops": [
    {"op": "conv_fprop", "name": "conv1", "inputs": {"x": "x", "w": "w"}, "outputs": {"y": "conv_out"},
     "padding": [1, 1]},
    {"op": "$op", "name": "act", "inputs": {"x": "conv_out"}, "outputs": {"y": "y"}}
  ]
}
EOF
}

printf '{"name": "bad", "tensors": [ {"name": "x", "dims": [1, 2,, 3]} ], "ops": [] }\n' > "$TMP/malformed.json"
head -c 100 "$SRC/examples/graphs/conv_bias_relu.json" > "$TMP/truncated.json"
: > "$TMP/empty.json"
echo '[1, 2, 3]' > "$TMP/array.json"
conv_graph '[2, 8, 10, 10]' '' frobnicate > "$TMP/unknown_op.json"
conv_graph '[2, 8, 10, 10]' '' relu bf17 > "$TMP/unknown_dtype.json"
conv_graph '[2, 8, 10, 10]' ', "layot": "nchw"' > "$TMP/unknown_field.json"
conv_graph '[2, -8, 10, 10]' > "$TMP/negative_dim.json"
conv_graph '[2, 0, 10, 10]' > "$TMP/zero_dim.json"
conv_graph '[4294967296, 4294967296, 4294967296, 2]' > "$TMP/overflow_dims.json"
conv_graph '[2, 8, 10, 10]' > "$TMP/wrong_type_dims.json"
sed -i 's/"dims": \[2, 8, 10, 10\]/"dims": [2, "8", 10, 10]/' "$TMP/wrong_type_dims.json"
conv_graph '[2, 8, 10, 10]' > "$TMP/missing_tensor.json"
sed -i 's/"inputs": {"x": "conv_out"}/"inputs": {"x": "conv_out", "bias": "no_such_tensor"}/; s/"op": "relu"/"op": "bias_add"/' \
  "$TMP/missing_tensor.json"

# What crashed `fusebox check` before (issue 9): deep nesting, a number beyond a double.
"$PY" -c 'print("[" * 200000 + "]" * 200000)' > "$TMP/deep.json"
printf '{"tensors": [{"name": "s", "scalar": 1e999}], "ops": []}\n' > "$TMP/huge_number.json"

# Each pattern quotes the part of the message that names the problem (the place and the rule).
expect_bad "malformed JSON"                  'malformed\.json: invalid JSON at byte 58: parse error at line 1, column 58: syntax error'  check "$TMP/malformed.json"
expect_bad "truncated example (100 bytes)"   'truncated\.json: invalid JSON at byte 101: '  check "$TMP/truncated.json"
expect_bad "empty graph file"                'empty\.json: invalid JSON at byte 1: .*empty input'  check "$TMP/empty.json"
expect_bad "JSON that is not an object"      'array\.json: graph: expected an object, got an array \[1,2,3\]'  check "$TMP/array.json"
expect_bad "unknown op"                      "ops\[1\] \('act'\)\.op: unknown op \"frobnicate\": accepted ops are conv_fprop, "  check "$TMP/unknown_op.json"
expect_bad "unknown dtype"                   'io_dtype: unknown dtype "bf17": accepted dtypes are bf16'  check "$TMP/unknown_dtype.json"
expect_bad "unknown field"                   "tensors\[0\] \('x'\): unknown field 'layot': accepted fields are name, dims, strides, layout"  check "$TMP/unknown_field.json"
expect_bad "negative dim"                    "tensor 'x': dim 1 is -8: dims must be >= 1"  check "$TMP/negative_dim.json"
expect_bad "zero dim"                        "tensor 'x': dim 1 is 0: dims must be >= 1"  check "$TMP/zero_dim.json"
expect_bad "overflowing dims"                "tensors\[0\] \('x'\)\.dims: this tensor alone holds more than 1099511627776 elements: the limit is"  check "$TMP/overflow_dims.json"
expect_bad "dims of the wrong JSON type"     "tensors\[0\] \('x'\)\.dims\[1\]: expected an integer, got \"8\""  check "$TMP/wrong_type_dims.json"
expect_bad "missing tensor reference"        "\[bias_add 'act'\] input 'bias': tensor 'no_such_tensor' is neither declared"  check "$TMP/missing_tensor.json"
expect_bad "JSON nested 200000 deep"         'deep\.json: at byte 65: JSON arrays and objects nest deeper than the limit of 64 levels'  check "$TMP/deep.json"
expect_bad "number beyond a double"          "huge_number\.json: invalid JSON: number overflow parsing '1e999'"  check "$TMP/huge_number.json"
expect_bad "invalid_shapes.json (check)"     "\[conv_fprop 'conv1'\] input 'w' \('w'\) has C=48 but input 'x' \('x'\) has C=64: the filter's dim 1 must equal x's channels, or divide them"  check "$SRC/examples/graphs/invalid_shapes.json"
expect_bad "invalid_shapes.json (build)"     "\[conv_fprop 'conv1'\] input 'w' \('w'\) has C=48 but input 'x' \('x'\) has C=64: the filter's dim 1 must equal x's channels, or divide them"  build "$SRC/examples/graphs/invalid_shapes.json" --device "$DEVPROP"
EXPECT_RC=1 expect_bad "sdpa: bottom-right with bias (build)" 'Bottom right causal mask is only supported with is_bias=False'  build "$SRC/examples/graphs/invalid_sdpa_bottom_right_bias.json" --device "$DEVPROP"
# Norms: a scale that is not x's trailing dims (exit 2, naming op, tensor and
# what is accepted); a residual add feeding layernorm is a valid graph that
# cuDNN 9.19's norm engine refuses (no pointwise prologue or epilogue).
sed 's/"dims": \[1, 128, 1, 1\]/"dims": [1, 120, 1, 1]/' "$SRC/examples/graphs/small/layernorm_small.json" > "$TMP/bad_scale.json"
expect_bad "layernorm: scale of wrong length" "\[layernorm 'ln'\] input 'scale' \('scale'\) has dims \[1, 120, 1, 1\] but 'x' \('x'\) is \[64, 128, 1, 1\]: layernorm's scale has x's normalized \(trailing\) dims and 1 on its row \(leading\) dims, e\.g\. \[1, 128, 1, 1\]"  check "$TMP/bad_scale.json"
# Pooling and batchnorm: a window larger than the padded input, a per-channel
# tensor of the wrong length (exit 2, naming op, tensor and what is accepted).
sed 's/"window": \[3, 3\], "stride": \[2, 2\], "padding": \[1, 1\]/"window": [12, 3], "stride": [2, 2], "padding": [1, 1]/' "$SRC/examples/graphs/small/max_pool_small.json" > "$TMP/bad_window.json"
expect_bad "max_pool: window larger than the padded input" "\[max_pool 'pool'\] input 'x' \('x'\) \[2, 16, 9, 9\] has 9 in spatial dim 0 \(11 with padding \[1, 1\]\) but window\[0\] is 12: the window must fit in the padded input; give window\[0\] <= 11 or more padding"  check "$TMP/bad_window.json"
sed 's/{"name": "scale", "dims": \[1, 16, 1, 1\]/{"name": "scale", "dims": [1, 8, 1, 1]/' "$SRC/examples/graphs/small/batchnorm_train_relu_small.json" > "$TMP/bad_bn_scale.json"
expect_bad "batchnorm: scale of wrong length" "\[batchnorm 'bn'\] input 'scale' \('scale'\) has dims \[1, 8, 1, 1\] but 'x' \('x'\) is \[2, 16, 2, 2\] \(C=16\): batchnorm's scale has one value per channel, dims \[1, 16, 1, 1\]"  check "$TMP/bad_bn_scale.json"
# (cuDNN's refusal lists several reasons, so not expect_bad's one line.)
run_fb build "$SRC/examples/graphs/invalid_add_layernorm.json" --device "$DEVPROP"
why=$(crash_reason)
if [ -n "$why" ]; then fail "layernorm after add (build)" "$why"
elif [ "$RC" -ne 1 ]; then fail "layernorm after add (build)" "exit $RC, expected 1"
elif ! grep -q 'NotSupported: .*no heuristic mode yielded a buildable engine' "$TMP/stderr" || \
     ! grep -q '^  mode a: create_execution_plans' "$TMP/stderr" || \
     ! grep -qF 'matcher->hasProloguePwNodes() || matcher->hasEpiloguePwNodes()' "$TMP/stderr"; then
  fail "layernorm after add (build)" "cuDNN's reason (pointwise prologue/epilogue) is not quoted"
else pass "layernorm after add (build): NotSupported, cuDNN's norm engine refuses the prologue"
fi
# A one-query decode's causal mask masks nothing: the lowering leaves it out and the report says so
# (text and JSON), while a prefill keeps it. Deviceless the decode then fails at the heuristics.
run_fb build "$SRC/examples/graphs/small/sdpa_paged_decode_small.json" --device "$DEVPROP" --no-cache
why=$(crash_reason)
if [ -n "$why" ]; then fail "decode: causal mask left out (build)" "$why"
elif ! grep -qF "  lowering: [sdpa_fwd 'attn']: the causal mask is left out: with one query per sequence" "$TMP/stdout"; then
  fail "decode: causal mask left out (build)" "no lowering line in the report"
else pass "decode: causal mask left out (build), said in the report"
fi
run_fb build "$SRC/examples/graphs/small/sdpa_paged_decode_small.json" --device "$DEVPROP" --no-cache --json
if [ -n "$(crash_reason)" ]; then fail "decode: lowering_notes (build --json)" "$(crash_reason)"
elif ! json_check 'len(d["lowering_notes"]) == 1 and "causal mask is left out" in d["lowering_notes"][0]'; then
  fail "decode: lowering_notes (build --json)" "$WHY"
else pass "decode: lowering_notes (build --json)"
fi
run_fb build "$SRC/examples/graphs/small/sdpa_paged_prefill_small.json" --device "$DEVPROP" --no-cache --json
if [ -n "$(crash_reason)" ]; then fail "prefill keeps its mask (build --json)" "$(crash_reason)"
elif ! json_check 'd["lowering_notes"] == []'; then fail "prefill keeps its mask (build --json)" "$WHY"
else pass "prefill keeps its mask (build --json)"
fi
# Reductions and FP8 epilogues: refused at check (exit 2), naming op, tensor and what is accepted.
sed 's/"reduce_dims": \[0, 2, 3\]/"reduce_dims": [0, 2, 4]/' "$SRC/examples/graphs/small/reduce_sum_bias_grad_small.json" > "$TMP/bad_reduce_dims.json"
expect_bad "reduce_sum: reduce_dims beyond x's rank" "\[reduce_sum 'dbias'\] reduce_dims \[0, 2, 4\] names dim 4 but input 'x' \('dy'\) \[4, 16, 7, 7\] has rank 4: give dims from 0 to 3"  check "$TMP/bad_reduce_dims.json"
sed 's/"name": "dbias", "dtype": "fp32"/"name": "dbias", "dtype": "fp32", "dims": [1, 1, 7, 7]/' "$SRC/examples/graphs/small/reduce_sum_bias_grad_small.json" > "$TMP/bad_reduce_y.json"
expect_bad "reduce_sum: declared y not the reduced dims" "\[reduce_sum 'dbias'\] output 'y' \('dbias'\) is declared with dims \[1, 1, 7, 7\] but the op produces \[1, 16, 1, 1\].*set reduce_dims to the dims where y is 1"  check "$TMP/bad_reduce_y.json"
sed 's/{"name": "descale_a", "dims": \[1, 1, 1\], "dtype": "fp32"/{"name": "descale_a", "dims": [1, 1, 1], "dtype": "bf16"/' "$SRC/examples/graphs/small/fp8_matmul_bias_relu_amax_small.json" > "$TMP/bad_fp8_scale.json"
expect_bad "fp8 matmul: a bf16 descale" "\[scale 'descale_a'\] input 'scale' \('descale_a'\) is bf16 \[1, 1, 1\]: a per-tensor scale \(FP8 descale or scale\) must be an fp32 tensor with every dim 1"  check "$TMP/bad_fp8_scale.json"
sed 's/"dims": \[1, 48, 40\], "layout": "col_major"/"dims": [1, 48, 40], "layout": "col_major", "dtype": "bf16"/' "$SRC/examples/graphs/small/fp8_matmul_bias_relu_amax_small.json" > "$TMP/bad_fp8_mixed.json"
expect_bad "fp8 matmul: fp8 a with bf16 b" "\[matmul 'gemm'\] input 'b' \('b'\) is bf16 but input 'a' \('a'\) is fp8_e4m3: an FP8 matmul takes fp8_e4m3 or fp8_e5m2 for both a and b"  check "$TMP/bad_fp8_mixed.json"
# cuDNN 9.19 refuses the AVG reduction descriptor itself (finalize: NOT_SUPPORTED,
# measured deviceless), so reduce_mean fails at build_operation_graph (exit 1).
EXPECT_RC=1 expect_bad "reduce_mean (build)" "build_operation_graph: CUDNN_BACKEND_API_FAILED: .*reduction_descriptor.*CUDNN_STATUS_NOT_SUPPORTED"  build "$SRC/examples/graphs/invalid_reduce_mean.json" --device "$DEVPROP"
# The embedding op is fusebox's own kernel: it builds deviceless, and its plan file names the
# kernel (no cuDNN bytes), rebuilt by name when read (so a plan check's verdict travels with it).
for k in embedding layernorm; do
  if "$FB" build "$SRC/examples/graphs/small/${k}_small.json" --device "$DEVPROP" --plan-out "$TMP/$k.plan" \
       > "$TMP/$k.out" 2>&1 && [ -s "$TMP/$k.plan" ]; then
    pass "$k (build --plan-out): fusebox's kernel by name"
  else
    fail "$k (build --plan-out): fusebox's kernel by name" "$(tail -3 "$TMP/$k.out")"
  fi
done
sed 's/"dims": \[12, 1, 1, 1\], "dtype": "int32"/"dims": [12, 1, 1, 1], "dtype": "int32", "values": [0, 1, 2, 3, 4, 50, 6, 7, 8, 9, 10, 11]/' "$SRC/examples/graphs/small/embedding_small.json" > "$TMP/bad_ids.json"
expect_bad "embedding: id outside the table (check)" "input 'ids' [(]'ids'[)]: values[[]5[]] = 50 is not a row of the table [(]50 rows[)]" check "$TMP/bad_ids.json"
# SwiGLU as one graph (two GEMMs sharing x) is a valid graph that cuDNN 9.19
# refuses at the support check (exit 1); the two-graph form is in the examples.
run_fb build "$SRC/examples/graphs/invalid_swiglu_one_graph.json" --device "$DEVPROP"
why=$(crash_reason)
if [ -n "$why" ]; then fail "swiglu in one graph (build)" "$why"
elif [ "$RC" -ne 1 ]; then fail "swiglu in one graph (build)" "exit $RC, expected 1"
elif ! grep -q 'NotSupported: ' "$TMP/stderr"; then fail "swiglu in one graph (build)" "no NotSupported reason"
else pass "swiglu in one graph (build): NotSupported"
fi
expect_bad "sdpa: seq_len value > Sq"        "\[sdpa_fwd 'attn'\] input 'seq_len_q' \('seq_len_q'\) holds the value 500: each length must be an integer in \[0, 96\]"  check "$SRC/examples/graphs/invalid_sdpa_lengths.json"
expect_bad "nonexistent graph file"          "graph file '$TMP/no_such_graph\.json': cannot open: No such file or directory"  check "$TMP/no_such_graph.json"
expect_bad "graph path is a directory"       "'$TMP'.*is a directory"  check "$TMP"

# ---------------------------------------------------------------- bad options
echo 'this is not json' > "$TMP/not_json.devprop"
echo '{"name": "not a device", "tensors": []}' > "$TMP/not_device.devprop"
expect_bad "build --device nonexistent file" "device-properties file '$TMP/no_such_device\.devprop': cannot open: No such file or directory"  build "$SMALL_CONV" --device "$TMP/no_such_device.devprop"
expect_bad "build --device file not JSON"    'not_json\.devprop: not a cuDNN device-properties file'  build "$SMALL_CONV" --device "$TMP/not_json.devprop"
expect_bad "build --device JSON not a device" "not_device\.devprop: device-properties field 'deviceVer' is missing"  build "$SMALL_CONV" --device "$TMP/not_device.devprop"
expect_bad "build --heuristics z"            "--heuristics: unknown mode 'z': accepted are a, b, fallback"  build "$SMALL_CONV" --device "$DEVPROP" --heuristics z
expect_bad "unknown command"                 "unknown command 'frobnicate': accepted commands are info, "  frobnicate
expect_bad "unknown flag"                    'argument was not expected: --frobnicate'  check "$SMALL_CONV" --frobnicate
expect_bad "no command"                      'A subcommand is required'

# ---------------------------------------------------------------- valid examples
VALID=()
for g in "$SRC"/examples/graphs/*.json "$SRC"/examples/graphs/small/*.json; do
  [ -f "$g" ] || continue
  case "$(basename "$g")" in invalid_*) continue ;; esac
  VALID+=("$g")
done
if [ "${#VALID[@]}" -eq 0 ]; then
  FAIL=$((FAIL + 1))
  echo "FAIL  examples: no valid graphs in $SRC/examples/graphs"
fi

BUILT=0
SKIPPED=0
for g in "${VALID[@]}"; do
  name=$(basename "$g" .json)
  run_fb check "$g"
  why=$(crash_reason)
  if [ -n "$why" ]; then fail "check $name" "$why"
  elif [ "$RC" -ne 0 ]; then fail "check $name" "exit 0 expected"
  elif ! "$PY" - "$g" "$TMP/stdout" <<'PYEOF'
import json, re, sys
graph = json.load(open(sys.argv[1]))
text = open(sys.argv[2]).read()
missing = [t["name"] for t in graph["tensors"] if not re.search(r"\b%s\b" % re.escape(t["name"]), text)]
sys.exit(f"tensors not listed: {missing}" if missing else 0)
PYEOF
  then fail "check $name" "the listing does not name every tensor"
  else pass "check $name"
  fi

  # cuDNN 9.19 builds only precompiled engines without a driver: a graph that
  # needs a runtime-compiled or cuBLASLt engine fails NotSupported (exit 1),
  # which is a known limitation, not a test failure. conv_bias_relu* must build.
  run_fb build "$g" --device "$DEVPROP" --json
  why=$(crash_reason)
  if [ -n "$why" ]; then fail "build --device $name" "$why"
  elif [ "$RC" -eq 1 ] && grep -q "NotSupported" "$TMP/stderr" && [[ "$name" != conv_bias_relu* ]]; then
    SKIPPED=$((SKIPPED + 1))
    echo "SKIP  build --device $name: cuDNN cannot build it deviceless (NotSupported)"
  elif [ "$RC" -ne 0 ]; then fail "build --device $name" "exit 0 expected"
  elif ! json_check 'd.get("engine") and d.get("ok", True)'; then fail "build --device $name" "$WHY"
  else
    BUILT=$((BUILT + 1))
    pass "build --device $name --json"
  fi
done

if [ "${#VALID[@]}" -gt 0 ] && [ "$BUILT" -eq 0 ]; then
  FAIL=$((FAIL + 1))
  echo "FAIL  deviceless builds: no example built for the H200 from $DEVPROP"
fi

# ---------------------------------------------------------------- no GPU here
if [ -e /dev/nvidia0 ] || [ -e /dev/nvidiactl ]; then
  echo "SKIP  run without a GPU: this machine has one"
else
  run_fb run "$SMALL_CONV" --iters 1 --warmup 0
  why=$(crash_reason)
  if [ -n "$why" ]; then fail "run without a GPU" "$why"
  elif [ "$RC" -eq 0 ]; then fail "run without a GPU" "exit 0 on a machine with no GPU"
  elif ! grep -qE 'NoDevice: no CUDA GPU' "$TMP/stderr"; then fail "run without a GPU" "the error does not match /NoDevice: no CUDA GPU/"
  else pass "run without a GPU (exit $RC)"
  fi
  # --cuda-graph is an accepted flag (not a usage error) that needs a GPU like any run.
  run_fb run "$SMALL_CONV" --cuda-graph --verify --iters 1 --warmup 0
  why=$(crash_reason)
  if [ -n "$why" ]; then fail "run --cuda-graph without a GPU" "$why"
  elif [ "$RC" -ne 1 ]; then fail "run --cuda-graph without a GPU" "exit $RC, 1 (NoDevice) expected"
  elif ! grep -qE 'NoDevice: no CUDA GPU' "$TMP/stderr"; then fail "run --cuda-graph without a GPU" "the error does not match /NoDevice: no CUDA GPU/"
  else pass "run --cuda-graph without a GPU (exit $RC)"
  fi
fi

# ---------------------------------------------------------------- reference (CPU, no GPU)
# `reference` computes run's inputs for a seed and their reference outputs; --compare judges saved
# outputs (here the reference's own, read back into the graph's dtypes: they pass; one value
# changed: exit 1 naming the output and its worst element; a file of the wrong shape: exit 2).
REF_GRAPH="$SRC/examples/graphs/small/conv_relu_channel_sum_small.json"
run_fb reference "$REF_GRAPH" --seed 3 --save-outputs "$TMP/ref3"
if [ "$RC" -eq 0 ] && [ -s "$TMP/ref3/y.npy" ] && [ -s "$TMP/ref3/channel_sum.npy" ]; then
  pass "reference --save-outputs"
else fail "reference --save-outputs" "exit 0 and ref3/y.npy, ref3/channel_sum.npy"; fi
run_fb reference "$REF_GRAPH" --seed 3 --compare "$TMP/ref3" --json
if [ "$RC" -eq 0 ] && json_check 'd["ok"] and len(d["verify"]) == 2 and all(v["pass"] for v in d["verify"])'; then
  pass "reference --compare: its own outputs pass"
else fail "reference --compare: its own outputs pass" "exit 0, ok: ${WHY:-exit $RC}"; fi
mkdir -p "$TMP/ref3bad"
"$PY" -c 'import numpy as np, sys
a = np.load(sys.argv[1] + "/channel_sum.npy"); a.flat[3] *= 1.5; np.save(sys.argv[2] + "/channel_sum.npy", a)
np.save(sys.argv[2] + "/y.npy", np.load(sys.argv[1] + "/y.npy"))' "$TMP/ref3" "$TMP/ref3bad"
# verify_fails NAME PATTERN ARGS...: exit 1, VerificationFailed on stderr, PATTERN in stdout or stderr.
verify_fails() {
  local name=$1 pattern=$2
  shift 2
  run_fb "$@"
  local why
  why=$(crash_reason)
  if [ -n "$why" ]; then fail "$name" "$why"
  elif [ "$RC" -ne 1 ]; then fail "$name" "exit $RC, expected 1"
  elif ! grep -qE "^fusebox reference: VerificationFailed: " "$TMP/stderr"; then fail "$name" "no VerificationFailed on stderr"
  elif ! grep -qE -- "$pattern" "$TMP/stdout" "$TMP/stderr"; then fail "$name" "the output does not match /$pattern/"
  else pass "$name"
  fi
}
verify_fails "reference --compare: one value changed, its worst element named" "worst at \[0, 3, 0, 0\]" \
  reference "$REF_GRAPH" --seed 3 --compare "$TMP/ref3bad"
verify_fails "reference --compare: another seed's inputs differ" "do not match the cpu reference" \
  reference "$REF_GRAPH" --seed 4 --compare "$TMP/ref3"
"$PY" -c 'import numpy as np, sys; np.save(sys.argv[1] + "/y.npy", np.zeros((2, 32, 10), np.float32))' "$TMP/ref3bad"
expect_bad "reference --compare: a file of the wrong shape" "output 'y'.*shape" \
  reference "$REF_GRAPH" --compare "$TMP/ref3bad"
expect_bad "reference --save-outputs over a --compare file" "same file as the --compare file" \
  reference "$REF_GRAPH" --compare "$TMP/ref3" --save-outputs "$TMP/ref3"
# --save-inputs writes the seed's inputs; fed back with --inputs under another seed they give the
# same outputs (the seed-3 outputs pass), and writing over a file being read is refused.
run_fb reference "$REF_GRAPH" --seed 3 --save-inputs "$TMP/in3"
IN3=$(cd "$TMP/in3" 2>/dev/null && for f in *.npy; do printf '%s=%s,' "${f%.npy}" "$TMP/in3/$f"; done)
if [ "$RC" -eq 0 ] && [ -n "$IN3" ]; then
  run_fb reference "$REF_GRAPH" --seed 9 --inputs "${IN3%,}" --compare "$TMP/ref3"
  if [ "$RC" -eq 0 ]; then pass "reference --save-inputs: read back with --inputs, seed 3's outputs again"
  else fail "reference --save-inputs: read back with --inputs, seed 3's outputs again" "exit $RC"; fi
else fail "reference --save-inputs: read back with --inputs, seed 3's outputs again" "exit $RC, files: $IN3"; fi
expect_bad "reference --save-inputs over an --inputs file" "same file as the --inputs file" \
  reference "$REF_GRAPH" --inputs "${IN3%,}" --save-inputs "$TMP/in3"
expect_bad "reference: a graph over --max-flops" "over --max-flops 1e\\+?0?3" \
  reference "$REF_GRAPH" --max-flops 1000
cat > "$TMP/huge_relu.json" <<'EOF2'
{"name": "huge", "io_dtype": "fp32", "tensors": [{"name": "x", "dims": [65536, 65536, 4]}, {"name": "y"}],
 "ops": [{"op": "relu", "name": "r", "inputs": {"x": "x"}, "outputs": {"y": "y"}}]}
EOF2
expect_bad "reference: a graph too large for host memory, refused before anything is made" "take 128 GiB, over" \
  reference "$TMP/huge_relu.json"
expect_bad "reference --compare: a folder without the outputs" "nothing|No such|cannot open" \
  reference "$REF_GRAPH" --compare "$TMP/empty-ref-dir"

# ---------------------------------------------------------------- plan cache
# Never worse than no cache: garbage at the cache path, a corrupt entry, a
# second build that hits.
CACHE="$TMP/cache/plans.sqlite"
CONV_BIG="$SRC/examples/graphs/conv_bias_relu.json"
# check_json NAME EXPR [ARGS...]: the last command exited 0 and its JSON stdout satisfies EXPR.
check_json() {
  local name=$1
  shift
  local why
  why=$(crash_reason)
  if [ -n "$why" ]; then fail "$name" "$why"
  elif [ "$RC" -ne 0 ]; then fail "$name" "exit 0 expected"
  elif ! json_check "$@"; then fail "$name" "$WHY"
  else pass "$name"
  fi
}
run_fb build "$SMALL_CONV" --device "$DEVPROP" --cache "$CACHE" --json
check_json "cache: first build is a miss and stores" 'd["cache"] == "miss" and d["engine"] and d["cache_key"]'
SMALL_ENGINE=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("engine", ""))' "$TMP/stdout" 2>/dev/null)
SMALL_KEY=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("cache_key", ""))' "$TMP/stdout" 2>/dev/null)
run_fb build "$SMALL_CONV" --device "$DEVPROP" --cache "$CACHE" --json
check_json "cache: second build hits (no heuristics), same engine and key" \
  'd["cache"] == "hit" and [d["engine"], d["cache_key"]] == args' "$SMALL_ENGINE" "$SMALL_KEY"
run_fb cache ls --cache "$CACHE" --json
check_json "cache ls lists the entry" '[e["key"] for e in d["entries"]] == args' "$SMALL_KEY"
# Flip one payload byte behind the cache's back: a miss with a warning, then a rebuild.
"$PY" - "$CACHE" <<'PYEOF'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
key, payload = db.execute("select key, payload from entries").fetchone()
b = bytearray(payload); b[len(b) // 2] ^= 0x40
db.execute("update entries set payload = ? where key = ?", (bytes(b), key)); db.commit()
PYEOF
run_fb cache verify --cache "$CACHE"
if [ "$RC" -ne 1 ]; then fail "cache verify finds the corrupt entry" "exit 1 expected"; else pass "cache verify finds the corrupt entry (exit 1)"; fi
run_fb build "$SMALL_CONV" --device "$DEVPROP" --cache "$CACHE" --json
if ! grep -q "warning" "$TMP/stderr"; then fail "cache: corrupt entry" "a warning on stderr expected"
else check_json "cache: corrupt entry is a miss with a warning, then rebuilt" 'd["cache"] == "miss"'
fi
# A file that is not a cache: used uncached, left untouched.
printf 'my precious notes, not a database\n' > "$TMP/notes.txt"
cp "$TMP/notes.txt" "$TMP/notes.orig"
run_fb build "$SMALL_CONV" --device "$DEVPROP" --cache "$TMP/notes.txt" --json
if ! cmp -s "$TMP/notes.txt" "$TMP/notes.orig"; then fail "cache: garbage file" "the file at --cache was modified"
elif ! grep -q "warning" "$TMP/stderr"; then fail "cache: garbage file" "a warning on stderr expected"
else check_json "cache: a non-cache file is left alone and the build runs uncached" 'd["cache"] != "hit"'
fi
run_fb build "$SMALL_CONV" --device "$DEVPROP" --no-cache --json
check_json "--no-cache builds without the cache" 'd["cache"] == "off"'
# A size bound evicts the least recently used entry: the big graph's, built first.
BOUNDED="$TMP/bounded.sqlite"
run_fb build "$CONV_BIG" --device "$DEVPROP" --cache "$BOUNDED" --cache-max-bytes 7000 --json
BIG_KEY=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("cache_key", ""))' "$TMP/stdout" 2>/dev/null)
run_fb build "$SMALL_CONV" --device "$DEVPROP" --cache "$BOUNDED" --cache-max-bytes 7000 --json
run_fb cache ls --cache "$BOUNDED" --json
check_json "cache: --cache-max-bytes evicts the least recently used entry" \
  'args[0] != args[1] and [e["key"] for e in d["entries"]] == args[:1]' "$SMALL_KEY" "$BIG_KEY"
expect_bad "cache show without a key"        "'cache show' needs an argument"  cache show --cache "$CACHE"

# ---------------------------------------------------------------- session: plan policy report
# Where the plan came from: the default policy tries heuristic modes in turn
# (a first); a pinned mode is tried alone; a workspace limit lists what it drops.
run_fb build "$SMALL_CONV" --device "$DEVPROP" --no-cache --json
check_json "build --json reports the plan's source and the mode that served" \
  'd["plan"]["source"] == "built" and d["plan"]["heuristic_mode"] == "a" and [a["modes"] for a in d["plan"]["attempts"]] == ["a"] and d["plan"]["attempts"][0]["ok"] and d["workspace_limit"] == -1 and d["dropped"] == []'
run_fb build "$SMALL_CONV" --device "$DEVPROP" --no-cache --heuristics fallback --json
check_json "build --heuristics fallback pins that mode" \
  'd["plan"]["heuristic_mode"] == "fallback" and len(d["plan"]["attempts"]) == 1'
run_fb build "$SMALL_CONV" --device "$DEVPROP" --cache "$CACHE" --json
check_json "build --json on a cache hit reports the heuristic cache as the source" \
  'd["cache"] == "hit" and d["plan"]["source"] == "heuristic cache" and d["plan"]["attempts"] == []'
# Issue #11's graph (tests/data/conv_dilated_fp16_fp32out.json): fp16 conv, dilation 2, fp32
# output. Mode A has no engine for it (on the GPU fallback has; deviceless none has): every mode
# is tried, in order.
run_fb build "$SRC/tests/data/conv_dilated_fp16_fp32out.json" --device "$DEVPROP" --no-cache --json
if [ -n "$(crash_reason)" ]; then fail "build tries heuristic modes in turn" "$(crash_reason)"
elif [ "$RC" -eq 0 ] && json_check 'd["plan"]["attempts"][-1]["ok"] and [a["modes"] for a in d["plan"]["attempts"]] == ["a", "b", "fallback"][:len(d["plan"]["attempts"])]'; then
  pass "build tries heuristic modes in turn (built with mode $("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["plan"]["heuristic_mode"])' "$TMP/stdout"))"
elif [ "$RC" -eq 1 ] && grep -q "tried in turn: a, b, fallback" "$TMP/stderr" && grep -q "^  mode fallback: " "$TMP/stderr" \
     && json_check '[a["modes"] for a in d["plan"]["attempts"]] == ["a", "b", "fallback"] and not any(a["ok"] for a in d["plan"]["attempts"])'; then
  pass "build tries heuristic modes in turn (a, b, fallback; none builds it deviceless) and names each"
else fail "build tries heuristic modes in turn" "exit 0 with the serving mode, or exit 1 naming a, b and fallback in order"
fi
run_fb build "$CONV_BIG" --device "$DEVPROP" --no-cache --json
BIG_ENGINE=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("engine", ""))' "$TMP/stdout" 2>/dev/null)
BIG_WS=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("workspace_bytes", 0))' "$TMP/stdout" 2>/dev/null)
if [ "${BIG_WS:-0}" -gt 0 ]; then
  run_fb build "$CONV_BIG" --device "$DEVPROP" --no-cache --max-workspace $((BIG_WS - 1)) --json
  if [ -n "$(crash_reason)" ]; then fail "build --max-workspace lists the dropped candidates" "$(crash_reason)"
  elif json_check 'd["workspace_limit"] == int(args[1]) - 1 and args[0] in [x["engine"] for x in d["dropped"]] and all(x["workspace_bytes"] >= int(args[1]) and "over the limit" in x["why"] for x in d["dropped"]) and (d["ok"] is False or d["workspace_bytes"] < int(args[1]))' "$BIG_ENGINE" "$BIG_WS"
  then pass "build --max-workspace lists the dropped candidates (the unlimited choice among them)"
  else fail "build --max-workspace lists the dropped candidates" "$WHY"
  fi
  run_fb build "$CONV_BIG" --device "$DEVPROP" --no-cache --max-workspace $((BIG_WS - 1))
  if grep -q "workspace limit .*candidate(s) dropped" "$TMP/stdout"; then pass "build --max-workspace prints the dropped candidates"
  else fail "build --max-workspace prints the dropped candidates" "a 'workspace limit ... dropped' line on stdout"
  fi
else
  echo "SKIP  build --max-workspace: the big conv's plan needs no workspace here"
fi

# ---------------------------------------------------------------- pipelines (docs/pipeline-format.md)
PIPE_EX="$SRC/examples/pipelines"
P_DOWN="$SRC/examples/graphs/small/conv_bias_relu_small.json"      # x [2,8,10,10] -> y [2,16,5,5]
P_SAME="$PIPE_EX/graphs/conv_bias_relu_16to16_small.json"          # x [2,16,5,5] -> y [2,16,5,5]
P_W='"w1": {"kind": "constant", "file": "'"$PIPE_EX"'/weights/two_convs_w1.npy"},
 "b1": {"kind": "constant", "file": "'"$PIPE_EX"'/weights/two_convs_b1.npy"},
 "w2": {"kind": "constant", "file": "'"$PIPE_EX"'/weights/two_convs_w2.npy"},
 "b2": {"kind": "constant", "file": "'"$PIPE_EX"'/weights/two_convs_b2.npy"}'
P_W2='"w2": {"kind": "constant", "file": "'"$PIPE_EX"'/weights/two_convs_w2.npy"},
 "b2": {"kind": "constant", "file": "'"$PIPE_EX"'/weights/two_convs_b2.npy"}'
P_IO='"x": {"kind": "input"}, "h": {"kind": "intermediate"}, "y": {"kind": "output"}, '
P_TWO='"a": "'"$P_DOWN"'", "b": "'"$P_SAME"'"'
P_BA='"a": {"x": "x", "w": "w1", "b": "b1", "y": "h"}'
# p_same STAGE IN OUT: the bind entry of a 16->16 stage.
p_same() { echo "\"$1\": {\"x\": \"$2\", \"w\": \"w2\", \"b\": \"b2\", \"y\": \"$3\"}"; }
# pipe NAME GRAPHS BUFFERS BIND: writes $TMP/NAME.json.
pipe() { printf '{"name": "p", "graphs": {%s}, "buffers": {%s}, "bind": {%s}}\n' "$2" "$3" "$4" > "$TMP/$1.json"; }
pipe p_unbound   "$P_TWO" "$P_IO$P_W" "$P_BA"', "b": {"x": "h", "w": "w2", "y": "y"}'
pipe p_shape     '"a": "'"$P_DOWN"'", "b": "'"$P_DOWN"'"' "$P_IO$P_W" "$P_BA"', "b": {"x": "h", "w": "w1", "b": "b1", "y": "y"}'
sed 's/"io_dtype": "bf16"/"io_dtype": "fp16"/' "$P_SAME" > "$TMP/same_fp16.json"
pipe p_dtype     '"a": "'"$P_DOWN"'", "b": "'"$TMP/same_fp16.json"'"' "$P_IO$P_W" "$P_BA, $(p_same b h y)"
pipe p_unread    '"a": "'"$P_DOWN"'"' '"x": {"kind": "input"}, "h": {"kind": "intermediate"}, '"$P_W" "$P_BA"
pipe p_unwritten "$P_TWO" '"x": {"kind": "input"}, "g": {"kind": "intermediate"}, "h": {"kind": "intermediate"}, "y": {"kind": "output"}, '"$P_W" "$P_BA, $(p_same b g y)"
pipe p_unused    "$P_TWO" "$P_IO$P_W"', "spare": {"kind": "input"}' "$P_BA, $(p_same b h y)"
pipe p_twowriter '"a": "'"$P_SAME"'", "b": "'"$P_SAME"'"' '"x": {"kind": "input"}, "y": {"kind": "output"}, '"$P_W" "$(p_same a x y), $(p_same b x y)"
pipe p_inwritten '"b": "'"$P_SAME"'"' '"x": {"kind": "input"}, "y": {"kind": "input"}, '"$P_W" "$(p_same b x y)"
pipe p_cycle     '"a": "'"$P_SAME"'", "b": "'"$P_SAME"'"' '"h1": {"kind": "intermediate"}, "h2": {"kind": "intermediate"}, '"$P_W2" "$(p_same a h2 h1), $(p_same b h1 h2)"
pipe p_inplace   '"a": "'"$P_SAME"'"' '"h": {"kind": "intermediate"}, '"$P_W2" "$(p_same a h h)"
pipe p_noweights "$P_TWO" "$P_IO$P_W"', "w9": {"kind": "constant", "file": "no_such_weights.npy"}' "$P_BA, $(p_same b h y)"
pipe p_twice     "$P_TWO" "$P_IO$P_W" "$P_BA"', "b": {"x": "h", "w": "w2", "b": "b2", "y": "y", "x": "h"}'
pipe p_virtual   "$P_TWO" "$P_IO$P_W" "$P_BA"', "b": {"x": "h", "w": "w2", "b": "b2", "y": "y", "conv_out": "h"}'
pipe p_nobuffer  "$P_TWO" "$P_IO$P_W" "$P_BA, $(p_same b h out)"
pipe p_nostage   "$P_TWO" "$P_IO$P_W" "$P_BA, $(p_same b h y), $(p_same c h y)"
pipe p_nograph   '"a": "'"$TMP"'/no_such_graph.json"' '"x": {"kind": "input"}' '"a": {}'

expect_bad "pipeline: tensor not bound"       "p_unbound\.json: pipeline 'p': stage 'b': graph tensor 'b' of 'conv_bias_relu_16to16_small' not bound to a buffer: bind every memory input and output"  pipeline check "$TMP/p_unbound.json"
expect_bad "pipeline: shapes disagree"        "p_shape\.json: pipeline 'p': stage 'b': graph tensor 'x' is bf16 \[2, 8, 10, 10\] strides \[800, 1, 80, 8\] but buffer 'h' is bf16 \[2, 16, 5, 5\] strides \[400, 1, 80, 16\] in stage 'a' \(graph tensor 'y'\): every stage must see a buffer with the same dims, strides and dtype"  pipeline check "$TMP/p_shape.json"
expect_bad "pipeline: dtypes disagree"        "p_dtype\.json: pipeline 'p': stage 'b': graph tensor 'x' is fp16 \[2, 16, 5, 5\] strides \[400, 1, 80, 16\] but buffer 'h' is bf16 \[2, 16, 5, 5\] strides \[400, 1, 80, 16\] in stage 'a' \(graph tensor 'y'\)"  pipeline check "$TMP/p_dtype.json"
expect_bad "pipeline: intermediate not read"  "p_unread\.json: pipeline 'p': intermediate buffer 'h' is written by stage 'a' but read by no stage: bind it to a graph input, or make it an output"  pipeline check "$TMP/p_unread.json"
expect_bad "pipeline: intermediate not written" "p_unwritten\.json: pipeline 'p': intermediate buffer 'g' is written by no stage: bind it to a graph output, or make it an input"  pipeline check "$TMP/p_unwritten.json"
expect_bad "pipeline: unused input"           "p_unused\.json: pipeline 'p': input buffer 'spare' is read by no stage: bind it to a graph input or remove it"  pipeline check "$TMP/p_unused.json"
expect_bad "pipeline: two writers"            "p_twowriter\.json: pipeline 'p': stage 'b': graph output 'y' writes buffer 'y', which stage 'a' already writes \(as 'y'\): a buffer has one writer"  pipeline check "$TMP/p_twowriter.json"
expect_bad "pipeline: input written"          "p_inwritten\.json: pipeline 'p': stage 'b': graph output 'y' writes buffer 'y', a pipeline input: inputs are only read"  pipeline check "$TMP/p_inwritten.json"
expect_bad "pipeline: cycle"                  "p_cycle\.json: pipeline 'p': the stages form a cycle: 'a' -> \('h1'\) -> 'b' -> \('h2'\) -> 'a': each buffer must be written before it is read"  pipeline check "$TMP/p_cycle.json"
expect_bad "pipeline: stage in place"         "p_inplace\.json: pipeline 'p': stage 'a': reads buffer 'h' \(as 'x'\) that it writes itself \(as 'y'\): a stage cannot work in place"  pipeline check "$TMP/p_inplace.json"
expect_bad "pipeline: missing weights file"   "p_noweights\.json: pipeline 'p': constant buffer 'w9': weights file 'no_such_weights\.npy' cannot be used: "  pipeline check "$TMP/p_noweights.json"
expect_bad "pipeline: tensor bound twice"     "p_twice\.json: key 'x' appears twice in one object: each key \(stage, buffer, graph tensor\) once"  pipeline check "$TMP/p_twice.json"
expect_bad "pipeline: virtual tensor bound"   "p_virtual\.json: pipeline 'p': stage 'b': graph tensor 'conv_out' is virtual \(it never reaches memory\) and takes no buffer"  pipeline check "$TMP/p_virtual.json"
expect_bad "pipeline: undeclared buffer"      "p_nobuffer\.json: pipeline 'p': stage 'b': graph tensor 'y' is bound to buffer 'out', which is not declared in 'buffers'"  pipeline check "$TMP/p_nobuffer.json"
expect_bad "pipeline: bind of an unknown stage" "p_nostage\.json: pipeline 'p': bind: 'c' is not a stage: the stages \(graphs\) are a, b"  pipeline check "$TMP/p_nostage.json"
expect_bad "pipeline: missing graph file"     "p_nograph\.json: pipeline 'p': stage 'a': .*no_such_graph\.json"  pipeline check "$TMP/p_nograph.json"
expect_bad "pipeline: no subcommand"          "fusebox pipeline: InvalidArgument: a subcommand is needed: accepted subcommands are check"  pipeline

run_fb pipeline check "$PIPE_EX/two_convs.json"
if [ "$RC" -eq 0 ] && grep -q "1. conv1 " "$TMP/stdout" && grep -q "2. conv2 " "$TMP/stdout" \
   && grep -qE "hidden +intermediate +bf16 \[2, 16, 5, 5\]  written by conv1\.y, read by conv2\.x" "$TMP/stdout" \
   && grep -q "^total flops " "$TMP/stdout"; then pass "pipeline check two_convs.json"
else fail "pipeline check two_convs.json" "exit 0, stages conv1 then conv2, hidden written by conv1.y and read by conv2.x"
fi
run_fb pipeline check "$PIPE_EX/two_convs.json" --json
if [ "$RC" -ne 0 ]; then fail "pipeline check --json" "exit 0"
elif json_check 'd["ok"] and [s["name"] for s in d["stages"]] == ["conv1", "conv2"] and {b["name"]: b for b in d["buffers"]}["hidden"]["writer"] == {"stage": "conv1", "tensor": "y"} and {b["name"]: b for b in d["buffers"]}["image"]["dims"] == [2, 8, 10, 10] and abs(d["flops"] - sum(s["flops"] for s in d["stages"])) < 1 and d["flops"] > 0'
then pass "pipeline check --json"
else fail "pipeline check --json" "$WHY"
fi
run_fb pipeline check "$TMP/p_cycle.json" --json
if [ "$RC" -eq 2 ] && json_check 'd["ok"] is False and d["code"] == "InvalidArgument" and "cycle" in d["error"]'
then pass "pipeline check --json on error"
else fail "pipeline check --json on error" "exit 2 and {ok: false, code: InvalidArgument}${WHY:+: $WHY}"
fi

# ---------------------------------------------------------------- pipeline build, tune, run
# Built deviceless here; run and tune need a GPU, but everything wrong with the
# caller's files is found before any GPU work (exit 2).
run_fb pipeline build "$PIPE_EX/two_convs.json" --device "$DEVPROP" --no-cache
if [ -n "$(crash_reason)" ] || [ "$RC" -ne 0 ]; then fail "pipeline build --device two_convs" "exit 0 $(crash_reason)"
elif grep -q "deviceless" "$TMP/stdout" && grep -qE "1\. conv1 +graph conv_bias_relu_small: built now" "$TMP/stdout" \
   && grep -qE "2\. conv2 +graph conv_bias_relu_16to16_small: built now" "$TMP/stdout" \
   && grep -q "workspace arena needed" "$TMP/stdout"; then pass "pipeline build --device two_convs"
else fail "pipeline build --device two_convs" "stages conv1 then conv2 built now, deviceless, the arena size"
fi
# pipeline check: the intermediates' memory, one allocation each and in one arena by their lives
# (conv10: 9 intermediates in a chain; two alive at a time).
run_fb pipeline check "$PIPE_EX/conv10.json" --json
if [ -n "$(crash_reason)" ] || [ "$RC" -ne 0 ]; then fail "pipeline check: intermediate bytes" "exit 0 $(crash_reason)"
elif json_check 'd["intermediate_bytes"]["shared"] * 4 < d["intermediate_bytes"]["separate"] and d["intermediate_bytes"]["shared"] > 0'
then pass "pipeline check: intermediate bytes, shared under a quarter of separate"
else fail "pipeline check: intermediate bytes" "$WHY"
fi
expect_bad "pipeline run: --share-intermediates with --verify" "--share-intermediates leaves no intermediate buffer to check: drop --verify or --share-intermediates" \
  pipeline run "$PIPE_EX/conv10.json" --share-intermediates --verify
# conv10: 10 stages of one graph; the first builds, the other nine hit the heuristic cache entry.
run_fb pipeline build "$PIPE_EX/conv10.json" --device "$DEVPROP" --cache "$TMP/pipe-cache.sqlite" --json
if [ -n "$(crash_reason)" ] || [ "$RC" -ne 0 ]; then fail "pipeline build --device conv10 --json" "exit 0 $(crash_reason)"
elif json_check 'd["ok"] and d["version"] == 1 and d["target"]["deviceless"] and [s["stage"] for s in d["stages"]] == ["conv%d" % i for i in range(1, 11)] and all(s["ok"] and s["engine"] for s in d["stages"]) and d["stages"][0]["plan"]["source"] == "built" and all(s["plan"]["cache"] == "hit" for s in d["stages"][1:]) and d["workspace_bytes"] == max(s["workspace_bytes"] for s in d["stages"])'
then pass "pipeline build --device conv10 --json"
else fail "pipeline build --device conv10 --json" "$WHY"
fi
# --static-shapes: a symbolic stage builds statically, with no dynamic-shape attempt (without it the
# session asks the static heuristics first: deviceless, their engine is precompiled, so the stage
# builds statically by policy and static_policy says so).
run_fb pipeline build "$PIPE_EX/two_convs_dyn.json" --device "$DEVPROP" --shape N=3 --no-cache --static-shapes --json
if [ -n "$(crash_reason)" ] || [ "$RC" -ne 0 ]; then fail "pipeline build --static-shapes" "exit 0 $(crash_reason)"
elif json_check 'all(s["ok"] and s["plan"]["shape"] == {"N": 3} and not s["plan"]["dynamic_shape"] and s["plan"]["dynamic_fallback"] == "" and "static build]" in s["plan"]["source_text"] for s in d["stages"])'
then pass "pipeline build --static-shapes: static builds at N=3, no dynamic attempt"
else fail "pipeline build --static-shapes" "$WHY"
fi
run_fb pipeline build "$PIPE_EX/two_convs_dyn.json" --device "$DEVPROP" --shape N=3 --no-cache --json
if [ -n "$(crash_reason)" ] || [ "$RC" -ne 0 ]; then fail "pipeline build (dynamic shapes)" "exit 0 $(crash_reason)"
elif json_check 'all(s["ok"] and not s["plan"]["dynamic_shape"] and "precompiled" in s["plan"]["static_policy"] and s["plan"]["static_probe_ms"] > 0 for s in d["stages"])'
then pass "pipeline build without --static-shapes: the static engine is precompiled, so static by policy (said so)"
else fail "pipeline build (dynamic shapes)" "$WHY"
fi
run_fb pipeline build "$PIPE_EX/two_convs.json" --device "$DEVPROP" --no-cache --engine eng9999_nothing --json
if [ -n "$(crash_reason)" ]; then fail "pipeline build: unknown engine" "$(crash_reason)"
elif [ "$RC" -ne 0 ] && json_check 'd["ok"] is False and "stage '"'"'conv1'"'"'" in d["error"] and len(d["stages"]) == 1 and not d["stages"][0]["ok"]'
then pass "pipeline build: unknown engine names the stage (exit $RC)"
else fail "pipeline build: unknown engine" "non-zero exit, ok false, the error names stage conv1${WHY:+: $WHY}"
fi

# Weights that do not fit their buffer (w1 is bf16 [16, 8, 3, 3]).
"$PY" - "$TMP" <<'PYEOF'
import sys, numpy as np
d = sys.argv[1]
np.save(f"{d}/w1_shape.npy", np.zeros((16, 8, 3, 1), np.float32))
np.save(f"{d}/w1_int.npy", np.zeros((16, 8, 3, 3), np.int32))
np.save(f"{d}/image_shape.npy", np.zeros((2, 8, 10, 9), np.float32))
PYEOF
P_W1REST='"b1": {"kind": "constant", "file": "'"$PIPE_EX"'/weights/two_convs_b1.npy"}, '"$P_W2"
pipe p_wshape "$P_TWO" "$P_IO"'"w1": {"kind": "constant", "file": "w1_shape.npy"}, '"$P_W1REST" "$P_BA, $(p_same b h y)"
pipe p_wint   "$P_TWO" "$P_IO"'"w1": {"kind": "constant", "file": "w1_int.npy"}, '"$P_W1REST" "$P_BA, $(p_same b h y)"
: > "$TMP/huge.npy"
truncate -s 70G "$TMP/huge.npy"
pipe p_huge   "$P_TWO" "$P_IO"'"w1": {"kind": "constant", "file": "huge.npy"}, '"$P_W1REST" "$P_BA, $(p_same b h y)"
expect_bad "pipeline run: wrong-shaped weights" "p_wshape\.json: pipeline 'p': constant buffer 'w1': file 'w1_shape\.npy' does not fit: expected a float array of shape \[16, 8, 3, 3\] for bf16 \[16, 8, 3, 3\]: .*shape \(16, 8, 3, 1\) does not match"  pipeline run "$TMP/p_wshape.json" --iters 0
expect_bad "pipeline run: wrong dtype weights"  "p_wint\.json: pipeline 'p': constant buffer 'w1': file 'w1_int\.npy' does not fit: expected a float array .*integer array '<i4' cannot feed"  pipeline run "$TMP/p_wint.json" --iters 0
expect_bad "pipeline run: missing weights file" "p_noweights\.json: pipeline 'p': constant buffer 'w9': weights file 'no_such_weights\.npy' cannot be used"  pipeline run "$TMP/p_noweights.json"
expect_bad "pipeline run: files over the size cap" "p_huge\.json: pipeline 'p': the graph and weights files add up to [0-9]+ bytes, over the limit of 64 GiB per pipeline"  pipeline run "$TMP/p_huge.json"
expect_bad "pipeline build: files over the size cap" "p_huge\.json: pipeline 'p': the graph and weights files add up to"  pipeline build "$TMP/p_huge.json" --device "$DEVPROP"
expect_bad "pipeline run: --input not an input" "pipeline 'two_convs': --input 'hidden' \(.*\) is not an input buffer: the inputs are 'image'"  pipeline run "$PIPE_EX/two_convs.json" --input "hidden=$TMP/image_shape.npy"
expect_bad "pipeline run: --input wrong shape"  "pipeline 'two_convs': input buffer 'image': file '.*image_shape\.npy' does not fit: expected a float array of shape \[2, 8, 10, 10\]"  pipeline run "$PIPE_EX/two_convs.json" --input "image=$TMP/image_shape.npy"
expect_bad "pipeline run: --input not NAME=FILE" "--input: 'image' is not NAME=FILE\.npy"  pipeline run "$PIPE_EX/two_convs.json" --input image
run_fb pipeline run "$TMP/p_wshape.json" --json
if [ "$RC" -eq 2 ] && json_check 'd["ok"] is False and d["code"] == "InvalidArgument" and "w1_shape.npy" in d["error"]'
then pass "pipeline run --json on bad weights"
else fail "pipeline run --json on bad weights" "exit 2 and {ok: false, code: InvalidArgument}${WHY:+: $WHY}"
fi
if [ -e /dev/nvidia0 ] || [ -e /dev/nvidiactl ]; then
  echo "SKIP  pipeline run/tune without a GPU: this machine has one"
else
  for sub in run tune "run --cuda-graph" "tune --cuda-graph"; do
    # shellcheck disable=SC2086
    run_fb pipeline $sub "$PIPE_EX/two_convs.json" --no-cache
    if [ -n "$(crash_reason)" ]; then fail "pipeline $sub without a GPU" "$(crash_reason)"
    elif [ "$RC" -eq 1 ] && grep -qE 'NoDevice: no CUDA GPU' "$TMP/stderr"; then pass "pipeline $sub without a GPU (exit 1)"
    else fail "pipeline $sub without a GPU" "exit 1 with NoDevice: no CUDA GPU"
    fi
  done
fi

# ---------------------------------------------------------------- symbolic graphs (graph-format.md, "Symbolic dims")
DYN="$SRC/examples/graphs/small/conv_bias_relu_dyn_small.json"
expect_bad "build --shape out of range"   "symbol 'N' \(dim 0 of 'x'\) = 9 is outside its range \[1, 8\]"  build "$DYN" --device "$DEVPROP" --shape N=9
expect_bad "run --shape out of range"     "symbol 'N' \(dim 0 of 'x'\) = 0|not a positive integer"  run "$DYN" --shape N=0
expect_bad "check --shape unknown symbol" "unknown symbol 'B': the graph declares N"  check "$DYN" --shape B=2
expect_bad "check --shape malformed"      "--shape: shape 'N': no NAME=.*NAME=VALUE"  check "$DYN" --shape N
expect_bad "check --shape on a static graph" "declares no symbols"  check "$SMALL_CONV" --shape N=2
expect_bad "shapes on a static graph"     "declares no symbols: nothing to sweep"  shapes "$SMALL_CONV" --shapes N=1..2 --device "$DEVPROP"
# The warm-up build: a shape outside the sweep, reported apart; none with --no-warmup or when the
# sweep holds every value of the symbol (N is 1..8 here).
run_fb shapes "$DYN" --shapes N=1..3 --device "$DEVPROP" --json
if [ -n "$(crash_reason)" ] || [ "$RC" -ne 0 ]; then fail "shapes warm-up" "exit 0 $(crash_reason)"
elif json_check 'd["summary"]["warmup_shape"] is not None and d["summary"]["warmup_shape"]["N"] not in (1, 2, 3) and d["summary"]["warmup_ms"] > 0'
then pass "shapes: one warm-up build outside the sweep, reported apart"
else fail "shapes warm-up" "$WHY"
fi
run_fb shapes "$DYN" --shapes N=1..8 --device "$DEVPROP" --json
if [ -n "$(crash_reason)" ] || [ "$RC" -ne 0 ]; then fail "shapes warm-up (full sweep)" "exit 0 $(crash_reason)"
elif json_check 'd["summary"]["warmup_shape"] is None and d["summary"]["warmup_ms"] is None'
then pass "shapes: no warm-up when the sweep holds every value"
else fail "shapes warm-up (full sweep)" "$WHY"
fi
expect_bad "shapes out of range"          "symbol 'N' \(dim 0 of 'x'\) = 9 is outside its range \[1, 8\]"  shapes "$DYN" --shapes N=7..9 --device "$DEVPROP"
expect_bad "shapes bad sweep"             "--shapes: shapes 'N=4..1': HI is below LO"  shapes "$DYN" --shapes N=4..1 --device "$DEVPROP"
sed 's/"layout": "nhwc"}/"layout": "nhwc", "strides": [800, 1, 80, 8]}/' "$DYN" > "$TMP/dyn_strides.json"
expect_bad "symbolic dims with strides"   "'x': has symbolic dims and explicit strides"  check "$TMP/dyn_strides.json"
sed 's/"dims": \["N", 8/"dims": ["B", 8/' "$DYN" > "$TMP/dyn_unknown.json"
expect_bad "undeclared symbol in dims"    "dims\[0\]: unknown symbol \"B\".*declared: N"  check "$TMP/dyn_unknown.json"

run_fb check "$DYN" --shape N=5 --json
if [ "$RC" -ne 0 ]; then fail "check --shape N=5 --json" "exit 0 expected"
elif ! json_check '[t["dims"] for t in d["tensors"] if t["name"] in ("x", "y")] == [[5, 8, 10, 10], [5, 16, 5, 5]]'; then
  fail "check --shape N=5 --json" "$WHY"
else pass "check --shape N=5: dims follow the shape"
fi
run_fb check "$DYN" --shape N=5
if [ "$RC" -ne 0 ] || ! grep -q "symbolic, at shape N=5" "$TMP/stdout"; then fail "check --shape N=5" "'symbolic, at shape N=5' expected"
else pass "check --shape N=5 text"
fi
# Two shapes in one cache: two entries.
run_fb build "$DYN" --device "$DEVPROP" --shape N=3 --cache "$TMP/dyn.sqlite" --json
if [ "$RC" -ne 0 ]; then fail "build --shape N=3" "exit 0 expected"
elif ! json_check 'd["plan"]["shape"] == {"N": 3} and d["cache_stored"]'; then fail "build --shape N=3" "$WHY"
else pass "build --shape N=3 --json: shape in the report, stored"
fi
run_fb build "$DYN" --device "$DEVPROP" --shape N=4 --cache "$TMP/dyn.sqlite"
if [ "$RC" -ne 0 ] || ! grep -q "shape N=4: " "$TMP/stdout"; then fail "build --shape N=4" "exit 0 and a 'shape N=4:' line expected"
else pass "build --shape N=4 text"
fi
run_fb cache ls --cache "$TMP/dyn.sqlite" --json
if [ "$RC" -ne 0 ]; then fail "cache list after two shapes" "exit 0 expected"
elif ! json_check 'len(d["entries"]) == 2'; then fail "cache list after two shapes" "$WHY"
else pass "two shapes, two plan-cache entries"
fi
run_fb shapes "$DYN" --shapes N=1,2 --device "$DEVPROP" --json
if [ "$RC" -ne 0 ]; then fail "shapes --device --json" "exit 0 expected"
elif ! json_check 'len(d["rows"]) == 4 and all(r["ok"] for r in d["rows"]) and {r["mode"] for r in d["rows"]} == {"kernel_cache", "cold"} and d["summary"]["shapes"] == 2 and d["summary"]["cold_total_ms"] > 0'; then
  fail "shapes --device --json" "$WHY"
else pass "shapes --device --json: a row per shape and pass"
fi

# ---------------------------------------------------------------- model embed
# `fusebox model embed` starts the Python runner (fusebox_tools.models.minilm_embed) with its arguments
# verbatim; missing pieces are one error line, exit 2.
expect_bad "model: no subcommand"             "fusebox model: InvalidArgument: a subcommand is needed: accepted subcommands are embed"  model
run_fb model embed --help
if [ "$RC" -ne 0 ] || ! grep -q -- "--text TEXT" "$TMP/stdout" || ! grep -q -- "--json" "$TMP/stdout"; then
  fail "model embed --help" "exit 0 and the options (--text, --file, --json) on stdout expected"
else pass "model embed --help"
fi
# issue 36: the client's batching, its cut and its plan cache are documented where a user looks
if ! grep -q -- "--batch-size N" "$TMP/stdout" || ! grep -q "max_seq_length" "$TMP/stdout" \
   || ! grep -q -- "--no-cache" "$TMP/stdout"; then
  fail "model embed --help (issue 36)" "--batch-size, max_seq_length and --no-cache in the help expected"
else pass "model embed --help (issue 36)"
fi
FUSEBOX_PYTHON=/nonexistent/python expect_bad "model embed: FUSEBOX_PYTHON missing" \
  "fusebox model embed: InvalidArgument: no Python interpreter '/nonexistent/python' \(from \\\$FUSEBOX_PYTHON\)" \
  model embed --text hi
FUSEBOX_PYTHONPATH="$TMP/no-tools" expect_bad "model embed: FUSEBOX_PYTHONPATH without the runner" \
  "the Python runner fusebox_tools/models/minilm_embed.py is not in \\\$FUSEBOX_PYTHONPATH" model embed --text hi
if "$PY" -c 'import numpy' 2>/dev/null; then
  expect_bad "model embed: --model folder missing" \
    "minilm_embed: --model '/nonexistent/minilm': no minilm_config.json there" \
    model embed --model /nonexistent/minilm --text hi
else
  SKIPPED=$((SKIPPED + 1)); echo "SKIP  model embed --model missing: $PY has no numpy"
fi
if "$PY" -c 'import numpy, tokenizers' 2>/dev/null &&
    PYTHONPATH="$SRC/python" "$PY" -m fusebox_tools.models.minilm random --out "$TMP/minilm" --seq 64 > /dev/null; then
  printf 'the sky is blue\n\n  the sea is blue  \n' > "$TMP/sentences.txt"
  # "pipeline" and "check" read like fusebox commands: they reach the runner as sentences.
  run_fb model embed --model "$TMP/minilm" --no-fusebox --json pipeline --text check --file "$TMP/sentences.txt"
  why=$(crash_reason)
  if [ -n "$why" ]; then fail "model embed --no-fusebox --json" "$why"
  elif [ "$RC" -ne 0 ]; then fail "model embed --no-fusebox --json" "exit 0 expected"
  elif ! json_check 'd["ok"] and d["sentences"] == ["pipeline", "check", "the sky is blue", "the sea is blue"] and len(d["embeddings"]) == 4 and all(abs(sum(x * x for x in e) - 1) < 1e-6 for e in d["embeddings"]) and all(abs(d["cosine"][i][i] - 1) < 1e-6 and abs(d["cosine"][i][j] - d["cosine"][j][i]) < 1e-9 for i in range(4) for j in range(4)) and d["computed_by"].startswith("numpy")'; then
    fail "model embed --no-fusebox --json" "$WHY"
  else pass "model embed --no-fusebox --json: 4 unit embeddings, a symmetric cosine matrix"
  fi
  printf 'caf\xe9\n' > "$TMP/latin1.txt"
  expect_bad "model embed: --file not UTF-8" "minilm_embed: --file '.*latin1.txt' is not UTF-8 text" \
    model embed --model "$TMP/minilm" --no-fusebox --file "$TMP/latin1.txt"
  run_fb model embed --model "$TMP/minilm" --no-fusebox --text "a b" --json
  if [ "$RC" -ne 0 ] || ! json_check 'len(d["embeddings"]) == 1'; then
    fail "model embed: the runner's exit code" "exit 0 and one embedding expected"
  else pass "model embed: exit code and stdout are the runner's"
  fi
else
  SKIPPED=$((SKIPPED + 1)); echo "SKIP  model embed on a random model: $PY lacks numpy or tokenizers"
fi

# ---------------------------------------------------------------- backward (docs/training.md)
G="$SRC/examples/graphs/small/matmul_bias_gelu_small.json"
run_fb backward "$G" --out "$TMP/mbg_bwd.json"
if [ "$RC" -ne 0 ] || [ ! -s "$TMP/mbg_bwd.json" ] || [ ! -s "$TMP/mbg_bwd.bindings.json" ]; then
  fail "backward: matmul_bias_gelu_small" "exit 0, the graph and its bindings written"
elif ! grep -q "recomputed in the backward: " "$TMP/stdout" || ! grep -q "gelu_tanh_bwd\|gelu_erf_bwd" "$TMP/mbg_bwd.json"; then
  fail "backward: matmul_bias_gelu_small" "the report names the recomputed ops; the graph has gelu's backward"
else
  run_fb check "$TMP/mbg_bwd.json"
  if [ "$RC" -ne 0 ]; then fail "backward: the derived graph checks" "fusebox check exit 0"
  else pass "backward: matmul_bias_gelu_small derived, written with its bindings, and checks"
  fi
fi
run_fb backward "$SRC/examples/graphs/small/conv_bias_relu_small.json" --out "$TMP/cbr_bwd.json" --verify
if [ "$RC" -ne 0 ] || [ "$(grep -c "verify: .*: PASS" "$TMP/stdout")" -ne 3 ]; then
  fail "backward --verify: conv_bias_relu_small" "exit 0 and three gradients (x, w, b) matching finite differences"
else pass "backward --verify: conv_bias_relu_small's three gradients match finite differences"
fi
EXPECT_RC=1 expect_bad "backward: a layernorm in the inference phase" \
  "\[layernorm 'ln'\]: no gradient: the inference phase saves no statistics: declare the outputs 'mean' and 'inv_variance'" \
  backward "$SRC/examples/graphs/small/layernorm_small.json" --out "$TMP/ln_bwd.json"
expect_bad "backward: --wrt names no input" "wrt 'nosuch' is not an input of the forward graph" \
  backward "$G" --out "$TMP/x.json" --wrt nosuch
cp "$G" "$TMP/same.json"
expect_bad "backward: --out is the forward graph" "--out '.*same.json' is the same file as the forward graph" \
  backward "$TMP/same.json" --out "$TMP/same.json"
if ! cmp -s "$G" "$TMP/same.json"; then FAIL=$((FAIL + 1)); echo "FAIL  backward: the forward graph was overwritten"; fi

run_fb pipeline backward "$SRC/examples/pipelines/two_convs.json" --out-dir "$TMP/tcb" --verify
if [ "$RC" -ne 0 ] || [ ! -s "$TMP/tcb/two_convs_bwd.json" ]; then
  fail "pipeline backward: two_convs" "exit 0 and the backward pipeline written"
elif [ "$(grep -c "verify: .*: PASS" "$TMP/stdout")" -ne 5 ]; then
  fail "pipeline backward --verify: two_convs" "five gradients (image, w1, b1, w2, b2) matching finite differences"
else
  run_fb pipeline check "$TMP/tcb/two_convs_bwd.json"
  if [ "$RC" -ne 0 ] || ! grep -q "image.grad *output" "$TMP/stdout"; then
    fail "pipeline backward: the backward pipeline checks" "pipeline check exit 0 with an output image.grad"
  else pass "pipeline backward: two_convs derived, written, and checks (image.grad an output)"
  fi
fi
expect_bad "pipeline backward: --wrt an intermediate" "wrt 'hidden' is not an input or constant buffer" \
  pipeline backward "$SRC/examples/pipelines/two_convs.json" --out-dir "$TMP/tcb2" --wrt hidden

expect_bad "train lm --profile without the gpu backend" "--profile .*needs --backend gpu" \
  train lm --config "$SRC/examples/train/lm_tiny.json" --data "$SRC/data/lm-ci" --steps 1 --out "$TMP/tp" --profile 3
if [ -e "$TMP/tp" ]; then fail "train lm --profile refused before anything is written" "$TMP/tp exists"
else pass "train lm --profile refused before anything is written"; fi

# ---------------------------------------------------------------- --help
for c in "" info devprop check build run reference engines tune cache pipeline "pipeline check" "pipeline build" "pipeline tune" "pipeline run" shapes model "model embed" backward "pipeline backward"; do
  # shellcheck disable=SC2086
  run_fb $c --help
  label="fusebox${c:+ $c} --help"
  why=$(crash_reason)
  if [ -n "$why" ]; then fail "$label" "$why"
  elif [ "$RC" -ne 0 ]; then fail "$label" "exit $RC"
  elif [ ! -s "$TMP/stdout" ]; then fail "$label" "nothing on stdout"
  else pass "$label"
  fi
done

echo "$PASS passed, $FAIL failed, $SKIPPED skipped"
[ "$FAIL" -eq 0 ]
