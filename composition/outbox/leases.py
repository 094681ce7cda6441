"""Lease renewal: a relay's rows stay leased to it for as long as it works on them.

While a batch is in flight (``holding()``, from claim to mark-sent) a ``LeaseKeeper`` thread renews
its rows' leases every third of ``OUTBOX_LEASE_S``, conditional on the claimant, so a slow batch
never loses its rows to the sweep (sent twice, a key's later rows overtaking them). A dead relay's
rows are free one lease after their last renewal. The thread starts on demand, ends after
``IDLE_EXIT_S`` with nothing held, and holds a database connection only while it renews.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import structlog
from django.db import connection

from composition.errors import described
from composition.outbox.claims import renew

__all__ = ["IDLE_EXIT_S", "RENEW_SHARE", "LeaseKeeper"]

log = structlog.get_logger("composition.outbox.relay")

# A held batch is renewed once this share of its lease has passed since its claim (or its last
# renewal); the keeper looks twice as often, so a lease is renewed by half its length at worst.
RENEW_SHARE = 1 / 3
# With nothing held for this long the thread ends (a new batch starts it again).
IDLE_EXIT_S = 30.0


@dataclass
class _Hold:
    ids: set[int]
    lease_s: float
    renewed_at: float  # time.monotonic() when the current lease began (at the latest)


Renew = Callable[[Sequence[int], float, str], set[int]]


def _renew(ids: Sequence[int], lease_s: float, relay_id: str) -> set[int]:
    return renew(ids, lease_s=lease_s, relay_id=relay_id)


class LeaseKeeper:
    """Renews the leases of the rows ``relay_id`` holds while they are held (see module doc).

    Thread-safe. ``renew`` (ids, lease_s, relay_id) -> the ids still held is the renewal
    statement (``composition.outbox.claims.renew`` by default).
    """

    def __init__(self, relay_id: str, *, renew: Renew = _renew, idle_exit_s: float = IDLE_EXIT_S) -> None:
        self.relay_id = relay_id
        self._renew = renew
        self.idle_exit_s = idle_exit_s
        self._cond = threading.Condition()
        self._held: dict[int, _Hold] = {}
        self._tokens = itertools.count()
        self._thread: threading.Thread | None = None
        self._tick_s = 0.0
        self.renewals = 0  # statements run, for tests and operators

    @contextmanager
    def holding(self, ids: Sequence[int], *, lease_s: float, since: float) -> Iterator[None]:
        """Keep the leases of ``ids`` (``lease_s`` seconds long, the current one begun at
        ``since``, a ``time.monotonic()`` value taken before the statement that set it) renewed
        until the block ends."""
        if not ids:
            yield
            return
        token = next(self._tokens)
        tick_s = lease_s * RENEW_SHARE / 2
        with self._cond:
            self._held[token] = _Hold(set(ids), lease_s, since)
            if self._thread is None:
                self._tick_s = tick_s
                self._thread = threading.Thread(target=self._run, name="outbox-lease-keeper", daemon=True)
                self._thread.start()
            elif tick_s < self._tick_s:
                self._tick_s = tick_s
                self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                del self._held[token]

    def held(self) -> set[int]:
        """The ids held now."""
        with self._cond:
            return set().union(*(hold.ids for hold in self._held.values()))

    def renew_due(self) -> int:
        """Renew every held batch whose lease is due for it; return how many rows were renewed."""
        now = time.monotonic()
        with self._cond:
            due = [(token, hold) for token, hold in self._held.items()
                   if hold.ids and now - hold.renewed_at >= hold.lease_s * RENEW_SHARE]
        renewed = 0
        for lease_s in {hold.lease_s for _, hold in due}:
            batch = [(token, hold) for token, hold in due if hold.lease_s == lease_s]
            ids = sorted(set().union(*(hold.ids for _, hold in batch)))
            started = time.monotonic()
            kept = self._renew(ids, lease_s, self.relay_id)
            self.renewals += 1
            renewed += len(kept)
            with self._cond:
                for token, hold in batch:
                    if token in self._held:
                        # Rows not renewed were marked sent or taken over: nothing to keep for them.
                        hold.ids &= kept
                        hold.renewed_at = started
        return renewed

    def _run(self) -> None:
        idle_since = time.monotonic()
        try:
            while True:
                with self._cond:
                    if self._held:
                        idle_since = time.monotonic()
                        self._tick_s = min(hold.lease_s for hold in self._held.values()) * RENEW_SHARE / 2
                    elif time.monotonic() - idle_since >= self.idle_exit_s:
                        self._thread = None
                        return
                    self._cond.wait(self._tick_s)
                try:
                    if self.renew_due():
                        log.debug("outbox leases renewed", relay_id=self.relay_id)
                except Exception as exc:
                    # The next tick tries again; should the lease run out meanwhile, the rows are
                    # claimed again and sent twice, which at-least-once delivery allows.
                    log.warning("could not renew outbox leases", error=described(exc))
                finally:
                    # Renewals are rare (only batches longer than a third of a lease): hold no
                    # connection between them.
                    if connection.connection is not None:
                        connection.close()
        except BaseException:
            with self._cond:
                self._thread = None
            raise
