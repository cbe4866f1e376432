#!/usr/bin/env bash
# Prints the path of a libtorch 2.13.0 usable by tch 0.26, installing it when missing.
#
# - If LIBTORCH is set, it is used as is (the user's own libtorch).
# - Otherwise the PyPI wheel torch==2.13.0 (or torch==$TESSERA_TORCH_VERSION, for a build against
#   another libtorch: scripts/build-for-torch.sh) is installed with pip into a cache folder outside the
#   repository ($TESSERA_CACHE, default ~/.cache/tessera), once; later builds, CI and other
#   checkouts reuse it. The install goes to a temporary folder that is renamed when complete, so an
#   interrupted install is never mistaken for a good one.
set -euo pipefail
TORCH_VERSION=${TESSERA_TORCH_VERSION:-2.13.0}
if [ -n "${LIBTORCH:-}" ]; then
  if [ ! -d "$LIBTORCH/lib" ] || [ ! -d "$LIBTORCH/include" ]; then
    echo "LIBTORCH=$LIBTORCH has no lib/ and include/ folders: point it at an unpacked libtorch" >&2
    exit 1
  fi
  echo "$LIBTORCH"
  exit 0
fi
CACHE=${TESSERA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}
DEST="$CACHE/torch-$TORCH_VERSION"
if [ ! -f "$DEST/torch/lib/libtorch_cpu.so" ]; then
  mkdir -p "$CACHE"
  PARTIAL="$DEST.partial.$$"
  rm -rf "$PARTIAL"
  echo "installing libtorch $TORCH_VERSION (PyPI wheel torch==$TORCH_VERSION, ~4.7 GB) into $DEST" >&2
  PYTHON=${PYTHON:-python3}
  "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-cache-dir \
    --target "$PARTIAL" "torch==$TORCH_VERSION" >&2
  rm -rf "$DEST"
  mv "$PARTIAL" "$DEST"
fi
echo "$DEST/torch"
