"""Backpressure: refuse new work before the queues overflow.

``admit(queue)`` raises ``Backpressure`` (with ``.retry_after_s``) once the queue's depth
(``composition.backpressure.depth``) reaches its limit in ``COMPOSITION["BACKPRESSURE_QUEUES"]``,
or while the queue is shed (one of ``SHED_QUEUES`` the shedding controller paused under
pressure: ``composition.queues.shedding``); ``BackpressureMiddleware`` answers unsafe requests
under ``BACKPRESSURE_PATHS``, and any view whose own ``admit()`` refused, with 503 and
``Retry-After``. Both are read at most every ``BACKPRESSURE_CACHE_S`` per process, so admission
costs nothing on the hot path. A queue an operator paused is admitted as usual: its publishes
wait on the broker.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import structlog
from django.http import HttpRequest, HttpResponse, JsonResponse

from composition.backpressure.depth import QueueDepths
from composition.backpressure.shed import ShedQueues
from composition.conf import conf, require_installed
from composition.errors import CompositionError
from composition.logging import already_logged
from composition.metrics import BACKPRESSURE_REJECTIONS_TOTAL

__all__ = ["Backpressure", "BackpressureMiddleware", "admit", "queue_for_path"]

log = structlog.get_logger("composition.backpressure")

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


class Backpressure(CompositionError):
    """The queue is full, or shed (``shed``, then ``depth`` and ``limit`` are None): try again
    after ``retry_after_s`` seconds."""

    def __init__(self, queue: str, depth: int | None, limit: int | None, retry_after_s: float, *,
                 shed: bool = False) -> None:
        why = ("is shed while essential work is under pressure" if shed
               else f"holds {depth} messages (limit {limit})")
        super().__init__(f"queue {queue!r} {why}; retry after {retry_after_s:g}s")
        self.queue = queue
        self.depth = depth
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.shed = shed


# Per-process measurements (plain objects, no I/O until the first admit).
_depths = QueueDepths()
_shed = ShedQueues()


def admit(queue: str) -> None:
    """Raise ``Backpressure`` when ``queue`` is at its limit or shed; return when it may take
    more work. A queue without a limit in ``BACKPRESSURE_QUEUES`` and not in ``SHED_QUEUES`` is
    always admitted.
    """
    shed_queues = conf.SHED_QUEUES or ()
    if queue in shed_queues and queue in _shed.get(shed_queues, max_age_s=float(conf.BACKPRESSURE_CACHE_S)):
        BACKPRESSURE_REJECTIONS_TOTAL.labels(queue).inc()
        raise Backpressure(queue, None, None, float(conf.BACKPRESSURE_RETRY_AFTER_S), shed=True)
    limit = (conf.BACKPRESSURE_QUEUES or {}).get(queue)
    if limit is None:
        _warn_if_unknown(queue, shed_queues)
        return
    depth = _depths.get(queue, max_age_s=float(conf.BACKPRESSURE_CACHE_S))
    if depth >= int(limit):
        BACKPRESSURE_REJECTIONS_TOTAL.labels(queue).inc()
        raise Backpressure(queue, depth, int(limit), float(conf.BACKPRESSURE_RETRY_AFTER_S))


# Every name looked at, known or not: a job's queue without a limit is admitted on each request,
# and the broker's queues (copied on each read) are not read again for it.
_looked_at: set[str] = set()


def _warn_if_unknown(queue: str, shed_queues: Any) -> None:
    """A name with no limit, not shed and no job's queue is always admitted: most likely a
    misspelt one (admit("ordrs")), which protects nothing. Said once per process and name."""
    if queue in _looked_at or queue in shed_queues:
        return
    from composition.broker.configured import configured_broker

    _looked_at.add(queue)
    if queue not in configured_broker().get_declared_queues():
        log.warning("admit() of a queue no setting limits and no job uses: always admitted (a misspelt name?)",
                    queue=queue, limited=sorted(conf.BACKPRESSURE_QUEUES or {}))


def queue_for_path(path: str, prefixes: Mapping[str, str]) -> str | None:
    """The queue of the longest prefix of ``path`` (below the mount point, as URLs are) that
    ends at a segment boundary, or None. Not the first prefix in the setting's order that is a
    plain string prefix: ``/api/remind`` took ``/api/reminders-export`` for its own queue's."""
    found: str | None = None
    length = -1
    for prefix, queue in prefixes.items():
        if len(prefix) > length and path.startswith(prefix) and (
                len(path) == len(prefix) or prefix.endswith("/") or path[len(prefix)] == "/"):
            found, length = str(queue), len(prefix)
    return found


class BackpressureMiddleware:
    """503 with Retry-After for unsafe requests whose queue is full (see module doc)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        require_installed("composition.backpressure.BackpressureMiddleware")
        self.get_response = get_response
        # At 0 from the start (once per process): a series first seen at 1 has no increase().
        for queue in {*(conf.BACKPRESSURE_QUEUES or {}), *(conf.SHED_QUEUES or ())}:
            BACKPRESSURE_REJECTIONS_TOTAL.labels(queue)

    def _queue_for(self, request: HttpRequest) -> str | None:
        if request.method in SAFE_METHODS:
            return None
        return queue_for_path(request.path_info, conf.BACKPRESSURE_PATHS or {})

    def __call__(self, request: HttpRequest) -> HttpResponse:
        queue = self._queue_for(request)
        if queue is not None:
            try:
                admit(queue)
            except Backpressure as exc:
                return self._overloaded(exc)
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        """A view's own ``admit()`` that refused (uncaught): the same 503 as a path's."""
        if isinstance(exception, Backpressure):
            return self._overloaded(exception)
        return None

    @staticmethod
    def _overloaded(exc: Backpressure) -> HttpResponse:
        log.warning("request shed: queue shed under pressure" if exc.shed else "request shed: queue full",
                    queue=exc.queue, depth=exc.depth, limit=exc.limit)
        retry_after = max(1, math.ceil(exc.retry_after_s))
        # The shape of any JSON API error (a stable code, a sentence for people). Not the queue,
        # its depth or its limit: this may answer before authentication, so anyone could read
        # them; they are in the warning above and in the metrics.
        response = JsonResponse({"code": "overloaded",
                                 "error": f"too much work is waiting: this request is not taken now; "
                                          f"retry after {retry_after} s",
                                 "retry_after_s": retry_after}, status=503)
        response["Retry-After"] = str(retry_after)
        return already_logged(response)
