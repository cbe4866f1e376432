"""The PyTorch side of `scripts/bench-dp.sh`: PyTorch's own DistributedDataParallel (Gloo) on the
model of `scripts/bench_dp.py`, or one plain process, on the same Fashion-MNIST IDX files
Tessera reads (`<DATA>/train-images-idx3-ubyte`, `train-labels-idx1-ubyte`).

WORLD (2) processes are started with `torch.multiprocessing.spawn` and joined in a Gloo group on
127.0.0.1; the model (`scripts/pytorch_models.py`, the twin of Tessera's) is wrapped in
`DistributedDataParallel` with Tessera's reducer settings: PyTorch's default buckets (a 1 MiB
first bucket, then 25 MiB; passing `bucket_cap_mb=25` would make the first one 25 MiB too, so
the CNN's 1.7 MB of gradients would go in one bucket after the whole backward pass),
`find_unused_parameters` as Tessera's default (FIND_UNUSED, 1), and `broadcast_buffers=False`
(Tessera broadcasts batch-norm buffers only before evaluation, not before every forward pass as
PyTorch's default does). WORLD=1 trains one process without DDP.

The data as a user's loop reads it: the uint8 images in one tensor, one shuffled order per epoch
(the same on every rank), global batch i = positions [i G, (i + 1) G) of it, rank r taking every
WORLD-th sample from r (as Tessera's loader and PyTorch's DistributedSampler split it), float
conversion and normalization per batch. `torch.optim.SGD` (lr 0.05, momentum 0.9), cross-entropy,
`torch.set_num_threads(THREADS)` in every process.

Timed on rank 0: the training steps after WARMUP batches, `time.perf_counter` from the start of
step WARMUP + 1 to the end of step BATCHES (batch building included, as in Tessera's
`train_seconds`); every step ends in the gradient all-reduce, so rank 0's clock covers the group.

Prints one JSON line (rank 0): samples/s of the timed steps over all ranks, the parameter
count, DDP's logger averages (`_get_ddp_logging_data()`: forward, backward compute, backward
communication and overlap, seconds, from the same c10d logger Tessera's run.json reads, and the
gradient buckets' sizes in bytes) and, as a reference for the all-reduce's cost, the median
time of ALLREDUCE_REPEATS (20) `all_reduce`s of one flat float32 tensor the size of the
gradients, taken after training.

Environment: MODEL (cnn | resnet20), WORLD (2), BATCH (per rank, 64), THREADS (1), BATCHES,
WARMUP, FIND_UNUSED (1), DATA (the Fashion-MNIST folder), SEED (0), ALLREDUCE_REPEATS (20).
"""

import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pytorch_models  # noqa: E402
# The models, normalization and SGD settings of the single-process comparison.
from bench_vs_pytorch import LR, MEAN, MODELS, MOMENTUM, STD, read_idx  # noqa: E402



def env(name, default):
    return int(os.environ.get(name, default))


def ddp_timing(model):
    """DDP logger's averages over its sampled steps, in seconds (nanoseconds in the dict)."""
    data = model._get_ddp_logging_data()
    keys = {
        "forward_seconds": "avg_forward_compute_time",
        "backward_compute_seconds": "avg_backward_compute_time",
        "backward_comm_seconds": "avg_backward_comm_time",
        "overlap_seconds": "avg_backward_compute_comm_overlap_time",
    }
    timing = {k: data.get(v, 0) / 1e9 for k, v in keys.items()}
    # Bytes per gradient bucket, after the reducer's rebuild in the order gradients came.
    timing["bucket_bytes"] = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes")
    return timing


def isolated_all_reduce_seconds(numel, repeats):
    """Median time of one all_reduce of `numel` float32 values (the gradients, flat)."""
    flat = torch.ones(numel)
    times = []
    for _ in range(repeats + 2):
        started = time.perf_counter()
        dist.all_reduce(flat)
        times.append(time.perf_counter() - started)
    return statistics.median(times[2:])


def train(rank, world, port):
    model_name = os.environ.get("MODEL", "cnn")
    batch = env("BATCH", 64)
    batches, warmup = env("BATCHES", 100), env("WARMUP", 10)
    data_dir = Path(os.environ.get("DATA", Path.home() / ".cache/tessera/data/fashion-mnist"))
    torch.set_num_threads(env("THREADS", 1))
    torch.manual_seed(env("SEED", 0))
    if world > 1:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
    images = read_idx(data_dir / "train-images-idx3-ubyte").unsqueeze(1)
    labels = read_idx(data_dir / "train-labels-idx1-ubyte").long()
    net = pytorch_models.build(MODELS[model_name][0], (1, 28, 28))
    net.train()
    params = sum(p.numel() for p in net.parameters())
    model = net
    if world > 1:
        model = DistributedDataParallel(
            net,
            broadcast_buffers=False,
            find_unused_parameters=env("FIND_UNUSED", 1) != 0,
        )
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    loss_fn = torch.nn.CrossEntropyLoss()
    global_batch = batch * world
    per_epoch = images.shape[0] // global_batch
    order_gen = torch.Generator().manual_seed(env("SEED", 0))
    done, started = 0, None
    while done < batches:
        order = torch.randperm(images.shape[0], generator=order_gen)
        for i in range(min(per_epoch, batches - done)):
            if done == warmup:
                started = time.perf_counter()
            index = order[i * global_batch : (i + 1) * global_batch][rank::world]
            x = (images[index].float() / 255.0 - MEAN) / STD
            y = labels[index]
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            done += 1
    seconds = time.perf_counter() - started
    result = {
        "side": "pytorch",
        "torch": torch.__version__,
        "model": model_name,
        "world_size": world,
        "params": params,
        "timed_batches": batches - warmup,
        "seconds": seconds,
        "samples_per_second": (batches - warmup) * global_batch / seconds,
        "loss": loss.item(),
    }
    if world > 1:
        result["timing"] = ddp_timing(model)
        result["isolated_all_reduce_seconds"] = isolated_all_reduce_seconds(
            params, env("ALLREDUCE_REPEATS", 20)
        )
        dist.destroy_process_group()
    if rank == 0:
        print(json.dumps(result), flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    world = env("WORLD", 2)
    if world == 1:
        train(0, 1, None)
    else:
        mp.spawn(train, args=(world, free_port()), nprocs=world)


if __name__ == "__main__":
    main()
