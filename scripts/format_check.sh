#!/usr/bin/env bash
# The format check (ctest `format_check`, so `make test` and CI run it): every
# tracked C, C++ and CUDA file must be as clang-format 14 writes it with
# .clang-format. 14 is Debian bookworm's clang-format, which scripts/setup.sh
# installs: other major versions format differently, so they are refused
# rather than trusted. `make format` formats the tree.
# Exit 0: formatted; 1: files differ (listed, with the first diff), or the
# wrong clang-format; 77 (ctest: skipped): not a git checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
want=14
cf=${CLANG_FORMAT:-clang-format}
if ! command -v "$cf" >/dev/null; then
  echo "format_check: $cf not found: scripts/setup.sh installs Debian's clang-format ($want)" >&2
  exit 1
fi
ver=$("$cf" --version | sed -n 's/.*version \([0-9]*\)\..*/\1/p')
if [ "$ver" != "$want" ]; then
  echo "format_check: $cf is version ${ver:-unknown}; the tree is formatted by clang-format $want (Debian's):" \
       "set CLANG_FORMAT to a clang-format $want" >&2
  exit 1
fi
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "format_check: not a git checkout, no list of tracked files: skipped"
  exit 77
fi
mapfile -t files < <(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh' '*.c')
bad=()
for f in "${files[@]}"; do
  "$cf" --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "format_check: ${#bad[@]} of ${#files[@]} files differ from clang-format $want (make format fixes them):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "first difference:" >&2
  "$cf" "${bad[0]}" | diff -u "${bad[0]}" - | head -30 >&2 || true
  exit 1
fi
echo "format_check: ${#files[@]} files as clang-format $want writes them"
