"""torchvision's side of tests/data/image_transforms.rs.

Reads CASES (JSON written by the test): for each decode, the image file, the plan, what
Tessera drew (crop box, colour-jitter order and factors) and Tessera's C×H×W u8 output; applies
torchvision.transforms.functional to the PIL image with those same draws and prints the largest
absolute pixel difference per case. For each recorded RandomResizedCrop draw, feeds the uniform
numbers Tessera consumed to torchvision's own RandomResizedCrop.get_params (torch's uniform_ and
randint replaced by them) and checks it returns the same box. A JPEG decoded at a reduced DCT
scale is also compared with Pillow's decode at that scale (`draft`) resized from the same box.

Usage: python3 image_transforms_reference.py CASES  ->  prints one JSON object.
"""

import json
import math
import sys

import numpy as np
import torch
from PIL import Image
import torchvision.transforms as T
import torchvision.transforms.functional as F
import torchvision.transforms.transforms as tt
from torchvision.transforms import InterpolationMode


def reference_pixels(case, start=None):
    """torchvision's pixels for `case`; with `start` (Tessera's C×H×W pixels before the
    colour jitter), only the jitter, run on those."""
    mode = "L" if case["channels"] == 1 else "RGB"
    if start is not None:
        return jitter(Image.fromarray(hwc(start), mode), case["jitter"])
    img = Image.open(case["path"]).convert(mode)
    size = case["size"]
    crop = case["crop"]
    if crop is not None:
        img = F.resized_crop(
            img, crop["top"], crop["left"], crop["height"], crop["width"], [size, size],
            InterpolationMode.BILINEAR,
        )
    else:
        img = F.resize(img, case["resize"], InterpolationMode.BILINEAR)
        img = F.center_crop(img, size)
    return jitter(img, case["jitter"])


def draft_pixels(case, scale):
    """Pillow's pixels for a crop decoded at 1/`scale` (JPEG draft mode), or an error string."""
    mode = "L" if case["channels"] == 1 else "RGB"
    img = Image.open(case["path"])
    w, h = img.size
    # Pillow's draft picks the largest scale that keeps the image at least the size asked for.
    img.draft(mode, (w // scale, h // scale))
    expected = (-(-w // scale), -(-h // scale))
    if img.size != expected:
        return f"Pillow's draft gave {img.size}, not {expected}"
    img = img.convert(mode)
    c, size = case["crop"], case["size"]
    # The scaled pixels that cover the crop (Tessera decodes only those), then the crop's
    # fractional box in them.
    x, y = c["left"] // scale, c["top"] // scale
    right = min(-(-(c["left"] + c["width"]) // scale), expected[0])
    bottom = min(-(-(c["top"] + c["height"]) // scale), expected[1])
    box = (c["left"] / scale - x, c["top"] / scale - y, (c["left"] + c["width"]) / scale - x,
           (c["top"] + c["height"]) / scale - y)
    img = img.crop((x, y, right, bottom)).resize((size, size), Image.BILINEAR, box=box)
    a = np.asarray(img, dtype=np.int32)
    return a[None] if a.ndim == 2 else a.transpose(2, 0, 1)


def hwc(chw):
    return np.ascontiguousarray(chw[0] if chw.shape[0] == 1 else chw.transpose(1, 2, 0))


def jitter(img, jitter):
    if jitter is not None:
        # ColorJitter.forward with the drawn order and factors.
        for fn_id in jitter["order"]:
            if fn_id == 0 and jitter["brightness"] is not None:
                img = F.adjust_brightness(img, jitter["brightness"])
            elif fn_id == 1 and jitter["contrast"] is not None:
                img = F.adjust_contrast(img, jitter["contrast"])
            elif fn_id == 2 and jitter["saturation"] is not None:
                img = F.adjust_saturation(img, jitter["saturation"])
            elif fn_id == 3 and jitter["hue"] is not None:
                img = F.adjust_hue(img, jitter["hue"])
    a = np.asarray(img, dtype=np.int32)
    if a.ndim == 2:
        a = a[None]
    else:
        a = a.transpose(2, 0, 1)
    return a


class FedTorch:
    """Stands in for `torch` inside torchvision.transforms.transforms: `empty(1).uniform_(a, b)`
    and `randint(lo, hi, ...)` take the next of the given uniform numbers."""

    def __init__(self, uniforms):
        self.uniforms = list(uniforms)
        self.used = 0

    def next(self):
        u = self.uniforms[self.used]
        self.used += 1
        return u

    def empty(self, *args, **kwargs):
        fed = self

        class Uniform:
            def uniform_(self, a, b):
                a, b = float(a), float(b)
                return torch.tensor([a + (b - a) * fed.next()], dtype=torch.float32)

        return Uniform()

    def randint(self, low, high, size=None):
        return torch.tensor([low + min(int(self.next() * (high - low)), high - low - 1)])

    def __getattr__(self, name):
        return getattr(torch, name)


def check_draws(draws):
    mismatches = []
    real = tt.torch
    try:
        for d in draws:
            fed = FedTorch(d["uniforms"])
            tt.torch = fed
            img = real.zeros(3, d["height"], d["width"], dtype=real.uint8)
            i, j, h, w = T.RandomResizedCrop.get_params(img, d["scale"], d["ratio"])
            got = {"top": int(i), "left": int(j), "height": int(h), "width": int(w)}
            if got != d["crop"] or fed.used != len(d["uniforms"]):
                mismatches.append({"tessera": d["crop"], "torchvision": got,
                                   "uniforms_used": fed.used, "given": len(d["uniforms"])})
    finally:
        tt.torch = real
    return mismatches


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    diffs = []
    end_to_end = 0
    for case in cases["decodes"]:
        ours = np.fromfile(case["output"], dtype=np.uint8).astype(np.int32)
        ref = reference_pixels(case)
        if ours.size != ref.size:
            diffs.append({"case": case["output"], "error": f"sizes {ours.size} vs {ref.shape}"})
            continue
        worst = int(np.abs(ours - ref.reshape(-1)).max())
        mean = float(np.abs(ours - ref.reshape(-1)).mean())
        if case["before_jitter"] is not None:
            # Crop + resize on their own, then the jitter on Tessera's resized pixels.
            end_to_end = max(end_to_end, worst)
            c, s = case["channels"], case["size"]
            before = np.fromfile(case["before_jitter"], dtype=np.uint8).reshape(c, s, s)
            plain = reference_pixels(dict(case, jitter=None))
            worst = max(int(np.abs(before.astype(np.int32) - plain).max()),
                        int(np.abs(ours - reference_pixels(case, before).reshape(-1)).max()))
        entry = {"case": case["output"], "max": worst, "mean": mean}
        scale = case.get("dct_scale") or 1
        if scale > 1:
            # The same DCT-scaled decode in Pillow (its `draft`, libjpeg's scaled IDCT), then the
            # crop's fractional box resized as torchvision resizes a crop (antialiased bilinear).
            draft = draft_pixels(case, scale)
            if isinstance(draft, str):
                entry["draft_error"] = draft
            else:
                entry["draft_max"] = int(np.abs(ours - draft.reshape(-1)).max())
                entry["draft_mean"] = float(np.abs(ours - draft.reshape(-1)).mean())
        diffs.append(entry)
    print(json.dumps({
        "diffs": diffs,
        "end_to_end_jitter_max": end_to_end,
        "draw_mismatches": check_draws(cases["draws"]),
        "draws": len(cases["draws"]),
        "fallbacks": sum(1 for d in cases["draws"] if len(d["uniforms"]) == 20),
    }))


if __name__ == "__main__":
    main()
