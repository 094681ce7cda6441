"""Invoices, payments, receipts and API tokens. Uniqueness and the allowed states live in the
database, not in the code paths: a payment id is paid once, a payment gets one receipt and an
invoice is open, paid or void, whatever retries or races do."""

from __future__ import annotations

from django.conf import settings
from django.db import models

# PostgreSQL's bigint: the largest amount the column holds.
MAX_AMOUNT_CENTS = 2**63 - 1


class Invoice(models.Model):
    class Status(models.TextChoices):
        OPEN = "open"
        PAID = "paid"
        VOID = "void"

    number = models.CharField(max_length=32, unique=True)
    customer = models.CharField(max_length=200)
    # Where the receipt and reminders go; an invoice without one is billed without email.
    email = models.EmailField(max_length=254, blank=True, default="")
    amount_cents = models.PositiveBigIntegerField()
    currency = models.CharField(max_length=3, default="EUR")
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.OPEN)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        permissions = [("pay_invoice", "Can record a payment of an invoice")]
        constraints = [
            # The transitions (open -> paid, open -> void) are checked under the row lock; the
            # states themselves hold here, whatever writes the row.
            models.CheckConstraint(condition=models.Q(status__in=["open", "paid", "void"]),
                                   name="billing_invoice_status_valid"),
            models.CheckConstraint(condition=models.Q(amount_cents__gt=0), name="billing_invoice_amount_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.number} ({self.status})"

    def as_dict(self) -> dict[str, object]:
        return {"id": self.pk, "number": self.number, "customer": self.customer, "email": self.email,
                "amount_cents": self.amount_cents, "currency": self.currency, "status": self.status,
                "created_at": self.created_at.isoformat(), "updated_at": self.updated_at.isoformat()}


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

    def as_dict(self) -> dict[str, object]:
        return {"payment_id": self.payment_id, "amount_cents": self.amount_cents,
                "created_at": self.created_at.isoformat()}


class Receipt(models.Model):
    payment = models.OneToOneField(Payment, on_delete=models.PROTECT, related_name="receipt")
    number = models.CharField(max_length=40, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.number

    def as_dict(self) -> dict[str, object]:
        return {"number": self.number, "created_at": self.created_at.isoformat()}


class ApiToken(models.Model):
    """A bearer token of the JSON API. Only its SHA-256 is stored: the token itself is shown
    once, when created (``manage.py create_api_token``). Tokens are 256 random bits, so a fast
    hash is enough: there is nothing to guess from."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    digest = models.CharField(max_length=64, unique=True, editable=False)
    # The first characters, so an operator can tell tokens apart without the secret.
    prefix = models.CharField(max_length=12, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    # From then on the token is refused (401 ``token_expired``); None: it never expires. An
    # operator ends a token early by setting it in the admin (or deleting the token).
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "name"], name="billing_api_token_name_per_user")]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"
