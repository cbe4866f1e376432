"""Tessera's image-folder loader against torchvision's DataLoader on the same JPEG folder.

Run through scripts/bench-jpeg-loader.sh (which builds the `loader_bench` example and sets
PYTHONPATH). Makes the folder once: IMAGES JPEGs (quality 90) of ImageNet-like sizes (width
and height drawn around 500x375, both orientations), textured so that they compress like
photographs, in CLASSES class folders under train/ (val/ holds one image per class, which
the loader's folder layout requires). Then, for each worker count, alternating sides per round:

- Tessera: `loader_bench ROOT SIZE WORKERS 256 rrc` (`rrc-dct` with DCT=1) — one epoch of RandomResizedCrop(SIZE) + flip
  to u8 batches of 256 with WORKERS loader threads;
- torchvision: ImageFolder(train, Compose([RandomResizedCrop(SIZE), RandomHorizontalFlip(),
  PILToTensor()])) + DataLoader(batch_size=256, shuffle=True, num_workers=WORKERS) collating to
  uint8 tensors, one epoch (worker start-up included, as Tessera's thread start-up is).

Prints the medians and the ratio (Tessera / torchvision) per worker count: both use WORKERS
worker cores, so the ratio is the per-core ratio.
"""

import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
from PIL import Image

IMAGES = int(os.environ.get("IMAGES", "5000"))
CLASSES = int(os.environ.get("CLASSES", "10"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
WORKERS = [int(w) for w in os.environ.get("WORKERS", "1 2").split()]
SIZE = int(os.environ.get("SIZE", "224"))
# DCT=1: Tessera with jpeg_dct_scale = true (JPEGs decoded at 1/2, 1/4 or 1/8 when the crop is
# at least twice the sample size on both sides).
DCT = os.environ.get("DCT", "0") == "1"
CACHE = os.environ.get("TESSERA_CACHE") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tessera")
ROOT = os.path.join(CACHE, f"bench-jpeg-{IMAGES}-{CLASSES}")


def make_folder():
    if os.path.exists(os.path.join(ROOT, "done")):
        return
    rng = np.random.default_rng(0)
    partial = ROOT + f".partial-{os.getpid()}"
    for part, count in (("train", IMAGES), ("val", CLASSES)):
        for i in range(count):
            c = i % CLASSES
            d = os.path.join(partial, part, f"class{c:03d}")
            os.makedirs(d, exist_ok=True)
            w, h = int(rng.integers(400, 600)), int(rng.integers(300, 450))
            if rng.random() < 0.25:
                w, h = h, w
            # Smooth colour fields plus fine noise: JPEG sizes like photographs' (~60-120 kB).
            low = rng.integers(0, 256, (h // 32 + 2, w // 32 + 2, 3), dtype=np.uint8)
            base = np.asarray(Image.fromarray(low).resize((w, h), Image.BICUBIC), dtype=np.int16)
            noise = rng.integers(-24, 25, (h, w, 3), dtype=np.int16)
            pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(os.path.join(d, f"{i:06d}.jpg"), quality=90)
    os.rename(partial, ROOT)
    open(os.path.join(ROOT, "done"), "w").close()


def tessera(workers):
    out = subprocess.run(
        [os.environ["LOADER_BENCH"], ROOT, str(SIZE), str(workers), "256",
         "rrc-dct" if DCT else "rrc"],
        check=True, capture_output=True, text=True, timeout=3600)
    return json.loads(out.stdout)["images_per_s"]


def torchvision(workers):
    import torch
    import torchvision.datasets as datasets
    import torchvision.transforms as T
    torch.set_num_threads(1)
    transform = T.Compose([T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip(), T.PILToTensor()])
    data = datasets.ImageFolder(os.path.join(ROOT, "train"), transform=transform)
    loader = torch.utils.data.DataLoader(data, batch_size=256, shuffle=True, num_workers=workers)
    start = time.perf_counter()
    n = 0
    for x, _ in loader:
        assert x.dtype == torch.uint8
        n += x.shape[0]
    return n / (time.perf_counter() - start)


def main():
    make_folder()
    if len(sys.argv) > 1 and sys.argv[1] == "profile":
        out = subprocess.run([os.environ["LOADER_BENCH"], ROOT, str(SIZE), "profile", "500"],
                             check=True, capture_output=True, text=True, timeout=600)
        print(out.stdout.strip())
        return
    results = {}
    for workers in WORKERS:
        ours, theirs = [], []
        for r in range(ROUNDS):
            sides = [("tessera", ours, tessera), ("torchvision", theirs, torchvision)]
            if r % 2:
                sides.reverse()
            for name, into, run in sides:
                into.append(run(workers))
                print(f"workers {workers} round {r} {name}: {into[-1]:.0f} images/s", flush=True)
        t, v = statistics.median(ours), statistics.median(theirs)
        results[workers] = {"tessera": round(t, 1), "torchvision": round(v, 1),
                            "ratio": round(t / v, 2)}
    print(json.dumps({"images": IMAGES, "size": SIZE, "rounds": ROUNDS, "jpeg_dct_scale": DCT,
                      "by_workers": results}))


if __name__ == "__main__":
    main()
