"""The "ringcc" backend beyond the op × type grid: async work, non-contiguous
tensors, a second group beside the default one, the group's timeout as
the deadline, a killed rank, mismatched sizes, refused CUDA tensors."""

from __future__ import annotations

import os
import signal
import time

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import ringcc  # noqa: E402
from ranks import Failed, Killed, check, run  # noqa: E402
from torch_helpers import join  # noqa: E402


def _async(rank, world):
    gloo = join("env")
    ts = [torch.full((1 << 16,), float(rank + k)) for k in range(6)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    avg = torch.full((1 << 16,), float(rank))
    works.append(dist.all_reduce(avg, op=dist.ReduceOp.AVG, async_op=True))
    fut = works[1].get_future()
    assert works[-1].wait() is True
    done = [w.is_completed() for w in works]
    value = fut.wait()
    assert isinstance(value, list) and value[0] is ts[1]
    want = [sum(float(r + k) for r in range(world)) for k in range(6)]
    want.append(sum(range(world)) / world)
    got = [float(t[0]) for t in ts] + [float(avg[0])]
    # async gathers and reduce_scatter, then a blocking call after them
    out = torch.empty(4 * world)
    w1 = dist.all_gather_into_tensor(out, torch.full((4,), float(rank)), async_op=True)
    rs = torch.empty(3)
    w2 = dist.reduce_scatter_tensor(rs, torch.ones(3 * world), async_op=True)
    b = torch.full((5,), float(rank))
    dist.broadcast(b, 0)
    assert w2.is_completed() or w2.wait()
    w1.wait()
    ref = torch.empty(4 * world)
    dist.all_gather_into_tensor(ref, torch.full((4,), float(rank)), group=gloo)
    dist.destroy_process_group()
    return done, got, want, torch.equal(out, ref), float(rs[0]), float(b[0])


@pytest.mark.deadline(120)
def test_async_work_completes_in_issue_order_with_futures():
    for done, got, want, gathered, rs, b in check(run(_async, 2, deadline=90)):
        assert all(done), done
        assert got == want
        assert gathered and rs == 2.0 and b == 0.0


def _non_contiguous(rank, world):
    gloo = join("env")
    x = torch.arange(24, dtype=torch.float32).reshape(4, 6) * (rank + 1)
    a = x.t()  # 6 × 4, not contiguous
    assert not a.is_contiguous()
    b = x.t().contiguous()
    dist.all_reduce(a)  # writes x through the view
    dist.all_reduce(b, group=gloo)
    outs = [torch.empty(6, 4).t() for _ in range(world)]  # non-contiguous outputs
    dist.all_gather(outs, x * 0 + rank)
    big = torch.zeros(4, 2 * world)[:, ::2]  # a strided output of the right size
    dist.broadcast(big, 0)
    y = torch.zeros(world * 3, 2).t()
    out = torch.zeros(3, 2).t()
    dist.reduce_scatter_tensor(out, torch.ones(2, world * 3) * (rank + 1))
    dist.destroy_process_group()
    return torch.equal(a, b), [float(o.sum()) for o in outs], float(out.sum()), y.shape


@pytest.mark.deadline(120)
def test_non_contiguous_tensors_are_copied_and_copied_back():
    for same, gathered, rs, _ in check(run(_non_contiguous, 2, deadline=90)):
        assert same
        assert gathered == [0.0, 24.0]
        assert rs == 6 * 3.0


def _groups(rank, world):
    gloo = join("store")
    even = dist.new_group([0, 2])
    odd = dist.new_group([1, 3])
    full = dist.new_group(backend="ringcc")
    mine = even if rank % 2 == 0 else odd
    res = []
    for k in range(5):
        a = torch.full((1000,), float(rank + k))
        dist.all_reduce(a, group=mine)
        b = torch.full((1000,), float(rank))
        dist.all_reduce(b)  # the default group, between the subgroup's calls
        c = torch.full((10,), float(rank))
        w = dist.all_reduce(c, group=full, async_op=True)
        g = torch.full((10,), float(rank))
        dist.all_reduce(g, group=gloo)
        w.wait()
        res.append((float(a[0]), float(b[0]), float(c[0]), float(g[0])))
    names = (type(mine).__name__, dist.get_backend(mine), dist.get_world_size(mine), dist.get_rank(mine))
    dist.destroy_process_group()
    return res, names


@pytest.mark.deadline(120)
def test_new_group_beside_the_default_group():
    world = 4
    for rank, (res, names) in enumerate(check(run(_groups, world, deadline=90))):
        assert names == ("ProcessGroup", "ringcc", 2, rank // 2)
        for k, (a, b, c, g) in enumerate(res):
            peer = rank ^ 2
            assert a == float(rank + k + peer + k)
            assert b == c == g == float(sum(range(world)))


def _timeout(rank, world):
    join("env", timeout=2.0)
    pg = dist.group.WORLD
    assert pg.communicator.options["timeout"] == 2.0
    dist.barrier()
    t0 = time.monotonic()
    if rank == 0:
        try:
            dist.all_reduce(torch.ones(10))  # rank 1 does not call
        except ringcc.Error as e:
            return type(e).__name__, time.monotonic() - t0, e.waiting_for
        return None
    time.sleep(5)
    return "slept"


@pytest.mark.deadline(60)
def test_the_group_timeout_is_the_deadline():
    (name, dt, waiting_for), slept = check(run(_timeout, 2, deadline=40))
    assert name == "Timeout" and 1.5 < dt < 4.5 and waiting_for, (name, dt, waiting_for)


def _killed(rank, world):
    join("env", timeout=20.0)
    x = torch.ones(1 << 14)
    t0 = time.monotonic()
    try:
        for k in range(100000):
            if rank == 1 and k == 50:
                os.kill(os.getpid(), signal.SIGKILL)
            if k == 50:
                t0 = time.monotonic()
            dist.all_reduce(x)
            x.fill_(1.0)
    except ringcc.Error as e:
        return type(e).__name__, time.monotonic() - t0
    return "no error"


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.deadline(90)
def test_a_killed_rank_makes_the_survivors_raise_fast(world):
    res = run(_killed, world, deadline=60)
    assert isinstance(res[1], Killed) and res[1].signal == signal.SIGKILL
    for r, got in enumerate(res):
        if r == 1:
            continue
        assert not isinstance(got, (Failed, Killed)), got
        name, dt = got
        # Well inside the group's 20 s timeout: the transports see the peer go.
        assert name in ("PeerGone", "Aborted", "Error") and dt < 10, got


def _mismatch(rank, world, async_op):
    join("env")
    try:
        w = dist.all_reduce(torch.ones(100 + 7 * rank), async_op=async_op)
        if async_op:
            w.wait()
    except ringcc.Error as e:
        return type(e).__name__
    return "no error"


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.deadline(90)
def test_mismatched_sizes_fail_on_every_rank(async_op):
    res = check(run(_mismatch, 3, async_op, deadline=60))
    assert all(r in ("Mismatch", "Aborted") for r in res) and "Mismatch" in res, res


def _cuda(rank, world):
    join("env")
    try:
        dist.all_reduce(torch.ones(4, device="meta"))
    except ringcc.BadBuffer as e:
        msg = str(e)
    else:
        msg = None
    x = torch.ones(4)
    dist.all_reduce(x)  # the refusal left the group usable
    dist.destroy_process_group()
    return msg, float(x[0])


@pytest.mark.deadline(60)
def test_cuda_tensors_are_refused_clearly():
    for msg, x in check(run(_cuda, 2, deadline=40)):
        assert msg and "CUDA per-process" in msg and x == 2.0
