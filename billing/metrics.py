"""Billing's own Prometheus metrics: the business events an operator watches beside composition's.

``composition`` comes first in ``INSTALLED_APPS``, so its ``metrics`` module has created the
multiprocess folder before these are defined. ``METRICS`` holds them for ``InvoiceService``,
which is given its counters rather than reaching for module globals.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter

__all__ = ["INVOICE_PAID_TOTAL", "INVOICE_REMINDERS_TOTAL", "METRICS", "RECEIPT_EMAILS_TOTAL", "BillingMetrics"]

INVOICE_PAID_TOTAL = Counter("billing_invoice_paid_total", "Invoices paid (one per invoice, repeats not counted).")
RECEIPT_EMAILS_TOTAL = Counter("billing_receipt_emails_total", "Receipt emails handed to the email backend.")
INVOICE_REMINDERS_TOTAL = Counter("billing_invoice_reminders_total",
                                  "Invoice reminders, by outcome (sent; skipped: the invoice was no longer open).",
                                  ["outcome"])


@dataclass(frozen=True)
class BillingMetrics:
    invoice_paid: Counter
    receipt_emails: Counter
    reminders: Counter  # labelled by outcome


METRICS = BillingMetrics(invoice_paid=INVOICE_PAID_TOTAL, receipt_emails=RECEIPT_EMAILS_TOTAL,
                         reminders=INVOICE_REMINDERS_TOTAL)
