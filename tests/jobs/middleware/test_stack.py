"""The worker middleware stack on its own: its order, and one in-process run through every piece
of it on Dramatiq's in-memory ``StubBroker`` (the behaviour against Redis and real worker
processes is in scenarios/test_jobs_workers.py, jobs/middleware/test_dead_letters.py and broker/test_time_limits.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
import structlog
from dramatiq import Message, Worker
from dramatiq.broker import MessageProxy
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import CurrentMessage, Retries, ShutdownNotifications, TimeLimit, TimeLimitExceeded

from composition.broker.time_limits import JobShutdownNotifications, JobTimeLimit
from composition.jobs import current_message
from composition.jobs.middleware.dead_letters import DeadLetters
from composition.jobs.middleware.expiry import Expiry
from composition.jobs.middleware.in_flight import InFlight, InFlightRegistry
from composition.jobs.middleware.interrupted_queries import InterruptedQueries
from composition.jobs.middleware.job_metrics import JobMetrics, explained
from composition.jobs.middleware.limited_starts import LimitedStarts
from composition.jobs.middleware.message_context import MessageContext
from composition.jobs.middleware.paused_queues import PausedQueues
from composition.jobs.middleware.retries import JobRetries, options_as_fetched
from composition.jobs.middleware.stack import find_in_flight, find_middleware, job_middleware
from composition.jobs.middleware.unknown_actors import UnknownActors
from composition.testing import metric_value

QUEUE = "middleware_stack"


def test_the_stack_keeps_its_order_rules() -> None:
    stack = job_middleware()
    kinds = [type(middleware) for middleware in stack]
    assert kinds[-1] is JobTimeLimit, "JobTimeLimit last: its after-hook disarms first"
    assert kinds[-2] is InterruptedQueries, "then what an interrupt left mid-query is closed"
    assert Retries not in kinds and TimeLimit not in kinds and ShutdownNotifications not in kinds
    assert JobShutdownNotifications in kinds
    # A message past its expiry is dropped before it could take a limit slot or run any other hook.
    assert kinds[:3] == [PausedQueues, Expiry, LimitedStarts]
    # After-hooks run in reverse: the retry decision, then the in-flight table, the counts, the
    # dead letter, and the log context and current message last.
    ours = [CurrentMessage, MessageContext, UnknownActors, DeadLetters, JobMetrics, InFlightRegistry, JobRetries]
    positions = [kinds.index(kind) for kind in ours]
    assert positions == sorted(positions)
    registry = stack[kinds.index(InFlightRegistry)]
    for reader in (DeadLetters, JobMetrics):
        assert stack[kinds.index(reader)].in_flight is registry  # type: ignore[attr-defined]
    assert find_in_flight(StubBroker(middleware=job_middleware())) is not registry, "one registry per broker"


@pytest.fixture
def stub() -> Iterator[tuple[StubBroker, Worker]]:
    broker = StubBroker(middleware=job_middleware())
    broker.declare_queue(QUEUE)
    worker = Worker(broker, worker_threads=1, worker_timeout=20)
    worker.start()
    yield broker, worker
    worker.stop()
    broker.close()


def _count(actor: str, outcome: str) -> float:
    return metric_value("composition_jobs_total", actor=actor, outcome=outcome)


def test_a_run_is_current_in_flight_and_in_context_only_while_it_runs(stub: tuple[StubBroker, Worker]) -> None:
    broker, worker = stub
    registry = find_in_flight(broker)
    assert registry is not None
    seen: dict[str, Any] = {}

    @dramatiq.actor(broker=broker, queue_name=QUEUE, actor_name="stack_probe", time_limit=5_000)
    def probe() -> None:
        message = current_message()
        seen["message_id"] = message.message_id if message else None
        seen["state"] = registry.state()
        seen["context"] = structlog.contextvars.get_contextvars()

    before = _count("stack_probe", "success")
    sent = probe.send_with_options(composition={"request_id": "req-7"})
    broker.join(QUEUE, timeout=10_000)
    worker.join()

    assert seen["message_id"] == sent.message_id
    assert seen["state"]["jobs_in_flight"] == 1 and seen["state"]["max_job_s"] == 5.0
    assert [job["job_id"] for job in seen["state"]["jobs"]] == [sent.message_id]
    context = seen["context"]
    assert context.pop("worker").endswith(f":{os.getpid()}") and context.pop("thread")
    assert context == {"job_id": sent.message_id, "actor": "stack_probe", "attempt": 1, "request_id": "req-7"}
    assert registry.in_flight() == {} and registry.state()["jobs_in_flight"] == 0
    assert _count("stack_probe", "success") == before + 1
    assert current_message() is None, "outside a job"


def test_a_failed_run_is_counted_once_per_attempt(stub: tuple[StubBroker, Worker]) -> None:
    broker, worker = stub

    @dramatiq.actor(broker=broker, queue_name=QUEUE, actor_name="stack_fails", max_retries=1,
                    min_backoff=1, max_backoff=2, dead_letter=False)
    def fails() -> None:
        raise ValueError("no")

    retries, dead = _count("stack_fails", "retry"), _count("stack_fails", "dead")
    fails.send()
    broker.join(QUEUE, timeout=10_000, fail_fast=False)
    worker.join()

    assert (_count("stack_fails", "retry"), _count("stack_fails", "dead")) == (retries + 1, dead + 1)
    assert len(broker.dead_letters) == 1, "dead_letter=False leaves it to the broker's own queue"


def test_finished_names_only_the_run_that_just_ended_on_this_thread() -> None:
    registry = InFlightRegistry()
    message = MessageProxy(Message(queue_name=QUEUE, actor_name="nobody", args=(), kwargs={}, options={}))
    broker = StubBroker()
    registry.before_process_message(broker, message)
    assert registry.finished(message) is None, "still running"
    registry.after_process_message(broker, message)
    job = registry.finished(message)
    assert job is not None and (job.job_id, job.attempt, job.time_limit_s) == (message.message_id, 1, None)
    other = MessageProxy(Message(queue_name=QUEUE, actor_name="nobody", args=(), kwargs={}, options={}))
    assert registry.finished(other) is None


def test_the_options_as_fetched_keep_nothing_a_run_changed_in_place() -> None:
    fetched = {"retries": 0, "composition": {"request_id": "r", "worker_ids": ["a"]}, "throws": None}
    message = MessageProxy(Message(queue_name=QUEUE, actor_name="nobody", args=(), kwargs={},
                                   options={**fetched, "composition": {**fetched["composition"], "worker_ids": ["a"]}}))
    JobRetries().before_process_message(StubBroker(), message)
    message.options["composition"]["worker_ids"].append("b")
    message.options["retries"] = 1
    as_fetched = options_as_fetched(message)
    assert as_fetched == fetched
    as_fetched["composition"]["worker_ids"].append("c")
    assert options_as_fetched(message) == fetched, "each caller gets a copy of its own"


def test_a_time_out_is_explained_with_its_limit() -> None:
    job = InFlight("m", "slow", 1, 0.0, 0.0, time_limit_s=0.5)
    error = explained(TimeLimitExceeded(), job)
    assert type(error) is TimeLimitExceeded and str(error) == "job ran longer than 0.5s and was interrupted"
    assert "its time limit" in str(explained(TimeLimitExceeded(), None))
    other = ValueError("x")
    assert explained(other, job) is other
    assert find_middleware(StubBroker(), InFlightRegistry) is None
