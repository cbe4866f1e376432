#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU and its own PyTorch (no network, no Rust),
# with gpu-bundle/ (scripts/gpu-bundle.sh, built here against that PyTorch's version) beside
# it, runs in well under 8 minutes:
#   1. the example (CNN + label_smoothing + cutout, Fashion-MNIST, 3 epochs) on CUDA, fp32;
#   2. the same in bf16 autocast;
#   3. resume exactness on CUDA: 200 batches straight, against 100 + resume from the checkpoint
#      at 100 to 200; and a second straight run, for the run-to-run difference of the GPU's
#      kernels themselves;
#   4. the whole-run benchmark against plain PyTorch on the same GPU (scripts/bench_vs_pytorch.py,
#      CNN, ResNet-20, MLP, alternating rounds);
# then prints one summary (also written to $OUT/summary.txt, with every run.json and log).
#
#   bash scripts/gpu-check.sh        # docs/gpu.md says how it is run through the device tool
#
# Environment: OUT (where results go; default /tmp/gpu-check), BUNDLE (gpu-bundle), PYTHON,
# DEVICE (cuda; `cpu` rehearses the whole script on a machine without a GPU), QUICK=1 (short
# runs, for that rehearsal), ROUNDS (3, benchmark rounds).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-check}
BUNDLE=${BUNDLE:-gpu-bundle}
PYTHON=${PYTHON:-python3}
export PYTHONWARNINGS=ignore
DEVICE=${DEVICE:-cuda}
ROUNDS=${ROUNDS:-3}
mkdir -p "$OUT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
started=$(date +%s)
elapsed() { echo "$(($(date +%s) - started))s"; }

if [ ! -x "$BUNDLE/bin/tessera" ]; then
  echo "no $BUNDLE/bin/tessera: run scripts/gpu-bundle.sh first (on the build machine)" >&2
  exit 1
fi
TORCH_DIR=$("$PYTHON" -c "import os, torch; print(os.path.dirname(torch.__file__))") || {
  echo "$PYTHON cannot import torch" >&2
  exit 1
}
# The binaries' rpath names the build machine's libtorch; here it is this PyTorch's.
export LD_LIBRARY_PATH="$TORCH_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
TESSERA="$PWD/$BUNDLE/bin/tessera"
TORCH_VERSION=$("$PYTHON" -c "import torch; print(torch.__version__)")
say "== Tessera GPU check, $(date -u +%Y-%m-%dT%H:%MZ), commit $(cat "$BUNDLE/COMMIT" 2>/dev/null)"
say "torch here: $TORCH_VERSION; bundle built against libtorch $(cat "$BUNDLE/BUILT_AGAINST")"
if [ "$DEVICE" != cpu ]; then
  say "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
  "$PYTHON" -c "import torch; assert torch.cuda.is_available(), 'torch sees no GPU'" || exit 1
fi

# Fashion-MNIST from the bundle (no network here).
DATA="$WORK/data"
mkdir -p "$DATA/fashion-mnist"
for f in "$BUNDLE"/data/fashion-mnist/*.gz; do
  gunzip -c "$f" >"$DATA/fashion-mnist/$(basename "$f" .gz)"
done
cp "$BUNDLE/data/fashion-mnist/VERIFIED" "$DATA/fashion-mnist/"

EXAMPLE=examples/fashion-mnist/trainer.toml
if [ "${QUICK:-0}" = 1 ]; then EPOCHS=30ba; STRAIGHT=20; HALF=10; SCALE=1; else EPOCHS=3ep; STRAIGHT=200; HALF=100; SCALE=6; fi
common=(--set "train.device=\"$DEVICE\"" --set "data.data_dir=\"$DATA\"" --set "data.fetch=false"
  --set "plugins.dirs=[\"$PWD/$BUNDLE/plugins\"]" --set "output_dir=\"$WORK/runs\""
  --set "train.progress=false")
# `train NAME ARGS...`: one tessera run; its log and run.json go to $OUT/NAME.*.
train() {
  local name=$1
  shift
  timeout 240 "$TESSERA" train "$EXAMPLE" "${common[@]}" --set "run_name=\"$name\"" "$@" \
    >"$OUT/$name.log" 2>&1
  local rc=$?
  cp "$WORK/runs/$name/run.json" "$OUT/$name.run.json" 2>/dev/null
  return $rc
}
# `report NAME LABEL`: accuracy and throughput of a finished run.
report() {
  "$PYTHON" - "$OUT/$1.run.json" "$2" <<'PY' | tee -a "$SUMMARY"
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]}: {r['status']}, device {r['device']}, {r['batches']} batches, "
      f"accuracy {r['final_accuracy']}, {r['samples_per_second']:.0f} samples/s, "
      f"training {r['train_seconds']:.1f} s")
PY
}

say ""
say "== 1. the example on $DEVICE, fp32 ($EPOCHS) [$(elapsed)]"
if train example-fp32 --set "train.max_duration=\"$EPOCHS\"" --set "data.workers=4"; then
  report example-fp32 "fp32"
else
  say "FAILED (exit $?): tail of $OUT/example-fp32.log:"; tail -5 "$OUT/example-fp32.log" | tee -a "$SUMMARY"
fi

say ""
say "== 2. the same in bf16 autocast [$(elapsed)]"
if train example-bf16 --set "train.max_duration=\"$EPOCHS\"" --set "data.workers=4" \
  --set 'train.precision="amp_bf16"'; then
  report example-bf16 "amp_bf16"
else
  say "FAILED (exit $?): tail of $OUT/example-bf16.log:"; tail -5 "$OUT/example-bf16.log" | tee -a "$SUMMARY"
fi

say ""
say "== 3. resume on $DEVICE: ${STRAIGHT} batches straight vs ${HALF} + resume [$(elapsed)]"
resume_ok=1
ckpt=(--set "checkpoint.interval=\"${HALF}ba\"" --set "train.max_duration=\"${STRAIGHT}ba\""
  --set "train.eval_interval=\"${STRAIGHT}ba\"" --set "data.workers=0")
train straight-a "${ckpt[@]}" || resume_ok=0
train straight-b "${ckpt[@]}" || resume_ok=0
half=$(ls "$WORK/runs/straight-a/checkpoints/"*-ba"$HALF".ckpt 2>/dev/null | head -1)
if [ -n "$half" ]; then
  train resumed "${ckpt[@]}" --set "checkpoint.load=\"$half\"" || resume_ok=0
else
  say "no checkpoint at batch $HALF in straight-a"; resume_ok=0
fi
if [ $resume_ok = 1 ]; then
  final=$(basename "$(ls "$WORK/runs/straight-a/checkpoints/"*-ba"$STRAIGHT".ckpt | head -1)")
  for other in resumed straight-b; do
    result=$("$PYTHON" scripts/compare_checkpoints.py "$WORK/runs/straight-a/checkpoints/$final" \
      "$WORK/runs/$other/checkpoints/$final")
    say "straight-a vs $other at $final: $result"
  done
else
  say "FAILED: see $OUT/straight-a.log, straight-b.log, resumed.log"
fi

say ""
say "== 4. whole runs against plain PyTorch on $DEVICE ($ROUNDS rounds, alternating) [$(elapsed)]"
DEVICE=$DEVICE SCALE=$SCALE ROUNDS=$ROUNDS THREADS=4 TESSERA="$TESSERA" DATA="$DATA/fashion-mnist" \
  timeout 300 "$PYTHON" -W ignore scripts/bench_vs_pytorch.py >"$OUT/bench.log" 2>&1
rc=$?
grep -E "^(torch|cnn|resnet20|mlp)" "$OUT/bench.log" | tee -a "$SUMMARY"
[ $rc = 0 ] || { say "FAILED (exit $rc): tail of $OUT/bench.log:"; tail -5 "$OUT/bench.log" | tee -a "$SUMMARY"; }
say ""
say "== done in $(elapsed); results in $OUT"
