#!/usr/bin/env bash
# A slim carry for the training runs on the GPU machine (scripts/gpu_train_lm.sh, docs/gpu.md):
# the CLI and the GPU tests xz-compressed, the data folders data/lm (scripts/fetch_lm_data.sh,
# 16 MB, 6 MB compressed) and data/lm-ci (the docs at vocabulary 512) as tar.xz, in .gpu-train/
# (git-ignored); with the repository it stays under the device tool's 64 MiB.
#   usage: scripts/gpu_train_bundle.sh [BUILD_DIR]    then run(..., carry=[".gpu-train"])
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}
DEST=.gpu-train
for f in fusebox fusebox_gpu_tests; do
  [ -x "$BUILD_DIR/$f" ] || { echo "gpu_train_bundle: $BUILD_DIR/$f not found: build first" >&2; exit 1; }
done
bash scripts/check_cuda_archs.sh "$BUILD_DIR"
[ -f data/lm/train.npy ] || { echo "gpu_train_bundle: data/lm missing: run scripts/fetch_lm_data.sh" >&2; exit 1; }
if [ ! -f data/lm-ci/train.npy ]; then
  PYTHONPATH=python python3 -m fusebox_tools.models.lm_data prepare --text docs/*.md --vocab 512 --out data/lm-ci
fi
rm -rf "$DEST"
mkdir -p "$DEST"
for f in fusebox fusebox_gpu_tests; do xz -T2 -6 -c "$BUILD_DIR/$f" > "$DEST/$f.xz"; done
tar -C data -cJf "$DEST/lm.tar.xz" lm
tar -C data -cJf "$DEST/lm-ci.tar.xz" lm-ci
du -sh "$DEST"/*
echo "gpu_train_bundle: $(du -sh "$DEST" | cut -f1) in $DEST"
