"""Tessera's MDS reader against MosaicML Streaming's StreamingDataset + DataLoader.

Run through scripts/bench-streaming.sh (which builds the `shards_bench` example and sets
PYTHONPATH). Writes the dataset once with streaming's own MDSWriter into
$TESSERA_CACHE/bench-mds-N: N samples (100,000) of SIZE x SIZE (64) textured JPEGs (quality 90)
in column `x` (encoding `jpeg`) with labels in `y` (`int`), 10 classes, zstd-compressed shards of
at most 8 MB, and a small val split. Then, alternating sides per round, medians of ROUNDS:

- images/s over one training epoch at WORKERS (1 and 2): Tessera's loader (`shards_bench ROOT
  SIZE 10 W 256 epoch`: decode + horizontal flip to u8 batches of 256, W loader threads) vs
  StreamingDataset(local=ROOT, split="train", shuffle=True, batch_size=256) with the same
  decode (PIL, from the `jpeg` column) + flip + PILToTensor, DataLoader(batch_size=256,
  num_workers=W) — dataset construction and worker start-up included on both sides;
- the time to the first batch when resuming at 90% of epoch 0 (and, for comparison, at its start),
  opening the dataset included: Tessera's `Loader::epoch(0, batch)` as a resumed run calls it vs
  StreamingDataset.load_state_dict({epoch 0, sample_in_epoch}) then the DataLoader's first batch
  (num_workers = 1).

Each measurement runs in its own process (StreamingDataset keeps shared memory per local folder),
timed inside it, so interpreter and import start-up are not counted.
"""

import json
import os
import statistics
import subprocess
import sys
import time

SAMPLES = int(os.environ.get("SAMPLES", "100000"))
SIZE = int(os.environ.get("SIZE", "64"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
WORKERS = [int(w) for w in os.environ.get("WORKERS", "1 2").split()]
FRACTION = float(os.environ.get("FRACTION", "0.9"))
BATCH = 256
CLASSES = 10
CACHE = os.environ.get("TESSERA_CACHE") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tessera")
ROOT = os.path.join(CACHE, f"bench-mds-{SAMPLES}-{SIZE}")


def make_dataset():
    if os.path.exists(os.path.join(ROOT, "done")):
        return
    import shutil

    import numpy as np
    from PIL import Image
    from streaming import MDSWriter

    partial = ROOT + f".partial-{os.getpid()}"
    rng = np.random.default_rng(0)
    for split, count in (("train", SAMPLES), ("val", 1000)):
        with MDSWriter(out=os.path.join(partial, split), columns={"x": "jpeg", "y": "int"},
                       compression="zstd", size_limit=8 << 20) as out:
            for i in range(count):
                # A smooth random field plus noise, so that it compresses like a photograph.
                base = rng.integers(0, 256, size=(SIZE // 8, SIZE // 8, 3), dtype=np.uint8)
                img = Image.fromarray(base).resize((SIZE, SIZE), Image.BILINEAR)
                noisy = np.asarray(img, dtype=np.int16) + rng.integers(-12, 13, size=(SIZE, SIZE, 3))
                img = Image.fromarray(noisy.clip(0, 255).astype(np.uint8))
                out.write({"x": img, "y": int(i % CLASSES)})
    open(os.path.join(partial, "done"), "w").close()
    if os.path.exists(ROOT):
        shutil.rmtree(ROOT)
    os.rename(partial, ROOT)


class _Flip:
    def __init__(self):
        import torch
        self.torch = torch

    def __call__(self, sample):
        from torchvision.transforms.functional import pil_to_tensor
        x = pil_to_tensor(sample["x"].convert("RGB"))
        if self.torch.rand(()) < 0.5:
            x = x.flip(-1)
        return x, sample["y"]


def streaming_dataset():
    from streaming import StreamingDataset

    class Dataset(StreamingDataset):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.transform = _Flip()

        def __getitem__(self, index):
            return self.transform(super().__getitem__(index))

    return Dataset(local=ROOT, split="train", shuffle=True, batch_size=BATCH)


def streaming_epoch(workers):
    from torch.utils.data import DataLoader

    start = time.perf_counter()
    loader = DataLoader(streaming_dataset(), batch_size=BATCH, num_workers=workers)
    images = 0
    for x, _ in loader:
        images += len(x)
    seconds = time.perf_counter() - start
    return {"images": images, "seconds": seconds, "images_per_s": images / seconds}


def streaming_resume(fraction):
    from torch.utils.data import DataLoader

    def first_batch(sample):
        start = time.perf_counter()
        dataset = streaming_dataset()
        if sample:
            dataset.load_state_dict({
                "epoch": 0,
                "sample_in_epoch": sample,
                # What StreamingDataset picks on one node for its default py1e shuffle.
                "num_canonical_nodes": dataset.num_canonical_nodes or 1,
                "shuffle_seed": dataset.shuffle_seed,
                "initial_physical_nodes": 1,
            })
        loader = DataLoader(dataset, batch_size=BATCH, num_workers=1)
        next(iter(loader))
        return time.perf_counter() - start

    batches = SAMPLES // BATCH
    at = int(fraction * batches)
    return {"batches": batches, "resume_batch": at, "first_batch_s": first_batch(0),
            "resume_first_batch_s": first_batch(at * BATCH)}


def run(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=1800)
    return json.loads(out.stdout.strip().splitlines()[-1])


def tessera(*args):
    return run([os.environ["SHARDS_BENCH"], ROOT, str(SIZE), str(CLASSES), *map(str, args)])


def python(*args):
    return run([sys.executable, "-W", "ignore", __file__, *map(str, args)])


def main():
    if len(sys.argv) > 1:
        # Imported before any clock starts (streaming imports transformers: seconds).
        import streaming  # noqa: F401
        import torch.utils.data  # noqa: F401
        import torchvision.transforms.functional  # noqa: F401
        mode = sys.argv[1]
        result = streaming_epoch(int(sys.argv[2])) if mode == "epoch" else \
            streaming_resume(float(sys.argv[2]))
        print(json.dumps(result))
        return
    make_dataset()
    report = {"samples": SAMPLES, "size": SIZE, "rounds": ROUNDS, "by_workers": {}}
    for workers in WORKERS:
        rates = {"tessera": [], "streaming": []}
        for r in range(ROUNDS):
            sides = [("tessera", lambda: tessera(workers, BATCH, "epoch")),
                     ("streaming", lambda: python("epoch", workers))]
            for name, go in sides if r % 2 == 0 else sides[::-1]:
                rate = go()["images_per_s"]
                rates[name].append(rate)
                print(f"workers {workers} round {r} {name}: {rate:.0f} images/s", flush=True)
        t, s = (statistics.median(rates[k]) for k in ("tessera", "streaming"))
        report["by_workers"][str(workers)] = {"tessera": round(t, 1), "streaming": round(s, 1),
                                              "ratio": round(t / s, 2)}
    resume = {"tessera": [], "streaming": []}
    for r in range(ROUNDS):
        sides = [("tessera", lambda: tessera(1, BATCH, "resume", FRACTION)),
                 ("streaming", lambda: python("resume", FRACTION))]
        for name, go in sides if r % 2 == 0 else sides[::-1]:
            got = go()
            resume[name].append(got)
            print(f"resume round {r} {name}: {json.dumps(got)}", flush=True)
    report["resume_at"] = FRACTION
    for name, rows in resume.items():
        report[f"resume_{name}"] = {
            key: round(statistics.median(row[key] for row in rows), 4)
            for key in ("first_batch_s", "resume_first_batch_s")}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
