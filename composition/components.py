"""The stock components: logging, metrics, database, cache, broker, Dramatiq workers, heartbeat
(child processes are in composition.processes). Each is a plain object with its dependencies passed in.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import structlog
from django.core.cache import caches
from django.db import connections
from dramatiq import Worker
from dramatiq.broker import Broker

from composition import health, heartbeats
from composition.broker import configured_broker
from composition.database import close_all_connections
from composition.jobs.middleware import find_job_middleware
from composition.jobs.runtime import BrokerKeepalive, drain_worker, stop_intake
from composition.metrics import WORKER_HEARTBEAT_TIMESTAMP
from composition.time_limits import boot_worker_process

__all__ = [
    "BrokerComponent",
    "CacheComponent",
    "DatabaseComponent",
    "HeartbeatComponent",
    "LoggingComponent",
    "MetricsComponent",
    "WorkerComponent",
]

log = structlog.get_logger("composition.components")



class LoggingComponent:
    """Logging is configured by Django's LOGGING setting; stopping flushes every handler."""

    name = "logging"

    def start(self) -> None:
        from composition.logging import configure_structlog

        configure_structlog()

    def stop(self, timeout_s: float) -> None:
        import logging

        for handler in logging.getLogger().handlers:
            handler.flush()


class MetricsComponent:
    """Prepares the multiprocess directory; on stop marks this process dead for live gauges."""

    name = "metrics"
    depends_on = ("logging",)

    def __init__(self, multiproc_dir: str | None = None) -> None:
        self.multiproc_dir = multiproc_dir if multiproc_dir is not None else os.environ.get(
            "PROMETHEUS_MULTIPROC_DIR")

    def start(self) -> None:
        if self.multiproc_dir:
            Path(self.multiproc_dir).mkdir(parents=True, exist_ok=True)

    def stop(self, timeout_s: float) -> None:
        if self.multiproc_dir:
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(os.getpid(), self.multiproc_dir)


class DatabaseComponent:
    """Fails the start when the database is unreachable; on stop closes every connection the
    process opened, in whatever thread (worker threads' included)."""

    name = "database"
    depends_on = ("logging",)

    def __init__(self, alias: str = "default") -> None:
        self.alias = alias

    def start(self) -> None:
        with connections[self.alias].cursor() as cursor:
            cursor.execute("SELECT 1")
        # The main thread only supervises: it must not keep a connection the budget does not count.
        connections[self.alias].close()

    def stop(self, timeout_s: float) -> None:
        close_all_connections()

    def check(self) -> None:
        health.probe_database(2.0)


class CacheComponent:
    """Fails the start when the cache cannot be reached; closes its connections on stop."""

    name = "cache"
    depends_on = ("logging",)

    def __init__(self, alias: str = "default", *, required: bool = False) -> None:
        self.alias = alias
        self.required = required

    def start(self) -> None:
        try:
            health.probe_cache(2.0)
        except Exception as exc:
            if self.required:
                raise
            # The database is the source of truth: a cache outage degrades, it does not stop us.
            log.warning("cache unreachable at start, continuing degraded", error=str(exc))

    def stop(self, timeout_s: float) -> None:
        caches[self.alias].close()


class BrokerComponent:
    """Checks the broker answers before workers start; closes its connections last."""

    name = "broker"
    depends_on = ("logging",)

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def start(self) -> None:
        health.probe_broker(2.0)

    def stop(self, timeout_s: float) -> None:
        self.broker.close()


class WorkerComponent:
    """Dramatiq worker threads. ``begin_drain`` stops consumption at once; ``drain`` lets running
    jobs finish until the deadline, interrupts the rest (requeued without using an attempt) and
    hands every unfinished message back to the broker (``composition.jobs.runtime``). While
    started, a keepalive keeps the Redis broker from taking this process for a dead worker."""

    name = "workers"
    depends_on = ("database", "broker")

    def __init__(self, broker: Broker, *, queues: Sequence[str] | None, threads: int,
                 idle_poll_ms: int) -> None:
        self.broker = broker
        self.queues = set(queues) if queues else None
        self.threads = threads
        self.idle_poll_ms = idle_poll_ms
        self.worker: Worker | None = None
        self._stopped = False
        self._drained = threading.Event()
        # Several beats within the broker's heartbeat timeout, so one late beat does not count.
        heartbeat_timeout_s = float(getattr(broker, "heartbeat_timeout", 60_000)) / 1000
        self.keepalive = BrokerKeepalive(broker, interval_s=max(0.5, heartbeat_timeout_s / 4))

    def start(self) -> None:
        # As Dramatiq's CLI does, once per process before any worker: starts the time limits.
        boot_worker_process(self.broker)
        self.worker = Worker(self.broker, queues=self.queues, worker_threads=self.threads,
                             worker_timeout=self.idle_poll_ms)
        self.worker.start()
        self.keepalive.start()

    def begin_drain(self) -> None:
        if self.worker is not None and not self._stopped:
            stop_intake(self.worker)

    def drain(self, deadline: float) -> None:
        self._stop(deadline)

    def stop(self, timeout_s: float) -> None:
        self._stop(time.monotonic() + timeout_s)
        # The drain may overrun its deadline a little by design (unwinding interrupted jobs,
        # then handing messages back); the System abandons it at the deadline, so wait here for
        # it to finish before the broker is closed under it.
        if not self._drained.wait(timeout_s):
            raise TimeoutError(f"the worker drain did not finish within {timeout_s:.1f}s more")

    def _stop(self, deadline: float) -> None:
        if self.worker is None:
            self._drained.set()
            return
        if self._stopped:
            return
        self._stopped = True
        try:
            drain_worker(self.worker, deadline)
        finally:
            self.keepalive.stop()
            self._drained.set()


class HeartbeatComponent:
    """Writes this worker process's heartbeat every ``interval_s`` for ``health workers``.

    ``state`` adds fields to each beat; by default the jobs in flight and since when, from the
    job middleware of ``broker`` (the configured broker when not given).
    """

    name = "heartbeat"
    depends_on = ("cache",)

    def __init__(self, interval_s: float, *, state: Callable[[], dict[str, Any]] | None = None,
                 broker: Broker | None = None) -> None:
        self.interval_s = interval_s
        self.state = state or self._jobs_state
        self.broker = broker
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}"
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None

    def _jobs_state(self) -> dict[str, Any]:
        middleware = find_job_middleware(self.broker or configured_broker())
        return middleware.state() if middleware is not None else {}

    def start(self) -> None:
        self._client = health.heartbeat_client()
        self._beat()
        self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        try:
            heartbeats.write_heartbeat(self._client, self.worker_id, self.state())
            WORKER_HEARTBEAT_TIMESTAMP.set(time.time())
        except Exception as exc:
            log.warning("heartbeat failed", error=str(exc))

    def _loop(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            self._beat()

    def stop(self, timeout_s: float) -> None:
        self._stop_event.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        try:
            heartbeats.clear_heartbeat(self._client, self.worker_id)
        except Exception as exc:  # best effort: the key expires by itself anyway
            log.warning("could not withdraw heartbeat", error=str(exc))
        finally:
            self._client.close()
