#!/usr/bin/env bash
# `[distributed] sharding = "full"` with the next unit gathered while one computes (`prefetch =
# true`, the default) against waiting for each unit's gather (`prefetch = false`), on
# scripts/bench-gpt-two-ranks.sh's GPT-2, 2 CPU ranks; the ratio is prefetch / no prefetch.
# Only the setting differs. docs/benchmarks.md records the output.
#   ROUNDS=5 BATCHES=30 WIDTH=256 ./scripts/bench-full-prefetch.sh
set -euo pipefail
NAME=full-prefetch \
  EXTRA='[distributed]\nsharding = "full"' \
  B_SET=distributed.prefetch=false \
  exec "$(dirname "$0")/bench-gpt-two-ranks.sh"
