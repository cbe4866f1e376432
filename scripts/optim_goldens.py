#!/usr/bin/env python3
"""Writes host/src/optim/pytorch_steps.json: several steps of torch.optim.AdamW and torch.optim.SGD
(momentum, dampening, Nesterov, weight decay, a learning rate changed between steps), which
host/src/optim/pytorch_steps.rs replays with Tessera's optimizers and compares.

Run with the torch wheel that scripts/ensure-libtorch.sh installed:

    PYTHONPATH=~/.cache/tessera/torch-2.13.0 python3 scripts/optim_goldens.py

Needs only torch (no numpy). Every number is a float32 value written as the shortest decimal
that reads back to the same double, so the file holds PyTorch's exact results.
"""

import json
import os
import warnings

with warnings.catch_warnings():
    # The torch wheel warns at import when NumPy is missing; it is not needed here.
    warnings.simplefilter("ignore")
    import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "host", "src", "optim",
                   "pytorch_steps.json")
STEPS = 6
SIZE = 7

CASES = [
    {
        "name": "adamw weight_decay=0.1",
        "optimizer": "adamw",
        "hyperparameters": {"betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.1},
        "lr": [0.01] * STEPS,
    },
    {
        "name": "adamw betas=(0.8,0.99) eps=1e-6 weight_decay=0.5, lr changed every step",
        "optimizer": "adamw",
        "hyperparameters": {"betas": [0.8, 0.99], "eps": 1e-6, "weight_decay": 0.5},
        "lr": [0.1, 0.05, 0.2, 0.1, 0.01, 0.1],
    },
    {
        "name": "sgd momentum=0.9 nesterov weight_decay=0.1",
        "optimizer": "sgd",
        "hyperparameters": {"momentum": 0.9, "dampening": 0.0, "nesterov": True,
                            "weight_decay": 0.1},
        "lr": [0.05] * STEPS,
    },
    {
        "name": "sgd momentum=0.9 dampening=0.1 weight_decay=0.01, lr changed every step",
        "optimizer": "sgd",
        "hyperparameters": {"momentum": 0.9, "dampening": 0.1, "nesterov": False,
                            "weight_decay": 0.01},
        "lr": [0.1, 0.05, 0.2, 0.1, 0.01, 0.1],
    },
    {
        "name": "sgd without momentum, weight_decay=0.05",
        "optimizer": "sgd",
        "hyperparameters": {"momentum": 0.0, "dampening": 0.0, "nesterov": False,
                            "weight_decay": 0.05},
        "lr": [0.1] * STEPS,
    },
]


def floats(t):
    return [float(x) for x in t.detach().flatten().tolist()]


def run(case, initial, grads):
    p = initial.clone().requires_grad_(True)
    h = case["hyperparameters"]
    if case["optimizer"] == "adamw":
        opt = torch.optim.AdamW([p], lr=case["lr"][0], betas=tuple(h["betas"]), eps=h["eps"],
                                weight_decay=h["weight_decay"])
    else:
        opt = torch.optim.SGD([p], lr=case["lr"][0], momentum=h["momentum"],
                              dampening=h["dampening"], nesterov=h["nesterov"],
                              weight_decay=h["weight_decay"])
    params = []
    for lr, g in zip(case["lr"], grads):
        for group in opt.param_groups:
            group["lr"] = lr
        p.grad = g.clone()
        opt.step()
        params.append(floats(p))
    return params


def main():
    torch.manual_seed(0)
    initial = torch.randn(SIZE)
    grads = torch.randn(STEPS, SIZE)
    cases = []
    for case in CASES:
        cases.append(dict(case, params=run(case, initial, grads)))
    doc = {
        "generator": "scripts/optim_goldens.py",
        "torch_version": torch.__version__,
        "description": "torch.optim on one float32 parameter: `initial` values, the gradient "
                       "`grads[i]` and learning rate `lr[i]` of step i, and the parameter "
                       "after each step in `params[i]`.",
        "initial": floats(initial),
        "grads": [floats(g) for g in grads],
        "cases": cases,
    }
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.normpath(OUT)} ({len(cases)} cases, {STEPS} steps each)")


if __name__ == "__main__":
    main()
