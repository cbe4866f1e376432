#!/usr/bin/env python3
"""Pretrained-weight files as users get them, and the logits PyTorch computes with them, for
tests/models/finetune.rs (`[model] init_weights`):

    python3 tests/support/pretrained_reference.py OUT_DIR VOCAB

writes into OUT_DIR
- `resnet18.pt`: torchvision's `resnet18()` (1000 classes, seeded random weights, batch-norm
  statistics drawn too so that evaluation depends on them) saved with `torch.save(state_dict)`;
- `resnet18.safetensors`: the same state_dict through `safetensors.torch.save_file`;
- `resnet18_io.safetensors`: `x` (2, 3, 32, 32) and the model's eval-mode `logits`;
- `gpt2/`: a tiny `GPT2LMHeadModel` (2 layers, 2 heads, 16 features, 32 positions, VOCAB
  tokens, random init) saved by `save_pretrained` (`model.safetensors`, `config.json`);
- `gpt2_io.safetensors`: `ids` (2, 8) and the eval-mode `logits`.

Nothing is downloaded: every model is built from its config with the installed wheels.
"""

import json
import os
import sys

import torch
from safetensors.torch import save_file


def resnet18(out):
    import torchvision

    torch.manual_seed(7)
    model = torchvision.models.resnet18(num_classes=1000)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_(0.0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.num_batches_tracked.fill_(3)
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0.0, 0.1)
    model.eval()
    state = model.state_dict()
    torch.save(state, os.path.join(out, "resnet18.pt"))
    save_file({k: v.contiguous() for k, v in state.items()}, os.path.join(out, "resnet18.safetensors"), {"format": "pt"})
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits = model(x)
    save_file({"x": x, "logits": logits.contiguous()}, os.path.join(out, "resnet18_io.safetensors"))
    return len(state)


def gpt2(out, vocab):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(11)
    config = GPT2Config(
        vocab_size=vocab,
        n_positions=32,
        n_embd=16,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=vocab - 1,
        eos_token_id=vocab - 1,
    )
    model = GPT2LMHeadModel(config)
    model.eval()
    model.save_pretrained(os.path.join(out, "gpt2"))
    ids = torch.randint(0, vocab, (2, 8), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        logits = model(ids).logits
    save_file({"ids": ids, "logits": logits.contiguous()}, os.path.join(out, "gpt2_io.safetensors"))


def main():
    out, vocab = sys.argv[1], int(sys.argv[2])
    os.makedirs(out, exist_ok=True)
    tensors = resnet18(out)
    gpt2(out, vocab)
    print(json.dumps({"resnet18_tensors": tensors, "gpt2": sorted(os.listdir(os.path.join(out, "gpt2")))}))


if __name__ == "__main__":
    main()
