"""ringcc from Python.

A :class:`Communicator` is one rank of a job (one process per rank, as
NCCL's); its collectives take numpy arrays, any buffer-protocol or DLPack
object and CPU torch tensors, in place or out of place, blocking (the GIL
released while the call runs) or asynchronous (:class:`Work`). Failures
raise :class:`ringcc.Error` subclasses carrying ringcc's typed error.

>>> comm = ringcc.Communicator.from_env()            # under torchrun / mpirun / srun
>>> comm.all_reduce(grads)                           # in place, sum
>>> w = comm.all_reduce(x, op="max", async_op=True)  # a Work
>>> w.wait()

The torch.distributed backend is :mod:`ringcc.distributed`
(``dist.init_process_group("ringcc")``).
"""

from __future__ import annotations

import atexit
import weakref

from . import errors
from ._buffers import as_buffer
from ._ringcc import Communicator as _Communicator
from ._ringcc import Work, __version__, dtypes
from .errors import Aborted, BadBuffer, BadConfig, Closed, Error, Mismatch, PeerGone, Poisoned, Timeout

__all__ = [
    "Communicator",
    "Work",
    "dtypes",
    "errors",
    "Error",
    "Timeout",
    "Aborted",
    "BadBuffer",
    "Mismatch",
    "PeerGone",
    "BadConfig",
    "Poisoned",
    "Closed",
    "__version__",
]

# Communicators still open, closed at interpreter exit (before the
# interpreter stops taking calls from the communicators' threads).
_live: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for c in list(_live):
        try:
            c.close()
        except Error:
            pass


def _buffers(buf, out, dtype):
    b, d = as_buffer(buf, "input" if out is not None else "in-place")
    if out is None:
        return b, None, dtype or d
    o, d2 = as_buffer(out, "output")
    return b, o, dtype or d or d2


class Communicator:
    """One rank of a job.

    ``Communicator(rank, world_size, store, *, token=None, timeout=None,
    bind_toward=None)`` joins over ``store``, any object with torch
    ``Store``'s ``set``/``get``/``add``/``check``/``wait`` (one store, or
    one prefix of it, per communicator); :meth:`from_env` joins the job a
    launcher described. ``timeout`` (seconds or ``timedelta``) bounds
    connecting and every call (nothing moving that long fails the call on
    every rank).
    """

    __slots__ = ("_c", "__weakref__")

    def __init__(self, rank: int, world_size: int, store, *, token=None, timeout=None, bind_toward=None):
        self._c = _Communicator(rank, world_size, store, token=token, timeout=timeout, bind_toward=bind_toward)
        _live.add(self)

    @classmethod
    def _wrap(cls, c: _Communicator | None) -> Communicator | None:
        if c is None:
            return None
        self = cls.__new__(cls)
        self._c = c
        _live.add(self)
        return self

    @classmethod
    def from_env(cls) -> Communicator:
        """The communicator of this process from the launcher's environment
        (torchrun's RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT, mpirun,
        srun or RINGCC_*); rank 0 serves ringcc's own store."""
        return cls._wrap(_Communicator.from_env())

    rank = property(lambda self: self._c.rank, doc="This rank.")
    world_size = property(lambda self: self._c.world_size, doc="Number of ranks.")
    hops = property(lambda self: self._c.hops, doc="Per channel, the transports out and in.")
    options = property(lambda self: self._c.options, doc="The settings in use.")
    calls = property(lambda self: self._c.calls, doc="Calls completed so far.")
    closed = property(lambda self: self._c.closed, doc="Whether close() was called.")

    def all_reduce(self, buf, op: str = "sum", *, out=None, async_op: bool = False, dtype: str | None = None):
        """Every rank ends with the reduction (sum, prod, min, max, avg) of every rank's ``buf``,
        in ``buf`` or in ``out``. Returns a :class:`Work` with ``async_op=True``, else None."""
        b, o, d = _buffers(buf, out, dtype)
        return self._c.all_reduce(b, op, out=o, async_op=async_op, dtype=d)

    def reduce_scatter(self, buf, op: str = "sum", *, out=None, async_op: bool = False, dtype: str | None = None):
        """``buf`` holds world_size equal blocks; rank r ends with block r of the reduction,
        in ``out`` or in its block of ``buf``."""
        b, o, d = _buffers(buf, out, dtype)
        return self._c.reduce_scatter(b, op, out=o, async_op=async_op, dtype=d)

    def all_gather(self, buf, *, out=None, async_op: bool = False, dtype: str | None = None):
        """Block r of the result is rank r's input: ``buf`` into ``out`` (world_size blocks),
        or in place (``buf`` holds every block; this rank's input is block ``rank``)."""
        b, o, d = _buffers(buf, out, dtype)
        return self._c.all_gather(b, out=o, async_op=async_op, dtype=d)

    def broadcast(self, buf, root: int, *, out=None, async_op: bool = False, dtype: str | None = None):
        """Every rank ends with ``root``'s ``buf``, in ``buf`` or in ``out``."""
        b, o, d = _buffers(buf, out, dtype)
        return self._c.broadcast(b, root, out=o, async_op=async_op, dtype=d)

    def reduce(self, buf, root: int, op: str = "sum", *, out=None, async_op: bool = False, dtype: str | None = None):
        """``root`` ends with the reduction of every rank's ``buf``, in ``buf`` or in ``out``."""
        b, o, d = _buffers(buf, out, dtype)
        return self._c.reduce(b, root, op, out=o, async_op=async_op, dtype=d)

    def barrier(self) -> None:
        """Waits until every rank has reached this point."""
        self._c.barrier()

    def split(self, color: int | None, key: int = 0) -> Communicator | None:
        """A sub-communicator of the ranks giving the same ``color`` (``None``: none), ranked by
        ``(key, rank)``. Every rank must call it."""
        return Communicator._wrap(self._c.split(color, key))

    def abort(self, reason: str = "aborted from Python") -> None:
        """Every rank's current and later calls fail with :class:`Aborted`. Returns at once."""
        self._c.abort(reason)

    def close(self) -> None:
        """Finishes queued calls and closes the connections (raises a failure nobody waited for)."""
        _live.discard(self)
        self._c.close()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return repr(self._c)
