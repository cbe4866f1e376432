#!/usr/bin/env bash
# Builds Tessera and its plugins, fetches Fashion-MNIST if missing, and trains the example
# (a small CNN with the label_smoothing and cutout plugins). Extra arguments go to
# `tessera train`, e.g. `./scripts/demo.sh --set train.max_duration=1ep`.
set -euo pipefail
cd "$(dirname "$0")/.."
LIBTORCH="$(./scripts/ensure-libtorch.sh)"
# libjpeg-turbo for the JPEG region decoder (build.rs falls back to the `image` crate without it).
./scripts/ensure-libjpeg.sh || true
export LIBTORCH
cargo build --release --workspace
./target/release/tessera data fetch fashion-mnist
exec ./target/release/tessera train examples/fashion-mnist/trainer.toml "$@"
