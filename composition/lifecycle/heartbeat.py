"""The worker process's heartbeat as a component, for ``health workers``."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import structlog
from dramatiq.broker import Broker

from composition.breaker import breaker_states
from composition.broker.configured import configured_broker
from composition.broker.pausing import paused_queues
from composition.health import heartbeats, probes
from composition.jobs.middleware.stack import find_in_flight
from composition.lifecycle import pids
from composition.lifecycle.periodic import PeriodicComponent
from composition.metrics import WORKER_HEARTBEAT_TIMESTAMP

__all__ = ["HeartbeatComponent"]

log = structlog.get_logger("composition.components")


class HeartbeatComponent(PeriodicComponent):
    """Writes this worker process's heartbeat every ``interval_s`` for ``health workers``: once
    before ``start`` returns, then on a background thread; ``stop`` withdraws it. The process is
    also registered on this host as one of this project's workers (``composition.lifecycle.pids``).

    ``state`` adds fields to each beat; by default the jobs in flight and since when, from the
    job middleware of ``broker`` (the configured broker when not given), the runs per queue over
    the last minutes, the states of this process's circuit breakers and the queues it has read
    as paused.
    """

    name = "heartbeat"
    depends_on = ("cache",)
    tick_at_start = False  # start() has just beaten
    # A draining process still beats, so ``health workers`` shows its jobs until it is gone.
    stop_on_drain = False

    def __init__(self, interval_s: float, *, state: Callable[[], dict[str, Any]] | None = None,
                 broker: Broker | None = None) -> None:
        super().__init__(interval_s=interval_s)
        self.state = state or self._jobs_state
        self.broker = broker
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}"

    def _jobs_state(self) -> dict[str, Any]:
        registry = find_in_flight(self.broker or configured_broker())
        jobs = registry.state() if registry is not None else {}
        # The queues this process has read as paused: `health workers` shows whether every
        # worker has seen a pause, and a paused queue's idle workers for what they are.
        return {**jobs, "breakers": breaker_states(), "paused_queues": sorted(paused_queues.names)}

    def start(self) -> None:
        self._register()
        self._client = probes.heartbeat_client()
        try:
            self.tick()
            super().start()
        except BaseException:
            # The System stops only what started: the beat and the registration would stay,
            # and health would count a worker that never consumed, then report it dead.
            try:
                self.stop(0.0)
            except Exception as exc:  # the start's own failure is the one to report
                log.warning("heartbeat of a failed start not withdrawn", error=str(exc))
            raise

    def _register(self) -> None:
        # On this host, apart from Redis: `health workers --local` tells this project's
        # processes by it, and still finds them while Redis is down. Each beat registers again
        # should a temporary-file cleaner have removed it; a directory it cannot write (a
        # read-only /tmp) costs only that local check, not the worker.
        try:
            pids.register_worker()
        except OSError as exc:
            log.warning("worker not registered for health workers --local", error=str(exc))

    def tick(self) -> None:
        """One beat; a failure is logged (the next beat may well succeed)."""
        self._register()
        # Before the write, which needs Redis: with only the cache's Redis down the process
        # still consumes, and its metric must not page as a worker that stopped.
        WORKER_HEARTBEAT_TIMESTAMP.labels("worker").set(time.time())
        try:
            heartbeats.write_heartbeat(self._client, self.worker_id, self.state())
        except Exception as exc:
            log.warning("heartbeat failed", error=str(exc))

    def stop(self, timeout_s: float) -> None:
        super().stop(timeout_s)
        # Unregistered before the beat goes: a registered process that runs without a beat is
        # frozen to `health workers --local`, even for the moment in between.
        with contextlib.suppress(OSError):
            pids.unregister_worker()
        try:
            heartbeats.clear_heartbeat(self._client, self.worker_id)
        except Exception as exc:  # best effort: the key expires by itself anyway
            log.warning("could not withdraw heartbeat", error=str(exc))
        finally:
            self._client.close()
