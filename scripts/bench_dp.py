"""Data-parallel training on this CPU: Tessera's c10d Gloo ranks against one process, and
against PyTorch's own DistributedDataParallel (`scripts/bench_dp_pytorch.py`), on Fashion-MNIST
with the small CNN (width 32) and ResNet-20 (width 16), SGD (lr 0.05, momentum 0.9), constant
rate, normalization, no methods, no checkpoints. Run it through `scripts/bench-dp.sh`.

Variants, every round each once, the order reversed every other round; medians over ROUNDS:

- tessera 1x128 2t: `tessera train`, batch 128, 2 threads (the whole machine, one process);
- tessera 1x128 1t: the same with 1 thread (one core: separates "2 cores" from "2 ranks");
- tessera 2x64 1t: `tessera launch --nproc 2 train`, 64 per rank (global batch 128), 1 thread
  per rank; gradients all-reduced in buckets during the backward pass by c10d's Reducer;
- pytorch 1x128 2t: one plain PyTorch process, batch 128, 2 threads;
- pytorch DDP 2x64 1t: PyTorch's DistributedDataParallel, Gloo, 2 spawned processes, 64 per
  rank, 1 thread each.

Every variant trains on the same global batch of 128, so samples/s compare directly; speed-up =
2-rank samples/s / 1-rank samples/s. What is timed: the training steps after WARMUP batches, to
batch BATCHES. Tessera's figure comes from its cumulative log lines (metrics.jsonl, written by
rank 0, `log_interval` = gcd(WARMUP, BATCHES) batches): train seconds at batch b = sample /
samples_per_second, so the rate is (samples_end - samples_warmup) / (seconds_end -
seconds_warmup), `train_seconds` of the steps after the warm-up, without start-up, rendezvous
and evaluation (one batch of 100 per rank after the last step). The PyTorch side times the same
steps with `time.perf_counter` (batch building included on both sides).

All-reduce: the 2-rank runs' `data_parallel.timing` in run.json (PyTorch DDP's c10d logger on
rank 0, the same logger `_get_ddp_logging_data()` reads on the PyTorch side): forward, backward
computation, backward communication (from the first bucket's all-reduce start to the last one's
end) and overlap (from the first bucket's all-reduce start to the end of the backward
computation); comm - overlap is the all-reduce time left after the backward computation, what
the step waits for. The first bucket is small (1 MiB cap, PyTorch's rule), so "overlap" says
when communication began, not how many bytes went during the backward pass. The logger
averages over the steps it samples, steps 1-10 and every 100th, so the first, slow step is in
it, on both sides alike. Gradient bytes = parameters x 4; "MB/s" = gradient bytes / time
(nccl-tests' algorithm bandwidth), over DDP's backward communication time (a lower bound: it
includes waiting for gradients still being computed) and over the median of 20 lone
`all_reduce`s of one tensor that size, timed after training on the PyTorch side.

Environment: ROUNDS (3), BATCHES (per model: cnn 150, resnet20 40), WARMUP (10), MODELS
(cnn,resnet20), FIND_UNUSED (1: both sides' `find_unused_parameters`, Tessera's default; 0
saves a walk of the autograd graph per step on both), TESSERA (the binary), DATA (the
Fashion-MNIST cache folder), SEED (0). The machine's allocator settings reach both sides:
`GLIBC_TUNABLES=...` (see docs/benchmarks.md) gives the PyTorch processes Tessera's.
"""

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The models, normalization and SGD settings of the single-process comparison.
from bench_vs_pytorch import LR, MEAN, MODELS, MOMENTUM, STD  # noqa: E402

# Batches per run unless BATCHES is set, per model (the models are bench_vs_pytorch.py's).
DEFAULT_BATCHES = {"cnn": 150, "resnet20": 40}
GLOBAL_BATCH = 128
# (side, ranks, threads per rank): the variants, in the order of even rounds.
VARIANTS = [
    ("tessera", 1, 2),
    ("tessera", 1, 1),
    ("tessera", 2, 1),
    ("pytorch", 1, 2),
    ("pytorch", 2, 1),
]

TOML = """run_name = "{run}"
output_dir = "{out}"
seed = {seed}
[data]
dataset = "fashion-mnist"
data_dir = "{data_root}"
fetch = false
batch_size = {batch}
eval_batch_size = 100
workers = 0
[data.transforms]
normalize = {{ mean = [{mean}], std = [{std}] }}
[model]
{model}
[optimizer]
name = "sgd"
lr = {lr}
momentum = {momentum}
[train]
max_duration = "{batches}ba"
threads = {threads}
eval_interval = "{batches}ba"
eval_subset_batches = 1
log_interval = "{log_every}ba"
progress = false
[distributed]
find_unused_parameters = {find_unused}
[checkpoint]
save = false
"""


def env(name, default):
    return int(os.environ.get(name, default))


def label(side, ranks, threads):
    ddp = " DDP" if side == "pytorch" and ranks > 1 else ""
    return f"{side}{ddp} {ranks}x{GLOBAL_BATCH // ranks} {threads}t"


def tessera_run(tessera, work, data_dir, name, ranks, threads, batches, warmup):
    run = f"{name}-{ranks}r{threads}t"
    path = Path(work) / f"{run}.toml"
    path.write_text(
        TOML.format(
            run=run,
            out=work,
            seed=env("SEED", 0),
            data_root=data_dir.parent,
            batch=GLOBAL_BATCH // ranks,
            model="\n".join(f"{k} = {json.dumps(v)}" for k, v in MODELS[name][0].items()
                             if k != "num_classes"),
            mean=MEAN,
            std=STD,
            lr=LR,
            momentum=MOMENTUM,
            batches=batches,
            threads=threads,
            log_every=math.gcd(warmup, batches),
            find_unused=str(env("FIND_UNUSED", 1) != 0).lower(),
        )
    )
    command = [tessera, "train", str(path)]
    if ranks > 1:
        command = [tessera, "launch", "--nproc", str(ranks)] + command[1:]
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{out.stderr[-3000:]}")
    folder = Path(work) / run
    lines = [json.loads(l) for l in (folder / "metrics.jsonl").read_text().splitlines()]
    train = {l["data"]["batch"]: l["data"] for l in lines if l.get("kind") == "train"}
    train[0] = {"sample": 0, "samples_per_second": 1.0}  # before the first step (WARMUP=0)
    secs = lambda d: d["sample"] / d["samples_per_second"]  # noqa: E731
    a, b = train[warmup], train[batches]
    record = json.loads((folder / "run.json").read_text())
    return {
        "samples_per_second": (b["sample"] - a["sample"]) / (secs(b) - secs(a)),
        "timing": (record.get("data_parallel") or {}).get("timing"),
    }


def pytorch_run(data_dir, name, ranks, threads, batches, warmup):
    script = Path(__file__).resolve().parent / "bench_dp_pytorch.py"
    e = dict(os.environ, MODEL=name, WORLD=str(ranks), BATCH=str(GLOBAL_BATCH // ranks),
             THREADS=str(threads), BATCHES=str(batches), WARMUP=str(warmup), DATA=str(data_dir))
    out = subprocess.run([sys.executable, "-W", "ignore", str(script)], capture_output=True,
                         text=True, env=e)
    if out.returncode != 0:
        sys.exit(f"bench_dp_pytorch.py failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def load():
    return ", ".join(Path("/proc/loadavg").read_text().split()[:3])


TIMING_KEYS = ("forward_seconds", "backward_compute_seconds", "backward_comm_seconds",
               "overlap_seconds")


def median_timing(timings):
    timings = [t for t in timings if t]
    if not timings:
        return None
    return {k: statistics.median(t[k] for t in timings) for k in TIMING_KEYS}


def bench_model(name, tessera, data_dir, rounds, warmup, work):
    batches = env("BATCHES", DEFAULT_BATCHES[name])
    if not 0 <= warmup < batches:
        sys.exit(f"WARMUP ({warmup}) must be below BATCHES ({batches})")
    runs = {v: [] for v in VARIANTS}
    timings = {"tessera": [], "pytorch": []}
    lone, params, buckets = [], None, None
    for r in range(rounds):
        for v in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
            side, ranks, threads = v
            before = load()
            if side == "tessera":
                res = tessera_run(tessera, work, data_dir, name, ranks, threads, batches, warmup)
            else:
                res = pytorch_run(data_dir, name, ranks, threads, batches, warmup)
                params = res["params"]
                if ranks > 1:
                    lone.append(res["isolated_all_reduce_seconds"])
                    buckets = res["timing"].get("bucket_bytes")
            if ranks > 1:
                timings[side].append(res["timing"])
            runs[v].append(res["samples_per_second"])
            print(f"{name} round {r + 1} {label(*v):22} {res['samples_per_second']:7.0f} samples/s"
                  f" (load {before} before, {load()} after)", flush=True)
    return {
        "name": name,
        "batches": batches,
        "params": params,
        "runs": runs,
        "timing": {side: median_timing(t) for side, t in timings.items()},
        "lone_all_reduce": statistics.median(lone) if lone else None,
        "pytorch_buckets": buckets,
    }


def report(result, rounds, warmup):
    name, runs = result["name"], result["runs"]
    med = {v: statistics.median(s) for v, s in runs.items()}
    grad_bytes = result["params"] * 4
    print()
    print(f"== {name}: {result['params']:,} parameters, gradients {grad_bytes / 1e6:.2f} MB; "
          f"global batch {GLOBAL_BATCH}, {result['batches'] - warmup} timed batches after "
          f"{warmup}, {rounds} rounds alternating; samples/s, median (all rounds)")
    for v in VARIANTS:
        print(f"  {label(*v):22} {med[v]:8.0f}  ({', '.join(f'{s:.0f}' for s in runs[v])})")
    for side in ("tessera", "pytorch"):
        two, one = med[(side, 2, 1)], med[(side, 1, 2)]
        one_thread = med.get((side, 1, 1))
        extra = f", vs 1 process 1 thread {two / one_thread:.2f}x" if one_thread else ""
        print(f"  {side} speed-up, 2 ranks vs 1 process 2 threads: {two / one:.2f}x{extra}")
    t, p = med[("tessera", 2, 1)], med[("pytorch", 2, 1)]
    print(f"  2 ranks, time ratio tessera/pytorch DDP: {p / t:.3f} (above 1: Tessera slower); "
          f"1 process 2 threads: {med[('pytorch', 1, 2)] / med[('tessera', 1, 2)]:.3f}")
    print("  per step on rank 0, ms (DDP logger averages, median over rounds):")
    print(f"    {'':8} {'forward':>8} {'bwd comp':>9} {'bwd comm':>9} {'overlap':>8} "
          f"{'comm - overlap':>15} {'grad MB/s over comm':>20}")
    for side, timing in result["timing"].items():
        if not timing:
            print(f"    {side:8} (no timing recorded)")
            continue
        comm = timing["backward_comm_seconds"]
        print(f"    {side:8} {timing['forward_seconds'] * 1e3:8.2f} "
              f"{timing['backward_compute_seconds'] * 1e3:9.2f} {comm * 1e3:9.2f} "
              f"{timing['overlap_seconds'] * 1e3:8.2f} "
              f"{(comm - timing['overlap_seconds']) * 1e3:15.2f} "
              f"{grad_bytes / comm / 1e6 if comm > 0 else float('nan'):20.0f}")
    if result["pytorch_buckets"]:
        print(f"  PyTorch DDP's gradient buckets, bytes: {result['pytorch_buckets']}")
    lone = result["lone_all_reduce"]
    if lone:
        print(f"  one lone all_reduce of the gradients' size (PyTorch, Gloo, median of 20): "
              f"{lone * 1e3:.2f} ms, {grad_bytes / lone / 1e6:.0f} MB/s")


def main():
    rounds, warmup = env("ROUNDS", 3), env("WARMUP", 10)
    names = os.environ.get("MODELS", "cnn,resnet20").split(",")
    for name in names:
        if name not in DEFAULT_BATCHES:
            sys.exit(f"MODELS: unknown model {name!r} (known: {', '.join(DEFAULT_BATCHES)})")
    tessera = os.environ.get("TESSERA", "target/release/tessera")
    data_dir = Path(os.environ.get("DATA", Path.home() / ".cache/tessera/data/fashion-mnist"))
    print(f"{os.cpu_count()} cores, load {load()} at the start; find_unused_parameters "
          f"{env('FIND_UNUSED', 1) != 0} on both sides")
    results = []
    with tempfile.TemporaryDirectory() as work:
        for name in names:
            results.append(bench_model(name, tessera, data_dir, rounds, warmup, work))
    for result in results:
        report(result, rounds, warmup)
    print(f"\nload {load()} at the end")


if __name__ == "__main__":
    main()
