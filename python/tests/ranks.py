"""Ranks as processes: ``run(fn, world, ...)`` forks ``world`` children,
each calls ``fn(rank, world, *args)`` with torchrun's variables (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT of a free port) and the extra
environment, and hands back what it returned, or its traceback; each
child exits once every rank has reported (rank 0 may serve the store the
others still need). Children
still running at the deadline are killed (SIGKILL) and reported; a child
killed by a signal is reported as ``Killed(signal)``."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import time
import traceback
from dataclasses import dataclass


@dataclass
class Failed:
    rank: int
    tb: str


@dataclass
class Killed:
    rank: int
    signal: int


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(fn, rank, world, args, env, q, release):
    os.environ.update(env)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    try:
        out = ("ok", fn(rank, world, *args))
    except BaseException:  # noqa: BLE001 - reported to the parent
        out = ("err", traceback.format_exc())
    q.put((rank, out))
    q.close()
    q.join_thread()
    # Stay until every rank has reported: rank 0 may serve the job's store,
    # which the others still use (bounded: the parent releases at its
    # deadline too).
    release.wait(60)
    # No interpreter teardown: a rank's leftovers (a peer's dead store)
    # must not make the test wait.
    os._exit(0)


def run(fn, world: int, *args, deadline: float = 60.0, env: dict | None = None):
    """Results by rank: fn's return value, ``Failed`` or ``Killed``.
    Raises AssertionError naming the ranks still running at ``deadline``."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    release = ctx.Event()
    base = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    base.update(env or {})
    procs = [ctx.Process(target=_child, args=(fn, r, world, args, base, q, release), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, object] = {}
    end = time.monotonic() + deadline
    while len(results) < world and time.monotonic() < end:
        try:
            rank, (kind, value) = q.get(timeout=0.1)
            results[rank] = value if kind == "ok" else Failed(rank, value)
        except Exception:  # queue.Empty
            pass
        for r, p in enumerate(procs):
            if r not in results and p.exitcode is not None and p.exitcode < 0:
                results[r] = Killed(r, -p.exitcode)
            elif r not in results and p.exitcode not in (None, 0):
                results[r] = Failed(r, f"exited with code {p.exitcode} before reporting")
    release.set()
    hung = [r for r in range(world) if r not in results]
    for r in hung:
        os.kill(procs[r].pid, signal.SIGKILL)
    for p in procs:
        p.join(10)
    assert not hung, f"ranks {hung} still running after {deadline} s (killed); others: {results}"
    return [results[r] for r in range(world)]


def check(results):
    """The results, after asserting no rank failed."""
    bad = [r for r in results if isinstance(r, (Failed, Killed))]
    assert not bad, "\n".join(r.tb if isinstance(r, Failed) else f"rank {r.rank} killed by signal {r.signal}" for r in bad)
    return results
