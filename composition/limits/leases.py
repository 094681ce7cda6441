"""The concurrency slots this process holds, and ``SlotRenewer``, which keeps them while their
jobs run.

A slot is a lease of ``LIMIT_SLOT_TTL_S``: a job may run far longer (``timeout_s=120``), so one
thread renews every slot of the process every third of the TTL, in one script call per job. A
process that dies stops renewing, and its slots come back within the TTL; a process that cannot
reach Redis for a whole TTL loses them (logged: the limit may then be exceeded by its runs).
"""

from __future__ import annotations

import threading

import structlog

from composition.conf import conf
from composition.lifecycle.periodic import PeriodicComponent
from composition.limits.store import limit_store

__all__ = ["HeldSlots", "SlotRenewer", "held_slots"]

log = structlog.get_logger("composition.limits")


class HeldSlots:
    """Job name → the tokens of the slots its runs in this process hold."""

    def __init__(self) -> None:
        self._tokens: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def add(self, actor: str, token: str) -> None:
        with self._lock:
            self._tokens.setdefault(actor, set()).add(token)

    def discard(self, actor: str, token: str) -> bool:
        """Forget ``token``; False when it was not held (its run has ended already)."""
        with self._lock:
            tokens = self._tokens.get(actor)
            if tokens is None or token not in tokens:
                return False
            tokens.discard(token)
            if not tokens:
                del self._tokens[actor]
            return True

    def snapshot(self) -> dict[str, list[str]]:
        with self._lock:
            return {actor: list(tokens) for actor, tokens in self._tokens.items()}

    def count(self) -> int:
        with self._lock:
            return sum(len(tokens) for tokens in self._tokens.values())


held_slots = HeldSlots()


class SlotRenewer(PeriodicComponent):
    """Renews this process's slots every third of ``LIMIT_SLOT_TTL_S`` (see module doc); started
    before the worker threads and stopped after their drain."""

    name = "limit-slots"
    depends_on = ("cache",)
    stop_on_drain = False  # running jobs keep their slots until the drain ends them
    failure_event = "could not renew the job limits' slots; they expire unless renewed in time"
    logger = log

    @property
    def interval_s(self) -> float:
        return float(conf.LIMIT_SLOT_TTL_S) / 3

    def tick(self) -> None:
        store = limit_store()
        for actor, tokens in held_slots.snapshot().items():
            for token in store.renew(actor, tokens):
                # A run that ended since the snapshot released its slot (forgetting it first):
                # nothing expired. Otherwise it is still running while the slot may be someone
                # else's: the limit may be exceeded until this run ends. Release nothing of theirs.
                if held_slots.discard(actor, token):
                    log.warning("a running job's concurrency slot expired before it was renewed", actor=actor)
