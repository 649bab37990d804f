#!/usr/bin/python3
"""torchrun's recovery time, measured the way recovery-bench measures elastictrain's.

It starts torchrun (Debian's python3-torch; run with /usr/bin/python3) with
--workers processes of a small linear-regression job under DDP over Gloo,
with torchrun's default settings (the c10d rendezvous of --standalone, on a
free port) and --max_restarts 3. Every worker appends
one line per completed step to a log of its own. Once every rank has trained
--kill-at steps, the script SIGKILLs the worker holding rank 1, then waits
for rank 0 of the restarted group (torchrun restarts every worker of a group
when one fails) to complete its first step, and reports the time from the
SIGKILL to that step. One JSON line per trial:

  {"impl": "torchrun", "workers": 2, "trial": 1, "recovery_seconds": ...}

  apt-get install -y python3-torch
  /usr/bin/python3 examples/recovery-bench/torchrun_recovery.py --workers 2 --trials 3
"""
import argparse
import glob
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time


def worker(logdir):
    import torch
    import torch.distributed as dist
    from torch import nn

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    with open(os.path.join(logdir, "pid.%d.%d" % (rank, restart)), "w") as f:
        f.write(str(os.getpid()))
    torch.manual_seed(1)
    model = nn.parallel.DistributedDataParallel(nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, w = torch.randn(64, 16), torch.randn(16, 1)
    log = open(os.path.join(logdir, "steps.%d.%d" % (rank, restart)), "a", buffering=1)
    while True:
        opt.zero_grad()
        ((model(x) - x @ w) ** 2).mean().backward()
        opt.step()
        log.write("%.6f\n" % time.time())
        time.sleep(0.01)  # about 100 steps/s, like a light training job


def lines(path):
    try:
        with open(path) as f:
            return [float(l) for l in f.read().split()]
    except (OSError, ValueError):
        return []


class TimedOut(Exception):
    pass


def wait(cond, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.005)
    raise TimedOut("timed out waiting for " + what)


def trial(a, n):
    logdir = tempfile.mkdtemp(prefix="torchrun-recovery.")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(a.workers),
           "--rdzv_backend", "c10d", "--rdzv_endpoint", "127.0.0.1:%d" % port, "--max_restarts", "3",
           # Debian's torchrun 1.13 fails at startup without these.
           "--redirects", "2", "--tee", "2",
           os.path.abspath(__file__), "--worker", logdir]
    run = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait(lambda: all(len(lines(os.path.join(logdir, "steps.%d.0" % r))) >= a.kill_at for r in range(a.workers)),
             120, "%d steps on every rank" % a.kill_at)
        pid = int(open(os.path.join(logdir, "pid.1.0")).read())
        t_kill = time.time()
        os.kill(pid, signal.SIGKILL)
        first = wait(lambda: [t for p in glob.glob(os.path.join(logdir, "steps.0.*")) if not p.endswith(".0")
                              for t in lines(p)[:1]], 120, "a step after the restart")
        return {"impl": "torchrun", "workers": a.workers, "trial": n, "recovery_seconds": round(min(first) - t_kill, 3)}
    finally:
        os.killpg(run.pid, signal.SIGTERM)
        try:
            run.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--kill-at", type=int, default=50, help="steps every rank trains before the kill")
    a = p.parse_args()
    if a.workers < 2:
        raise SystemExit("torchrun_recovery: want --workers >= 2 (rank 1 is killed)")
    for n in range(1, a.trials + 1):
        try:
            res = trial(a, n)
        except TimedOut as e:
            # torchrun 1.13's c10d rendezvous sometimes fails to start on a
            # busy machine (rank 0 cannot bind the port torchrun picked);
            # one more try.
            print("torchrun_recovery: trial %d: %s; once more" % (n, e), file=sys.stderr)
            res = trial(a, n)
        print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
