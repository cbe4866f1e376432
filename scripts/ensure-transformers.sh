#!/usr/bin/env bash
# Prints a folder holding Hugging Face transformers (and what it imports: huggingface-hub,
# tokenizers, safetensors, regex, numpy, pyyaml, tqdm, filelock, packaging, ...) for the
# installed torch wheel, installing it when missing: transformers==$TESSERA_TRANSFORMERS_VERSION
# (default 5.24.0, which needs Python >= 3.11 and supports torch 2.13) with pip into a cache
# folder outside the repository ($TESSERA_CACHE, default ~/.cache/tessera), once. Put it on
# PYTHONPATH after the torch wheel's folder. tests/models/gpt2.rs loads Tessera's exported GPT-2
# weights into transformers' own GPT2LMHeadModel with it.
#
# torch is not among transformers' requirements, so pip's dependency resolution installs no
# second copy of it (checked below): torch comes from the torch wheel's own folder.
set -euo pipefail
VERSION=${TESSERA_TRANSFORMERS_VERSION:-5.24.0}
CACHE=${TESSERA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}
DEST="$CACHE/transformers-$VERSION"
if [ ! -f "$DEST/transformers/__init__.py" ]; then
  mkdir -p "$CACHE"
  PARTIAL="$DEST.partial.$$"
  rm -rf "$PARTIAL"
  echo "installing transformers $VERSION and its requirements into $DEST" >&2
  PYTHON=${PYTHON:-python3}
  "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-cache-dir \
    --target "$PARTIAL" "transformers==$VERSION" >&2
  if [ -e "$PARTIAL/torch" ]; then
    echo "ensure-transformers.sh: pip installed a torch into $PARTIAL; refusing (torch must come from the torch wheel's folder)" >&2
    rm -rf "$PARTIAL"
    exit 1
  fi
  rm -rf "$DEST"
  mv "$PARTIAL" "$DEST"
fi
echo "$DEST"
