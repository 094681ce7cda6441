"""The order in which one worker process takes work from its queues (``runworkers --queues``).

``QueueOrder`` is the parsed value: ``critical,default,bulk`` (strict) or
``critical=4,default=2,bulk=1`` (weighted). ``OrderedWorkQueue`` replaces Dramatiq's shared work
queue to follow it. The outbox relay's queue, when listed, is served ahead of every other queue
and takes no weight: it carries every queue's jobs to the broker and each of its jobs is a short,
bounded round. What a changer must not break: ``Queue.get`` waits on ``_qsize()``, so ``_qsize()``
counts exactly what the calling thread may take now, and a thread ending work of a capped queue
wakes a waiting one (``task_done``).
"""

from __future__ import annotations

import heapq
import queue
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dramatiq.common import q_name

from composition.outbox.relay_actor import RELAY_QUEUE_NAME

if TYPE_CHECKING:
    from dramatiq.worker import _WorkQueueItem

__all__ = ["OrderedWorkQueue", "QueueOrder"]

_WEIGHT = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class QueueOrder:
    """Queues in the order a free worker thread takes from them.

    ``weights`` None is strict: a free thread always takes from the first non-empty queue. With
    weights, free threads share the queues in proportion to them (smooth weighted round-robin),
    and ``reserved_threads`` of the process's threads are kept for the first queue.
    ``relay_listed``: the relay queue was listed too; it is served ahead of ``names``.
    ``str(order)`` is the ``--queues`` text that parses back to it.
    """

    names: tuple[str, ...]
    weights: tuple[int, ...] | None = None
    relay_listed: bool = False

    @classmethod
    def parse(cls, spec: str | Sequence[str]) -> QueueOrder:
        """``"a,b,c"``, ``"a=4,b=2,c=1"``, or a list of such entries (the ``WORKER_QUEUES``
        setting). Raises ValueError for no queue, an empty or repeated name, weighted and
        unweighted queues mixed, a weight that is not a whole number of at least 1, or a weight
        on the relay queue."""
        entries = spec.split(",") if isinstance(spec, str) else list(spec)
        if not any(str(entry).strip() for entry in entries):
            raise ValueError(f"{spec!r} names no queue (leave it out to consume every queue)")
        names: list[str] = []
        weights: list[int | None] = []
        relay_listed = False
        for entry in entries:
            name, has_weight, weight_text = str(entry).partition("=")
            name, weight_text = name.strip(), weight_text.strip()
            if not name:
                raise ValueError(f"{spec!r} has an empty queue name")
            if name in names or (name == RELAY_QUEUE_NAME and relay_listed):
                raise ValueError(f"{spec!r} lists queue {name!r} twice")
            if name == RELAY_QUEUE_NAME:
                if has_weight:
                    raise ValueError(f"{spec!r} gives {RELAY_QUEUE_NAME!r}, the outbox relay's queue, a weight: "
                                     "it takes none, it is always served first")
                relay_listed = True
                continue
            if has_weight and not (_WEIGHT.fullmatch(weight_text) and int(weight_text) >= 1):
                raise ValueError(f"{spec!r}: the weight of queue {name!r} must be a whole number of at least 1, "
                                 f"not {weight_text!r}")
            names.append(name)
            weights.append(int(weight_text) if has_weight else None)
        if None in weights and any(weight is not None for weight in weights):
            raise ValueError(f"{spec!r} mixes weighted and unweighted queues: give every queue a weight or none")
        given = tuple(weight for weight in weights if weight is not None)
        return cls(names=tuple(names), weights=given or None, relay_listed=relay_listed)

    @property
    def queues(self) -> tuple[str, ...]:
        """Every queue listed, the relay's first: what the worker consumes."""
        return ((RELAY_QUEUE_NAME,) if self.relay_listed else ()) + self.names

    @property
    def orders_several(self) -> bool:
        """More than one queue besides the relay: only then is there an order to keep."""
        return len(self.names) > 1

    def reserved_threads(self, threads: int) -> int:
        """k, the threads of ``threads`` kept for the first queue: weighted,
        ``max(1, threads * w_first // sum(weights))`` and at most ``threads - 1``; 0 when strict
        or with one thread. At most ``threads - k`` threads ever run work of the other queues, so
        first-queue work never waits for a whole batch of slow work of theirs to end; the first
        queue itself may use all ``threads``."""
        if self.weights is None or threads < 2:
            return 0
        share = threads * self.weights[0] // sum(self.weights)
        return min(threads - 1, max(1, share))

    def __str__(self) -> str:
        entries = list(self.names) if self.weights is None else [
            f"{name}={weight}" for name, weight in zip(self.names, self.weights, strict=True)]
        return ",".join(([RELAY_QUEUE_NAME] if self.relay_listed else []) + entries)


class OrderedWorkQueue(queue.PriorityQueue["_WorkQueueItem"]):
    """Dramatiq's work queue (``Worker.work_queue``) taking items in a ``QueueOrder``.

    One heap per listed queue, each ordered as Dramatiq orders its one queue (actor priority,
    then enqueue time); the relay's heap comes before them, and a heap of anything else (a queue
    not listed) after them. Strict: a thread takes from the first non-empty heap. Weighted:
    smooth weighted round-robin (as nginx balances upstreams) among the heaps the thread may take
    from now, where work of a queue other than the first (and of the unlisted heap) is open only
    while fewer than ``threads - k`` threads run such work.

    Which work a thread runs is known by its thread ident from ``get`` to its ``task_done``,
    both of which Dramatiq's worker thread calls itself. ``qsize()`` and ``empty()`` count every
    item held, open or not; once no job runs, ``get_nowait`` reaches every item (Dramatiq's
    ``Worker.stop`` hands them back so).
    """

    def __init__(self, order: QueueOrder, *, threads: int) -> None:
        if not order.names:
            raise ValueError("an order of no queue")
        self.order = order
        self.threads = threads
        # The threads that may run capped work (every queue but the relay's and the first) at once.
        self.capped_threads = threads - order.reserved_threads(threads)
        super().__init__()

    def _init(self, maxsize: int) -> None:
        self._relay: list[_WorkQueueItem] = []
        self._listed: list[list[_WorkQueueItem]] = [[] for _ in self.order.names]
        self._index = {name: index for index, name in enumerate(self.order.names)}
        self._unlisted: list[_WorkQueueItem] = []
        self._current_weights = [0] * len(self.order.names)
        self._running_capped: set[int] = set()

    def _put(self, item: _WorkQueueItem) -> None:
        name = q_name(item.message.queue_name)
        if name == RELAY_QUEUE_NAME:
            heap = self._relay
        elif name in self._index:
            heap = self._listed[self._index[name]]
        else:
            heap = self._unlisted
        heapq.heappush(heap, item)

    def _qsize(self) -> int:
        open_now = len(self._relay) + len(self._listed[0])
        if self._may_take_capped(threading.get_ident()):
            open_now += sum(len(heap) for heap in self._listed[1:]) + len(self._unlisted)
        return open_now

    def _get(self) -> _WorkQueueItem:
        me = threading.get_ident()
        heap = self._relay or self._next_listed(self._may_take_capped(me)) or self._unlisted
        item = heapq.heappop(heap)
        if heap is self._relay or heap is self._listed[0]:
            self._running_capped.discard(me)
        else:
            self._running_capped.add(me)
        return item

    def task_done(self) -> None:
        with self.mutex:
            if self.order.weights is not None and threading.get_ident() in self._running_capped:
                # A capped slot is free: a thread waiting on get() may now take capped work.
                self.not_empty.notify()
            self._running_capped.discard(threading.get_ident())
        super().task_done()

    def qsize(self) -> int:
        with self.mutex:
            return len(self._relay) + sum(len(heap) for heap in self._listed) + len(self._unlisted)

    def empty(self) -> bool:
        return self.qsize() == 0

    def _may_take_capped(self, thread_id: int) -> bool:
        if self.order.weights is None:
            return True
        # A thread already counted (one that took twice without task_done, as Worker.stop's
        # hand-back does) takes its own slot again.
        return thread_id in self._running_capped or len(self._running_capped) < self.capped_threads

    def _next_listed(self, may_take_capped: bool) -> list[_WorkQueueItem] | None:
        """The listed heap to take from next, or None when none is open and non-empty."""
        candidates = [index for index, heap in enumerate(self._listed) if heap and (index == 0 or may_take_capped)]
        if not candidates:
            return None
        if self.order.weights is None:
            return self._listed[candidates[0]]
        # Smooth weighted round-robin: each candidate gains its weight, the highest (the earlier
        # listed on a tie) is chosen and pays back the candidates' total.
        weights = self.order.weights
        for index in candidates:
            self._current_weights[index] += weights[index]
        chosen = max(candidates, key=lambda index: (self._current_weights[index], -index))
        self._current_weights[chosen] -= sum(weights[index] for index in candidates)
        return self._listed[chosen]
