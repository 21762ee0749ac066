#!/usr/bin/env bash
# On the GPU machine: unpacks a bundle that scripts/gpu_bundle.sh packed (PACK=1: the binaries
# xz-compressed, the ahead-of-time plans in aot.tgz, about 15 MB instead of 60), in place, once.
# The scripts that read .gpu call it first; a bundle that is not packed is left as it is.
#   usage: scripts/gpu_unpack.sh [BUNDLE_DIR]      (default .gpu)
set -uo pipefail
BUNDLE=${1:-.gpu}
[ -d "$BUNDLE" ] || { echo "gpu_unpack: no bundle folder $BUNDLE: scripts/gpu_bundle.sh first" >&2; exit 1; }
# Only where a GPU is: unpacked here, the bundle (about 80 MB) would no longer fit the carry.
if ! nvidia-smi -L > /dev/null 2>&1; then
  echo "gpu_unpack: no GPU here: $BUNDLE left packed" >&2
  exit 0
fi
for z in "$BUNDLE"/*.xz; do
  [ -f "$z" ] || continue
  f=${z%.xz}
  [ -s "$f" ] && [ "$f" -nt "$z" ] && continue  # unpacked by an earlier call on this machine
  xz -dc "$z" > "$f.tmp" && chmod +x "$f.tmp" && mv "$f.tmp" "$f" || { echo "gpu_unpack: $z did not unpack" >&2; exit 1; }
done
if [ -f "$BUNDLE/aot.tgz" ] && [ ! -d "$BUNDLE/aot" ]; then
  tar -C "$BUNDLE" -xzf "$BUNDLE/aot.tgz" || { echo "gpu_unpack: $BUNDLE/aot.tgz did not unpack" >&2; exit 1; }
fi
exit 0
