"""Backpressure: refuse new work before the queues overflow, and stop calling what is failing.

- ``admit(queue)`` raises ``Backpressure`` (with ``.retry_after_s``) when the queue's backlog,
  the pending outbox rows for it plus the messages on the broker, has reached its limit in
  ``COMPOSITION["BACKPRESSURE_QUEUES"]``. The depth is measured at most every
  ``BACKPRESSURE_CACHE_S`` per process, so admission costs nothing on the hot path.
- ``BackpressureMiddleware`` calls ``admit`` for unsafe requests under the path prefixes of
  ``BACKPRESSURE_PATHS`` and answers 503 with ``Retry-After``: the caller learns to come back
  later instead of piling up work nobody can do.
- ``CircuitBreaker`` stops calling a dependency after ``failure_threshold`` consecutive
  failures, for ``reset_timeout_s``, then lets ``half_open_max_calls`` trial calls through.
  ``CircuitOpen`` is a ``TransientError``, so a job that hits an open circuit retries later.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import structlog
from django.http import HttpRequest, HttpResponse, JsonResponse

from composition.conf import conf
from composition.errors import CompositionError, TransientError
from composition.metrics import (
    BACKPRESSURE_REJECTIONS_TOTAL,
    CIRCUIT_REJECTIONS_TOTAL,
    CIRCUIT_STATE,
    QUEUE_DEPTH,
)

__all__ = [
    "Backpressure",
    "BackpressureMiddleware",
    "CircuitBreaker",
    "CircuitOpen",
    "admit",
    "queue_depth",
]

log = structlog.get_logger("composition.backpressure")

P = ParamSpec("P")
R = TypeVar("R")

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


class Backpressure(CompositionError):
    """The queue is full: try again after ``retry_after_s`` seconds."""

    def __init__(self, queue: str, depth: int, limit: int, retry_after_s: float) -> None:
        super().__init__(f"queue {queue!r} holds {depth} messages (limit {limit}); retry after {retry_after_s:g}s")
        self.queue = queue
        self.depth = depth
        self.limit = limit
        self.retry_after_s = retry_after_s


class CircuitOpen(TransientError):
    """The circuit ``name`` is open: the dependency is not called until ``retry_after_s`` passes."""

    def __init__(self, name: str, retry_after_s: float) -> None:
        super().__init__(f"circuit {name!r} is open; retry after {retry_after_s:.2f}s")
        self.name = name
        self.retry_after_s = retry_after_s


# -- queue depth ------------------------------------------------------------------------------------
def _broker_depth(queue: str) -> int:
    """Messages the broker holds for ``queue`` (waiting, delayed and in flight)."""
    from composition.broker import configured_broker

    broker = configured_broker()
    client = getattr(broker, "client", None)
    if client is not None:  # Redis: every message body lives in the queue's hash until acked
        namespace = getattr(broker, "namespace", "dramatiq")
        pipe = client.pipeline(transaction=False)
        pipe.hlen(f"{namespace}:{queue}.msgs")
        pipe.hlen(f"{namespace}:{queue}.DQ.msgs")
        return int(sum(pipe.execute()))
    channel = broker.channel  # type: ignore[attr-defined]
    return int(channel.queue_declare(queue, passive=True).method.message_count)


def _outbox_depth(queue: str) -> int:
    from composition.outbox.models import OutboxMessage

    return int(OutboxMessage.objects.filter(status="pending", queue_name=queue).count())


def queue_depth(queue: str, *, broker_breaker: CircuitBreaker | None = None) -> int:
    """The backlog of ``queue``: pending outbox rows plus the broker's messages.

    A broker that cannot be asked (or whose ``broker_breaker`` is open) counts as empty: the
    outbox then holds the backlog, and that is still counted. The failure is logged.
    """
    depth = _outbox_depth(queue)
    try:
        if broker_breaker is None:
            depth += _broker_depth(queue)
        else:
            depth += broker_breaker.call(_broker_depth, queue)
    except CircuitOpen:
        pass
    except Exception as exc:
        log.warning("could not read the broker's queue depth", queue=queue, error=str(exc))
    QUEUE_DEPTH.labels(queue).set(depth)
    return depth


class _DepthCache:
    """Per-process depths, refreshed at most every ``BACKPRESSURE_CACHE_S`` by one thread at a
    time (the others keep answering with the previous value), with the broker behind a breaker
    so a frozen broker costs one socket timeout per reset period, not one per request."""

    BROKER_RESET_S = 5.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, tuple[float, int]] = {}
        self._refreshing: dict[str, threading.Lock] = {}
        self._breaker: CircuitBreaker | None = None

    def _broker_breaker(self) -> CircuitBreaker:
        if self._breaker is None:
            self._breaker = CircuitBreaker("backpressure-broker-depth", failure_threshold=1,
                                           reset_timeout_s=self.BROKER_RESET_S)
        return self._breaker

    def _fresh(self, queue: str) -> tuple[float, int] | None:
        with self._lock:
            cached = self._values.get(queue)
        if cached is not None and time.monotonic() - cached[0] < float(conf.BACKPRESSURE_CACHE_S):
            return cached
        return None

    def get(self, queue: str) -> int:
        fresh = self._fresh(queue)
        if fresh is not None:
            return fresh[1]
        with self._lock:
            cached = self._values.get(queue)
            refreshing = self._refreshing.setdefault(queue, threading.Lock())
        if not refreshing.acquire(blocking=cached is None):
            return cached[1] if cached is not None else 0  # another thread is measuring
        try:
            fresh = self._fresh(queue)  # measured by the thread we waited for
            if fresh is not None:
                return fresh[1]
            depth = queue_depth(queue, broker_breaker=self._broker_breaker())
            with self._lock:
                self._values[queue] = (time.monotonic(), depth)
            return depth
        finally:
            refreshing.release()

    def clear(self) -> None:
        with self._lock:
            self._values.clear()
            self._breaker = None


_depths = _DepthCache()


def admit(queue: str) -> None:
    """Raise ``Backpressure`` when ``queue`` is at its limit; return when it may take more work.

    A queue without a limit in ``BACKPRESSURE_QUEUES`` is always admitted.
    """
    limit = (conf.BACKPRESSURE_QUEUES or {}).get(queue)
    if limit is None:
        return
    depth = _depths.get(queue)
    if depth >= int(limit):
        BACKPRESSURE_REJECTIONS_TOTAL.labels(queue).inc()
        raise Backpressure(queue, depth, int(limit), float(conf.BACKPRESSURE_RETRY_AFTER_S))


class BackpressureMiddleware:
    """503 with Retry-After for unsafe requests whose queue is full (see module doc)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def _queue_for(self, request: HttpRequest) -> str | None:
        if request.method in SAFE_METHODS:
            return None
        for prefix, queue in (conf.BACKPRESSURE_PATHS or {}).items():
            if request.path.startswith(prefix):
                return str(queue)
        return None

    def __call__(self, request: HttpRequest) -> HttpResponse:
        queue = self._queue_for(request)
        if queue is not None:
            try:
                admit(queue)
            except Backpressure as exc:
                log.warning("request shed: queue full", queue=queue, depth=exc.depth, limit=exc.limit)
                response = JsonResponse({"error": "overloaded", "queue": queue, "depth": exc.depth,
                                         "limit": exc.limit, "retry_after_s": exc.retry_after_s}, status=503)
                response["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
                return response
        return self.get_response(request)


# -- circuit breaker -----------------------------------------------------------------------------
class CircuitBreaker:
    """Closed → open after ``failure_threshold`` consecutive failures; open for
    ``reset_timeout_s``; then half-open, where ``half_open_max_calls`` trial calls decide: a
    success closes it, a failure opens it again. Thread-safe.

    Use ``breaker.call(fn, *args)``, ``@breaker`` or ``with breaker:``. Only exceptions that are
    instances of ``failure_types`` count as failures; any other outcome means the dependency
    answered, which counts as a success.
    """

    CLOSED, HALF_OPEN, OPEN = "closed", "half_open", "open"
    _STATE_VALUES = {CLOSED: 0, HALF_OPEN: 1, OPEN: 2}

    def __init__(self, name: str, *, failure_threshold: int, reset_timeout_s: float,
                 half_open_max_calls: int = 1, failure_types: tuple[type[BaseException], ...] = (Exception,),
                 clock: Callable[[], float] = time.monotonic) -> None:
        if failure_threshold < 1 or half_open_max_calls < 1:
            raise ValueError("failure_threshold and half_open_max_calls must be at least 1")
        if reset_timeout_s <= 0:
            raise ValueError(f"reset_timeout_s must be positive, got {reset_timeout_s!r}")
        self.name = name
        self.failure_threshold = failure_threshold
        self.reset_timeout_s = reset_timeout_s
        self.half_open_max_calls = half_open_max_calls
        self.failure_types = failure_types
        self._clock = clock
        self._lock = threading.Lock()
        self._state = self.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._trials = 0
        CIRCUIT_STATE.labels(name).set(0)

    @property
    def state(self) -> str:
        with self._lock:
            self._advance()
            return self._state

    def _set(self, state: str) -> None:
        if state != self._state:
            log.warning("circuit state changed", circuit=self.name, old=self._state, new=state)
        self._state = state
        CIRCUIT_STATE.labels(self.name).set(self._STATE_VALUES[state])

    def _advance(self) -> None:
        if self._state == self.OPEN and self._clock() - self._opened_at >= self.reset_timeout_s:
            self._set(self.HALF_OPEN)
            self._trials = 0

    def before_call(self) -> None:
        """Raise CircuitOpen when the call must not go through; otherwise count it."""
        with self._lock:
            self._advance()
            if self._state == self.OPEN:
                retry_after_s = self.reset_timeout_s - (self._clock() - self._opened_at)
            elif self._state == self.HALF_OPEN and self._trials >= self.half_open_max_calls:
                retry_after_s = self.reset_timeout_s
            else:
                if self._state == self.HALF_OPEN:
                    self._trials += 1
                return
        CIRCUIT_REJECTIONS_TOTAL.labels(self.name).inc()
        raise CircuitOpen(self.name, max(0.0, retry_after_s))

    def record_success(self) -> None:
        with self._lock:
            self._failures = 0
            if self._state != self.CLOSED:
                self._set(self.CLOSED)

    def record_failure(self) -> None:
        with self._lock:
            self._failures += 1
            if self._state == self.HALF_OPEN or self._failures >= self.failure_threshold:
                self._opened_at = self._clock()
                self._set(self.OPEN)

    def call(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        self.before_call()
        try:
            result = fn(*args, **kwargs)
        except self.failure_types:
            self.record_failure()
            raise
        except BaseException:
            self.record_success()
            raise
        self.record_success()
        return result

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
            return self.call(fn, *args, **kwargs)

        guarded.__name__ = getattr(fn, "__name__", "guarded")
        guarded.__doc__ = fn.__doc__
        return guarded

    def __enter__(self) -> CircuitBreaker:
        self.before_call()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if exc is not None and isinstance(exc, self.failure_types):
            self.record_failure()
        else:
            self.record_success()
