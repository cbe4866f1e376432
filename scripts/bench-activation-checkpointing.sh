#!/usr/bin/env bash
# Activation checkpointing (`train.activation_checkpointing`) on GPT-2 small at sequence 1024,
# fp32 on this machine's CPU: the activation memory (peak resident set during forward and
# backward minus the resident set before them, the C allocator returning freed blocks to the
# kernel so that the resident set follows live memory) and the time of a forward + backward,
# with every block checkpointed and without, each measurement in its own process, the timed
# runs alternated. host/benches/activation_checkpointing.rs says how; docs/benchmarks.md
# records the output.
#   BATCH=2 SEQ=1024 STEPS=3 ROUNDS=2 ./scripts/bench-activation-checkpointing.sh
set -euo pipefail
cd "$(dirname "$0")/.."
LIBTORCH="$(./scripts/ensure-libtorch.sh)"
export LIBTORCH
cargo bench -p tessera --bench activation_checkpointing
