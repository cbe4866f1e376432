#!/usr/bin/env bash
# Muon's orthogonalization shared by the ranks (plugin-api 1.9 `all_gather`, the default) against
# every rank computing every matrix (`share_across_ranks = false`): a 4-layer GPT-2 of width
# WIDTH (256) with Muon on its 16 hidden matrices, AdamW for the rest, BATCHES (30) batches of 2
# ranks x 8 sequences of 64 tokens on this machine's CPU (`tessera launch --nproc 2`, one thread
# a rank), whole processes timed by farm-bench side by side, alternating, ROUNDS (5) pairs;
# the ratio is shared / not shared (below 1: sharing is faster). Only the setting differs.
# docs/benchmarks.md records the output.
#   ROUNDS=5 BATCHES=30 WIDTH=256 ./scripts/bench-muon-share.sh
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
run_name = "muon-share"
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

[[algorithms]]
plugin = "muon"
lr = 0.02
TOML
T="$PWD/target/release/tessera"
farm-bench -n "$ROUNDS" --timeout 3000 \
  --vs "$T launch --nproc 2 train $DIR/trainer.toml --set algorithms.0.share_across_ranks=false" \
  -- "$T" launch --nproc 2 train "$DIR/trainer.toml"
