#!/usr/bin/env bash
# Prints a folder holding MosaicML Streaming (`mosaicml-streaming`, the MDS writer and
# `StreamingDataset`) and `webdataset`, installing them when missing, with pip into a cache folder
# outside the repository ($TESSERA_CACHE, default ~/.cache/tessera), once. --no-deps plus the
# modules their writers and readers import: torch, torchvision, numpy, Pillow and transformers
# (which `streaming` imports at start) come from the torch wheel's folder and the folders
# ensure-torchvision.sh and ensure-transformers.sh print, not a second copy. Put it on PYTHONPATH
# after those. tests/data/streaming.rs writes MDS and WebDataset shards with them and reads Tessera's
# `tessera data pack` output back.
set -euo pipefail
VERSION=${TESSERA_STREAMING_VERSION:-0.13.0}
WDS_VERSION=${TESSERA_WEBDATASET_VERSION:-1.0.2}
CACHE=${TESSERA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}
DEST="$CACHE/streaming-$VERSION"
if [ ! -f "$DEST/streaming/__init__.py" ] || [ ! -f "$DEST/webdataset/__init__.py" ]; then
  mkdir -p "$CACHE"
  PARTIAL="$DEST.partial.$$"
  rm -rf "$PARTIAL"
  echo "installing mosaicml-streaming $VERSION and webdataset $WDS_VERSION into $DEST" >&2
  PYTHON=${PYTHON:-python3}
  # The imports of `streaming` (compression, hashing, progress) and `webdataset` (shard-name
  # brace patterns, yaml), found by importing both, pinned to the versions tested; the cloud clients it lists are imported only
  # for remotes that Tessera's tests do not use.
  "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-cache-dir --no-deps \
    --target "$PARTIAL" "mosaicml-streaming==$VERSION" "webdataset==$WDS_VERSION" \
    brotli==1.2.1 python-snappy==0.7.3 cramjam==2.14.0 xxhash==4.1.0 zstd==1.5.7.2 \
    tqdm==4.70.1 braceexpand==0.1.7 pyyaml==6.0.4 catalogue==2.0.10 \
    typing_extensions==4.16.0 >&2
  rm -rf "$DEST"
  mv "$PARTIAL" "$DEST"
fi
echo "$DEST"
