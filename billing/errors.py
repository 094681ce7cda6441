"""Billing's business errors: what the API turns into 4xx answers with stable codes."""

from __future__ import annotations

__all__ = [
    "AlreadyPaid",
    "AmountMismatch",
    "BillingError",
    "DuplicateInvoice",
    "InvoiceBusy",
    "InvoiceHasNoEmail",
    "InvoiceNotFound",
    "InvoiceNotOpen",
    "InvoiceVoid",
    "PaymentIdReused",
]


class BillingError(Exception):
    """Base of the business errors the API turns into 4xx answers."""


class InvoiceNotFound(BillingError):
    pass


class AlreadyPaid(BillingError):
    pass


class InvoiceVoid(BillingError):
    """The invoice was voided: it can no longer be paid."""


class InvoiceNotOpen(BillingError):
    """The invoice is paid or void: there is nothing to remind its customer of."""


class InvoiceHasNoEmail(BillingError):
    """The invoice has no email address: a reminder could not be sent."""


class AmountMismatch(BillingError):
    pass


class PaymentIdReused(BillingError):
    """The payment id was already used, for another invoice or another amount."""


class DuplicateInvoice(BillingError):
    pass


class InvoiceBusy(BillingError):
    """Another payment of the same invoice holds its lock; retry shortly."""
