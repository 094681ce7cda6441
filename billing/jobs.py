"""Billing's background jobs: thin, the service does the work. Payloads carry ids only; the
database holds the facts."""

from __future__ import annotations

from django.utils import timezone

from billing.wiring import default_service
from composition.jobs import current_message, job
from composition.schedules import current_fire_at


# Retries sized for an email outage: the breaker fails them fast, the backoff spaces them out
# (0.5 s doubling to 60 s), and 25 runs outlast an hour-long outage before a dead letter.
@job(queue="billing", idempotent=True, max_attempts=25, initial_delay_s=0.5, max_delay_s=60)
def send_payment_receipt(payment_id: int) -> None:
    """Write the payment's receipt and email it, once (see InvoiceService.send_receipt)."""
    default_service().send_receipt(payment_id)


# A queue of their own, with a backlog limit of its own: the work shed first under load. The
# mail provider takes so many sends per second from us; the morning sweep queues thousands at
# once, so the rate keeps them to its pace across every worker (docs/limits.md).
@job(queue="reminders", max_attempts=5, initial_delay_s=5, max_delay_s=300, rate="20/1s")
def send_invoice_reminder(invoice_id: int) -> None:
    """Email a reminder of an invoice that is still open."""
    message = current_message()
    default_service().send_reminder(invoice_id, reference=message.message_id if message else f"invoice-{invoice_id}")


# On a schedule (billing/schedules.py). Idempotent: the ledger row commits with the reminders it
# queues, so a redelivered tick queues nothing more; the tick, not the clock, says what is
# overdue, so a retry or a late catch-up picks the same invoices.
@job(queue="reminders", idempotent=True, max_attempts=5, initial_delay_s=5, max_delay_s=300)
def send_overdue_reminders(overdue_days: int) -> None:
    """Queue a reminder of every invoice open for more than ``overdue_days``."""
    default_service().remind_overdue(overdue_days=overdue_days, as_of=current_fire_at() or timezone.now())


@job(queue="default")
def ping(token: str) -> None:
    """A no-op job for smoke tests and benchmarks."""
