#!/usr/bin/env bash
# Instruction tuning with LoRA, end to end (README.md beside this file):
#   1. dialogue pairs from the Shakespeare corpus (tessera data fetch, make_dialogues.py);
#   2. a SmolLM-sized llama fine-tuned with LoRA on them (sft.toml), the loss on the answers;
#   3. the adapters exported for PEFT, and the model with them merged as a Hugging Face folder;
#   4. samples generated from the merged folder (`tessera generate`).
# STEPS=N cuts the run to N batches of 2 sequences of 64 tokens (tests/models/chat.rs runs it so, in
# CI). TESSERA names the binary (default: the checkout's release build); PYTHON runs the
# standard-library script that makes the dialogues.
set -euo pipefail
cd "$(dirname "$0")"
TESSERA=${TESSERA:-../../target/release/tessera}
PYTHON=${PYTHON:-python3}
DATA=${TESSERA_DATA:-$HOME/.cache/tessera/data}
short=()
limit=2000
if [ -n "${STEPS:-}" ]; then
  short=(--set "train.max_duration=${STEPS}ba" --set "train.eval_interval=${STEPS}ba"
    --set "checkpoint.interval=${STEPS}ba" --set train.progress=false
    --set data.batch_size=2 --set data.eval_batch_size=2 --set data.text.seq_len=64
    --set train.eval_subset_batches=1)
  limit=200
  NEW_TOKENS=${NEW_TOKENS:-8}
fi
mkdir -p data out

echo "== dialogues from the Shakespeare corpus"
"$TESSERA" data fetch shakespeare
"$PYTHON" make_dialogues.py "$DATA/shakespeare" data/dialogues.jsonl --limit "$limit"

echo "== LoRA fine-tuning of a SmolLM-sized llama"
"$TESSERA" train sft.toml "${short[@]}"
ckpt=../../runs/sft-smollm-lora/checkpoints/latest.ckpt

echo "== the adapters for PEFT, and the merged model for transformers"
"$TESSERA" export "$ckpt" --format peft --to out/adapter
# The folder gets the BPE the run trained on the dialogues (no tokenizer was given) as its
# tokenizer.json.
"$TESSERA" export "$ckpt" --format hf --to out/merged

echo "== samples from the merged model (the prompt rendered as the ChatML template renders it)"
system="You are a character in a Shakespeare play. Answer the line you are given in verse or prose, in character."
prompt=$'<|im_start|>system\n'"$system"$'<|im_end|>\n<|im_start|>user\nKing: Welcome, good friends, to our court.<|im_end|>\n<|im_start|>assistant\n'
"$TESSERA" generate out/merged --prompt "$prompt" --max-new-tokens "${NEW_TOKENS:-60}" \
  --temperature 0.8 --top-k 50 --seed 1 --stop "<|im_end|>"
