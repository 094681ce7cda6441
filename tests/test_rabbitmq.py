"""The RabbitMQ broker (BROKER_URL=amqp://...): readiness, and outbox -> relay -> worker -> effect."""

from __future__ import annotations

import os
import uuid

import pytest
from django.conf import settings
from django.db import transaction
from django.test import override_settings

from composition import health
from composition.outbox import publish
from composition.testing import free_port, wait_until
from tests.jobsapp.jobs import RABBIT_QUEUE
from tests.jobsapp.models import Effect

pytestmark = pytest.mark.rabbitmq

RABBITMQ_URL = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")


@pytest.mark.django_db
def test_readiness_probes_rabbitmq_up_and_down() -> None:
    health._cached = None
    with override_settings(COMPOSITION={**settings.COMPOSITION, "BROKER_URL": RABBITMQ_URL}):
        report = health.readiness(use_cache=False)
        assert report.ok, report.as_dict()
    closed = f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F"
    with override_settings(COMPOSITION={**settings.COMPOSITION, "BROKER_URL": closed}):
        report = health.readiness(use_cache=False)
    assert not report.ok
    assert [check.name for check in report.checks if not check.ok] == ["broker"]
    health._cached = None


@pytest.mark.django_db(transaction=True)
def test_outbox_messages_run_once_through_a_rabbitmq_broker(worker_processes) -> None:  # type: ignore[no-untyped-def]
    run = uuid.uuid4().hex[:8]
    worker = worker_processes.spawn(
        ["--threads", "2", "--queues", f"{RABBIT_QUEUE},composition.outbox", "--shutdown-timeout", "10"],
        BROKER_URL=RABBITMQ_URL)
    keys = [f"{run}-{index}" for index in range(30)]
    with transaction.atomic():
        for key in keys:
            publish("rabbit_effect", {"key": key})
    wait_until(lambda: Effect.objects.filter(key__startswith=run).count() == len(keys), 60,
               message="effects missing:\n" + worker.output()[-3000:])
    assert worker.terminate(20) == 0, worker.output()[-3000:]
    assert sorted(Effect.objects.filter(key__startswith=run).values_list("key", flat=True)) == sorted(keys)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_time_limits_are_enforced_under_a_rabbitmq_broker(worker_processes) -> None:  # type: ignore[no-untyped-def]
    from composition.jobs.models import DeadLetter
    from tests.jobsapp.jobs import TIME_LIMIT_QUEUE
    from tests.jobsapp.models import Attempt

    key = f"rabbit-overrun-{uuid.uuid4().hex[:8]}"
    worker = worker_processes.spawn(
        ["--threads", "2", "--queues", f"{TIME_LIMIT_QUEUE},composition.outbox", "--shutdown-timeout", "10"],
        BROKER_URL=RABBITMQ_URL)
    publish("overruns", {"key": key, "run_s": 10})
    wait_until(lambda: DeadLetter.objects.filter(actor="overruns", payload__key=key).exists(), 40,
               message="no dead letter:\n" + worker.output()[-3000:])
    assert DeadLetter.objects.get(payload__key=key).error_class.endswith("TimeLimitExceeded")
    assert list(Attempt.objects.filter(key=key).values_list("attempt", flat=True).order_by("attempt")) == [1, 2]
    assert not Effect.objects.filter(key=key).exists()
    assert worker.terminate(20) == 0, worker.output()[-3000:]
