#!/usr/bin/env python3
"""Writes a small CNN made in PyTorch as a TorchScript file, for `[model] torchscript`.

    python3 scripts/make_torchscript_model.py OUT.pt [--channels 1] [--classes 10] [--seed 0]

The model (Conv2d + BatchNorm2d + ReLU, twice, then global average pooling and a Linear) takes
`(N, channels, H, W)` images of any size and gives `(N, classes)` logits. It is the worked
example of docs/torchscript.md and the model tests/models/torchscript.rs trains; `--channels` and
`--classes` make the misfits that test refuses.
"""

import argparse
import warnings

with warnings.catch_warnings():
    # The torch wheel warns at import when NumPy is missing; it is not needed here.
    warnings.simplefilter("ignore")
    import torch
    from torch import nn


class SmallCNN(nn.Module):
    def __init__(self, channels=1, classes=10, width=16):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1, bias=False),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(2 * width, classes)

    def forward(self, x):
        x = self.pool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the .pt file to write")
    parser.add_argument("--channels", type=int, default=1)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    model = SmallCNN(args.channels, args.classes)
    torch.jit.script(model).save(args.out)
    params = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.out}: SmallCNN, {params} parameters, {len(model.state_dict())} tensors")


if __name__ == "__main__":
    main()
