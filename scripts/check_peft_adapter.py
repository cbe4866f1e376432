"""Checks a `tessera export --format peft` folder with Hugging Face PEFT: the adapter loads onto
the base model with `PeftModel.from_pretrained` with every adapter tensor in place (each LoRA
layer PEFT builds holds the exported A and B exactly, none left at its initial value), and the
adapted model's logits on CASE's `input` equal CASE's `output` (Tessera's, from the merged
export) within float rounding; so do the logits of PEFT's own `merge_and_unload`.

    python3 scripts/check_peft_adapter.py BASE_DIR ADAPTER_DIR CASE.safetensors

BASE_DIR is the base model's `save_pretrained` folder. Prints the largest differences; exits 1
when a check fails.
"""

import sys

import torch
from safetensors.torch import load_file


def main():
    import peft
    import transformers

    base_dir, adapter_dir, case = sys.argv[1:4]
    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(base, adapter_dir)
    model.eval()
    exported = load_file(f"{adapter_dir}/adapter_model.safetensors")
    loaded = {}
    for name, module in model.named_modules():
        if isinstance(module, peft.tuners.lora.LoraLayer):
            for part in ("lora_A", "lora_B"):
                key = f"{name}.{part}.weight"
                loaded[key] = getattr(module, part)["default"].weight.detach()
    if sorted(loaded) != sorted(exported):
        print(f"PEFT's LoRA layers {sorted(loaded)} != the exported {sorted(exported)}")
        return 1
    for key, t in exported.items():
        if not torch.equal(loaded[key], t):
            print(f"{key}: PEFT holds another tensor than the exported one")
            return 1
    tensors = load_file(case)
    want = tensors["output"].float()
    scale = max(float(want.abs().max()), 1.0)
    with torch.no_grad():
        adapted = model(input_ids=tensors["input"]).logits.float()
        merged = model.merge_and_unload()(input_ids=tensors["input"]).logits.float()
    diffs = {
        "peft": float((adapted - want).abs().max()),
        "merge_and_unload": float((merged - want).abs().max()),
    }
    print(
        f"{len(exported) // 2} LoRA layers loaded; max abs logits difference "
        + ", ".join(f"{k} {v:.3e}" for k, v in diffs.items())
        + f" (scale {scale:.3e})"
    )
    return 0 if all(v <= 1e-4 * scale for v in diffs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
