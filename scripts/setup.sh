#!/usr/bin/env bash
# Installs what fusebox needs on a fresh machine: Debian build packages that
# are missing, and the pinned cuDNN Frontend headers (from its PyPI wheel)
# unpacked into third_party/ (git-ignored). Idempotent and quick when done.
set -euo pipefail
cd "$(dirname "$0")/.."

FRONTEND_VERSION=1.32.0
DEST=third_party/cudnn-frontend

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
# The Python tests (ctest's `python`): pytest and numpy, for the python3 on PATH;
# scikit-build-core for the wheel of the Python module (ctest `python_wheel`,
# `pip wheel .`). torch is not installed (several GB): the tests that need it skip.
if ! python3 -c 'import pytest, numpy, scikit_build_core' >/dev/null 2>&1; then
  echo "setup: installing pytest, numpy and scikit-build-core (pip)"
  python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore pytest numpy scikit-build-core
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
test -f /usr/local/cuda/include/cudnn.h || { echo "setup: cuDNN headers not found in /usr/local/cuda/include" >&2; exit 1; }
echo "setup: ok (cuDNN Frontend $FRONTEND_VERSION)"
