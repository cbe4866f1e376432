"""The Tessera side of the GPU check (scripts/gpu-check.sh): writes the run's trainer.toml, runs
`tessera train` on it and prints one JSON line with the steady-state throughput, to set against
scripts/bench_gpu_pytorch.py's figures for the same model on the same device.

    python3 scripts/bench_gpu_tessera.py resnet50 --tessera BIN --plugins DIR --work DIR
    python3 scripts/bench_gpu_tessera.py gpt2 --tessera BIN --work DIR [--alibi]

Models (the PyTorch side's, see bench_gpu_pytorch.py):
- `resnet50`: the zoo's `resnet50` (torchvision's architecture, 1000 classes), the
  `channels_last` plugin, `precision = "amp_bf16"`, SGD (lr 0.1, momentum 0.9, weight decay
  5e-5), `dataset = "synthetic"` images of 3 x SIZE x SIZE (generated in memory as uint8; the
  loader's WORKERS threads make the batches), batch BATCH.
- `airbench`: the zoo's `airbench` (the CIFAR-10 speedrun's network, its default widths) on the
  same synthetic images (`--size 32 --classes 10`), with the same plugin, precision and SGD;
  Tessera only (for the CUDA-graph comparison, `--set train.cuda_graphs=true`).
- `gpt2`: the zoo's `gpt2` at GPT-2 small's sizes (12 layers, 12 heads, width 768, vocabulary
  50257, context = SEQ), dropout 0, `amp_bf16`, AdamW (lr 6e-4, betas (0.9, 0.95), weight decay
  0.1), `dataset = "synthetic-text"` of that vocabulary, batch BATCH x SEQ tokens. `--alibi` adds
  the alibi plugin (max_sequence_length = SEQ, no batch reshape).

Timing: the run logs a training line every LOG_EVERY batches (`train.log_interval`); the line is
written after the trainer reads the running loss back from the device, so its timestamp (the
log's own, else its arrival on stderr) marks a point where the device has caught up with that
step. The steady-state rate is (items at the last line - items at the first line at or after
WARMUP batches) / (wall time between those lines): everything a training step costs (input pipeline, host work, device) is
in it, the start-up, the warmup and the final evaluation are not. Tessera's own figure over the
same lines (from `train_seconds`, the sum of its step times) is reported beside it.

MFU (gpt2): as bench_gpu_pytorch.py, `6·N + 12·L·H·Q·T` FLOPs per token with N the parameters
without the position table (from the sizes: V·C + L·(12·C² + 13·C) + 2·C), over --peak-tflops.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

H200_BF16_DENSE_TFLOPS = 989.0

RESNET = """run_name = "{name}"
seed = 0
output_dir = "{work}"
[data]
dataset = "synthetic"
batch_size = {batch}
eval_batch_size = {batch}
workers = {workers}
[data.synthetic]
samples = {samples}
eval_samples = {batch}
channels = 3
height = {size}
width = {size}
classes = {classes}
[model]
name = "{net}"
num_classes = {classes}
[optimizer]
name = "sgd"
lr = 0.1
momentum = 0.9
weight_decay = 5e-5
[train]
device = "{device}"
precision = "amp_bf16"
max_duration = "{batches}ba"
eval_interval = "{batches}ba"
eval_subset_batches = 1
log_interval = "{log_every}ba"
progress = false
[checkpoint]
save = false
[plugins]
dirs = ["{plugins}"]
[[algorithms]]
plugin = "channels_last"
"""

GPT2 = """run_name = "{name}"
seed = 0
output_dir = "{work}"
[data]
dataset = "synthetic-text"
batch_size = {batch}
eval_batch_size = {batch}
workers = {workers}
[data.text]
seq_len = {seq}
vocab_size = {vocab}
tokens = {tokens}
eval_tokens = {eval_tokens}
[model]
name = "gpt2"
n_layer = {layers}
n_head = {heads}
n_embd = {width}
n_positions = {seq}
vocab_size = {vocab}
dropout = 0.0
[optimizer]
name = "adamw"
lr = 6e-4
betas = [0.9, 0.95]
weight_decay = 0.1
[train]
device = "{device}"
precision = "amp_bf16"
max_duration = "{batches}ba"
eval_interval = "{batches}ba"
eval_subset_batches = 1
log_interval = "{log_every}ba"
progress = false
[checkpoint]
save = false
[plugins]
dirs = ["{plugins}"]
"""

ALIBI = """[[algorithms]]
plugin = "alibi"
max_sequence_length = {seq}
train_sequence_length_scaling = 1.0
"""


def gpt2_flops_per_token(layers, heads, width, vocab, seq):
    """6·N + 12·L·H·Q·T with N = V·C + L·(12·C² + 13·C) + 2·C (GPT-2 without wpe, tied head)."""
    n = vocab * width + layers * (12 * width * width + 13 * width) + 2 * width
    return 6 * n + 12 * layers * heads * (width // heads) * seq, n


LINE = re.compile(r"^(?:(\S+)\s+)?INFO\s+(\{.*\})\s*$")


def stamp(text):
    """Seconds since the epoch of a tracing timestamp (`2026-12-01T16:40:12.247140Z`), or None."""
    if not text:
        return None
    match = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?Z$", text)
    if not match:
        return None
    whole = datetime.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
    return whole.timestamp() + float(match.group(2) or 0.0)


def run_tessera(cmd, log_path, timeout, env):
    """Runs `cmd`, teeing its stderr to `log_path`; returns (exit code, [(time, train line)]):
    the time is the line's own timestamp when the log has one, else its arrival here."""
    lines = []
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.PIPE, text=True, env=env)

        def kill(*_):
            try:
                proc.kill()
            except ProcessLookupError:
                pass

        # When this script is stopped (gpu-check.sh's `timeout`), the run must not outlive it
        # and hold the GPU for the next step.
        def stopped(signum, _frame):
            kill()
            sys.exit(128 + signum)

        signal.signal(signal.SIGTERM, stopped)
        killer = threading.Timer(timeout, kill)
        killer.start()
        try:
            for raw in proc.stderr:
                now = time.time()
                log.write(raw)
                match = LINE.match(raw.strip())
                if match:
                    try:
                        data = json.loads(match.group(2))
                    except json.JSONDecodeError:
                        continue
                    if isinstance(data, dict) and "batch" in data and "loss" in data:
                        lines.append((stamp(match.group(1)) or now, data))
            rc = proc.wait()
        finally:
            killer.cancel()
    return rc, lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", choices=["resnet50", "airbench", "gpt2"])
    ap.add_argument("--tessera", required=True)
    ap.add_argument("--plugins", default="")
    ap.add_argument("--work", required=True, help="folder for the config and the run")
    ap.add_argument("--name", default=None, help="run name (default: the model's)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--log-every", type=int, default=5)
    ap.add_argument("--alibi", action="store_true")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--peak-tflops", type=float, default=H200_BF16_DENSE_TFLOPS)
    ap.add_argument("--set", action="append", default=[], help="a `--set` for tessera train")
    args = ap.parse_args()
    if args.warmup % args.log_every or args.steps % args.log_every:
        sys.exit("--warmup and --steps must be multiples of --log-every")

    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    name = args.name or (args.model + ("-alibi" if args.alibi else ""))
    batches = args.warmup + args.steps
    common = dict(name=name, work=work, device=args.device, workers=args.workers,
                  batches=batches, log_every=args.log_every, plugins=args.plugins)
    result = {"side": "tessera", "model": args.model, "name": name,
              "warmup_steps": args.warmup, "timed_steps": args.steps}
    if args.model in ("resnet50", "airbench"):
        batch = args.batch or 256
        # A few batches' worth of distinct images, cycled over the epochs.
        toml = RESNET.format(net=args.model, batch=batch, samples=4 * batch, size=args.size,
                             classes=args.classes, **common)
        unit, per_batch = "images", batch
        result.update(batch=batch, size=args.size, classes=args.classes, channels_last=True)
    else:
        batch = args.batch or 16
        tokens = batch * args.seq * (batches + 2) + 1
        toml = GPT2.format(batch=batch, seq=args.seq, vocab=args.vocab, tokens=tokens,
                           eval_tokens=batch * args.seq + 1, layers=args.layers,
                           heads=args.heads, width=args.width, **common)
        if args.alibi:
            toml += ALIBI.format(seq=args.seq)
        unit, per_batch = "tokens", batch * args.seq
        flops, n = gpt2_flops_per_token(args.layers, args.heads, args.width, args.vocab, args.seq)
        result.update(batch=batch, seq=args.seq, layers=args.layers, heads=args.heads,
                      width=args.width, vocab=args.vocab, alibi=args.alibi,
                      flops_per_token=flops, params_without_wpe=n)
    config = work / f"{name}.toml"
    config.write_text(toml)
    cmd = [args.tessera, "train", str(config)]
    for s in args.set:
        cmd += ["--set", s]
    started = time.perf_counter()
    rc, lines = run_tessera(cmd, work / f"{name}.log", args.timeout, dict(os.environ))
    result["wall_seconds"] = time.perf_counter() - started
    result["exit"] = rc
    result["log"] = str(work / f"{name}.log")
    record = work / name / "run.json"
    if record.is_file():
        r = json.loads(record.read_text())
        result["status"] = r.get("status")
        result["device"] = r.get("device")
    if rc != 0:
        result["error"] = f"tessera train exited with {rc}"
        print(json.dumps(result), flush=True)
        sys.exit(1)
    count = "token" if unit == "tokens" else "sample"
    window = [(t, d) for t, d in lines if d.get("batch", 0) >= args.warmup]
    if len(window) < 2:
        result["error"] = f"fewer than 2 training log lines at or after batch {args.warmup}"
        print(json.dumps(result), flush=True)
        sys.exit(1)
    (t0, a), (t1, b) = window[0], window[-1]
    items = b[count] - a[count]
    steps = b["batch"] - a["batch"]
    result["timed_steps"] = steps
    result["seconds"] = t1 - t0
    result["step_ms"] = 1000 * (t1 - t0) / steps
    result[f"{unit}_per_second"] = items / (t1 - t0)
    rate = f"{count}s_per_second"
    own = lambda d: d[count] / d[rate]  # noqa: E731 - train_seconds at that line
    result[f"{unit}_per_second_train_seconds"] = items / (own(b) - own(a))
    result["final_loss"] = b.get("loss")
    if unit == "tokens":
        achieved = result["flops_per_token"] * result["tokens_per_second"]
        result["achieved_tflops"] = achieved / 1e12
        result["peak_tflops"] = args.peak_tflops
        result["mfu"] = achieved / (args.peak_tflops * 1e12)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
