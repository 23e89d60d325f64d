"""The plain package: numpy, buffer-protocol, DLPack and torch buffers,
in place and out of place, async Work, errors; one rank in this process
over a Python store, several ranks as processes (from_env and over
torch's TCPStore)."""

from __future__ import annotations

import array
import datetime
import os
import threading
import time

import numpy as np
import pytest

import ringcc
from ranks import check, run


# Communicators and stores kept until the rank's process exits: rank 0
# serves the job's store, and closing it would stop the store under the
# others.
_KEEP = []


class DictStore:
    """A store in this process, with torch Store's methods."""

    def __init__(self):
        self.d = {}
        self.cv = threading.Condition()

    def set(self, key, value):
        with self.cv:
            self.d[key] = bytes(value)
            self.cv.notify_all()

    def get(self, key):
        with self.cv:
            return self.d[key]

    def add(self, key, delta):
        with self.cv:
            v = int(self.d.get(key, b"0")) + delta
            self.d[key] = str(v).encode()
            self.cv.notify_all()
            return v

    def check(self, keys):
        with self.cv:
            return all(k in self.d for k in keys)

    def wait(self, keys, timeout):
        with self.cv:
            if not self.cv.wait_for(lambda: all(k in self.d for k in keys), timeout.total_seconds()):
                raise TimeoutError(f"wait timeout for {keys}")


@pytest.fixture
def one():
    c = ringcc.Communicator(0, 1, DictStore(), timeout=10)
    yield c
    c.close()


# -- one rank, in this process ---------------------------------------------


def test_one_rank_numpy_in_place_and_out_of_place(one):
    x = np.arange(1000, dtype=np.float32)
    one.all_reduce(x)
    assert np.array_equal(x, np.arange(1000, dtype=np.float32))
    y = np.zeros(1000, dtype=np.float32)
    one.all_reduce(x, out=y, op="max")
    assert np.array_equal(y, x)
    g = np.zeros(1000, dtype=np.float32)
    one.all_gather(x, out=g)
    assert np.array_equal(g, x)
    assert one.rank == 0 and one.world_size == 1 and one.calls == 3
    assert one.options["timeout"] == 10.0


@pytest.mark.parametrize(
    "make",
    [
        lambda: bytearray(range(64)),
        lambda: memoryview(bytearray(range(64))),
        lambda: array.array("i", range(16)),
        lambda: array.array("d", [1.5] * 8),
        lambda: np.arange(12, dtype=np.int64).reshape(3, 4),
        lambda: np.ones(7, dtype=np.float16),
    ],
    ids=["bytearray", "memoryview", "array-i", "array-d", "numpy-2d", "numpy-f16"],
)
def test_buffer_protocol_objects_copy_through_out_of_place(one, make):
    src, dst = make(), make()
    mv = memoryview(dst).cast("B")
    mv[:] = b"\0" * len(mv)
    one.broadcast(src, 0, out=dst)
    assert bytes(memoryview(dst)) == bytes(memoryview(src))


def test_dlpack_object_without_buffer_protocol(one):
    torch = pytest.importorskip("torch")

    class OnlyDlpack:
        def __init__(self, t):
            self.t = t

        def __dlpack__(self, **kw):
            return self.t.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.t.__dlpack_device__()

    src = torch.arange(10, dtype=torch.int32)
    dst = torch.zeros(10, dtype=torch.int32)
    one.all_reduce(OnlyDlpack(src), out=OnlyDlpack(dst))
    assert torch.equal(dst, src)
    with pytest.raises(ringcc.BadBuffer, match="neither"):
        one.all_reduce(object())


def test_torch_tensors_all_types_and_refusals(one):
    torch = pytest.importorskip("torch")
    for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32, torch.int64):
        src = (torch.arange(33) % 7).to(dt)
        dst = torch.zeros(33, dtype=dt)
        one.all_reduce(src, out=dst)
        assert torch.equal(dst, src), dt
    with pytest.raises(ringcc.BadBuffer, match="not contiguous"):
        one.all_reduce(torch.zeros(4, 4).t())
    with pytest.raises(ringcc.BadBuffer, match="CUDA per-process"):
        one.all_reduce(torch.zeros(4, device="meta"))
    with pytest.raises(ringcc.BadBuffer, match="no ringcc element type"):
        one.all_reduce(torch.zeros(4, dtype=torch.int16))


def test_buffer_refusals_are_bad_buffer_errors(one):
    ro = np.zeros(8, dtype=np.float32)
    ro.flags.writeable = False
    with pytest.raises(ringcc.BadBuffer, match="read-only") as e:
        one.all_reduce(ro)
    assert e.value.kind == "bad_buffer" and isinstance(e.value, ValueError)
    one.all_reduce(ro, out=np.zeros(8, dtype=np.float32))  # a read-only input is fine
    with pytest.raises(ringcc.BadBuffer, match="C-contiguous"):
        one.all_reduce(np.zeros((4, 4), dtype=np.float32)[:, 1])
    with pytest.raises(ringcc.BadBuffer, match="input holds"):
        one.all_reduce(np.zeros(4, dtype=np.float32), out=np.zeros(4, dtype=np.int32))
    x = np.zeros(8, dtype=np.float32)
    with pytest.raises(ringcc.BadBuffer, match="overlap"):
        one.all_gather(x[:4], out=x)
    with pytest.raises(ringcc.BadBuffer, match="call needs"):
        one.all_reduce(np.zeros(4, dtype=np.float32), out=np.zeros(5, dtype=np.float32))
    with pytest.raises(ringcc.BadBuffer, match="no ringcc element type"):
        one.all_reduce(np.zeros(4, dtype=np.int16))
    with pytest.raises(ringcc.BadConfig, match="no reduction"):
        one.all_reduce(x, op="xor")
    # None of these poisoned the communicator.
    one.all_reduce(x)


def test_dtype_names_bfloat16_over_uint16(one):
    bits = np.array([0x3F80, 0x4000], dtype=np.uint16)  # bf16 1.0 and 2.0
    out = np.zeros(2, dtype=np.uint16)
    one.all_reduce(bits, out=out, dtype="bfloat16")
    assert out.tolist() == [0x3F80, 0x4000]
    assert ("bfloat16", 2) in ringcc.dtypes()


def test_async_work(one):
    x = np.arange(1 << 16, dtype=np.float64)
    ws = [one.all_reduce(x, async_op=True) for _ in range(5)]
    assert all(isinstance(w, ringcc.Work) for w in ws)
    assert ws[-1].wait(datetime.timedelta(seconds=10)) is True
    assert all(w.is_completed() for w in ws)  # issue order
    assert all(w.wait() for w in ws) and ws[0].exception() is None
    bad = one.all_reduce(np.zeros(3, dtype=np.float32), out=np.zeros(4, dtype=np.float32), async_op=True)
    with pytest.raises(ringcc.BadBuffer):
        bad.wait()
    assert isinstance(bad.exception(), ringcc.BadBuffer)
    with pytest.raises(ringcc.BadBuffer):  # raised again by a second wait
        bad.wait()


def test_close_then_calls_raise_closed(one):
    one.close()
    one.close()  # twice is fine
    assert one.closed
    with pytest.raises(ringcc.Closed):
        one.all_reduce(np.zeros(1, dtype=np.float32))


def test_errors_are_picklable_with_their_fields():
    import pickle

    e = ringcc.Timeout("waited", kind="timeout", rank=None, channel=1, waiting_for="x", after=2.0)
    e2 = pickle.loads(pickle.dumps(e))
    assert type(e2) is ringcc.Timeout and (e2.kind, e2.channel, e2.waiting_for, e2.after) == ("timeout", 1, "x", 2.0)
    assert isinstance(e2, TimeoutError) and str(e2) == "waited"


# -- several ranks, as processes --------------------------------------------


def _from_env(rank, world, timeout_ms=20000):
    os.environ.update(
        RINGCC_RANK=str(rank),
        RINGCC_WORLD_SIZE=str(world),
        RINGCC_ADDR=f"127.0.0.1:{os.environ['MASTER_PORT']}",
        RINGCC_TOKEN="pytest-" + os.environ["MASTER_PORT"],
        RINGCC_TIMEOUT_MS=str(timeout_ms),
    )
    # torchrun's variables would do as well; RINGCC_* wins.
    return ringcc.Communicator.from_env()


def _every_collective(rank, world):
    c = _from_env(rank, world)
    n = 1003
    out = {}
    x = (np.arange(n, dtype=np.int64) * (rank + 1)) % 1000
    c.all_reduce(x)
    out["allreduce"] = x.copy()
    y = np.empty(n, dtype=np.int32)
    c.all_reduce(np.full(n, rank + 1, dtype=np.int32), out=y, op="prod")
    out["prod"] = y.copy()
    g = np.empty(n * world, dtype=np.uint8)
    c.all_gather(np.full(n, rank, dtype=np.uint8), out=g)
    out["gather"] = g.copy()
    gi = np.zeros(n * world, dtype=np.float64)
    gi[rank * n : (rank + 1) * n] = rank + 0.5
    c.all_gather(gi)
    out["gather_in_place"] = gi.copy()
    rs = np.empty(n, dtype=np.int8)
    c.reduce_scatter(np.tile(np.arange(world, dtype=np.int8), (n, 1)).T.copy().reshape(-1), out=rs, op="max")
    out["reduce_scatter"] = rs.copy()
    rsi = np.full(n * world, rank + 1, dtype=np.float32)
    c.reduce_scatter(rsi, op="sum")
    out["reduce_scatter_in_place"] = rsi[rank * n : (rank + 1) * n].copy()
    b = np.full(n, rank, dtype=np.uint64)
    c.broadcast(b, world - 1)
    out["broadcast"] = b.copy()
    r = np.full(n, rank + 1, dtype=np.int64)
    c.reduce(r, 0, op="min")
    out["reduce"] = r.copy()
    a = np.full(n, 2 * rank, dtype=np.int32)
    c.all_reduce(a, op="avg")
    out["avg"] = a.copy()
    w = c.all_reduce(np.full(1 << 18, float(rank), dtype=np.float32), async_op=True)
    assert w.wait() and w.is_completed()
    c.barrier()
    sub = c.split(rank % 2, key=-rank % 7)
    s = np.array([rank], dtype=np.int64)
    sub.all_reduce(s)
    out["split"] = (sub.rank, sub.world_size, int(s[0]))
    sub.close()
    c.close()
    return out


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.deadline(120)
def test_every_collective_over_processes(world):
    res = check(run(_every_collective, world, deadline=90))
    n = 1003
    ranks = np.arange(world)
    for r, out in enumerate(res):
        assert np.array_equal(out["allreduce"], sum((np.arange(n, dtype=np.int64) * (k + 1)) % 1000 for k in ranks))
        assert (out["prod"] == np.prod(ranks + 1)).all()
        assert np.array_equal(out["gather"], np.repeat(ranks, n).astype(np.uint8))
        assert np.array_equal(out["gather_in_place"], np.repeat(ranks + 0.5, n))
        assert (out["reduce_scatter"] == r).all()  # max over ranks of block r (= r)
        assert (out["reduce_scatter_in_place"] == sum(ranks + 1)).all()
        assert (out["broadcast"] == world - 1).all()
        if r == 0:
            assert (out["reduce"] == 1).all()
        assert (out["avg"] == sum(2 * ranks) // world).all()
        color = [k for k in ranks if k % 2 == r % 2]
        assert out["split"][1] == len(color) and out["split"][2] == sum(color)


def _over_torch_store(rank, world):
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), world, rank == 0, timeout=datetime.timedelta(seconds=20))
    _KEEP.append(store)  # rank 0's serves the others until they are done
    c = ringcc.Communicator(rank, world, store, timeout=20)
    x = np.full(100, rank + 1.0)
    c.all_reduce(x)
    c.close()
    return float(x[0]), c.closed


@pytest.mark.deadline(90)
def test_bootstrap_over_torch_tcpstore():
    pytest.importorskip("torch")
    res = check(run(_over_torch_store, 3, deadline=60))
    assert res == [(6.0, True)] * 3


def _late_peer_gil(rank, world):
    c = _from_env(rank, world)
    c.barrier()
    if rank == 1:
        time.sleep(1.0)
    ticks = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    t = threading.Thread(target=spin)
    t.start()
    t0 = time.monotonic()
    c.all_reduce(np.ones(10, dtype=np.float32))  # rank 0 waits ~1 s here
    dt = time.monotonic() - t0
    stop.set()
    t.join()
    c.close()
    return dt, ticks[0]


@pytest.mark.deadline(60)
def test_gil_is_released_while_a_call_waits():
    res = check(run(_late_peer_gil, 2, deadline=40))
    dt, ticks = res[0]
    assert dt > 0.8
    # A thread needing the GIL kept running through the wait (~1 ms sleeps).
    assert ticks > 200, res


def _timeout_then_abort(rank, world):
    c = _from_env(rank, world, timeout_ms=1500)
    _KEEP.append(c)
    c.barrier()
    got = {}
    if rank == 0:
        t0 = time.monotonic()
        try:
            c.all_reduce(np.ones(10, dtype=np.float32))  # rank 1 never calls
        except ringcc.Error as e:
            got["first"] = (type(e).__name__, e.kind, e.rank, e.waiting_for, time.monotonic() - t0)
    else:
        time.sleep(4.0)
        try:
            c.all_reduce(np.ones(10, dtype=np.float32))
        except ringcc.Error as e:
            got["first"] = (type(e).__name__, e.kind, e.rank, e.waiting_for, None)
    return got


@pytest.mark.deadline(60)
def test_a_call_nobody_answers_times_out_and_aborts_the_job():
    r0, r1 = check(run(_timeout_then_abort, 2, deadline=40))
    name, kind, _, waiting_for, dt = r0["first"]
    assert (name, kind) == ("Timeout", "timeout") and "waits for" in waiting_for and 1.0 < dt < 10, r0
    # Rank 0's failure became the job's abort notice: rank 1's later call fails at once.
    name, kind, rank, _, _ = r1["first"]
    assert (name, kind, rank) == ("Aborted", "aborted", 0), r1


def _abort(rank, world):
    c = _from_env(rank, world)
    _KEEP.append(c)
    c.barrier()
    if rank == 0:
        c.abort("stop, says rank 0")
    try:
        t0 = time.monotonic()
        for _ in range(10000):
            c.all_reduce(np.ones(1000, dtype=np.float32))
    except ringcc.Aborted as e:
        return e.rank, "stop, says rank 0" in str(e), time.monotonic() - t0
    return None


@pytest.mark.deadline(60)
def test_abort_reaches_every_rank_with_its_rank_and_reason():
    for rank, said, dt in check(run(_abort, 3, deadline=40)):
        assert rank == 0 and said and dt < 5


def _mismatch(rank, world):
    c = _from_env(rank, world)
    try:
        c.all_reduce(np.ones(100 + rank, dtype=np.float32))
    except ringcc.Error as e:
        return type(e).__name__
    return None


@pytest.mark.deadline(60)
def test_mismatched_counts_fail_on_every_rank():
    res = check(run(_mismatch, 3, deadline=40))
    assert all(r in ("Mismatch", "Aborted") for r in res) and "Mismatch" in res, res
