"""A retry the broker refuses (Redis restarting or frozen at the moment a failed job's retry is
enqueued) is not lost (``composition.jobs.middleware.retries``): tried again for a few seconds, then the
message fails, which DeadLetters records as a dead letter. Against a private Valkey server that
the tests stop and freeze, never the shared one."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import dramatiq
import pytest
from dramatiq import Message
from dramatiq.broker import Broker, MessageProxy

from composition.broker.configured import build_broker
from composition.jobs.middleware.retries import BACKOFF_OPTION, RETRY_ENQUEUE_PAUSES_S, JobRetries
from composition.testing import ThrowawayRedis

QUEUE = "retry_probe"


@pytest.fixture
def broker(throwaway_redis_server: ThrowawayRedis) -> Iterator[Broker]:
    broker = build_broker(throwaway_redis_server.url, heartbeat_timeout_s=5.0, maintenance_chance=0,
                          socket_timeout_s=0.3, connect_timeout_s=0.3, middleware=[JobRetries()])
    dramatiq.actor(lambda: None, broker=broker, actor_name="retry_probe", queue_name=QUEUE, max_retries=3)
    yield broker
    broker.client.close()  # type: ignore[attr-defined]


def _failed_attempt(broker: Broker) -> tuple[MessageProxy, float]:
    """A first attempt of a retry_probe message that failed transiently, through JobRetries; the
    message and how long its after-hook took."""
    message = MessageProxy(Message(queue_name=QUEUE, actor_name="retry_probe", args=(), kwargs={}, options={}))
    retries = next(m for m in broker.middleware if isinstance(m, JobRetries))
    began = time.monotonic()
    retries.after_process_message(broker, message, exception=RuntimeError("the job's own transient error"))
    return message, time.monotonic() - began


def _delayed(broker: Any) -> int:
    return int(broker.client.hlen(f"{broker.namespace}:{QUEUE}.DQ.msgs"))


def test_a_retry_the_broker_refuses_for_good_fails_the_message_for_its_dead_letter(
        broker: Broker, throwaway_redis_server: ThrowawayRedis) -> None:
    throwaway_redis_server.stop()
    message, took = _failed_attempt(broker)
    assert message.failed, "acked with its retry lost"
    assert took < sum(RETRY_ENQUEUE_PAUSES_S) + 4 * 1.0, took


def test_a_retry_refused_while_the_broker_is_frozen_goes_out_once_it_answers(
        broker: Broker, throwaway_redis_server: ThrowawayRedis) -> None:
    throwaway_redis_server.freeze()
    threading.Timer(0.6, throwaway_redis_server.thaw).start()
    message, _ = _failed_attempt(broker)
    assert not message.failed
    assert message.options["retries"] == 1
    assert _delayed(broker) == 1  # the retry, waiting out its backoff


@pytest.mark.parametrize("options", [{"max_backoff": 5}, {"min_backoff": 0}, {"min_backoff": "soon"},
                                     {"min_backoff": 10**9, "max_backoff": 1000}])
def test_a_per_message_backoff_out_of_bounds_still_retries(broker: Broker, options: dict[str, Any]) -> None:
    # send_with_options(max_backoff=...) below the job's minimum (or a minimum of 0, or not a
    # number) raised in the after-hook: Dramatiq logged it and acked the message, neither
    # retried nor dead-lettered. It is retried, within the bounds that make sense.
    message = MessageProxy(Message(queue_name=QUEUE, actor_name="retry_probe", args=(), kwargs={}, options=options))
    retries = next(m for m in broker.middleware if isinstance(m, JobRetries))
    retries.after_process_message(broker, message, exception=RuntimeError("transient"))
    assert not message.failed
    assert message.options["retries"] == 1 and _delayed(broker) == 1


def test_a_job_s_own_retry_delay_is_the_one_recorded_for_its_log_and_its_schedule_lease(broker: Broker) -> None:
    # raise dramatiq.Retry(delay=...) was retried after its delay, but the retry's log line said
    # delay_ms null (or the previous attempt's backoff), and a scheduled run's lease was sized
    # without it, so overlap="skip" could fire the next tick while the retry waited.
    message = MessageProxy(Message(queue_name=QUEUE, actor_name="retry_probe", args=(), kwargs={},
                                   options={BACKOFF_OPTION: 10_000, "retries": 1}))
    retries = next(m for m in broker.middleware if isinstance(m, JobRetries))
    retries.after_process_message(broker, message, exception=dramatiq.Retry(delay=120_000))
    assert not message.failed
    assert message.options[BACKOFF_OPTION] == 120_000
    assert _delayed(broker) == 1


@pytest.mark.parametrize(("delay", "recorded"), [(timedelta(seconds=30), 30_000), ("30s", 10_000),
                                                 (float("nan"), 10_000)], ids=["timedelta", "text", "nan"])
def test_a_job_s_retry_delay_that_is_no_number_of_milliseconds_still_retries(
        broker: Broker, delay: Any, recorded: int) -> None:
    # Retry(delay=timedelta(...)) made Dramatiq's Retries raise TypeError in its after-hook:
    # logged, and the message acked, neither retried nor dead-lettered. A timedelta is taken for
    # what it says; anything else that is no number gets the job's backoff (10 s at a first retry).
    message = MessageProxy(Message(queue_name=QUEUE, actor_name="retry_probe", args=(), kwargs={},
                                   options={"min_backoff": 10_000}))
    retries = next(m for m in broker.middleware if isinstance(m, JobRetries))
    retries.after_process_message(broker, message, exception=dramatiq.Retry("rate limited", delay=delay))
    assert not message.failed
    assert message.options["retries"] == 1 and _delayed(broker) == 1
    assert recorded <= message.options[BACKOFF_OPTION] <= recorded * 1.5  # the backoff's jitter


def test_after_a_redis_outage_a_live_worker_s_messages_are_not_taken_for_a_dead_one(
        throwaway_redis_server: ThrowawayRedis) -> None:
    # Two live workers, A and B; Redis is away longer than the heartbeat timeout, so both last
    # beats are old when it returns. A, back first, must not hand B's unfinished message back
    # (it would run twice): it beats, and recovers only once B has had the time to beat too.
    from composition.jobs.runtime import BrokerKeepalive

    def worker() -> Any:
        broker = build_broker(throwaway_redis_server.url, heartbeat_timeout_s=1.0, maintenance_chance=0,
                              socket_timeout_s=0.2, connect_timeout_s=0.2, middleware=[])
        dramatiq.actor(lambda: None, broker=broker, actor_name="retry_probe", queue_name=QUEUE)
        return broker

    a, b = worker(), worker()
    b.enqueue(Message(queue_name=QUEUE, actor_name="retry_probe", args=(), kwargs={}, options={}))
    consumer = b.consume(QUEUE, prefetch=1, timeout=1000)
    taken = next(iter(consumer))
    assert taken is not None
    b_unacked = f"{b.namespace}:__acks__.{b.broker_id}.{QUEUE}"  # type: ignore[attr-defined]
    a_keepalive, b_keepalive = BrokerKeepalive(a, interval_s=0.2), BrokerKeepalive(b, interval_s=0.2)
    a_keepalive.start()
    try:
        time.sleep(0.5)
        throwaway_redis_server.freeze()
        time.sleep(1.5)  # longer than the heartbeat timeout
        throwaway_redis_server.thaw()
        time.sleep(0.5)  # A beats again first; B's keepalive reconnects later
        b_keepalive.start()
        time.sleep(1.5)  # A's recovery runs again, B beating all along
        unacked = b.client.smembers(b_unacked)  # type: ignore[attr-defined]
        assert taken.options["redis_message_id"].encode() in unacked, "B's message was taken back while B lived"
    finally:
        a_keepalive.stop()
        b_keepalive.stop()
        consumer.close()
        for broker in (a, b):
            broker.client.close()  # type: ignore[attr-defined]
