#!/usr/bin/env bash
# Packs the pinned cuDNN (third_party/cudnn/lib, from scripts/setup.sh) for the
# GPU machine, which has only torch's cuDNN 9.19 and takes 64 MiB per carry
# (docs/gpu.md, "A second cuDNN on the GPU machine"). Writes, git-ignored:
#   .gpu-cudnn/jit.tar.xz         the JIT set: libcudnn, libcudnn_graph and the
#                                 runtime-compiled engines (about 55 MB; the same
#                                 files as the nvidia-cudnn-jit-cu13 wheel of this version)
#   .gpu-cudnn/full.tar.xz.NN     the other libraries (precompiled engines,
#                                 heuristics, ...), split into parts of 50 MiB (each part and the tree fit one 64 MiB carry)
#   .gpu-cudnn/MANIFEST           the version, the part names and their SHA-256
# Then, one call per file: run(command="bash scripts/gpu_cudnn.sh receive .gpu-cudnn/FILE",
# carry=[".gpu-cudnn/FILE"]); see scripts/gpu_cudnn.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=third_party/cudnn
DEST=.gpu-cudnn
test -f "$SRC/VERSION" || { echo "cudnn_gpu_parts: $SRC missing: run scripts/setup.sh" >&2; exit 1; }
rm -rf "$DEST"
mkdir -p "$DEST"
jit=(libcudnn.so.9 libcudnn_graph.so.9 libcudnn_engines_runtime_compiled.so.9)
rest=()
for f in "$SRC"/lib/*.so.9; do
  b=$(basename "$f")
  [[ " ${jit[*]} " == *" $b "* ]] || rest+=("$b")
done
tar -C "$SRC/lib" -cf - "${jit[@]}" | xz -6 -T0 > "$DEST/jit.tar.xz"
tar -C "$SRC/lib" -cf - "${rest[@]}" | xz -6 -T0 | split -b 50M -d - "$DEST/full.tar.xz."
{
  echo "version $(cat "$SRC/VERSION")"
  (cd "$DEST" && sha256sum jit.tar.xz full.tar.xz.*)
} > "$DEST/MANIFEST"
ls -la "$DEST"
