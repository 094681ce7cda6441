"""Lease renewal: a live relay keeps its rows for as long as its batch takes, a dead one loses them
one lease later, and renewal is only ever the claimant's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from composition.broker.configured import build_broker, configured_broker
from composition.outbox import OutboxMessage, publish
from composition.outbox.claims import ClaimedMessage
from composition.outbox.relay import Relay
from composition.testing import ThrowawayRedis, subprocess_env, wait_until
from tests.helpers import ROOT
from tests.outboxapp import jobs as outbox_jobs

LEASE_S = 0.5
# What a loaded 2-core machine adds to a bound: a poll, a scheduling delay.
SLACK_S = 1.0


pytestmark = pytest.mark.empty_queues()


def _publish(count: int) -> list[int]:
    # Keyed and keyless rows alike: a key's later rows must not overtake a held head either.
    return [publish(outbox_jobs.relay_probe, {"seq": seq}, key="k" if seq % 2 else None).pk for seq in range(count)]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("nudge_only")
def test_a_batch_slower_than_two_leases_keeps_its_rows_and_sends_them_once(
        throwaway_redis_server: ThrowawayRedis) -> None:
    rows = _publish(6)
    # A real slow broker step: the relay's enqueue waits on a frozen Redis for three leases.
    broker = build_broker(throwaway_redis_server.url, heartbeat_timeout_s=4.0, maintenance_chance=0,
                          socket_timeout_s=10.0)
    slow = Relay(broker, relay_id="slow", lease_s=LEASE_S)
    other = Relay(broker, relay_id="other", lease_s=LEASE_S)
    relayed: list[int] = []

    def run_batch() -> None:
        try:
            relayed.append(slow.run_once())
        finally:
            connection.close()

    throwaway_redis_server.freeze()
    batch = threading.Thread(target=run_batch)
    try:
        batch.start()
        wait_until(lambda: OutboxMessage.objects.filter(pk__in=rows, claimed_by="slow").count() == len(rows), 5)
        frozen_at = time.monotonic()
        taken: list[ClaimedMessage] = []
        while time.monotonic() - frozen_at < 3 * LEASE_S:
            taken += other.claim()
            time.sleep(0.02)
    finally:
        throwaway_redis_server.thaw()
        batch.join(15)
        broker.close()
    assert taken == [], "another relay claimed rows whose relay was still working on them"
    assert relayed == [len(rows)]
    assert slow.leases.renewals >= 2
    assert set(OutboxMessage.objects.filter(pk__in=rows).values_list("status", "attempts", "claimed_by")) == {
        ("sent", 1, "slow")}
    assert slow.leases.held() == set()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("nudge_only")
def test_renewal_is_the_claimant_s_only() -> None:
    rows = _publish(1)
    first = Relay(configured_broker(), relay_id="first", lease_s=0.2)
    assert [message.id for message in first.claim()] == rows
    time.sleep(0.3)  # the lease runs out while "first" is paused
    taker = Relay(configured_broker(), relay_id="taker", lease_s=5.0)
    assert [message.id for message in taker.claim()] == rows
    with first.leases.holding(rows, lease_s=0.2, since=time.monotonic() - 1.0):
        assert first.leases.renew_due() == 0
    row = OutboxMessage.objects.get(pk=rows[0])
    assert (row.status, row.claimed_by) == ("pending", "taker")


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("nudge_only")
def test_a_released_row_is_not_leased_again_by_a_late_renewal() -> None:
    rows = _publish(1)
    relay = Relay(configured_broker(), relay_id="failed-batch", lease_s=0.5)
    assert [message.id for message in relay.claim()] == rows
    # The batch's enqueue failed: its rows are given back while the keeper still holds them.
    with relay.leases.holding(rows, lease_s=0.5, since=time.monotonic() - 1.0):
        relay.release_claimed(rows, error="broker timed out")
        assert relay.leases.renew_due() == 0
    assert OutboxMessage.objects.get(pk=rows[0]).claimed_until is None
    assert Relay(configured_broker(), relay_id="sweeper").run_until_idle() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("nudge_only")
def test_a_batch_that_ended_is_renewed_no_more() -> None:
    rows = _publish(1)
    relay = Relay(configured_broker(), relay_id="ended", lease_s=LEASE_S)
    assert len(relay.claim()) == 1
    with relay.leases.holding(rows, lease_s=LEASE_S, since=time.monotonic()):
        time.sleep(2 * LEASE_S)
        assert Relay(configured_broker(), relay_id="other").claim() == []
    time.sleep(LEASE_S + 0.2)
    assert [message.id for message in Relay(configured_broker(), relay_id="other").claim()] == rows


_HOLD_FOREVER = textwrap.dedent("""
    import sys, time
    import django
    django.setup()
    from composition.broker.configured import configured_broker
    from composition.outbox.relay import Relay
    relay = Relay(configured_broker(), relay_id="doomed", lease_s={lease_s})
    claimed = relay.claim()
    with relay.leases.holding([m.id for m in claimed], lease_s={lease_s}, since=time.monotonic()):
        print(len(claimed), flush=True)
        time.sleep(600)  # a batch stuck in its broker step
""")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("nudge_only")
def test_a_killed_relay_s_rows_are_free_one_lease_after_its_death() -> None:
    rows = _publish(4)
    script = _HOLD_FOREVER.format(lease_s=LEASE_S)
    child = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=subprocess_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == b"4", child.stdout.read().decode(errors="replace")
        other = Relay(configured_broker(), relay_id="other", lease_s=LEASE_S)
        alive_until = time.monotonic() + 4 * LEASE_S
        while time.monotonic() < alive_until:  # alive: renewed, never free
            assert other.claim() == []
            time.sleep(0.05)
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(10)
        killed_at = time.monotonic()
        taken: list[int] = []
        wait_until(lambda: taken.extend(message.id for message in other.claim()) or len(taken) == len(rows),
                   LEASE_S + SLACK_S + 5, 0.02)
        took_s = time.monotonic() - killed_at
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(10)
    assert sorted(taken) == rows
    # At most one lease (renewed by half a lease at the latest) after the last renewal.
    assert took_s <= LEASE_S + SLACK_S


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("nudge_only")
def test_a_claim_stops_at_a_row_of_its_key_leased_elsewhere() -> None:
    # Rows 1, 2, 3 of one key: 1 free again (its send failed and released it), 2 leased to
    # another process (its transaction committed late and sends it itself), 3 free. Claiming
    # 1 and 3 would send 3 before 2: the claim must stop at 2.
    with transaction.atomic():
        ids = [publish(outbox_jobs.relay_probe, {"seq": seq}, key="order:7").pk for seq in (1, 2, 3)]
    OutboxMessage.objects.filter(pk=ids[0]).update(claimed_until=None, claimed_by="")
    OutboxMessage.objects.filter(pk=ids[1]).update(claimed_until=timezone.now() + timedelta(seconds=30),
                                                   claimed_by="another-process")
    OutboxMessage.objects.filter(pk=ids[2]).update(claimed_until=None, claimed_by="")
    assert [message.id for message in Relay(configured_broker(), relay_id="sweeper").claim()] == ids[:1]
