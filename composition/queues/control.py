"""Pausing and resuming a queue for every host, durably: ``pause_queue``, ``resume_queue``.

A queue's pause is a ``composition.pauses.Pause`` row of kind ``queue``, as a schedule's is:
audited and shown the same way. Every worker process reads the paused queues every
``QUEUE_PAUSE_REFRESH_S`` (``composition.queues.refresher``) and starts no job of one from then
on; publishing into a paused queue goes on (the outbox commits and relays, the broker keeps the
messages).
"""

from __future__ import annotations

from typing import Any

from composition.broker.configured import configured_broker
from composition.errors import CompositionError
from composition.outbox.relay import RELAY_QUEUE_NAME
from composition.pauses import Pause, pause, paused_names, resume
from composition.sampling.queues import declared_queues

__all__ = ["QueueNotPausable", "checked_queue", "known_queues", "pause_queue", "paused_queue_names", "resume_queue"]


class QueueNotPausable(CompositionError):
    """The name is not a queue of this project, or is the relay's own queue."""


def known_queues() -> list[str]:
    """The queues a pause may name: every queue a declared job uses, and any paused before
    (a queue whose jobs a deploy removed can still be resumed)."""
    return sorted(set(declared_queues(configured_broker()))
                  | set(Pause.objects.filter(kind=Pause.QUEUE).values_list("name", flat=True)))


def checked_queue(name: str) -> str:
    """``name``, when it is a queue of this project other than the relay's; else raises
    ``QueueNotPausable`` saying why."""
    if name == RELAY_QUEUE_NAME:
        raise QueueNotPausable(
            f"{RELAY_QUEUE_NAME!r} is the outbox relay's queue: it carries every queue's jobs to the broker, "
            "and pausing it would stop them all; pause the queues themselves")
    if name not in known_queues():
        known = ", ".join(queue for queue in known_queues() if queue != RELAY_QUEUE_NAME) or "none is declared"
        raise QueueNotPausable(f"no queue named {name!r} (the queues: {known})")
    return name


def pause_queue(name: str, *, by: str, reason: str = "", user: Any = None) -> tuple[Pause, bool]:
    """Pause ``name`` for every host: no job of it starts once each worker has read it (within
    ``QUEUE_PAUSE_REFRESH_S``); running ones finish. Returns the row and whether this call
    changed it. Raises ``QueueNotPausable`` for a name that is not a queue of this project."""
    return pause(Pause.QUEUE, checked_queue(name), by=by, reason=reason, user=user)


def resume_queue(name: str, *, by: str, reason: str = "", user: Any = None) -> tuple[Pause | None, bool]:
    """Undo ``pause_queue``: its waiting messages run again. The row (None when it was never
    paused) and whether this call changed it."""
    return resume(Pause.QUEUE, checked_queue(name), by=by, reason=reason, user=user)


def paused_queue_names() -> frozenset[str]:
    """The queues paused now, as the database says (one query)."""
    return paused_names(Pause.QUEUE)
