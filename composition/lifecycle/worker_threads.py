"""Dramatiq worker threads as a component: consume in the queue order given, drain on the first
signal, hand back the rest."""

from __future__ import annotations

import logging
import threading
import time

import structlog
from dramatiq import Worker
from dramatiq.broker import Broker
from dramatiq.middleware import Middleware

from composition.broker.time_limits import boot_worker_process
from composition.errors import described
from composition.jobs.deploy_window import accept_unknown_jobs
from composition.jobs.queue_order import OrderedWorkQueue, QueueOrder
from composition.jobs.runtime import BrokerKeepalive, drain_worker, stop_intake
from composition.logging import ShutdownIsNoFailure

__all__ = ["WorkerComponent"]

log = structlog.get_logger("composition.components")

# What a start that failed half-way gives the threads it did start to hand their messages back.
FAILED_START_STOP_S = 5.0


class WorkerComponent:
    """Dramatiq worker threads. ``begin_drain`` stops consumption at once; ``drain`` lets running
    jobs finish until the deadline, interrupts the rest (requeued without using an attempt) and
    hands every unfinished message back to the broker (``composition.jobs.runtime``). While
    started, a keepalive keeps the Redis broker from taking this process for a dead worker.
    With more than one queue in ``queue_order`` besides the relay's, the threads take work in
    that order (``OrderedWorkQueue``); otherwise in Dramatiq's own."""

    name = "workers"
    depends_on = ("database", "broker")

    def __init__(self, broker: Broker, *, queue_order: QueueOrder | None, threads: int,
                 idle_poll_ms: int) -> None:
        self.broker = broker
        self.queue_order = queue_order
        self.queues = set(queue_order.queues) if queue_order is not None else None
        self.threads = threads
        self.idle_poll_ms = idle_poll_ms
        self.worker: Worker | None = None
        self._worker_middleware: list[Middleware] = []
        self._stopped = False
        self._drained = threading.Event()
        # Several beats within the broker's heartbeat timeout, so one late beat does not count.
        heartbeat_timeout_s = float(getattr(broker, "heartbeat_timeout", 60_000)) / 1000
        self.keepalive = BrokerKeepalive(broker, interval_s=max(0.5, heartbeat_timeout_s / 4))

    def start(self) -> None:
        # As Dramatiq's CLI does, once per process before any worker: starts the time limits.
        boot_worker_process(self.broker)
        dramatiq_threads = logging.getLogger("dramatiq.worker.WorkerThread")
        if not any(isinstance(each, ShutdownIsNoFailure) for each in dramatiq_threads.filters):
            dramatiq_threads.addFilter(ShutdownIsNoFailure())
        try:
            self._start()
        except BaseException:
            # Threads and consumers that did start before one the host refused (a container's
            # pid limit) would go on taking and running jobs while the System rolls back the
            # database and the broker under them: the System stops only the components that
            # started, so this one cleans up its own part.
            try:
                self._stop(time.monotonic() + FAILED_START_STOP_S)
            except Exception as exc:  # the start's own failure is the one to report
                log.error("worker threads of a failed start not cleaned up", error=described(exc))
            raise

    def _start(self) -> None:
        # A job this code does not know waits for the deploy, then is parked, rather than being
        # rejected by Dramatiq's consumer (composition.jobs.deploy_window).
        accept_unknown_jobs(self.broker)
        # RabbitMQ: a queue it refuses to declare (one of another type) fails this start, with
        # what to do, rather than Dramatiq's consumer threads, which retry for ever.
        ensure_queues = getattr(self.broker, "ensure_queues", None)
        if ensure_queues is not None:
            ensure_queues(sorted(queue for queue in self.broker.get_declared_queues()
                                 if self.queues is None or queue in self.queues))
        self.worker = Worker(self.broker, queues=self.queues, worker_threads=self.threads,
                             worker_timeout=self.idle_poll_ms)
        order = self.queue_order
        # Only where there is an order to keep: otherwise Dramatiq's one PriorityQueue, which
        # costs nothing more. Before start(), which hands the queue to consumers and threads.
        if order is not None and order.orders_several:
            self.worker.work_queue = OrderedWorkQueue(order, threads=self.threads)
            log.info("worker threads take work in queue order", queues=str(order),
                     mode="strict" if order.weights is None else "weighted", threads=self.threads,
                     reserved_for_first_queue=order.reserved_threads(self.threads))
        before = list(self.broker.middleware)
        self.worker.start()
        # What the Worker's start added to the broker for itself (it adds consumers as queues are
        # declared), taken off again at the stop: a stopped worker must not start consumers, and
        # a test process starts many (composition.testing.run_queued_jobs).
        self._worker_middleware = [each for each in self.broker.middleware if not any(each is old for old in before)]
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
        if self._stopped:
            return
        self._stopped = True
        try:
            if self.worker is not None:
                drain_worker(self.worker, deadline)
        finally:
            self.keepalive.stop()
            accept_unknown_jobs(self.broker, False)
            for middleware in self._worker_middleware:
                self.broker.middleware.remove(middleware)
            self._worker_middleware = []
            self._drained.set()
