#!/usr/bin/env bash
# Assembles gpu-bundle/: what scripts/gpu-check.sh needs on a GPU machine that has its own
# PyTorch but no network and no Rust — Tessera and the example's plugins built against that
# machine's libtorch version (scripts/build-for-torch.sh), and Fashion-MNIST, gzipped. About
# 40 MB, under the 64 MiB such a machine takes in.
#
#   scripts/gpu-bundle.sh [TORCH_VERSION]     # default 2.11.0, the GPU machine's PyTorch
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${1:-2.11.0}
RELEASE="$(./scripts/build-for-torch.sh "$VERSION")"
# The data comes through the main build's `tessera data fetch` (downloads and verifies once).
LIBTORCH="$(./scripts/ensure-libtorch.sh)"
export LIBTORCH
cargo build --release --workspace
DATA_ROOT="${TESSERA_DATA:-$HOME/.cache/tessera/data}"
./target/release/tessera data fetch fashion-mnist --dir "$DATA_ROOT" >/dev/null

BUNDLE=gpu-bundle
rm -rf "$BUNDLE.partial"
mkdir -p "$BUNDLE.partial/bin" "$BUNDLE.partial/plugins" "$BUNDLE.partial/data/fashion-mnist"
cp "$RELEASE/tessera" "$BUNDLE.partial/bin/"
for p in label_smoothing cutout; do
  cp "$RELEASE/lib$p.so" "$BUNDLE.partial/plugins/"
done
for f in "$DATA_ROOT"/fashion-mnist/*-ubyte; do
  gzip -1 -c "$f" >"$BUNDLE.partial/data/fashion-mnist/$(basename "$f").gz"
done
cp "$DATA_ROOT/fashion-mnist/VERIFIED" "$BUNDLE.partial/data/fashion-mnist/"
echo "$VERSION" >"$BUNDLE.partial/BUILT_AGAINST"
git rev-parse --short HEAD >"$BUNDLE.partial/COMMIT" 2>/dev/null || true
rm -rf "$BUNDLE"
mv "$BUNDLE.partial" "$BUNDLE"
du -sh "$BUNDLE" >&2
echo "$BUNDLE"
