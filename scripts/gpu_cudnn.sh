#!/usr/bin/env bash
# On the GPU machine: a second cuDNN (the pinned one fusebox builds against)
# beside torch's 9.19, kept outside the repository between calls while the
# machine is held. Files come from scripts/cudnn_gpu_parts.sh, one per call:
#   bash scripts/gpu_cudnn.sh receive .gpu-cudnn/jit.tar.xz      (the JIT set: enough to run)
#   bash scripts/gpu_cudnn.sh receive .gpu-cudnn/full.tar.xz.00  (then .01, ...: the full set)
#   bash scripts/gpu_cudnn.sh status                             (what is there)
# Every call carries .gpu-cudnn/MANIFEST too (it is small): each file is checked
# against its SHA-256. Then `source scripts/gpu_cudnn.sh env` puts it first on
# LD_LIBRARY_PATH (with torch's cuBLAS(Lt) and NVRTC).
set -uo pipefail
ROOT=${FUSEBOX_GPU_CUDNN_DIR:-/tmp/fusebox-cudnn}
TORCH_CU=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
CUDA_LIB=/usr/local/cuda-13.0/targets/x86_64-linux/lib
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
manifest="$here/.gpu-cudnn/MANIFEST"

status() {
  echo "gpu_cudnn: $ROOT: $(ls "$ROOT/lib" 2>/dev/null | tr '\n' ' ')"
  [ -f "$ROOT/VERSION" ] && echo "gpu_cudnn: version $(cat "$ROOT/VERSION")"
  ls "$ROOT/parts" 2>/dev/null | sed 's/^/gpu_cudnn: part /'
}

case "${1:-}" in
  receive)
    f=${2:?usage: gpu_cudnn.sh receive FILE}
    [ -f "$f" ] || { echo "gpu_cudnn: $f not carried" >&2; exit 2; }
    [ -f "$manifest" ] || { echo "gpu_cudnn: $manifest not carried" >&2; exit 2; }
    want=$(awk -v n="$(basename "$f")" '$2 == n {print $1}' "$manifest")
    got=$(sha256sum "$f" | cut -d' ' -f1)
    [ -n "$want" ] && [ "$want" = "$got" ] || { echo "gpu_cudnn: $f does not match MANIFEST" >&2; exit 2; }
    mkdir -p "$ROOT/lib" "$ROOT/parts"
    awk '$1 == "version" {print $2}' "$manifest" > "$ROOT/VERSION"
    case "$(basename "$f")" in
      jit.tar.xz) tar -C "$ROOT/lib" -xJf "$f" || exit 1 ;;
      full.tar.xz.*)
        cp "$f" "$ROOT/parts/" || exit 1
        need=$(awk '$2 ~ /^full.tar.xz./' "$manifest" | wc -l)
        have=$(ls "$ROOT/parts" | wc -l)
        if [ "$have" -eq "$need" ]; then
          cat "$ROOT"/parts/full.tar.xz.* | tar -C "$ROOT/lib" -xJf - || exit 1
          rm -rf "$ROOT/parts"
          echo "gpu_cudnn: the full set is unpacked"
        else
          echo "gpu_cudnn: $have of $need parts of the full set here"
        fi ;;
      *) echo "gpu_cudnn: unknown file $f" >&2; exit 2 ;;
    esac
    status ;;
  status) status ;;
  env)
    if [ ! -f "$ROOT/lib/libcudnn.so.9" ]; then
      echo "gpu_cudnn: no cuDNN in $ROOT (a fresh machine): receive jit.tar.xz first" >&2
      return 1 2>/dev/null || exit 1
    fi
    export LD_LIBRARY_PATH="$ROOT/lib:$TORCH_CU:$CUDA_LIB"
    echo "gpu_cudnn: LD_LIBRARY_PATH=$LD_LIBRARY_PATH" ;;
  *) echo "usage: gpu_cudnn.sh receive FILE | status | env" >&2; exit 2 ;;
esac
