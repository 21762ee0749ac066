#!/usr/bin/env bash
# fusebox across cuDNN versions, no GPU needed (ctest's cli_cudnn_versions):
#   tests/cli/cudnn_versions.sh FUSEBOX_BIN SOURCE_DIR OTHER_CUDNN_LIB_DIR
# fusebox is built against the pinned cuDNN (third_party/cudnn, 9.27) and must
# run on any cuDNN from 9.19 up (issue 35). OTHER_CUDNN_LIB_DIR holds another
# cuDNN 9 (this machine's 9.19 in /usr/local/cuda/lib64), put first on
# LD_LIBRARY_PATH. Checks: the version floor and the feature table in `info`;
# a deviceless build on either; a plan-cache entry written under one version is
# never served under the other. Skips (exit 0, saying so) when the other folder
# holds no cuDNN or the same version.
# Ends with the line "N passed, M failed" and exits 1 if M > 0.
set -uo pipefail
if [ $# -ne 3 ]; then
  echo "usage: $0 FUSEBOX_BIN SOURCE_DIR OTHER_CUDNN_LIB_DIR" >&2
  exit 2
fi
FB=$1
SRC=$2
OTHER=$3
DEVPROP="$SRC/devices/h200-cudnn-9.27.devprop"
OLD_DEVPROP="$SRC/devices/h200-cudnn-9.19.devprop"
GRAPH="$SRC/examples/graphs/small/conv_bias_relu_small.json"
PY=python3
TMP=$(mktemp -d "${TMPDIR:-/tmp}/fusebox_versions.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
export FUSEBOX_CACHE="$TMP/default-cache.sqlite"
PASS=0
FAIL=0
pass() { PASS=$((PASS + 1)); echo "PASS  $1"; }
fail() {
  FAIL=$((FAIL + 1))
  echo "FAIL  $1: $2"
  sed -n '1,8s/^/      stderr| /p' "$TMP/stderr"
  sed -n '1,4s/^/      stdout| /p' "$TMP/stdout"
}
# on DIR ARGS...: run fusebox with DIR first on LD_LIBRARY_PATH ("" = the build's own cuDNN).
on() {
  local dir=$1
  shift
  if [ -n "$dir" ]; then
    LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$FB" "$@" >"$TMP/stdout" 2>"$TMP/stderr"
  else
    "$FB" "$@" >"$TMP/stdout" 2>"$TMP/stderr"
  fi
  RC=$?
}
# check NAME EXPR [ARGS...]: stdout is JSON d and EXPR holds.
check() {
  local name=$1
  shift
  if "$PY" - "$TMP/stdout" "$@" <<'PYEOF' 2>"$TMP/why"; then pass "$name"; else fail "$name" "$(cat "$TMP/why")"; fi
import json, sys
d = json.load(open(sys.argv[1]))
expr, args = sys.argv[2], sys.argv[3:]
if not eval(expr):
    sys.exit("expected " + expr + " with args " + repr(args) + "; got " + json.dumps(d)[:600])
PYEOF
}
feature() {  # the JSON expression for feature $1's state
  echo "{f['name']: f for f in d['cudnn_features']}['$1']"
}

# ---- the build's own cuDNN (the pinned wheel)
on "" info --json
BUILT=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["cudnn_runtime"])' "$TMP/stdout" 2>/dev/null)
check "info: built against and running the pinned cuDNN; floor 9.19.0" \
  'd["cudnn_runtime_ok"] and d["cudnn_headers"] == d["cudnn_runtime"] and d["cudnn_min_runtime"] == "9.19.0"'
check "info: every feature of the pinned cuDNN (9.27) is compiled in and active" \
  'all(f["compiled"] and f["loaded"] and f["active"] for f in d["cudnn_features"]) and '"$(feature rope)"'["min_cudnn"] == "9.24.0"'
check "info: libcuda.so.1 is the driver or, with no driver, the toolkit's stub (cuDNN 9.27 needs it to load)" \
  'd["cuda_driver_library"] == "libcuda.so.1" or "stub" in d["cuda_driver_library"]'
on "" build "$GRAPH" --device "$DEVPROP" --cache "$TMP/plans.sqlite" --json
check "build on the pinned cuDNN: a miss that stores" 'd["ok"] and d["cache"] == "miss"'
on "" build "$GRAPH" --device "$DEVPROP" --cache "$TMP/plans.sqlite" --json
check "build on the pinned cuDNN again: a hit" 'd["cache"] == "hit"'
KEY_NEW=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["cache_key"])' "$TMP/stdout" 2>/dev/null)
on "" build "$GRAPH" --device "$OLD_DEVPROP" --no-cache
if [ "$RC" -eq 2 ] && grep -qi "lacks .*smCountOrigin.*capture it again with \`fusebox devprop\`" "$TMP/stderr"; then
  pass "a device file captured under 9.19 on cuDNN 9.27: exit 2 naming the missing keys and the fix"
else fail "a device file captured under 9.19 on cuDNN 9.27" "exit 2 naming smCountOrigin and fusebox devprop expected, got $RC"
fi


# ---- the pinned cuDNN's runtime-compiled set alone (the nvidia-cudnn-jit wheel; the GPU machine's
# second cuDNN, scripts/gpu_cudnn.sh): no precompiled engines, so nothing builds deviceless and a
# deviceless-built plan does not load; both say why.
on "" info --json
check "info: the pinned cuDNN has its precompiled and runtime-compiled engines" \
  'd["cudnn_engine_libraries"] == {"precompiled": True, "runtime_compiled": True}'
PINNED_DIR=$(dirname "$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["cudnn_library"])' "$TMP/stdout")")
mkdir -p "$TMP/jit"
for f in libcudnn.so.9 libcudnn_graph.so.9 libcudnn_engines_runtime_compiled.so.9; do ln -s "$PINNED_DIR/$f" "$TMP/jit/$f"; done
on "$TMP/jit" info --json
check "info on the runtime-compiled set alone: precompiled engines absent" \
  'd["cudnn_engine_libraries"] == {"precompiled": False, "runtime_compiled": True} and d["cudnn_runtime"] == args[0]' "$BUILT"
on "$TMP/jit" build "$GRAPH" --device "$DEVPROP" --no-cache
if [ "$RC" -ne 0 ] && grep -q "has no libcudnn_engines_precompiled.so.9 (a runtime-compiled-only set" "$TMP/stderr"; then
  pass "a deviceless build on the runtime-compiled set alone fails, naming the missing library"
else fail "a deviceless build on the runtime-compiled set alone" "a non-zero exit naming libcudnn_engines_precompiled expected, got $RC"
fi

# ---- another cuDNN (this machine's 9.19)
OTHER_VERSION=""
if ls "$OTHER"/libcudnn.so.9* >/dev/null 2>&1; then
  on "$OTHER" info --json
  OTHER_VERSION=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["cudnn_runtime"])' "$TMP/stdout" 2>/dev/null)
fi
if [ -z "$OTHER_VERSION" ] || [ "$OTHER_VERSION" = "$BUILT" ]; then
  echo "SKIP  the cross-version checks: no cuDNN other than $BUILT in $OTHER"
else
  check "info on cuDNN $OTHER_VERSION: accepted (>= 9.19), headers still $BUILT" \
    'd["cudnn_runtime_ok"] and d["cudnn_runtime"] == args[0] and d["cudnn_headers"] == args[1]' "$OTHER_VERSION" "$BUILT"
  check "info on cuDNN $OTHER_VERSION: rope compiled in but off (the loaded cuDNN is older than 9.24)" \
    'not '"$(feature rope)"'["loaded"] and not '"$(feature rope)"'["active"] and '"$(feature rope)"'["compiled"]'
  on "$OTHER" build "$GRAPH" --device "$DEVPROP" --cache "$TMP/plans.sqlite" --json
  check "cache across versions: the $BUILT entry is not served on $OTHER_VERSION (a miss, another key)" \
    'd["ok"] and d["cache"] == "miss" and d["cache_key"] != args[0]' "$KEY_NEW"
  on "$OTHER" build "$GRAPH" --device "$OLD_DEVPROP" --no-cache --json
  check "cuDNN $OTHER_VERSION builds from the device file captured under 9.19" 'd["ok"]'
  on "" build "$GRAPH" --device "$DEVPROP" --cache "$TMP/plans.sqlite" --json
  check "cache across versions: back on $BUILT, its own entry hits" \
    'd["cache"] == "hit" and d["cache_key"] == args[0]' "$KEY_NEW"
  on "$OTHER" cache ls --cache "$TMP/plans.sqlite" --json
  check "the cache holds one entry per cuDNN version" 'len(d["entries"]) == 2'
  # Programs link libfusebox.so against whatever libcudnn.so.9 they find: every cuDNN entry point
  # it needs strongly must be one the older cuDNN exports (newer ones are weak: src/cudnn/frontend.h).
  LIB="$(dirname "$FB")/libfusebox.so"
  if [ -e "$LIB" ] && command -v nm >/dev/null; then
    missing=$(comm -23 <(nm -D --undefined-only "$LIB" | awk '$1 == "U" && $2 ~ /^cudnn/ {sub(/@.*/, "", $2); print $2}' | sort -u) \
                       <(nm -D --defined-only "$OTHER"/libcudnn.so.9 | awk '{sub(/@.*/, "", $3); print $3}' | sort -u))
    if [ -z "$missing" ]; then pass "libfusebox.so needs no cuDNN entry point that $OTHER_VERSION lacks (newer ones are weak)"
    else FAIL=$((FAIL + 1)); echo "FAIL  libfusebox.so needs cuDNN entry points $OTHER_VERSION lacks: $missing"
    fi
  fi
fi
echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
