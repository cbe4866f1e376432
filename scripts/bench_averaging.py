"""Effect of weight averaging on final accuracy: the Fashion-MNIST example
(examples/fashion-mnist/trainer.toml: CNN, 3 epochs, label smoothing and CutOut) trained as it
is and with one averaging method added, for several seeds; prints each run's final test
accuracy and, per variant, the mean and the spread (max - min). Run it through
`scripts/bench-averaging.sh`.

Environment: SEEDS (comma-separated, default "1,2"), VARIANTS (comma-separated subset of
baseline, ema, swa), TESSERA (the binary), EPOCHS (overrides the example's 3).
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "fashion-mnist" / "trainer.toml"

# variant -> extra [[algorithms]] text
VARIANTS = {
    "baseline": "",
    # Composer's defaults: half-life 1000 batches would hardly move in 1400 batches, so a
    # half-life fitted to this short run (the card's advice: about 1% to 10% of the run).
    "ema": '[[algorithms]]\nplugin = "ema"\nhalf_life = "50ba"\n',
    # Composer's defaults (start 0.7dur, end 0.97dur, average once per epoch) would average a
    # single epoch of 3; average every 50 batches from 0.5 of the run instead.
    "swa": '[[algorithms]]\nplugin = "swa"\nswa_start = "0.5dur"\nswa_end = "0.97dur"\n'
    'update_interval = "50ba"\n',
}


def run(tessera, work, variant, seed, epochs):
    text = EXAMPLE.read_text()
    plugins = str(Path(tessera).resolve().parent)
    text = text.replace('dirs = ["../../target/release"]', f'dirs = ["{plugins}"]')
    text = text.replace('output_dir = "../../runs"', f'output_dir = "{work}"')
    text += "\n" + VARIANTS[variant]
    path = Path(work) / f"{variant}-{seed}.toml"
    path.write_text(text)
    name = f"{variant}-{seed}"
    args = [
        tessera, "train", str(path),
        "--set", f"seed={seed}",
        "--set", f"run_name=\"{name}\"",
        "--set", "train.progress=false",
        "--set", "checkpoint.save=false",
    ]
    if epochs:
        args += ["--set", f"train.max_duration=\"{epochs}ep\""]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{path}: tessera train failed:\n{out.stderr[-3000:]}")
    record = json.loads((Path(work) / name / "run.json").read_text())
    return record["evals"][-1]["accuracy"], record["train_seconds"]


def main():
    seeds = [int(s) for s in os.environ.get("SEEDS", "1,2").split(",") if s]
    variants = [v for v in os.environ.get("VARIANTS", ",".join(VARIANTS)).split(",") if v]
    tessera = os.environ.get("TESSERA", str(ROOT / "target/release/tessera"))
    epochs = os.environ.get("EPOCHS")
    results = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as work:
        # Seeds outer, variants inner: the variants of one seed run side by side.
        for seed in seeds:
            for v in variants:
                acc, secs = run(tessera, work, v, seed, epochs)
                results[v].append(acc)
                print(f"{v:9} seed {seed}: accuracy {acc:.4f} ({secs:.0f} s training)", flush=True)
    print("variant   mean     spread (max - min)  runs")
    for v in variants:
        a = results[v]
        print(f"{v:9} {statistics.mean(a):.4f}   {max(a) - min(a):.4f}              {len(a)}")


if __name__ == "__main__":
    main()
