"""The metrics sampler (queue depths, the oldest ready message, open dead letters): what it
reads, what it does when the broker freezes, and its settings (with the slow-query threshold's)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings
from dramatiq import Message
from dramatiq.broker import MessageProxy
from prometheus_client import REGISTRY

from composition.broker.configured import configured_broker
from composition.errors import PermanentError
from composition.jobs.deadletters import record_dead_letter
from composition.sampling import MetricsSamplerComponent


@pytest.mark.django_db
def test_the_sampler_sets_a_vanished_label_to_zero() -> None:
    actor = f"catalogue_{uuid.uuid4().hex[:8]}"
    sampler = MetricsSamplerComponent(configured_broker(), connection_budget=9)
    try:
        raise PermanentError("gone")
    except PermanentError as exc:
        pk = record_dead_letter(MessageProxy(Message(queue_name="default", actor_name=actor, args=(), kwargs={},
                                                     options={})), exc, attempts=1)
    assert (sampler.sample().dead_letters or {}).get(actor) == 1
    assert REGISTRY.get_sample_value("composition_dead_letters_open", {"actor": actor}) == 1
    from composition.jobs.models import DeadLetter

    DeadLetter.objects.filter(pk=pk).delete()
    sampler.sample()
    assert REGISTRY.get_sample_value("composition_dead_letters_open", {"actor": actor}) == 0


@pytest.mark.django_db
def test_a_frozen_broker_costs_one_timeout_and_keeps_the_last_readings(throwaway_redis_server: Any) -> None:
    import time

    from composition.broker.configured import build_broker

    broker = build_broker(throwaway_redis_server.url, heartbeat_timeout_s=4, maintenance_chance=0,
                          socket_timeout_s=0.3, connect_timeout_s=0.3, middleware=[])
    busy, idle = (f"catalogue-{name}-{uuid.uuid4().hex[:8]}" for name in ("busy", "idle"))
    for queue in (busy, idle):
        broker.declare_queue(queue)
    broker.enqueue(Message(queue_name=busy, actor_name="nobody", args=(), kwargs={}, options={}))
    sampler = MetricsSamplerComponent(broker, connection_budget=1)
    before = time.time()
    first = sampler.sample()
    assert {q.queue: q.depth for q in first.queues or ()} == {busy: 1, idle: 0}
    assert REGISTRY.get_sample_value("composition_broker_messages", {"queue": busy, "state": "ready"}) == 1
    read_at = REGISTRY.get_sample_value("composition_broker_read_timestamp_seconds", {"queue": busy})
    assert read_at is not None and read_at >= before

    throwaway_redis_server.freeze()
    try:
        started = time.monotonic()
        second = sampler.sample()
        took = time.monotonic() - started
    finally:
        throwaway_redis_server.thaw()
    assert set(second.errors) == {f"broker:{busy}", f"broker:{idle}"}
    assert took < 2 * 0.3 + 0.5, "the second queue waited for a broker already known to be down"
    assert second.database is not None and second.dead_letters is not None  # the other sources still read
    # What the broker could not say keeps its last reading, not a false 0.
    assert REGISTRY.get_sample_value("composition_queue_depth_messages", {"queue": busy}) == 1
    assert REGISTRY.get_sample_value("composition_broker_messages", {"queue": busy, "state": "ready"}) == 1
    # And says how old that reading is: it stood for a reading of now, and nothing paged.
    assert REGISTRY.get_sample_value("composition_broker_read_timestamp_seconds", {"queue": busy}) == read_at


@pytest.mark.django_db(transaction=True)
def test_the_read_time_of_a_queue_counts_from_the_start_and_one_no_longer_sampled_is_not_unread() -> None:
    # A broker down from the start left no series (BrokerUnread could not fire), and a queue
    # sampled once for its outbox rows kept its last read time for good (BrokerUnread fired).
    import time

    from composition.outbox import OutboxMessage

    broker = configured_broker()
    declared = next(iter(broker.get_declared_queues()))
    before = time.time()
    sampler = MetricsSamplerComponent(broker, connection_budget=1, interval_s=3600)
    sampler.start()
    try:
        assert (REGISTRY.get_sample_value("composition_broker_read_timestamp_seconds", {"queue": declared})
                or 0) >= before
        # A row left on a queue no code declares any more (its job moved to another queue).
        orphan = f"undeclared-{uuid.uuid4().hex[:8]}"
        row = OutboxMessage.objects.create(actor_name="moved", queue_name=orphan, payload={})
        sampler.sample()
        first = REGISTRY.get_sample_value("composition_broker_read_timestamp_seconds", {"queue": orphan})
        assert first is not None
        row.delete()  # relayed, say: the queue is sampled no more
        time.sleep(0.05)
        sampler.sample()
        later = REGISTRY.get_sample_value("composition_broker_read_timestamp_seconds", {"queue": orphan})
        assert later is not None and later > first
    finally:
        sampler.stop(5.0)


def test_the_sampling_and_slow_query_settings_are_checked() -> None:
    from django.core.checks import run_checks

    def ids(**overrides: Any) -> set[str]:
        with override_settings(COMPOSITION={**settings.COMPOSITION, **overrides}):
            return {message.id for message in run_checks() if message.id and message.id.startswith("composition.")}

    assert not {"composition.E073", "composition.E074"} & ids(DB_SLOW_QUERY_S=None)
    assert "composition.E074" in ids(DB_SLOW_QUERY_S=0)
    assert "composition.E073" in ids(METRICS_SAMPLE_INTERVAL_S="15")


@pytest.fixture
def age_queue() -> Iterator[str]:
    broker = configured_broker()
    queue = f"catalogue-age-{uuid.uuid4().hex[:8]}"
    broker.declare_queue(queue)
    yield queue
    broker.flush(queue)


def test_the_oldest_ready_message_age_counts_from_its_creation_or_its_eta(age_queue: str) -> None:
    import time

    from composition.sampling import oldest_ready_age_s

    broker = configured_broker()
    if getattr(broker, "client", None) is None:
        pytest.skip("the oldest message's age is read on the Redis broker only")
    now_ms = int(time.time() * 1000)
    assert oldest_ready_age_s(broker, age_queue) == 0.0
    broker.enqueue(Message(queue_name=age_queue, actor_name="nobody", args=(), kwargs={}, options={},
                           message_timestamp=now_ms - 60_000))
    broker.enqueue(Message(queue_name=age_queue, actor_name="nobody", args=(), kwargs={}, options={},
                           message_timestamp=now_ms - 120_000))
    assert oldest_ready_age_s(broker, age_queue, now_s=now_ms / 1000) == pytest.approx(60, abs=0.01)
    # A retried message is ready from its eta, not from when it was first created.
    broker.flush(age_queue)
    broker.enqueue(Message(queue_name=age_queue, actor_name="nobody", args=(), kwargs={},
                           options={"eta": now_ms - 10_000}, message_timestamp=now_ms - 600_000))
    assert oldest_ready_age_s(broker, age_queue, now_s=now_ms / 1000) == pytest.approx(10, abs=0.01)


# -- alert rules ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_pending_cache_invalidations_are_counted_with_the_age_of_the_oldest() -> None:
    # Nothing showed an invalidation waiting for the replay: the window in which other processes
    # may serve the value its write replaced.
    from datetime import timedelta

    from django.utils import timezone

    from composition.cache.models import PendingInvalidation

    sampler = MetricsSamplerComponent(configured_broker(), connection_budget=9)
    sampler.sample()
    assert REGISTRY.get_sample_value("composition_cache_invalidations_pending", {"alias": "default"}) == 0
    now = timezone.now()
    for target in ("sampled:1", "sampled:2"):
        PendingInvalidation.objects.create(alias="default", kind="key", target=target)
    PendingInvalidation.objects.filter(target="sampled:1").update(created_at=now - timedelta(seconds=90))
    sampler.sample()
    assert REGISTRY.get_sample_value("composition_cache_invalidations_pending", {"alias": "default"}) == 2
    age = REGISTRY.get_sample_value("composition_cache_invalidation_oldest_pending_age_seconds", {"alias": "default"})
    assert age is not None and 89 <= age < 120
    PendingInvalidation.objects.all().delete()
    sampler.sample()
    assert REGISTRY.get_sample_value("composition_cache_invalidation_oldest_pending_age_seconds",
                                     {"alias": "default"}) == 0
