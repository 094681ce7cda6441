"""The relay: Dramatiq's format and layout, leases, per-key order, SKIP LOCKED, broker failures."""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict

import psycopg
import pytest
from django.db import transaction
from dramatiq.brokers.redis import RedisBroker
from prometheus_client import REGISTRY

from composition.broker.configured import configured_broker
from composition.outbox import OutboxMessage, publish
from composition.outbox.models import message_id_for
from composition.outbox.relay import Relay
from composition.testing import ThrowawayRedis, current_database_url
from tests.outboxapp.helpers import delayed, enqueued

PROBE = "outboxapp_relay_probe"
QUEUE = "outboxapp_probe"

# These tests relay (or watch relays take) committed rows themselves.
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("nudge_only"),
    pytest.mark.empty_queues(),
]


def _publish_many(specs: list[str | None]) -> list[int]:
    with transaction.atomic():
        return [publish(PROBE, {"seq": seq, "key": key}, key=key).pk for seq, key in enumerate(specs)]


def test_relayed_message_is_a_dramatiq_message_derived_from_the_row() -> None:
    import structlog

    structlog.contextvars.bind_contextvars(request_id="req-relay")
    try:
        row = publish(PROBE, {"seq": 1, "key": "k"}, key="k")
    finally:
        structlog.contextvars.clear_contextvars()
    assert Relay(configured_broker()).run_until_idle() == 1
    [message] = enqueued(QUEUE)
    assert (message.actor_name, message.queue_name) == (PROBE, QUEUE)
    assert message.args == () and message.kwargs == {"seq": 1, "key": "k"}
    assert message.message_id == message_id_for(row.pk)
    headers = message.options["composition"]
    assert headers["outbox_id"] == row.pk and headers["request_id"] == "req-relay" and headers["key"] == "k"
    assert headers["published_at"] == row.headers["published_at"]
    row.refresh_from_db()
    assert (row.status, row.attempts, row.claimed_until) == ("sent", 1, None)
    assert row.sent_at is not None and row.sent_at >= row.created_at


def test_a_row_written_before_its_job_moved_queue_goes_to_the_job_s_queue_now() -> None:
    # Written by the code of a deploy ago, when the job ran on another queue: no worker of this
    # code reads that one. A held row may come due days after such a deploy.
    moved, stays = publish(PROBE, {"seq": 1, "key": "a"}), publish(PROBE, {"seq": 2, "key": "b"})
    OutboxMessage.objects.filter(pk=moved.pk).update(queue_name="outboxapp_before_the_move")
    assert Relay(configured_broker()).run_until_idle() == 2
    assert sorted(message.kwargs["seq"] for message in enqueued(QUEUE)) == [1, 2]
    assert enqueued("outboxapp_before_the_move") == []
    # The row says where it went.
    assert set(OutboxMessage.objects.filter(pk__in=[moved.pk, stays.pk]).values_list("queue_name", flat=True)) \
        == {QUEUE}


@pytest.mark.parametrize("key", [None, "k"], ids=["unkeyed", "keyed"])
def test_only_the_claimant_marks_its_rows_sent(key: str | None) -> None:
    from django.utils import timezone

    from composition.outbox.claims import mark_sent

    row = publish(PROBE, {"seq": 1}, key=key)
    holder = Relay(configured_broker(), relay_id="holder")
    assert [message.id for message in holder.claim()] == [row.pk]
    # Another relay (one whose lease ran out and whose rows were taken over) marks nothing.
    assert mark_sent([row.pk], sent_at=timezone.now(), relay_id="other", keyed=key is not None) is False
    row.refresh_from_db()
    assert row.status == "pending"
    assert mark_sent([row.pk], sent_at=timezone.now(), relay_id="holder", keyed=key is not None) is False
    row.refresh_from_db()
    assert (row.status, row.claimed_until) == ("sent", None)
    assert row.sent_at is not None


def test_delayed_message_goes_to_the_delay_queue_with_an_eta_never_before_it_is_due() -> None:
    # Fractions of a millisecond in the delays: an eta truncated to whole milliseconds (on a
    # floored clock) fell up to 2 ms before the due time, and the job started that early.
    rows = [publish(PROBE, {"seq": seq}, delay_s=30 + seq * 0.000137) for seq in range(20)]
    Relay(configured_broker()).run_until_idle()
    assert enqueued(QUEUE) == []
    etas = {message.kwargs["seq"]: message.options["eta"] for message in delayed(QUEUE)}
    for seq, row in enumerate(rows):
        due_ms = (row.created_at.timestamp() + row.delay_s) * 1000
        assert due_ms <= etas[seq] < due_ms + 2000


def test_a_relayed_row_is_not_relayed_again() -> None:
    _publish_many([None, None, "a"])
    relay = Relay(configured_broker())
    assert relay.run_until_idle() == 3
    assert relay.run_until_idle() == 0
    assert len(enqueued(QUEUE)) == 3


def test_metrics_count_relayed_messages_and_their_lag() -> None:
    before_total = REGISTRY.get_sample_value("composition_outbox_relayed_total", {"actor": PROBE}) or 0.0
    before_lag = REGISTRY.get_sample_value("composition_outbox_relay_lag_seconds_count") or 0.0
    _publish_many([None] * 4)
    Relay(configured_broker()).run_until_idle()
    assert REGISTRY.get_sample_value("composition_outbox_relayed_total", {"actor": PROBE}) == before_total + 4
    assert REGISTRY.get_sample_value("composition_outbox_relay_lag_seconds_count") == before_lag + 4


# -- claims: leases and per-key order -------------------------------------------------------------------
def test_a_leased_head_blocks_its_key_but_not_other_keys() -> None:
    ids = _publish_many(["k1", "k1", "k2", None, "k1", "k2"])
    first = Relay(configured_broker(), relay_id="first").claim(limit=1)
    assert [m.id for m in first] == [ids[0]]
    # The first relay "crashed" holding k1's head: nobody else may send k1 before its lease ends.
    second = Relay(configured_broker(), relay_id="second").claim()
    assert [m.id for m in second] == [ids[2], ids[3], ids[5]]
    assert Relay(configured_broker(), relay_id="third").claim() == []


def test_an_expired_lease_is_claimed_again_in_key_order() -> None:
    ids = _publish_many(["k", "k", "k"])
    crashed = Relay(configured_broker(), lease_s=0.3, relay_id="crashed")
    assert [m.id for m in crashed.claim(limit=2)] == ids[:2]
    taker = Relay(configured_broker(), relay_id="taker")
    assert taker.claim() == []  # leased head: the key waits
    time.sleep(0.4)
    assert taker.run_until_idle() == 3
    assert [m.options["composition"]["outbox_id"] for m in enqueued(QUEUE)] == ids
    attempts = dict(OutboxMessage.objects.values_list("id", "attempts"))
    assert attempts == {ids[0]: 2, ids[1]: 2, ids[2]: 1}


def test_a_batch_takes_a_prefix_of_each_key_in_id_order() -> None:
    ids = _publish_many(["a", "b", "a", "b", "a", None])
    claimed = Relay(configured_broker()).claim(limit=4)
    # Cut at four in id order: every key's share is a prefix of its pending rows.
    assert [m.id for m in claimed] == ids[:4]


def test_a_head_locked_by_an_open_claim_is_skipped_with_its_whole_key() -> None:
    ids = _publish_many(["k", "k", "other"])
    # Another relay's claim transaction is in flight: it holds the head's row lock and its lease
    # is not committed yet. SKIP LOCKED skips the head; the key's later rows must not be taken.
    with psycopg.connect(current_database_url()) as other:
        other.execute("SELECT id FROM composition_outboxmessage WHERE id = %s FOR UPDATE", [ids[0]])
        claimed = Relay(configured_broker()).claim()
        assert [m.id for m in claimed] == [ids[2]]
        other.rollback()
    assert [m.id for m in Relay(configured_broker()).claim()] == ids[:2]


def test_a_row_that_commits_after_a_higher_id_is_still_relayed() -> None:
    # ids are allocated at insert, not at commit: a relay keeping an id cursor would skip this row.
    from django.db import connections

    started = threading.Event()
    finish = threading.Event()

    def slow_publisher() -> None:
        try:
            with transaction.atomic():
                publish(PROBE, {"seq": "slow"})
                started.set()
                finish.wait(10)
        finally:
            connections.close_all()

    thread = threading.Thread(target=slow_publisher)
    thread.start()
    assert started.wait(10)
    publish(PROBE, {"seq": "fast"})
    relay = Relay(configured_broker())
    assert relay.run_until_idle() == 1
    finish.set()
    thread.join(10)
    assert relay.run_until_idle() == 1
    assert sorted(m.kwargs["seq"] for m in enqueued(QUEUE)) == ["fast", "slow"]
    assert not OutboxMessage.objects.filter(status="pending").exists()


# -- broker failure -----------------------------------------------------------------------------------------
def test_a_broker_failure_releases_the_claims_and_records_the_error() -> None:
    ids = _publish_many(["k", "k"])
    server = ThrowawayRedis().start()
    dead = RedisBroker(url=server.url, socket_timeout=0.5, socket_connect_timeout=0.5)
    server.close()  # gone, its data directory with it: a broker that is away
    with pytest.raises(Exception, match=r"(?i)connect"):
        Relay(dead).run_once()
    rows = list(OutboxMessage.objects.order_by("id").values("status", "claimed_until", "last_error"))
    assert all(r["status"] == "pending" and r["claimed_until"] is None for r in rows)
    assert "onnect" in rows[0]["last_error"]
    # Released at once (no lease wait), and relayed in order by a working relay.
    assert Relay(configured_broker()).run_until_idle() == 2
    assert [m.options["composition"]["outbox_id"] for m in enqueued(QUEUE)] == ids
    assert set(OutboxMessage.objects.values_list("last_error", flat=True)) == {""}


# -- three relays at once --------------------------------------------------------------------------------------
RELAYS = 3
MESSAGES = 5000
KEYS = 40


def test_three_relays_at_once_deliver_each_message_exactly_once_in_key_order() -> None:
    # Every fifth message has no key; the rest rotate over KEYS keys.
    specs = [None if seq % 5 == 0 else f"key-{seq % KEYS}" for seq in range(MESSAGES)]
    with transaction.atomic():
        rows = [OutboxMessage(actor_name=PROBE, queue_name=QUEUE, payload={"seq": seq}, key=key,
                              headers={"published_at": time.time()})
                for seq, key in enumerate(specs)]
        OutboxMessage.objects.bulk_create(rows, batch_size=1000)
    ids = list(OutboxMessage.objects.order_by("id").values_list("id", flat=True))
    key_of = dict(zip(ids, specs, strict=True))

    barrier = threading.Barrier(RELAYS)
    relayed: dict[str, int] = {}
    errors: list[BaseException] = []

    def run(name: str) -> None:
        from django.db import connections

        relay = Relay(configured_broker(), batch_size=100, relay_id=name)
        try:
            barrier.wait(10)
            relayed[name] = relay.run_until_idle()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(f"relay-{n}",)) for n in range(RELAYS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    # A relay may stop while another still holds keys; a final pass sweeps whatever is left.
    leftover = Relay(configured_broker(), relay_id="final").run_until_idle()

    deliveries = enqueued(QUEUE)
    outbox_ids = [m.options["composition"]["outbox_id"] for m in deliveries]
    counts = Counter(outbox_ids)
    assert len(deliveries) == MESSAGES, f"{len(deliveries)} deliveries"
    assert set(counts) == set(ids) and set(counts.values()) == {1}
    assert len({m.message_id for m in deliveries}) == MESSAGES
    # Per-key order: each key's ids appear on the queue in increasing order.
    per_key: dict[str, list[int]] = defaultdict(list)
    for outbox_id in outbox_ids:
        if key_of[outbox_id] is not None:
            per_key[key_of[outbox_id]].append(outbox_id)
    assert set(per_key) == {key for key in specs if key is not None}
    for key, sequence in per_key.items():
        assert sequence == sorted(sequence), f"{key} out of order"
    # They really ran at once: every relay did part of the work.
    assert sum(relayed.values()) + leftover == MESSAGES
    assert all(count > 0 for count in relayed.values()), relayed
    assert not OutboxMessage.objects.filter(status="pending").exists()
    assert set(OutboxMessage.objects.values_list("attempts", flat=True)) == {1}




@pytest.mark.slow
def test_three_relay_processes_released_at_once_deliver_each_message_exactly_once() -> None:
    import json
    import subprocess
    import sys

    from composition.testing import subprocess_env

    messages, keys = 3000, 30
    specs = [None if seq % 7 == 0 else f"key-{seq % keys}" for seq in range(messages)]
    OutboxMessage.objects.bulk_create(
        [OutboxMessage(actor_name=PROBE, queue_name=QUEUE, payload={"seq": seq}, key=key)
         for seq, key in enumerate(specs)], batch_size=1000)
    key_of = dict(zip(OutboxMessage.objects.order_by("id").values_list("id", flat=True), specs, strict=True))
    relays: list[subprocess.Popen[bytes]] = []
    # The gate: while this transaction holds an EXCLUSIVE table lock, every relay's claim waits;
    # releasing it starts all three at the same instant, whatever their start-up times were.
    with psycopg.connect(current_database_url()) as gate:
        gate.execute("LOCK TABLE composition_outboxmessage IN EXCLUSIVE MODE")
        try:
            for _ in range(RELAYS):
                relays.append(subprocess.Popen(
                    [sys.executable, "manage.py", "outbox", "relay", "--batch-size", "50", "--json"],
                    env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE))

            def waiting() -> int:
                row = gate.execute("SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = "
                                   "'composition_outboxmessage'::regclass").fetchone()
                return int(row[0]) if row else 0

            deadline = time.monotonic() + 60
            while waiting() < RELAYS:
                assert time.monotonic() < deadline, "relay processes never reached their claim"
                assert all(p.poll() is None for p in relays), [p.communicate() for p in relays]
                time.sleep(0.05)
            gate.commit()
            outputs = [p.communicate(timeout=120) for p in relays]
        finally:
            for process in relays:
                if process.poll() is None:
                    process.kill()
                    process.wait()
    assert all(p.returncode == 0 for p in relays), outputs
    relayed = [json.loads(out)["relayed"] for out, _ in outputs]
    leftover = Relay(configured_broker(), relay_id="final").run_until_idle()
    assert sum(relayed) + leftover == messages
    assert sum(1 for n in relayed if n > 0) >= 2, relayed  # they really overlapped

    deliveries = enqueued(QUEUE)
    outbox_ids = [m.options["composition"]["outbox_id"] for m in deliveries]
    assert len(outbox_ids) == messages and set(Counter(outbox_ids).values()) == {1}
    assert set(outbox_ids) == set(key_of)
    per_key: dict[str, list[int]] = defaultdict(list)
    for outbox_id in outbox_ids:
        key = key_of[outbox_id]
        if key is not None:
            per_key[key].append(outbox_id)
    assert all(sequence == sorted(sequence) for sequence in per_key.values())
