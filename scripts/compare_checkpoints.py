"""Compares two Tessera checkpoints tensor by tensor: whether they are bit-for-bit equal and,
where not, the largest absolute difference per part (`model/`, `optim/`, `method/…`). Used by
scripts/gpu-check.sh to measure resume exactness on CUDA; needs only torch.

    python3 scripts/compare_checkpoints.py A.ckpt B.ckpt

Prints one JSON object: {"identical": bool, "tensors": n, "differing": n,
"max_abs_diff": {part: value}}; exits 0 either way (2 when the files cannot be compared).
"""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pytorch_models import read_safetensors  # noqa: E402


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    try:
        a, _ = read_safetensors(sys.argv[1])
        b, _ = read_safetensors(sys.argv[2])
    except (OSError, ValueError) as e:
        print(f"cannot compare: {e}", file=sys.stderr)
        sys.exit(2)
    if sorted(a) != sorted(b):
        only = sorted(set(a) ^ set(b))
        print(f"the checkpoints hold different tensors: {only[:5]}", file=sys.stderr)
        sys.exit(2)
    differing, worst = 0, {}
    for name in sorted(a):
        x, y = a[name], b[name]
        if x.shape != y.shape or x.dtype != y.dtype:
            print(f"{name}: {x.shape}/{x.dtype} vs {y.shape}/{y.dtype}", file=sys.stderr)
            sys.exit(2)
        if torch.equal(x, y):
            continue
        differing += 1
        part = name.split("/", 1)[0]
        diff = (x.double() - y.double()).abs().max().item()
        worst[part] = max(worst.get(part, 0.0), diff)
    print(
        json.dumps(
            {
                "identical": differing == 0,
                "tensors": len(a),
                "differing": differing,
                "max_abs_diff": worst,
            }
        )
    )


if __name__ == "__main__":
    main()
