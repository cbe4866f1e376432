"""Reference Muon steps for tests/methods/muon.rs.

    python3 scripts/muon_reference.py OUT.safetensors CASES_JSON

CASES_JSON is a JSON list of cases, each `{"variant": "torch"|"keller", "lr": .., "weight_decay":
.., "momentum": .., "nesterov": .., "ns_steps": .., "adjust_lr": null|"original"|
"match_rms_adamw", "lr_factors": [..]}` (one step per factor, at rate `lr * factor`).

Writes, as float32: `init/<name>` the starting parameters and `grad/<t>/<name>` the gradient of
step t (the same for every case, from a fixed seed), and for case c after step t:
`c<c>/bf16/<t>/<name>` the parameters as the reference computes them (Newton–Schulz in bfloat16,
as published) and `c<c>/fp32/<t>/<name>` the same with Newton–Schulz in float32, which measures
how far bfloat16 rounding alone moves the result.

- `torch`: `torch.optim.Muon` of the installed wheel itself. It takes 2-D parameters only, so the
  conv filter is stepped as its `(out, in*kh*kw)` flattening (the shape Tessera's Muon uses).
- `keller`: written here from KellerJordan/Muon `muon.py` (`zeropower_via_newtonschulz5`,
  `muon_update`, `SingleDeviceMuon.step`), with the conv filter flattened before the
  `sqrt(max(1, rows/cols))` scale (see plugins/muon/README.md).
"""

import json
import struct
import sys

import torch

SHAPES = {
    "tall": (12, 5),
    "wide": (5, 12),
    "square_a": (8, 8),
    "square_b": (8, 8),
    "conv": (6, 3, 3, 3),
    "conv_tall": (16, 1, 3, 3),
}
STEPS_SEED = 1234
NS = (3.4445, -4.7750, 2.0315)


def write_safetensors(path, tensors):
    header = {}
    offset = 0
    blobs = []
    for name, t in tensors.items():
        data = t.detach().to(torch.float32).contiguous().cpu().flatten()
        raw = struct.pack(f"<{data.numel()}f", *data.tolist())
        header[name] = {
            "dtype": "F32",
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        offset += len(raw)
        blobs.append(raw)
    text = json.dumps(header).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def keller_ns(g, steps, dtype):
    """`zeropower_via_newtonschulz5` of KellerJordan/Muon, in `dtype`."""
    a, b, c = NS
    x = g.to(dtype)
    if g.size(-2) > g.size(-1):
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        A = x @ x.mT
        B = b * A + c * A @ A
        x = a * x + B @ x
    if g.size(-2) > g.size(-1):
        x = x.mT
    return x


def keller_steps(case, init, grads, dtype):
    params = {n: p.clone() for n, p in init.items()}
    bufs = {n: torch.zeros_like(p) for n, p in init.items()}
    out = []
    beta = case["momentum"]
    for t, factor in enumerate(case["lr_factors"]):
        lr = case["lr"] * factor
        for n, p in params.items():
            g = grads[t][n].clone()
            bufs[n].lerp_(g, 1 - beta)
            u = g.lerp_(bufs[n], beta) if case["nesterov"] else bufs[n]
            u = u.reshape(len(u), -1)
            u = keller_ns(u, case["ns_steps"], dtype)
            u *= max(1, u.size(-2) / u.size(-1)) ** 0.5
            p.mul_(1 - lr * case["weight_decay"])
            p.add_(u.reshape(p.shape), alpha=-lr)
        out.append({n: p.clone() for n, p in params.items()})
    return out


def torch_steps(case, init, grads, dtype):
    import torch.optim._muon as muon_module

    original = muon_module._zeropower_via_newtonschulz
    if dtype == torch.float32:
        # The same iteration (same operations) on float32 instead of bfloat16.
        def fp32_ns(grad, coefficients, steps, eps):
            a, b, c = coefficients
            x = grad.float()
            if grad.size(0) > grad.size(1):
                x = x.T
            x = x / x.norm().clamp(min=eps)
            for _ in range(steps):
                gram = x @ x.T
                gram_update = torch.addmm(gram, gram, gram, beta=b, alpha=c)
                x = torch.addmm(x, gram_update, x, beta=a)
            if grad.size(0) > grad.size(1):
                x = x.T
            return x

        muon_module._zeropower_via_newtonschulz = fp32_ns
    try:
        params = {
            n: torch.nn.Parameter(p.clone().reshape(len(p), -1)) for n, p in init.items()
        }
        opt = torch.optim.Muon(
            list(params.values()),
            lr=case["lr"],
            weight_decay=case["weight_decay"],
            momentum=case["momentum"],
            nesterov=case["nesterov"],
            ns_steps=case["ns_steps"],
            adjust_lr_fn=case["adjust_lr"],
        )
        out = []
        for t, factor in enumerate(case["lr_factors"]):
            for group in opt.param_groups:
                group["lr"] = case["lr"] * factor
            for n, p in params.items():
                p.grad = grads[t][n].clone().reshape(len(p), -1)
            opt.step()
            out.append({n: p.detach().clone().reshape(init[n].shape) for n, p in params.items()})
        return out
    finally:
        muon_module._zeropower_via_newtonschulz = original


def main():
    path, cases_json = sys.argv[1], sys.argv[2]
    cases = json.loads(cases_json)
    steps = max(len(c["lr_factors"]) for c in cases)
    gen = torch.Generator().manual_seed(STEPS_SEED)
    init = {n: torch.randn(s, generator=gen) * 0.1 for n, s in SHAPES.items()}
    grads = [
        {n: torch.randn(s, generator=gen) * (0.5 + t) for n, s in SHAPES.items()}
        for t in range(steps)
    ]
    tensors = {f"init/{n}": p for n, p in init.items()}
    for t, g in enumerate(grads):
        tensors.update({f"grad/{t}/{n}": v for n, v in g.items()})
    for c, case in enumerate(cases):
        run = torch_steps if case["variant"] == "torch" else keller_steps
        for tag, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
            for t, params in enumerate(run(case, init, grads, dtype)):
                tensors.update({f"c{c}/{tag}/{t}/{n}": p for n, p in params.items()})
    write_safetensors(path, tensors)
    print(f"wrote {len(tensors)} tensors with torch {torch.__version__}")


if __name__ == "__main__":
    main()
