#!/usr/bin/env python3
"""Converts a pickled PyTorch state_dict (`torch.save(model.state_dict(), "model.pt")`, a
Hugging Face `pytorch_model.bin`, a torchvision or timm `.pth`) to a safetensors file that
`[model] init_weights` reads, keeping the names:

    python3 scripts/to_safetensors.py model.pt model.safetensors

It needs `torch` and `safetensors` (`pip install torch safetensors`). The file is unpickled with
`torch.load(..., weights_only=True)`, which refuses anything but tensors and plain containers.
A dict that holds the state_dict under `state_dict`, `model` or `model_state_dict` (a training
checkpoint) is unwrapped; a `module.` prefix (DataParallel) is removed. Tensors shared under two
names (tied weights) are written under each. The one-line equivalent, for a plain state_dict:

    python3 -c "import sys,torch,safetensors.torch as s; s.save_file({k: v.contiguous().clone() for k, v in torch.load(sys.argv[1], map_location='cpu', weights_only=True).items()}, sys.argv[2], {'format': 'pt'})" model.pt model.safetensors
"""

import sys

import torch
from safetensors.torch import save_file


def state_dict_of(obj, path):
    for key in ("state_dict", "model_state_dict", "model"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict):
        sys.exit(f"{path}: holds a {type(obj).__name__}, not a state_dict (a dict of tensors)")
    tensors = {}
    for name, value in obj.items():
        if not isinstance(value, torch.Tensor):
            sys.exit(f"{path}: `{name}` is a {type(value).__name__}, not a tensor")
        if name.startswith("module."):
            name = name[len("module."):]
        tensors[name] = value.detach().contiguous().clone()
    return tensors


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: to_safetensors.py MODEL.pt OUT.safetensors")
    src, dst = sys.argv[1], sys.argv[2]
    obj = torch.load(src, map_location="cpu", weights_only=True)
    tensors = state_dict_of(obj, src)
    save_file(tensors, dst, metadata={"format": "pt"})
    print(f"{dst}: {len(tensors)} tensors")


if __name__ == "__main__":
    main()
