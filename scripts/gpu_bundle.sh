#!/usr/bin/env bash
# Copies what the GPU machine needs from a build folder into .gpu/ (git-ignored):
# the CLI and the test binaries, nothing else (examples, scripts and the Python
# tools in python/ travel with the repository). Carry .gpu with the device tool and run scripts/gpu_check.sh there.
#   usage: [PACK=1] scripts/gpu_bundle.sh BUILD_DIR
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

BUILD_DIR=${1:-build}
DEST=.gpu

for required in fusebox fusebox_gpu_tests; do
  if [ ! -x "$BUILD_DIR/$required" ]; then
    echo "gpu_bundle: $BUILD_DIR/$required not found: build first (make build)" >&2
    exit 1
  fi
done

bash scripts/check_cuda_archs.sh "$BUILD_DIR" || exit 1

rm -rf "$DEST"
mkdir -p "$DEST"
cp "$BUILD_DIR/fusebox" "$BUILD_DIR/fusebox_gpu_tests" "$DEST/" || exit 1
for optional in fusebox_deviceless_tests bound_execute_bench; do
  if [ -x "$BUILD_DIR/$optional" ]; then
    cp "$BUILD_DIR/$optional" "$DEST/" || exit 1
  fi
done
# The C API test and the installed-package consumer (docs/c-api.md, README), with
# libfusebox.so under its soname: run them with LD_LIBRARY_PATH=.gpu. The Python
# module (python/fusebox, docs/python.md) loads the same file (FUSEBOX_LIBRARY).
if [ -x "$BUILD_DIR/fusebox_capi_test" ] && [ -e "$BUILD_DIR/libfusebox.so" ]; then
  cp "$BUILD_DIR/fusebox_capi_test" "$DEST/" || exit 1
  soname=$(objdump -p "$BUILD_DIR/libfusebox.so" | awk '/SONAME/ {print $2}')
  cp -L "$BUILD_DIR/libfusebox.so" "$DEST/${soname:-libfusebox.so}" || exit 1
  prefix=$(mktemp -d)
  if cmake --install "$BUILD_DIR" --prefix "$prefix/p" >/dev/null &&
     cmake -S examples/consumer -B "$prefix/c" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix/p" >/dev/null &&
     cmake --build "$prefix/c" >/dev/null; then
    cp "$prefix/c/consumer" "$DEST/" || exit 1
    echo "gpu_bundle: built examples/consumer against an installed prefix"
  else
    echo "gpu_bundle: examples/consumer did not build (ctest package_consumer says why)" >&2
  fi
  rm -rf "$prefix"
fi
# Smaller to carry (the device tool takes 64 MiB in all); keeps the originals intact.
if command -v strip >/dev/null 2>&1; then
  strip --strip-debug "$DEST"/* 2>/dev/null || true
fi
# Plans compiled ahead of time here, on the machine without a GPU, for the
# GPU to run (scripts/gpu_check.sh, section cpu_built_plans). Graphs cuDNN
# cannot build without a driver are skipped.
mkdir -p "$DEST/aot"
for g in examples/graphs/*.json examples/graphs/small/*.json; do
  case "$(basename "$g")" in invalid_*) continue ;; esac
  name=$(basename "$g" .json)
  if "$BUILD_DIR/fusebox" build "$g" --device devices/h200-cudnn-9.27.devprop --plan-out "$DEST/aot/$name.plan" \
      --cache "$DEST/aot/cache.sqlite" >/dev/null 2>&1; then
    echo "gpu_bundle: built $name.plan here (deviceless)"
  fi
done
# The cuDNN they were built with: on a GPU machine with another version, gpu_check.sh
# expects them refused (a plan or cache entry is never served to another cuDNN version).
"$BUILD_DIR/fusebox" info --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["cudnn_runtime"])' \
  > "$DEST/aot/CUDNN_VERSION" || true
# The same cache exported as a file to import on the GPU machine (section cache_migration).
if [ -f "$DEST/aot/cache.sqlite" ]; then
  "$BUILD_DIR/fusebox" cache export "$DEST/aot/export.sqlite" --cache "$DEST/aot/cache.sqlite" || exit 1
fi
# The binary from before the canonical form (issue 9), if built: FUSEBOX_OLD_BIN=path.
if [ -n "${FUSEBOX_OLD_BIN:-}" ] && [ -x "$FUSEBOX_OLD_BIN" ]; then
  mkdir -p "$DEST/old" && cp "$FUSEBOX_OLD_BIN" "$DEST/old/fusebox" || exit 1
fi
# PACK=1: the binaries xz-compressed and the plans in one archive (about 22 MB with sm_80 and sm_90 code), so the
# bundle fits one carry beside .gpu-train (scripts/gpu_train_bundle.sh); the scripts that read .gpu
# unpack it there first (scripts/gpu_unpack.sh). The deviceless tests and the bench binary stay
# behind (they run here).
if [ "${PACK:-0}" = 1 ]; then
  rm -f "$DEST/fusebox_deviceless_tests" "$DEST/bound_execute_bench"
  for f in fusebox fusebox_gpu_tests "$DEST"/libfusebox.so*; do
    f=$(basename "$f")
    [ -f "$DEST/$f" ] && { xz -T2 -6 -c "$DEST/$f" > "$DEST/$f.xz" && rm "$DEST/$f" || exit 1; }
  done
  tar -C "$DEST" -czf "$DEST/aot.tgz" aot && rm -rf "$DEST/aot" || exit 1
fi
ls -l "$DEST"
echo "gpu_bundle: $(du -sh "$DEST" | cut -f1) in $DEST ($(du -sb "$DEST" | cut -f1) bytes; the carry limit is 64 MiB)"
