"""Step-time cost of each method: `tessera train` of the same run with and without one plugin,
alternating, medians of the training time per batch (run.json's train_seconds / batches) and
their ratio (above 1: the method costs time). ResNet-20 (width 16) on Fashion-MNIST, batch 64,
SGD, 2 threads, no evaluation during training; stochastic_depth on ResNet-50 (width 8), the only
zoo model with bottleneck blocks. Run it through `scripts/bench-methods.sh`.

Environment: ROUNDS (3), BATCHES (30), METHODS (comma-separated subset), TESSERA (the binary),
DATA (the data cache root, holding fashion-mnist/).
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# entry -> (settings lines, model lines); an entry `plugin@variant` measures `plugin` with
# other settings (`sam@interval10`).
RESNET20 = 'name = "resnet20"\nwidth = 16'
RESNET50 = 'name = "resnet50"\nwidth = 8'
METHODS = {
    "label_smoothing": ("smoothing = 0.1", RESNET20),
    "cutout": ("length = 0.25", RESNET20),
    "blurpool": ("min_channels = 16", RESNET20),
    "sam": ("", RESNET20),
    "sam@interval10": ("interval = 10", RESNET20),
    "selective_backprop": ("start = 0.0\nend = 1.0", RESNET20),
    "ema": ('half_life = "10ba"', RESNET20),
    "mixup": ("", RESNET20),
    "cutmix": ("", RESNET20),
    "colout": ("", RESNET20),
    "progressive_resizing": ("delay_fraction = 0.0\nfinetune_fraction = 0.0", RESNET20),
    "randaugment": ("", RESNET20),
    "augmix": ("", RESNET20),
    "channels_last": ("", RESNET20),
    "weight_standardization": ("", RESNET20),
    "ghost_batchnorm": ("ghost_batch_size = 16", RESNET20),
    "squeeze_excite": ("latent_channels = 0.25\nmin_channels = 16", RESNET20),
    "factorize": ("min_channels = 16\nlatent_channels = 0.25", RESNET20),
    "stochastic_depth": ("drop_rate = 0.2", RESNET50),
    "swa": ('swa_start = "0.0dur"\nswa_end = "1.0dur"\nupdate_interval = "1ba"', RESNET20),
}

TOML = """run_name = "{name}"
output_dir = "{out}"
seed = 0
[data]
dataset = "fashion-mnist"
data_dir = "{data}"
fetch = false
batch_size = 64
eval_batch_size = 1000
workers = 0
[data.transforms]
normalize = {{ mean = [0.2860], std = [0.3530] }}
[model]
{model}
[optimizer]
name = "sgd"
lr = 0.05
momentum = 0.9
[train]
max_duration = "{batches}ba"
threads = 2
eval_interval = "{batches}ba"
eval_subset_batches = 1
log_interval = "{batches}ba"
progress = false
[checkpoint]
save = false
[plugins]
dirs = ["{plugins}"]
{algorithm}
"""


def seconds_per_batch(tessera, work, name, model, plugin, settings, batches, data, plugins):
    algorithm = f'[[algorithms]]\nplugin = "{plugin}"\n{settings}' if plugin else ""
    path = Path(work) / f"{name}.toml"
    path.write_text(
        TOML.format(
            name=name, out=work, data=data, model=model, batches=batches,
            plugins=plugins, algorithm=algorithm,
        )
    )
    out = subprocess.run([tessera, "train", str(path)], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{path}: tessera train failed:\n{out.stderr[-2000:]}")
    record = json.loads((Path(work) / name / "run.json").read_text())
    return record["train_seconds"] / record["batches"]


def main():
    rounds = int(os.environ.get("ROUNDS", "3"))
    batches = int(os.environ.get("BATCHES", "30"))
    names = [m for m in os.environ.get("METHODS", ",".join(METHODS)).split(",") if m]
    tessera = os.environ.get("TESSERA", "target/release/tessera")
    data = os.environ.get("DATA", str(Path.home() / ".cache/tessera/data"))
    plugins = str(Path(tessera).resolve().parent)
    print(f"{rounds} rounds, {batches} batches of 64, alternating; ms per batch (medians)")
    with tempfile.TemporaryDirectory() as work:
        for m in names:
            settings, model = METHODS[m]
            runs = {"plain": [], "method": []}
            for r in range(rounds):
                order = ["plain", "method"] if r % 2 == 0 else ["method", "plain"]
                for side in order:
                    plugin = m.split("@")[0] if side == "method" else None
                    runs[side].append(
                        seconds_per_batch(tessera, work, f"{m.replace('@', '-')}-{side}", model, plugin,
                                          settings, batches, data, plugins)
                    )
            p, q = statistics.median(runs["plain"]), statistics.median(runs["method"])
            print(f"{m:24} plain {p * 1e3:7.1f} ms, with it {q * 1e3:7.1f} ms, ratio {q / p:.3f}")


if __name__ == "__main__":
    main()
