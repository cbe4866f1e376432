#!/usr/bin/env bash
# libtorch operator calls and time of one optimizer step, per-parameter vs fused, on ResNet-50's
# and GPT-2 small's parameters (host/benches/optim_ops.rs says what is measured; the figures are
# in docs/benchmarks.md). Not part of the test suite. ROUNDS and MODELS tune it, e.g.
# `ROUNDS=3 MODELS=gpt2 ./scripts/bench-optim-ops.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
export LIBTORCH="${LIBTORCH:-$HOME/.cache/tessera/torch-2.13.0/torch}"
exec cargo bench -p tessera --bench optim_ops
