#!/usr/bin/env bash
# Memory per rank under `[distributed] sharding` (ZeRO), measured: GPT-2 small (124M
# parameters, AdamW, fp32) on 1, 2 and 4 Gloo ranks of this machine in each mode, batch 1 of
# SEQ (64) tokens so that activations are small next to the parameters, gradients and optimizer
# state. Rank 0's CPU memory allocated by libtorch on its training thread, as the allocator
# counts it (TESSERA_MEMORY_PEAK=1; host/csrc/oom.cpp): right after the last optimizer step
# (parameters, gradients and optimizer state: run.json `memory_after_step_bytes`) and its peak
# from the end of set-up on (`memory_peak_bytes`: that plus one backward pass's activations and
# gradients in flight), beside the ideal of each mode for N parameters (ratio: after step /
# ideal): none 16N, optimizer 8N + 8N/world, gradients 4N + 12N/world, full 16N/world (bytes:
# fp32 parameters 4N, gradients 4N, AdamW moments 8N). `full` gathers one block at a time and
# the parameters outside the blocks (the tied embedding, 38.6M: the largest unit) for a whole
# pass, so its peak adds those gathered parameters and their gradients in flight; the "unit"
# column is the ideal plus the largest unit's gathered parameters. Not part of the test suite;
# docs/benchmarks.md records its output.
# WORLDS, MODES and SET (one more `--set`, e.g. SET=distributed.prefetch=false) narrow it;
# EXTRA is appended to trainer.toml (a method: `[[algorithms]]` and `[plugins] dirs`).
#   SEQ=64 STEPS=3 ./scripts/bench-sharding-memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."
LIBTORCH="$(./scripts/ensure-libtorch.sh)"
export LIBTORCH
cargo build --release -p tessera >&2
SEQ=${SEQ:-64}
STEPS=${STEPS:-3}
BIN="$PWD/target/release/tessera"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cat >"$WORK/trainer.toml" <<TOML
run_name = "r"
seed = 1
output_dir = "runs"

[data]
dataset = "synthetic-text"
batch_size = 1
eval_batch_size = 1
workers = 0

[data.text]
seq_len = $SEQ
vocab_size = 50257
tokens = 20000
eval_tokens = 2000

[model]
name = "gpt2"
n_layer = 12
n_head = 12
n_embd = 768
n_positions = 1024

[optimizer]
name = "adamw"
lr = 0.0006

[train]
max_duration = "${STEPS}ba"
eval_interval = "1ep"
eval_subset_batches = 1
progress = false

[checkpoint]
save = false

${EXTRA:-}
TOML
printf '%-6s %-10s %14s %14s %12s %8s %12s %10s\n' ranks sharding "after step MiB" "peak MiB" \
  "ideal MiB" ratio "+unit MiB" "peak ratio"
for world in ${WORLDS:-1 2 4}; do
  for mode in ${MODES:-none optimizer gradients full}; do
    if [ "$world" = 1 ] && [ "$mode" != none ]; then continue; fi
    run="w$world-$mode"
    (cd "$WORK" && TESSERA_MEMORY_PEAK=1 timeout 900 "$BIN" launch --nproc "$world" train trainer.toml \
      --set run_name="\"$run\"" --set distributed.sharding="\"$mode\"" ${SET:+--set "$SET"} \
      >/dev/null 2>"$run.err") ||
      { cat "$WORK/$run.err" >&2; exit 1; }
    python3 - "$WORK/runs/$run/run.json" "$world" "$mode" <<'PY'
import json, sys
record = json.load(open(sys.argv[1]))
world, mode = int(sys.argv[2]), sys.argv[3]
dp = record.get("data_parallel") or {}
# Parameters: the sharded ones' count when sharded, else GPT-2 small's (tied head).
n = dp.get("sharded_elements") or 124439808
ideal = {"none": 16 * n, "optimizer": 8 * n + 8 * n / world,
         "gradients": 4 * n + 12 * n / world, "full": 16 * n / world}[mode]
# The largest unit under `full`: what lies outside the blocks (wte 50257 x 768, wpe 1024 x 768,
# ln_f 2 x 768), fp32.
unit = 4 * (50257 * 768 + 1024 * 768 + 2 * 768) if mode == "full" else 0
peak = record["memory_peak_bytes"]
steady = record["memory_after_step_bytes"]
print(f"{world:<6} {mode:<10} {steady / 2**20:14.0f} {peak / 2**20:14.0f} {ideal / 2**20:12.0f}"
      f" {steady / ideal:8.2f} {(ideal + unit) / 2**20:12.0f} {peak / (ideal + unit):10.2f}")
PY
  done
done
