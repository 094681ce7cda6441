"""In-process coalescing: at most one rebuild per key at a time in this process.

The first thread to ask for a key leads its flight and rebuilds; threads asking for the same key
meanwhile join the flight and wait for the leader's payload, or its exception, as long as another
process would wait for the lease. The lease in Redis does the same across processes; this keeps
a process's own threads from queueing on it. A joiner takes the leader's value only if the
leader's read (its ACQUIRE or its loader) began after the joiner did (``tick``, ``Flight.read_at``)
or its lease still stands in Redis (``Flight.lease``): else the value may predate a write the
joiner must see, and it waits for the next flight.
"""

from __future__ import annotations

import itertools
import threading

from composition.cache.invalidation import KIND_NAMESPACE

__all__ = ["Flight", "Flights", "tick"]

_order = itertools.count(1)


def tick() -> int:
    """A number greater than every one handed out before, in any thread of this process."""
    return next(_order)


class Flight:
    """One in-process rebuild that other threads asking for the same key wait on."""

    def __init__(self, key: str) -> None:
        self.key = key
        self._done = threading.Event()
        self._payload: bytes | None = None
        self._error: BaseException | None = None
        self._leader = threading.get_ident()
        # (token, version) of the rebuild lease the leader holds, once it holds one: an
        # invalidation by another process deletes that lease or bumps the version, and a caller
        # who sees that must not take what the leader loaded (it may predate the write).
        self.lease: tuple[str, bytes] | None = None
        # The ``tick`` at which the leader's last read began (0: none yet). A caller whose own
        # tick is earlier began before that read, so any write finished before it is in the value.
        self.read_at = 0

    def reading(self) -> None:
        """The leader is about to read (send ACQUIRE, or run the loader)."""
        self.read_at = tick()

    def wait(self, timeout_s: float) -> bytes | None:
        """The leader's payload once it landed, None after ``timeout_s`` (the leader is still
        loading); raises the leader's exception instead, and RuntimeError in the leader's own
        thread (its loader asked for the key it loads: it would wait on itself for good)."""
        if self._leader == threading.get_ident():
            raise RuntimeError(f"the loader of cache key {self.key!r} asked for that key itself")
        if not self._done.wait(timeout_s):
            return None
        if self._error is not None:
            raise self._error
        assert self._payload is not None
        return self._payload


class Flights:
    """The flights in progress, by key. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flights: dict[str, Flight] = {}

    def join(self, key: str) -> tuple[Flight, bool]:
        """The flight of ``key`` and whether the caller leads it: a leader must ``land`` it."""
        with self._lock:
            flight = self._flights.get(key)
            if flight is not None:
                return flight, False
            flight = self._flights[key] = Flight(key)
            return flight, True

    def land(self, key: str, flight: Flight, *, payload: bytes | None = None,
             error: BaseException | None = None) -> None:
        """End the leader's flight with its ``payload`` or ``error`` and wake the waiters."""
        flight._payload, flight._error = payload, error
        with self._lock:
            if self._flights.get(key) is flight:  # not if detached (and maybe replaced) meanwhile
                del self._flights[key]
        flight._done.set()

    def leave(self, key: str, flight: Flight) -> tuple[Flight, bool]:
        """``flight`` is outdated for the caller: detach it (unless replaced already) and join
        the key's flight anew, as ``join``."""
        with self._lock:
            if self._flights.get(key) is flight:
                del self._flights[key]
        return self.join(key)

    def detach(self, key: str) -> None:
        """An invalidation of ``key`` was applied: a rebuild in flight may have read the data
        before the write, so callers from now on start a new one instead of joining it (those
        that joined before the write keep waiting for it, as any read racing a write may)."""
        with self._lock:
            self._flights.pop(key, None)

    def detach_invalidated(self, kind: str, target: str) -> None:
        """An invalidation (``KIND_KEY`` or ``KIND_NAMESPACE``, see ``composition.cache.invalidation``)
        was applied: a rebuild in flight may hold the data as it was before the write; its fill is
        refused (the lease went with the entry), and callers from now on must not get its value."""
        if kind == KIND_NAMESPACE:
            self.detach_namespace(target)
        else:
            self.detach(target)

    def detach_namespace(self, namespace: str) -> None:
        """``detach`` every key of ``namespace`` (the text before a key's first ``:``)."""
        with self._lock:
            for key in [key for key in self._flights if key.split(":", 1)[0] == namespace]:
                del self._flights[key]
