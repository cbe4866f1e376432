#!/usr/bin/env python3
"""torchvision's reading of images, the reference for Tessera's image folders (tests/data/folder.rs).

    python3 scripts/folder_resize_reference.py DIR

Writes into DIR seeded random RGB images of several shapes as `<k>.png` and, for each and for
channels 3 (`convert("RGB")`) and 1 (`convert("L")`), what torchvision makes of it with
`Resize(size)` then `CenterCrop(size)`: `<k>-<channels>-<size>.raw`, C×H×W uint8 bytes.
Exits 0 on success, 2 when it cannot run (bad arguments, torchvision or PIL missing).
"""

import os
import random
import sys

# (width, height, size): shrinking, enlarging, landscape, portrait, square, odd crop offsets.
CASES = [(37, 23, 16), (64, 48, 32), (20, 30, 28), (13, 13, 28), (100, 61, 7), (28, 28, 28)]


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        import numpy as np
        from PIL import Image
        from torchvision import transforms
    except ImportError as e:
        print(f"cannot import torchvision, PIL or numpy: {e}", file=sys.stderr)
        return 2
    out = argv[1]
    rng = random.Random(0)
    for k, (width, height, size) in enumerate(CASES):
        pixels = bytes(rng.randrange(256) for _ in range(width * height * 3))
        image = Image.frombytes("RGB", (width, height), pixels)
        image.save(os.path.join(out, f"{k}.png"))
        for channels, mode in [(3, "RGB"), (1, "L")]:
            made = transforms.CenterCrop(size)(transforms.Resize(size)(image.convert(mode)))
            array = np.asarray(made, dtype=np.uint8)
            if channels == 3:
                array = array.transpose(2, 0, 1)
            array.tofile(os.path.join(out, f"{k}-{channels}-{size}.raw"))
    print(f"wrote {len(CASES)} images and their torchvision readings to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
