"""Backpressure: refuse new work before the queues overflow.

``admit(queue)`` raises ``Backpressure`` (with ``.retry_after_s``) once the queue's depth
(``composition.backpressure.depth``) reaches its limit in ``COMPOSITION["BACKPRESSURE_QUEUES"]``;
``BackpressureMiddleware`` answers unsafe requests under ``BACKPRESSURE_PATHS`` with 503 and
``Retry-After``. The depth is measured at most every ``BACKPRESSURE_CACHE_S`` per process, so
admission costs nothing on the hot path.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import structlog
from django.http import HttpRequest, HttpResponse, JsonResponse

from composition.backpressure.depth import QueueDepths
from composition.conf import conf
from composition.errors import CompositionError
from composition.logging import already_logged
from composition.metrics import BACKPRESSURE_REJECTIONS_TOTAL

__all__ = ["Backpressure", "BackpressureMiddleware", "admit"]

log = structlog.get_logger("composition.backpressure")

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


class Backpressure(CompositionError):
    """The queue is full: try again after ``retry_after_s`` seconds."""

    def __init__(self, queue: str, depth: int, limit: int, retry_after_s: float) -> None:
        super().__init__(f"queue {queue!r} holds {depth} messages (limit {limit}); retry after {retry_after_s:g}s")
        self.queue = queue
        self.depth = depth
        self.limit = limit
        self.retry_after_s = retry_after_s


# Per-process measurements (a plain object, no I/O until the first admit).
_depths = QueueDepths()


def admit(queue: str) -> None:
    """Raise ``Backpressure`` when ``queue`` is at its limit; return when it may take more work.

    A queue without a limit in ``BACKPRESSURE_QUEUES`` is always admitted.
    """
    limit = (conf.BACKPRESSURE_QUEUES or {}).get(queue)
    if limit is None:
        return
    depth = _depths.get(queue, max_age_s=float(conf.BACKPRESSURE_CACHE_S))
    if depth >= int(limit):
        BACKPRESSURE_REJECTIONS_TOTAL.labels(queue).inc()
        raise Backpressure(queue, depth, int(limit), float(conf.BACKPRESSURE_RETRY_AFTER_S))


class BackpressureMiddleware:
    """503 with Retry-After for unsafe requests whose queue is full (see module doc)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        # At 0 from the start (once per process): a series first seen at 1 has no increase().
        for queue in (conf.BACKPRESSURE_QUEUES or {}):
            BACKPRESSURE_REJECTIONS_TOTAL.labels(queue)

    def _queue_for(self, request: HttpRequest) -> str | None:
        if request.method in SAFE_METHODS:
            return None
        for prefix, queue in (conf.BACKPRESSURE_PATHS or {}).items():
            if request.path_info.startswith(prefix):  # below the mount point (SCRIPT_NAME), as URLs are
                return str(queue)
        return None

    def __call__(self, request: HttpRequest) -> HttpResponse:
        queue = self._queue_for(request)
        if queue is not None:
            try:
                admit(queue)
            except Backpressure as exc:
                log.warning("request shed: queue full", queue=queue, depth=exc.depth, limit=exc.limit)
                retry_after = max(1, math.ceil(exc.retry_after_s))
                # The shape of any JSON API error (a stable code, a sentence for people). Not the
                # queue, its depth or its limit: this runs before authentication, so anyone could
                # read them; they are in the warning above and in the metrics.
                response = JsonResponse({"code": "overloaded",
                                         "error": f"too much work is waiting: this request is not taken now; "
                                                  f"retry after {retry_after} s",
                                         "retry_after_s": retry_after}, status=503)
                response["Retry-After"] = str(retry_after)
                return already_logged(response)
        return self.get_response(request)
