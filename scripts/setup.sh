#!/usr/bin/env bash
# Installs what fusebox needs on a fresh machine: Debian build packages that
# are missing, the pinned cuDNN Frontend headers (from its PyPI wheel) and the
# pinned cuDNN itself (headers and libraries, from its PyPI wheel, checked
# against its SHA-256), unpacked into third_party/ (git-ignored). Idempotent
# and quick when done.
set -euo pipefail
cd "$(dirname "$0")/.."

FRONTEND_VERSION=1.32.0
DEST=third_party/cudnn-frontend
# cuDNN: the newest version PyPI serves both as the full wheel (here: every
# engine, for deviceless builds) and as the JIT wheel (what the GPU machine can
# receive), so that both run one version (issue 35). The build input only: any
# cuDNN from 9.19 up is accepted at run time (docs/architecture.md, "cuDNN versions").
CUDNN_VERSION=9.27.0.42
CUDNN_WHEEL_SHA256=9677e76f21862eb5da7ee5ed69d544738b2d8b5c3ce7e5ec125c5592e6cdbdc8
CUDNN_DEST=third_party/cudnn

# Debian packages (only those missing; apt-get needs root, as on CI).
need=()
# clang-format: Debian bookworm's (14), the version the tree is formatted with (scripts/format_check.sh).
for p in cmake ninja-build g++ libgtest-dev libsqlite3-dev libcli11-dev libxxhash-dev unzip time pkg-config clang-format; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
# Graphviz (`dot`, for `fusebox check --dot` pictures: make docs) only when asked.
if [ -n "${FUSEBOX_GRAPHVIZ:-}" ]; then
  dpkg -s graphviz >/dev/null 2>&1 || need+=(graphviz)
fi
if ((${#need[@]})); then
  echo "setup: installing Debian packages: ${need[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

if [ "$(cat "$DEST/VERSION" 2>/dev/null)" != "$FRONTEND_VERSION" ]; then
  echo "setup: fetching nvidia-cudnn-frontend==$FRONTEND_VERSION headers"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --no-deps --only-binary=:all: "nvidia-cudnn-frontend==$FRONTEND_VERSION" -d "$tmp" \
    || python3 -m pip download -q --no-deps --no-binary=:all: "nvidia-cudnn-frontend==$FRONTEND_VERSION" -d "$tmp"
  rm -rf "$DEST"; mkdir -p "$DEST"
  f=$(ls "$tmp"/nvidia_cudnn_frontend-* | head -n1)
  case "$f" in
    *.whl) unzip -q "$f" 'include/*' -d "$DEST" ;;
    *.tar.gz) tar -xzf "$f" -C "$tmp" && cp -r "$tmp"/nvidia_cudnn_frontend-*/include "$DEST/" ;;
  esac
  test -f "$DEST/include/cudnn_frontend.h" || { echo "setup: cudnn_frontend.h missing after unpacking $f" >&2; exit 1; }
  echo "$FRONTEND_VERSION" > "$DEST/VERSION"
fi
if [ "$(cat "$CUDNN_DEST/VERSION" 2>/dev/null)" != "$CUDNN_VERSION" ]; then
  echo "setup: fetching nvidia-cudnn-cu13==$CUDNN_VERSION (537 MB wheel, checked by SHA-256)"
  ctmp=$(mktemp -d)
  trap 'rm -rf "$ctmp" "${tmp:-}"' EXIT
  echo "nvidia-cudnn-cu13==$CUDNN_VERSION --hash=sha256:$CUDNN_WHEEL_SHA256" > "$ctmp/requirements.txt"
  python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --require-hashes \
    -r "$ctmp/requirements.txt" -d "$ctmp"
  unzip -q "$ctmp"/nvidia_cudnn_cu13-*.whl 'nvidia/cudnn/include/*' 'nvidia/cudnn/lib/*' -d "$ctmp/unpacked"
  rm -f "$ctmp"/nvidia_cudnn_cu13-*.whl
  rm -rf "$CUDNN_DEST"; mkdir -p "$CUDNN_DEST"
  mv "$ctmp/unpacked/nvidia/cudnn/include" "$ctmp/unpacked/nvidia/cudnn/lib" "$CUDNN_DEST/"
  ln -s libcudnn.so.9 "$CUDNN_DEST/lib/libcudnn.so"  # the wheel has only the versioned names
  grep -q "define CUDNN_MINOR $(echo "$CUDNN_VERSION" | cut -d. -f2)\$" "$CUDNN_DEST/include/cudnn_version.h" \
    || { echo "setup: $CUDNN_DEST/include/cudnn_version.h is not cuDNN $CUDNN_VERSION" >&2; exit 1; }
  echo "$CUDNN_VERSION" > "$CUDNN_DEST/VERSION"
fi
# The Python tests (ctest's `python`): pytest and numpy, for the python3 on PATH;
# scikit-build-core for the wheel of the Python module (ctest `python_wheel`,
# `pip wheel .`). torch is not installed (several GB): the tests that need it skip.
# tokenizers, pinned, for the language model's data (fusebox_tools.models.lm_data, docs/lm-data.md).
# matplotlib, pinned, for the loss curves (fusebox_tools.models.lm_plot, `fusebox train lm`).
TOKENIZERS_VERSION=0.23.3
MATPLOTLIB_VERSION=3.11.2
if ! python3 -c "import pytest, numpy, scikit_build_core, tokenizers, matplotlib; assert tokenizers.__version__ == '$TOKENIZERS_VERSION'; assert matplotlib.__version__ == '$MATPLOTLIB_VERSION'" >/dev/null 2>&1; then
  echo "setup: installing pytest, numpy, scikit-build-core, tokenizers==$TOKENIZERS_VERSION and matplotlib==$MATPLOTLIB_VERSION (pip)"
  python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore pytest numpy scikit-build-core \
    "tokenizers==$TOKENIZERS_VERSION" "matplotlib==$MATPLOTLIB_VERSION"
fi
# Real model weights for docs/models.md, only when asked (never for make test):
# FUSEBOX_MODELS=minilm scripts/setup.sh (a comma-separated list).
MODELS=${FUSEBOX_MODELS:-}
for model in ${MODELS//,/ }; do
  case "$model" in
    minilm) bash scripts/fetch_minilm.sh ;;
    *) echo "setup: unknown model '$model' in FUSEBOX_MODELS (known: minilm)" >&2; exit 2 ;;
  esac
done
echo "setup: ok (cuDNN Frontend $FRONTEND_VERSION, cuDNN $CUDNN_VERSION)"
