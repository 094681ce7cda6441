"""The stock infrastructure components of a process: logging, metrics, database, cache, broker.

Each is a plain object with its dependencies passed in. They probe their dependency with
``composition.health.probes``; the worker threads and the heartbeat are in ``worker_threads`` and
``heartbeat``, child processes in ``processes``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import structlog
from django.core.cache import caches
from django.db import connections
from dramatiq.broker import Broker
from prometheus_client import multiprocess

from composition.db.timeouts import close_all_connections
from composition.errors import REDIS_ERRORS
from composition.health import probes
from composition.logging import configure_structlog
from composition.prometheus.archive import archive_dead_processes

__all__ = [
    "BrokerComponent",
    "CacheComponent",
    "DatabaseComponent",
    "LoggingComponent",
    "MetricsComponent",
]

log = structlog.get_logger("composition.components")


class LoggingComponent:
    """Logging is configured by Django's LOGGING setting; stopping flushes every handler."""

    name = "logging"

    def start(self) -> None:
        configure_structlog()

    def stop(self, timeout_s: float) -> None:
        for handler in logging.getLogger().handlers:
            handler.flush()


class MetricsComponent:
    """Prepares the multiprocess directory and archives the files that processes which no longer
    run left in it (so they count once, and scrapes stay fast); on stop marks this process dead
    for live gauges."""

    name = "metrics"
    depends_on = ("logging",)

    def __init__(self, multiproc_dir: str | None = None) -> None:
        self.multiproc_dir = multiproc_dir if multiproc_dir is not None else os.environ.get(
            "PROMETHEUS_MULTIPROC_DIR")

    def start(self) -> None:
        if self.multiproc_dir:
            Path(self.multiproc_dir).mkdir(parents=True, exist_ok=True)
            archived = archive_dead_processes(self.multiproc_dir)
            if archived:
                log.info("archived metrics of processes that no longer run", processes=len(archived))

    def stop(self, timeout_s: float) -> None:
        if self.multiproc_dir:
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
        probes.probe_database(2.0)


class CacheComponent:
    """Fails the start when the cache cannot be reached; closes its connections on stop."""

    name = "cache"
    depends_on = ("logging",)

    def __init__(self, alias: str = "default", *, required: bool = False) -> None:
        self.alias = alias
        self.required = required

    def start(self) -> None:
        try:
            probes.probe_cache(2.0)
        except REDIS_ERRORS as exc:
            if self.required:
                raise
            # The database is the source of truth: a cache outage degrades, it does not stop us.
            # Anything else (a LOCATION that is no URL) is a mistake and fails the start here,
            # before any job runs.
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
        probes.probe_broker(2.0)

    def stop(self, timeout_s: float) -> None:
        self.broker.close()
