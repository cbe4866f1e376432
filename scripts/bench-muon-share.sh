#!/usr/bin/env bash
# Muon's orthogonalization shared by the ranks (plugin-api 1.9 `all_gather`, the default) against
# every rank computing every matrix (`share_across_ranks = false`): Muon on the 16 hidden
# matrices of scripts/bench-gpt-two-ranks.sh's GPT-2 (AdamW for the rest), 2 CPU ranks; the
# ratio is shared / not shared (below 1: sharing is faster). Only the setting differs.
# docs/benchmarks.md records the output.
#   ROUNDS=5 BATCHES=30 WIDTH=256 ./scripts/bench-muon-share.sh
set -euo pipefail
NAME=muon-share \
  EXTRA='[[algorithms]]\nplugin = "muon"\nlr = 0.02' \
  B_SET=algorithms.0.share_across_ranks=false \
  exec "$(dirname "$0")/bench-gpt-two-ranks.sh"
