"""The worker side as a composed system: what ``manage.py runworkers`` runs.

One process: logging → metrics (→ metrics server) → database → cache → broker → queue pauses →
limit slots (→ task leases) → relay sweeper (→ broker losses) → invalidation replay → retention →
shedding → metrics sampler → scheduler → heartbeat → worker threads.
Several: a supervisor of the metrics directory's upkeep, the scheduler, and child processes that
each run the one-process system without a scheduler of their own, up once each has written its
ready file. This is the top of the lifecycle package: nothing below it imports it.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from django.conf import settings
from dramatiq.brokers.redis import RedisBroker

from composition import health
from composition.broker.configured import configured_broker
from composition.cache import InvalidationReplayComponent
from composition.conf import conf
from composition.db.budget import connections_per_process
from composition.errors import ConfigurationError
from composition.health import draining
from composition.jobs.broker_losses import BrokerLossReconciler
from composition.jobs.queue_order import QueueOrder
from composition.lifecycle.base import Component
from composition.lifecycle.components import (
    BrokerComponent,
    CacheComponent,
    DatabaseComponent,
    LoggingComponent,
    MetricsComponent,
)
from composition.lifecycle.heartbeat import HeartbeatComponent
from composition.lifecycle.pids import pid_runs
from composition.lifecycle.processes import AwaitReady, ProcessComponent
from composition.lifecycle.system import System
from composition.lifecycle.worker_threads import WorkerComponent
from composition.limits import SlotRenewer
from composition.outbox.sweeper import RelaySweeperComponent
from composition.prometheus.archive import archive_reaped_child
from composition.prometheus.server import MetricsServerComponent
from composition.queues.history import HistoryRecorder
from composition.queues.refresher import QueuePauseRefresher
from composition.queues.shedding import ShedController
from composition.retention import RetentionComponent
from composition.sampling import MetricsSamplerComponent
from composition.schedules.component import SchedulerComponent

__all__ = [
    "BACKGROUND_DB_THREADS",
    "BACKGROUND_HELD_CONNECTIONS",
    "SCHEDULER_DB_THREADS",
    "ReadyFiles",
    "WorkerOptions",
    "build_supervisor",
    "build_worker_system",
    "child_argv",
    "worker_components",
]

# Threads besides the worker threads that may hold a database connection in a worker process,
# counted in the connection budget: the outbox relay sweeper, the deferred cache invalidation
# replay, the cache breaker's recovery probe (it replays deferred invalidations too), the
# retention pruner, the metrics sampler, the queue pause refresher, the shedding controller, the
# renewer of running tasks' leases and the broker loss reconciler. A web process has none: its
# request threads send what they publish after COMMIT themselves.
BACKGROUND_DB_THREADS = 9
# And one per host for the scheduler: in the worker process, or under --processes N in the
# supervisor (its children run none).
SCHEDULER_DB_THREADS = 1
# Behind a transaction pooler a connection is held for a transaction only. A worker thread running
# an idempotent job holds one for the whole job; the background threads' transactions are short,
# and one server connection per process that no job can take keeps their lease renewals and sweeps
# from queueing behind long jobs in the pooler (the sizing rule in docs/deployment.md).
BACKGROUND_HELD_CONNECTIONS = 1


@dataclass(frozen=True)
class WorkerOptions:
    processes: int = 1
    threads: int = 8
    # The queues to consume, in order (None: every declared queue, in Dramatiq's own order).
    queue_order: QueueOrder | None = None
    shutdown_timeout_s: float = 30.0
    # Serve /metrics on this port (None: not served by this process).
    metrics_port: int | None = None
    metrics_address: str = "0.0.0.0"
    # Run the scheduler (composition.schedules) in this process; the supervisor's children do not.
    schedules: bool = True
    # Written (the pid) once every component has started, removed at the first signal and at exit.
    ready_file: Path | None = None

    @classmethod
    def from_settings(cls) -> WorkerOptions:
        """Raises ``ConfigurationError`` for a ``WORKER_QUEUES`` that ``QueueOrder.parse`` refuses."""
        port = conf.WORKER_METRICS_PORT
        queues = conf.WORKER_QUEUES
        try:
            queue_order = None if queues is None else QueueOrder.parse(queues)
        except ValueError as exc:
            raise ConfigurationError(f"COMPOSITION['WORKER_QUEUES']: {exc}") from exc
        return cls(processes=int(conf.WORKER_PROCESSES), threads=int(conf.WORKER_THREADS),
                   queue_order=queue_order, shutdown_timeout_s=float(conf.SHUTDOWN_TIMEOUT_S),
                   metrics_port=None if port is None else int(port),
                   metrics_address=str(conf.WORKER_METRICS_ADDRESS))


def _metrics_components(options: WorkerOptions) -> list[Component]:
    """The multiprocess directory's upkeep, and the /metrics server when a port is set."""
    components: list[Component] = [MetricsComponent()]
    if options.metrics_port is not None:
        # With the host's worker check beside /metrics: a probe of it costs no process start.
        components.append(MetricsServerComponent(options.metrics_port, address=options.metrics_address,
                                                 health=partial(health.workers, local=True)))
    return components


def worker_components(options: WorkerOptions) -> list[Component]:
    broker = configured_broker()
    return [
        LoggingComponent(),
        *_metrics_components(options),
        DatabaseComponent(),
        CacheComponent(conf.CACHE_ALIAS),
        BrokerComponent(broker),
        # Before the worker threads: a pause set before a restart holds from the first message.
        QueuePauseRefresher(),
        # Before the worker threads, so a running job's concurrency slot is renewed until its end.
        SlotRenewer(),
        # Before the worker threads too, so a running task's result stays RUNNING until its end.
        *_task_components(),
        RelaySweeperComponent(broker),
        # Redis only: a loss of the broker's data, reconciled from the ledger.
        *([BrokerLossReconciler(broker)] if isinstance(broker, RedisBroker) else []),
        InvalidationReplayComponent(alias=conf.CACHE_ALIAS),
        RetentionComponent(),
        ShedController(),
        MetricsSamplerComponent(broker, connection_budget=connections_per_process(
            options.threads, BACKGROUND_DB_THREADS + (SCHEDULER_DB_THREADS if options.schedules else 0)),
            on_sample=HistoryRecorder(broker)),
        *([SchedulerComponent()] if options.schedules else []),
        HeartbeatComponent(float(conf.WORKER_HEARTBEAT_S), broker=broker),
        # Last: the first job runs once everything else is up, so a component that fails to start
        # rolls back a process that took no work; and first to stop, so all else outlives its drain.
        WorkerComponent(broker, queue_order=options.queue_order, threads=options.threads,
                        idle_poll_ms=int(conf.WORKER_IDLE_POLL_MS)),
    ]


def _task_components() -> list[Component]:
    """The renewer of running tasks' leases, in a project whose ``TASKS`` has an ``OutboxBackend``
    (imported only then: ``composition.tasks`` needs ``django.tasks`` or its backport)."""
    if not getattr(settings, "TASKS", None):
        return []
    from composition.tasks.setup import outbox_aliases

    if not outbox_aliases():
        return []
    from composition.tasks.leases import TaskLeaseRenewer

    return [TaskLeaseRenewer()]


def build_worker_system(options: WorkerOptions) -> System:
    return System(worker_components(options), shutdown_timeout_s=options.shutdown_timeout_s,
                  on_draining=draining.set_draining, ready_file=options.ready_file)


def child_argv(options: WorkerOptions, ready_file: Path | None = None) -> list[str]:
    argv = [sys.executable, "-m", "django", "runworkers", "--processes", "1",
            "--threads", str(options.threads), "--shutdown-timeout", str(options.shutdown_timeout_s),
            "--settings", settings.SETTINGS_MODULE]
    if ready_file is not None:
        argv += ["--ready-file", str(ready_file)]
    if options.queue_order is not None:
        argv += ["--queues", str(options.queue_order)]
    # The supervisor serves the whole multiprocess directory; a child serving too would only
    # compete for the port.
    argv += ["--metrics-port", "off"]
    # One scheduler per host is the supervisor's (more would only contend for the same rows).
    argv += ["--no-schedules"]
    return argv


def build_supervisor(options: WorkerOptions) -> System:
    """A system of ``options.processes`` child worker processes. The supervisor keeps the
    multiprocess metrics directory (archiving each child's files once it has reaped it), serves
    /metrics for all of them when a port is set, and runs the host's scheduler."""
    # The supervisor's import path too: a child started from another directory (manage.py run
    # by its path) finds the project's modules as the supervisor did.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(entry or os.getcwd() for entry in sys.path)}
    ready_files = ReadyFiles()
    children = [
        ProcessComponent(f"worker-process-{index}", child_argv(options, ready_files.path(index)), env=env,
                         ready_file=ready_files.path(index), on_exit=archive_reaped_child)
        for index in range(options.processes)
    ]
    # Children drain concurrently on the first signal (each gets SIGTERM and the same deadline);
    # the supervisor adds a little to its own timeout so it never cuts a clean child drain short.
    scheduler: list[Component] = []
    if options.schedules:
        scheduler = [DatabaseComponent(), BrokerComponent(configured_broker()), SchedulerComponent()]
    # The children start side by side; the supervisor is up once each one is (a child that fails
    # to start fails the supervisor's start, and is not reported later as one that died).
    return System([LoggingComponent(), *_metrics_components(options), *scheduler, ready_files, *children,
                   AwaitReady("worker-processes-ready", children)],
                  shutdown_timeout_s=options.shutdown_timeout_s + 2.0,
                  on_draining=draining.set_draining, ready_file=options.ready_file)


class ReadyFiles:
    """The directory of the children's ready files: made at start, removed at stop (a component
    before the children, so it outlives them). One a killed supervisor left is removed at the
    next start on the host."""

    name = "ready-files"
    PREFIX = "runworkers-ready-"

    def __init__(self) -> None:
        try:
            base = Path(tempfile.gettempdir())
        except FileNotFoundError:  # none writable: start() says so
            base = Path("/tmp")
        self.directory = base / f"{self.PREFIX}{os.getpid()}-{id(self):x}"

    def path(self, index: int) -> Path:
        return self.directory / f"worker-process-{index}"

    def start(self) -> None:
        for stale in self.directory.parent.glob(f"{self.PREFIX}*"):
            pid = stale.name.removeprefix(self.PREFIX).partition("-")[0]
            if pid.isdigit() and not pid_runs(int(pid)):
                shutil.rmtree(stale, ignore_errors=True)
        try:
            self.directory.mkdir(mode=0o700)
        except OSError as exc:
            raise ConfigurationError(f"the worker processes' ready files need a writable temporary directory "
                                     f"({self.directory.parent}: {exc.strerror or exc}); set TMPDIR") from exc

    def drain(self, deadline: float) -> None:
        pass

    def stop(self, timeout_s: float) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
