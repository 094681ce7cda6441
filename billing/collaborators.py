"""What ``InvoiceService`` is given rather than reaching for: the cache, the invoice lock, the
jobs it publishes, its metrics. (The logger is a structlog logger; the email sender is
``billing.mail.EmailSender``.) Each is a small object with real alternates: another cache
alias, another lock timeout, jobs on other queues, another email backend.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from billing.errors import InvoiceBusy, InvoiceNotFound
from billing.metrics import INVOICE_PAID_TOTAL, INVOICE_REMINDERS_TOTAL, RECEIPT_EMAILS_TOTAL
from billing.models import Invoice
from composition.backpressure import admit
from composition.broker import configured_broker
from composition.cache import CacheAside
from composition.locks import LockNotAcquired, row_lock
from composition.outbox import OutboxMessage, publish

__all__ = ["BillingJobs", "BillingMetrics", "InvoiceCache", "InvoiceLocks"]


@dataclass(frozen=True)
class InvoiceCache:
    """Invoices' answers through cache-aside on one cache alias's engine."""

    engine: CacheAside
    ttl_s: float = 300.0

    @staticmethod
    def key(invoice_id: int) -> str:
        return f"invoice:{invoice_id}"

    def get(self, invoice_id: int, load: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        value: dict[str, Any] = self.engine.fetch(self.key(invoice_id), load, ttl_s=self.ttl_s,
                                                  pattern="invoice").value
        return value

    def invalidate(self, invoice_id: int) -> None:
        """After the caller's transaction commits (durably recorded in it; see composition.cache)."""
        self.engine.invalidate(self.key(invoice_id))


@dataclass(frozen=True)
class InvoiceLocks:
    """The row lock that keeps two writers of one invoice from interleaving, with a bound on
    the wait: a caller that cannot have it in ``timeout_s`` gets ``InvoiceBusy`` (a 409 with
    ``retry_after_s``) rather than a request stuck behind a slow payment."""

    timeout_s: float = 2.0

    @contextmanager
    def hold(self, invoice_id: int) -> Iterator[Invoice]:
        """The invoice, locked FOR UPDATE until the transaction ends (inside ``atomic``)."""
        held = ExitStack()
        try:
            rows = held.enter_context(row_lock(Invoice.objects.filter(pk=invoice_id), timeout_s=self.timeout_s))
        except LockNotAcquired as exc:
            raise InvoiceBusy(f"invoice {invoice_id} is being changed by another request") from exc
        with held:  # the lock's hold time (a metric) covers the caller's work under it
            if not rows:
                raise InvoiceNotFound(f"invoice {invoice_id} does not exist")
            yield rows[0]


@dataclass(frozen=True)
class BillingJobs:
    """The jobs billing publishes through the outbox, by actor name (so building a service
    never imports the jobs module that runs it)."""

    receipt_actor: str = "send_payment_receipt"
    reminder_actor: str = "send_invoice_reminder"

    def receipt(self, payment_id: int) -> None:
        # No ordering key: an invoice has one payment and so one receipt job, nothing to order
        # it against (a key costs a confirming statement after COMMIT).
        publish(self.receipt_actor, {"payment_id": payment_id})

    def admit_reminder(self) -> None:
        """Raise ``Backpressure`` when the reminders' queue is full: reminders are the work to
        shed first, so they have a queue, and a limit, of their own."""
        admit(configured_broker().get_actor(self.reminder_actor).queue_name)

    def reminder(self, invoice_id: int) -> OutboxMessage:
        return publish(self.reminder_actor, {"invoice_id": invoice_id})


class BillingMetrics:
    """Billing's business counters (``billing.metrics``)."""

    def invoice_paid(self) -> None:
        INVOICE_PAID_TOTAL.inc()

    def receipt_emailed(self) -> None:
        RECEIPT_EMAILS_TOTAL.inc()

    def reminder(self, outcome: str) -> None:
        INVOICE_REMINDERS_TOTAL.labels(outcome).inc()
