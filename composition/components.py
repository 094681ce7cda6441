"""The stock components: logging, metrics, database, cache, broker, Dramatiq workers, heartbeat
and child processes. Each is a plain object with its dependencies passed in.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import structlog
from django.core.cache import caches
from django.db import connections
from dramatiq import Worker
from dramatiq.broker import Broker

from composition import health
from composition.metrics import WORKER_HEARTBEAT_TIMESTAMP

__all__ = [
    "BrokerComponent",
    "CacheComponent",
    "DatabaseComponent",
    "HeartbeatComponent",
    "LoggingComponent",
    "MetricsComponent",
    "ProcessComponent",
    "WorkerComponent",
]

log = structlog.get_logger("composition.components")

_PR_SET_PDEATHSIG = 1


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
    """Fails the start when the database is unreachable; closes this thread's connections on stop."""

    name = "database"
    depends_on = ("logging",)

    def __init__(self, alias: str = "default") -> None:
        self.alias = alias

    def start(self) -> None:
        with connections[self.alias].cursor() as cursor:
            cursor.execute("SELECT 1")

    def stop(self, timeout_s: float) -> None:
        connections.close_all()

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
    """Dramatiq worker threads. Draining stops consumption, lets running jobs finish until the
    deadline and hands prefetched messages back to the broker."""

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

    def start(self) -> None:
        self.worker = Worker(self.broker, queues=self.queues, worker_threads=self.threads,
                             worker_timeout=self.idle_poll_ms)
        self.worker.start()

    def drain(self, deadline: float) -> None:
        self._stop(max(0.0, deadline - time.monotonic()))

    def stop(self, timeout_s: float) -> None:
        self._stop(timeout_s)

    def _stop(self, timeout_s: float) -> None:
        if self.worker is None or self._stopped:
            return
        self._stopped = True
        self.worker.stop(timeout=max(1, int(timeout_s * 1000)))


class HeartbeatComponent:
    """Writes this worker process's heartbeat every ``interval_s`` for ``health workers``."""

    name = "heartbeat"
    depends_on = ("cache",)

    def __init__(self, interval_s: float, *, state: Callable[[], dict[str, Any]] | None = None) -> None:
        self.interval_s = interval_s
        self.state = state or dict
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}"
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._client = health._heartbeat_client()
        self._beat()
        self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        try:
            health.write_heartbeat(self._client, self.worker_id, self.state())
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
            health.clear_heartbeat(self._client, self.worker_id)
        finally:
            self._client.close()


def _die_with_parent() -> None:
    """In the child, before exec: own session (a terminal's Ctrl-C reaches only the parent, which
    then drains in order) and SIGTERM when the parent dies."""
    os.setsid()
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # not Linux: the child's own parent watch has to do
        pass


class ProcessComponent:
    """A child process in its own session. Start waits until ``ready_url`` answers 200 (when
    given); drain sends SIGTERM and waits until the deadline; stop kills what is left."""

    def __init__(self, name: str, argv: Sequence[str], *, env: dict[str, str] | None = None,
                 depends_on: Sequence[str] = (), ready_url: str | None = None,
                 start_timeout_s: float = 60.0, cwd: str | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = env
        self.depends_on = tuple(depends_on)
        self.ready_url = ready_url
        self.start_timeout_s = start_timeout_s
        self.cwd = cwd
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd,
                                        preexec_fn=_die_with_parent)
        if self.ready_url:
            self._wait_ready(self.ready_url)

    def _wait_ready(self, url: str) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.start_timeout_s
        last_error = "no answer"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"exited with code {self.process.returncode} before it was ready")
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return
            except Exception as exc:
                last_error = str(exc)
            time.sleep(0.2)
        self._kill()
        raise TimeoutError(f"{url} not ready within {self.start_timeout_s:.0f}s: {last_error}")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def begin_drain(self) -> None:
        if self.alive():
            self._signal(signal.SIGTERM)

    def drain(self, deadline: float) -> None:
        if not self.alive():
            return
        assert self.process is not None
        try:
            self.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("child did not drain before the deadline", component=self.name)

    def stop(self, timeout_s: float) -> None:
        if self.process is None:
            return
        if self.alive():
            self._signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._kill()
        code = self.process.returncode
        if code not in (0, None, -signal.SIGTERM):
            raise RuntimeError(f"exited with code {code}")

    def _signal(self, signum: int) -> None:
        assert self.process is not None
        try:
            os.killpg(self.process.pid, signum)
        except ProcessLookupError:
            pass

    def _kill(self) -> None:
        if self.alive():
            self._signal(signal.SIGKILL)
            assert self.process is not None
            self.process.wait()
