"""dist.all_reduce busbw, the "ringcc" backend vs gloo in the same
processes (both groups over the same ranks, sizes interleaved), float32
sum, 4 KiB … 64 MiB; then the DDP step time of the small model of the
tests (python/tests/ddp_model.py) on each. A benchmark, never a test: it
prints numbers and checks none.

Usage: python bench_torch.py [--ranks 2 4] [--min-bytes 4096] [--max-bytes 64M]
Time per size: the slowest rank's mean over a loop sized to ~0.3 s
(after warm-up); busbw = algbw × 2(n-1)/n, as nccl-tests.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))


def _bytes(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(s.rstrip("KMG")) * mult


def _time_loop(fn, dist, group, target: float = 0.3) -> float:
    """Mean seconds per call, the slowest rank's."""
    import torch

    fn()
    fn()
    dist.barrier(group=group)
    t0 = time.perf_counter()
    fn()
    once = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(once, op=dist.ReduceOp.MAX, group=group)
    iters = max(3, min(1000, int(target / max(float(once[0]), 1e-6))))
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    dt = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=group)
    return float(dt[0])


def _rank(rank, world, port, sizes, ddp_steps, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    import torch
    import torch.distributed as dist

    import ringcc.distributed  # noqa: F401  (the entry point would do too)

    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=120)
    dist.init_process_group("ringcc", timeout=timeout)
    gloo = dist.new_group(backend="gloo", timeout=timeout)
    groups = {"ringcc": None, "gloo": gloo}
    rows = []
    for nbytes in sizes:
        x = torch.ones(nbytes // 4, dtype=torch.float32)
        t = {}
        for name, g in groups.items():
            t[name] = _time_loop(lambda g=g: dist.all_reduce(x, group=g), dist, gloo)
        rows.append((nbytes, t["ringcc"], t["gloo"]))
    # DDP: the tests' model and data, per-step wall time after 5 warm-up steps.
    from ddp_model import batches, model
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp_times = {}
    for name, g in groups.items():
        m = DDP(model(), process_group=g or dist.group.WORLD)
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        loss_fn = torch.nn.CrossEntropyLoss()
        steps = []
        for k, (xb, yb) in enumerate(batches(rank, ddp_steps + 5)):
            dist.barrier(group=gloo)
            t0 = time.perf_counter()
            opt.zero_grad()
            loss_fn(m(xb), yb).backward()
            opt.step()
            dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=gloo)
            if k >= 5:
                steps.append(float(dt[0]))
        ddp_times[name] = statistics.median(steps)
    nparams = sum(p.numel() for p in model().parameters())
    dist.barrier(group=gloo)
    q.put((rank, rows, ddp_times, nparams))
    dist.destroy_process_group()
    os._exit(0)


def _human(n: int) -> str:
    for unit, s in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= s:
            return f"{n // s} {unit}"
    return f"{n} B"


def run(world: int, sizes, ddp_steps: int) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, world, port, sizes, ddp_steps, q)) for r in range(world)]
    for p in procs:
        p.start()
    got = {}
    deadline = time.monotonic() + 900
    while len(got) < world and time.monotonic() < deadline:
        try:
            r, rows, ddp, nparams = q.get(timeout=1)
            got[r] = (rows, ddp, nparams)
        except Exception:
            if any(p.exitcode not in (None, 0) for p in procs):
                break
    for p in procs:
        p.join(30)
        if p.exitcode is None:
            p.kill()
    if 0 not in got:
        raise SystemExit(f"{world} ranks: the benchmark failed (exit codes {[p.exitcode for p in procs]})")
    rows, ddp, nparams = got[0]
    bus = 2 * (world - 1) / world
    print(f"\n## dist.all_reduce, float32 sum, {world} ranks (time: slowest rank's mean; busbw GB/s)")
    print(f"| size | ringcc time | ringcc busbw | gloo time | gloo busbw | ringcc / gloo |")
    print(f"|---|---|---|---|---|---|")
    for nbytes, tr, tg in rows:
        print(
            f"| {_human(nbytes)} | {tr * 1e6:.1f} us | {bus * nbytes / tr / 1e9:.2f} | "
            f"{tg * 1e6:.1f} us | {bus * nbytes / tg / 1e9:.2f} | **{tg / tr:.2f}x** |"
        )
    print(
        f"\nDDP step ({nparams} parameters, batch 32 per rank, median of {ddp_steps} steps): "
        f"ringcc {ddp['ringcc'] * 1e3:.2f} ms, gloo {ddp['gloo'] * 1e3:.2f} ms "
        f"(**{ddp['gloo'] / ddp['ringcc']:.2f}x**)"
    )
    sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--min-bytes", type=_bytes, default=4 << 10)
    ap.add_argument("--max-bytes", type=_bytes, default=64 << 20)
    ap.add_argument("--ddp-steps", type=int, default=30)
    a = ap.parse_args()
    sizes = []
    n = a.min_bytes
    while n <= a.max_bytes:
        sizes.append(n)
        n *= 4
    for world in a.ranks:
        run(world, sizes, a.ddp_steps)


if __name__ == "__main__":
    main()
