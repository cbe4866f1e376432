#!/usr/bin/env bash
# Prints a folder holding Hugging Face peft and accelerate (which peft imports) and psutil
# (which accelerate imports), installing them when missing: peft==$TESSERA_PEFT_VERSION (default
# 0.21.2) and accelerate==$TESSERA_ACCELERATE_VERSION (default 1.16.0) with pip into a cache
# folder outside the repository ($TESSERA_CACHE, default ~/.cache/tessera), once. Put it on
# PYTHONPATH after transformers' folder (scripts/ensure-transformers.sh): tests/models/lora.rs loads
# Tessera's exported LoRA adapter onto the base model with peft's PeftModel.
#
# peft and accelerate are installed without their requirements (torch, transformers, numpy,
# safetensors, huggingface-hub, pyyaml, ... come from the torch wheel's and transformers'
# folders), so that pip installs no second torch.
set -euo pipefail
PEFT=${TESSERA_PEFT_VERSION:-0.21.2}
ACCELERATE=${TESSERA_ACCELERATE_VERSION:-1.16.0}
CACHE=${TESSERA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}
DEST="$CACHE/peft-$PEFT"
if [ ! -f "$DEST/peft/__init__.py" ]; then
  mkdir -p "$CACHE"
  PARTIAL="$DEST.partial.$$"
  rm -rf "$PARTIAL"
  echo "installing peft $PEFT, accelerate $ACCELERATE and psutil into $DEST" >&2
  PYTHON=${PYTHON:-python3}
  "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-cache-dir --no-deps \
    --target "$PARTIAL" "peft==$PEFT" "accelerate==$ACCELERATE" psutil >&2
  rm -rf "$DEST"
  mv "$PARTIAL" "$DEST"
fi
echo "$DEST"
