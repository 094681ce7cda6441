"""Billing's own Prometheus metrics: the business events an operator watches beside composition's.

``composition`` comes first in ``INSTALLED_APPS``, so its ``metrics`` module has created the
multiprocess folder before these are defined."""

from __future__ import annotations

from prometheus_client import Counter

__all__ = ["INVOICE_PAID_TOTAL", "INVOICE_REMINDERS_TOTAL", "RECEIPT_EMAILS_TOTAL"]

INVOICE_PAID_TOTAL = Counter("billing_invoice_paid_total", "Invoices paid (one per invoice, repeats not counted).")
RECEIPT_EMAILS_TOTAL = Counter("billing_receipt_emails_total", "Receipt emails handed to the email backend.")
INVOICE_REMINDERS_TOTAL = Counter("billing_invoice_reminders_total",
                                  "Invoice reminders, by outcome (sent; skipped: the invoice was no longer open).",
                                  ["outcome"])
