#!/usr/bin/env bash
# Assembles gpu-bundle/: what scripts/gpu-check.sh needs on a GPU machine that has its own
# PyTorch but no network and no Rust — Tessera and the plugins its steps use (label_smoothing
# and cutout for the example, channels_last for ResNet-50, alibi for the ALiBi GPT-2) built
# against that machine's libtorch version (scripts/build-for-torch.sh), and Fashion-MNIST,
# gzipped. About 47 MB (against 2.13.0), within the 64 MiB such a machine takes in with the
# working tree (13 MB).
#
#   scripts/gpu-bundle.sh [TORCH_VERSION]     # default 2.11.0, the GPU machine's PyTorch
#   scripts/gpu-bundle.sh 2.13.0              # the main build's own libtorch (target/release,
#                                             # no second build): for the CPU rehearsal here
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${1:-2.11.0}
# The data comes through the main build's `tessera data fetch` (downloads and verifies once).
LIBTORCH="$(./scripts/ensure-libtorch.sh)"
export LIBTORCH
VERSION_FILE="$LIBTORCH/build-version"
[ -f "$VERSION_FILE" ] || VERSION_FILE="$LIBTORCH/version.py"
MAIN_VERSION=$(grep -oE "[0-9]+\.[0-9]+\.[0-9]+" "$VERSION_FILE" 2>/dev/null | head -1 || true)
if [ "$VERSION" = "$MAIN_VERSION" ]; then
  RELEASE="$PWD/target/release"
else
  RELEASE="$(./scripts/build-for-torch.sh "$VERSION")"
fi
cargo build --release --workspace
DATA_ROOT="${TESSERA_DATA:-$HOME/.cache/tessera/data}"
./target/release/tessera data fetch fashion-mnist --dir "$DATA_ROOT" >/dev/null

BUNDLE=gpu-bundle
rm -rf "$BUNDLE.partial"
mkdir -p "$BUNDLE.partial/bin" "$BUNDLE.partial/plugins" "$BUNDLE.partial/data/fashion-mnist"
cp "$RELEASE/tessera" "$BUNDLE.partial/bin/"
for p in label_smoothing cutout channels_last alibi; do
  cp "$RELEASE/lib$p.so" "$BUNDLE.partial/plugins/"
done
# The device tool carries at most 64 MiB with the working tree (13 MB): the symbols only a
# debugger reads are left out (the dynamic symbols the loader needs stay), and the data is
# compressed hard.
if command -v strip >/dev/null; then
  strip --strip-unneeded "$BUNDLE.partial/bin/tessera" "$BUNDLE.partial/plugins/"*.so
fi
for f in "$DATA_ROOT"/fashion-mnist/*-ubyte; do
  gzip -9 -c "$f" >"$BUNDLE.partial/data/fashion-mnist/$(basename "$f").gz"
done
cp "$DATA_ROOT/fashion-mnist/VERIFIED" "$BUNDLE.partial/data/fashion-mnist/"
echo "$VERSION" >"$BUNDLE.partial/BUILT_AGAINST"
git rev-parse --short HEAD >"$BUNDLE.partial/COMMIT" 2>/dev/null || true
rm -rf "$BUNDLE"
mv "$BUNDLE.partial" "$BUNDLE"
du -sh "$BUNDLE" >&2
echo "$BUNDLE"
