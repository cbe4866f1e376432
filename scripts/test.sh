#!/usr/bin/env bash
# Runs Tessera's whole test suite. Installs what is missing (libtorch into ~/.cache/tessera,
# Fashion-MNIST into ~/.cache/tessera/data) and reuses it when present. `.ci/run` calls this.
set -euo pipefail
cd "$(dirname "$0")/.."
LIBTORCH="$(./scripts/ensure-libtorch.sh)"
export LIBTORCH

echo "== build (release: tests, demo and benchmarks share one build of libtorch's wrapper)"
cargo build --release --workspace --all-targets
echo "== data"
./target/release/tessera data fetch fashion-mnist
echo "== format and lints"
cargo fmt --all --check
cargo clippy --release --workspace --all-targets -- -D warnings
echo "== tests"
cargo test --release --workspace
