"""Tokens/s of the GPT of `examples/gpt` (no methods): `tessera train` against a plain PyTorch
loop (`scripts/bench_gpt_pytorch.py`, which says what it runs), same model, data, packing, batch
32, AdamW and constant rate, rounds alternating which goes first; medians and the ratio. Run it
through `scripts/bench-gpt.sh`.

Both sides time the training steps after WARMUP batches with THREADS libtorch threads. Tessera's
figure comes from its cumulative log lines (metrics.jsonl, `log_interval = LOG_EVERY` batches):
train seconds at batch b = token / tokens_per_second, so the rate over batches WARMUP..BATCHES is
(tokens_end - tokens_warmup) / (seconds_end - seconds_warmup) (evaluation and start-up are not in
`train_seconds`). Data in the training thread (`data.workers = 0`), as the PyTorch loop.

Also printed: the mean training loss over each LOG_EVERY batches of both sides in the last round
(a sanity check that they train alike: different dropout and shuffling draws, so not bitwise).

Environment: ROUNDS (3), BATCHES (35), WARMUP (5), THREADS (2), LOG_EVERY (5), SEED (0, both
sides' seed: Tessera's `seed`, PyTorch's manual_seed), SHUFFLE (1; 0: both sides take the
sequences in stream order, the same batches), TESSERA, DATA (cache root), and bench_gpt_pytorch.py's ACT and TWIN.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

TOML = """run_name = "gpt-bench"
output_dir = "{out}"
seed = {seed}
[data]
dataset = "shakespeare"
data_dir = "{data}"
fetch = false
batch_size = 32
eval_batch_size = 64
workers = 0
shuffle = {shuffle}
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
[train]
max_duration = "{batches}ba"
threads = {threads}
eval_interval = "{batches}ba"
eval_subset_batches = 1
log_interval = "{log_every}ba"
progress = false
[checkpoint]
save = false
"""


def env(name, default):
    return int(os.environ.get(name, default))


def tessera_run(tessera, work, batches, warmup, threads, log_every, data):
    path = Path(work) / "gpt.toml"
    path.write_text(
        TOML.format(
            out=work, seed=env("SEED", 0), shuffle=str(os.environ.get("SHUFFLE", "1") != "0").lower(), data=data, batches=batches, threads=threads, log_every=log_every
        )
    )
    out = subprocess.run([tessera, "train", str(path)], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"tessera train failed:\n{out.stderr[-3000:]}")
    lines = [
        json.loads(l)
        for l in (Path(work) / "gpt-bench" / "metrics.jsonl").read_text().splitlines()
    ]
    train = {l["data"]["batch"]: l["data"] for l in lines if l.get("kind") == "train"}
    secs = lambda d: d["token"] / d["tokens_per_second"]  # noqa: E731
    a, b = train[warmup], train[batches]
    return {
        "side": "tessera",
        "tokens_per_second": (b["token"] - a["token"]) / (secs(b) - secs(a)),
        "losses": [[k, v["loss"]] for k, v in sorted(train.items())],
    }


def pytorch_run(batches, warmup, threads, log_every, data):
    script = Path(__file__).resolve().parent / "bench_gpt_pytorch.py"
    e = dict(os.environ, BATCHES=str(batches), WARMUP=str(warmup), THREADS=str(threads),
             LOG_EVERY=str(log_every), DATA=str(data))
    out = subprocess.run([sys.executable, "-W", "ignore", str(script)], capture_output=True,
                         text=True, env=e)
    if out.returncode != 0:
        sys.exit(f"bench_gpt_pytorch.py failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def load():
    return "load " + ", ".join(Path("/proc/loadavg").read_text().split()[:3])


def main():
    rounds, batches, warmup = env("ROUNDS", 3), env("BATCHES", 35), env("WARMUP", 5)
    threads, log_every = env("THREADS", 2), env("LOG_EVERY", 5)
    tessera = os.environ.get("TESSERA", "target/release/tessera")
    data = Path(os.environ.get("DATA", Path.home() / ".cache/tessera/data"))
    runs = {"tessera": [], "pytorch": []}
    last = {}
    with tempfile.TemporaryDirectory() as work:
        for r in range(rounds):
            order = ["tessera", "pytorch"] if r % 2 == 0 else ["pytorch", "tessera"]
            for side in order:
                before = load()
                if side == "tessera":
                    res = tessera_run(tessera, work, batches, warmup, threads, log_every, data)
                else:
                    res = pytorch_run(batches, warmup, threads, log_every, data)
                runs[side].append(res["tokens_per_second"])
                last[side] = res
                print(f"round {r + 1} {side:8} {res['tokens_per_second']:7.0f} tokens/s "
                      f"({before} before, {load()} after)", flush=True)
    t, p = statistics.median(runs["tessera"]), statistics.median(runs["pytorch"])
    print(f"pytorch model: {last['pytorch']['model']}, {last['pytorch']['params']} parameters")
    print(f"batch 32 x 128 tokens, {batches - warmup} timed batches after {warmup}, "
          f"{threads} threads, {rounds} rounds alternating")
    print(f"median tokens/s: tessera {t:.0f} ({', '.join(f'{v:.0f}' for v in runs['tessera'])}), "
          f"pytorch {p:.0f} ({', '.join(f'{v:.0f}' for v in runs['pytorch'])}); "
          f"time ratio tessera/pytorch {p / t:.3f}")
    tl, pl = dict(last["tessera"]["losses"]), dict(last["pytorch"]["losses"])
    print("mean training loss per window (last round), batch: tessera / pytorch")
    for b in sorted(set(tl) & set(pl)):
        print(f"  {b:4}: {tl[b]:.3f} / {pl[b]:.3f}")


if __name__ == "__main__":
    main()
