"""Recovery in seconds: a crashed relay's rows and a killed worker's messages come back within
about 5 s, a live worker's never, and a transaction's rows reach the broker at its COMMIT."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from django.db import transaction

from composition.broker.configured import configured_broker
from composition.conf import conf
from composition.outbox import OutboxMessage, publish
from composition.outbox.claims import mark_sent
from composition.outbox.relay import Relay
from composition.testing import empty_queues, left_to_the_relay, wait_until
from tests.jobsapp import jobs
from tests.jobsapp.models import Attempt, Effect
from tests.outboxapp import jobs as outbox_jobs
from tests.outboxapp.helpers import enqueued

RECOVERY_S = 5.0
# What a loaded 2-core machine adds to a bound: a poll, a scheduling delay.
SLACK_S = 1.0


pytestmark = pytest.mark.empty_queues()


@pytest.mark.django_db(transaction=True)
def test_a_transaction_s_rows_are_sent_right_after_its_commit_by_its_own_process() -> None:
    with transaction.atomic():
        rows = [publish(outbox_jobs.relay_probe, {"seq": seq}, key="k") for seq in range(3)]
        rows.append(publish(outbox_jobs.relay_probe, {"seq": 3}))
        assert not enqueued("outboxapp_probe")  # nothing leaves before COMMIT
    assert [message.kwargs["seq"] for message in enqueued("outboxapp_probe")] == [0, 1, 2, 3]
    assert set(OutboxMessage.objects.values_list("status", "attempts")) == {("sent", 1)}
    assert Relay(configured_broker()).run_until_idle() == 0  # nothing left for the relay
    assert not enqueued("composition.outbox"), "no nudge: the relay had nothing to do"


@pytest.mark.django_db(transaction=True)
def test_a_row_behind_an_older_pending_row_of_its_key_waits_for_the_relay() -> None:
    with left_to_the_relay():
        older = publish(outbox_jobs.relay_probe, {"seq": 0}, key="k")  # pending: only nudged
    newer = publish(outbox_jobs.relay_probe, {"seq": 1}, key="k")
    other = publish(outbox_jobs.relay_probe, {"seq": 2}, key="other")
    # The newer row of "k" must not overtake the older one; the row of another key goes at once.
    assert [message.kwargs["seq"] for message in enqueued("outboxapp_probe")] == [2]
    for row, status in ((older, "pending"), (newer, "pending"), (other, "sent")):
        row.refresh_from_db()
        assert row.status == status
    assert Relay(configured_broker()).run_until_idle() == 2
    assert [message.kwargs["seq"] for message in enqueued("outboxapp_probe")] == [2, 0, 1]


@pytest.mark.django_db(transaction=True)
def test_a_relay_whose_lease_was_taken_over_does_not_mark_the_rows(nudge_only: None) -> None:
    row = publish(outbox_jobs.relay_probe, {"seq": 0})
    slow = Relay(configured_broker(), relay_id="slow", lease_s=0.2)
    assert len(slow.claim()) == 1
    time.sleep(0.3)
    taker = Relay(configured_broker(), relay_id="taker")
    assert [message.id for message in taker.claim()] == [row.pk]
    mark_sent([row.pk], sent_at=row.created_at, relay_id="slow")
    row.refresh_from_db()
    assert (row.status, row.claimed_by) == ("pending", "taker")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_crashed_relay_s_rows_are_relayed_within_seconds(worker_processes, nudge_only: None) -> None:  # type: ignore[no-untyped-def]
    rows = [publish(outbox_jobs.relay_probe, {"seq": seq}).pk for seq in range(5)]
    empty_queues()  # the nudges of the publishes, so only the sweep can relay
    # A relay that claimed the batch and died before marking it (a SIGKILL mid-batch leaves
    # exactly this in the database): the rows are leased to nobody alive.
    assert len(Relay(configured_broker(), relay_id="crashed").claim()) == 5
    crashed_at = time.monotonic()
    worker = worker_processes.spawn(["--threads", "2", "--queues", "composition.outbox"])
    wait_until(lambda: not OutboxMessage.objects.filter(pk__in=rows, status="pending").exists(),
               RECOVERY_S + SLACK_S + 5, 0.05, message=worker.output()[-3000:])
    took_s = time.monotonic() - crashed_at
    print(f"a crashed relay's rows were relayed {took_s:.2f}s after the crash "
          f"(lease {conf.OUTBOX_LEASE_S}s, sweep every {conf.OUTBOX_SWEEP_INTERVAL_S}s)")
    assert took_s <= RECOVERY_S + SLACK_S
    assert [m.kwargs["seq"] for m in enqueued("outboxapp_probe")] == list(range(5))
    assert worker.terminate() == 0


@pytest.mark.main_cell  # process timing no Python or Django version changes
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_killed_worker_s_messages_run_within_seconds_of_its_restart_and_a_live_one_keeps_its_own(
        worker_processes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    configured_broker().flush(jobs.SLOW_QUEUE)
    gate, live_gate = tmp_path / "gate", tmp_path / "live-gate"
    args = ["--threads", "2", "--queues", jobs.SLOW_QUEUE]
    doomed = worker_processes.spawn(args)
    keys = ["held-1", "held-2", *[f"prefetched-{n}" for n in range(2)]]
    for key in keys:
        jobs.slow.send(key=key, hold_s=60 if key.startswith("held") else 0.05, gate=str(gate))
    wait_until(lambda: Attempt.objects.filter(key__startswith="held-").count() == 2, 30, message=doomed.output())

    # A second, live runworkers on the same host, busy with its own jobs on the same queue. Four
    # fill both workers' prefetch (2 threads x 2), so neither fetches the other's messages.
    live = worker_processes.spawn(args)
    for index in range(4):
        jobs.slow.send(key=f"live-{index}", hold_s=60, gate=str(live_gate))
    wait_until(lambda: _jobs_in_flight(live.pid) == 2, 30, 0.1, message=live.output())

    doomed.kill_group()  # its two running jobs and its prefetch are unacked in Redis
    gate.touch()

    restarted = worker_processes.spawn(args)
    restarted_at = time.monotonic()
    wait_until(lambda: Effect.objects.filter(key__in=keys).values("key").distinct().count() == len(keys),
               30, 0.05, message=restarted.output()[-3000:])
    took_s = time.monotonic() - restarted_at
    print(f"a killed worker's messages ran {took_s:.2f}s after its restart "
          f"(BROKER_HEARTBEAT_TIMEOUT_S {conf.BROKER_HEARTBEAT_TIMEOUT_S}s)")
    assert took_s <= RECOVERY_S + SLACK_S

    # The live worker's jobs were never taken for a dead worker's: each ran once, to the end.
    live_gate.touch()
    wait_until(lambda: Effect.objects.filter(key__startswith="live-").count() == 4, 60)
    time.sleep(1.0)
    live_keys = [f"live-{index}" for index in range(4)]
    assert sorted(Attempt.objects.filter(key__startswith="live-").values_list("key", flat=True)) == live_keys
    assert sorted(Effect.objects.filter(key__startswith="live-").values_list("key", flat=True)) == live_keys
    assert live.terminate() == 0 and restarted.terminate() == 0


def _jobs_in_flight(pid: int) -> int:
    from composition import health

    for beat in health.workers().detail.get("workers", []):
        if beat["worker"].endswith(f":{pid}"):
            return int(beat.get("jobs_in_flight") or 0)
    return 0
