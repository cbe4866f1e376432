#!/usr/bin/env bash
# Prints a folder holding torchvision (and the numpy and Pillow it imports) for the installed
# torch wheel, installing it when missing: the PyPI wheel torchvision==0.(minor+15).patch that
# pairs with torch 2.minor.patch (0.28.0 for 2.13.0), with pip into a cache folder outside the
# repository ($TESSERA_CACHE, default ~/.cache/tessera), once. Put it on PYTHONPATH after the
# torch wheel's folder. tests/models/export.rs loads Tessera's exported ResNet-18/50 weights into
# torchvision's own models with it.
set -euo pipefail
TORCH_VERSION=${TESSERA_TORCH_VERSION:-2.13.0}
IFS=. read -r major minor patch <<<"$TORCH_VERSION"
if [ "$major" != 2 ]; then
  echo "ensure-torchvision.sh: no torchvision pairing known for torch $TORCH_VERSION" >&2
  exit 1
fi
VERSION="0.$((minor + 15)).${patch}"
CACHE=${TESSERA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}
DEST="$CACHE/torchvision-$VERSION"
if [ ! -f "$DEST/torchvision/__init__.py" ]; then
  mkdir -p "$CACHE"
  PARTIAL="$DEST.partial.$$"
  rm -rf "$PARTIAL"
  echo "installing torchvision $VERSION (for torch $TORCH_VERSION) with numpy and Pillow into $DEST" >&2
  PYTHON=${PYTHON:-python3}
  # --no-deps: torch comes from the torch wheel's own folder, not a second copy.
  "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-cache-dir --no-deps \
    --target "$PARTIAL" "torchvision==$VERSION" numpy pillow >&2
  rm -rf "$DEST"
  mv "$PARTIAL" "$DEST"
fi
echo "$DEST"
