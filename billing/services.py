"""Billing's business rules, as ``InvoiceService``: the source document's
``createInvoiceService({ db, cache, lock, logger, metrics })``. What it is given are the
library's own objects, not wrappers of ours: a cache-aside object (``composition.cache``), the
row lock (``composition.locks.row_lock``), ``composition.outbox.publish`` and ``publish_many``,
Prometheus counters, a structlog logger and the email sender. ``billing.wiring`` builds the default one.

The database is the source of truth: the lock keeps two payers of one invoice from
interleaving, the unique constraints make a duplicate impossible, the outbox row commits with
the payment, and the cache is only invalidated after commit. An invoice moves open -> paid or
open -> void, nothing else: the transition is checked under the row lock, the set of states by
a check constraint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import structlog
from django.db import IntegrityError, transaction

from billing.errors import (
    AlreadyPaid,
    AmountMismatch,
    DuplicateInvoice,
    InvoiceBusy,
    InvoiceHasNoEmail,
    InvoiceNotFound,
    InvoiceNotOpen,
    InvoiceVoid,
    PaymentIdReused,
)
from billing.mail import EmailSender
from billing.metrics import BillingMetrics
from billing.models import Invoice, Payment, Receipt
from composition.backpressure.admission import admit
from composition.broker.configured import configured_broker
from composition.cache import CacheAside
from composition.jobs import PermanentError
from composition.locks import LockNotAcquired

__all__ = ["InvoicePage", "InvoiceService", "PaymentOutcome", "invoice_cache_key"]


@dataclass(frozen=True)
class PaymentOutcome:
    payment: Payment
    created: bool  # False when this payment id had been recorded before (an idempotent repeat)


@dataclass(frozen=True)
class InvoicePage:
    invoices: list[dict[str, Any]]
    next_before_id: int | None  # where the next page starts; None on the last page


def invoice_cache_key(invoice_id: int) -> str:
    return f"invoice:{invoice_id}"


@dataclass(frozen=True, kw_only=True)
class InvoiceService:
    cache: CacheAside  # composition.cache.get_cache_aside(alias)
    lock: Callable[..., Any]  # composition.locks.row_lock
    publish: Callable[..., Any]  # composition.outbox.publish
    publish_many: Callable[..., Any]  # composition.outbox.publish_many
    metrics: BillingMetrics
    log: Any  # a structlog logger
    mail: EmailSender
    invoice_ttl_s: float = 300.0
    # A payer who cannot have the invoice's lock in this long gets InvoiceBusy (a 409 with
    # retry_after_s) rather than a request stuck behind a slow payment.
    lock_timeout_s: float = 2.0
    # The jobs it publishes, by name (building a service never imports the module that runs them).
    receipt_job: str = "send_payment_receipt"
    reminder_job: str = "send_invoice_reminder"

    # -- invoices ----------------------------------------------------------------------------
    def create_invoice(self, *, number: str, customer: str, amount_cents: int, currency: str = "EUR",
                       email: str = "") -> Invoice:
        """A new open invoice; raises DuplicateInvoice when ``number`` is taken (the constraint decides)."""
        try:
            with transaction.atomic():
                return Invoice.objects.create(number=number, customer=customer, amount_cents=amount_cents,
                                              currency=currency, email=email)
        except IntegrityError as exc:
            raise DuplicateInvoice(f"invoice number {number!r} already exists") from exc

    def get_invoice(self, invoice_id: int) -> dict[str, Any]:
        """The invoice with its payment and receipt, through the cache (the database answers when
        Redis cannot). Raises InvoiceNotFound; a miss is never cached, so an invoice created a
        moment later is visible at once, and asking for ids that do not exist cannot fill Redis."""

        def load() -> dict[str, Any]:
            invoice = Invoice.objects.filter(pk=invoice_id).first()
            if invoice is None:
                raise InvoiceNotFound(f"invoice {invoice_id} does not exist")
            payment = Payment.objects.filter(invoice=invoice).select_related("receipt").first()
            receipt = getattr(payment, "receipt", None) if payment is not None else None
            return {**invoice.as_dict(), "payment": payment.as_dict() if payment else None,
                    "receipt": receipt.as_dict() if receipt else None}

        return self.cache.fetch(invoice_cache_key(invoice_id), load, ttl_s=self.invoice_ttl_s,
                                pattern="invoice").value

    def list_invoices(self, *, status: str | None = None, before_id: int | None = None,
                      limit: int = 50) -> InvoicePage:
        """Invoices newest first, ``limit`` at a time: keyset pagination on the id, so a page
        costs the same however deep it is and rows added meanwhile never shift one."""
        rows = Invoice.objects.order_by("-id")
        if status is not None:
            rows = rows.filter(status=status)
        if before_id is not None:
            rows = rows.filter(id__lt=before_id)
        page = list(rows[: limit + 1])
        more = len(page) > limit
        page = page[:limit]
        return InvoicePage([invoice.as_dict() for invoice in page], page[-1].pk if more else None)

    def void_invoice(self, invoice_id: int) -> tuple[Invoice, bool]:
        """Void an open invoice; returns it and whether this call voided it (False: it was void
        already, a repeat). Raises InvoiceNotFound, AlreadyPaid or InvoiceBusy."""
        try:
            with transaction.atomic(), self.lock(Invoice.objects.filter(pk=invoice_id),
                                                 timeout_s=self.lock_timeout_s) as found:
                invoice = _the_invoice(found, invoice_id)
                if invoice.status == Invoice.Status.VOID:
                    return invoice, False
                if invoice.status == Invoice.Status.PAID:
                    raise AlreadyPaid(f"invoice {invoice.number} is paid: it cannot be voided")
                invoice.status = Invoice.Status.VOID
                invoice.save(update_fields=["status", "updated_at"])
                self.cache.invalidate(invoice_cache_key(invoice.pk))
        except LockNotAcquired as exc:
            raise InvoiceBusy(f"invoice {invoice_id} is being changed by another request") from exc
        self.log.info("invoice voided", invoice_id=invoice.pk)
        return invoice, True

    # -- payments ----------------------------------------------------------------------------
    def pay_invoice(self, invoice_id: int, *, payment_id: str, amount_cents: int) -> PaymentOutcome:
        """Record one payment of an invoice, exactly once per ``payment_id``.

        Raises InvoiceNotFound, AlreadyPaid, InvoiceVoid, AmountMismatch, PaymentIdReused or InvoiceBusy.
        """
        # No look for an earlier payment first: a repeat finds the invoice paid under the lock
        # (or its payment id taken by the constraint), and a first payment saves the query.
        try:
            with transaction.atomic(), self.lock(Invoice.objects.filter(pk=invoice_id),
                                                 timeout_s=self.lock_timeout_s) as found:
                invoice = _the_invoice(found, invoice_id)
                if invoice.status == Invoice.Status.PAID:
                    # Paid already; if by this very payment id (a retried request, or one racing
                    # its first try), answer as a repeat, not a conflict.
                    repeat = _earlier_payment(invoice_id, payment_id, amount_cents)
                    if repeat is not None:
                        return PaymentOutcome(repeat, created=False)
                    raise AlreadyPaid(f"invoice {invoice.number} is already paid")
                if invoice.status == Invoice.Status.VOID:
                    raise InvoiceVoid(f"invoice {invoice.number} is void: it cannot be paid")
                if amount_cents != invoice.amount_cents:
                    raise AmountMismatch(f"invoice {invoice.number} is for {invoice.amount_cents} cents, "
                                         f"not {amount_cents}")
                payment = Payment.objects.create(payment_id=payment_id, invoice=invoice, amount_cents=amount_cents)
                invoice.status = Invoice.Status.PAID
                invoice.save(update_fields=["status", "updated_at"])
                # Invalidated first: after COMMIT the hooks run in this order, and readers must
                # not wait for the receipt's send to see the invoice paid.
                self.cache.invalidate(invoice_cache_key(invoice.pk))
                # No ordering key: an invoice has one payment, so one receipt, nothing to order.
                self.publish(self.receipt_job, {"payment_id": payment.pk})
        except LockNotAcquired as exc:
            raise InvoiceBusy(f"invoice {invoice_id} is being changed by another request") from exc
        except IntegrityError:
            # A concurrent request with the same payment id won the race: the constraint decided.
            repeat = _earlier_payment(invoice_id, payment_id, amount_cents)
            if repeat is None:
                raise
            return PaymentOutcome(repeat, created=False)
        self.metrics.invoice_paid.inc()
        self.log.info("invoice paid", invoice_id=invoice.pk, payment_id=payment.payment_id)
        return PaymentOutcome(payment, created=True)

    def send_receipt(self, payment_id: int) -> Receipt:
        """The job's body: write the payment's receipt and email it, once. Runs inside the job's
        transaction (``idempotent=True``): the email goes out before the receipt row commits, so
        a failed send leaves nothing and is retried; a worker that dies between the send and the
        commit sends it again (same Message-ID): at least once, as with any external effect."""
        payment = Payment.objects.select_related("invoice").filter(pk=payment_id).first()
        if payment is None:
            # Retrying cannot make a missing payment appear: fix the data, then replay.
            raise PermanentError(f"payment {payment_id} does not exist")
        invoice = payment.invoice
        # Every line this job logs from here on names the payment and the invoice.
        structlog.contextvars.bind_contextvars(payment_id=payment.payment_id, invoice_id=invoice.pk)
        with transaction.atomic():
            receipt, created = Receipt.objects.get_or_create(payment=payment,
                                                             defaults={"number": f"R-{invoice.number}"})
            if created:
                self.cache.invalidate(invoice_cache_key(invoice.pk))  # its answer shows the receipt
                if invoice.email:
                    self.mail.send(to=[invoice.email], subject=f"Receipt {receipt.number}",
                                   body=f"We received {payment.amount_cents} cents ({invoice.currency}) "
                                        f"for invoice {invoice.number}. Thank you.",
                                   message_id=self.mail.message_id("receipt", receipt.number))
                    self.metrics.receipt_emails.inc()
        self.log.info("payment receipt written", receipt=receipt.number, created=created,
                      emailed=bool(created and invoice.email))
        return receipt

    # -- reminders ---------------------------------------------------------------------------
    def remind(self, invoice_id: int) -> None:
        """Queue a reminder of an open invoice. Reminders are the first work to shed: raises
        ``composition.backpressure.admission.Backpressure`` when their queue is full or shed,
        InvoiceNotFound, InvoiceNotOpen or InvoiceHasNoEmail."""
        invoice = Invoice.objects.filter(pk=invoice_id).first()
        if invoice is None:
            raise InvoiceNotFound(f"invoice {invoice_id} does not exist")
        if invoice.status != Invoice.Status.OPEN:
            raise InvoiceNotOpen(f"invoice {invoice.number} is {invoice.status}: there is nothing to remind of")
        if not invoice.email:
            # Said now, not by a job that would skip it: the caller can add an address.
            raise InvoiceHasNoEmail(f"invoice {invoice.number} has no email address to send a reminder to")
        # Reminders are the work to shed first, so their queue has a backlog limit of its own.
        admit(configured_broker().get_actor(self.reminder_job).queue_name)
        self.publish(self.reminder_job, {"invoice_id": invoice.pk})

    def remind_overdue(self, *, overdue_days: int, as_of: datetime) -> int:
        """Queue a reminder of every open invoice with an address created more than
        ``overdue_days`` before ``as_of`` (the scheduled sweep's body); returns how many. Run in
        the sweep job's transaction, so its reminders are queued once per tick."""
        cutoff = as_of - timedelta(days=overdue_days)
        overdue = list(Invoice.objects.filter(status=Invoice.Status.OPEN, created_at__lt=cutoff)
                       .exclude(email="").order_by("pk").values_list("pk", flat=True))
        if overdue:
            self.publish_many(self.reminder_job, [{"invoice_id": invoice_id} for invoice_id in overdue])
        self.log.info("overdue invoices reminded", count=len(overdue), overdue_days=overdue_days,
                      as_of=as_of.isoformat())
        return len(overdue)

    def send_reminder(self, invoice_id: int, *, reference: str) -> bool:
        """The job's body: email the reminder if the invoice is still open and has an address;
        ``reference`` (the job's message id) makes the Message-ID, the same on every retry."""
        # Every line this job logs from here on (a retry, its dead letter) names the invoice.
        structlog.contextvars.bind_contextvars(invoice_id=invoice_id)
        invoice = Invoice.objects.filter(pk=invoice_id).first()
        if invoice is None or invoice.status != Invoice.Status.OPEN or not invoice.email:
            self.metrics.reminders.labels("skipped").inc()
            return False
        self.mail.send(to=[invoice.email], subject=f"Reminder: invoice {invoice.number}",
                       body=f"Invoice {invoice.number} for {invoice.amount_cents} cents ({invoice.currency}) "
                            "is still open.",
                       message_id=self.mail.message_id("reminder", reference))
        self.metrics.reminders.labels("sent").inc()
        return True


def _the_invoice(found: list[Invoice], invoice_id: int) -> Invoice:
    if not found:
        raise InvoiceNotFound(f"invoice {invoice_id} does not exist")
    return found[0]


def _earlier_payment(invoice_id: int, payment_id: str, amount_cents: int) -> Payment | None:
    """The payment recorded under ``payment_id`` before, if it is this very payment; raises
    PaymentIdReused when the id was used for another invoice or another amount."""
    payment = Payment.objects.filter(payment_id=payment_id).first()
    if payment is not None and payment.invoice_id != invoice_id:
        raise PaymentIdReused(f"payment id {payment_id!r} was used for another invoice")
    if payment is not None and payment.amount_cents != amount_cents:
        raise PaymentIdReused(f"payment id {payment_id!r} was used for {payment.amount_cents} cents, "
                              f"not {amount_cents}")
    return payment
