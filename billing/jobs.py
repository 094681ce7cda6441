"""Billing's background jobs. Payloads carry ids only; the database holds the facts."""

from __future__ import annotations

import structlog

from billing.models import Payment, Receipt
from composition.jobs import PermanentError, job

log = structlog.get_logger("billing.jobs")


@job(queue="billing", idempotent=True)
def send_payment_receipt(payment_id: int) -> None:
    """Write the payment's receipt, once: the inbox ledger and Receipt's one-to-one both hold."""
    payment = Payment.objects.select_related("invoice").filter(pk=payment_id).first()
    if payment is None:
        # Retrying cannot make a missing payment appear: fix the data, then replay.
        raise PermanentError(f"payment {payment_id} does not exist")
    structlog.contextvars.bind_contextvars(payment_id=payment.payment_id, invoice_id=payment.invoice_id)
    receipt, created = Receipt.objects.get_or_create(
        payment=payment, defaults={"number": f"R-{payment.invoice.number}"})
    log.info("processing payment receipt job", receipt=receipt.number, created=created)


@job(queue="default")
def ping(token: str) -> None:
    """A no-op job for smoke tests and benchmarks."""
