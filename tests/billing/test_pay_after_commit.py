"""What a pay does after its COMMIT, on the committing thread: the outbox row is on the broker
and marked sent, and the invalidation applied and its record deleted, when ``pay_invoice``
returns; nothing is left for a user's test to flush."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from billing.models import Invoice
from billing.wiring import default_service
from composition.cache.models import PendingInvalidation
from composition.outbox import OutboxMessage
from tests.pgtrace import sent_queries


@pytest.mark.django_db(transaction=True)
def test_a_pay_is_plain_statements_then_its_row_is_sent_before_it_returns() -> None:
    invoice = Invoice.objects.create(number=f"AC-{uuid.uuid4().hex[:8]}", customer="Ada", amount_cents=500)
    service = default_service()
    with sent_queries() as queries:
        outcome = service.pay_invoice(invoice.pk, payment_id=f"ac-{invoice.pk}", amount_cents=500)
    # BEGIN, the lock, the payment, the invoice's update, the invalidation record, the outbox
    # row, COMMIT; then the record's DELETE and the mark-sent.
    assert [query.split()[0] for query in queries[:7]] == ["BEGIN", "SELECT", "INSERT", "UPDATE", "INSERT", "INSERT",
                                                            "COMMIT"], queries
    assert "FOR UPDATE" in queries[1] and 'INSERT INTO "billing_payment"' in queries[2], queries
    assert 'INSERT INTO "composition_outboxmessage"' in queries[5], queries
    message = OutboxMessage.objects.get(payload__payment_id=outcome.payment.pk)
    assert (message.status, message.attempts) == (OutboxMessage.Status.SENT, 1), "sent once, by this process"
    assert not PendingInvalidation.objects.filter(target=f"invoice:{invoice.pk}").exists()


@pytest.mark.django_db  # the test runs inside a transaction: its on-commit hooks run inside it
def test_hooks_run_inside_an_enclosing_transaction_send_on_the_calling_thread(
        django_capture_on_commit_callbacks: Any) -> None:
    invoice = Invoice.objects.create(number=f"AC-{uuid.uuid4().hex[:8]}", customer="Ada", amount_cents=500)
    with django_capture_on_commit_callbacks(execute=True):
        outcome = default_service().pay_invoice(invoice.pk, payment_id=f"in-{invoice.pk}", amount_cents=500)
    message = OutboxMessage.objects.get(payload__payment_id=outcome.payment.pk)
    assert (message.status, message.attempts) == (OutboxMessage.Status.SENT, 1)
    assert not PendingInvalidation.objects.filter(target=f"invoice:{invoice.pk}").exists()
