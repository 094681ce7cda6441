"""The relay's nudge gives its worker thread back: under steady publishing for three times the
relay's time limit, no relay run lasts longer than its budget and ``health workers`` stays
healthy, and every message is still relayed once."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings

from composition import health
from composition.health import heartbeats
from composition.health.probes import heartbeat_client
from composition.outbox import OutboxMessage, publish
from composition.outbox.relay import RELAY_ACTOR_NAME
from composition.testing import wait_until
from tests.outboxapp import jobs
from tests.outboxapp.models import Effect

RELAY_TIME_LIMIT_S = 3.0
RELAY_BUDGET_S = 1.0
# One batch may run past the budget; a batch here is a few milliseconds, a second is generous.
BATCH_SLACK_S = 1.0
PUBLISH_FOR_S = 3 * RELAY_TIME_LIMIT_S


pytestmark = pytest.mark.empty_queues()


@pytest.fixture(autouse=True)
def _no_heartbeats() -> Iterator[None]:
    client = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    client.delete(heartbeats.REGISTRY_KEY)
    yield
    client.close()


def _relay_runs(worker_pid: int) -> list[float]:
    """Ages of the relay runs the worker's latest heartbeat shows in flight."""
    client = heartbeat_client()
    try:
        beats = heartbeats.read_heartbeats(client)
    finally:
        client.close()
    now = time.time()
    return [now - job["started_at"] for beat in beats if beat["worker"].endswith(f":{worker_pid}")
            for job in beat.get("jobs", []) if job["actor"] == RELAY_ACTOR_NAME]


@pytest.mark.main_cell  # process timing no Python or Django version changes
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("nudge_only")  # every commit nudges: the relay's worst case
def test_nudges_under_steady_publishing_never_hold_a_thread(worker_processes: Any) -> None:
    overrides = {"OUTBOX_RELAY_TIME_LIMIT_S": RELAY_TIME_LIMIT_S, "OUTBOX_RELAY_BUDGET_S": RELAY_BUDGET_S,
                 "WORKER_HEARTBEAT_S": 0.25}
    worker = worker_processes.spawn(["--threads", "4"], COMPOSITION_TEST_OVERRIDES=json.dumps(overrides))
    wait_until(lambda: health.workers().ok, 30, 0.2, message=worker.output())

    published = 0
    longest_run_s = 0.0
    unhealthy: list[dict[str, Any]] = []
    began = time.monotonic()
    next_sample = began
    # As fast as one publisher goes: nudges then arrive faster than a relay round ends.
    while time.monotonic() - began < PUBLISH_FOR_S:
        publish(jobs.record_effect, {"seq": published})  # its own transaction, then a nudge
        published += 1
        if time.monotonic() >= next_sample:
            next_sample += 0.25
            longest_run_s = max([longest_run_s, *_relay_runs(worker.pid)])
            report = health.workers()
            if not report.ok:
                unhealthy.append(report.detail)

    assert longest_run_s > 0, "no relay run was ever seen in flight: the test observes nothing"
    assert longest_run_s < RELAY_BUDGET_S + BATCH_SLACK_S, (longest_run_s, worker.output()[-3000:])
    assert not unhealthy, unhealthy[:3]
    wait_until(lambda: Effect.objects.count() == published, 60, 0.2,
               message=f"{Effect.objects.count()} of {published} ran:\n{worker.output()[-3000:]}")
    time.sleep(1.0)  # room for a duplicate to show up before counting
    assert sorted(Effect.objects.values_list("seq", flat=True)) == list(range(published))
    assert set(OutboxMessage.objects.values_list("status", "attempts")) == {("sent", 1)}
    assert "exceeded its time limit" not in worker.output()
    assert worker.terminate(30) == 0, worker.output()[-3000:]
