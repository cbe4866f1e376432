#!/usr/bin/env bash
# Tokens/s of the small GPT of examples/gpt (no methods) on Shakespeare: `tessera train` against
# a plain PyTorch loop on the same model, token files, packing, batch and AdamW, alternating
# rounds, medians and the time ratio (scripts/bench_gpt.py and bench_gpt_pytorch.py say what is
# timed). Not part of the test suite. ROUNDS (3), BATCHES (35), WARMUP (5), THREADS (2) tune it,
# e.g. `ROUNDS=5 BATCHES=60 ./scripts/bench-gpt.sh`; ACT=gelu_pytorch_tanh gives the PyTorch side
# the fused GELU kernel Tessera uses; TWIN=1 uses the hand-written model instead of transformers.
set -euo pipefail
cd "$(dirname "$0")/.."
LIBTORCH="$(./scripts/ensure-libtorch.sh)"
export LIBTORCH
cargo build --release --workspace
./target/release/tessera data fetch shakespeare >/dev/null
PYTHON=${PYTHON:-python3}
TORCH_PATH="$(dirname "$LIBTORCH")"
if ! PYTHONPATH="$TORCH_PATH" "$PYTHON" -c "import torch" 2>/dev/null; then
  TORCH_PATH="$(dirname "$(LIBTORCH='' ./scripts/ensure-libtorch.sh)")"
fi
# transformers for GPT2LMHeadModel; without it the PyTorch side uses its hand-written twin.
HF_PATH="$(PYTHONPATH="$TORCH_PATH" ./scripts/ensure-transformers.sh 2>/dev/null || true)"
# The token cache (tokens-<sha16>/train.u16) that both sides read: a first short run writes it.
export TESSERA="$PWD/target/release/tessera"
PYTHONPATH="$TORCH_PATH${HF_PATH:+:$HF_PATH}" exec "$PYTHON" -W ignore scripts/bench_gpt.py
