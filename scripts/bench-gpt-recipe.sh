#!/usr/bin/env bash
# Time to a target validation perplexity on Shakespeare: the GPT of examples/gpt without methods
# against ALiBi + SeqLengthWarmup, two seeds each, alternating (scripts/bench_gpt_recipe.py says
# what is measured). Not part of the test suite. BATCHES (150), EVAL_EVERY (15), EVAL_BATCHES
# (3), SEEDS (1,2), SCALING (ALiBi's train_sequence_length_scaling, 1.0), TARGET and KEEP tune
# it, e.g. `BATCHES=600 EVAL_EVERY=50 ./scripts/bench-gpt-recipe.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
LIBTORCH="$(./scripts/ensure-libtorch.sh)"
export LIBTORCH
cargo build --release --workspace
./target/release/tessera data fetch shakespeare >/dev/null
export TESSERA="$PWD/target/release/tessera"
exec "${PYTHON:-python3}" -W ignore scripts/bench_gpt_recipe.py
