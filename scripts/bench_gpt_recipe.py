"""Time to a target validation perplexity: the GPT of `examples/gpt` on Shakespeare, baseline
against ALiBi + SeqLengthWarmup, SEEDS seeds each, alternating (base s1, recipe s1, base s2,
recipe s2, ...). Run it through `scripts/bench-gpt-recipe.sh`.

Every run: batch 32 x 128 tokens, BATCHES batches, AdamW (lr 1e-3, weight decay 0.1), cosine
schedule with 5% warmup, THREADS libtorch threads, data in the training thread; evaluation every
EVAL_EVERY batches on the first EVAL_BATCHES batches of 64 validation sequences (always the same
ones), with a train log line at the same batches. From each run's metrics.jsonl and run.json:
the perplexity at each evaluation, the training seconds there (token / tokens_per_second of the
train line: evaluation and start-up excluded, identical for both variants anyway), the tokens the
loader gave (Tessera's `token` clock) and the tokens actually trained (after SeqLengthWarmup's
cut: its logged `curr_seq_len` x `curr_bs` per batch).

TARGET: the perplexity to reach; default the highest final perplexity of the baseline runs (so
every baseline reaches it). Time to target = the training seconds at the first evaluation at or
below it (so it is resolved to EVAL_EVERY batches).

The recipe: `alibi` (max_sequence_length 128, train_sequence_length_scaling SCALING, default 1.0:
see docs/benchmarks.md for why) and `seq_length_warmup` (duration 0.3, 16 -> 128 in steps of 16).

Environment: BATCHES (150), EVAL_EVERY (15), EVAL_BATCHES (3), SEEDS (1,2), THREADS (2), SCALING
(1.0), TARGET, TESSERA, DATA (cache root), KEEP (a folder to keep the runs in).
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOML = """run_name = "{name}"
output_dir = "{out}"
seed = {seed}
[data]
dataset = "shakespeare"
data_dir = "{data}"
fetch = false
batch_size = 32
eval_batch_size = 64
workers = 0
[data.text]
seq_len = 128
vocab_size = 4096
[model]
name = "gpt2"
n_layer = 4
n_head = 4
n_embd = 256
n_positions = 128
dropout = 0.1
[optimizer]
name = "adamw"
lr = 1e-3
weight_decay = 0.1
[scheduler]
name = "cosine_with_warmup"
t_warmup = "0.05dur"
[train]
max_duration = "{batches}ba"
threads = {threads}
eval_interval = "{every}ba"
eval_subset_batches = {eval_batches}
log_interval = "{every}ba"
progress = false
[checkpoint]
save = false
[plugins]
dirs = ["{plugins}"]
"""

RECIPE = """
[[algorithms]]
plugin = "alibi"
max_sequence_length = 128
train_sequence_length_scaling = {scaling}

[[algorithms]]
plugin = "seq_length_warmup"
duration = 0.3
min_seq_length = 16
max_seq_length = 128
step_size = 16
"""


def load():
    return ", ".join(Path("/proc/loadavg").read_text().split()[:3])


def run(tessera, work, name, seed, recipe, cfg):
    toml = TOML.format(name=name, out=work, seed=seed, **cfg)
    if recipe:
        toml += RECIPE.format(scaling=cfg["scaling"])
    path = Path(work) / f"{name}.toml"
    path.write_text(toml)
    before = load()
    started = time.perf_counter()
    out = subprocess.run([tessera, "train", str(path)], capture_output=True, text=True)
    wall = time.perf_counter() - started
    if out.returncode != 0:
        sys.exit(f"tessera train {path} failed:\n{out.stderr[-3000:]}")
    folder = Path(work) / name
    record = json.loads((folder / "run.json").read_text())
    lines = [json.loads(l) for l in (folder / "metrics.jsonl").read_text().splitlines()]
    train = {l["data"]["batch"]: l["data"] for l in lines if l.get("kind") == "train"}
    seq, bs = {}, {}
    for l in lines:
        if l.get("kind") == "method" and l["name"].endswith("curr_seq_len"):
            seq[l["batch"]] = l["value"]
        if l.get("kind") == "method" and l["name"].endswith("curr_bs"):
            bs[l["batch"]] = l["value"]
    trained, cumulative = 0, {}
    for b in range(record["batches"]):
        trained += int(seq.get(b, 128) * bs.get(b, 32))
        cumulative[b + 1] = trained
    evals = []
    for e in record["evals"]:
        t = train[e["batch"]]
        evals.append({
            "batch": e["batch"],
            "perplexity": e["perplexity"],
            "seconds": t["token"] / t["tokens_per_second"],
            "tokens": t["token"],
            "trained_tokens": cumulative[e["batch"]],
        })
    return {
        "name": name, "seed": seed, "recipe": recipe, "evals": evals, "wall": wall,
        "train_seconds": record["train_seconds"], "final": record["final_perplexity"],
        "load": f"{before} / {load()}",
    }


def main():
    cfg = {
        "batches": int(os.environ.get("BATCHES", "150")),
        "every": int(os.environ.get("EVAL_EVERY", "15")),
        "eval_batches": int(os.environ.get("EVAL_BATCHES", "3")),
        "threads": int(os.environ.get("THREADS", "2")),
        "scaling": float(os.environ.get("SCALING", "1.0")),
        "data": os.environ.get("DATA", str(Path.home() / ".cache/tessera/data")),
    }
    seeds = [int(s) for s in os.environ.get("SEEDS", "1,2").split(",")]
    tessera = os.environ.get("TESSERA", "target/release/tessera")
    cfg["plugins"] = str(Path(tessera).resolve().parent)
    keep = os.environ.get("KEEP")
    work = keep or tempfile.mkdtemp()
    Path(work).mkdir(parents=True, exist_ok=True)
    runs = []
    for seed in seeds:
        for recipe in (False, True):
            name = f"{'recipe' if recipe else 'base'}-s{seed}"
            r = run(tessera, work, name, seed, recipe, cfg)
            runs.append(r)
            print(f"{name}: final perplexity {r['final']:.2f}, train {r['train_seconds']:.1f} s, "
                  f"wall {r['wall']:.1f} s (load {r['load']})", flush=True)
            print("   " + "  ".join(f"{e['batch']}:{e['perplexity']:.1f}@{e['seconds']:.0f}s"
                                    for e in r["evals"]), flush=True)
    base = [r for r in runs if not r["recipe"]]
    target = float(os.environ.get("TARGET", max(r["final"] for r in base)))
    print(f"\n{cfg['batches']} batches of 32 x 128, eval every {cfg['every']} batches on "
          f"{cfg['eval_batches']} x 64 validation sequences, ALiBi scaling {cfg['scaling']}; "
          f"target perplexity {target:.2f}")
    print("run         final ppl  train s  | to target: batch  train s  loader tokens  trained tokens")
    times = {False: [], True: []}
    for r in runs:
        hit = next((e for e in r["evals"] if e["perplexity"] <= target), None)
        if hit:
            times[r["recipe"]].append(hit["seconds"])
            to = (f"{hit['batch']:5}  {hit['seconds']:7.1f}  {hit['tokens']:13}  "
                  f"{hit['trained_tokens']:14}")
        else:
            to = "not reached"
        print(f"{r['name']:11} {r['final']:9.2f}  {r['train_seconds']:7.1f}  | {to}")
    if times[False] and len(times[True]) == len(seeds):
        b, c = statistics.mean(times[False]), statistics.mean(times[True])
        print(f"mean time to target: baseline {b:.1f} s, recipe {c:.1f} s; speed-up {b / c:.3f}")
    else:
        print("the recipe did not reach the target in every run: no speed-up to quote")
    print(f"runs kept in {work}" if keep else "")


if __name__ == "__main__":
    main()
