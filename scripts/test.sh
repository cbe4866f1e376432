#!/usr/bin/env bash
# Runs Tessera's whole test suite. Installs what is missing (libtorch into ~/.cache/tessera,
# Fashion-MNIST and the Shakespeare and State of the Union corpora into ~/.cache/tessera/data)
# and reuses it when present. `.ci/run` calls this.
#
# Each phase prints its time when it ends (`== build: done (took 3m12s)`), and a summary of all
# phases is printed at the end, also when a phase fails (the failing one is marked FAILED).
set -euo pipefail
cd "$(dirname "$0")/.."

PHASES=()
PHASE=""
PHASE_STARTED=0
# 75 -> 1m15s
took() {
  local s=$1
  if ((s >= 3600)); then
    printf '%dh%02dm%02ds' $((s / 3600)) $((s % 3600 / 60)) $((s % 60))
  elif ((s >= 60)); then
    printf '%dm%02ds' $((s / 60)) $((s % 60))
  else
    printf '%ds' "$s"
  fi
}
# Ends the current phase (if any) with outcome $1 and prints its time.
end_phase() {
  [ -n "$PHASE" ] || return 0
  local seconds=$((SECONDS - PHASE_STARTED))
  PHASES+=("$PHASE|$seconds|$1")
  echo "== $PHASE: $1 (took $(took "$seconds"))"
  PHASE=""
}
# `phase NAME WHAT`: ends the current phase and starts NAME, printing `== NAME: WHAT`.
phase() {
  end_phase done
  PHASE=$1
  PHASE_STARTED=$SECONDS
  echo "== $1: $2"
}
summary() {
  local rc=$?
  if ((rc == 0)); then end_phase done; else end_phase FAILED; fi
  echo "== summary"
  local entry name seconds outcome
  for entry in "${PHASES[@]}"; do
    IFS='|' read -r name seconds outcome <<<"$entry"
    printf '   %-10s %9s  %s\n' "$name" "$(took "$seconds")" "$outcome"
  done
  printf '   %-10s %9s  %s\n' total "$(took "$SECONDS")" "$( ((rc == 0)) && echo passed || echo "FAILED (exit $rc)")"
  exit "$rc"
}
trap summary EXIT

phase libtorch "libtorch (~/.cache/tessera, or LIBTORCH)"
LIBTORCH="$(./scripts/ensure-libtorch.sh)"
export LIBTORCH
# libjpeg-turbo for the JPEG region decoder (build.rs falls back to the `image` crate without it).
./scripts/ensure-libjpeg.sh || true

phase pytorch "PyTorch, torchvision, transformers and timm for the comparisons (tests/models/export.rs, finetune.rs, vit.rs) and the TorchScript models (tests/models/torchscript.rs)"
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
# timm, beside them: Tessera's ViTs load timm's weights and their exports load into timm.
TESSERA_TORCH_PYTHONPATH="$TESSERA_TORCH_PYTHONPATH:$(./scripts/ensure-timm.sh)"
if ! PYTHONPATH="$TESSERA_TORCH_PYTHONPATH" "$PYTHON" -W ignore -c "import timm"; then
  echo "error: \`import timm\` fails with PYTHONPATH=$TESSERA_TORCH_PYTHONPATH ($PYTHON)" >&2
  exit 1
fi
# peft, beside them: Tessera's exported LoRA adapters load onto the base model with PeftModel.
TESSERA_TORCH_PYTHONPATH="$TESSERA_TORCH_PYTHONPATH:$(./scripts/ensure-peft.sh)"
if ! PYTHONPATH="$TESSERA_TORCH_PYTHONPATH" "$PYTHON" -W ignore -c "import peft"; then
  echo "error: \`import peft\` fails with PYTHONPATH=$TESSERA_TORCH_PYTHONPATH ($PYTHON)" >&2
  exit 1
fi
export TESSERA_TORCH_PYTHONPATH
# The PyTorch comparisons must run: a failing `import torch` (or transformers) is a test
# failure, not a skip.
export TESSERA_REQUIRE_PYTORCH=1
export TESSERA_REQUIRE_TRANSFORMERS=1

phase mlflow "MLflow for the tracking tests (tests/trainer/mlflow.rs)"
# A tracking server from PyPI, in its own cache folder (about 830 MB, under a minute to install
# on a warm network; reused after). The test starts it on the loopback address.
TESSERA_MLFLOW_PYTHONPATH="$(./scripts/ensure-mlflow.sh)"
export TESSERA_MLFLOW_PYTHONPATH
# The MLflow server tests must run: missing MLflow is a test failure, not a skip.
export TESSERA_REQUIRE_MLFLOW=1

phase chromium "Chromium for the explorer's report (tests/trainer/explore.rs)"
TESSERA_CHROMIUM="$(./scripts/ensure-chromium.sh)"
export TESSERA_CHROMIUM
# The browser test must run: a missing browser is a test failure, not a skip.
export TESSERA_REQUIRE_CHROMIUM=1

phase streaming "MosaicML Streaming and WebDataset for the shard tests (tests/data/streaming.rs)"
# The MDS and WebDataset writers and readers, beside torch, torchvision and transformers (which
# `streaming` imports): the tests write shards with them and read Tessera's back.
TESSERA_STREAMING_PYTHONPATH="$TESSERA_TORCH_PYTHONPATH:$(./scripts/ensure-streaming.sh)"
if ! PYTHONPATH="$TESSERA_STREAMING_PYTHONPATH" "$PYTHON" -W ignore -c "import streaming, webdataset"; then
  echo "error: \`import streaming, webdataset\` fails with PYTHONPATH=$TESSERA_STREAMING_PYTHONPATH ($PYTHON)" >&2
  exit 1
fi
export TESSERA_STREAMING_PYTHONPATH
# The shard tests must run: missing packages are a test failure, not a skip.
export TESSERA_REQUIRE_STREAMING=1

phase moto "moto, a local S3 server, for the remote dataset tests (tests/data/s3.rs)"
# The test starts `python -m moto.server` on the loopback address and uploads shards with boto3.
TESSERA_MOTO_PYTHONPATH="$(./scripts/ensure-moto.sh)"
if ! PYTHONPATH="$TESSERA_MOTO_PYTHONPATH" "$PYTHON" -W ignore -c "import moto.server, boto3"; then
  echo "error: \`import moto.server, boto3\` fails with PYTHONPATH=$TESSERA_MOTO_PYTHONPATH ($PYTHON)" >&2
  exit 1
fi
export TESSERA_MOTO_PYTHONPATH
# The S3 tests must run: a missing server is a test failure, not a skip.
export TESSERA_REQUIRE_MOTO=1

# Waiting OpenMP threads sleep instead of spinning. Two test threads each run a `tessera` (or a
# PyTorch reference) that uses every core, so the cores are shared by more compute threads than
# there are cores; libgomp's default lets an idle thread spin for a while before it sleeps, and
# the spinning threads take the CPU from the ones with work. Only the waiting changes (the
# threads and the order of every reduction are the same, so every result is), and the test
# binaries take 30-40 % less time (docs/testing.md, "Threads that wait sleep").
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"

phase build "release: tests, demo and benchmarks share one build of libtorch's wrapper"
cargo build --release --workspace --all-targets
phase data "Fashion-MNIST, Shakespeare, State of the Union"
./target/release/tessera data fetch fashion-mnist
./target/release/tessera data fetch shakespeare
./target/release/tessera data fetch sotu
phase fmt "cargo fmt --check"
cargo fmt --all --check
phase tests "cargo test --release --workspace --no-fail-fast, and cargo clippy -D warnings beside it"
# --no-fail-fast: every test binary runs, so one failure does not hide the others.
#
# `cargo clippy` type-checks every crate again (about 3.5 min of CPU on a clean clone) and the
# tests leave a core idle now and then (a long test finishing alone, a process starting), so
# clippy runs beside them at the lowest priority and takes what they leave. It starts once
# `cargo test` runs its first test binary: cargo holds the build folder's lock while it builds
# (here: finds everything built) and lets go before it runs the tests. Its output is printed
# after the tests; a lint fails the script as a failing test does.
TESTS_LOG="$(mktemp)"
CLIPPY_LOG="$(mktemp)"
cargo test --release --workspace --no-fail-fast > >(tee "$TESTS_LOG") 2>&1 &
TESTS_PID=$!
for _ in $(seq 600); do
  grep -q '^     Running ' "$TESTS_LOG" && break
  kill -0 "$TESTS_PID" 2>/dev/null || break
  sleep 1
done
CLIPPY_STARTED=$SECONDS
CLIPPY_TIME="$(mktemp)"
(
  rc=0
  nice -n 19 cargo clippy --release --workspace --all-targets -- -D warnings > "$CLIPPY_LOG" 2>&1 || rc=$?
  echo $((SECONDS - CLIPPY_STARTED)) > "$CLIPPY_TIME"
  exit "$rc"
) &
CLIPPY_PID=$!
TESTS_RC=0
wait "$TESTS_PID" || TESTS_RC=$?
CLIPPY_RC=0
wait "$CLIPPY_PID" || CLIPPY_RC=$?
rm -f "$TESTS_LOG"
echo "== clippy: beside the tests, from $(took $((CLIPPY_STARTED - PHASE_STARTED))) into them, took $(took "$(cat "$CLIPPY_TIME" 2>/dev/null || echo 0)")"
cat "$CLIPPY_LOG"
rm -f "$CLIPPY_LOG" "$CLIPPY_TIME"
if ((CLIPPY_RC != 0)); then
  echo "error: cargo clippy --release --workspace --all-targets -- -D warnings failed (exit $CLIPPY_RC)" >&2
fi
if ((TESTS_RC != 0)); then
  exit "$TESTS_RC"
fi
exit "$CLIPPY_RC"
