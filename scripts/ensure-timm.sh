#!/usr/bin/env bash
# Prints a folder holding timm (PyTorch Image Models) for the installed torch wheel, installing
# it when missing: timm==$TESSERA_TIMM_VERSION (default 1.0.31) with pip into a cache folder
# outside the repository ($TESSERA_CACHE, default ~/.cache/tessera), once. Put it on PYTHONPATH
# after the torch, torchvision and transformers folders: timm's own requirements
# (huggingface-hub, safetensors, pyyaml) come from transformers' folder, torch and torchvision
# from theirs, so it is installed without dependencies (pip would otherwise pull a second torch).
# tests/models/vit.rs builds timm's `vit_*_patch16_*` models with it (random weights, no downloads).
set -euo pipefail
VERSION=${TESSERA_TIMM_VERSION:-1.0.31}
CACHE=${TESSERA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}
DEST="$CACHE/timm-$VERSION"
if [ ! -f "$DEST/timm/__init__.py" ]; then
  mkdir -p "$CACHE"
  PARTIAL="$DEST.partial.$$"
  rm -rf "$PARTIAL"
  echo "installing timm $VERSION into $DEST" >&2
  PYTHON=${PYTHON:-python3}
  "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-cache-dir --no-deps \
    --target "$PARTIAL" "timm==$VERSION" >&2
  rm -rf "$DEST"
  mv "$PARTIAL" "$DEST"
fi
echo "$DEST"
