#!/usr/bin/python3
"""PyTorch's Gloo allreduce on the CPU, measured the way allreduce-bench measures sync's.

--world processes on 127.0.0.1 (torch.multiprocessing, spawn) form one Gloo
process group. Per size: warm-up calls, a barrier, then timed back-to-back
all_reduce calls (SUM, float32, a zeroed buffer). An iteration's time is the
maximum over the ranks (the slowest rank counts); rank 0 prints one JSON
object per size with allreduce-bench's fields: impl, np, size_bytes, iters,
median_s, algbw_GBps = size / median, busbw_GBps = algbw * 2(n-1)/n
(NCCL-tests' definitions). Iteration counts follow allreduce-bench's
defaults. Each rank runs one thread (torchrun's OMP_NUM_THREADS=1).

  apt-get install -y python3-torch                          # Debian's PyTorch
  /usr/bin/python3 examples/allreduce-bench/gloo_allreduce.py --world 2 --sizes 4096,1048576
"""
import argparse
import json
import os
import socket
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def plan(size):
    """(warm-up, timed) iterations for a size, as allreduce-bench chooses them."""
    if size <= 4 << 10:
        return 20, 500
    if size <= 64 << 10:
        return 20, 300
    if size <= 1 << 20:
        return 10, 100
    if size <= 16 << 20:
        return 3, 20
    return 2, 10


def rank_main(rank, world, port, sizes, results):
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=world, timeout=timedelta(seconds=120))
    probe = torch.full((16,), float(rank + 1))
    dist.all_reduce(probe)
    if probe[0].item() != world * (world + 1) / 2:
        raise SystemExit("gloo_allreduce: allreduce gave %s" % probe[0].item())
    for size in sizes:
        warm, iters = plan(size)
        buf = torch.zeros(size // 4, dtype=torch.float32)
        for _ in range(warm):
            dist.all_reduce(buf)
        dist.barrier()
        times = torch.empty(iters, dtype=torch.float64)
        for i in range(iters):
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            times[i] = time.perf_counter() - t0
        dist.all_reduce(times, op=dist.ReduceOp.MAX)  # per iteration, the slowest rank
        if rank == 0:
            med = statistics.median(times.tolist())
            algbw = size / med / 1e9
            results.put({"impl": "gloo", "np": world, "size_bytes": size, "iters": iters, "median_s": med,
                         "algbw_GBps": algbw, "busbw_GBps": algbw * 2 * (world - 1) / world})
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=2, help="number of ranks (processes)")
    p.add_argument("--sizes", default="4096,65536,1048576,16777216,67108864", help="comma-separated sizes in bytes")
    p.add_argument("--port", type=int, default=0, help="rendezvous port (0: a free one)")
    a = p.parse_args()
    sizes = [int(s) for s in a.sizes.split(",") if s]
    if a.world < 2 or any(s < 4 or s % 4 for s in sizes):
        raise SystemExit("gloo_allreduce: want --world >= 2 and sizes that are positive multiples of 4")
    port = a.port
    if port == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, a.world, port, sizes, results)) for r in range(a.world)]
    for pr in procs:
        pr.start()
    try:
        for _ in sizes:
            print(json.dumps(results.get(timeout=600)), flush=True)
    finally:
        for pr in procs:
            pr.join(timeout=60)
            if pr.is_alive():
                pr.kill()
    if any(pr.exitcode for pr in procs):
        raise SystemExit("gloo_allreduce: a rank failed")


if __name__ == "__main__":
    main()
