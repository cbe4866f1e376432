#!/usr/bin/env bash
# Data-parallel training on this CPU (c10d Gloo): the small CNN and ResNet-20 on Fashion-MNIST,
# global batch 128, as 1 process (2 threads, and 1 thread) and as 2 ranks of 64 (`tessera launch
# --nproc 2 train`, 1 thread each), against PyTorch's own DistributedDataParallel and one plain
# PyTorch process on the same model, data and SGD; alternating rounds, medians, speed-ups, the
# Tessera/PyTorch time ratio and the all-reduce's time per step (scripts/bench_dp.py says what
# is timed). Not part of the test suite. ROUNDS (3), BATCHES (cnn 150, resnet20 40), WARMUP (10)
# and MODELS (cnn,resnet20) tune it, e.g. `ROUNDS=1 BATCHES=20 MODELS=cnn ./scripts/bench-dp.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
LIBTORCH="$(./scripts/ensure-libtorch.sh)"
export LIBTORCH
cargo build --release --workspace
./target/release/tessera data fetch fashion-mnist >/dev/null
PYTHON=${PYTHON:-python3}
# The wheel ensure-libtorch.sh installed (or, with your own LIBTORCH, the one beside it).
TORCH_PATH="$(dirname "$LIBTORCH")"
if ! PYTHONPATH="$TORCH_PATH" "$PYTHON" -c "import torch.distributed" 2>/dev/null; then
  TORCH_PATH="$(dirname "$(LIBTORCH='' ./scripts/ensure-libtorch.sh)")"
fi
export TESSERA="$PWD/target/release/tessera"
PYTHONPATH="$TORCH_PATH" exec "$PYTHON" -W ignore scripts/bench_dp.py
