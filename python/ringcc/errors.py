"""ringcc's errors as exceptions.

Every failure of a call is a :class:`Error` carrying ringcc's typed error:
``kind`` (ringcc's variant name: ``timeout``, ``aborted``, ``bad_buffer``,
``core``, ``peer_gone``, ``poisoned``, ``closed``, ...), ``rank`` (the rank
that aborted, or the peer that is gone or misbehaved), ``channel`` (the
channel that failed), ``waiting_for`` (what a timeout waited for, with the
engine's stall report) and ``after`` (seconds waited); each is ``None``
where the error has none. Subclasses name the failures worth catching
apart; they also derive from the builtin exception of the same meaning
(``Timeout`` is a ``TimeoutError``, ``BadBuffer`` a ``ValueError``).
"""

from __future__ import annotations

__all__ = [
    "Error",
    "Timeout",
    "Aborted",
    "BadBuffer",
    "Mismatch",
    "PeerGone",
    "BadConfig",
    "Poisoned",
    "Closed",
]


class Error(Exception):
    """A ringcc failure; see the module's documentation for the fields."""

    def __init__(
        self,
        message: str,
        *,
        kind: str = "internal",
        rank: int | None = None,
        channel: int | None = None,
        waiting_for: str | None = None,
        after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.rank = rank
        self.channel = channel
        self.waiting_for = waiting_for
        self.after = after

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):
        # Picklable with its fields (multiprocessing hands errors back).
        return (
            _rebuild,
            (type(self), self.message, self.kind, self.rank, self.channel, self.waiting_for, self.after),
        )


def _rebuild(cls, message, kind, rank, channel, waiting_for, after):
    return cls(message, kind=kind, rank=rank, channel=channel, waiting_for=waiting_for, after=after)


class Timeout(Error, TimeoutError):
    """Nothing moved within the deadline (``waiting_for`` says what was awaited)."""


class Aborted(Error):
    """The job was aborted: by ``rank`` (when known), or because a rank failed or vanished."""


class BadBuffer(Error, ValueError):
    """A buffer the call cannot take: wrong size or type, read-only, not contiguous, on a GPU."""


class Mismatch(Error):
    """The ranks made different calls (count, type, op, collective or root)."""


class PeerGone(Error, ConnectionError):
    """A neighbour's connection closed or its process died (``rank``, ``channel``)."""


class BadConfig(Error, ValueError):
    """A configuration that cannot work (a bad argument or ``RINGCC_*`` variable)."""


class Poisoned(Error):
    """The communicator failed earlier and takes no more calls."""


class Closed(Error):
    """The communicator was closed."""


_BY_KIND = {
    "timeout": Timeout,
    "aborted": Aborted,
    "bad_buffer": BadBuffer,
    "peer_gone": PeerGone,
    "bad_config": BadConfig,
    "env": BadConfig,
    "poisoned": Poisoned,
    "closed": Closed,
}


def _from_ringcc(kind, message, rank, channel, waiting_for, after, mismatch):
    """The exception for one of ringcc's errors (called by the extension)."""
    cls = Mismatch if mismatch else _BY_KIND.get(kind, Error)
    return cls(message, kind=kind, rank=rank, channel=channel, waiting_for=waiting_for, after=after)
