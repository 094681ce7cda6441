"""Invoices, payments and receipts. Uniqueness lives in the database, not in the code paths:
a payment id is paid once and a payment gets one receipt, whatever retries or races do."""

from __future__ import annotations

from django.db import models


class Invoice(models.Model):
    class Status(models.TextChoices):
        OPEN = "open"
        PAID = "paid"

    number = models.CharField(max_length=32, unique=True)
    customer = models.CharField(max_length=200)
    amount_cents = models.PositiveBigIntegerField()
    currency = models.CharField(max_length=3, default="EUR")
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.OPEN)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.number} ({self.status})"

    def as_dict(self) -> dict[str, object]:
        return {"id": self.pk, "number": self.number, "customer": self.customer,
                "amount_cents": self.amount_cents, "currency": self.currency, "status": self.status,
                "updated_at": self.updated_at.isoformat()}


class Payment(models.Model):
    # The caller's idempotency key: the same payment id posted twice is one payment.
    payment_id = models.CharField(max_length=64, unique=True)
    invoice = models.ForeignKey(Invoice, on_delete=models.PROTECT, related_name="payments")
    amount_cents = models.PositiveBigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            # One successful payment per invoice: a second one is a bug or a race, never a charge.
            models.UniqueConstraint(fields=["invoice"], name="billing_one_payment_per_invoice"),
        ]

    def __str__(self) -> str:
        return self.payment_id


class Receipt(models.Model):
    payment = models.OneToOneField(Payment, on_delete=models.PROTECT, related_name="receipt")
    number = models.CharField(max_length=40, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.number
