"""Which queues this process must not start jobs of, and handing a message back to its queue.

``paused_queues`` is the process's copy of the paused queues, written by one refresher thread
(``composition.queues.refresher``) and read where it costs a set lookup: a consumer of a paused
queue stops fetching (Redis) or cancels its subscription (RabbitMQ), and the ``PausedQueues``
middleware hands back what was prefetched before the pause. A message marked with
``hand_back()`` goes back to its queue where it would have been acknowledged: requeued on
Redis, ``basic_nack(requeue=True)`` on RabbitMQ, so it keeps its id and delivery count and runs
later, elsewhere or here.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

__all__ = ["HAND_BACK_OPTION", "LOCAL_OPTIONS", "PUT_BACK_OPTION", "PausedQueueSet", "hand_back", "handed_back",
           "paused_queues"]

# Keys of a fetched message's options, in this process only: a message handed back (or put back,
# composition.jobs.middleware.put_backs) goes back without them.
HAND_BACK_OPTION = "composition_hand_back"
PUT_BACK_OPTION = "composition_put_back"
LOCAL_OPTIONS = (HAND_BACK_OPTION, PUT_BACK_OPTION)


class PausedQueueSet:
    """A set of queue names replaced whole (readers see the old or the new one, never half), and
    a wait that ends at the next change."""

    def __init__(self) -> None:
        self._names: frozenset[str] = frozenset()
        self._changed = threading.Condition()

    def __contains__(self, queue: object) -> bool:
        return queue in self._names

    @property
    def names(self) -> frozenset[str]:
        return self._names

    def replace(self, names: Iterable[str]) -> bool:
        """Make ``names`` the paused queues; True when that changed them (waiters wake)."""
        new = frozenset(names)
        with self._changed:
            if new == self._names:
                return False
            self._names = new
            self._changed.notify_all()
        return True

    def wait(self, timeout_s: float) -> None:
        """Return at the next change, or after ``timeout_s``."""
        with self._changed:
            self._changed.wait(timeout_s)


paused_queues = PausedQueueSet()


def hand_back(message: Any) -> None:
    """Mark a fetched message (a ``MessageProxy``) to go back to its queue instead of being
    acknowledged; its worker thread then skips it (``SkipMessage``)."""
    message.options[HAND_BACK_OPTION] = True


def handed_back(message: Any) -> bool:
    return bool(message.options.get(HAND_BACK_OPTION))
