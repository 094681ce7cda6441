"""``save_with_commit`` (composition.deferred_saves): the update of a locked row goes in one
string with COMMIT, a read in the transaction sees it, it rolls back with the transaction, an
update that finds no row fails the whole transaction as ``Model.save`` would, and wherever it
cannot be held it is saved at once, signals and all."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction
from django.db.models import signals

from billing.models import Invoice
from composition.deferred_saves import save_with_commit
from composition.locks import row_lock
from tests.outboxapp.models import Order
from tests.pgtrace import sent_queries


def _invoice() -> Invoice:
    return Invoice.objects.create(number=f"DS-{uuid.uuid4().hex[:10]}", customer="Ada", amount_cents=500)


@pytest.mark.django_db(transaction=True)
def test_a_locked_rows_update_goes_with_commit_in_one_string() -> None:
    invoice = _invoice()
    before = invoice.updated_at
    with sent_queries() as queries, transaction.atomic(), \
            row_lock(Invoice.objects.filter(pk=invoice.pk), timeout_s=1) as [locked]:
        locked.customer = "Grace"
        assert save_with_commit(locked, update_fields=["customer", "updated_at"]) is True
        assert locked.updated_at > before  # auto_now, set at the call as by save()
    # BEGIN with the lock (one string, as a lock with a timeout is sent), then the update with
    # COMMIT: two round trips, where save() takes three.
    assert len(queries) == 2, queries
    assert queries[1].startswith('WITH composition_updated AS (UPDATE "billing_invoice"'), queries[1]
    assert queries[1].endswith("; COMMIT")
    stored = Invoice.objects.get(pk=invoice.pk)
    assert (stored.customer, stored.updated_at) == ("Grace", locked.updated_at)


@pytest.mark.django_db(transaction=True)
def test_a_read_in_the_transaction_sees_the_held_update() -> None:
    invoice = _invoice()
    with transaction.atomic(), row_lock(Invoice.objects.filter(pk=invoice.pk)) as [locked]:
        locked.customer = "Grace"
        assert save_with_commit(locked, update_fields=["customer"])
        assert connection.held_writes  # type: ignore[attr-defined]
        assert Invoice.objects.get(pk=invoice.pk).customer == "Grace"


@pytest.mark.django_db(transaction=True)
def test_a_held_update_rolls_back_with_its_transaction() -> None:
    invoice = _invoice()
    with pytest.raises(RuntimeError), transaction.atomic(), row_lock(Invoice.objects.filter(pk=invoice.pk)) as [locked]:
        locked.customer = "Grace"
        assert save_with_commit(locked, update_fields=["customer"])
        raise RuntimeError
    assert Invoice.objects.get(pk=invoice.pk).customer == "Ada"
    with transaction.atomic():  # and the next transaction does not send it
        Order.objects.create(reference="next")
    assert Invoice.objects.get(pk=invoice.pk).customer == "Ada"


@pytest.mark.django_db(transaction=True)
def test_an_update_that_finds_no_row_fails_the_whole_transaction_as_save_would() -> None:
    gone = _invoice()
    reference = uuid.uuid4().hex
    with pytest.raises(DatabaseError, match=rf"did not affect any rows: billing_invoice id {gone.pk}\b"), \
            transaction.atomic():
        Order.objects.create(reference=reference)
        Invoice.objects.filter(pk=gone.pk).delete()
        gone.customer = "Grace"
        assert save_with_commit(gone, update_fields=["customer"])
    assert not Order.objects.filter(reference=reference).exists()  # nothing half-written
    with transaction.atomic():  # the connection works on
        Order.objects.create(reference=reference)
    assert Order.objects.filter(reference=reference).count() == 1


@pytest.mark.django_db(transaction=True)
def test_an_update_that_finds_no_row_fails_the_statement_it_went_with() -> None:
    gone = _invoice()
    with pytest.raises(DatabaseError, match="did not affect any rows"), transaction.atomic():
        Order.objects.create(reference="lost")
        Invoice.objects.filter(pk=gone.pk).delete()
        save_with_commit(gone, update_fields=["customer"])
        Order.objects.count()
    assert not Order.objects.filter(reference="lost").exists()


@pytest.mark.django_db(transaction=True)
def test_outside_a_transaction_it_saves_at_once() -> None:
    invoice = _invoice()
    invoice.customer = "Grace"
    with sent_queries() as queries:
        assert save_with_commit(invoice, update_fields=["customer"]) is False
    assert len(queries) == 1 and queries[0].startswith('UPDATE "billing_invoice"'), queries
    assert Invoice.objects.get(pk=invoice.pk).customer == "Grace"


@pytest.mark.django_db(transaction=True)
def test_a_model_with_save_receivers_is_saved_at_once_and_they_run() -> None:
    invoice = _invoice()
    seen: list[tuple[str, Any]] = []

    def receiver(sender: Any, instance: Invoice, update_fields: Any, **kwargs: Any) -> None:
        seen.append((instance.customer, sorted(update_fields)))

    signals.post_save.connect(receiver, sender=Invoice, weak=False)
    try:
        with transaction.atomic(), row_lock(Invoice.objects.filter(pk=invoice.pk)) as [locked]:
            locked.customer = "Grace"
            assert save_with_commit(locked, update_fields=["customer"]) is False
            assert seen == [("Grace", ["customer"])]  # at the call, as save() sends it
    finally:
        signals.post_save.disconnect(receiver, sender=Invoice)
    assert Invoice.objects.get(pk=invoice.pk).customer == "Grace"


@pytest.mark.django_db(transaction=True)
def test_a_model_with_its_own_save_is_saved_through_it(monkeypatch: pytest.MonkeyPatch) -> None:
    invoice = _invoice()
    saved: list[list[str]] = []

    def own_save(self: Invoice, *args: Any, **kwargs: Any) -> None:
        saved.append(sorted(kwargs["update_fields"]))
        super(Invoice, self).save(*args, **kwargs)

    monkeypatch.setattr(Invoice, "save", own_save)
    with transaction.atomic(), row_lock(Invoice.objects.filter(pk=invoice.pk)) as [locked]:
        locked.customer = "Grace"
        assert save_with_commit(locked, update_fields=["customer"]) is False
        assert saved == [["customer"]]
    assert Invoice.objects.get(pk=invoice.pk).customer == "Grace"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("fields", [[], ["id"], ["no_such_field"]])
def test_fields_it_cannot_save_are_refused_before_anything_is_sent(fields: list[str]) -> None:
    invoice = _invoice()
    with transaction.atomic(), row_lock(Invoice.objects.filter(pk=invoice.pk)) as [locked]:
        with pytest.raises(ValueError, match="save_with_commit"):
            save_with_commit(locked, update_fields=fields)
        assert not connection.held_writes  # type: ignore[attr-defined]
