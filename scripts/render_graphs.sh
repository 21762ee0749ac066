#!/usr/bin/env bash
# Renders `fusebox check --dot` of each top-level example graph, and `fusebox
# build --dot` (deviceless for the H200: the engine and its workspace) of
# conv_bias_relu, to docs/images/*.svg with Graphviz's dot (make docs).
#   usage: scripts/render_graphs.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
FB=${1:-build}/fusebox
command -v dot >/dev/null || { echo "render_graphs: Graphviz 'dot' not found: FUSEBOX_GRAPHVIZ=1 scripts/setup.sh" >&2; exit 1; }
mkdir -p docs/images
for g in examples/graphs/*.json; do
  case "$(basename "$g")" in invalid_*) continue ;; esac
  name=$(basename "$g" .json)
  "$FB" check "$g" --dot | dot -Tsvg -o "docs/images/$name.svg"
  echo "render_graphs: docs/images/$name.svg"
done
"$FB" build examples/graphs/conv_bias_relu.json --device devices/h200-cudnn-9.27.devprop --no-cache --dot \
  | dot -Tsvg -o docs/images/conv_bias_relu_built.svg
echo "render_graphs: docs/images/conv_bias_relu_built.svg"
