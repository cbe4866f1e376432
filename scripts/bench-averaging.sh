#!/usr/bin/env bash
# Final test accuracy of the Fashion-MNIST example as it is and with EMA or SWA added, several
# seeds (scripts/bench_averaging.py says what is run). Not part of the test suite. SEEDS,
# VARIANTS and EPOCHS tune it, e.g. `SEEDS=1,2,3 VARIANTS=baseline,ema ./scripts/bench-averaging.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
LIBTORCH="$(./scripts/ensure-libtorch.sh)"
export LIBTORCH
cargo build --release --workspace --all-targets
./target/release/tessera data fetch fashion-mnist >/dev/null
export TESSERA="$PWD/target/release/tessera"
exec "${PYTHON:-python3}" scripts/bench_averaging.py
