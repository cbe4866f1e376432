#!/usr/bin/env bash
# One setting's effect on a data-parallel run, timed side by side: a 4-layer GPT-2 of width
# WIDTH (256), AdamW, BATCHES (30) batches of 2 ranks x 8 sequences of 64 tokens on this
# machine's CPU (`tessera launch --nproc 2`, one thread a rank, Gloo, no checkpoints), as
# `trainer.toml` plus the lines in EXTRA (A) against the same with the override B_SET (B);
# whole processes timed by farm-bench, alternating, ROUNDS (5) pairs; the ratio is A/B. The
# named benches call it (bench-muon-share.sh, bench-full-prefetch.sh).
#   NAME=x EXTRA='[distributed]\nsharding = "full"' B_SET='distributed.prefetch=false' \
#     ./scripts/bench-gpt-two-ranks.sh
set -euo pipefail
cd "$(dirname "$0")/.."
LIBTORCH="$(./scripts/ensure-libtorch.sh)"
export LIBTORCH
cargo build --release --workspace
ROUNDS=${ROUNDS:-5}
BATCHES=${BATCHES:-30}
WIDTH=${WIDTH:-256}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
cat >"$DIR/trainer.toml" <<TOML
run_name = "${NAME:-bench}"
seed = 7
output_dir = "$DIR/runs"

[data]
dataset = "synthetic-text"
batch_size = 8
workers = 0

[data.text]
seq_len = 64
vocab_size = 256
tokens = 200000
eval_tokens = 2000

[model]
name = "gpt2"
n_layer = 4
n_head = 4
n_embd = $WIDTH
n_positions = 64

[optimizer]
name = "adamw"
lr = 0.003

[train]
max_duration = "${BATCHES}ba"
eval_interval = "1000ep"
progress = false
device = "cpu"
threads = 1

[checkpoint]
save = false

[plugins]
dirs = ["$PWD/target/release"]
TOML
printf '\n%b\n' "${EXTRA:-}" >>"$DIR/trainer.toml"
T="$PWD/target/release/tessera"
farm-bench -n "$ROUNDS" --timeout 3000 \
  --vs "$T launch --nproc 2 train $DIR/trainer.toml --set $B_SET" \
  -- "$T" launch --nproc 2 train "$DIR/trainer.toml"
