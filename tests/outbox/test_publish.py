"""publish(): validation at once, atomicity with the caller's transaction, one nudge per commit."""

from __future__ import annotations

import datetime
import types
from typing import Any

import pytest
import structlog
from django.db import transaction
from django.db.transaction import TransactionManagementError
from django.test import override_settings

from composition.outbox import (
    InvalidDelayError,
    InvalidExpiryError,
    InvalidKeyError,
    InvalidPriorityError,
    OutboxMessage,
    PayloadNotSerializableError,
    PayloadTooLargeError,
    PublishError,
    UnknownActorError,
    publish,
)
from composition.outbox.models import message_id_for
from composition.outbox.publish import publish_with_headers
from composition.outbox.relay import RELAY_QUEUE_NAME
from tests.outboxapp import jobs
from tests.outboxapp.helpers import enqueued
from tests.outboxapp.models import Order

PROBE = "outboxapp_relay_probe"


# -- bad input raises at publish, and writes nothing ------------------------------------------------
pytestmark = [pytest.mark.empty_queues()]


@pytest.mark.django_db
@pytest.mark.parametrize(("actor", "payload", "kwargs", "error"), [
    ("no_such_actor", {"seq": 1}, {}, UnknownActorError),
    (object(), {"seq": 1}, {}, UnknownActorError),
    (PROBE, ["seq", 1], {}, PayloadNotSerializableError),
    (PROBE, {"seq": datetime.date(2024, 1, 1)}, {}, PayloadNotSerializableError),
    (PROBE, {"seq": {1: "int key"}}, {}, PayloadNotSerializableError),
    (PROBE, {"seq": (1, 2)}, {}, PayloadNotSerializableError),
    (PROBE, {"seq": float("nan")}, {}, PayloadNotSerializableError),
    # Text PostgreSQL's jsonb refuses: the error came at COMMIT, aborting the caller's transaction.
    (PROBE, {"seq": "a\x00b"}, {}, PayloadNotSerializableError),
    (PROBE, {"seq": ["\ud800"]}, {}, PayloadNotSerializableError),
    (PROBE, {"nul\x00key": 1}, {}, PayloadNotSerializableError),
    (PROBE, {"seq": 1}, {"key": ""}, InvalidKeyError),
    (PROBE, {"seq": 1}, {"key": "k" * 256}, InvalidKeyError),
    (PROBE, {"seq": 1}, {"key": 7}, InvalidKeyError),
    (PROBE, {"seq": 1}, {"delay_s": -1}, InvalidDelayError),
    (PROBE, {"seq": 1}, {"delay_s": float("inf")}, InvalidDelayError),
    (PROBE, {"seq": 1}, {"delay_s": "5"}, InvalidDelayError),
    # Each escaped as a raw OverflowError, DataError, UnicodeEncodeError, ValueError or TypeError.
    (PROBE, {"seq": 1}, {"delay_s": 1e12}, InvalidDelayError),
    (PROBE, {"seq": 1}, {"delay_s": 10**400}, InvalidDelayError),
    (PROBE, {"seq": 1}, {"key": "k\x00"}, InvalidKeyError),
    (PROBE, {"seq": 1}, {"key": "k\ud800"}, InvalidKeyError),
    (PROBE, {"seq": 10**5000}, {}, PayloadNotSerializableError),
    (PROBE, {"seq": types.MappingProxyType({"a": 1})}, {}, PayloadNotSerializableError),
    (PROBE, {"seq": 1}, {"priority": 101}, InvalidPriorityError),
    (PROBE, {"seq": 1}, {"priority": -101}, InvalidPriorityError),
    (PROBE, {"seq": 1}, {"priority": 1.5}, InvalidPriorityError),
    (PROBE, {"seq": 1}, {"priority": "high"}, InvalidPriorityError),
    (PROBE, {"seq": 1}, {"priority": True}, InvalidPriorityError),
    (PROBE, {"seq": 1}, {"priority": None}, InvalidPriorityError),
    (PROBE, {"seq": 1}, {"expires_s": 0}, InvalidExpiryError),
    (PROBE, {"seq": 1}, {"expires_s": "60"}, InvalidExpiryError),
    (PROBE, {"seq": 1}, {"expires_s": float("nan")}, InvalidExpiryError),
    (PROBE, {"seq": 1}, {"expires_s": 60, "delay_s": 60}, InvalidExpiryError),
    (PROBE, {"seq": 1}, {"expires_s": 60, "delay_s": -1}, InvalidDelayError),
])
def test_bad_input_raises_at_publish_and_writes_nothing(actor: Any, payload: Any, kwargs: dict[str, Any],
                                                        error: type[Exception]) -> None:
    with pytest.raises(error) as caught:
        publish(actor, payload, **kwargs)
    assert isinstance(caught.value, PublishError)
    assert isinstance(caught.value, ValueError)
    assert OutboxMessage.objects.count() == 0


def _not_a_job(seq: int) -> None:
    """A plain function: published by mistake for the @job beside it."""


@pytest.mark.django_db
def test_a_plain_function_is_refused_as_not_a_job() -> None:
    # It said "unknown actor '<function ...>'": nothing about @job.
    with pytest.raises(UnknownActorError, match=r"<function _not_a_job at .*> is not a job: publish\(\) takes a "
                                                r"function declared with @job"):
        publish(_not_a_job, {"seq": 1})


@pytest.mark.django_db
def test_any_mapping_of_keyword_arguments_is_published_as_a_dict() -> None:
    message = publish(PROBE, types.MappingProxyType({"seq": 1}))
    assert OutboxMessage.objects.get(pk=message.pk).payload == {"seq": 1}


@pytest.mark.django_db
def test_text_that_only_looks_like_a_nul_escape_is_published_as_it_is() -> None:
    message = publish(PROBE, {"seq": 1, "note": "\\u0000 and \\\\u0000 are text"})
    assert OutboxMessage.objects.get(pk=message.pk).payload["note"] == "\\u0000 and \\\\u0000 are text"
    with pytest.raises(PayloadNotSerializableError, match="NUL"):
        publish_with_headers(PROBE, {"seq": 1}, headers={"reason": "\x00"})
    with pytest.raises(PayloadNotSerializableError, match="lone surrogate"):
        publish_with_headers(PROBE, {"seq": 1}, headers={"reason": "\udfff"})


@pytest.mark.django_db
def test_unknown_actor_message_names_the_actor() -> None:
    with pytest.raises(UnknownActorError, match="'billing_send_nothing'"):
        publish("billing_send_nothing", {})


@pytest.mark.django_db
def test_non_json_error_names_the_offending_path() -> None:
    with pytest.raises(PayloadNotSerializableError, match=r"payload\['items'\]\[1\] is a set"):
        publish(PROBE, {"items": [1, {2}]})


@pytest.mark.django_db
def test_oversize_payload_is_refused_at_the_configured_limit() -> None:
    publish(PROBE, {"blob": "x" * 8000})  # encoded size 8011 bytes: under the 8 KiB default
    with pytest.raises(PayloadTooLargeError, match="OUTBOX_MAX_PAYLOAD_BYTES=8192") as caught:
        publish(PROBE, {"blob": "x" * 8200})
    assert caught.value.size_bytes == len('{"blob":""}') + 8200
    with override_settings(COMPOSITION={"OUTBOX_MAX_PAYLOAD_BYTES": 64}), pytest.raises(PayloadTooLargeError):
        publish(PROBE, {"blob": "x" * 60})
    # Multi-byte characters count in UTF-8 bytes, which is what travels.
    with override_settings(COMPOSITION={"OUTBOX_MAX_PAYLOAD_BYTES": 64}), pytest.raises(PayloadTooLargeError):
        publish(PROBE, {"s": "é" * 30})
    assert OutboxMessage.objects.count() == 1


# -- what a row records ------------------------------------------------------------------------------
@pytest.mark.django_db
def test_row_records_actor_queue_payload_key_and_headers() -> None:
    structlog.contextvars.bind_contextvars(request_id="req-123")
    try:
        before = datetime.datetime.now(datetime.UTC).timestamp()
        row = publish(jobs.relay_probe, {"seq": 5, "key": "invoice:1"}, key="invoice:1", delay_s=2)
    finally:
        structlog.contextvars.clear_contextvars()
    row.refresh_from_db()
    assert (row.actor_name, row.queue_name, row.status) == (PROBE, "outboxapp_probe", "pending")
    assert row.payload == {"seq": 5, "key": "invoice:1"}
    assert row.key == "invoice:1" and row.delay_s == 2.0
    assert row.headers["request_id"] == "req-123"
    assert before <= row.headers["published_at"] <= before + 5
    assert row.message_id == message_id_for(row.pk) != message_id_for(row.pk + 1)


# -- atomicity ------------------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_publish_in_a_rolled_back_block_leaves_no_row_and_no_nudge() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        Order.objects.create(reference="A")
        publish(PROBE, {"seq": 1})
        raise RuntimeError("business failure")
    assert Order.objects.count() == 0
    assert OutboxMessage.objects.count() == 0
    assert enqueued(RELAY_QUEUE_NAME) == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("nudge_only")
def test_publish_in_a_committed_block_leaves_one_row_and_nudges_once() -> None:
    with transaction.atomic():
        Order.objects.create(reference="B")
        for seq in range(50):
            publish(PROBE, {"seq": seq})
        # Nothing leaves before the commit.
        assert enqueued(RELAY_QUEUE_NAME) == []
    assert OutboxMessage.objects.count() == 50
    nudges = enqueued(RELAY_QUEUE_NAME)
    assert [m.actor_name for m in nudges] == ["composition_outbox_relay"]


@pytest.mark.django_db(transaction=True)
def test_rolled_back_savepoint_drops_its_row_and_the_outer_commit_still_nudges() -> None:
    with transaction.atomic():
        publish(PROBE, {"seq": 1})
        with pytest.raises(RuntimeError), transaction.atomic():
            publish(PROBE, {"seq": 2})
            raise RuntimeError
        publish(PROBE, {"seq": 3})
    assert sorted(r["seq"] for r in OutboxMessage.objects.values_list("payload", flat=True)) == [1, 3]
    assert 1 <= len(enqueued(RELAY_QUEUE_NAME)) <= 2


@pytest.mark.django_db(transaction=True)
def test_only_savepoint_publish_rolled_back_means_no_nudge_from_it() -> None:
    with transaction.atomic(), pytest.raises(RuntimeError), transaction.atomic():
        publish(PROBE, {"seq": 1})
        raise RuntimeError
    assert OutboxMessage.objects.count() == 0
    assert enqueued(RELAY_QUEUE_NAME) == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("nudge_only")
def test_autocommit_publish_nudges_at_once() -> None:
    publish(PROBE, {"seq": 1})
    assert len(enqueued(RELAY_QUEUE_NAME)) == 1


def test_a_database_error_of_the_after_commit_send_does_not_pause_sends() -> None:
    # A restarting PostgreSQL fails the send's claim; that says nothing about the broker, so the
    # breaker that skips sends to a failing broker stays closed.
    from django.db import OperationalError

    from composition.broker.configured import configured_broker
    from composition.outbox.after_commit import nudge_breaker

    def claim_on_a_restarting_database() -> None:
        raise OperationalError("the database system is shutting down")

    breaker = nudge_breaker(configured_broker())
    with pytest.raises(OperationalError):
        breaker.call(claim_on_a_restarting_database)
    assert breaker.call(lambda: "sent") == "sent"


# -- transactions Django's atomic does not describe ---------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_a_row_published_under_a_savepoint_rolled_back_by_hand_is_never_sent() -> None:
    # transaction.savepoint() is not atomic's: Django keeps the after-commit hook, and the send
    # must find out that the row went with the savepoint.
    with transaction.atomic():
        sid = transaction.savepoint()
        publish(PROBE, {"seq": 1})
        transaction.savepoint_rollback(sid)
        publish(PROBE, {"seq": 2})
    assert [row["seq"] for row in OutboxMessage.objects.values_list("payload", flat=True)] == [2]
    assert [message.kwargs["seq"] for message in enqueued("outboxapp_probe")] == [2]


@pytest.mark.django_db(transaction=True)
def test_publish_under_manual_transaction_management_is_refused() -> None:
    # Autocommit off outside atomic: nothing says when (or whether) it commits, so publish()
    # refuses, as on_commit() does, rather than send a row that is then rolled back.
    transaction.set_autocommit(False)
    try:
        with pytest.raises(TransactionManagementError, match="manual transaction management"):
            publish(PROBE, {"seq": 1})
    finally:
        transaction.rollback()
        transaction.set_autocommit(True)
    assert not OutboxMessage.objects.exists()
    assert enqueued("outboxapp_probe") == []
