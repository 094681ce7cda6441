"""A relay SIGKILLed mid-batch: its rows are relayed by a live ``runworkers`` within 5 s of the
kill, at the default lease (``OUTBOX_LEASE_S`` 4 s, a sweep every ``OUTBOX_SWEEP_INTERVAL_S`` 1 s).

The doomed relay is a real ``runworkers`` whose broker is a throwaway Valkey, frozen before the
rows are published: its sweep claims them and then waits in its enqueue, the batch's broker step,
while its lease keeper renews their leases. It is killed right after a renewal, the worst moment
(a whole lease left), and a second, live ``runworkers`` on the test broker sweeps them up."""

from __future__ import annotations

import json
import socket
import time
from datetime import datetime
from typing import Any

import pytest
from django.db import transaction

from composition import health
from composition.conf import conf
from composition.outbox import OutboxMessage, publish
from composition.outbox.relay import RELAY_QUEUE_NAME
from composition.testing import ThrowawayRedis, wait_until
from tests.outboxapp import jobs as outbox_jobs
from tests.outboxapp.helpers import enqueued

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.empty_queues()]

RECOVERY_S = 5.0
# The live sweep's own run (claim, enqueue, mark) and a loaded machine's scheduling delay.
SLACK_S = 0.5
ROWS = 20
# Only the relay's queue: neither worker runs the probe jobs, so what the live relay sent stays
# on the test broker to be read back in order.
WORKER_ARGS = ["--threads", "1", "--queues", RELAY_QUEUE_NAME]




def _relay_of(pid: int) -> str:
    """The start of the relay id of the runworkers process ``pid`` (``host:pid:<random>``)."""
    return f"{socket.gethostname()}:{pid}:"


def _heartbeat_of(pid: int) -> bool:
    return any(beat["worker"].endswith(f":{pid}") for beat in health.workers().detail.get("workers", []))


def _leases(rows: list[int]) -> set[tuple[str, str, datetime | None]]:
    return set(OutboxMessage.objects.filter(pk__in=rows).values_list("status", "claimed_by", "claimed_until"))


def _held_by(relay: str, leases: set[tuple[str, str, datetime | None]]) -> bool:
    """Every row pending and leased to ``relay`` (a failed batch would have dropped the leases)."""
    return {(status, by.startswith(relay), until is not None) for status, by, until in leases} \
        == {("pending", True, True)}


@pytest.mark.usefixtures("nudge_only")
def test_a_relay_killed_mid_batch_has_its_rows_relayed_within_5_s(
        worker_processes: Any, throwaway_redis_server: ThrowawayRedis) -> None:
    assert (conf.OUTBOX_LEASE_S, conf.OUTBOX_SWEEP_INTERVAL_S) == (4.0, 1.0), "the defaults this bound is about"
    # A socket timeout far beyond the test: the frozen broker holds the doomed batch until the kill,
    # instead of failing it (a failed batch gives its rows back at once).
    doomed = worker_processes.spawn(WORKER_ARGS, BROKER_URL=throwaway_redis_server.url,
                                    COMPOSITION_TEST_OVERRIDES=json.dumps({"BROKER_SOCKET_TIMEOUT_S": 120}))
    wait_until(lambda: _heartbeat_of(doomed.pid), 60, 0.1,
               message=f"the doomed worker never started; its log:\n{doomed.output()[-3000:]}")
    throwaway_redis_server.freeze()

    # Committed without a send (nudge_only), so the doomed relay's sweep is what takes them.
    with transaction.atomic():
        rows = [publish(outbox_jobs.relay_probe, {"seq": seq}, key="k" if seq % 2 else None).pk
                for seq in range(ROWS)]
    doomed_relay = _relay_of(doomed.pid)
    wait_until(lambda: _held_by(doomed_relay, _leases(rows)), 10, 0.02,
               message=f"the doomed relay never claimed the rows; its log:\n{doomed.output()[-3000:]}")

    # The live runworkers starts while the doomed one holds the rows: alive, it keeps them.
    live = worker_processes.spawn(WORKER_ARGS)
    wait_until(lambda: _heartbeat_of(live.pid), 60, 0.1,
               message=f"the live worker never started; its log:\n{live.output()[-3000:]}")
    leases = _leases(rows)
    assert _held_by(doomed_relay, leases)

    # Kill right after a renewal: a whole lease to wait out.
    def renewed() -> bool:
        nonlocal leases
        now = _leases(rows)
        changed = {until for _, _, until in now} != {until for _, _, until in leases}
        leases = now
        return changed

    wait_until(renewed, 3 * conf.OUTBOX_LEASE_S, 0.01, message="the doomed relay's leases were never renewed")
    assert _held_by(doomed_relay, leases)
    killed_at = time.time()
    doomed.kill_group()

    wait_until(lambda: not OutboxMessage.objects.filter(pk__in=rows, status="pending").exists(),
               RECOVERY_S + SLACK_S + 10, 0.05, message=f"live worker log:\n{live.output()[-3000:]}")
    sent = list(OutboxMessage.objects.filter(pk__in=rows).values_list("sent_at", "claimed_by", "attempts"))
    took_s = max(sent_at.timestamp() for sent_at, _, _ in sent) - killed_at
    print(f"a relay killed mid-batch had its {ROWS} rows relayed {took_s:.2f}s after the kill "
          f"(lease {conf.OUTBOX_LEASE_S}s, sweep every {conf.OUTBOX_SWEEP_INTERVAL_S}s)")
    assert took_s <= RECOVERY_S + SLACK_S
    # Taken again by the live relay (a second claim), in publish order, each once.
    assert {(by.startswith(_relay_of(live.pid)), attempts) for _, by, attempts in sent} == {(True, 2)}
    assert [message.kwargs["seq"] for message in enqueued(outbox_jobs.relay_probe.queue_name)] == list(range(ROWS))
    assert live.terminate() == 0
