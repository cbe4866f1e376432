#!/usr/bin/env python3
"""Writes host/src/optim/pytorch_steps.json: several steps of torch.optim's SGD, Adam and AdamW
(each as PyTorch's for-loop, `foreach=True` and `fused=True` implementations) and of Lion (a
reference written after lucidrains' lion-pytorch; PyTorch has none) and Composer's decoupled SGD
(a reference after Composer's DecoupledSGDW), on several parameters split into parameter groups
with their own learning-rate multiplier and weight decay, with the learning rate changed between
steps, parameters left without a gradient in some steps (as stochastic depth does), parameters
that join late (no gradient in the first steps, as a layer unfrozen later: Adam's step count and
bias correction are per parameter, SGD's momentum buffer starts at the first gradient), and
masked steps (a step that amp's overflow check skips: torch.optim simply does not step).
host/src/optim/pytorch_steps.rs replays every case with both of Tessera's implementations and
compares.

Run with the torch wheel that scripts/ensure-libtorch.sh installed:

    PYTHONPATH=~/.cache/tessera/torch-2.13.0 python3 scripts/optim_goldens.py

Needs only torch (no numpy). Every number is a float32 value written as the shortest decimal
that reads back to the same double, so the file holds PyTorch's exact results.

The file: `cases`, each with `optimizer` (sgd, sgdw, adam, adamw, lion), base
`hyperparameters`, `params` (name, shape, initial values), `groups` (name, the parameter names
it holds, `lr_multiplier`, `weight_decay`; parameters in no group take the base
hyperparameters), the base learning rate `lr[i]` and the gradients `grads[i][j]` of step i and
parameter j (null: no gradient), `masked` (the 0-based steps that are masked: their parameters
are those of the step before; the replay gives them non-finite gradients, as an overflow does),
and `expected`: for each implementation (`for_loop`, `foreach`, `fused`, `reference`) the
parameters after each step, `[step][param]`.
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
VARIED = [0.1, 0.05, 0.2, 0.1, 0.01, 0.1]

# A small model's parameters: a matrix, its bias, a norm's scale and an embedding table.
PARAMS = [("fc.weight", [3, 4]), ("fc.bias", [3]), ("ln.weight", [4]), ("wte.weight", [5, 2])]
# GPT's rule (no decay for biases, norms and embeddings) with a learning-rate multiplier too.
GPT_GROUPS = [{"name": "no_decay", "params": ["fc.bias", "ln.weight", "wte.weight"],
               "lr_multiplier": 0.5, "weight_decay": 0.0}]
# Two groups and the default group.
TWO_GROUPS = [{"name": "head", "params": ["fc.weight"], "lr_multiplier": 2.0,
               "weight_decay": 0.3},
              {"name": "norms", "params": ["ln.weight"], "lr_multiplier": 0.1,
               "weight_decay": 0.0}]
# Steps (0-based) in which a parameter has no gradient.
NO_GRAD = {2: ["fc.bias"], 4: ["ln.weight", "wte.weight"]}
# Late joiners and missing gradients: `wte.weight` joins at step 2, `ln.weight` at step 3 (a
# masked step, so its first step taken is 4), `fc.bias` has no gradient in steps 2 and 4.
LATE = {0: ["wte.weight", "ln.weight"], 1: ["wte.weight", "ln.weight"],
        2: ["fc.bias", "ln.weight"], 4: ["fc.bias"]}
# Masked steps (0-based): the first one, before any state exists, and a later one.
MASKED = [0, 3]

CASES = [
    {"name": "adamw weight_decay=0.1, GPT groups", "optimizer": "adamw",
     "hyperparameters": {"betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.1},
     "lr": [0.01] * STEPS, "groups": GPT_GROUPS},
    {"name": "adamw betas=(0.8,0.99) eps=1e-6 weight_decay=0.5, two groups, lr varied",
     "optimizer": "adamw",
     "hyperparameters": {"betas": [0.8, 0.99], "eps": 1e-6, "weight_decay": 0.5},
     "lr": VARIED, "groups": TWO_GROUPS},
    {"name": "adamw one parameter group", "optimizer": "adamw",
     "hyperparameters": {"betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01},
     "lr": [0.01] * STEPS, "groups": []},
    {"name": "adam weight_decay=0.1 (L2), two groups, lr varied", "optimizer": "adam",
     "hyperparameters": {"betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.1},
     "lr": VARIED, "groups": TWO_GROUPS},
    {"name": "adam without decay, GPT groups", "optimizer": "adam",
     "hyperparameters": {"betas": [0.85, 0.95], "eps": 1e-7, "weight_decay": 0.0},
     "lr": [0.02] * STEPS, "groups": GPT_GROUPS},
    {"name": "sgd momentum=0.9 nesterov weight_decay=0.1, GPT groups", "optimizer": "sgd",
     "hyperparameters": {"momentum": 0.9, "dampening": 0.0, "nesterov": True,
                         "weight_decay": 0.1},
     "lr": [0.05] * STEPS, "groups": GPT_GROUPS},
    {"name": "sgd momentum=0.9 dampening=0.1 weight_decay=0.01, two groups, lr varied, "
             "missing gradients", "optimizer": "sgd",
     "hyperparameters": {"momentum": 0.9, "dampening": 0.1, "nesterov": False,
                         "weight_decay": 0.01},
     "lr": VARIED, "groups": TWO_GROUPS, "no_grad": NO_GRAD},
    {"name": "sgd without momentum, weight_decay=0.05", "optimizer": "sgd",
     "hyperparameters": {"momentum": 0.0, "dampening": 0.0, "nesterov": False,
                         "weight_decay": 0.05},
     "lr": [0.1] * STEPS, "groups": GPT_GROUPS},
    {"name": "sgd decoupled weight_decay=0.01 (Composer), two groups, lr varied",
     "optimizer": "sgdw",
     "hyperparameters": {"momentum": 0.9, "dampening": 0.0, "nesterov": False,
                         "weight_decay": 0.01},
     "lr": VARIED, "groups": TWO_GROUPS},
    {"name": "lion weight_decay=0.1, GPT groups", "optimizer": "lion",
     "hyperparameters": {"betas": [0.9, 0.99], "weight_decay": 0.1},
     "lr": [0.01] * STEPS, "groups": GPT_GROUPS},
    {"name": "lion betas=(0.95,0.98), two groups, lr varied, missing gradients",
     "optimizer": "lion",
     "hyperparameters": {"betas": [0.95, 0.98], "weight_decay": 0.5},
     "lr": VARIED, "groups": TWO_GROUPS, "no_grad": NO_GRAD},
    {"name": "adam weight_decay=0.1 (L2), two groups, lr varied, late joiners, missing "
             "gradients, masked steps", "optimizer": "adam",
     "hyperparameters": {"betas": [0.8, 0.99], "eps": 1e-8, "weight_decay": 0.1},
     "lr": VARIED, "groups": TWO_GROUPS, "no_grad": LATE, "masked": MASKED},
    {"name": "adamw weight_decay=0.1, GPT groups, late joiners, missing gradients, masked steps",
     "optimizer": "adamw",
     "hyperparameters": {"betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.1},
     "lr": [0.01] * STEPS, "groups": GPT_GROUPS, "no_grad": LATE, "masked": MASKED},
    {"name": "adamw one parameter group, late joiners, missing gradients", "optimizer": "adamw",
     "hyperparameters": {"betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01},
     "lr": [0.01] * STEPS, "groups": [], "no_grad": LATE},
    {"name": "sgd momentum=0.9 dampening=0.3, two groups, lr varied, late joiners, missing "
             "gradients, masked steps", "optimizer": "sgd",
     "hyperparameters": {"momentum": 0.9, "dampening": 0.3, "nesterov": False,
                         "weight_decay": 0.01},
     "lr": VARIED, "groups": TWO_GROUPS, "no_grad": LATE, "masked": MASKED},
    {"name": "lion, GPT groups, late joiners, missing gradients, masked steps",
     "optimizer": "lion",
     "hyperparameters": {"betas": [0.9, 0.99], "weight_decay": 0.2},
     "lr": [0.01] * STEPS, "groups": GPT_GROUPS, "no_grad": LATE, "masked": MASKED},
]


def floats(t):
    return [float(x) for x in t.detach().flatten().tolist()]


def torch_groups(case, params):
    """torch.optim param groups: the case's groups, then the default group."""
    by_name = dict(zip([n for n, _ in PARAMS], params))
    h, base = case["hyperparameters"], case["lr"][0]
    grouped = [n for g in case["groups"] for n in g["params"]]
    out = [{"params": [by_name[n] for n in g["params"]], "lr": base * g["lr_multiplier"],
            "weight_decay": g["weight_decay"], "lr_multiplier": g["lr_multiplier"]}
           for g in case["groups"]]
    rest = [p for n, p in by_name.items() if n not in grouped]
    if rest:
        out.append({"params": rest, "lr": base, "weight_decay": h["weight_decay"],
                    "lr_multiplier": 1.0})
    return out


def torch_optimizer(case, groups, impl):
    h = case["hyperparameters"]
    flags = {"for_loop": {"foreach": False}, "foreach": {"foreach": True},
             "fused": {"fused": True}}[impl]
    if case["optimizer"] in ("adam", "adamw"):
        cls = torch.optim.AdamW if case["optimizer"] == "adamw" else torch.optim.Adam
        return cls(groups, lr=case["lr"][0], betas=tuple(h["betas"]), eps=h["eps"],
                   weight_decay=h["weight_decay"], **flags)
    return torch.optim.SGD(groups, lr=case["lr"][0], momentum=h["momentum"],
                           dampening=h["dampening"], nesterov=h["nesterov"],
                           weight_decay=h["weight_decay"], **flags)


class Reference:
    """Lion (lucidrains' lion-pytorch) and Composer's DecoupledSGDW, one parameter at a time."""

    def __init__(self, case, groups):
        self.case, self.groups, self.state = case, groups, {}
        self.initial_lr = case["lr"][0]

    @torch.no_grad()
    def step(self):
        h = self.case["hyperparameters"]
        for group in self.groups:
            lr, wd = group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                if self.case["optimizer"] == "lion":
                    b1, b2 = h["betas"]
                    m = self.state.setdefault(id(p), torch.zeros_like(p))
                    update = m.clone().mul_(b1).add(g, alpha=1 - b1).sign_()
                    p.mul_(1 - lr * wd)
                    p.add_(update, alpha=-lr)
                    m.mul_(b2).add_(g, alpha=1 - b2)
                else:
                    d_p = g
                    if h["momentum"] != 0:
                        buf = self.state.get(id(p))
                        if buf is None:
                            buf = self.state[id(p)] = torch.clone(d_p).detach()
                        else:
                            buf.mul_(h["momentum"]).add_(d_p, alpha=1 - h["dampening"])
                        d_p = d_p.add(buf, alpha=h["momentum"]) if h["nesterov"] else buf
                    if wd != 0:
                        # Composer: decay_factor = lr / initial_lr, both the group's.
                        initial = self.initial_lr * group["lr_multiplier"]
                        p.mul_(1 - (lr / initial) * wd)
                    p.add_(d_p, alpha=-lr)


def run(case, initial, grads, impl):
    params = [t.clone().requires_grad_(True) for t in initial]
    groups = torch_groups(case, params)
    opt = Reference(case, groups) if impl == "reference" else torch_optimizer(case, groups, impl)
    groups = groups if impl == "reference" else opt.param_groups
    out = []
    for i, (lr, step_grads) in enumerate(zip(case["lr"], grads)):
        for group in groups:
            group["lr"] = lr * group["lr_multiplier"]
        for p, g in zip(params, step_grads):
            p.grad = None if g is None else g.clone()
        if i not in case.get("masked", []):
            opt.step()
        out.append([floats(p) for p in params])
    return out


def main():
    torch.manual_seed(0)
    initial = [torch.randn(shape) for _, shape in PARAMS]
    all_grads = [[torch.randn(shape) for _, shape in PARAMS] for _ in range(STEPS)]
    cases = []
    for case in CASES:
        grads = [[None if n in case.get("no_grad", {}).get(i, []) else g
                  for (n, _), g in zip(PARAMS, step)] for i, step in enumerate(all_grads)]
        if case["optimizer"] in ("lion", "sgdw"):
            impls = ["reference"]
        else:
            impls = ["for_loop", "foreach", "fused"]
        expected = {impl: run(case, initial, grads, impl) for impl in impls}
        out = {k: v for k, v in case.items() if k != "no_grad"}
        out["masked"] = case.get("masked", [])
        out["params"] = [{"name": n, "shape": s, "initial": floats(t)}
                         for (n, s), t in zip(PARAMS, initial)]
        out["grads"] = [[None if g is None else floats(g) for g in step] for step in grads]
        out["expected"] = expected
        cases.append(out)
    doc = {
        "generator": "scripts/optim_goldens.py",
        "torch_version": torch.__version__,
        "description": "torch.optim (and references for Lion and Composer's decoupled SGD) on "
                       "float32 parameters in parameter groups; see the generator's docstring.",
        "cases": cases,
    }
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.normpath(OUT)} ({len(cases)} cases, {STEPS} steps each)")


if __name__ == "__main__":
    main()
