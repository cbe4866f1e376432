"""ChannelsLast step time in plain PyTorch, steps interleaved: the ResNet-20 twin of
scripts/pytorch_models.py (width 16, one 28x28 channel, batch 128 of random data, SGD with
momentum), one copy plain and one after `model.to(memory_format=torch.channels_last)`, a step of
each in turn (alternating which goes first), so a busy machine slows both alike. Prints the
median step time of each (the first 2 steps of each left out) and their ratio.

    PYTHONPATH=<torch wheel> python3 scripts/bench_channels_last_pytorch.py [STEPS]
"""

import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pytorch_models import build  # noqa: E402


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 22
    torch.manual_seed(0)
    plain = build({"name": "resnet20", "width": 16, "num_classes": 10},
                  {"channels": 1, "height": 28, "width": 28})
    models = {"plain": plain,
              "channels_last": copy.deepcopy(plain).to(memory_format=torch.channels_last)}
    optims = {k: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
              for k, m in models.items()}
    x = torch.randn(128, 1, 28, 28)
    y = torch.randint(0, 10, (128,))
    times = {k: [] for k in models}
    for step in range(steps):
        order = list(models) if step % 2 == 0 else list(reversed(models))
        for k in order:
            start = time.perf_counter()
            optims[k].zero_grad()
            torch.nn.functional.cross_entropy(models[k](x), y).backward()
            optims[k].step()
            if step >= 2:
                times[k].append(time.perf_counter() - start)
    ms = {k: statistics.median(v) * 1000 for k, v in times.items()}
    print(f"median ms/step: plain {ms['plain']:.1f}, channels_last {ms['channels_last']:.1f}, "
          f"ratio {ms['channels_last'] / ms['plain']:.3f} ({torch.get_num_threads()} threads)")


if __name__ == "__main__":
    main()
