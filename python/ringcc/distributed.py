"""ringcc as a ``torch.distributed`` backend named ``"ringcc"``.

    import torch.distributed as dist
    dist.init_process_group("ringcc")        # under torchrun (env://), or with
                                             # init_method= / store=, rank=, world_size=

The package's entry point (``torch.distributed.backends``) registers the
backend when torch first meets the name; importing this module (or calling
:func:`register`) does it too.

Each process group is a :class:`ProcessGroup` over one ringcc communicator,
bootstrapped through the store torch already built for the group (the
``store``, rank, size and timeout torch hands the backend's creator: no
second rendezvous). The group's timeout is the communicator's deadline:
a call on which nothing moves that long fails on every rank, and a rank
that dies stops the survivors' calls within milliseconds (the transports
see it go) or at that deadline.

Ops: allreduce (SUM, PRODUCT, MIN, MAX, AVG: SUM then one division, as
the reference ``sum / world_size``), allreduce_coalesced, broadcast,
allgather, all_gather_into_tensor (``_allgather_base``), reduce_scatter,
reduce_scatter_tensor (``_reduce_scatter_base``), reduce and barrier, on
CPU tensors of float32, float64, float16, bfloat16, int8, uint8, int32 and
int64 (and uint32 / uint64). Non-contiguous tensors are copied into
contiguous ones and the results copied back. CUDA tensors are refused
(:class:`ringcc.BadBuffer`) until the CUDA per-process communicator
exists.

Work: a blocking op (``async_op=False``) runs in the caller's thread with
the GIL released and returns a finished Work; an asynchronous one is
queued, and a completer thread per group finishes its Work's future (the
results copied back, AVG divided) in issue order. ``wait()`` raises the
call's :class:`ringcc.Error`; ``is_completed()``, ``exception()`` and
``get_future()`` (what DDP's reducer chains its hooks on) tell the rest.
Torch's C++ callers (DDP) see the work through torch's wrapper, which
forwards ``wait`` and ``get_future`` only.
"""

from __future__ import annotations

import datetime
import os
import queue
import threading

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from . import Communicator
from ._buffers import tensor_buffer
from .errors import BadBuffer, BadConfig, Error, Timeout

__all__ = ["ProcessGroup", "register", "BACKEND"]

BACKEND = "ringcc"

_RED = ReduceOp.RedOpType
_OPS = {_RED.SUM: "sum", _RED.PRODUCT: "prod", _RED.MIN: "min", _RED.MAX: "max"}
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _op_name(reduce_op, dtype) -> tuple[str, bool]:
    """ringcc's op and whether the result is divided by the group size
    afterwards (AVG on floating-point tensors)."""
    kind = getattr(reduce_op, "op", reduce_op)
    if kind == _RED.AVG:
        # Floats: SUM, then the division torch would do (bit for bit the
        # reference `sum / world_size`); integers: ringcc's AVG (the wrapped
        # sum divided, truncating).
        return ("sum", True) if dtype in _FLOATS else ("avg", False)
    if kind in _OPS:
        return _OPS[kind], False
    raise BadConfig(f"ringcc: reduce op {reduce_op} is not supported (SUM, PRODUCT, MIN, MAX, AVG)", kind="bad_config")


def _contiguous(t: torch.Tensor, which: str) -> torch.Tensor:
    """``t`` itself if contiguous, else a contiguous copy (the caller copies
    results back)."""
    if t.device.type != "cpu":
        tensor_buffer(t, which)  # raises the CUDA message
    return t if t.is_contiguous() else t.contiguous()


class _Completer:
    """One thread per group that waits for queued calls in issue order and
    finishes their futures (post-processing first)."""

    def __init__(self, name: str) -> None:
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=f"ringcc-completer-{name}", daemon=True)
        self._thread.start()

    def put(self, works, post, fut, result) -> None:
        self._q.put((works, post, fut, result))

    def _run(self) -> None:
        while True:
            try:
                item = self._q.get(timeout=1.0)
            except queue.Empty:
                if self._stop:
                    return
                continue
            if item is None:
                return
            works, post, fut, result = item
            try:
                # Each wait ends within the communicator's deadline.
                for w in works:
                    w.wait()
                if post is not None:
                    post()
            except BaseException as e:  # noqa: BLE001 - handed to the waiter
                fut.set_exception(e)
            else:
                fut.set_result(result)

    def stop(self, timeout: float) -> None:
        self._stop = True
        self._q.put(None)
        self._thread.join(timeout)


class _Work(dist._Work):
    """A ringcc call as torch's Work."""

    def __init__(self, fut: torch.futures.Future, works=()) -> None:
        super().__init__()
        self._fut = fut
        self._works = works

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        secs = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
        if secs:  # torch passes timedelta(0) for "no limit of the caller's"
            for w in self._works:
                if not w.wait(secs):
                    raise Timeout(f"ringcc: the call is still running after {secs} s", kind="timeout", after=secs)
        self._fut.wait()  # raises the call's error
        return True

    def is_completed(self) -> bool:
        return self._fut.done()

    def is_success(self) -> bool:
        return self._fut.done() and self.exception() is None

    def exception(self):
        if not self._fut.done():
            return None
        try:
            self._fut.value()
        except Exception as e:  # noqa: BLE001 - returned, not raised
            return e
        return None

    def get_future(self) -> torch.futures.Future:
        return self._fut

    def result(self):
        return self._fut.value()


def _done(result) -> _Work:
    fut = torch.futures.Future()
    fut.set_result(result)
    return _Work(fut)


class ProcessGroup(dist.ProcessGroup):
    """A torch process group over a ringcc communicator."""

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta | None = None, *, name: str = "") -> None:
        try:
            super().__init__(store, rank, size)
        except TypeError:  # a torch without the (store, rank, size) constructor
            super().__init__(rank, size)
        toward = None
        if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
            toward = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        self._rank = rank
        self._size = size
        self._name = name
        self._comm = Communicator(rank, size, store, timeout=timeout, bind_toward=toward)
        self._completer: _Completer | None = None
        self._lock = threading.Lock()

    # -- what torch asks of a process group -------------------------------

    def getBackendName(self) -> str:
        return BACKEND

    def getRank(self) -> int:
        return self._rank

    def getSize(self) -> int:
        return self._size

    @property
    def communicator(self) -> Communicator:
        """The ringcc communicator under this group."""
        return self._comm

    # -- running calls ------------------------------------------------------

    def _issue(self, async_op: bool, calls, post, result) -> _Work:
        """Runs ``calls`` (each ``f(async_op) -> ringcc Work | None``), then
        ``post``; the work's future holds ``result``."""
        if not async_op:
            for c in calls:
                c(False)
            if post is not None:
                post()
            return _done(result)
        works = [w for w in (c(True) for c in calls) if w is not None]
        fut = torch.futures.Future()
        with self._lock:
            if self._completer is None:
                self._completer = _Completer(self._name or str(id(self)))
            self._completer.put(works, post, fut, result)
        return _Work(fut, works)

    def _in_place(self, method, t: torch.Tensor, *args, **kw):
        """A call in place on tensor ``t`` (contiguous)."""
        b, d = tensor_buffer(t)
        return lambda a: method(b, *args, async_op=a, dtype=d, **kw)

    def _apart(self, method, i: torch.Tensor, o: torch.Tensor, *args, **kw):
        """A call from tensor ``i`` into tensor ``o`` (both contiguous)."""
        if i.dtype != o.dtype:
            raise BadBuffer(f"ringcc: input is {i.dtype}, output {o.dtype}", kind="bad_buffer")
        ib, d = tensor_buffer(i, "input")
        ob, _ = tensor_buffer(o, "output")
        return lambda a: method(ib, *args, out=ob, async_op=a, dtype=d, **kw)

    @staticmethod
    def _copy_back(pairs, div: int | None = None):
        """After the call: divide (AVG) and copy contiguous stand-ins back."""
        todo = [(t, c) for t, c in pairs if c is not t]
        if not todo and not div:
            return None

        def post():
            for t, c in pairs:
                if div:
                    c.div_(div)
                if c is not t:
                    t.copy_(c)

        return post

    # -- the collectives ----------------------------------------------------

    def allreduce(self, tensors, opts=None):
        opts = opts or dist.AllreduceOptions()
        calls, pairs, div = [], [], None
        for t in tensors:
            c = _contiguous(t, "allreduce")
            op, divide = _op_name(opts.reduceOp, c.dtype)
            div = self._size if divide else div
            calls.append(self._in_place(self._comm._c.all_reduce, c, op))
            pairs.append((t, c))
        return self._issue(opts.asyncOp, calls, self._copy_back(pairs, div), list(tensors))

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts or dist.AllreduceCoalescedOptions()
        o = dist.AllreduceOptions()
        o.reduceOp, o.asyncOp = opts.reduceOp, opts.asyncOp
        return self.allreduce(tensors, o)

    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        calls, pairs = [], []
        for t in tensors:
            c = _contiguous(t, "broadcast")
            calls.append(self._in_place(self._comm._c.broadcast, c, opts.rootRank))
            pairs.append((t, c))
        return self._issue(opts.asyncOp, calls, self._copy_back(pairs), list(tensors))

    def reduce(self, tensors, opts=None):
        opts = opts or dist.ReduceOptions()
        calls, pairs, div = [], [], None
        for t in tensors:
            c = _contiguous(t, "reduce")
            op, divide = _op_name(opts.reduceOp, c.dtype)
            div = self._size if divide else div
            calls.append(self._in_place(self._comm._c.reduce, c, opts.rootRank, op))
            pairs.append((t, c))
        if div and self._rank != opts.rootRank:
            div = None  # only the root's tensor holds the sum
        return self._issue(opts.asyncOp, calls, self._copy_back(pairs, div), list(tensors))

    def _allgather_base(self, output, input, opts=None):
        opts = opts or dist.AllgatherOptions()
        if output.numel() != input.numel() * self._size:
            raise BadBuffer(
                f"ringcc: all_gather_into_tensor needs an output of {self._size} × {input.numel()} elements, "
                f"got {output.numel()}",
                kind="bad_buffer",
            )
        i, o = _contiguous(input, "input"), _contiguous(output, "output")
        call = self._apart(self._comm._c.all_gather, i.reshape(-1), o.reshape(-1))
        return self._issue(opts.asyncOp, [call], self._copy_back([(output, o)]), [output])

    all_gather_single = _allgather_base

    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.AllgatherOptions()
        calls, posts = [], []
        for outs, inp in zip(output_tensors, input_tensors):
            if len(outs) != self._size or any(o.numel() != inp.numel() for o in outs):
                raise BadBuffer(
                    f"ringcc: all_gather needs {self._size} output tensors of {inp.numel()} elements each",
                    kind="bad_buffer",
                )
            i = _contiguous(inp, "input").reshape(-1)
            flat = torch.empty(self._size * i.numel(), dtype=i.dtype)
            calls.append(self._apart(self._comm._c.all_gather, i, flat))
            posts.append((outs, flat, i.numel()))

        def post():
            for outs, flat, n in posts:
                for r, o in enumerate(outs):
                    o.copy_(flat[r * n : (r + 1) * n].view_as(o))

        return self._issue(opts.asyncOp, calls, post, [list(o) for o in output_tensors])

    def _reduce_scatter_base(self, output, input, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        if input.numel() != output.numel() * self._size:
            raise BadBuffer(
                f"ringcc: reduce_scatter_tensor needs an input of {self._size} × {output.numel()} elements, "
                f"got {input.numel()}",
                kind="bad_buffer",
            )
        i, o = _contiguous(input, "input"), _contiguous(output, "output")
        op, divide = _op_name(opts.reduceOp, o.dtype)
        call = self._apart(self._comm._c.reduce_scatter, i.reshape(-1), o.reshape(-1), op)
        post = self._copy_back([(output, o)], self._size if divide else None)
        return self._issue(opts.asyncOp, [call], post, [output])

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        calls, pairs, div = [], [], None
        for out, ins in zip(output_tensors, input_tensors):
            if len(ins) != self._size or any(t.numel() != out.numel() for t in ins):
                raise BadBuffer(
                    f"ringcc: reduce_scatter needs {self._size} input tensors of {out.numel()} elements each",
                    kind="bad_buffer",
                )
            for t in ins:
                _contiguous(t, "input")  # refuses CUDA tensors
            flat = torch.cat([t.reshape(-1) for t in ins])
            o = _contiguous(out, "output")
            op, divide = _op_name(opts.reduceOp, o.dtype)
            div = self._size if divide else div
            calls.append(self._apart(self._comm._c.reduce_scatter, flat, o.reshape(-1), op))
            pairs.append((out, o))
        return self._issue(opts.asyncOp, calls, self._copy_back(pairs, div), list(output_tensors))

    def barrier(self, opts=None):
        self._comm.barrier()
        return _done(None)

    # -- lifetime -----------------------------------------------------------

    def shutdown(self) -> None:
        """Closes the communicator (``destroy_process_group``)."""
        if self._comm.closed:
            return
        if self._completer is not None:
            self._completer.stop(timeout=self._comm.options["timeout"] + 5.0)
        self._comm.close()

    def abort(self) -> None:
        """Aborts the job: every rank's calls on this group fail."""
        try:
            self._comm.abort("torch.distributed abort")
        except Error:
            pass

    def __repr__(self) -> str:
        return f"<ringcc.distributed.ProcessGroup rank {self._rank} of {self._size}>"


def _create(store, rank, size, timeout):
    return ProcessGroup(store, rank, size, timeout)


def register() -> None:
    """Registers the backend ``"ringcc"`` with torch.distributed (the
    package's entry point calls it; calling it again does nothing)."""
    plugins = getattr(dist.Backend, "_plugins", {})
    if BACKEND.upper() in plugins:
        return
    dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])


register()
