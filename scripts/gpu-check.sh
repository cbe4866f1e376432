#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU and its own PyTorch (no network, no Rust),
# with gpu-bundle/ (scripts/gpu-bundle.sh, built here against that PyTorch's version) beside
# it, one script that ends within BUDGET seconds (default 540: under the device tool's 10
# minutes). Steps, the most valuable figures first (docs/gpu.md says what each measures):
#   1. GPT-2 small (124M) bf16, 16 x 1024 tokens: Tessera tokens/s and MFU;
#   2. the same model in plain PyTorch, eager (scripts/bench_gpu_pytorch.py);
#   3. ResNet-50 bf16 channels-last, batch 256 of 224x224 synthetic images: Tessera images/s;
#   4. the same model in plain PyTorch, eager;
#   5. a 1-rank NCCL run (`tessera launch --nproc 1`, `[distributed] backend = "nccl"`);
#   6. resume exactness with `train.deterministic = true`: 200 batches straight vs 100 + resume,
#      and a second straight run;
#   7. GPT-2 small under torch.compile;
#   8. ResNet-50 under torch.compile;
#   9. GPT-2 small with the alibi plugin (its fused SDPA path);
#  10. the example (CNN + label_smoothing + cutout, Fashion-MNIST, 3 epochs), fp32 and bf16;
#  11. the whole-run benchmark against plain PyTorch (scripts/bench_vs_pytorch.py: CNN,
#      ResNet-20, MLP);
#  12. CUDA graphs (`train.cuda_graphs = true`): step time eager vs captured for the airbench
#      net, ResNet-50 and GPT-2 small (the eager ResNet-50 and GPT-2 figures are steps 1 and 3),
#      and the losses of a deterministic run eager vs captured, bit for bit;
#  13. `[distributed] sharding`: 2 ranks on the GPU through Gloo, ResNet-20 (blocks, for
#      `full`), each mode's losses against DDP's and the memory each rank holds after a step;
#      `full` under amp_bf16 with bf16 gathers and bf16 gradient reduce-scatters too.
# Every step runs under `timeout` (its own limit, cut to what is left of BUDGET); a step that
# fails, times out or finds no time left is recorded as such and the script goes on. Throughput
# is warm steady state: warmup steps left out, CUDA synchronized around the timed steps.
# Writes ONE summary, $OUT/summary.txt (text, written as the steps go) and $OUT/summary.json
# (every figure), and $OUT/details.tar.gz (each step's log, JSON result and run.json): three
# files, as the device tool brings back at most 8 from $OUT.
#
#   bash scripts/gpu-check.sh        # docs/gpu.md says how it is run through the device tool
#
# Environment: OUT (where results go; default /tmp/gpu-check), BUNDLE (gpu-bundle), PYTHON,
# ONLY (comma-separated step names, e.g. ONLY=nccl,resume: run just those),
# DEVICE (cuda; `cpu` rehearses the whole script on a machine without a GPU), QUICK=1 (tiny
# sizes and short runs, for that rehearsal), BUDGET (540 s), ROUNDS (1, whole-run benchmark
# rounds), PEAK_TFLOPS (989: H100/H200 dense bf16), GPT_BATCH (16), RESNET_BATCH (256).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-check}
BUNDLE=${BUNDLE:-gpu-bundle}
PYTHON=${PYTHON:-python3}
export PYTHONWARNINGS=ignore
DEVICE=${DEVICE:-cuda}
ROUNDS=${ROUNDS:-1}
BUDGET=${BUDGET:-540}
PEAK_TFLOPS=${PEAK_TFLOPS:-989}
QUICK=${QUICK:-0}
mkdir -p "$OUT"
rm -f "$OUT/summary.txt" "$OUT/summary.json" "$OUT/details.tar.gz"
WORK=$(mktemp -d)
# Everything but the summary goes to DETAILS, packed into $OUT/details.tar.gz at the end.
DETAILS="$WORK/details"
mkdir -p "$DETAILS/results"
finish_all() {
  tar -czf "$OUT/details.tar.gz" -C "$WORK" details 2>/dev/null
  rm -rf "$WORK"
}
trap finish_all EXIT
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
started=$(date +%s)
elapsed() { echo "$(($(date +%s) - started))s"; }
# Seconds left of BUDGET, keeping 15 s for the summary.
left() { echo $((BUDGET - 15 - ($(date +%s) - started))); }

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
PLUGINS="$PWD/$BUNDLE/plugins"
TORCH_VERSION=$("$PYTHON" -c "import torch; print(torch.__version__)")
say "== Tessera GPU check, $(date -u +%Y-%m-%dT%H:%MZ), commit $(cat "$BUNDLE/COMMIT" 2>/dev/null)"
say "torch here: $TORCH_VERSION; bundle built against libtorch $(cat "$BUNDLE/BUILT_AGAINST")"
GPU_NAME=cpu
if [ "$DEVICE" != cpu ]; then
  GPU_NAME=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
  say "gpu: $GPU_NAME"
  "$PYTHON" -c "import torch; assert torch.cuda.is_available(), 'torch sees no GPU'" || exit 1
fi
say "budget ${BUDGET}s; quick=$QUICK; device $DEVICE"
"$PYTHON" - "$DETAILS/env.json" "$TORCH_VERSION" "$(cat "$BUNDLE/BUILT_AGAINST")" \
  "$(cat "$BUNDLE/COMMIT" 2>/dev/null)" "$GPU_NAME" "$DEVICE" "$QUICK" "$BUDGET" <<'PY'
import json, sys
keys = ["torch", "bundle_libtorch", "commit", "gpu", "device", "quick", "budget_s"]
json.dump(dict(zip(keys, sys.argv[2:])), open(sys.argv[1], "w"), indent=1)
PY

# `record STEP STATUS SECONDS NOTE`: one line of $DETAILS/steps.jsonl.
record() {
  "$PYTHON" -c 'import json, sys; print(json.dumps({"step": sys.argv[1], "status": sys.argv[2], "seconds": int(sys.argv[3]), "note": sys.argv[4]}))' \
    "$1" "$2" "$3" "${4:-}" >>"$DETAILS/steps.jsonl"
}
# `status_of RC LOG`: ok, timed out, needs the config key (a key this build does not have
# yet, named in LOG), or failed.
status_of() {
  if [ "$1" = 0 ]; then echo ok
  elif [ "$1" = 124 ] || [ "$1" = 137 ]; then echo "timed out"
  elif grep -qE "(distributed\.backend|train\.deterministic): unknown key" "$2" 2>/dev/null; then
    echo "needs the config key"
  else echo failed
  fi
}
# `timebox WANT MIN`: WANT seconds, cut to what is left; empty (skip the step) under MIN.
timebox() {
  local l
  l=$(left)
  if [ "$l" -lt "$2" ]; then echo ""; else echo $((l < $1 ? l : $1)); fi
}
# `begin STEP TITLE WANT MIN`: prints the step's title; sets T (its time box) or records it
# as skipped and returns 1.
begin() {
  if [ -n "${ONLY:-}" ] && [[ ",$ONLY," != *",$1,"* ]]; then
    record "$1" "skipped: not in ONLY" 0 ""
    return 1
  fi
  say ""
  say "== $2 [$(elapsed)]"
  T=$(timebox "$3" "$4")
  STEP_START=$(date +%s)
  if [ -z "$T" ]; then
    say "skipped: out of time ($(left)s left of the budget)"
    record "$1" "skipped: out of time" 0 ""
    return 1
  fi
}
# `finish STEP RC LOG [NOTE]`: records the step's outcome; prints the log's tail on failure.
finish() {
  local status
  status=$(status_of "$2" "$3")
  record "$1" "$status" $(($(date +%s) - STEP_START)) "${4:-}"
  if [ "$status" != ok ]; then
    say "$status (exit $2, after $(($(date +%s) - STEP_START))s): tail of details/$(basename "$3"):"
    tail -5 "$3" 2>/dev/null | tee -a "$SUMMARY"
  fi
}

# Sizes: the GPU's, or tiny ones for the CPU rehearsal.
if [ "$QUICK" = 1 ]; then
  GPT=(--batch 2 --seq 64 --layers 2 --heads 2 --width 64 --vocab 512 --warmup 2 --steps 4)
  GPT_TESSERA=(--log-every 2 --workers 1)
  RESNET=(--batch 2 --size 64 --classes 10 --warmup 2 --steps 2)
  RESNET_TESSERA=(--log-every 2 --workers 1)
  # Inductor compiles ResNet-50 for minutes on a CPU: the rehearsal proves the path with
  # aot_eager (the same dynamo capture and autograd, no code generation).
  RESNET_COMPILE=(--compile-backend aot_eager)
  EPOCHS=30ba; STRAIGHT=20; HALF=10; SCALE=1
else
  GPT=(--batch "${GPT_BATCH:-16}" --seq 1024 --warmup 10 --steps 30)
  GPT_TESSERA=(--log-every 5 --workers 2)
  RESNET=(--batch "${RESNET_BATCH:-256}" --size 224 --classes 1000 --warmup 10 --steps 30)
  RESNET_TESSERA=(--log-every 5 --workers 8)
  RESNET_COMPILE=()
  EPOCHS=3ep; STRAIGHT=200; HALF=100; SCALE=6
fi

# `tessera_bench NAME MODEL ARGS...`: scripts/bench_gpu_tessera.py; its JSON to results/NAME.json.
tessera_bench() {
  local name=$1 model=$2
  shift 2
  timeout -k 5 "$T" "$PYTHON" scripts/bench_gpu_tessera.py "$model" --tessera "$TESSERA" \
    --plugins "$PLUGINS" --work "$WORK/bench" --name "$name" --device "$DEVICE" \
    --timeout "$((T - 5))" --peak-tflops "$PEAK_TFLOPS" "$@" \
    >"$DETAILS/results/$name.json" 2>"$DETAILS/$name.err"
  local rc=$?
  cp "$WORK/bench/$name.log" "$DETAILS/$name.log" 2>/dev/null
  cp "$WORK/bench/$name/run.json" "$DETAILS/$name.run.json" 2>/dev/null
  cat "$DETAILS/$name.err" >>"$DETAILS/$name.log" 2>/dev/null
  return $rc
}
# `pytorch_bench NAME MODEL ARGS...`: scripts/bench_gpu_pytorch.py; JSON to results/NAME.json.
pytorch_bench() {
  local name=$1 model=$2
  shift 2
  timeout -k 5 "$T" "$PYTHON" scripts/bench_gpu_pytorch.py "$model" --device "$DEVICE" \
    --peak-tflops "$PEAK_TFLOPS" "$@" >"$DETAILS/results/$name.json" 2>"$DETAILS/$name.log"
}
# `show NAME`: the one-line figure of a bench result.
show() {
  "$PYTHON" - "$DETAILS/results/$1.json" <<'PY' | tee -a "$SUMMARY"
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
unit = "tokens" if "tokens_per_second" in r else "images"
line = f"{r['side']} {r.get('mode', '')}".strip()
line += f": {r[unit + '_per_second']:.1f} {unit}/s, step {r['step_ms']:.1f} ms over {r['timed_steps']} steps"
if "mfu" in r:
    line += f", {r['achieved_tflops']:.1f} TFLOP/s, MFU {100 * r['mfu']:.1f}%"
if "first_step_seconds" in r:
    line += f" (first step {r['first_step_seconds']:.1f} s)"
if f"{unit}_per_second_train_seconds" in r:
    line += f" (Tessera's own train_seconds: {r[unit + '_per_second_train_seconds']:.1f} {unit}/s)"
print(line)
PY
}

GPT_DESC="GPT-2 small (124M), bf16 autocast"
[ "$QUICK" = 1 ] && GPT_DESC="GPT-2 (QUICK: 2 layers, width 64, seq 64), bf16 autocast"
if begin gpt2-tessera "1. $GPT_DESC: Tessera" 150 30; then
  tessera_bench gpt2-tessera gpt2 "${GPT[@]}" "${GPT_TESSERA[@]}"
  rc=$?; finish gpt2-tessera $rc "$DETAILS/gpt2-tessera.log"; [ $rc = 0 ] && show gpt2-tessera
fi
if begin gpt2-eager "2. the same model in plain PyTorch, eager" 120 30; then
  pytorch_bench gpt2-eager gpt2 --mode eager "${GPT[@]}"
  rc=$?; finish gpt2-eager $rc "$DETAILS/gpt2-eager.log"; [ $rc = 0 ] && show gpt2-eager
fi

RESNET_DESC="ResNet-50, bf16 autocast, channels-last, batch 256, 224x224 synthetic images"
[ "$QUICK" = 1 ] && RESNET_DESC="ResNet-50 (QUICK: batch 2, 64x64, 10 classes), bf16, channels-last"
if begin resnet50-tessera "3. $RESNET_DESC: Tessera" 150 30; then
  tessera_bench resnet50-tessera resnet50 "${RESNET[@]}" "${RESNET_TESSERA[@]}"
  rc=$?; finish resnet50-tessera $rc "$DETAILS/resnet50-tessera.log"; [ $rc = 0 ] && show resnet50-tessera
fi
if begin resnet50-eager "4. the same model in plain PyTorch, eager" 120 30; then
  pytorch_bench resnet50-eager resnet50 --mode eager "${RESNET[@]}"
  rc=$?; finish resnet50-eager $rc "$DETAILS/resnet50-eager.log"; [ $rc = 0 ] && show resnet50-eager
fi

# Fashion-MNIST from the bundle (no network here), for the example runs.
DATA="$WORK/data"
mkdir -p "$DATA/fashion-mnist"
for f in "$BUNDLE"/data/fashion-mnist/*.gz; do
  gunzip -c "$f" >"$DATA/fashion-mnist/$(basename "$f" .gz)"
done
cp "$BUNDLE/data/fashion-mnist/VERIFIED" "$DATA/fashion-mnist/"
EXAMPLE=examples/fashion-mnist/trainer.toml
common=(--set "train.device=\"$DEVICE\"" --set "data.data_dir=\"$DATA\"" --set "data.fetch=false"
  --set "plugins.dirs=[\"$PLUGINS\"]" --set "output_dir=\"$WORK/runs\""
  --set "train.progress=false")
# `train NAME ARGS...`: one tessera run of the example within T seconds; its log and run.json
# go to details/NAME.*.
train() {
  local name=$1
  shift
  timeout -k 5 "$T" "$TESSERA" train "$EXAMPLE" "${common[@]}" --set "run_name=\"$name\"" "$@" \
    >"$DETAILS/$name.log" 2>&1
  local rc=$?
  cp "$WORK/runs/$name/run.json" "$DETAILS/$name.run.json" 2>/dev/null
  return $rc
}
# `report NAME LABEL`: accuracy and throughput of a finished run (and results/NAME.json).
report() {
  "$PYTHON" - "$DETAILS/$1.run.json" "$2" "$DETAILS/results/$1.json" <<'PY' | tee -a "$SUMMARY"
import json, sys
r = json.load(open(sys.argv[1]))
keep = ["status", "device", "batches", "final_accuracy", "samples_per_second", "train_seconds"]
json.dump({"side": "tessera", "label": sys.argv[2], **{k: r.get(k) for k in keep}},
          open(sys.argv[3], "w"))
print(f"{sys.argv[2]}: {r['status']}, device {r['device']}, {r['batches']} batches, "
      f"accuracy {r['final_accuracy']}, {r['samples_per_second']:.0f} samples/s, "
      f"training {r['train_seconds']:.1f} s")
PY
}

# NCCL on a GPU; the CPU rehearsal proves the same path with Gloo.
BACKEND=nccl
[ "$DEVICE" = cpu ] && BACKEND=gloo
if begin nccl "5. one rank through $BACKEND: tessera launch --nproc 1, [distributed] backend = \"$BACKEND\"" 90 20; then
  # Needs `[distributed] backend` (issue 23, added in parallel): without it, the step says so.
  timeout -k 5 "$T" "$TESSERA" launch --nproc 1 train "$EXAMPLE" "${common[@]}" \
    --set 'run_name="nccl"' --set "distributed.backend=\"$BACKEND\"" \
    --set "train.max_duration=\"${STRAIGHT}ba\"" --set 'data.workers=2' \
    --set 'checkpoint.save=false' >"$DETAILS/nccl.log" 2>&1
  rc=$?
  cp "$WORK/runs/nccl/run.json" "$DETAILS/nccl.run.json" 2>/dev/null
  # The data-parallel start line names the process group: "(c10d NCCL)" or "(c10d Gloo)".
  backend=""
  [ $rc = 0 ] && backend=$(grep -oiE "c10d (nccl|gloo)|ProcessGroup(NCCL|Gloo)" "$DETAILS/nccl.log" | head -1)
  note="distributed.backend = \"$BACKEND\""
  [ $rc = 0 ] && note="${backend:-the log names no process group}"
  finish nccl $rc "$DETAILS/nccl.log" "$note"
  if [ $rc = 0 ]; then
    report nccl "1 rank, $BACKEND"
    say "backend in the log: ${backend:-none named}"
  fi
fi

if begin resume "6. resume on $DEVICE with train.deterministic = true: ${STRAIGHT} batches straight vs ${HALF} + resume" 120 30; then
  # cuBLAS is deterministic only with a fixed workspace (CUDA >= 10.2), set before it starts.
  export CUBLAS_WORKSPACE_CONFIG=:4096:8
  ckpt=(--set "checkpoint.interval=\"${HALF}ba\"" --set "train.max_duration=\"${STRAIGHT}ba\""
    --set "train.eval_interval=\"${STRAIGHT}ba\"" --set "data.workers=0")
  # The CPU rehearsal evaluates a few batches only (the whole test set takes long there).
  [ "$QUICK" = 1 ] && ckpt+=(--set "train.eval_subset_batches=2")
  det=(--set "train.deterministic=true")
  # Each run gets what is left of the step's time box.
  deadline=$(($(date +%s) + T))
  rest() { T=$((deadline - $(date +%s))); [ "$T" -ge 5 ] || T=5; }
  rest
  train straight-a "${ckpt[@]}" "${det[@]}"
  rc=$?
  note="deterministic"
  if [ "$(status_of $rc "$DETAILS/straight-a.log")" = "needs the config key" ]; then
    # This build has no train.deterministic yet: today's check, and the step says so.
    say "train.deterministic: needs the config key (not in this build); resume checked without it"
    record resume-deterministic "needs the config key" 0 "train.deterministic"
    det=(); note="without train.deterministic (needs the config key)"
    rest
    train straight-a "${ckpt[@]}"
    rc=$?
  fi
  resume_ok=1
  [ $rc = 0 ] || resume_ok=0
  rest
  train straight-b "${ckpt[@]}" "${det[@]}" || resume_ok=0
  half=$(ls "$WORK/runs/straight-a/checkpoints/"*-ba"$HALF".ckpt 2>/dev/null | head -1)
  if [ -n "$half" ]; then
    rest
    train resumed "${ckpt[@]}" "${det[@]}" --set "checkpoint.load=\"$half\"" || resume_ok=0
  else
    say "no checkpoint at batch $HALF in straight-a"; resume_ok=0
  fi
  if [ $resume_ok = 1 ]; then
    final=$(basename "$(ls "$WORK/runs/straight-a/checkpoints/"*-ba"$STRAIGHT".ckpt | head -1)")
    for other in resumed straight-b; do
      result=$("$PYTHON" scripts/compare_checkpoints.py "$WORK/runs/straight-a/checkpoints/$final" \
        "$WORK/runs/$other/checkpoints/$final")
      echo "$result" >"$DETAILS/results/resume-straight-a-vs-$other.json"
      say "straight-a vs $other at $final: $result"
    done
    record resume ok $(($(date +%s) - STEP_START)) "$note"
  else
    record resume failed $(($(date +%s) - STEP_START)) "$note"
    say "FAILED: see details/straight-a.log, straight-b.log, resumed.log"
  fi
  unset CUBLAS_WORKSPACE_CONFIG
fi

if begin gpt2-compile "7. $GPT_DESC: plain PyTorch, torch.compile" 200 60; then
  pytorch_bench gpt2-compile gpt2 --mode compile "${GPT[@]}"
  rc=$?; finish gpt2-compile $rc "$DETAILS/gpt2-compile.log"; [ $rc = 0 ] && show gpt2-compile
fi
if begin resnet50-compile "8. $RESNET_DESC: plain PyTorch, torch.compile" 200 60; then
  pytorch_bench resnet50-compile resnet50 --mode compile "${RESNET[@]}" "${RESNET_COMPILE[@]}"
  rc=$?; finish resnet50-compile $rc "$DETAILS/resnet50-compile.log"; [ $rc = 0 ] && show resnet50-compile
fi

if begin gpt2-alibi-tessera "9. $GPT_DESC with the alibi plugin (fused SDPA with a float mask): Tessera" 120 30; then
  tessera_bench gpt2-alibi-tessera gpt2 --alibi "${GPT[@]}" "${GPT_TESSERA[@]}"
  rc=$?; finish gpt2-alibi-tessera $rc "$DETAILS/gpt2-alibi-tessera.log"; [ $rc = 0 ] && show gpt2-alibi-tessera
fi

if begin example-fp32 "10a. the example on $DEVICE, fp32 ($EPOCHS)" 90 20; then
  train example-fp32 --set "train.max_duration=\"$EPOCHS\"" --set "data.workers=4"
  rc=$?; finish example-fp32 $rc "$DETAILS/example-fp32.log"; [ $rc = 0 ] && report example-fp32 "fp32"
fi
if begin example-bf16 "10b. the same in bf16 autocast" 90 20; then
  train example-bf16 --set "train.max_duration=\"$EPOCHS\"" --set "data.workers=4" \
    --set 'train.precision="amp_bf16"'
  rc=$?; finish example-bf16 $rc "$DETAILS/example-bf16.log"; [ $rc = 0 ] && report example-bf16 "amp_bf16"
fi

if begin bench-vs-pytorch "11. whole runs against plain PyTorch on $DEVICE ($ROUNDS rounds, alternating)" 300 40; then
  DEVICE=$DEVICE SCALE=$SCALE ROUNDS=$ROUNDS THREADS=4 TESSERA="$TESSERA" DATA="$DATA/fashion-mnist" \
    timeout -k 5 "$T" "$PYTHON" -W ignore scripts/bench_vs_pytorch.py >"$DETAILS/bench.log" 2>&1
  rc=$?
  grep -E "^(torch|cnn|resnet20|mlp)" "$DETAILS/bench.log" | tee -a "$SUMMARY"
  finish bench-vs-pytorch $rc "$DETAILS/bench.log"
fi

if begin cuda-graphs "12. CUDA graphs: eager vs captured (train.cuda_graphs = true)" 300 60; then
  deadline=$(($(date +%s) + T))
  rest() { T=$((deadline - $(date +%s))); [ "$T" -ge 5 ] || T=5; }
  graphs=(--set 'train.cuda_graphs=true')
  if [ "$QUICK" = 1 ]; then
    AIRBENCH=(--batch 8 --size 32 --classes 10 --warmup 2 --steps 2)
  else
    AIRBENCH=(--batch 512 --size 32 --classes 10 --warmup 10 --steps 30)
  fi
  graphs_ok=1
  # The airbench net, eager and captured; ResNet-50 and GPT-2 small captured (eager: steps 1, 3).
  for run in "airbench-eager airbench" "airbench-graphs airbench graphs" \
    "resnet50-graphs resnet50 graphs" "gpt2-graphs gpt2 graphs"; do
    set -- $run
    name=$1 model=$2 mode=${3:-eager}
    sizes=("${AIRBENCH[@]}" "${RESNET_TESSERA[@]}")
    [ "$model" = resnet50 ] && sizes=("${RESNET[@]}" "${RESNET_TESSERA[@]}")
    [ "$model" = gpt2 ] && sizes=("${GPT[@]}" "${GPT_TESSERA[@]}")
    extra=()
    [ "$mode" = graphs ] && extra=("${graphs[@]}")
    rest
    if tessera_bench "$name" "$model" "${sizes[@]}" "${extra[@]}"; then
      show "$name"
    else
      graphs_ok=0
      say "$name: failed (details/$name.log): $(grep -m1 '^error' "$DETAILS/$name.log")"
    fi
  done
  # Captured == eager, bit for bit: a small deterministic GPT, its loss logged every batch.
  export CUBLAS_WORKSPACE_CONFIG=:4096:8
  det=(--batch 4 --seq 128 --layers 2 --heads 4 --width 128 --vocab 1024 --warmup 0 --steps 12
    --log-every 1 --workers 1 --set 'train.deterministic=true')
  for mode in eager graphs; do
    extra=()
    [ "$mode" = graphs ] && extra=("${graphs[@]}")
    rest
    tessera_bench "det-$mode" gpt2 "${det[@]}" "${extra[@]}" || graphs_ok=0
  done
  unset CUBLAS_WORKSPACE_CONFIG
  if [ $graphs_ok = 1 ]; then
    "$PYTHON" - "$WORK/bench" <<'PY' | tee -a "$SUMMARY" | tee "$DETAILS/results/graphs-losses.txt"
import json, sys
from pathlib import Path
def losses(name):
    lines = Path(sys.argv[1], name, "metrics.jsonl").read_text().splitlines()
    records = [json.loads(l) for l in lines if l.strip()]
    return [r["data"]["loss"] for r in records if r.get("kind") == "train"]
a, b = losses("det-eager"), losses("det-graphs")
same = len(a) == len(b) > 0 and all(x == y for x, y in zip(a, b))
print(f"deterministic GPT, {len(a)} losses: captured == eager bit for bit: {same}"
      + ("" if same else f" (eager {a[:4]}..., captured {b[:4]}...)"))
PY
    record cuda-graphs ok $(($(date +%s) - STEP_START)) "eager vs captured"
  else
    record cuda-graphs failed $(($(date +%s) - STEP_START)) "see details"
  fi
fi

# Sharding on the device: 2 ranks on the one GPU (NCCL needs a device per rank, so Gloo through
# host copies), each mode against DDP, and the memory each holds after a step.
if begin sharding "13. [distributed] sharding on $DEVICE: 2 ranks (Gloo), none vs optimizer vs gradients vs full" 200 40; then
  deadline=$(($(date +%s) + T))
  shard_ok=1
  for mode in none optimizer gradients full full-bf16; do
    T=$((deadline - $(date +%s))); [ "$T" -ge 10 ] || T=10
    dev=(--set 'train.device="cuda:0"')
    [ "$DEVICE" = cpu ] && dev=()
    # full-bf16: `full` under amp_bf16 (units gathered in bf16) with gradients reduced in bf16.
    wire=()
    [ "$mode" = full-bf16 ] && wire=(--set 'train.precision="amp_bf16"' \
      --set 'distributed.reduce_dtype="bf16"')
    timeout -k 5 "$T" "$TESSERA" launch --nproc 2 train "$EXAMPLE" "${common[@]}" "${dev[@]}" \
      "${wire[@]}" --set "run_name=\"shard-$mode\"" --set 'distributed.backend="gloo"' \
      --set "distributed.sharding=\"${mode%-bf16}\"" --set 'train.max_duration="20ba"' \
      --set 'model.name="resnet20"' --set 'model.width=8' \
      --set 'data.workers=0' --set 'checkpoint.save=false' --set 'train.threads=1' \
      >"$DETAILS/shard-$mode.log" 2>&1 || shard_ok=0
    cp "$WORK/runs/shard-$mode/run.json" "$DETAILS/shard-$mode.run.json" 2>/dev/null
  done
  if [ $shard_ok = 1 ]; then
    "$PYTHON" - "$WORK/runs" <<'PY' | tee -a "$SUMMARY" | tee "$DETAILS/results/sharding.txt"
import json, sys
from pathlib import Path
def run(mode):
    d = Path(sys.argv[1], f"shard-{mode}")
    lines = (d / "metrics.jsonl").read_text().splitlines()
    losses = [json.loads(l)["data"]["loss"] for l in lines
              if l.strip() and json.loads(l).get("kind") == "train"]
    return losses, json.loads((d / "run.json").read_text()).get("memory_after_step_bytes")
base, base_mem = run("none")
for mode in ("optimizer", "gradients", "full", "full-bf16"):
    losses, mem = run(mode)
    worst = max((abs(a - b) / max(abs(a), 1.0) for a, b in zip(base, losses)), default=float("nan"))
    print(f"sharding = {mode}: {len(losses)} losses, largest relative difference to DDP {worst:.2e}; "
          f"after a step {mem} bytes (DDP {base_mem})")
PY
    record sharding ok $(($(date +%s) - STEP_START)) "none vs optimizer vs gradients vs full (and full in bf16)"
  else
    finish sharding 1 "$DETAILS/shard-gradients.log" "see details"
  fi
fi

say ""
"$PYTHON" scripts/gpu_check_summary.py "$DETAILS" "$OUT" | tee -a "$SUMMARY"
say ""
say "== done in $(elapsed); results in $OUT (summary.txt, summary.json, details.tar.gz)"
