#!/usr/bin/env bash
# Host reads and libtorch operator calls per training step, as the observer in the C++ shim
# counts them (run.json's `host_reads`, host/csrc/observe.cpp), for GPT-2 small (124M
# parameters, AdamW) and ResNet-50 (SGD with momentum) with their defaults and under amp_bf16,
# and the same models with the plugins of the GPT and vision recipes. CPU runs of STEPS (4)
# steps: the counts do not depend on the device (the same code runs on CUDA), the times here say
# nothing about a GPU. Not part of the test suite; docs/benchmarks.md records its output.
#   STEPS=4 SEQ=256 IMAGE=64 ./scripts/bench-host-reads.sh
set -euo pipefail
cd "$(dirname "$0")/.."
LIBTORCH="$(./scripts/ensure-libtorch.sh)"
export LIBTORCH
cargo build --release --workspace >&2
STEPS=${STEPS:-4}
SEQ=${SEQ:-256}
IMAGE=${IMAGE:-64}
BIN="$PWD/target/release/tessera"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# `run NAME PRECISION MODEL DATA OPTIMIZER ALGORITHMS`: trains and prints one row.
run() {
  local name=$1 precision=$2 model=$3 data=$4 optimizer=$5 algorithms=$6
  local dir="$WORK/$name-$precision"
  mkdir -p "$dir"
  cat >"$dir/trainer.toml" <<TOML
run_name = "r"
seed = 1
output_dir = "runs"

[data]
$data

[model]
$model

[optimizer]
$optimizer

[train]
max_duration = "${STEPS}ba"
eval_interval = "1000ba"
eval_subset_batches = 1
log_interval = "1000ba"
progress = false
device = "cpu"
precision = "$precision"

[plugins]
dirs = ["$PWD/target/release"]
$algorithms
TOML
  (cd "$dir" && timeout 1800 "$BIN" train trainer.toml >"$dir/log" 2>&1) || {
    echo "$name $precision: failed (see below)" >&2
    tail -20 "$dir/log" >&2
    return 1
  }
  python3 - "$dir/runs/r/run.json" "$name" "$precision" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["host_reads"]
steps = r["steps"]
by = r.get("in_steps_by_source") or {}
sources = ", ".join(f"{s}: {sum(o.values())}" for s, o in by.items()) or "-"
print(f"| {sys.argv[2]} | {sys.argv[3]} | {steps} | {r['in_steps'] / steps:g} | "
      f"{r['counted']['in_steps'] / steps:g} | {r['operators_in_steps'] / steps:.0f} | "
      f"{r['all_operators_in_steps'] / steps:.0f} | {sources} |")
PY
}

GPT2_SMALL='name = "gpt2"
n_layer = 12
n_head = 12
n_embd = 768
n_positions = 1024'
TEXT="dataset = \"synthetic-text\"
batch_size = 1
eval_batch_size = 1
workers = 0

[data.text]
seq_len = $SEQ
vocab_size = 50257
tokens = $((SEQ * (STEPS + 2) + 1))
eval_tokens = $((SEQ + 1))"
IMAGES="dataset = \"synthetic\"
batch_size = 2
eval_batch_size = 2
workers = 0

[data.synthetic]
samples = $((2 * STEPS))
eval_samples = 2
channels = 3
height = $IMAGE
width = $IMAGE
classes = 1000"
GPT_METHODS='
[[algorithms]]
plugin = "alibi"
max_sequence_length = '"$SEQ"'

[[algorithms]]
plugin = "gated_linear_units"

[[algorithms]]
plugin = "seq_length_warmup"
duration = 0.5
min_seq_length = 128
max_seq_length = 256
step_size = 128'
VISION_METHODS='
[[algorithms]]
plugin = "channels_last"

[[algorithms]]
plugin = "blurpool"

[[algorithms]]
plugin = "label_smoothing"
smoothing = 0.1

[[algorithms]]
plugin = "mixup"
alpha = 0.2

[[algorithms]]
plugin = "stochastic_depth"
drop_rate = 0.1
stochastic_method = "sample"

[[algorithms]]
plugin = "ema"
half_life = "2ba"'

echo "| model | precision | steps | host reads / step | trainer-counted / step | operator calls / step (top level) | all operator calls / step | reads by source |"
echo "|---|---|---|---|---|---|---|---|"
for precision in fp32 amp_bf16; do
  run gpt2-small "$precision" "$GPT2_SMALL" "$TEXT" 'name = "adamw"
lr = 0.0006' ""
  run resnet50 "$precision" 'name = "resnet50"' "$IMAGES" 'name = "sgd"
lr = 0.1
momentum = 0.9' ""
done
run "gpt2-small + alibi, glu, seq_length_warmup" fp32 "$GPT2_SMALL" "$TEXT" 'name = "adamw"
lr = 0.0006' "$GPT_METHODS"
run "resnet50 + channels_last, blurpool, label_smoothing, mixup, stochastic_depth (sample), ema" fp32 'name = "resnet50"' "$IMAGES" 'name = "sgd"
lr = 0.1
momentum = 0.9' "$VISION_METHODS"
