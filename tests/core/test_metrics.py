"""``docs/metrics.md`` lists exactly the metrics composition and billing register, with their
types and labels, and every family it lists is in a real ``/metrics`` scrape after one pay, one
cache miss and hit, one lock time-out, one lock lost, one slow query and one dead letter, whose counters moved
by exactly what those did."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import DataError, connection, transaction
from django.test import Client, override_settings
from dramatiq import Message
from dramatiq.broker import MessageProxy
from dramatiq.middleware import SkipMessage
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from composition.backpressure.admission import Backpressure, admit
from composition.broker.configured import configured_broker
from composition.cache import cache_aside_result
from composition.cache.engine import CacheAside, CacheResult
from composition.cache.serializers import load_serializer
from composition.conf import conf
from composition.errors import IncompatibleMessageError, PermanentError
from composition.health.checks import reset_readiness_cache
from composition.jobs.deadletters import record_dead_letter
from composition.jobs.deploy_window import refuse
from composition.jobs.middleware import LimitedStarts
from composition.jobs.middleware.dead_letters import write_dead_letter
from composition.limits import limit_store
from composition.locks import LockNotAcquired, StaleFence, acquire_redis_lock, fenced_write, redis_lock
from composition.outbox.maintenance import prune_sent
from composition.pauses import Pause
from composition.queues import QueuePauseRefresher, ShedController, pause_queue
from composition.sampling import MetricsSamplerComponent
from composition.schedules import Schedule
from composition.schedules.component import SchedulerComponent
from tests.helpers import elsewhere, post_json
from tests.jobsapp import jobs
from tests.metrics_catalogue import (
    OWN_PREFIXES,
    RUNWORKERS_ONLY,
    catalogue,
    family_name,
    own_metrics,
)


def test_every_registered_metric_is_in_the_catalogue_and_nothing_else_is() -> None:
    documented = catalogue()
    own = own_metrics()
    registered = {family.name for family in REGISTRY.collect() if family.name.startswith(OWN_PREFIXES)}
    # Defined anywhere but composition/metrics.py and billing/metrics.py: the house rule is broken.
    assert registered == {family_name(name, kind) for name, (kind, _) in own.items()}, \
        "a composition_/billing_ metric is defined outside the metrics modules"
    documented_own = {name: row for name, row in documented.items() if name.startswith(OWN_PREFIXES)}
    assert sorted(set(own) - set(documented_own)) == [], "registered but missing from docs/metrics.md"
    assert sorted(set(documented_own) - set(own)) == [], "in docs/metrics.md but not registered"
    assert {name: row for name, row in documented_own.items() if own[name] != row} == {}, \
        "type or labels in docs/metrics.md differ from the definition"
    # The django-prometheus families listed are real too.
    from django_prometheus.middleware import Metrics

    Metrics.get_instance()  # its middleware registers them on first use
    django_families = {family.name for family in REGISTRY.collect()}
    for name, (kind, _) in documented.items():
        if not name.startswith(OWN_PREFIXES):
            assert family_name(name, kind) in django_families, f"{name} is documented, nothing registers it"


# -- a real scrape after real work ------------------------------------------------------------
def _scrape(client: Client) -> dict[str, Any]:
    response = client.get("/metrics")
    assert response.status_code == 200
    return {family.name: family for family in text_string_to_metric_families(response.content.decode())}


def _value(families: dict[str, Any], family: str, sample: str, **labels: str) -> float:
    """The sum of ``sample``'s values whose labels include ``labels`` (0 when none)."""
    if family not in families:
        return 0.0
    return sum(s.value for s in families[family].samples
               if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()))


@pytest.fixture
def no_slow_queries() -> Iterator[None]:
    """No query counts as slow unless a test says so: on a loaded machine any query might."""
    with override_settings(COMPOSITION={**settings.COMPOSITION, "DB_SLOW_QUERY_S": None}):
        yield


@pytest.mark.django_db(transaction=True)  # the outbox send and the invalidation run after COMMIT
# The receipt and the put-back limited job, left for no other test's workers.
@pytest.mark.empty_queues("billing", jobs.LIMIT_QUEUE)
@pytest.mark.usefixtures("no_cached_invoices", "no_slow_queries")
def test_a_scrape_after_real_work_holds_every_family_and_counters_moved_exactly(api_client: Client) -> None:
    actor = f"catalogue_{uuid.uuid4().hex[:8]}"
    lock_name = f"catalogue-{uuid.uuid4().hex[:8]}"
    before = _scrape(api_client)

    # One pay through the API (the invoice first), then one miss and one hit on its answer.
    created = post_json(api_client, "/api/invoices", {"number": f"CAT-{uuid.uuid4().hex[:8]}",
                                                   "customer": "Ada", "amount_cents": 4200})
    assert created.status_code == 201, created.content
    invoice_id = created.json()["id"]
    paid = post_json(api_client, f"/api/invoices/{invoice_id}/pay",
                 {"payment_id": uuid.uuid4().hex, "amount_cents": 4200})
    assert paid.status_code == 201, paid.content
    for _ in range(2):
        assert api_client.get(f"/api/invoices/{invoice_id}").json()["status"] == "paid"
    # One lock time-out: the lock is held, a second caller waits 50 ms for it in vain.
    with redis_lock(f"{lock_name}:x", ttl_s=5), pytest.raises(LockNotAcquired):
        elsewhere(lambda: acquire_redis_lock(f"{lock_name}:x", ttl_s=5, wait_s=0.05))
    # One lock lost: its TTL ran out under its body.
    with redis_lock(f"{lock_name}:lost", ttl_s=0.05):
        time.sleep(0.15)
    # One slow query, the only statement under a threshold it exceeds.
    with override_settings(COMPOSITION={**settings.COMPOSITION, "DB_SLOW_QUERY_S": 0.2}), \
            connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(0.3)")
    # One dead letter, recorded as the worker records it.
    try:
        raise PermanentError("no such account")
    except PermanentError as exc:
        record_dead_letter(MessageProxy(Message(queue_name="default", actor_name=actor, args=(), kwargs={},
                                                options={})), exc, attempts=1)
    # One tick of a schedule, fired as a scheduler fires it (the database's clock driven).
    schedule_name = f"catalogue-{uuid.uuid4().hex[:8]}"
    ticking = Schedule(name=schedule_name, actor_name=jobs.scheduled_effect.actor_name, every=timedelta(seconds=10),
                       payload={"label": schedule_name})
    clock = [datetime(2026, 6, 1, 12, 0, 1, tzinfo=UTC)]
    scheduler = SchedulerComponent([ticking], clock=lambda: clock[0])
    scheduler.tick()  # the schedule's state, from now
    clock[0] += timedelta(seconds=10)
    scheduler.tick()  # its tick at 12:00:10
    # One queue paused as a worker reads it, and one shedding round over a limit (a query always
    # takes longer than a nanosecond).
    pause_queue(jobs.PAUSE_QUEUE, by="catalogue")
    refresher = QueuePauseRefresher(interval_s=60)
    refresher.start()
    refresher.stop(5)
    with override_settings(COMPOSITION={**settings.COMPOSITION, "SHED_QUEUES": [jobs.SHED_OPTIONAL_QUEUE],
                                        "SHED_ESSENTIAL_QUEUES": [jobs.SHED_ESSENTIAL_QUEUE],
                                        "SHED_WHEN": {"db_latency_ms": 1e-6}}):
        ShedController().tick()
    assert Pause.objects.get(kind=Pause.QUEUE, name=jobs.SHED_OPTIONAL_QUEUE).shed
    # One start over a limit, put back as a worker puts it back: the rate's window is full.
    limits = jobs.rated_call.options["job_limits"]
    store = limit_store()
    store.client.delete(*(f"{store.prefix}rated_call:{name}" for name in ("starts", "meta")))
    for index in range(limits.rate.starts):
        assert store.admit("rated_call", limits, f"catalogue-{index}").started
    with pytest.raises(SkipMessage):
        LimitedStarts().before_process_message(configured_broker(), MessageProxy(Message(
            queue_name=jobs.LIMIT_QUEUE, actor_name="rated_call", args=(), kwargs={"key": "c", "hold_s": 0.0},
            options={})))
    # One message a worker's code cannot run, parked (its deploy window is 0 in the tests).
    with pytest.raises(IncompatibleMessageError):
        refuse(configured_broker(), MessageProxy(Message(queue_name=jobs.CHECK_QUEUE, actor_name="removed_job",
                                                         args=(), kwargs={}, options={})),
               IncompatibleMessageError("catalogue"))
    # One outbox row sent again after a loss of the broker's data, as runworkers reconciles it.
    from composition.jobs.broker_losses import reconcile
    from composition.jobs.models import BrokerEpoch
    from composition.outbox import OutboxMessage

    sent_at = datetime.now(UTC) - timedelta(seconds=60)
    OutboxMessage.objects.create(actor_name="crash_effect", queue_name=jobs.CRASH_QUEUE, payload={}, status="sent",
                                 created_at=sent_at, sent_at=sent_at)
    assert reconcile(BrokerEpoch.objects.create(token=uuid.uuid4().hex, lost=True), {"crash_effect": 1.0}) == (1, 1)
    # One sampling round, as runworkers runs it.
    sample = MetricsSamplerComponent(configured_broker(), connection_budget=9).sample()
    assert sample.errors == {}
    middle = _scrape(api_client)
    rarer = _rarer_events(api_client, f"catalogue{uuid.uuid4().hex[:8]}")
    after = _scrape(api_client)

    documented = catalogue()
    assert sorted(set(RUNWORKERS_ONLY) - set(documented)) == [], "RUNWORKERS_ONLY names undocumented families"
    missing = [name for name, (kind, _) in documented.items() if family_name(name, kind) not in after]
    assert missing == [], "documented families missing from /metrics"
    # Present by name is not enough: a labelled family nothing has set prints no sample.
    unsampled = [name for name, (kind, _) in documented.items()
                 if name not in RUNWORKERS_ONLY and not after[family_name(name, kind)].samples]
    assert unsampled == [], "documented families without a sample in /metrics"

    def moved(family: str, sample_name: str, **labels: str) -> float:
        """What the acceptance's work moved (the rarer events come after ``middle``)."""
        return _value(middle, family, sample_name, **labels) - _value(before, family, sample_name, **labels)

    def moved_later(family: str, sample_name: str, **labels: str) -> float:
        return _value(after, family, sample_name, **labels) - _value(middle, family, sample_name, **labels)

    assert moved("billing_invoice_paid", "billing_invoice_paid_total") == 1
    assert moved("composition_lock_acquire", "composition_lock_acquire_total",
                 kind="row", name="billing.Invoice", outcome="acquired") == 1
    assert moved("composition_outbox_relayed", "composition_outbox_relayed_total", actor="send_payment_receipt") == 1
    assert moved("composition_cache_invalidations", "composition_cache_invalidations_total", outcome="applied") == 1
    assert moved("composition_cache_misses", "composition_cache_misses_total", pattern="invoice") == 1
    assert moved("composition_cache_hits", "composition_cache_hits_total", pattern="invoice") == 1
    operation = "composition_cache_operation_seconds"
    assert moved(operation, f"{operation}_count", operation="get") == 2
    assert moved(operation, f"{operation}_count", operation="acquire") == 1
    assert moved(operation, f"{operation}_count", operation="fill") == 1
    assert moved("composition_lock_timeouts", "composition_lock_timeouts_total", kind="redis", name=lock_name) == 1
    assert moved("composition_lock_acquire", "composition_lock_acquire_total",
                 kind="redis", name=lock_name, outcome="busy") == 1
    assert moved("composition_lock_timeouts", "composition_lock_timeouts_total", kind="row") == 0
    assert moved("composition_lock_lost", "composition_lock_lost_total", kind="redis", name=lock_name) == 1
    assert moved("composition_db_slow_queries", "composition_db_slow_queries_total", alias="default") == 1
    assert moved("composition_dead_letters", "composition_dead_letters_total", actor=actor) == 1
    assert moved("composition_job_limit_delays", "composition_job_limit_delays_total",
                 actor="rated_call", kind="rate") == 1
    assert _value(middle, "composition_job_limit", "composition_job_limit", actor="rated_call", kind="rate") == 10
    assert _value(middle, "composition_job_limit", "composition_job_limit", actor="limited_call",
                  kind="concurrency") == jobs.LIMIT_CONCURRENCY
    assert moved("composition_schedule_ticks", "composition_schedule_ticks_total",
                 schedule=schedule_name, outcome="fired") == 1
    assert _value(middle, "composition_schedule_next_fire_timestamp_seconds",
                  "composition_schedule_next_fire_timestamp_seconds",
                  schedule=schedule_name) == datetime(2026, 6, 1, 12, 0, 20, tzinfo=UTC).timestamp()
    responses = "django_http_responses_total_by_status_view_method"
    assert moved(responses, f"{responses}_total", status="201", method="POST") == 2
    assert moved(responses, f"{responses}_total", view="billing-invoice", status="200") == 2
    # The sampled gauges hold this round's readings.
    assert _value(middle, "composition_dead_letters_open", "composition_dead_letters_open", actor=actor) == 1
    assert _value(middle, "composition_queue_depth_messages", "composition_queue_depth_messages", queue="billing") >= 1
    assert _value(middle, "composition_db_connections_in_use", "composition_db_connections_in_use") >= 1
    assert _value(middle, "composition_db_connections_max", "composition_db_connections_max") > 0

    # The rarer events, one each.
    health = "composition_health_check_seconds"
    assert moved_later(health, f"{health}_count", dependency="database") == 1
    assert _value(after, "composition_health_check_up", "composition_health_check_up", dependency="database") == 1
    assert moved_later("composition_backpressure_rejections", "composition_backpressure_rejections_total",
                       queue="billing") == 1
    assert moved_later("composition_lock_fence_rejections", "composition_lock_fence_rejections_total",
                       name=rarer["name"]) == 1
    assert rarer["pruned"] == 2
    assert moved_later("composition_retention_pruned", "composition_retention_pruned_total",
                       table="composition_outboxmessage") == 2
    assert moved_later("django_db_errors", "django_db_errors_total", alias="default", type="DivisionByZero") == 1
    assert moved_later("composition_dead_letter_record_failures", "composition_dead_letter_record_failures_total",
                       outcome="broker_dlq") == 1
    assert rarer["lease"].outcome == "uncached"
    assert moved_later("composition_cache_lease_rejections", "composition_cache_lease_rejections_total",
                       pattern=rarer["name"], stage="acquire") == 1
    assert moved_later("composition_cache_errors", "composition_cache_errors_total",
                       pattern=rarer["name"], reason="lease_wait_timeout") == 1


def _rarer_events(client: Client, name: str) -> dict[str, Any]:
    """One of each event a web process counts that the acceptance's work does not cause: a
    readiness probe, a backpressure refusal, a stale fence, a retention prune, a database error,
    a dead letter the database refuses, and a rebuild lease held by another process."""
    reset_readiness_cache()  # probe now, not answer from an earlier test's round
    assert client.get("/readyz").status_code == 200
    with override_settings(COMPOSITION={**settings.COMPOSITION, "BACKPRESSURE_QUEUES": {"billing": 0}}), \
            pytest.raises(Backpressure):
        admit("billing")
    with fenced_write(f"{name}:resource", 2):
        pass
    with pytest.raises(StaleFence), fenced_write(f"{name}:resource", 1):
        pass
    pruned = prune_sent(0.0)  # the pay's receipt message and the schedule's tick, relayed at COMMIT
    with pytest.raises(DataError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT 1 / 0")
    # An actor name longer than its column: a write that would fail the same way every time,
    # so the worker gives up on the dead letter at once (the broker's DLQ keeps the message).
    try:
        raise PermanentError("unrecordable")
    except PermanentError as exc:
        write_dead_letter(configured_broker(), MessageProxy(Message(
            queue_name="default", actor_name=f"{name}{'x' * 255}", args=(), kwargs={}, options={})), exc, 1)
    return {"name": name, "pruned": pruned, "lease": _lose_a_rebuild_lease(name)}


def _lose_a_rebuild_lease(namespace: str) -> CacheResult:
    """Ask for a key while another process holds its rebuild lease (its loader is running): the
    lease is refused, the wait (CACHE_LEASE_WAIT_S, 50 ms here) runs out, the value is not cached."""
    # The other process: an engine of its own over the same Redis, whose rebuild this process's
    # in-process coalescing does not know about.
    other = CacheAside(conf.CACHE_ALIAS, serializer=load_serializer(conf.CACHE_SERIALIZER), lease_ttl_s=5.0,
                       lease_wait_s=5.0, breaker_failures=5, breaker_reset_s=5.0)
    key = f"{namespace}:key"
    asked: list[CacheResult] = []

    def their_loader() -> str:
        with override_settings(COMPOSITION={**settings.COMPOSITION, "CACHE_LEASE_WAIT_S": 0.05}):
            asked.append(cache_aside_result(key, lambda: "ours", ttl_s=5))
        return "theirs"

    assert other.fetch(key, their_loader, ttl_s=5).outcome == "loaded"
    return asked[0]



# A process as a web process is before its first request: Django set up, no component started,
# nothing cached yet (billing builds its cache-aside object on first use), then scraped.
FRESH_PROCESS_SCRAPE = """
import django
django.setup()
from prometheus_client import generate_latest
print(generate_latest().decode())
"""


def test_a_process_that_never_beats_shows_no_heartbeat_and_counters_alerted_on_start_at_zero() -> None:
    # The web exported a heartbeat of 0 (WorkerHeartbeatStale paged for it from the start, and
    # NoWorkerUp could never fire), and a first lost invalidation, seen at 1, had no increase().
    import subprocess
    import sys

    from composition.testing import subprocess_env

    done = subprocess.run([sys.executable, "-c", FRESH_PROCESS_SCRAPE], capture_output=True, text=True, timeout=60,
                          env=subprocess_env())
    assert done.returncode == 0, done.stderr[-3000:]
    samples = [line for line in done.stdout.splitlines() if not line.startswith("#")]
    assert [line for line in samples if line.startswith("composition_worker_heartbeat_timestamp_seconds")] == []
    for outcome in ("applied", "deferred", "replayed", "lost"):
        assert f'composition_cache_invalidations_total{{outcome="{outcome}"}} 0.0' in samples
