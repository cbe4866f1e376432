#!/usr/bin/env bash
# Memory of a LoRA fine-tune against a full one, measured: a GPT-2-small-sized llama (12 layers,
# hidden 768, 12 heads, SwiGLU of 2048, vocabulary 50257, tied head: 113.6M parameters) trained
# with AdamW in fp32 for STEPS batches of 1 x SEQ tokens, so that activations are small next to
# parameters, gradients and optimizer state. Every parameter trained, then the `lora` plugin
# (rank R, default 8, on q_proj and v_proj: the base frozen). Rank 0's CPU memory allocated by
# libtorch on the training thread (TESSERA_MEMORY_PEAK=1): right after the last optimizer step
# (run.json `memory_after_step_bytes`: parameters, gradients, optimizer state) and its peak from
# the end of set-up on (`memory_peak_bytes`), beside the ideal after the step (full: 16 bytes a
# parameter, fp32 weights, gradients and two AdamW moments; LoRA: 4 bytes a frozen parameter and
# 16 an adapter one). Not part of the test suite; docs/lora.md records its output.
#   SEQ=64 STEPS=3 R=8 ./scripts/bench-lora-memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."
LIBTORCH="$(./scripts/ensure-libtorch.sh)"
export LIBTORCH
cargo build --release -p tessera -p lora >&2
SEQ=${SEQ:-64}
STEPS=${STEPS:-3}
R=${R:-8}
BIN="$PWD/target/release/tessera"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
for run in full lora; do
  extra=""
  if [ "$run" = lora ]; then
    extra="[plugins]
dirs = [\"$PWD/target/release\"]

[[algorithms]]
plugin = \"lora\"
r = $R
lora_alpha = $((2 * R)).0"
  fi
  cat >"$WORK/$run.toml" <<TOML
run_name = "$run"
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
name = "llama"
num_hidden_layers = 12
hidden_size = 768
intermediate_size = 2048
num_attention_heads = 12
num_key_value_heads = 12
max_position_embeddings = 1024

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

$extra
TOML
  (cd "$WORK" && TESSERA_MEMORY_PEAK=1 timeout 900 "$BIN" train "$run.toml" >/dev/null 2>"$run.err") ||
    { cat "$WORK/$run.err" >&2; exit 1; }
done
python3 - "$WORK" "$R" <<'PY'
import json, sys
work, r = sys.argv[1], int(sys.argv[2])
layers, hidden = 12, 768
n = 12 * (4 * hidden * hidden + 3 * hidden * 2048 + 2 * hidden) + 50257 * hidden + hidden
adapters = layers * 2 * (r * hidden + hidden * r)
ideal = {"full": 16 * n, "lora": 4 * n + 16 * adapters}
print(f"parameters {n} ({n / 1e6:.1f}M), LoRA rank {r} on q_proj and v_proj: {adapters} adapter parameters")
print(f"{'run':<6} {'after step MiB':>14} {'peak MiB':>10} {'ideal MiB':>10} {'ratio':>6}")
rows = {}
for run in ("full", "lora"):
    record = json.load(open(f"{work}/runs/{run}/run.json"))
    steady, peak = record["memory_after_step_bytes"], record["memory_peak_bytes"]
    rows[run] = (steady, peak)
    print(f"{run:<6} {steady / 2**20:14.0f} {peak / 2**20:10.0f} {ideal[run] / 2**20:10.0f} {steady / ideal[run]:6.2f}")
print(f"lora / full: after step {rows['lora'][0] / rows['full'][0]:.3f}, peak {rows['lora'][1] / rows['full'][1]:.3f}")
PY
