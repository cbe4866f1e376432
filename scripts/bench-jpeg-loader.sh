#!/usr/bin/env bash
# Images/s of an image folder's training input, RandomResizedCrop(224) + horizontal flip to
# uint8 batches of 256, on the same folder of JPEGs of ImageNet-like sizes (~500x375, quality 90,
# made once with Pillow into $TESSERA_CACHE/bench-jpeg-N): Tessera's loader alone (the
# `loader_bench` example, no model) against torchvision's ImageFolder + DataLoader (PIL), at 1
# and 2 workers, alternating sides, medians of ROUNDS and the ratio per worker (scripts/
# bench_jpeg_loader.py says what is timed). Not part of the test suite. IMAGES (5000), CLASSES
# (10), ROUNDS (3), WORKERS ("1 2"), SIZE (224), DCT (0; 1 for jpeg_dct_scale = true) tune it,
# e.g. `ROUNDS=5 ./scripts/bench-jpeg-loader.sh`; `./scripts/bench-jpeg-loader.sh profile` times
# the stages of 500 images on one thread instead.
set -euo pipefail
cd "$(dirname "$0")/.."
LIBTORCH="$(./scripts/ensure-libtorch.sh)"
# libjpeg-turbo for the JPEG region decoder (build.rs falls back to the `image` crate without it).
./scripts/ensure-libjpeg.sh || true
export LIBTORCH
cargo build --release -p tessera --example loader_bench
PYTHON=${PYTHON:-python3}
TORCH_PATH="$(dirname "$LIBTORCH")"
if ! PYTHONPATH="$TORCH_PATH" "$PYTHON" -c "import torch" 2>/dev/null; then
  TORCH_PATH="$(dirname "$(LIBTORCH='' ./scripts/ensure-libtorch.sh)")"
fi
VISION_PATH="$(./scripts/ensure-torchvision.sh)"
export LOADER_BENCH="$PWD/target/release/examples/loader_bench"
PYTHONPATH="$TORCH_PATH:$VISION_PATH" exec "$PYTHON" -W ignore scripts/bench_jpeg_loader.py "$@"
