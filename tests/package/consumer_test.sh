#!/usr/bin/env bash
# The installed package from a consumer's side (ctest package_consumer):
# installs this build into a fresh prefix, builds examples/consumer against
# it with find_package(fusebox) and again with pkg-config, runs both
# (deviceless plan build; a checked GPU run when there is a GPU), and checks
# that nothing private reaches the consumer: no frontend/nlohmann/src include
# path in its compile commands, no private header installed, no private
# symbol exported by libfusebox.so.
#   usage: consumer_test.sh BUILD_DIR SOURCE_DIR FRONTEND_INCLUDE_DIR CXX CUDA_INCLUDE_DIR CUDA_LIBRARY_DIR
set -euo pipefail
BUILD=$1 SRC=$2 FRONTEND=$3 CXX=$4 CUDA_INC=$5 CUDA_LIB=$6
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
PREFIX=$TMP/prefix
fail() { echo "FAIL: $*" >&2; exit 1; }

echo "== cmake --install $BUILD --prefix <fresh prefix>"
cmake --install "$BUILD" --prefix "$PREFIX" >"$TMP/install.log" || { cat "$TMP/install.log"; fail "install"; }
LIB=$(find "$PREFIX" -name 'libfusebox.so' | head -1)
[ -n "$LIB" ] || fail "no libfusebox.so installed"
LIBDIR=$(dirname "$LIB")
for f in include/fusebox/fusebox.h include/fusebox/session.h include/fusebox/graph.h include/fusebox/ops/conv.h \
         bin/fusebox share/fusebox/devices/h200-cudnn-9.27.devprop share/fusebox/python/fusebox_tools/models/minilm_embed.py; do
  [ -e "$PREFIX/$f" ] || fail "$f not installed"
done
for f in cmake/fusebox/fuseboxConfig.cmake cmake/fusebox/fuseboxConfigVersion.cmake cmake/fusebox/fuseboxTargets.cmake \
         pkgconfig/fusebox.pc; do
  [ -e "$LIBDIR/$f" ] || fail "$f not installed in $LIBDIR"
done
# Only the public headers: nothing of the frontend, nlohmann or a layer's private folder.
if find "$PREFIX" \( -name 'cudnn_frontend*' -o -name 'json.hpp' -o -name 'sqlite3.h' -o -name 'xxhash.h' \
     -o -path '*/common/*.h' -o -name '*.a' \) | grep .; then
  fail "private files installed (above)"
fi
# libfusebox exports fusebox's API only (src/package/fusebox.map).
# Every exported symbol is fusebox's own: none of the frontend, nlohmann, SQLite or xxhash.
nm -D --defined-only "$LIBDIR/libfusebox.so" | c++filt | sed -E 's/^[0-9a-f]+ [A-Za-z] //' >"$TMP/symbols.txt"
if grep -v -E '^(fusebox::|fusebox_|(typeinfo|typeinfo name|vtable) for fusebox::)' "$TMP/symbols.txt" | head -5 | grep .; then
  fail "libfusebox.so exports symbols that are not fusebox's (above)"
fi
grep -q '^fusebox_execute$' "$TMP/symbols.txt" || fail "the C API is not exported"
grep -q 'fusebox::Session::create' "$TMP/symbols.txt" || fail "the C++ API is not exported"
echo "installed: $(cd "$PREFIX" && find . -type f | wc -l) files; libfusebox.so exports $(wc -l <"$TMP/symbols.txt") symbols"
"$PREFIX/bin/fusebox" check "$SRC/examples/graphs/conv_bias_relu.json" | head -1
# `fusebox model embed` finds its Python runner in the prefix (share/fusebox/python), not in the source tree.
if python3 -c 'import numpy' 2>/dev/null; then
  (cd "$TMP" && env -u FUSEBOX_PYTHONPATH -u PYTHONPATH "$PREFIX/bin/fusebox" model embed --runner-help) \
    >"$TMP/embed_help.txt" 2>&1 || { cat "$TMP/embed_help.txt"; fail "the installed fusebox model embed"; }
  grep -q -- "--no-fusebox" "$TMP/embed_help.txt" || fail "the installed fusebox model embed: no runner help"
  echo "installed fusebox model embed: runs share/fusebox/python/fusebox_tools/models/minilm_embed.py"
fi

echo "== examples/consumer with find_package(fusebox)"
cmake -S "$SRC/examples/consumer" -B "$TMP/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER="$CXX" -DCMAKE_PREFIX_PATH="$PREFIX" >"$TMP/configure.log" \
  || { cat "$TMP/configure.log"; fail "consumer configure"; }
cmake --build "$TMP/consumer" >"$TMP/build.log" 2>&1 || { cat "$TMP/build.log"; fail "consumer build"; }
CC_JSON=$TMP/consumer/compile_commands.json
[ -f "$CC_JSON" ] || fail "no compile_commands.json"
grep '"command"' "$CC_JSON"
FRONTEND_REAL=$(realpath "$FRONTEND")
for private in "$FRONTEND" "$FRONTEND_REAL" cudnn-frontend cudnn_frontend thirdparty "$SRC/src" "$SRC/include" \
               "$SRC/third_party"; do
  if grep -F -e "$private" "$CC_JSON" >/dev/null; then fail "the consumer's compile commands contain '$private'"; fi
done
grep -F -e "-isystem $PREFIX/include" -e "-I$PREFIX/include" "$CC_JSON" >/dev/null \
  || fail "the consumer does not compile against the installed headers"
"$TMP/consumer/consumer" | tee "$TMP/run.log"
grep -q "^deviceless plan for NVIDIA H200: built now, engine eng" "$TMP/run.log" || fail "no deviceless plan"
grep -q "^consumer: ok" "$TMP/run.log" || fail "consumer did not finish"
# The training loop against the installed library (examples/consumer/train_lm.cpp): 3 steps of
# the tiny model on the CPU reference backend, a checkpoint, then a resume to step 4.
if python3 -c 'import numpy' 2>/dev/null; then
  python3 -c "import numpy as np; np.save('$TMP/tokens.npy', (np.arange(5000) * 7 % 512).astype(np.uint16))"
  "$TMP/consumer/train_lm" "$SRC/examples/train/lm_tiny.json" "$TMP/tokens.npy" 3 "$TMP/train" | tee "$TMP/train.log"
  grep -q "^step    2  loss" "$TMP/train.log" || fail "train_lm did not take 3 steps"
  "$TMP/consumer/train_lm" "$SRC/examples/train/lm_tiny.json" "$TMP/tokens.npy" 4 "$TMP/train" "$TMP/tokens.npy" \
    | tee "$TMP/train2.log"
  grep -q "^resumed at step 3" "$TMP/train2.log" || fail "train_lm did not resume"
  grep -q "^validation loss" "$TMP/train2.log" || fail "train_lm did not validate"
fi

echo "== examples/consumer with pkg-config"
export PKG_CONFIG_PATH=$LIBDIR/pkgconfig
echo "pkg-config --cflags --libs fusebox: $(pkg-config --cflags --libs fusebox) (version $(pkg-config --modversion fusebox))"
# shellcheck disable=SC2046
"$CXX" -std=c++20 $(pkg-config --cflags fusebox) -isystem "$CUDA_INC" \
  -DFUSEBOX_DEVICES_DIR="\"$PREFIX/share/fusebox/devices\"" "$SRC/examples/consumer/main.cpp" \
  -o "$TMP/consumer_pc" $(pkg-config --libs fusebox) -L"$CUDA_LIB" -lcudart || fail "pkg-config C++ build"
LD_LIBRARY_PATH=$LIBDIR "$TMP/consumer_pc" >"$TMP/run_pc.log" || { cat "$TMP/run_pc.log"; fail "pkg-config consumer run"; }
grep "^deviceless plan\|^consumer:" "$TMP/run_pc.log"
# The C header alone, as C99 with every warning an error.
cat >"$TMP/version.c" <<'C'
#include <stdio.h>
#include <fusebox/fusebox.h>
int main(void) {
  printf("C: fusebox %s, C API %d\n", fusebox_version(), fusebox_c_api_version());
  return fusebox_c_api_version() == FUSEBOX_C_API_VERSION ? 0 : 1;
}
C
# shellcheck disable=SC2046
cc -std=c99 -Wall -Wextra -Werror -pedantic $(pkg-config --cflags fusebox) "$TMP/version.c" -o "$TMP/version_c" \
  $(pkg-config --libs fusebox) || fail "pkg-config C build"
LD_LIBRARY_PATH=$LIBDIR "$TMP/version_c" || fail "C program"
echo "package_consumer: ok"
