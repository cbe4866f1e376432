#!/usr/bin/env bash
# Whole-run benchmark against plain PyTorch (the installed torch wheel's Python): the CNN,
# ResNet-20 and the MLP trained on Fashion-MNIST by Tessera and by a plain PyTorch loop,
# alternating, medians and the time ratio per model (scripts/bench_vs_pytorch.py says what is
# timed). Not part of the test suite. ROUNDS, THREADS and MODELS tune it, e.g.
# `ROUNDS=5 MODELS=cnn ./scripts/bench-vs-pytorch.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
LIBTORCH="$(./scripts/ensure-libtorch.sh)"
export LIBTORCH
cargo build --release --workspace
./target/release/tessera data fetch fashion-mnist >/dev/null
PYTHON=${PYTHON:-python3}
# The wheel ensure-libtorch.sh installed (or, with your own LIBTORCH, the one beside it).
TORCH_PATH="$(dirname "$LIBTORCH")"
if ! PYTHONPATH="$TORCH_PATH" "$PYTHON" -c "import torch" 2>/dev/null; then
  TORCH_PATH="$(dirname "$(LIBTORCH='' ./scripts/ensure-libtorch.sh)")"
fi
export TESSERA="$PWD/target/release/tessera"
PYTHONPATH="$TORCH_PATH" exec "$PYTHON" -W ignore scripts/bench_vs_pytorch.py
