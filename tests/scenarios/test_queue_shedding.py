"""Shedding with real worker processes: while the essential queue's pressure signal is held over
its limit (its messages wait with no worker for them: on Redis its oldest message's age, on
RabbitMQ its ready messages), the non-essential queues pause within 5 s and billing's remind
endpoint answers 503 with Retry-After; once a worker drains the essential queue they resume
within 30 s, with one pause and one resume in the episode, whichever of the two hosts'
controllers made them, and every job published meanwhile runs once."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import transaction
from django.test import override_settings

from composition.outbox import publish
from composition.outbox.relay import RELAY_QUEUE_NAME
from composition.pauses import Pause
from composition.testing import WorkerProcess, wait_until
from tests.helpers import RABBITMQ_URL, open_invoice
from tests.jobsapp import jobs
from tests.jobsapp.models import Effect

pytestmark = [pytest.mark.slow, pytest.mark.empty_queues(jobs.SHED_ESSENTIAL_QUEUE, jobs.SHED_OPTIONAL_QUEUE,
                                                         "reminders", RELAY_QUEUE_NAME)]

SHED = [jobs.SHED_OPTIONAL_QUEUE, "reminders"]
SHEDDING = {"SHED_QUEUES": SHED, "SHED_ESSENTIAL_QUEUES": [jobs.SHED_ESSENTIAL_QUEUE], "SHED_INTERVAL_S": 0.25,
            "SHED_RESUME_BELOW": 0.5, "SHED_RESUME_AFTER_S": 3.0}
# On Redis the essential queue's oldest message has waited 2 s; on RabbitMQ 5 messages are ready.
SIGNAL = {"redis": {"oldest_wait_s": 2.0, "ready_messages": None},
          "rabbitmq": {"oldest_wait_s": None, "ready_messages": 5}}


class Transitions(threading.Thread):
    """Every change of the shed queues' Pause rows, read every 0.1 s: (time, queue, paused, shed)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.seen: list[tuple[float, str, bool, bool]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        from django.db import connection

        last: dict[str, tuple[bool, bool]] = {}
        try:
            while not self.stopping.wait(0.1):
                for name, paused, shed in Pause.objects.filter(kind=Pause.QUEUE, name__in=SHED).values_list(
                        "name", "paused", "shed"):
                    if last.get(name) != (paused, shed):
                        last[name] = (paused, shed)
                        self.seen.append((time.monotonic(), name, paused, shed))
        finally:
            connection.close()

    def of(self, queue: str) -> list[tuple[float, bool, bool]]:
        return [(at, paused, shed) for at, name, paused, shed in self.seen if name == queue]


@pytest.fixture
def transitions(transactional_db: None) -> Iterator[Transitions]:
    Pause.objects.filter(kind=Pause.QUEUE).delete()
    watcher = Transitions()
    watcher.start()
    yield watcher
    watcher.stopping.set()
    watcher.join(5)
    Pause.objects.filter(kind=Pause.QUEUE).delete()


def _publish(job: str, keys: list[str]) -> None:
    with transaction.atomic():
        for key in keys:
            publish(job, {"key": key})


def _done(keys: list[str]) -> set[str]:
    return set(Effect.objects.filter(key__in=keys).values_list("key", flat=True))


def _logs(hosts: list[WorkerProcess]) -> str:
    return "\n".join(host.output()[-2000:] for host in hosts)


@pytest.mark.parametrize("broker", ["redis", pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)])
def test_optional_queues_are_shed_while_the_essential_one_is_behind_and_resume_once_it_drains(
        worker_processes: Any, transitions: Transitions, api_client: Any, broker: str,
        request: pytest.FixtureRequest) -> None:
    overrides = {**SHEDDING, "SHED_WHEN": SIGNAL[broker]}
    env = {"COMPOSITION_TEST_OVERRIDES": json.dumps(overrides)}
    if broker == "rabbitmq":
        env["BROKER_URL"] = RABBITMQ_URL
        request.getfixturevalue("nudge_only")  # the hosts relay over RabbitMQ; this process's broker is Redis
    optional_only = ["--threads", "2", "--queues", f"{jobs.SHED_OPTIONAL_QUEUE},{RELAY_QUEUE_NAME}"]
    hosts = [worker_processes.spawn(optional_only, **env)]
    run = uuid.uuid4().hex[:8]
    before = [f"{run}-before-{index}" for index in range(10)]
    _publish("shed_optional", before)
    wait_until(lambda: _done(before) == set(before), timeout_s=30, message=_logs(hosts))

    # The essential queue backs up: no worker takes it.
    essential = [f"{run}-essential-{index}" for index in range(8)]
    _publish("shed_essential", essential)
    behind_at = time.monotonic()
    wait_until(lambda: len(transitions.of(jobs.SHED_OPTIONAL_QUEUE)) >= 1, timeout_s=15, message=_logs(hosts))
    shed_at, paused, shed = transitions.of(jobs.SHED_OPTIONAL_QUEUE)[0]
    assert paused and shed
    # The signal crossed its limit 2 s after the publish (Redis) or at once (RabbitMQ); then 5 s at most.
    assert shed_at - behind_at < 2.0 + 5.0, shed_at - behind_at
    row = Pause.objects.get(kind=Pause.QUEUE, name=jobs.SHED_OPTIONAL_QUEUE)
    assert row.changed_by == "shedding" and ("oldest_wait_s" in row.reason or "ready_messages" in row.reason)

    # Meanwhile (once the hosts have read the pause: QUEUE_PAUSE_REFRESH_S), optional jobs
    # published wait, and billing's reminders route answers 503.
    time.sleep(1.0)
    meanwhile = [f"{run}-meanwhile-{index}" for index in range(10)]
    _publish("shed_optional", meanwhile)
    invoice = open_invoice(f"SHED-{run}", email="ada@example.com")
    with override_settings(COMPOSITION={**settings.COMPOSITION, **overrides}):
        answer = api_client.post(f"/api/invoices/{invoice.pk}/remind")
        assert answer.status_code == 503 and int(answer["Retry-After"]) >= 1, answer.content
        assert "payments come first" in answer.json()["error"]
        time.sleep(1.5)
        assert not _done(meanwhile), "an optional job ran while its queue was shed"

        # Recovery: a host for the essential queue drains it.
        hosts.append(worker_processes.spawn(["--threads", "2", "--queues", jobs.SHED_ESSENTIAL_QUEUE], **env))
        wait_until(lambda: _done(essential) == set(essential), timeout_s=30, message=_logs(hosts))
        recovered_at = time.monotonic()
        wait_until(lambda: len(transitions.of(jobs.SHED_OPTIONAL_QUEUE)) >= 2, timeout_s=35, message=_logs(hosts))
        resumed_at, paused, shed = transitions.of(jobs.SHED_OPTIONAL_QUEUE)[1]
        assert not paused and resumed_at - recovered_at < 30.0
        wait_until(lambda: _done(meanwhile) == set(meanwhile), timeout_s=30, message=_logs(hosts))
        time.sleep(0.6)  # past the reading admission keeps (BACKPRESSURE_CACHE_S)
        assert api_client.post(f"/api/invoices/{invoice.pk}/remind").status_code == 202

    for host in hosts:
        assert host.terminate() == 0, host.output()[-3000:]
    # One pause and one resume per queue in the episode, whichever controller made them.
    for queue in SHED:
        assert [(paused, shed) for _, paused, shed in transitions.of(queue)] == [(True, True), (False, True)], (
            queue, transitions.seen)
    logs = _logs(hosts)
    assert sum(host.output().count('"event": "queue shed"') for host in hosts) == len(SHED), logs
    assert sum(host.output().count('"event": "queue unshed"') for host in hosts) == len(SHED), logs
    assert set(Effect.objects.filter(key__startswith=run).values_list("key", flat=True)) == {
        *before, *essential, *meanwhile}
