"""The plain PyTorch side of the GPU check (scripts/gpu-check.sh): the same models Tessera trains
there, trained by a minimal PyTorch loop, eager or under `torch.compile`, on the same device;
prints one JSON line with the steady-state throughput.

    python3 scripts/bench_gpu_pytorch.py resnet50 --mode eager --batch 256 --size 224
    python3 scripts/bench_gpu_pytorch.py gpt2 --mode compile --batch 16 --seq 1024

Models (what Tessera's zoo defines, host/src/model):
- `resnet50`: torchvision's `resnet50(num_classes=CLASSES)` when torchvision imports, else
  `TorchvisionResNet50` below, its architecture written out (Bottleneck v1.5: stride on the
  3x3; the same module names, shapes and FLOPs); channels-last (`model.to(memory_format=
  torch.channels_last)` and channels-last inputs, as Tessera's `channels_last` plugin), bf16
  autocast, cross-entropy, SGD (lr 0.1, momentum 0.9, weight decay 5e-5: PyTorch's default
  multi-tensor implementation). Inputs: BATCHES random batches made once on the device
  (float32 in [0, 1)), cycled: the model's speed without an input pipeline.
- `gpt2`: `scripts/pytorch_models.py`'s `GPT2LMHeadModel` (the plain-PyTorch twin of Hugging
  Face's, which Tessera's gpt2 is written as: Conv1D as addmm, fused SDPA with is_causal, tanh
  GELU, tied head), GPT-2 small by default (12 layers, 12 heads, width 768, vocabulary 50257,
  context = --seq), dropout 0, bf16 autocast, next-token cross-entropy, AdamW (lr 6e-4, betas
  (0.9, 0.95), weight decay 0.1 on every parameter, as Tessera's adamw without groups). Inputs:
  random token ids on the device.

`--mode compile` compiles the model (`torch.compile(model)`, default mode, inductor), not the
optimizer step.

Timing: WARMUP steps (with `--mode compile` the first one compiles; its time is reported as
`first_step_seconds`), then `torch.cuda.synchronize()`, STEPS timed steps, synchronize again;
throughput = items / seconds of the timed steps. On CPU (`--device cpu`, the rehearsal) the same
loop runs without synchronisation and bf16 autocast runs on the CPU.

MFU (gpt2): model FLOPs per token `6·N + 12·L·H·Q·T` (nanoGPT's `estimate_mfu`, PaLM appendix
B: N = parameters without the position embedding, L layers, H heads, Q = head width, T =
context), times tokens/s, over `--peak-tflops` (989: H100/H200 dense bf16).
"""

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

H200_BF16_DENSE_TFLOPS = 989.0


# ---- ResNet-50, torchvision's architecture ---------------------------------------------------


class Bottleneck(nn.Module):
    """torchvision's `Bottleneck` (expansion 4, stride on the 3x3 conv: "ResNet v1.5")."""

    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class TorchvisionResNet50(nn.Module):
    """torchvision's `resnet50(num_classes=classes)` written out (used when torchvision is not
    installed): the same module tree, state_dict names and shapes, and initialisation."""

    def __init__(self, classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        inplanes = 64
        for i, (planes, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)]):
            stride = 1 if i == 0 else 2
            layers = []
            for b in range(blocks):
                downsample = None
                if b == 0 and (stride != 1 or inplanes != planes * 4):
                    downsample = nn.Sequential(
                        nn.Conv2d(inplanes, planes * 4, 1, stride=stride, bias=False),
                        nn.BatchNorm2d(planes * 4),
                    )
                layers.append(Bottleneck(inplanes, planes, stride if b == 0 else 1, downsample))
                inplanes = planes * 4
            setattr(self, f"layer{i + 1}", nn.Sequential(*layers))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(2048, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet50(classes):
    """torchvision's resnet50 if it imports, else the written-out one; and which it is."""
    if os.environ.get("TORCHVISION", "1") != "0":
        try:
            import torchvision

            return torchvision.models.resnet50(num_classes=classes), "torchvision.models.resnet50"
        except Exception:  # noqa: BLE001 - not installed, or built for another torch
            pass
    return TorchvisionResNet50(classes), "torchvision's resnet50 written out (no torchvision)"


# ---- GPT-2 -----------------------------------------------------------------------------------


def gpt2(layers, heads, width, vocab, context):
    from pytorch_models import GPT2LMHeadModel

    model = GPT2LMHeadModel(vocab, context, width, layers, heads, dropout=0.0)
    for name, p in model.named_parameters():
        # Hugging Face's init, as Tessera's: c_proj weights scaled by 1/sqrt(2 L).
        if name.endswith("c_proj.weight"):
            nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers))
        elif name.endswith(("wte.weight", "wpe.weight")):
            nn.init.normal_(p, 0.0, 0.02)
    return model, "scripts/pytorch_models.py GPT2LMHeadModel (HF's GPT-2, plain PyTorch)"


def gpt2_flops_per_token(model, layers, heads, width, context):
    """nanoGPT's `estimate_mfu` numerator: 6·N + 12·L·H·Q·T, N without the position table."""
    n = sum(p.numel() for p in model.parameters()) - model.transformer.wpe.weight.numel()
    q = width // heads
    return 6 * n + 12 * layers * heads * q * context, n


# ---- the loop --------------------------------------------------------------------------------


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", choices=["resnet50", "gpt2"])
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--size", type=int, default=224, help="resnet50: image side")
    ap.add_argument("--classes", type=int, default=1000, help="resnet50: classes")
    ap.add_argument("--seq", type=int, default=1024, help="gpt2: tokens per sequence")
    ap.add_argument("--layers", type=int, default=12, help="gpt2: n_layer")
    ap.add_argument("--heads", type=int, default=12, help="gpt2: n_head")
    ap.add_argument("--width", type=int, default=768, help="gpt2: n_embd")
    ap.add_argument("--vocab", type=int, default=50257, help="gpt2: vocabulary")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batches", type=int, default=4, help="distinct input batches, cycled")
    ap.add_argument("--peak-tflops", type=float, default=H200_BF16_DENSE_TFLOPS)
    ap.add_argument("--no-channels-last", action="store_true")
    ap.add_argument("--compile-backend", default="inductor",
                    help="torch.compile's backend (aot_eager: the CPU rehearsal's quick one)")
    args = ap.parse_args()

    device = torch.device(args.device)
    torch.manual_seed(0)
    if device.type == "cuda":
        # The usual setting for fixed shapes (Tessera's default on CUDA, issue 23); matmul
        # precision stays PyTorch's default.
        torch.backends.cudnn.benchmark = True
    result = {
        "side": "pytorch",
        "mode": args.mode,
        "model": args.model,
        "torch": torch.__version__,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "warmup_steps": args.warmup,
        "timed_steps": args.steps,
    }
    if args.model == "resnet50":
        batch = args.batch or 256
        model, what = resnet50(args.classes)
        channels_last = not args.no_channels_last
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        model = model.to(device, memory_format=fmt)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-5)
        inputs = [
            (
                torch.rand(batch, 3, args.size, args.size, device=device).contiguous(memory_format=fmt),
                torch.randint(0, args.classes, (batch,), device=device),
            )
            for _ in range(args.batches)
        ]
        items, unit = batch, "images"
        loss_fn = F.cross_entropy
        result.update(batch=batch, size=args.size, classes=args.classes, channels_last=channels_last)
    else:
        batch = args.batch or 16
        model, what = gpt2(args.layers, args.heads, args.width, args.vocab, args.seq)
        model = model.to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
        inputs = []
        for _ in range(args.batches):
            rows = torch.randint(0, args.vocab, (batch, args.seq + 1), device=device)
            inputs.append((rows[:, :-1], rows[:, 1:]))
        items, unit = batch * args.seq, "tokens"

        def loss_fn(logits, y):
            return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))

        flops, n = gpt2_flops_per_token(model, args.layers, args.heads, args.width, args.seq)
        result.update(batch=batch, seq=args.seq, layers=args.layers, heads=args.heads,
                      width=args.width, vocab=args.vocab, flops_per_token=flops,
                      params_without_wpe=n)
    result["params"] = sum(p.numel() for p in model.parameters())
    result["definition"] = what
    model.train()
    if args.mode == "compile":
        forward = torch.compile(model, backend=args.compile_backend)
        result["compile_backend"] = args.compile_backend
    else:
        forward = model

    def step(i):
        x, y = inputs[i % len(inputs)]
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out = forward(x)
        loss = loss_fn(out, y)
        loss.backward()
        optimizer.step()
        return loss

    started = time.perf_counter()
    step(0)
    sync(device)
    result["first_step_seconds"] = time.perf_counter() - started
    for i in range(1, args.warmup):
        step(i)
    sync(device)
    started = time.perf_counter()
    for i in range(args.steps):
        loss = step(args.warmup + i)
    sync(device)
    seconds = time.perf_counter() - started
    result["seconds"] = seconds
    result["step_ms"] = 1000 * seconds / args.steps
    result[f"{unit}_per_second"] = items * args.steps / seconds
    result["final_loss"] = loss.item()
    if args.model == "gpt2":
        achieved = result["flops_per_token"] * result["tokens_per_second"]
        result["achieved_tflops"] = achieved / 1e12
        result["peak_tflops"] = args.peak_tflops
        result["mfu"] = achieved / (args.peak_tflops * 1e12)
    if device.type == "cuda":
        result["max_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
