#!/usr/bin/env python3
"""Checks a file written by `tessera export` against PyTorch.

    python3 scripts/check_export.py EXPORTED.safetensors CASE.safetensors

EXPORTED is loaded into the matching model of scripts/pytorch_models.py with
`load_state_dict(strict=True)` (names and shapes must match exactly; dtypes are checked too).
CASE is a safetensors file holding `input` and `output`: a batch and Tessera's eval-mode output
for it (for gpt2: int64 token ids `(B, T)` and the logits; a Hugging Face model's `.logits`
are compared). The model is run in eval mode on `input` and compared with `output`: the largest
absolute difference must be at most 1e-4 times the output's scale (its largest absolute value,
at least 1). The case must also be well-conditioned: the same model run in float64 must be
within a quarter of that limit of its float32 output, or rounding alone could decide the check.

Prints the difference (`max_abs_diff=...`) and exits 0 when the check passes, 1 when it fails,
2 when it cannot run (bad arguments, torch missing).
"""

import json
import os
import sys
import warnings

TOLERANCE = 1e-4
# The share of the limit that float32 rounding alone may take.
CONDITIONING = 0.25


def _logits(output):
    """The tensor a model returned: itself, or a Hugging Face model output's `.logits`."""
    return getattr(output, "logits", output)


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    exported, case = argv[1], argv[2]
    try:
        with warnings.catch_warnings():
            # The torch wheel warns at import when NumPy is missing; it is not needed here.
            warnings.simplefilter("ignore")
            import torch  # noqa: F401
    except ImportError as e:
        print(f"check_export: cannot import torch: {e}", file=sys.stderr)
        return 2
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import pytorch_models

    tensors, metadata = pytorch_models.read_safetensors(exported)
    if metadata.get("format") != "pt":
        print(f"FAIL: metadata format is {metadata.get('format')!r}, not 'pt'")
        return 1
    if "tessera.model" not in metadata:
        print("FAIL: no tessera.model metadata")
        return 1
    model_config = json.loads(metadata["tessera.model"])
    input_shape = json.loads(metadata.get("tessera.input", "null"))
    model = pytorch_models.build(model_config, input_shape)
    try:
        pytorch_models.apply_modules(
            model, json.loads(metadata.get("tessera.modules", "[]")), tensors
        )
    except (ValueError, KeyError) as e:
        print(f"FAIL: building the plugin modules kept in the export: {e}")
        return 1

    expected = model.state_dict()
    failures = []
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing:
        failures.append(f"missing from the export: {', '.join(missing)}")
    if unexpected:
        failures.append(f"not in the PyTorch model: {', '.join(unexpected)}")
    for name in sorted(set(expected) & set(tensors)):
        e, t = expected[name], tensors[name]
        if e.dtype != t.dtype or tuple(e.shape) != tuple(t.shape):
            failures.append(
                f"{name}: exported {t.dtype} {tuple(t.shape)}, PyTorch has {e.dtype} {tuple(e.shape)}"
            )
    try:
        model.load_state_dict(tensors, strict=True)
    except RuntimeError as e:
        failures.append(f"load_state_dict(strict=True) failed: {e}")
    if failures:
        for f in failures:
            print(f"FAIL: {f}")
        return 1

    case_tensors, _ = pytorch_models.read_safetensors(case)
    x, want = case_tensors["input"], case_tensors["output"]
    model.eval()
    with torch.no_grad():
        got = _logits(model(x))
    if tuple(got.shape) != tuple(want.shape):
        print(f"FAIL: PyTorch output shape {tuple(got.shape)}, Tessera's {tuple(want.shape)}")
        return 1
    diff = (got.double() - want.double()).abs().max().item()
    scale = max(want.double().abs().max().item(), 1.0)
    limit = TOLERANCE * scale
    params = sum(p.numel() for p in model.parameters())
    print(
        f"{model_config.get('name', 'torchscript')}: {len(tensors)} tensors, {params} parameters loaded strictly "
        f"into {type(model).__module__}.{type(model).__name__}; "
        f"max_abs_diff={diff:.3e} (output scale {scale:.3g}, limit {limit:.3e})"
    )
    # The comparison means something only when float32 rounding alone stays well inside the
    # limit: a network whose activations explode (e.g. batch-norm running statistics far from
    # the batches' after a few steps) amplifies rounding until any two float32 computations
    # differ, and a wrong export could then pass or a right one fail. The same model in float64
    # measures that noise.
    model.double()
    with torch.no_grad():
        exact = _logits(model(x.double() if x.is_floating_point() else x))
    noise = (got.double() - exact).abs().max().item()
    print(f"float32 rounding of this case (PyTorch float32 vs float64): {noise:.3e}")
    if not noise <= CONDITIONING * limit:
        print(
            f"FAIL: the case is ill-conditioned: PyTorch's own float32 output is {noise:.3e} from "
            f"its float64 output, more than {CONDITIONING} of the limit; the comparison cannot "
            "tell a wrong export from rounding (make the run's outputs better scaled)"
        )
        return 1
    if not diff <= limit:
        print("FAIL: PyTorch's output differs from Tessera's")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
