#!/usr/bin/env bash
# Step time with and without the channels_last plugin, side by side: ResNet-20 (width 16) on
# Fashion-MNIST, batch 128, BATCHES batches (default 30), no evaluation or checkpoints, rounds
# alternating which goes first (ROUNDS, default 3). Prints each run's training seconds per batch
# (run.json's train_seconds / batches) and the medians. Not part of the test suite.
# `ROUNDS=5 BATCHES=40 DEVICE=cpu ./scripts/bench-channels-last.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
BATCHES=${BATCHES:-30}
DEVICE=${DEVICE:-cpu}
TESSERA="$PWD/target/release/tessera"
PLUGINS="$PWD/target/release"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
"$TESSERA" data fetch fashion-mnist >/dev/null 2>&1

run() { # run VARIANT ROUND
  local dir="$WORK/$1-$2"
  mkdir -p "$dir"
  cat >"$dir/trainer.toml" <<TOML
run_name = "bench"
seed = 1
output_dir = "runs"
[data]
dataset = "fashion-mnist"
fetch = false
batch_size = 128
eval_batch_size = 128
workers = 0
[data.transforms]
normalize = { mean = [0.2860], std = [0.3530] }
[model]
name = "resnet20"
width = 16
[optimizer]
name = "sgd"
lr = 0.05
momentum = 0.9
[train]
max_duration = "${BATCHES}ba"
eval_interval = "1000ep"
eval_subset_batches = 1
progress = false
device = "$DEVICE"
[checkpoint]
save = false
[plugins]
dirs = ["$PLUGINS"]
TOML
  if [ "$1" = channels_last ]; then
    printf '[[algorithms]]\nplugin = "channels_last"\n' >>"$dir/trainer.toml"
  fi
  (cd "$dir" && "$TESSERA" train trainer.toml >/dev/null 2>"$dir/stderr" ||
    { cat "$dir/stderr" >&2; exit 1; })
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], sys.argv[3], "%.2f" % (1000*r["train_seconds"]/r["batches"]))' \
    "$dir/runs/bench/run.json" "$1" "$2" | tee -a "$WORK/results"
}

for round in $(seq 1 "$ROUNDS"); do
  if [ $((round % 2)) = 1 ]; then order="plain channels_last"; else order="channels_last plain"; fi
  for variant in $order; do run "$variant" "$round"; done
done
python3 - "$WORK/results" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    variant, _, ms = line.split()
    runs.setdefault(variant, []).append(float(ms))
plain, cl = statistics.median(runs["plain"]), statistics.median(runs["channels_last"])
print(f"median ms/batch: plain {plain:.2f}, channels_last {cl:.2f}, ratio {cl / plain:.3f}")
PY
