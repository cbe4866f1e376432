#!/usr/bin/env bash
# Measures checkpoint cost and resume speed with the release `tessera` binary (build it first:
# `cargo build --release --workspace`). Prints one line per measurement; figures are recorded in
# docs/reliability.md.
#
# 1. ResNet-20 (3x32x32 synthetic, batch 128, SGD with momentum, EMA plugin): size of one
#    checkpoint, time to write it, time to read + verify + restore it on resume.
# 2. Mid-epoch resume is O(1): an MLP run resumed at batch 10 and at batch 900 of a 937-batch
#    epoch; the time from start to the end of one more batch does not grow with the position.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="$PWD/target/release/tessera"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"

cat > resnet.toml <<EOF
run_name = "resnet"
[data]
dataset = "synthetic"
batch_size = 128
workers = 0
[data.synthetic]
samples = 2048
eval_samples = 128
channels = 3
height = 32
width = 32
[model]
name = "resnet20"
[optimizer]
name = "sgd"
lr = 0.1
momentum = 0.9
[train]
max_duration = "3ba"
eval_interval = "100ep"
progress = false
[checkpoint]
interval = "1ba"
[plugins]
dirs = ["$OLDPWD/target/release"]
[[algorithms]]
plugin = "ema"
half_life = "10ba"
EOF
"$BIN" train resnet.toml 2> resnet.log
grep -o 'checkpoint .*ckpt ([0-9.]* MB in [0-9]* ms)' resnet.log | sed 's/^/resnet20 write: /'
"$BIN" train resnet.toml --set train.max_duration=4ba --set checkpoint.autoresume=true 2> resume.log
grep -o 'read and verified in [0-9]* ms, restored in [0-9]* ms' resume.log | sed 's/^/resnet20 resume: /'

cat > mlp.toml <<EOF
run_name = "mlp"
[data]
dataset = "synthetic"
batch_size = 64
workers = 0
[data.synthetic]
samples = 60000
eval_samples = 64
[model]
name = "mlp"
hidden = [32]
[optimizer]
name = "sgd"
lr = 0.05
[train]
max_duration = "901ba"
eval_interval = "100ep"
log_interval = "1000ba"
progress = false
[checkpoint]
interval = "10ba"
keep = 0
EOF
"$BIN" train mlp.toml 2> mlp.log
for at in 10 900; do
  ckpt="runs/mlp/checkpoints/ep0-ba$at.ckpt"
  for round in 1 2 3; do
    start=$(date +%s.%N)
    "$BIN" train mlp.toml --set run_name=\"r$at-$round\" --set checkpoint.save=false \
      --set checkpoint.load=\""$ckpt"\" --set train.max_duration=$((at + 1))ba 2> r.log
    end=$(date +%s.%N)
    echo "mlp resume at batch $at of 937, one more batch, whole process: $(echo "$end - $start" | bc) s"
  done
done
