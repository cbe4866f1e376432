#!/usr/bin/env python3
"""PyTorch references for the lookahead plugin (`tests/reference.rs` runs this script).

Plain SGD (`p -= lr * grad`, written out) on a tiny model, Linear(4, 6) -> BatchNorm1d(6) -> Tanh ->
Linear(6, 3) with a mean-squared-error loss, a new seeded batch of 8 every step, and on top:

* `lookahead*` cases: Lookahead (Zhang, Lucas, Hinton, Ba 2019, Algorithm 1) written out: slow
  weights phi copied from the weights before the first step; after every k-th optimizer step
  `phi.lerp_(theta, alpha); theta.copy_(phi)`; at the last step T the slow weights go into the
  model (the paper returns phi). Frozen parameters (requires_grad False) are not touched.
* `airbench` case: KellerJordan/cifar10-airbench `legacy/airbench94.py`'s `LookaheadState` and
  training-loop lines copied verbatim: an EMA of the whole state_dict (float32/float16 entries only)
  written back into the weights every 5 steps with decay `0.95**5 * (t / T)**3`, and a final
  `update(model, decay=1.0)` at step T.

Usage: python reference.py OUT_DIR. For each case it writes OUT_DIR/<case>.safetensors:
`init/<name>` (the state_dict before the first step), `pre/<t>/<name>` (after optimizer step t,
before the method) and `post/<t>/<name>` (after the method at step t), plus `input/<t>` and
`target/<t>`; and OUT_DIR/<case>.json: the plugin settings that reproduce the case, the learning
rate, T, and for each state_dict entry whether it is a buffer and whether it is trainable.

Only torch is needed (no numpy, no safetensors package): the files are written by hand.
"""

import json
import struct
import sys
from pathlib import Path

import torch
from torch import nn

torch.set_num_threads(1)

DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.float16: "F16",
          torch.bfloat16: "BF16", torch.int64: "I64"}


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        data = bytes(t.reshape(-1).view(torch.uint8).tolist())
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def make_model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 3))


def batches(seed, steps):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 4, generator=g), torch.randn(8, 3, generator=g)) for _ in range(steps)]


def sgd_step(model, x, y, lr):
    """One step of plain SGD, written out (the Rust test replays the same operations)."""
    model.train()
    out = model(x)
    loss = (out - y).pow(2).mean()
    for p in model.parameters():
        p.grad = None
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.sub_(p.grad * lr)


def snapshot(model, prefix, into):
    for name, t in model.state_dict().items():
        into[f"{prefix}/{name}"] = t.detach().clone()


def describe(model):
    buffers = {n for n, _ in model.named_buffers()}
    params = dict(model.named_parameters())
    return {name: {"buffer": name in buffers,
                   "trainable": name in params and params[name].requires_grad}
            for name in model.state_dict()}


def lookahead_case(k, alpha, buffers, steps, lr, frozen):
    model = make_model(1)
    for name, p in model.named_parameters():
        if name in frozen:
            p.requires_grad_(False)
    data = batches(2, steps)
    tensors = {}
    snapshot(model, "init", tensors)

    def tracked():
        out = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if buffers:
            out += [(n, b) for n, b in model.named_buffers() if b.is_floating_point()]
        return out

    # Slow weights: a copy of the weights before the first step.
    slow = {n: t.detach().clone() for n, t in tracked()}
    for t, (x, y) in enumerate(data, start=1):
        tensors[f"input/{t}"], tensors[f"target/{t}"] = x, y
        sgd_step(model, x, y, lr)
        snapshot(model, f"pre/{t}", tensors)
        with torch.no_grad():
            if t % k == 0:
                for n, fast in tracked():
                    slow[n].lerp_(fast, alpha)  # phi <- phi + alpha (theta - phi)
                    fast.copy_(slow[n])         # theta <- phi
            if t == steps:
                for n, fast in tracked():
                    fast.copy_(slow[n])         # the paper returns phi
        snapshot(model, f"post/{t}", tensors)
    settings = {"variant": "lookahead", "k": k, "alpha": alpha, "buffers": buffers,
                "total_steps": steps}
    return tensors, settings, describe(model)


# ---- KellerJordan/cifar10-airbench legacy/airbench94.py, verbatim ----
class LookaheadState:
    def __init__(self, net):
        self.net_ema = {k: v.clone() for k, v in net.state_dict().items()}

    def update(self, net, decay):
        for ema_param, net_param in zip(self.net_ema.values(), net.state_dict().values()):
            if net_param.dtype in (torch.half, torch.float):
                ema_param.lerp_(net_param, 1-decay)
                net_param.copy_(ema_param)
# ---- end of airbench's code ----


def airbench_case(total_train_steps, lr):
    model = make_model(3)
    data = batches(4, total_train_steps)
    tensors = {}
    snapshot(model, "init", tensors)
    # airbench94.py's lines, with its optimizer step replaced by the plain SGD step.
    alpha_schedule = 0.95**5 * (torch.arange(total_train_steps+1) / total_train_steps)**3
    lookahead_state = LookaheadState(model)
    current_steps = 0
    for x, y in data:
        tensors[f"input/{current_steps + 1}"], tensors[f"target/{current_steps + 1}"] = x, y
        sgd_step(model, x, y, lr)
        current_steps += 1
        snapshot(model, f"pre/{current_steps}", tensors)
        if current_steps % 5 == 0:
            lookahead_state.update(model, decay=alpha_schedule[current_steps].item())
        if current_steps >= total_train_steps:
            if lookahead_state is not None:
                lookahead_state.update(model, decay=1.0)
        snapshot(model, f"post/{current_steps}", tensors)
        if current_steps >= total_train_steps:
            break
    tensors["decays"] = alpha_schedule.clone()
    settings = {"variant": "ema", "k": 5, "decay_base": 0.95, "decay_power": 3.0,
                "total_steps": total_train_steps}
    return tensors, settings, describe(model)


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    lr = 0.2
    cases = {
        # alpha >= 0.5 and < 0.5 take torch.lerp's two formulas; T = 10 is not a multiple of
        # k = 3, so the final copy puts the step-9 slow weights back.
        "lookahead": lookahead_case(3, 0.5, False, 10, lr, frozen={"0.bias"}),
        "lookahead_buffers": lookahead_case(2, 0.3, True, 7, lr, frozen=set()),
        # T = 13: updates at 5 and 10, the final copy at 13 drops steps 11-13.
        "airbench": airbench_case(13, lr),
    }
    for case, (tensors, settings, entries) in cases.items():
        write_safetensors(out / f"{case}.safetensors", tensors)
        steps = settings["total_steps"]
        meta = {"case": case, "settings": settings, "lr": lr, "steps": steps,
                "entries": entries, "torch": torch.__version__}
        (out / f"{case}.json").write_text(json.dumps(meta, indent=1))
    print(f"wrote {len(cases)} cases to {out}")


if __name__ == "__main__":
    main()
