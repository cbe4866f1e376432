"""Whole-run benchmark: Tessera against a plain PyTorch loop on the same model, data, batch,
optimizer and schedule (Fashion-MNIST, SGD with momentum, constant rate, the same number of
batches), rounds alternating which goes first, medians of the training throughput and their
ratio per model. Run it through `scripts/bench-vs-pytorch.sh`, which builds Tessera, fetches the
data and points PYTHONPATH at the installed torch wheel.

Both sides time the same thing: the training loop from the first batch request to the last
optimizer step (Tessera's `train_seconds` in run.json, which leaves out evaluation and start-up;
here `time.perf_counter` around the loop), over the same samples, with the same number of
libtorch threads. The PyTorch loop is what a user would write: the uint8 images in one tensor, a
shuffled index per epoch, float conversion and normalization per batch, `torch.optim.SGD`.

Environment: ROUNDS (3), THREADS (2), MODELS (cnn,resnet20,mlp), TESSERA (the binary),
DATA (the Fashion-MNIST cache folder), DEVICE (cpu; `cuda` trains both on the GPU: the batch is
moved there each step, as a user's loop does, and the clock stops after a CUDA synchronize),
SCALE (1: multiplies the number of batches, for a GPU where 150 batches take a second).
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pytorch_models  # noqa: E402

# Per model: the zoo config, batch size and batches trained per run.
MODELS = {
    "cnn": ({"name": "cnn", "width": 32, "num_classes": 10}, 128, 150),
    "resnet20": ({"name": "resnet20", "width": 16, "num_classes": 10}, 128, 30),
    "mlp": ({"name": "mlp", "hidden": [256], "num_classes": 10}, 64, 600),
}
MEAN, STD, LR, MOMENTUM = 0.2860, 0.3530, 0.05, 0.9


def read_idx(path):
    data = Path(path).read_bytes()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims)]
    return torch.frombuffer(bytearray(data[4 + 4 * dims :]), dtype=torch.uint8).view(shape)


def batches_of(name):
    return MODELS[name][2] * int(os.environ.get("SCALE", "1"))


def pytorch_run(name, data_dir, threads, device):
    """Samples per second of a plain PyTorch training loop."""
    config, batch, _ = MODELS[name]
    batches = batches_of(name)
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    images = read_idx(data_dir / "train-images-idx3-ubyte").unsqueeze(1)
    labels = read_idx(data_dir / "train-labels-idx1-ubyte").long()
    model = pytorch_models.build(config, (1, 28, 28)).to(device)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    loss_fn = torch.nn.CrossEntropyLoss()
    per_epoch = images.shape[0] // batch
    done = 0
    started = time.perf_counter()
    while done < batches:
        order = torch.randperm(images.shape[0])
        for i in range(min(per_epoch, batches - done)):
            index = order[i * batch : (i + 1) * batch]
            x = ((images[index].float() / 255.0 - MEAN) / STD).to(device)
            y = labels[index].to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            done += 1
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    return batches * batch / seconds


TOML = """run_name = "{name}"
output_dir = "{out}"
seed = 0
[data]
dataset = "fashion-mnist"
data_dir = "{data_root}"
fetch = false
batch_size = {batch}
eval_batch_size = 1000
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
device = "{device}"
eval_interval = "{batches}ba"
eval_subset_batches = 1
log_interval = "{batches}ba"
progress = false
[checkpoint]
save = false
"""


def tessera_run(name, tessera, data_dir, threads, device, work):
    """Samples per second of `tessera train` (run.json's samples / train_seconds)."""
    config, batch, _ = MODELS[name]
    batches = batches_of(name)
    model = "\n".join(
        f"{k} = {json.dumps(v)}" for k, v in config.items() if k != "num_classes"
    )
    toml = TOML.format(
        name=name,
        out=work,
        data_root=data_dir.parent,
        batch=batch,
        mean=MEAN,
        std=STD,
        model=model,
        lr=LR,
        momentum=MOMENTUM,
        batches=batches,
        threads=threads,
        device=device,
    )
    path = Path(work) / f"{name}.toml"
    path.write_text(toml)
    out = subprocess.run(
        [tessera, "train", str(path)], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        sys.exit(f"tessera train {path} failed:\n{out.stderr}")
    record = json.loads((Path(work) / name / "run.json").read_text())
    return record["samples"] / record["train_seconds"]


def main():
    rounds = int(os.environ.get("ROUNDS", "3"))
    threads = int(os.environ.get("THREADS", "2"))
    device = os.environ.get("DEVICE", "cpu")
    names = os.environ.get("MODELS", "cnn,resnet20,mlp").split(",")
    tessera = os.environ.get("TESSERA", "target/release/tessera")
    data_dir = Path(
        os.environ.get("DATA", Path.home() / ".cache/tessera/data/fashion-mnist")
    )
    print(
        f"torch {torch.__version__}, {device}, {threads} threads, {rounds} rounds, alternating; "
        "samples/s of the training loop"
    )
    with tempfile.TemporaryDirectory() as work:
        for name in names:
            _, batch, _ = MODELS[name]
            batches = batches_of(name)
            runs = {"tessera": [], "pytorch": []}
            for r in range(rounds):
                order = ["tessera", "pytorch"] if r % 2 == 0 else ["pytorch", "tessera"]
                for side in order:
                    if side == "tessera":
                        sps = tessera_run(name, tessera, data_dir, threads, device, work)
                    else:
                        sps = pytorch_run(name, data_dir, threads, device)
                    runs[side].append(sps)
            t, p = statistics.median(runs["tessera"]), statistics.median(runs["pytorch"])
            print(
                f"{name:9} batch {batch:3} x {batches:3}: tessera {t:8.0f} samples/s "
                f"({', '.join(f'{v:.0f}' for v in runs['tessera'])}), pytorch {p:8.0f} "
                f"({', '.join(f'{v:.0f}' for v in runs['pytorch'])}); "
                f"time ratio tessera/pytorch {p / t:.3f}"
            )


if __name__ == "__main__":
    main()
