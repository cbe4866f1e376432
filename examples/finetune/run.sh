#!/usr/bin/env bash
# Runs the fine-tuning examples end to end (README.md beside this file):
#   1. GPT-2: pretrain on sotu, export, continue on Shakespeare from the exported weights;
#   2. ResNet-18: torchvision's weights (make_resnet18.py) fine-tuned on an image folder made
#      by `tessera data export-folder`;
#   3. BERT: a masked LM pretrained on sotu, exported, fine-tuned as a classifier of the
#      labelled sentences in labelled-text/.
# STEPS=N cuts every run to N batches (tests/models/finetune.rs runs it so, in CI). TESSERA names the
# binary (default: the checkout's release build); PYTHON needs torch, torchvision, safetensors.
set -euo pipefail
cd "$(dirname "$0")"
TESSERA=${TESSERA:-../../target/release/tessera}
PYTHON=${PYTHON:-python3}
DATA=${TESSERA_DATA:-$HOME/.cache/tessera/data}
short=()
limit=()
if [ -n "${STEPS:-}" ]; then
  short=(--set "train.max_duration=${STEPS}ba" --set "train.eval_interval=${STEPS}ba"
    --set "checkpoint.interval=${STEPS}ba" --set train.progress=false)
  limit=(--limit 20)
fi
mkdir -p weights data

echo "== GPT-2: pretraining on sotu"
"$TESSERA" train gpt2-pretrain.toml "${short[@]}"
"$TESSERA" export ../../runs/finetune-gpt2-pretrain/checkpoints/latest.ckpt \
  --to weights/gpt2-sotu.safetensors
cp "$DATA/sotu/tokenizer-bpe-4096.json" weights/gpt2-sotu-tokenizer.json
echo "== GPT-2: continuing on Shakespeare from the exported weights"
"$TESSERA" train gpt2-shakespeare.toml "${short[@]}"

echo "== ResNet-18: fine-tuning on an image folder"
if [ ! -d data/fashion-mnist-folder ]; then
  "$TESSERA" data export-folder fashion-mnist data/fashion-mnist-folder "${limit[@]}"
fi
if [ ! -f weights/resnet18.safetensors ]; then
  "$PYTHON" make_resnet18.py weights/resnet18.safetensors
fi
"$TESSERA" train resnet18-folder.toml "${short[@]}"

echo "== BERT: masked-LM pretraining on sotu"
"$TESSERA" train bert-pretrain.toml "${short[@]}"
"$TESSERA" export ../../runs/finetune-bert-pretrain/checkpoints/latest.ckpt \
  --to weights/bert-sotu.safetensors
cp "$DATA/sotu/tokenizer-bpe-4096.json" weights/bert-sotu-tokenizer.json
echo "== BERT: fine-tuning a classifier of labelled sentences from the exported weights"
"$TESSERA" train bert-classify.toml "${short[@]}"
