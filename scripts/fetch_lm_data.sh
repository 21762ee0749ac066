#!/usr/bin/env bash
# Makes the language model's data folder (docs/lm-data.md, docs/lm.md "Data files") from
# English text that Debian ships: the Linux kernel's documentation, package
# linux-doc-6.1 pinned by version and checked against its sha256, unpacked into a
# temporary folder (dpkg-deb -x, nothing installed), its HTML pages turned into one
# plain-text corpus, then tokenized by fusebox_tools.models.lm_data prepare.
# Never run by `make test`.
#   usage: scripts/fetch_lm_data.sh [DEST] [VOCAB]     (default data/lm 16384; data/ is git-ignored)
#   LM_DATA_DEB=path/to/linux-doc-6.1_6.1.192-3_all.deb uses a saved copy of the package
#   (still checked) where Debian no longer serves this version.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGE=linux-doc-6.1
VERSION=6.1.192-3
SHA256=f18dfe28dcab7bdbf9185be16b9521f5841277a6a96c374a6683a648d5d5fa4f
DEB=${PACKAGE}_${VERSION}_all.deb
# The corpus this package gave with Python 3.11 (a different one is reported, not refused).
CORPUS_SHA256=2b7cfb158311b568124adc8b4a89d7798d5d667c415089ca72e663fffebcd4eb
MIN_CORPUS_BYTES=$((20 * 1000 * 1000))
HTML=usr/share/doc/$PACKAGE/html
# Left out: the translations (not English), Sphinx's own pages and folders (_sources, _static...).
EXCLUDE=('translations/*' '_*' 'genindex*' 'search.html' 'py-modindex*')
DEST=${1:-data/lm}
VOCAB=${2:-16384}
export PYTHONPATH=python
start=$SECONDS

if [ -f "$DEST/data.json" ] && python3 - "$DEST/data.json" "$SHA256" "$VOCAB" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
sys.exit(0 if (d.get("source") or {}).get("sha256") == sys.argv[2] and d.get("vocab") == int(sys.argv[3]) else 1)
PY
then
  echo "fetch_lm_data: $DEST already holds $PACKAGE $VERSION at vocab $VOCAB"
  exit 0
fi
python3 -c 'import tokenizers, numpy' 2>/dev/null \
  || { echo "fetch_lm_data: python3 needs tokenizers and numpy: run scripts/setup.sh" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -n "${LM_DATA_DEB:-}" ]; then
  cp "$LM_DATA_DEB" "$tmp/$DEB"
else
  if ! apt-cache madison "$PACKAGE" 2>/dev/null | awk '{print $3}' | grep -x -- "$VERSION" >/dev/null; then
    echo "fetch_lm_data: apt does not list $PACKAGE $VERSION: apt-get update"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
  fi
  echo "fetch_lm_data: downloading $PACKAGE=$VERSION (37 MB)"
  if ! (cd "$tmp" && apt-get download -qq "$PACKAGE=$VERSION" 2>&1 | grep -v 'unsandboxed as root' >&2; \
        test -f "$DEB"); then
    echo "fetch_lm_data: Debian no longer serves $PACKAGE $VERSION. Use a saved copy" \
         "(LM_DATA_DEB=...), or move VERSION and SHA256 here and in docs/lm-data.md to the" \
         "current one (apt-cache policy $PACKAGE): the corpus and the data change with it" >&2
    exit 1
  fi
fi
got=$(sha256sum "$tmp/$DEB" | cut -d' ' -f1)
if [ "$got" != "$SHA256" ]; then
  echo "fetch_lm_data: $DEB has sha256 $got, expected $SHA256: refusing it" >&2
  exit 1
fi
echo "fetch_lm_data: package $PACKAGE $VERSION, sha256 $SHA256"
dpkg-deb -x "$tmp/$DEB" "$tmp/x"
rm -f "$tmp/$DEB"

python3 -m fusebox_tools.models.lm_data corpus --html "$tmp/x/$HTML" --exclude "${EXCLUDE[@]}" --out "$tmp/corpus.txt"
rm -rf "$tmp/x"
corpus_sha=$(sha256sum "$tmp/corpus.txt" | cut -d' ' -f1)
corpus_bytes=$(stat -c %s "$tmp/corpus.txt")
echo "fetch_lm_data: corpus $corpus_bytes bytes, sha256 $corpus_sha"
if [ "$corpus_bytes" -lt "$MIN_CORPUS_BYTES" ]; then
  echo "fetch_lm_data: the corpus is under $MIN_CORPUS_BYTES bytes: refusing it" >&2
  exit 1
fi
[ "$corpus_sha" = "$CORPUS_SHA256" ] \
  || echo "fetch_lm_data: note: the corpus differs from the one recorded ($CORPUS_SHA256): another Python's HTML parser?"

python3 - "$tmp/source.json" "$PACKAGE" "$VERSION" "$SHA256" "$corpus_sha" "$corpus_bytes" "${EXCLUDE[@]}" <<'PY'
import json, sys
out, package, version, sha256, corpus_sha, corpus_bytes, *exclude = sys.argv[1:]
json.dump({"package": package, "version": version, "sha256": sha256, "archive": "Debian bookworm",
           "licence": "GPL-2", "html": f"usr/share/doc/{package}/html", "exclude": exclude,
           "corpus_sha256": corpus_sha, "corpus_bytes": int(corpus_bytes),
           "converted_by": "fusebox_tools.models.lm_data corpus"}, open(out, "w"), indent=1)
PY
python3 -m fusebox_tools.models.lm_data prepare --text "$tmp/corpus.txt" --vocab "$VOCAB" --out "$DEST" \
  --source-json "$tmp/source.json"
ls -l "$DEST"
echo "fetch_lm_data: ok ($DEST, $((SECONDS - start)) s)"
