#!/usr/bin/env bash
# Tessera's MDS reader vs MosaicML Streaming's StreamingDataset + DataLoader on the same MDS
# dataset (100,000 64x64 JPEG samples written once by streaming's MDSWriter): images/s over an
# epoch at 1 and 2 workers, and the time to the first batch when resuming at 90% of the epoch,
# alternating sides, medians of ROUNDS (scripts/bench_streaming.py says what is timed). Not part
# of the test suite. SAMPLES (100000), SIZE (64), ROUNDS (3), WORKERS ("1 2"), FRACTION (0.9)
# tune it, e.g. `ROUNDS=5 ./scripts/bench-streaming.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
LIBTORCH="$(./scripts/ensure-libtorch.sh)"
./scripts/ensure-libjpeg.sh || true
export LIBTORCH
cargo build --release -p tessera --example shards_bench
PYTHON=${PYTHON:-python3}
TORCH_PATH="$(dirname "$LIBTORCH")"
if ! PYTHONPATH="$TORCH_PATH" "$PYTHON" -c "import torch" 2>/dev/null; then
  TORCH_PATH="$(dirname "$(LIBTORCH='' ./scripts/ensure-libtorch.sh)")"
fi
VISION_PATH="$(./scripts/ensure-torchvision.sh)"
TRANSFORMERS_PATH="$(./scripts/ensure-transformers.sh)"
STREAMING_PATH="$(./scripts/ensure-streaming.sh)"
export SHARDS_BENCH="$PWD/target/release/examples/shards_bench"
PYTHONPATH="$TORCH_PATH:$VISION_PATH:$TRANSFORMERS_PATH:$STREAMING_PATH" exec "$PYTHON" -W ignore scripts/bench_streaming.py "$@"
