"""Tiny random Llama-family models made by Hugging Face transformers, for the parity test of
Tessera's `[model] name = "llama"` (tests/models/llama.rs): writes OUT/config.json (the model's
`save_pretrained` config) and OUT/case.safetensors holding every tensor of the model's
`state_dict` as `param/<name>`, the input ids `input` and transformers' logits `logits`
(float32, eval mode); and the model's `save_pretrained` folders OUT/single (model.safetensors)
and OUT/sharded (shards of at most 20 KB and model.safetensors.index.json).

    python3 scripts/llama_reference.py VARIANT OUT

VARIANT: `gqa` (Llama, 4 query heads over 2 key/value heads, untied head), `rope3` (Llama 3's
`rope_scaling`, tied head, a head_dim of its own), `qwen2` (Qwen2: biases on q, k and v only).
Nothing is downloaded: the models are drawn from a fixed seed.
"""

import json
import os
import sys

import torch
from safetensors.torch import save_file


def build(variant):
    import transformers

    common = dict(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        initializer_range=0.5,
    )
    if variant == "gqa":
        config = transformers.LlamaConfig(
            num_key_value_heads=2, tie_word_embeddings=False, rope_theta=500.0, **common
        )
        return transformers.LlamaForCausalLM(config)
    if variant == "rope3":
        config = transformers.LlamaConfig(
            num_key_value_heads=1,
            head_dim=16,
            tie_word_embeddings=True,
            rope_theta=10000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
            **common,
        )
        return transformers.LlamaForCausalLM(config)
    if variant == "qwen2":
        config = transformers.Qwen2Config(
            num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1000.0, **common
        )
        return transformers.Qwen2ForCausalLM(config)
    raise SystemExit(f"unknown variant {variant!r}")


def main():
    variant, out = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = build(variant).float().eval()
    os.makedirs(out, exist_ok=True)
    model.config.save_pretrained(out)
    ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    tensors = {f"param/{k}": v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    tensors["input"] = ids
    tensors["logits"] = logits.contiguous()
    save_file(tensors, os.path.join(out, "case.safetensors"))
    # The same weights as save_pretrained writes them: one file, and shards with an index.
    model.save_pretrained(os.path.join(out, "single"))
    model.save_pretrained(os.path.join(out, "sharded"), max_shard_size="20KB")
    print(json.dumps({"variant": variant, "logits_abs_max": float(logits.abs().max())}))


if __name__ == "__main__":
    main()
