"""Payloads are checked against the job's arguments at publish, and again when a dead letter is
replayed: a payload that could only fail in the worker is refused at once, and nothing is written."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction
from dramatiq import Message
from dramatiq.broker import MessageProxy

from composition.errors import CompositionError, PayloadValidationError
from composition.jobs import replay as service
from composition.jobs.deadletters import record_dead_letter
from composition.jobs.models import DeadLetter
from composition.outbox import OutboxMessage, PayloadDoesNotFitError, PublishError, publish
from tests.jobsapp import jobs
from tests.jobsapp.models import Effect


@pytest.mark.django_db
@pytest.mark.parametrize(("payload", "reason"), [
    ({"m": 1}, "unexpected keyword argument 'm'; missing a required argument 'invoice_id'"),
    ({"invoice_id": "x"}, "argument 'invoice_id' must be int, got str"),
    ({"invoice_id": True}, "argument 'invoice_id' must be int, got bool"),
    ({"invoice_id": 1, "note": 2}, "argument 'note' must be str, got int"),
    ({}, "missing a required argument 'invoice_id'"),
])
def test_a_payload_that_does_not_fit_is_refused_and_nothing_is_written(payload: dict, reason: str) -> None:
    with pytest.raises(PayloadDoesNotFitError, match=reason) as caught:
        publish(jobs.typed, payload)
    assert isinstance(caught.value, PublishError) and isinstance(caught.value, TypeError)
    assert "payload for typed" in str(caught.value)
    assert not OutboxMessage.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(("payload", "reason"), [
    ({"invoice_ids": [1, "x"]}, "argument 'invoice_ids' must be list[int], got str at invoice_ids[1]"),
    ({"invoice_ids": [[1]]}, "argument 'invoice_ids' must be list[int], got list at invoice_ids[0]"),
    ({"invoice_ids": 1}, "argument 'invoice_ids' must be list[int], got int"),
])
def test_a_list_with_an_element_that_does_not_fit_is_refused_and_nothing_is_written(payload: dict,
                                                                                    reason: str) -> None:
    with pytest.raises(PayloadDoesNotFitError) as caught:
        publish(jobs.typed_batch, payload)
    assert str(caught.value) == f"payload for typed_batch: {reason}"
    assert not OutboxMessage.objects.exists()
    publish(jobs.typed_batch, {"invoice_ids": [1, 2]})
    assert OutboxMessage.objects.count() == 1


@pytest.mark.django_db
def test_a_refusal_inside_a_transaction_leaves_the_rest_of_it_alone() -> None:
    with transaction.atomic():
        Effect.objects.create(key="kept")
        with pytest.raises(PayloadDoesNotFitError):
            publish("typed", {"invoice": 1})  # by name too
        publish(jobs.typed, {"invoice_id": 7, "note": "ok"})
    assert Effect.objects.filter(key="kept").exists()
    assert list(OutboxMessage.objects.values_list("payload", flat=True)) == [{"invoice_id": 7, "note": "ok"}]


def _dead_letter_of_an_old_deploy() -> DeadLetter:
    """A dead letter whose payload names an argument the job no longer takes."""
    message = MessageProxy(Message(queue_name=jobs.CHECK_QUEUE, actor_name="typed", args=(),
                                   kwargs={"invoice": 43}, options={}))
    pk = record_dead_letter(message, PayloadValidationError("unexpected keyword argument 'invoice'"), attempts=1)
    return DeadLetter.objects.get(pk=pk)


@pytest.mark.django_db
def test_replaying_a_dead_letter_that_no_longer_fits_is_refused() -> None:
    letter = _dead_letter_of_an_old_deploy()
    with pytest.raises(PayloadDoesNotFitError, match="unexpected keyword argument 'invoice'"):
        service.replay(letter.pk)
    assert isinstance(PayloadDoesNotFitError("x"), CompositionError), "bulk replay reports it as refused"
    letter.refresh_from_db()
    assert letter.status == "dead" and letter.replay_outbox_id is None
    assert not OutboxMessage.objects.exists()

    with pytest.raises(CommandError, match="unexpected keyword argument 'invoice'"):
        call_command("deadletters", "replay", "--id", str(letter.pk))
    err = StringIO()
    with pytest.raises(CommandError, match="1 dead letter\\(s\\) not replayed"):
        call_command("deadletters", "replay", "--actor", "typed", "--yes", stdout=StringIO(), stderr=err)
    assert "1 refused: payload for typed" in err.getvalue() and f"ids {letter.pk}" in err.getvalue()
    assert DeadLetter.objects.get(pk=letter.pk).status == "dead"
    assert not OutboxMessage.objects.exists()
