"""publish_many(): every payload checked before anything is written, ids in list order, one INSERT
per ROWS_PER_INSERT payloads, and the whole batch sent in the transaction's one send after COMMIT,
a key's rows in order behind the key's older rows."""

from __future__ import annotations

import importlib
import threading
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext

from composition.broker.configured import configured_broker
from composition.broker.priorities import PRIORITY_HEADER
from composition.outbox import (
    InvalidDelayError,
    InvalidExpiryError,
    InvalidKeyError,
    InvalidPriorityError,
    OutboxMessage,
    PayloadDoesNotFitError,
    PayloadNotSerializableError,
    PayloadTooLargeError,
    PublishError,
    UnknownActorError,
    publish,
    publish_many,
)
from composition.outbox.relay import RELAY_QUEUE_NAME, Relay, relay_for
from composition.testing import empty_queues, left_to_the_relay
from tests.jobsapp import jobs as typed_jobs
from tests.outboxapp import jobs
from tests.outboxapp.helpers import delayed, enqueued
from tests.outboxapp.models import Order

# The module (the package's name publish_many is the function).
publish_many_module = importlib.import_module("composition.outbox.publish_many")

PROBE = "outboxapp_relay_probe"
PROBE_QUEUE = "outboxapp_probe"
KEY = "invoice:many"


pytestmark = [pytest.mark.empty_queues()]


def _seqs(queue_name: str = PROBE_QUEUE) -> list[int]:
    return [message.kwargs["seq"] for message in enqueued(queue_name)]


def _inserts(queries: CaptureQueriesContext) -> list[str]:
    return [query["sql"] for query in queries.captured_queries if query["sql"].lstrip().startswith("INSERT")]


# -- what it writes and returns --------------------------------------------------------------------
@pytest.mark.django_db
def test_rows_come_back_in_list_order_with_their_ids_and_as_read_back() -> None:
    rows = publish_many(jobs.relay_probe, [{"seq": seq} for seq in range(5)], key=KEY, delay_s=2)
    assert [row.payload["seq"] for row in rows] == list(range(5))
    assert [row.pk for row in rows] == sorted(row.pk for row in rows)
    stored = {row.pk: row for row in OutboxMessage.objects.filter(pk__in=[row.pk for row in rows])}
    fields = ["actor_name", "queue_name", "payload", "key", "headers", "delay_s", "status", "created_at",
              "claimed_until", "claimed_by", "attempts", "sent_at", "last_error"]
    for row in rows:
        assert [getattr(row, name) for name in fields] == [getattr(stored[row.pk], name) for name in fields]
    # Leased to this process's relay, to be sent right after COMMIT (this test never commits).
    assert {(row.claimed_by, row.attempts) for row in rows} == {(relay_for(configured_broker()).relay_id, 1)}


@pytest.mark.django_db
def test_payload_text_survives_the_array_it_travels_in() -> None:
    awkward = ['a "quoted" {brace}, comma', "back\\slash \\\\ and \\u0000 as text", "é ✓ 🧾", "NULL", "", "}{"]
    rows = publish_many(PROBE, [{"seq": index, "note": note, "nested": {"list": [note, None, 1.5]}}
                                for index, note in enumerate(awkward)])
    stored = OutboxMessage.objects.filter(pk__in=[row.pk for row in rows]).order_by("id")
    assert [row.payload for row in stored] == [row.payload for row in rows]
    assert [row.payload["note"] for row in stored] == awkward


@pytest.mark.django_db
def test_an_empty_list_writes_nothing_and_registers_nothing(django_capture_on_commit_callbacks: Any) -> None:
    with django_capture_on_commit_callbacks() as callbacks:
        assert publish_many(PROBE, []) == []
        assert publish_many(PROBE, iter([])) == []
    assert callbacks == []
    assert not OutboxMessage.objects.exists()


@pytest.mark.django_db
def test_a_batch_larger_than_one_insert_is_written_in_several_in_list_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publish_many_module, "ROWS_PER_INSERT", 3)
    with CaptureQueriesContext(connection) as queries:
        rows = publish_many(PROBE, [{"seq": seq} for seq in range(10)], key=KEY)
    assert len(_inserts(queries)) == 4
    assert [row.pk for row in rows] == sorted(row.pk for row in rows)
    assert list(OutboxMessage.objects.order_by("id").values_list("payload__seq", flat=True)) == list(range(10))
    # A later INSERT's key check does not count the rows the earlier ones leased: all are leased.
    assert {row.attempts for row in OutboxMessage.objects.all()} == {1}


@pytest.mark.django_db(transaction=True)
def test_thousands_of_payloads_go_in_a_few_inserts_and_all_reach_the_broker() -> None:
    count = publish_many_module.ROWS_PER_INSERT * 2 + 500
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        rows = publish_many(PROBE, [{"seq": seq} for seq in range(count)])
    assert len(_inserts(queries)) == 3
    assert _seqs() == list(range(count))
    assert OutboxMessage.objects.filter(pk__in=[row.pk for row in rows], status="sent").count() == count


# -- bad input: nothing written, the bad payload named ----------------------------------------------
@pytest.mark.django_db
@pytest.mark.parametrize(("bad", "error", "message"), [
    ({"seq": {1, 2}}, PayloadNotSerializableError, r"payloads\[3\]: payload\['seq'\] is a set"),
    (["seq", 1], PayloadNotSerializableError, r"payloads\[3\]: payload must be a dict"),
    ({"seq": "a\x00b"}, PayloadNotSerializableError, r"payloads\[3\]: payload holds a NUL"),
    ({"blob": "x" * 8200}, PayloadTooLargeError, r"payloads\[3\]: payload is 8211 bytes"),
])
def test_a_bad_payload_at_any_index_writes_nothing_and_is_named(bad: Any, error: type[Exception],
                                                                message: str) -> None:
    payloads = [{"seq": 0}, {"seq": 1}, {"seq": 2}, bad, {"seq": 4}]
    with pytest.raises(error, match=message) as caught:
        publish_many(PROBE, payloads)
    assert isinstance(caught.value, PublishError)
    assert not OutboxMessage.objects.exists()


@pytest.mark.django_db
def test_a_payload_that_does_not_fit_the_job_refuses_the_batch_and_leaves_the_transaction_usable() -> None:
    with transaction.atomic():
        Order.objects.create(reference="kept")
        with pytest.raises(PayloadDoesNotFitError, match=r"payloads\[1\]: .*missing a required argument"):
            publish_many(typed_jobs.typed, [{"invoice_id": 1}, {"note": "no id"}, {"invoice_id": 3}])
        publish_many(typed_jobs.typed, [{"invoice_id": 7}])
    assert Order.objects.filter(reference="kept").exists()
    assert list(OutboxMessage.objects.values_list("payload", flat=True)) == [{"invoice_id": 7}]


@pytest.mark.django_db
@pytest.mark.parametrize(("actor", "payloads", "kwargs", "error"), [
    ("no_such_actor", [{"seq": 1}], {}, UnknownActorError),
    ("no_such_actor", [], {}, UnknownActorError),
    (PROBE, [{"seq": 1}], {"key": ""}, InvalidKeyError),
    (PROBE, [], {"key": 7}, InvalidKeyError),
    (PROBE, [{"seq": 1}], {"delay_s": -1}, InvalidDelayError),
    (PROBE, [{"seq": 1}], {"priority": "high"}, InvalidPriorityError),
    (PROBE, [], {"priority": 500}, InvalidPriorityError),
    (PROBE, [], {"expires_s": -5}, InvalidExpiryError),
    (PROBE, [{"seq": 1}], {"expires_s": 10, "delay_s": 20}, InvalidExpiryError),
    (PROBE, {"seq": 1}, {}, PayloadNotSerializableError),
    (PROBE, "seq", {}, PayloadNotSerializableError),
    (PROBE, 7, {}, PayloadNotSerializableError),
])
def test_bad_batch_options_raise_before_anything_is_written(actor: Any, payloads: Any, kwargs: dict[str, Any],
                                                            error: type[Exception]) -> None:
    with pytest.raises(error):
        publish_many(actor, payloads, **kwargs)
    assert not OutboxMessage.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_publish_many_under_manual_transaction_management_is_refused() -> None:
    transaction.set_autocommit(False)
    try:
        with pytest.raises(TransactionManagementError, match=r"publish_many\(\) cannot be used"):
            publish_many(PROBE, [{"seq": 1}])
    finally:
        transaction.rollback()
        transaction.set_autocommit(True)
    assert not OutboxMessage.objects.exists()


# -- the one send after COMMIT ---------------------------------------------------------------------
@pytest.mark.django_db
def test_a_transaction_registers_one_send_whatever_it_publishes(django_capture_on_commit_callbacks: Any) -> None:
    with django_capture_on_commit_callbacks() as callbacks:
        publish(PROBE, {"seq": 0})
        publish_many(PROBE, [{"seq": seq} for seq in range(1, 40)])
        publish_many(PROBE, [{"seq": seq} for seq in range(40, 50)], key=KEY)
    assert len(callbacks) == 1


@pytest.mark.django_db(transaction=True)
def test_at_commit_the_whole_batch_is_on_the_broker_in_list_order_sent_in_one_batch() -> None:
    with transaction.atomic():
        Order.objects.create(reference="A")
        rows = publish_many(PROBE, [{"seq": seq} for seq in range(50)])
        assert enqueued(PROBE_QUEUE) == []  # nothing leaves before the COMMIT
    assert _seqs() == list(range(50))
    sent = list(OutboxMessage.objects.filter(pk__in=[row.pk for row in rows]))
    assert {(row.status, row.claimed_by, row.attempts) for row in sent} == {
        ("sent", relay_for(configured_broker()).relay_id, 1)}
    assert len({row.sent_at for row in sent}) == 1, "one enqueue and one mark-sent for the whole batch"
    assert enqueued(RELAY_QUEUE_NAME) == [], "nothing was left for the relay to be nudged for"


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_transaction_writes_nothing_and_sends_nothing() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        Order.objects.create(reference="B")
        publish_many(PROBE, [{"seq": seq} for seq in range(5)])
        raise RuntimeError("business failure")
    assert not Order.objects.exists() and not OutboxMessage.objects.exists()
    assert enqueued(PROBE_QUEUE) == [] and enqueued(RELAY_QUEUE_NAME) == []


@pytest.mark.django_db(transaction=True)
def test_a_batch_in_a_rolled_back_savepoint_is_never_sent_and_the_rest_is() -> None:
    with transaction.atomic():
        publish_many(PROBE, [{"seq": 0}, {"seq": 1}])
        with pytest.raises(RuntimeError), transaction.atomic():
            publish_many(PROBE, [{"seq": 2}, {"seq": 3}])
            raise RuntimeError
        publish_many(PROBE, [{"seq": 4}])
    assert _seqs() == [0, 1, 4]
    assert set(OutboxMessage.objects.values_list("status", flat=True)) == {"sent"}


@pytest.mark.django_db(transaction=True)
def test_in_autocommit_the_batch_is_on_the_broker_when_it_returns() -> None:
    rows = publish_many(PROBE, [{"seq": seq} for seq in range(3)])
    assert _seqs() == [0, 1, 2]
    assert set(OutboxMessage.objects.filter(pk__in=[row.pk for row in rows]).values_list("status", flat=True)) \
        == {"sent"}


@pytest.mark.django_db(transaction=True)
def test_a_delayed_batch_goes_to_the_delay_queue() -> None:
    publish_many(PROBE, [{"seq": 0}, {"seq": 1}], delay_s=60)
    assert enqueued(PROBE_QUEUE) == []
    assert [message.kwargs["seq"] for message in delayed(PROBE_QUEUE)] == [0, 1]


@pytest.mark.django_db(transaction=True)
def test_left_to_the_relay_the_batch_stays_pending_and_the_relay_is_nudged_once() -> None:
    with left_to_the_relay(), transaction.atomic():
        publish_many(PROBE, [{"seq": seq} for seq in range(3)])
    assert set(OutboxMessage.objects.values_list("status", "attempts")) == {("pending", 0)}
    assert len(enqueued(RELAY_QUEUE_NAME)) == 1
    assert Relay(configured_broker()).run_until_idle() == 3
    assert _seqs() == [0, 1, 2]


@pytest.mark.django_db(transaction=True)
def test_a_priority_orders_what_waits_in_the_queue_higher_first_equal_ones_in_publish_order() -> None:
    with transaction.atomic():
        publish(PROBE, {"seq": 0})
        publish(PROBE, {"seq": 1}, priority=-5)
        publish_many(PROBE, [{"seq": 2}, {"seq": 3}], priority=10)
        publish(PROBE, {"seq": 4}, priority=50, key=KEY)
        publish(PROBE, {"seq": 5}, priority=0)
    rows = OutboxMessage.objects.order_by("id")
    assert [row.headers.get(PRIORITY_HEADER) for row in rows] == [None, -5, 10, 10, 50, None]
    consumer = configured_broker().consume(PROBE_QUEUE, prefetch=1, timeout=100)
    fetched: list[int] = []
    try:
        for _ in range(100):
            message = next(consumer)
            if message is not None:
                fetched.append(message.kwargs["seq"])
                consumer.ack(message)
            if len(fetched) == 6:
                break
    finally:
        consumer.close()
    assert fetched == [4, 2, 3, 0, 5, 1]


def test_a_priority_rabbitmq_would_not_honour_is_refused_at_publish(settings: Any) -> None:
    amqp = "amqp://guest:guest@127.0.0.1:5672/%2F"
    settings.COMPOSITION = {**settings.COMPOSITION, "BROKER_URL": amqp, "RABBITMQ_QUEUE_TYPE": "quorum"}
    with pytest.raises(InvalidPriorityError, match="quorum queues"):
        publish(PROBE, {"seq": 1}, priority=5)
    settings.COMPOSITION = {**settings.COMPOSITION, "RABBITMQ_QUEUE_TYPE": "classic", "RABBITMQ_MAX_PRIORITY": None}
    with pytest.raises(InvalidPriorityError, match="RABBITMQ_MAX_PRIORITY"):
        publish_many(PROBE, [{"seq": 1}], priority=-1)


# -- a key's order -----------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_a_key_s_batch_is_sent_at_commit_in_list_order_as_publish_would_send_it() -> None:
    # As publish() called once per payload in one transaction: the transaction's rows of a key
    # never wait for each other; they leave in one batch, in order.
    with transaction.atomic():
        publish_many(PROBE, [{"seq": seq} for seq in range(4)], key=KEY)
    with transaction.atomic():
        for seq in range(4, 8):
            publish(PROBE, {"seq": seq}, key=KEY)
    assert _seqs() == list(range(8))
    rows = list(OutboxMessage.objects.order_by("id"))
    assert {(row.status, row.attempts) for row in rows} == {("sent", 1)}
    assert len({row.sent_at for row in rows[:4]}) == 1


@pytest.mark.django_db(transaction=True)
def test_a_key_s_batch_behind_an_older_pending_row_waits_for_it_and_follows_in_order() -> None:
    with left_to_the_relay():
        publish(PROBE, {"seq": 0}, key=KEY)  # committed, still pending: the key's head
    empty_queues()
    with transaction.atomic():
        rows = publish_many(PROBE, [{"seq": seq} for seq in range(1, 4)], key=KEY)
        # Inserted unleased: they must wait for the key's head.
        assert {(row.claimed_by, row.claimed_until, row.attempts) for row in rows} == {("", None, 0)}
    # Left to the relay, which was nudged.
    assert enqueued(PROBE_QUEUE) == []
    assert set(OutboxMessage.objects.values_list("status", "attempts")) == {("pending", 0)}
    assert len(enqueued(RELAY_QUEUE_NAME)) == 1
    assert Relay(configured_broker()).run_until_idle() == 4
    assert _seqs() == [0, 1, 2, 3]


def _publish_before_the_send(batches: list[list[int]], errors: list[BaseException]) -> None:
    """Publish ``batches[0]`` in a transaction whose send after COMMIT runs only once the other
    batches were published and sent, each in a transaction of its own on another connection: as if
    another process committed the key's later rows while this one was between COMMIT and send."""
    def publish_the_rest() -> None:
        if batches[1:]:
            thread = threading.Thread(target=_in_thread, args=(batches[1:], errors))
            thread.start()
            thread.join()

    with transaction.atomic():
        transaction.on_commit(publish_the_rest)  # registered first, so it runs before the send
        publish_many(PROBE, [{"seq": seq} for seq in batches[0]], key=KEY)


def _in_thread(batches: list[list[int]], errors: list[BaseException]) -> None:
    try:
        _publish_before_the_send(batches, errors)
    except BaseException as exc:
        errors.append(exc)
    finally:
        connection.close()


@pytest.mark.django_db(transaction=True)
def test_a_batch_that_waited_behind_another_transaction_s_rows_is_relayed_after_them() -> None:
    errors: list[BaseException] = []
    _publish_before_the_send([[0, 1], [2, 3]], errors)
    assert errors == []
    rows = list(OutboxMessage.objects.order_by("id"))
    assert [(row.payload["seq"], row.status) for row in rows] == [(0, "sent"), (1, "sent"), (2, "pending"),
                                                                   (3, "pending")]
    assert _seqs() == [0, 1]
    # The later batch's own nudge, and the earlier one's once its rows (the key's head) were sent.
    assert len(enqueued(RELAY_QUEUE_NAME)) == 2
    assert Relay(configured_broker()).run_until_idle() == 2
    assert _seqs() == [0, 1, 2, 3]
