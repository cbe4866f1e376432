#!/usr/bin/env python3
"""timm's VisionTransformer beside Tessera's ViT, for tests/models/vit.rs.

    python3 tests/support/vit_reference.py make SPEC_JSON OUT_DIR
    python3 tests/support/vit_reference.py check SPEC_JSON EXPORT.safetensors IO.safetensors

SPEC_JSON: `{"model": "vit_tiny_patch16_224", "img_size": 32, "classes": 10, "channels": 3,
"embed_dim": ..., "depth": ..., "num_heads": ..., "patch_size": ...}` (the last four optional:
timm's defaults for the model otherwise).

- `make` builds the model with timm (random weights, seeded; nothing downloaded), writes its
  `state_dict` (`weights.safetensors`), an input `x` (2, C, S, S) and its eval-mode `logits`
  (`io.safetensors`) into OUT_DIR.
- `check` loads a Tessera export strictly into the timm model of SPEC (`load_state_dict(strict=
  True)`: every name and shape must be timm's) and compares its eval-mode logits on IO's `x`
  with IO's `logits` (Tessera's); prints the largest difference, exits 1 above 1e-4.
"""

import json
import sys

import timm
import torch
from safetensors.torch import load_file, save_file


def build(spec):
    kwargs = {
        "pretrained": False,
        "num_classes": spec["classes"],
        "img_size": spec["img_size"],
        "in_chans": spec.get("channels", 3),
    }
    for key in ("embed_dim", "depth", "num_heads", "patch_size"):
        if key in spec:
            kwargs[key] = spec[key]
    return timm.create_model(spec["model"], **kwargs)


def main():
    mode, spec = sys.argv[1], json.loads(sys.argv[2])
    if mode == "make":
        out = sys.argv[3]
        torch.manual_seed(3)
        model = build(spec).eval()
        # Non-trivial norms, so that a misplaced layer norm shows in the logits.
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.add_(torch.randn_like(p) * 0.1)
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        save_file(state, f"{out}/weights.safetensors", {"format": "pt"})
        c, s = spec.get("channels", 3), spec["img_size"]
        x = torch.randn(2, c, s, s, generator=torch.Generator().manual_seed(4))
        with torch.no_grad():
            logits = model(x)
        save_file({"x": x, "logits": logits.contiguous()}, f"{out}/io.safetensors")
        print(json.dumps({"tensors": len(state), "parameters": sum(p.numel() for p in model.parameters())}))
    elif mode == "check":
        model = build(spec).eval()
        weights = load_file(sys.argv[3])
        model.load_state_dict(weights, strict=True)
        io = load_file(sys.argv[4])
        with torch.no_grad():
            logits = model(io["x"])
        diff = (logits - io["logits"]).abs().max().item()
        print(f"timm {spec['model']} with the export: max abs logits difference {diff:.3e}")
        sys.exit(0 if diff < 1e-4 else 1)
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
