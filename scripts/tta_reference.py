#!/usr/bin/env python3
"""airbench's test-time augmentation, the reference for the test_time_augmentation plugin
(tests/methods/test_time_augmentation.rs).

    python3 scripts/tta_reference.py DIR CONFIDENCE

DIR holds little-endian float32 files written by the test: `input.f32` (N, 2, 5, 6 images),
`w1.f32` (2, 2, 3, 3), `b1.f32` (2), `w2.f32` (3, 60): the net
`linear(flatten(relu(conv2d(x, w1, b1, padding=1))), w2)`. Writes `level1.f32` and `level2.f32`,
the logits of airbench's `infer_mirror` and `infer_mirror_translate` (KellerJordan/cifar10-airbench
airbench94_muon.py @f1c599c, with the crops of 32x32 images written for H x W), and
`selective.f32`: level 2 only for the samples whose top softmax probability is below CONFIDENCE
(hiverge/cifar10-speedrun's selective TTA, with a threshold instead of its 25% quantile).
Exits 0 on success, 2 when it cannot run.
"""

import os
import struct
import sys


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(f"cannot import torch: {e}", file=sys.stderr)
        return 2
    folder, confidence = argv[1], float(argv[2])

    def read(name, shape):
        with open(os.path.join(folder, name), "rb") as f:
            data = f.read()
        values = struct.unpack(f"<{len(data) // 4}f", data)
        return torch.tensor(values, dtype=torch.float32).view(*shape)

    x = read("input.f32", (-1, 2, 5, 6))
    w1, b1, w2 = read("w1.f32", (2, 2, 3, 3)), read("b1.f32", (2,)), read("w2.f32", (3, 60))

    def net(inputs):
        h = F.relu(F.conv2d(inputs, w1, b1, padding=1))
        return F.linear(h.flatten(1), w2)

    def infer_mirror(inputs):
        return 0.5 * net(inputs) + 0.5 * net(inputs.flip(-1))

    def infer_mirror_translate(inputs):
        h, w = inputs.shape[-2:]
        logits = infer_mirror(inputs)
        padded = F.pad(inputs, (1,) * 4, "reflect")
        views = [padded[:, :, 0:h, 0:w], padded[:, :, 2 : h + 2, 2 : w + 2]]
        translated = torch.stack([infer_mirror(v) for v in views]).mean(0)
        return 0.5 * logits + 0.5 * translated

    def write(name, t):
        values = t.detach().to(torch.float32).flatten().tolist()
        with open(os.path.join(folder, name), "wb") as f:
            f.write(struct.pack(f"<{len(values)}f", *values))

    with torch.no_grad():
        write("level1.f32", infer_mirror(x))
        write("level2.f32", infer_mirror_translate(x))
        plain = net(x)
        unsure = F.softmax(plain, dim=1).max(dim=1).values < confidence
        selective = plain.clone()
        selective[unsure] = infer_mirror_translate(x[unsure])
        write("selective.f32", selective)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
