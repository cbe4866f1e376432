#!/usr/bin/env bash
# Runs Tessera's whole test suite. Installs what is missing (libtorch into ~/.cache/tessera,
# Fashion-MNIST and the Shakespeare and State of the Union corpora into ~/.cache/tessera/data)
# and reuses it when present. `.ci/run` calls this.
set -euo pipefail
cd "$(dirname "$0")/.."
LIBTORCH="$(./scripts/ensure-libtorch.sh)"
export LIBTORCH

echo "== PyTorch for the export comparison (tests/export.rs) and the TorchScript models (tests/torchscript.rs)"
# The torch wheel that provides libtorch is also the Python package: its folder goes on
# PYTHONPATH. With your own LIBTORCH (not the wheel), the wheel is installed into the cache too.
PYTHON=${PYTHON:-python3}
TESSERA_TORCH_PYTHONPATH="$(dirname "$LIBTORCH")"
if ! PYTHONPATH="$TESSERA_TORCH_PYTHONPATH" "$PYTHON" -c "import torch" 2>/dev/null; then
  TESSERA_TORCH_PYTHONPATH="$(dirname "$(LIBTORCH='' ./scripts/ensure-libtorch.sh)")"
fi
if ! PYTHONPATH="$TESSERA_TORCH_PYTHONPATH" "$PYTHON" -W ignore -c "import torch"; then
  echo "error: \`import torch\` fails with PYTHONPATH=$TESSERA_TORCH_PYTHONPATH ($PYTHON)" >&2
  exit 1
fi
# torchvision for the same torch, beside it: the exported ResNet-18/50 load into its models.
TESSERA_TORCH_PYTHONPATH="$TESSERA_TORCH_PYTHONPATH:$(./scripts/ensure-torchvision.sh)"
if ! PYTHONPATH="$TESSERA_TORCH_PYTHONPATH" "$PYTHON" -W ignore -c "import torchvision"; then
  echo "error: \`import torchvision\` fails with PYTHONPATH=$TESSERA_TORCH_PYTHONPATH ($PYTHON)" >&2
  exit 1
fi
# Hugging Face transformers, beside them: the exported GPT-2 loads into its GPT2LMHeadModel.
TESSERA_TORCH_PYTHONPATH="$TESSERA_TORCH_PYTHONPATH:$(./scripts/ensure-transformers.sh)"
if ! PYTHONPATH="$TESSERA_TORCH_PYTHONPATH" "$PYTHON" -W ignore -c "import transformers"; then
  echo "error: \`import transformers\` fails with PYTHONPATH=$TESSERA_TORCH_PYTHONPATH ($PYTHON)" >&2
  exit 1
fi
export TESSERA_TORCH_PYTHONPATH
# The PyTorch comparisons must run: a failing `import torch` (or transformers) is a test
# failure, not a skip.
export TESSERA_REQUIRE_PYTORCH=1
export TESSERA_REQUIRE_TRANSFORMERS=1

echo "== MLflow for the tracking tests (tests/mlflow.rs)"
# A tracking server from PyPI, in its own cache folder (about 830 MB, under a minute to install
# on a warm network; reused after). The test starts it on the loopback address.
TESSERA_MLFLOW_PYTHONPATH="$(./scripts/ensure-mlflow.sh)"
export TESSERA_MLFLOW_PYTHONPATH
# The MLflow server tests must run: missing MLflow is a test failure, not a skip.
export TESSERA_REQUIRE_MLFLOW=1

echo "== Chromium for the explorer's report (tests/explore.rs)"
TESSERA_CHROMIUM="$(./scripts/ensure-chromium.sh)"
export TESSERA_CHROMIUM
# The browser test must run: a missing browser is a test failure, not a skip.
export TESSERA_REQUIRE_CHROMIUM=1

echo "== build (release: tests, demo and benchmarks share one build of libtorch's wrapper)"
cargo build --release --workspace --all-targets
echo "== data"
./target/release/tessera data fetch fashion-mnist
./target/release/tessera data fetch shakespeare
./target/release/tessera data fetch sotu
echo "== format and lints"
cargo fmt --all --check
cargo clippy --release --workspace --all-targets -- -D warnings
echo "== tests"
cargo test --release --workspace
