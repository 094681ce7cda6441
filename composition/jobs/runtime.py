"""What a worker process needs around Dramatiq's ``Worker``: a graceful drain and a broker
heartbeat that does not depend on the consumers polling.

Drain (Redis broker): intake stops at once, running jobs get until the deadline and are then
interrupted with ``Shutdown`` through the time-limit watchdog, and every message fetched but not
finished goes back to its queue at once; on RabbitMQ, Dramatiq's own ``Worker.stop``.
``BrokerKeepalive`` beats well inside the heartbeat timeout, so a worker whose consumers send
nothing while long jobs run is not taken for a dead one.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Collection, Iterable

import structlog
from dramatiq import Worker
from dramatiq.broker import Broker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Shutdown

from composition.broker.keys import acks_key
from composition.broker.redis_consumer import WakingRedisConsumer, end_waits
from composition.broker.time_limits import interrupt_running_job
from composition.jobs.middleware.in_flight import InFlight
from composition.jobs.middleware.stack import find_in_flight
from composition.jobs.recovery import return_dead_workers_messages

__all__ = ["BrokerKeepalive", "drain_worker", "requeue_unacked", "stop_intake"]

log = structlog.get_logger("composition.jobs")

# Jobs still running this long before the deadline are interrupted, to unwind (roll back,
# requeue) by the deadline; at most a quarter of the whole drain. Unwinding gets at least
# MIN_UNWIND_S, after which the remaining messages are handed back regardless.
INTERRUPT_GRACE_S = 2.0
MIN_UNWIND_S = 0.5
# How long to wait for consumer threads to leave their poll or wait (ended by stop_intake).
CONSUMER_JOIN_S = 2.0
# Message ids per requeue command: Lua unpacks arguments onto a bounded stack.
REQUEUE_BATCH = 500

_intake_stopped: weakref.WeakSet[Worker] = weakref.WeakSet()
# The thread ending a stopped worker's consumers' waits (end_waits), joined by the drain.
_ending_waits: weakref.WeakKeyDictionary[Worker, threading.Thread | None] = weakref.WeakKeyDictionary()


def stop_intake(worker: Worker) -> None:
    """Worker threads take no new message, and on Redis the consumers stop fetching; running
    jobs go on.

    A RabbitMQ consumer thread keeps running until ``drain_worker`` stops the worker, as
    Dramatiq's own ``Worker.stop`` keeps it: its connection is serviced only by it, so stopped,
    it sent no heartbeats and the acknowledgements of jobs finishing meanwhile waited in it;
    a drain longer than the heartbeat timeout then had RabbitMQ close the connection and deliver
    those jobs again, to run twice. What it fetches meanwhile stays unacknowledged and goes back
    when the worker closes.

    Idempotent; the broker's ``before_worker_shutdown`` hooks run once.
    """
    if worker in _intake_stopped:
        return
    _intake_stopped.add(worker)
    worker.broker.emit_before("worker_shutdown", worker)
    for thread in worker.workers:
        thread.stop()
    if isinstance(worker.broker, RedisBroker):
        for consumer in worker.consumers.values():
            consumer.stop()
        # A consumer waiting for a message on an empty queue sees its stop flag at once.
        _ending_waits[worker] = end_waits(thread.consumer for thread in worker.consumers.values()
                                          if isinstance(thread.consumer, WakingRedisConsumer))
    # Said once intake has stopped (the signal's "draining" line comes before it): from here no
    # new job starts in this worker.
    log.info("worker intake stopped; running jobs go on", threads=len(worker.workers))


def _join(threads: Iterable[threading.Thread], deadline: float) -> None:
    for thread in threads:
        # A thread the host refused (Dramatiq lists a consumer before starting it) is not
        # joined: that raises, and would end the drain before the hand-back.
        if thread.ident is not None:
            thread.join(max(0.0, deadline - time.monotonic()))


def drain_worker(worker: Worker, deadline: float) -> int:
    """Finish or hand back everything ``worker`` holds; returns how many messages were requeued.
    Raises RuntimeError, once the rest is handed back, when a job is still running after its
    interrupt (its message is kept back: see the comment below).

    ``stop_intake`` must have been called (it is, again, harmlessly).
    """
    broker = worker.broker
    stop_intake(worker)
    if not isinstance(broker, RedisBroker):
        worker.stop(timeout=max(1, int((deadline - time.monotonic()) * 1000)))
        return 0
    # Interrupt a little before the deadline, so that unwinding also fits in the shutdown timeout.
    grace_s = min(INTERRUPT_GRACE_S, max(0.0, deadline - time.monotonic()) / 4)
    _join(worker.workers, deadline - grace_s)
    busy = [thread for thread in worker.workers if thread.is_alive()]
    registry = find_in_flight(broker)
    running = registry.in_flight() if registry is not None else {}
    for thread in busy:
        if thread.ident in running:
            _interrupt(thread.ident, running[thread.ident])
    _join(busy, max(deadline, time.monotonic() + MIN_UNWIND_S))
    # A job the interrupt did not end (it catches BaseException, or sits in C code) is still
    # running: handed back now, another worker would run its message beside it. It stays with
    # this process and comes back through the broker's recovery once the process is gone.
    running = registry.in_flight() if registry is not None else {}
    still_running = [running[thread.ident] for thread in busy if thread.is_alive() and thread.ident in running]
    consumers_deadline = time.monotonic() + CONSUMER_JOIN_S
    _join(worker.consumers.values(), consumers_deadline)
    ending = _ending_waits.pop(worker, None)
    if ending is not None:
        _join([ending], consumers_deadline)
    requeued = requeue_unacked(broker, keep={job.redis_message_id for job in still_running if job.redis_message_id})
    for consumer in worker.consumers.values():
        consumer.close()
    broker.emit_after("worker_shutdown", worker)
    if requeued:
        log.info("unfinished messages handed back to the broker", count=requeued)
    if still_running:
        for job in still_running:
            log.error("job still running after the drain interrupted it; its message is not handed back while "
                      "it runs, and returns through the broker's recovery once this process is gone",
                      job_id=job.job_id, actor=job.actor)
        raise RuntimeError(f"{len(still_running)} job(s) still running after the drain")
    return requeued


def _interrupt(thread_id: int, job: InFlight) -> None:
    """Interrupt a job still running at the deadline with ``Shutdown``, through the time-limit
    watchdog (``interrupt_running_job``): its body is cut, its retry or dead-letter bookkeeping
    is not."""
    if interrupt_running_job(thread_id, Shutdown):
        log.warning("job still running at the deadline, interrupting", job_id=job.job_id, actor=job.actor)
    else:
        log.info("job not interrupted at the deadline: past its body (retry or dead-letter bookkeeping), or its "
                 "time limit's interrupt already raised and not yet unwound", job_id=job.job_id, actor=job.actor)


def requeue_unacked(broker: RedisBroker, *, keep: Collection[str] = ()) -> int:
    """Move every message this broker instance fetched and has not acknowledged back to its
    queue, but those whose Redis ids are in ``keep``; returns how many. Safe against late
    acknowledgements: acking a requeued message is a no-op for the Redis broker."""
    queues = set(broker.get_declared_queues()) | set(broker.delay_queues)
    total = 0
    for queue_name in sorted(queues):
        key = acks_key(broker.namespace, broker.broker_id, queue_name)
        ids = [message_id for raw in broker.client.smembers(key)
               if (message_id := raw.decode() if isinstance(raw, bytes) else raw) not in keep]
        for start in range(0, len(ids), REQUEUE_BATCH):
            batch = ids[start:start + REQUEUE_BATCH]
            broker.do_requeue(queue_name, *batch)
            total += len(batch)
    return total


class BrokerKeepalive:
    """Refreshes this process's Redis-broker heartbeat every ``interval_s`` (see module doc)."""

    def __init__(self, broker: Broker, interval_s: float) -> None:
        self.broker = broker
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if not isinstance(self.broker, RedisBroker):
            return
        thread = threading.Thread(target=self._loop, name="broker-keepalive", daemon=True)
        thread.start()
        self._thread = thread  # once started: a thread the host refused cannot be joined

    def _loop(self) -> None:
        assert isinstance(self.broker, RedisBroker)
        broker = self.broker
        chance = broker.maintenance_chance
        # After a Redis outage longer than the heartbeat timeout every worker's last beat is old:
        # recovering at once would take live workers' messages (they run twice), so wait one.
        steady_after_s = broker.heartbeat_timeout / 1000
        # Since when this process's beats have all gone through; -inf at start, so a dead
        # predecessor's messages come back now.
        steady_since: float | None = float("-inf")
        wait_s = 0.0
        while not self._stop.wait(wait_s):
            wait_s = self.interval_s
            now = time.monotonic()
            steady = steady_since is not None and now - steady_since >= steady_after_s
            try:
                # Records this worker's heartbeat, and returns dead workers' messages at once
                # rather than by Dramatiq's chance maintenance (composition.jobs.recovery);
                # after an outage of our own, only the heartbeat, until the others beat again.
                return_dead_workers_messages(broker, recover=steady)
            except Exception as exc:  # the consumers report broker outages; keep trying
                steady_since = None
                broker.maintenance_chance = 0
                log.warning("broker keepalive failed", error=str(exc))
                continue
            if steady_since is None:
                steady_since = now
            elif steady:
                broker.maintenance_chance = chance

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval_s + 1.0)
