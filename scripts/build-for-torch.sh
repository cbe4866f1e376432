#!/usr/bin/env bash
# Builds Tessera (host and plugins) against another libtorch than the 2.13.0 that tch 0.26
# expects — e.g. the libtorch inside the PyTorch installed on a GPU machine you cannot build
# on — into its own target folder, leaving the main build alone.
#
#   scripts/build-for-torch.sh 2.11.0          # installs the PyPI wheel torch==2.11.0 into
#                                              # ~/.cache/tessera/torch-2.11.0 when missing
#   LIBTORCH=/path/to/libtorch scripts/build-for-torch.sh   # your own libtorch (any version)
#   TEST=1 scripts/build-for-torch.sh 2.11.0   # and run the whole test suite against it
#
# Prints the target folder (target/torch-<version>/release, with `tessera` and the plugin
# `.so` files) on stdout. The binaries find libtorch through an rpath to the folder they were
# built against; on another machine, point LD_LIBRARY_PATH at that machine's `torch/lib`
# (scripts/gpu-check.sh does).
#
# c10d's NCCL backend is compiled in when the NCCL and CUDA headers are found (host/build.rs):
# for a wheel, ensure-libtorch.sh installs the missing ones next to it from PyPI; for your own
# LIBTORCH, set TESSERA_CUDA_INCLUDE (folders separated by `:`) or CUDA_HOME to where they are,
# else the build warns and data-parallel CUDA runs use Gloo (docs/distributed.md, "Backends").
#
# tch 0.26's C++ wrapper has one function per operator of libtorch 2.13; against another
# version a few of them do not compile. scripts/patch_torch_sys.py copies torch-sys into the
# target folder with just those functions turned into an error at call time (Tessera calls none
# of them), and cargo builds with that copy patched in (`--config patch.crates-io...`); the
# workspace's Cargo.lock is put back afterwards. docs/gpu.md has what this gave for 2.11.0.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${LIBTORCH:-}" ]; then
  VERSION_FILE="$LIBTORCH/build-version"
  [ -f "$VERSION_FILE" ] || VERSION_FILE="$LIBTORCH/version.py"
  VERSION=$(grep -oE "[0-9]+\.[0-9]+\.[0-9]+" "$VERSION_FILE" 2>/dev/null | head -1 || true)
  VERSION=${VERSION:-${1:-custom}}
else
  VERSION=${1:?usage: scripts/build-for-torch.sh VERSION (e.g. 2.11.0), or set LIBTORCH}
  LIBTORCH="$(TESSERA_TORCH_VERSION="$VERSION" ./scripts/ensure-libtorch.sh)"
fi
export LIBTORCH
# tch checks that libtorch is the version it was generated for; the C++ compile is the real test.
export LIBTORCH_BYPASS_VERSION_CHECK=1
export CARGO_TARGET_DIR="$PWD/target/torch-$VERSION"
echo "building against libtorch $VERSION ($LIBTORCH) into $CARGO_TARGET_DIR" >&2
PYTHON=${PYTHON:-python3}
TORCH_SYS_SRC=$(cargo metadata --format-version 1 --locked | "$PYTHON" -c '
import json, os, sys
meta = json.load(sys.stdin)
print(next(os.path.dirname(p["manifest_path"]) for p in meta["packages"] if p["name"] == "torch-sys"))')
PATCHED="$CARGO_TARGET_DIR/torch-sys-patched"
mkdir -p "$CARGO_TARGET_DIR"
"$PYTHON" scripts/patch_torch_sys.py "$TORCH_SYS_SRC" "$PATCHED" "$LIBTORCH" "$VERSION"
cp Cargo.lock "$CARGO_TARGET_DIR/Cargo.lock.orig"
trap 'cp "$CARGO_TARGET_DIR/Cargo.lock.orig" Cargo.lock' EXIT
PATCH=(--config "patch.crates-io.torch-sys.path=\"$PATCHED\"")
cargo build --release --workspace "${PATCH[@]}" >&2
if [ "${TEST:-0}" = 1 ]; then
  # The export comparison runs this libtorch's own Python package when it is a wheel.
  TESSERA_TORCH_PYTHONPATH="${TESSERA_TORCH_PYTHONPATH:-$(dirname "$LIBTORCH")}"
  export TESSERA_TORCH_PYTHONPATH
  cargo test --release --workspace --no-fail-fast "${PATCH[@]}" >&2
fi
echo "$CARGO_TARGET_DIR/release"
