#!/usr/bin/python3
"""One rank of PyTorch's Gloo allreduce (CPU, torch.distributed, default algorithm).

allreduce-bench -hosts starts one of these per rank, each inside the network
namespace of its host, to measure Gloo on the same links and caps as its own
allreduce. Every rank runs the same plan: per size, WARMUP all_reduce calls,
a barrier, then ITERS timed back-to-back all_reduce calls of a zeroed float32
tensor (sum), and prints one JSON line per size on stdout:

  {"size": BYTES, "times": [seconds, ...]}

The caller takes each iteration's maximum over ranks (the slowest rank
counts, as NCCL-tests and allreduce-bench do) and reports the median.

  /usr/bin/python3 gloo_rank.py --rank R --world N --master HOST:PORT \
      --ifname eth0 --plan 1048576:10:100,67108864:2:10

Rank 0 serves the rendezvous (torch's TCPStore) on --master, which must be
one of its own addresses. Needs Debian's python3-torch (run it with
/usr/bin/python3: another python3 on the PATH may lack torch).
"""
import argparse
import json
import os
import sys
import time
from datetime import timedelta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--master", required=True, help="HOST:PORT of rank 0's rendezvous store")
    ap.add_argument("--ifname", default="", help="network interface Gloo binds (GLOO_SOCKET_IFNAME)")
    ap.add_argument("--plan", required=True, help="comma-separated SIZE:WARMUP:ITERS, sizes in bytes")
    ap.add_argument("--timeout", type=float, default=300, help="seconds before a collective gives up")
    a = ap.parse_args()
    plan = []
    for item in a.plan.split(","):
        size, warm, iters = (int(x) for x in item.split(":"))
        if size <= 0 or size % 4 or warm < 0 or iters <= 0:
            sys.exit(f"bad plan entry {item!r}")
        plan.append((size, warm, iters))
    if a.ifname:
        os.environ["GLOO_SOCKET_IFNAME"] = a.ifname

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{a.master}", rank=a.rank,
                            world_size=a.world, timeout=timedelta(seconds=a.timeout))
    check = torch.full((1024,), float(a.rank + 1))
    dist.all_reduce(check)
    want = a.world * (a.world + 1) / 2
    if check[0].item() != want:
        sys.exit(f"gloo allreduce sanity check: {check[0].item()}, want {want}")
    for size, warm, iters in plan:
        x = torch.zeros(size // 4, dtype=torch.float32)  # zeros: sums never overflow
        for _ in range(warm):
            dist.all_reduce(x)
        dist.barrier()
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            dist.all_reduce(x)
            times.append(time.perf_counter() - t0)
        print(json.dumps({"size": size, "times": times}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
