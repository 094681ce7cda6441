"""Run what is queued, in the test's own process: ``run_queued_jobs()`` relays committed outbox
rows, runs every due message of the queues on in-process worker threads (the same middleware as
``runworkers``: retries, dead letters, time limits, the ledger) until none is left, and reports
each run."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from composition.lifecycle.worker_threads import WorkerComponent
    from composition.outbox.relay import Relay

__all__ = ["JobRun", "JobsFailed", "QueuedJobsRun", "run_queued_jobs"]

OUTCOMES = ("success", "retry", "dead", "expired", "skipped")
# How often, and for how long, the queues must read empty before the run counts as done: a
# message a consumer has fetched but not yet handed to a thread is on no count for a moment.
POLL_S = 0.02
QUIET_S = 0.1
# After the timeout, how long a job still running has to end before it is interrupted and its
# message handed back: the call returns about then, not after the whole SHUTDOWN_TIMEOUT_S.
INTERRUPT_AFTER_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class JobRun:
    """One run of one message: ``outcome`` is ``success``, ``retry`` (it failed and waits for
    its backoff), ``dead`` (dead-lettered), ``expired`` (dropped unrun past its expiry) or
    ``skipped``; ``exception`` is the run's, if any."""

    actor_name: str
    queue_name: str
    message_id: str
    payload: dict[str, Any]
    outcome: str
    exception: BaseException | None

    def __str__(self) -> str:
        failure = f": {self.exception!r}" if self.exception is not None else ""
        return f"{self.actor_name} ({self.message_id}) {self.outcome}{failure}"


@dataclass(frozen=True)
class QueuedJobsRun:
    """What ``run_queued_jobs()`` ran, in the order the runs ended."""

    runs: tuple[JobRun, ...]

    def count(self, outcome: str | None = None, *, actor: str | None = None) -> int:
        """The runs with that outcome (any when None) of that actor (any when None)."""
        if outcome is not None and outcome not in OUTCOMES:
            raise ValueError(f"{outcome!r} is not an outcome: one of {', '.join(OUTCOMES)}")
        return sum(1 for run in self.runs if (outcome is None or run.outcome == outcome)
                   and (actor is None or run.actor_name == actor))

    @property
    def failures(self) -> tuple[JobRun, ...]:
        """The runs that raised: retried or dead-lettered."""
        return tuple(run for run in self.runs if run.outcome in ("retry", "dead"))


class JobsFailed(AssertionError):
    """Runs failed under ``run_queued_jobs(raise_failures=True)``; ``report`` has every run, and
    the first failure's exception is this one's cause."""

    def __init__(self, report: QueuedJobsRun) -> None:
        self.report = report
        lines = "\n".join(f"  {run}" for run in report.failures)
        super().__init__(f"{len(report.failures)} of {len(report.runs)} job runs failed:\n{lines}")


def run_queued_jobs(*queues: str, timeout_s: float = 30.0, threads: int = 1, delayed: bool = False,
                    raise_failures: bool = True) -> QueuedJobsRun:
    """Run, in this process, every job queued on the configured broker for ``queues`` (default:
    every declared queue), the jobs those jobs publish included, until none is due; return what
    ran. Committed outbox rows still pending are relayed first.

    Messages not yet due (a retry in its backoff, ``publish(..., delay_s=)``, one a limit put back
    to wait) are left where they are, unless ``delayed``: then the run also waits for them to come
    due and runs them. Raises ``JobsFailed`` when a run failed (unless ``raise_failures`` is
    False), TimeoutError when the queues still hold work after ``timeout_s``, and RuntimeError
    inside a transaction: the worker threads have connections of their own and cannot see
    uncommitted rows, so use ``TransactionTestCase`` (``pytest.mark.django_db(transaction=True)``)."""
    # Late: composition.testing is imported by settings modules, before the app registry exists.
    from django.db import connection

    from composition.broker.configured import configured_broker
    from composition.conf import conf
    from composition.jobs.middleware.run_signals import every_run_followed, job_run_ended
    from composition.jobs.queue_order import QueueOrder
    from composition.lifecycle.worker_threads import WorkerComponent
    from composition.outbox.relay import RELAY_QUEUE_NAME, Relay

    if connection.in_atomic_block:
        raise RuntimeError("run_queued_jobs() runs the jobs on threads of their own, which cannot see this "
                           "transaction's uncommitted rows: use TransactionTestCase "
                           "(pytest.mark.django_db(transaction=True))")
    if not (timeout_s > 0 and threads >= 1):
        raise ValueError(f"timeout_s must be above 0 and threads at least 1, not {timeout_s!r} and {threads!r}")
    broker = configured_broker()
    declared = sorted(name for name in broker.get_declared_queues() if name != RELAY_QUEUE_NAME)
    unknown = sorted(set(queues) - set(declared))
    if unknown:
        raise ValueError(f"no job declares queue {', '.join(map(repr, unknown))}: the declared queues are "
                         f"{', '.join(declared) or 'none'}")
    names = tuple(dict.fromkeys(queues)) or tuple(declared)
    if not names:
        raise ValueError("no job declares a queue: nothing to run")

    runs: list[JobRun] = []
    runs_lock = threading.Lock()

    def record(sender: Any, *, message: Any, outcome: str, exception: BaseException | None = None,
               **_: Any) -> None:
        with runs_lock:
            runs.append(JobRun(actor_name=message.actor_name, queue_name=message.queue_name,
                               message_id=message.message_id, payload=dict(message.kwargs), outcome=outcome,
                               exception=exception))

    relay = Relay(broker)
    workers = WorkerComponent(broker, queue_order=QueueOrder(names=names), threads=threads,
                              idle_poll_ms=int(POLL_S * 1000) or 1)
    deadline = time.monotonic() + timeout_s
    timed_out = False
    job_run_ended.connect(record, weak=False)
    try:
        with every_run_followed():
            workers.start()
            try:
                while True:
                    relayed = relay.run_until_idle()
                    _wait_until_idle(workers, relay, names, delayed=delayed, runs=runs, deadline=deadline)
                    # Work a job published whose send failed is a pending row again: relay it.
                    if relayed == 0 and relay.run_until_idle() == 0:
                        break
            except TimeoutError:
                timed_out = True
                raise
            finally:
                # Idle, nothing runs by now: the stop is at once. After a timeout, a job still
                # running is interrupted and its message handed back, for the call to end soon.
                try:
                    workers.stop(INTERRUPT_AFTER_TIMEOUT_S if timed_out else float(conf.SHUTDOWN_TIMEOUT_S))
                except (TimeoutError, RuntimeError):
                    if not timed_out:
                        raise
                    # The job did not unwind in time (or, on RabbitMQ, cannot be interrupted):
                    # the TimeoutError already says the queues held work; its thread ends by itself.
    finally:
        job_run_ended.disconnect(record)
    report = QueuedJobsRun(tuple(runs))
    if raise_failures and report.failures:
        raise JobsFailed(report) from report.failures[0].exception
    return report


def _wait_until_idle(workers: WorkerComponent, relay: Relay, names: Sequence[str], *, delayed: bool,
                     runs: list[JobRun], deadline: float) -> None:
    """Until the queues have read empty, with no run ending meanwhile, for ``QUIET_S``. With
    ``delayed`` the relay goes round each time: rows held in the outbox are released as they come
    due and sent."""
    quiet_since: float | None = None
    while True:
        ended_before = len(runs)
        if delayed:
            relay.run_until_idle()
        held = _held(workers, names, delayed=delayed)
        now = time.monotonic()
        if held or len(runs) != ended_before:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = now
        elif now - quiet_since >= QUIET_S:
            return
        if now >= deadline:
            raise TimeoutError(f"run_queued_jobs(): after its timeout the queues still hold work: {held or 'none'} "
                               "(a message a killed worker took stays taken until the broker's heartbeat "
                               "timeout: call empty_queues() before the test's jobs are published)")
        time.sleep(POLL_S)


def _held(workers: WorkerComponent, names: Sequence[str], *, delayed: bool) -> str:
    """What still holds work, as text ("" when nothing): the broker's counts and this worker's,
    and with ``delayed`` the outbox rows not yet sent (held until due, or pending)."""
    from composition.backpressure.depth import broker_counts
    from composition.outbox.models import OutboxMessage

    held = []
    for name in names:
        counts = broker_counts(name, workers.broker)
        waiting = counts.ready + (counts.in_flight or 0) + (counts.delayed if delayed else 0)
        if waiting:
            held.append(f"{name}: {counts.ready} ready, {counts.in_flight or 0} taken"
                        + (f", {counts.delayed} delayed" if delayed else ""))
    worker = workers.worker
    if worker is not None:
        if worker.work_queue.unfinished_tasks:
            held.append(f"{worker.work_queue.unfinished_tasks} fetched or running in this process")
        if delayed:
            waiting = sum(consumer.delay_queue.qsize() for consumer in worker.consumers.values())
            if waiting:
                held.append(f"{waiting} delayed, held by this process until due")
    if delayed:
        unsent = OutboxMessage.objects.filter(queue_name__in=names, status__in=(
            OutboxMessage.Status.PENDING, OutboxMessage.Status.HELD)).count()
        if unsent:
            held.append(f"{unsent} outbox rows not yet sent")
    return "; ".join(held)
