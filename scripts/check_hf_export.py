"""Checks a `tessera export --format hf` folder with Hugging Face transformers: the folder loads
with the Auto class of its architecture (`AutoModelForCausalLM`, `AutoModelForMaskedLM`,
`AutoModelForSequenceClassification`) with no missing, unexpected or mis-shaped tensor, and its
logits on CASE's `input` (with CASE's `attention_mask` and `token_type_ids` when it has them)
equal CASE's `output` (Tessera's) within float rounding.

    python3 scripts/check_hf_export.py DIR CASE.safetensors

Prints the class and the largest difference; exits 1 when a check fails.
"""

import json
import os
import sys

import torch
from safetensors.torch import load_file


def main():
    import transformers

    folder, case = sys.argv[1], sys.argv[2]
    with open(os.path.join(folder, "config.json")) as f:
        architecture = json.load(f)["architectures"][0]
    auto = {
        "BertForMaskedLM": transformers.AutoModelForMaskedLM,
        "BertForSequenceClassification": transformers.AutoModelForSequenceClassification,
    }.get(architecture, transformers.AutoModelForCausalLM)
    model, info = auto.from_pretrained(folder, output_loading_info=True, dtype=torch.float32)
    problems = {k: v for k, v in info.items() if v}
    if problems:
        print(f"loading {folder}: {problems}")
        return 1
    model.eval()
    tensors = load_file(case)
    with torch.no_grad():
        extra = {k: tensors[k] for k in ("attention_mask", "token_type_ids") if k in tensors}
        logits = model(input_ids=tensors["input"], **extra).logits.float()
    want = tensors["output"].float()
    diff = float((logits - want).abs().max())
    scale = float(want.abs().max())
    cls = f"{type(model).__module__}.{type(model).__name__}"
    print(f"{cls}: max abs logits difference {diff:.3e} (scale {scale:.3e})")
    return 0 if diff <= 1e-4 * max(scale, 1.0) else 1


if __name__ == "__main__":
    sys.exit(main())
