#!/usr/bin/env python3
"""Reference outputs, in float64 PyTorch, for the GPT-2 architecture plugins (rotary, qk_norm,
relu_squared, logit_softcap; zero_init_projections changes only initial values).

    python3 tests/support/gpt_reference.py MODE SPEC_JSON CASE.safetensors OUT.safetensors

MODE is one of
- `attention`: CASE holds `c_attn.weight`, `c_attn.bias`, `c_proj.weight`, `c_proj.bias` and
  inputs `x.0`, `x.1`, ... `(B, T, C)`; OUT gets `y.0`, `y.1`, ...: GPT-2's causal
  self-attention with the spec's features;
- `mlp`: CASE holds `c_fc.*`, `c_proj.*` and `x.i`; OUT gets `y.i` (`spec.relu_squared`);
- `head`: CASE holds `weight` `(V, C)` and `x.i`; OUT gets `y.i` = `cap * tanh(x Wᵀ / cap)`
  (`spec.cap`; no cap when null);
- `model`: CASE holds every tensor of the GPT-2 under Hugging Face's names and `ids` `(B, T)`;
  OUT gets `logits`.

SPEC_JSON: `{"n_head": H, "rotary": {"base": b, "dims": d} or null, "qk_norm": bool,
"relu_squared": bool, "cap": c or null, "n_layer": L, "tied": bool, "eps": 1e-5}`.

Written independently of the plugins, from the papers' and the reference code's formulas:
- attention is explicit: `softmax(q kᵀ / √D + causal −inf mask) v`, no fused kernel;
- rotary positions are Hugging Face's GPT-NeoX `apply_rotary_pos_emb` (`q·cos + rotate_half(q)·sin`
  on the first `dims` features, the rest passed through) when `transformers` imports, else the
  same formula copied here; the frequencies `base^(−2i/dims)` as Hugging Face's default rope;
- QK-norm is `F.rms_norm(x, (D,))` and is applied *after* the rotation (modded-nanogpt's
  2024-10-14 record; the plugins normalise first: the two commute, a rotation keeps the RMS);
- the squared ReLU is `F.relu(x).square()`; the cap is `cap * tanh(logits / cap)`.

It also checks one fact the method card states: modded-nanogpt's `apply_rotary_emb`
(`y1 = x1 cos + x2 sin`, `y2 = −x1 sin + x2 cos`) is this rotation at position −m.

Exits 0 and prints which rotary implementation ran, 1 when the self-check fails.
"""

import json
import os
import struct
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import pytorch_models  # noqa: E402  (read_safetensors only)

try:
    from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb

    ROTARY_SOURCE = "transformers.models.gpt_neox.apply_rotary_pos_emb"
except Exception:  # noqa: BLE001 - any import failure falls back to the copy below

    def _rotate_half(x):
        x1 = x[..., : x.shape[-1] // 2]
        x2 = x[..., x.shape[-1] // 2 :]
        return torch.cat((-x2, x1), dim=-1)

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        d = cos.shape[-1]
        q_rot, q_pass = q[..., :d], q[..., d:]
        k_rot, k_pass = k[..., :d], k[..., d:]
        q = torch.cat([q_rot * cos + _rotate_half(q_rot) * sin, q_pass], dim=-1)
        k = torch.cat([k_rot * cos + _rotate_half(k_rot) * sin, k_pass], dim=-1)
        return q, k

    ROTARY_SOURCE = "a copy of GPT-NeoX's apply_rotary_pos_emb (transformers does not import)"


def write_safetensors(path, tensors):
    """A safetensors file of float64/float32/int64 CPU tensors, written by hand."""
    names = {torch.float64: "F64", torch.float32: "F32", torch.int64: "I64"}
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        data = t.numpy().tobytes() if hasattr(t, "numpy") and _numpy() else _bytes(t)
        header[name] = {
            "dtype": names[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header).encode("utf-8")
    raw += b" " * ((8 - len(raw) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(b)


def _numpy():
    try:
        import numpy  # noqa: F401

        return True
    except ImportError:
        return False


def _bytes(t):
    """The raw little-endian bytes of a contiguous CPU tensor, without NumPy."""
    flat = t.reshape(-1)
    if flat.numel() == 0:
        return b""
    as_bytes = flat.view(torch.uint8)
    return bytes(as_bytes.tolist())


def rotary_cos_sin(t, dims, base):
    """Hugging Face's default rope: `inv_freq = 1 / base^(arange(0, dims, 2) / dims)`,
    `emb = cat(freqs, freqs)`, in float64; `(t, dims)` each."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dims, 2, dtype=torch.int64).double() / dims))
    freqs = torch.outer(torch.arange(t, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def modded_nanogpt_rotary(x, cos_half, sin_half):
    """modded-nanogpt's `apply_rotary_emb` (records/2024-10-14_ModernArch), on `(B, T, H, D)`
    with `cos`, `sin` `(T, D/2)`."""
    d = x.shape[3] // 2
    x1, x2 = x[..., :d], x[..., d:]
    cos, sin = cos_half[None, :, None, :], sin_half[None, :, None, :]
    y1 = x1 * cos + x2 * sin
    y2 = x1 * (-sin) + x2 * cos
    return torch.cat([y1, y2], 3)


def self_check():
    """modded-nanogpt's rotation is GPT-NeoX's at negated positions (sin → −sin)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 9, 3, 8, dtype=torch.float64, generator=g)
    cos, sin = rotary_cos_sin(9, 8, 10000.0)
    ours, _ = apply_rotary_pos_emb(x.transpose(1, 2), x.transpose(1, 2), cos[None], -sin[None])
    theirs = modded_nanogpt_rotary(x, cos[:, :4], sin[:, :4]).transpose(1, 2)
    diff = (ours - theirs).abs().max().item()
    if diff > 1e-12:
        print(f"FAIL: modded-nanogpt's rotary is not GPT-NeoX's at −m: {diff:e}")
        return False
    return True


def conv1d(x, w, b):
    return x @ w + b


def attention(x, p, spec, prefix=""):
    """Causal self-attention of GPT-2 with the spec's features, explicit, float64."""
    b, t, c = x.shape
    h = int(spec["n_head"])
    d = c // h
    qkv = conv1d(x, p[prefix + "c_attn.weight"], p[prefix + "c_attn.bias"])
    q, k, v = qkv.split(c, dim=2)
    q, k, v = (z.view(b, t, h, d).transpose(1, 2) for z in (q, k, v))
    rotary = spec.get("rotary")
    if rotary:
        cos, sin = rotary_cos_sin(t, int(rotary["dims"]), float(rotary["base"]))
        q, k = apply_rotary_pos_emb(q, k, cos.unsqueeze(0), sin.unsqueeze(0))
    if spec.get("qk_norm"):
        q, k = F.rms_norm(q, (d,)), F.rms_norm(k, (d,))
    scores = q @ k.transpose(-1, -2) / (d**0.5)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    y = scores.softmax(dim=-1) @ v
    y = y.transpose(1, 2).reshape(b, t, c)
    return conv1d(y, p[prefix + "c_proj.weight"], p[prefix + "c_proj.bias"])


def mlp(x, p, spec, prefix=""):
    h = conv1d(x, p[prefix + "c_fc.weight"], p[prefix + "c_fc.bias"])
    h = F.relu(h).square() if spec.get("relu_squared") else F.gelu(h, approximate="tanh")
    return conv1d(h, p[prefix + "c_proj.weight"], p[prefix + "c_proj.bias"])


def softcap(logits, spec):
    cap = spec.get("cap")
    return logits if cap is None else cap * torch.tanh(logits / cap)


def model(ids, p, spec):
    """Hugging Face's GPT2LMHeadModel (eval) with the spec's changes; rotary positions replace
    the learned ones (the position table must be all zeros then)."""
    eps = float(spec.get("eps", 1e-5))
    c = p["transformer.wte.weight"].shape[1]
    t = ids.shape[1]
    x = p["transformer.wte.weight"][ids]
    wpe = p["transformer.wpe.weight"]
    if spec.get("rotary"):
        assert wpe.abs().max().item() == 0.0, "rotary: the position table is not zero"
    x = x + wpe[:t].unsqueeze(0)
    for i in range(int(spec["n_layer"])):
        pre = f"transformer.h.{i}."
        ln = lambda z, name: F.layer_norm(z, (c,), p[pre + name + ".weight"], p[pre + name + ".bias"], eps)  # noqa: E731
        x = x + attention(ln(x, "ln_1"), p, spec, pre + "attn.")
        x = x + mlp(ln(x, "ln_2"), p, spec, pre + "mlp.")
    x = F.layer_norm(x, (c,), p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], eps)
    head = p["transformer.wte.weight"] if spec.get("tied", True) else p["lm_head.weight"]
    return softcap(x @ head.T, spec)


def main(argv):
    if len(argv) != 5:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    mode, spec, case, out = argv[1], json.loads(argv[2]), argv[3], argv[4]
    if not self_check():
        return 1
    tensors, _ = pytorch_models.read_safetensors(case)
    p = {k: (v.double() if v.is_floating_point() else v) for k, v in tensors.items()}
    result = {}
    with torch.no_grad():
        if mode == "model":
            result["logits"] = model(p["ids"], p, spec)
        else:
            inputs = sorted((k for k in p if k.startswith("x.")), key=lambda k: int(k[2:]))
            for name in inputs:
                x = p[name]
                if mode == "attention":
                    y = attention(x, p, spec)
                elif mode == "mlp":
                    y = mlp(x, p, spec)
                elif mode == "head":
                    y = softcap(x @ p["weight"].T, spec)
                else:
                    print(f"unknown mode {mode!r}", file=sys.stderr)
                    return 2
                result["y." + name[2:]] = y
    write_safetensors(out, result)
    print(f"{mode}: {len(result)} outputs; rotary from {ROTARY_SOURCE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
