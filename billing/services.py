"""Billing's business rules. The database is the source of truth: the lock keeps two payers of
one invoice from interleaving, the unique constraints make a duplicate impossible, the outbox
row commits with the payment, and the cache is only invalidated after commit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import structlog
from django.db import IntegrityError, transaction

from billing.models import Invoice, Payment
from composition.cache import cache_aside, invalidate
from composition.locks import LockNotAcquired, row_lock
from composition.outbox import publish

__all__ = [
    "AlreadyPaid",
    "AmountMismatch",
    "BillingError",
    "DuplicateInvoice",
    "InvoiceBusy",
    "InvoiceNotFound",
    "PaymentIdReused",
    "PaymentOutcome",
    "create_invoice",
    "get_invoice",
    "invoice_cache_key",
    "pay_invoice",
]

log = structlog.get_logger("billing")

INVOICE_TTL_S = 300.0
LOCK_TIMEOUT_S = 2.0


class BillingError(Exception):
    """Base of the business errors the API turns into 4xx answers."""


class InvoiceNotFound(BillingError):
    pass


class AlreadyPaid(BillingError):
    pass


class AmountMismatch(BillingError):
    pass


class PaymentIdReused(BillingError):
    """The payment id was already used for another invoice."""


class DuplicateInvoice(BillingError):
    pass


class InvoiceBusy(BillingError):
    """Another payment of the same invoice holds its lock; retry shortly."""


@dataclass(frozen=True)
class PaymentOutcome:
    payment: Payment
    created: bool  # False when this payment id had been recorded before (an idempotent repeat)


def invoice_cache_key(invoice_id: int) -> str:
    return f"invoice:{invoice_id}"


def create_invoice(*, number: str, customer: str, amount_cents: int, currency: str = "EUR") -> Invoice:
    """A new open invoice; raises DuplicateInvoice when ``number`` is taken (the constraint decides)."""
    try:
        with transaction.atomic():
            return Invoice.objects.create(number=number, customer=customer, amount_cents=amount_cents,
                                          currency=currency)
    except IntegrityError as exc:
        raise DuplicateInvoice(f"invoice number {number!r} already exists") from exc


def get_invoice(invoice_id: int) -> dict[str, Any] | None:
    """The invoice as a dict, through the cache (the database answers when Redis cannot)."""

    def load() -> dict[str, Any] | None:
        invoice = Invoice.objects.filter(pk=invoice_id).first()
        return invoice.as_dict() if invoice else None

    return cache_aside(invoice_cache_key(invoice_id), load, ttl_s=INVOICE_TTL_S, pattern="invoice")


def pay_invoice(invoice_id: int, *, payment_id: str, amount_cents: int) -> PaymentOutcome:
    """Record one payment of an invoice, exactly once per ``payment_id``.

    Raises InvoiceNotFound, AlreadyPaid, AmountMismatch, PaymentIdReused or InvoiceBusy.
    """
    repeat = _earlier_payment(invoice_id, payment_id)
    if repeat is not None:
        return PaymentOutcome(repeat, created=False)
    from billing.jobs import send_payment_receipt

    try:
        with transaction.atomic():
            try:
                with row_lock(Invoice.objects.filter(pk=invoice_id), timeout_s=LOCK_TIMEOUT_S):
                    invoice = Invoice.objects.filter(pk=invoice_id).first()
            except LockNotAcquired as exc:
                raise InvoiceBusy(f"invoice {invoice_id} is being paid by another request") from exc
            if invoice is None:
                raise InvoiceNotFound(f"invoice {invoice_id} does not exist")
            if invoice.status == Invoice.Status.PAID:
                # The lock made us wait for whoever paid it; if that was this very payment id
                # (a retried request racing its first try), answer as a repeat, not a conflict.
                repeat = _earlier_payment(invoice_id, payment_id)
                if repeat is not None:
                    return PaymentOutcome(repeat, created=False)
                raise AlreadyPaid(f"invoice {invoice.number} is already paid")
            if amount_cents != invoice.amount_cents:
                raise AmountMismatch(f"invoice {invoice.number} is for {invoice.amount_cents} cents, "
                                     f"not {amount_cents}")
            payment = Payment.objects.create(payment_id=payment_id, invoice=invoice, amount_cents=amount_cents)
            invoice.status = Invoice.Status.PAID
            invoice.save(update_fields=["status", "updated_at"])
            publish(send_payment_receipt, {"payment_id": payment.pk}, key=f"invoice:{invoice.pk}")
            invalidate(invoice_cache_key(invoice.pk))
    except IntegrityError:
        # A concurrent request with the same payment id won the race: the constraint decided.
        repeat = _earlier_payment(invoice_id, payment_id)
        if repeat is None:
            raise
        return PaymentOutcome(repeat, created=False)
    log.info("invoice paid", invoice_id=invoice.pk, payment_id=payment.payment_id)
    return PaymentOutcome(payment, created=True)


def _earlier_payment(invoice_id: int, payment_id: str) -> Payment | None:
    payment = Payment.objects.filter(payment_id=payment_id).first()
    if payment is not None and payment.invoice_id != invoice_id:
        raise PaymentIdReused(f"payment id {payment_id!r} was used for another invoice")
    return payment
