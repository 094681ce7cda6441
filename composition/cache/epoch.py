"""The cache's epoch as this process last read it: the part of every entry's version that is new
after Redis restarts or fails over (``composition.cache.store`` says why). Read, and installed
anew when the running server is another (``composition.cache._scripts.ENSURE_EPOCH``), at most
once per ``EPOCH_CHECK_S`` and at once after the breaker closes."""

from __future__ import annotations

import secrets
import threading
import time

import structlog

from composition.cache.store import LeaseStore
from composition.errors import REDIS_ERRORS

__all__ = ["CHECK_WAIT_S", "EPOCH_CHECK_S", "Epoch"]

log = structlog.get_logger("composition.cache")

# How long entries a restarted Redis brought back from an older snapshot can still be served
# by a process, at most.
EPOCH_CHECK_S = 1.0
# How long a thread waits for another's check before going on with the epoch it has: a check is
# one round trip, but against a Redis that hangs it lasts the socket's timeout.
CHECK_WAIT_S = 0.1


class Epoch:
    """The epoch of one cache alias (its Redis key ``key``), as this process knows it."""

    def __init__(self, store: LeaseStore, key: str, alias: str) -> None:
        self._store = store
        self._key = key
        self._alias = alias
        self._due = 0.0  # time.monotonic() of the next check
        self._checking = threading.Lock()
        self._rechecks = 0  # recheck() calls: one during a check is not lost when the check ends
        # Only a check sets it: a stale value sends hits to the slow path, whose scripts read the
        # real one, until the next check.
        self.value = b""

    def current(self) -> bytes:
        """The epoch, checked first when a check is due."""
        # The other threads wait for the one check (a while: CHECK_WAIT_S) rather than go on with
        # the epoch it replaces: right after a new one was installed, their rebuilds were
        # versioned before it, refused at the fill, and the key loaded twice.
        if time.monotonic() >= self._due and self._checking.acquire(timeout=CHECK_WAIT_S):
            try:
                if time.monotonic() >= self._due:
                    self._check()
            finally:
                self._checking.release()
        return self.value

    def recheck(self) -> None:
        """Check before the next read (Redis answers again: maybe a restarted one)."""
        self._rechecks += 1
        self._due = 0.0

    def _check(self) -> None:
        asked = self._rechecks
        try:
            installed, self.value = self._store.ensure_epoch(self._key, secrets.token_hex(8), self.value)
        except REDIS_ERRORS:
            return  # the read that follows finds Redis failing, and counts it
        finally:
            self._due = time.monotonic() + EPOCH_CHECK_S if self._rechecks == asked else 0.0
        if installed:
            log.info("cache epoch installed: what Redis held before is a miss", alias=self._alias)
