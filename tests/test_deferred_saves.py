"""``save_with_commit`` (composition.deferred_saves): the update of a locked row goes in one
string with COMMIT, a read in the transaction sees it, it rolls back with the transaction, an
update that finds no row fails the whole transaction as ``Model.save`` would, and wherever it
cannot be held it is saved at once, signals and all."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import F, signals

from billing.models import Invoice, Payment
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
    with pytest.raises(DatabaseError, match=rf"did not affect any rows: billing.Invoice id {gone.pk},") as raised, \
            transaction.atomic():
        Order.objects.create(reference=reference)
        Invoice.objects.filter(pk=gone.pk).delete()
        gone.customer = "Grace"
        assert save_with_commit(gone, update_fields=["customer"])
    # Django 6 raises the model's own NotUpdated (a DatabaseError) from save(): so does this.
    assert isinstance(raised.value, getattr(Invoice, "NotUpdated", DatabaseError))
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
@pytest.mark.parametrize("fields", [["id"], ["no_such_field"]])
def test_fields_it_cannot_save_are_refused_before_anything_is_sent(fields: list[str]) -> None:
    invoice = _invoice()
    with transaction.atomic(), row_lock(Invoice.objects.filter(pk=invoice.pk)) as [locked]:
        with pytest.raises(ValueError, match="save_with_commit"):
            save_with_commit(locked, update_fields=fields)
        assert not connection.held_writes  # type: ignore[attr-defined]


@pytest.mark.django_db(transaction=True)
def test_no_fields_does_nothing_as_save() -> None:
    invoice = _invoice()
    with transaction.atomic(), row_lock(Invoice.objects.filter(pk=invoice.pk)) as [locked]:
        with sent_queries() as queries:
            assert save_with_commit(locked, update_fields=[]) is False
        assert queries == [] and not connection.held_writes  # type: ignore[attr-defined]


@pytest.mark.django_db(transaction=True)
def test_a_unique_field_is_saved_at_once_so_its_conflict_is_raised_at_the_call() -> None:
    taken, invoice = _invoice(), _invoice()
    with transaction.atomic(), row_lock(Invoice.objects.filter(pk=invoice.pk)) as [locked]:
        locked.number = taken.number
        with pytest.raises(IntegrityError):
            save_with_commit(locked, update_fields=["number"])  # at the call, as save()
    assert Invoice.objects.get(pk=invoice.pk).number != taken.number


@pytest.mark.django_db(transaction=True)
def test_any_other_error_of_the_update_is_raised_at_the_end_of_the_block_with_everything_rolled_back() -> None:
    invoice = _invoice()
    reference = uuid.uuid4().hex
    with pytest.raises(IntegrityError, match="billing_invoice_status_valid"), transaction.atomic(), \
            row_lock(Invoice.objects.filter(pk=invoice.pk)) as [locked]:
        Order.objects.create(reference=reference)
        locked.status = "bogus"
        assert save_with_commit(locked, update_fields=["status"])  # held: it fails at COMMIT
    assert Invoice.objects.get(pk=invoice.pk).status == "open"
    assert not Order.objects.filter(reference=reference).exists()


@pytest.mark.django_db(transaction=True)
def test_every_relation_is_prepared_as_save_does_not_only_the_fields_saved() -> None:
    first = _invoice()
    payment = Payment.objects.create(payment_id=uuid.uuid4().hex, invoice=first, amount_cents=500)
    with transaction.atomic(), row_lock(Payment.objects.filter(pk=payment.pk)) as [locked]:
        locked.invoice = Invoice(number="never-saved", customer="Ada", amount_cents=500)
        with pytest.raises(ValueError, match="unsaved related object"):
            save_with_commit(locked, update_fields=["amount_cents"])
    with transaction.atomic(), row_lock(Payment.objects.filter(pk=payment.pk)) as [locked]:
        moved_to = Invoice(number=f"DS-{uuid.uuid4().hex[:10]}", customer="Ada", amount_cents=500)
        locked.invoice = moved_to
        moved_to.save()
        assert save_with_commit(locked, update_fields=["amount_cents"])
        assert locked.invoice_id == moved_to.pk  # as save() leaves the instance
    assert Payment.objects.get(pk=payment.pk).invoice_id == first.pk  # not saved: not in update_fields


@pytest.mark.django_db(transaction=True)
def test_a_held_update_that_fails_with_an_inner_savepoint_fails_the_commit_even_when_caught() -> None:
    # The held update goes out with the inner atomic's SAVEPOINT and fails there, before the
    # savepoint exists: catching that error must not let the outer block end in a silent ROLLBACK.
    gone = _invoice()
    reference = uuid.uuid4().hex
    with pytest.raises(DatabaseError, match="aborted by rows held for its COMMIT"), transaction.atomic():
        Order.objects.create(reference=reference)
        Invoice.objects.filter(pk=gone.pk).delete()
        save_with_commit(gone, update_fields=["customer"])
        try:
            with transaction.atomic():
                Order.objects.create(reference="inner")
        except DatabaseError:
            pass  # the caller thinks only the inner block failed
    assert not Order.objects.filter(reference__in=[reference, "inner"]).exists()


@pytest.mark.django_db(transaction=True)
def test_a_held_update_in_a_rolled_back_savepoint_is_dropped_and_the_rest_commits() -> None:
    gone = _invoice()
    reference = uuid.uuid4().hex
    with transaction.atomic():
        Order.objects.create(reference=reference)
        Invoice.objects.filter(pk=gone.pk).delete()
        with pytest.raises(ValueError), transaction.atomic():
            assert save_with_commit(gone, update_fields=["customer"])  # would fail: its row is gone
            raise ValueError
        assert not connection.held_writes  # type: ignore[attr-defined]
    assert Order.objects.filter(reference=reference).count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_foreign_key_set_to_an_object_saved_since_takes_its_id_and_an_unsaved_one_is_refused() -> None:
    first = _invoice()
    payment = Payment.objects.create(payment_id=uuid.uuid4().hex, invoice=first, amount_cents=500)
    with transaction.atomic(), row_lock(Payment.objects.filter(pk=payment.pk)) as [locked]:
        moved_to = Invoice(number=f"DS-{uuid.uuid4().hex[:10]}", customer="Ada", amount_cents=500)
        locked.invoice = moved_to
        moved_to.save()  # after the assignment: save() takes its id now, and so must this
        # By field name and column name both: one assignment. (Saved at once, in fact: one
        # payment per invoice makes the column unique.)
        save_with_commit(locked, update_fields=["invoice", "invoice_id", "amount_cents"])
    assert Payment.objects.get(pk=payment.pk).invoice_id == moved_to.pk
    with transaction.atomic(), row_lock(Payment.objects.filter(pk=payment.pk)) as [locked]:
        locked.invoice = Invoice(number="never-saved", customer="Ada", amount_cents=500)
        with pytest.raises(ValueError, match="unsaved related object"):
            save_with_commit(locked, update_fields=["invoice"])
        assert not connection.held_writes  # type: ignore[attr-defined]
    assert Payment.objects.get(pk=payment.pk).invoice_id == moved_to.pk


@pytest.mark.django_db(transaction=True)
def test_a_value_given_as_an_expression_is_saved_at_once() -> None:
    invoice = _invoice()
    with transaction.atomic(), row_lock(Invoice.objects.filter(pk=invoice.pk)) as [locked]:
        locked.amount_cents = F("amount_cents") + 1
        assert save_with_commit(locked, update_fields=["amount_cents"]) is False
    assert Invoice.objects.get(pk=invoice.pk).amount_cents == 501
