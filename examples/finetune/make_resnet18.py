#!/usr/bin/env python3
"""Writes torchvision's ResNet-18 state_dict as safetensors for the fine-tuning example:

    python3 make_resnet18.py weights/resnet18.safetensors [--pretrained]

With --pretrained, torchvision's ImageNet weights (`IMAGENET1K_V1`, downloaded by torchvision
into its cache: needs the network). Without it, torchvision's random init (seeded): a stand-in
with the same names and shapes, which is what CI uses (no downloads there).
"""

import sys

import torch
import torchvision
from safetensors.torch import save_file


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 1:
        sys.exit("usage: make_resnet18.py OUT.safetensors [--pretrained]")
    torch.manual_seed(0)
    weights = "IMAGENET1K_V1" if "--pretrained" in sys.argv else None
    model = torchvision.models.resnet18(weights=weights)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, args[0], {"format": "pt"})
    print(f"{args[0]}: {len(state)} tensors ({'ImageNet' if weights else 'random init'})")


if __name__ == "__main__":
    main()
