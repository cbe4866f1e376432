#!/usr/bin/env bash
# Memory of loading a Hugging Face folder, measured: `init_weights` (here through
# `tessera generate DIR`, which builds the model from DIR/config.json and loads DIR's weights with
# the same reader) reads a sharded folder shard by shard, so its peak should stay within the
# model plus the largest shard, where a single model.safetensors is read whole (model + file).
#
# transformers saves one random llama (hidden 1024, 8 layers, SwiGLU of 2816, vocabulary 32000,
# untied head: 168M parameters, 673 MB in fp32) twice: as shards of at most SHARD (default
# 100MB) with model.safetensors.index.json, and as one model.safetensors. A tiny llama of the
# same layout (hidden 64, 1 layer, vocabulary 256) gives the process's own baseline (libtorch,
# the binary). Each folder generates 1 token from 1 prompt token; peak resident memory by
# /usr/bin/time, ROUNDS rounds alternating, medians. Not part of the test suite; docs/models.md
# records its output.
#   SHARD=100MB ROUNDS=3 ./scripts/bench-init-memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."
LIBTORCH="$(./scripts/ensure-libtorch.sh)"
export LIBTORCH
cargo build --release -p tessera >&2
PYTHON=${PYTHON:-python3}
PYPATH="$(dirname "$LIBTORCH"):$(./scripts/ensure-transformers.sh)"
SHARD=${SHARD:-100MB}
ROUNDS=${ROUNDS:-3}
BIN="$PWD/target/release/tessera"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

PYTHONPATH="$PYPATH" "$PYTHON" -W ignore - "$WORK" "$SHARD" <<'PY'
import os, sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM

work, shard = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
def llama(hidden, layers, inner, vocab):
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=inner, num_hidden_layers=layers,
        num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=256,
        tie_word_embeddings=False)).eval()
big = llama(1024, 8, 2816, 32000)
big.save_pretrained(os.path.join(work, "sharded"), max_shard_size=shard)
big.save_pretrained(os.path.join(work, "single"), max_shard_size="100GB")
llama(64, 1, 128, 256).save_pretrained(os.path.join(work, "tiny"))
print(f"parameters {sum(p.numel() for p in big.parameters())}", file=sys.stderr)
PY

bytes_of() { du -cb "$@" | tail -1 | cut -f1; }
model=$(bytes_of "$WORK"/single/model.safetensors)
largest=$(ls -l "$WORK"/sharded/model-*.safetensors | awk '{print $5}' | sort -n | tail -1)
shards=$(ls "$WORK"/sharded/model-*.safetensors | wc -l)

declare -A peaks
for round in $(seq "$ROUNDS"); do
  for folder in tiny sharded single; do
    /usr/bin/time -o "$WORK/time" -f "%M" "$BIN" generate "$WORK/$folder" --prompt-ids 1 \
      --max-new-tokens 1 >/dev/null 2>"$WORK/log" || { cat "$WORK/log" >&2; exit 1; }
    kb=$(tail -1 "$WORK/time")
    peaks[$folder]+="$kb "
    echo "round $round $folder: peak $((kb / 1024)) MiB" >&2
  done
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
mib() { echo $(($1 / 1048576)); }
base=$(( $(echo "${peaks[tiny]}" | median) * 1024 ))
sharded=$(( $(echo "${peaks[sharded]}" | median) * 1024 ))
single=$(( $(echo "${peaks[single]}" | median) * 1024 ))
echo "model (fp32 safetensors): $(mib "$model") MiB; $shards shards, the largest $(mib "$largest") MiB"
echo "process baseline (tiny llama): $(mib "$base") MiB peak"
printf '%-28s %10s %16s %22s\n' folder "peak MiB" "above baseline" "bound (model + shard)"
printf '%-28s %10s %16s %22s\n' "sharded ($shards files)" "$(mib "$sharded")" "$(mib $((sharded - base)))" "$(mib $((model + largest)))"
printf '%-28s %10s %16s %22s\n' "single model.safetensors" "$(mib "$single")" "$(mib $((single - base)))" "$(mib $((model + model)))"
