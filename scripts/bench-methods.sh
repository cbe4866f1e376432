#!/usr/bin/env bash
# The step-time cost of each method plugin: the same training run with and without it,
# alternating, medians and the ratio (scripts/bench_methods.py says what is timed). Not part of
# the test suite. ROUNDS, BATCHES and METHODS tune it, e.g.
# `ROUNDS=5 METHODS=blurpool,sam ./scripts/bench-methods.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
LIBTORCH="$(./scripts/ensure-libtorch.sh)"
export LIBTORCH
# --all-targets: the same feature set as the test build, so the two do not rebuild each other.
cargo build --release --workspace --all-targets
./target/release/tessera data fetch fashion-mnist >/dev/null
export TESSERA="$PWD/target/release/tessera"
exec "${PYTHON:-python3}" scripts/bench_methods.py
