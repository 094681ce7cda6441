"""The pay benchmark's URLs: the example project's, plus the baseline, a plain pay view."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.http import HttpRequest, JsonResponse
from django.urls import path

from billing.api import ApiError, endpoint
from billing.models import Invoice, Payment
from billing.validation import parse_json_body
from billing.views import PAYMENT_FIELDS
from project.urls import urlpatterns as project_urlpatterns


def plain_pay(request: HttpRequest, invoice_id: int) -> JsonResponse:
    """What a Django view without the library does: the same authentication and parsing, one
    transaction with a row lock, the payment inserted, the invoice updated. No lock timeout, no
    outbox row, no cache invalidation, no metrics, no backpressure."""
    data = parse_json_body(request, PAYMENT_FIELDS)
    try:
        with transaction.atomic():
            invoice = Invoice.objects.select_for_update().filter(pk=invoice_id).first()
            if invoice is None:
                raise ApiError(404, "invoice_not_found", "no such invoice")
            if invoice.status != "open":
                raise ApiError(409, "invoice_paid", "already paid")
            payment = Payment.objects.create(payment_id=data["payment_id"], invoice=invoice,
                                             amount_cents=data["amount_cents"])
            invoice.status = "paid"
            invoice.save(update_fields=["status", "updated_at"])
    except IntegrityError as exc:
        raise ApiError(409, "payment_id_reused", "payment id used") from exc
    return JsonResponse({"payment_id": payment.payment_id, "invoice_id": invoice.pk, "created": True}, status=201)


urlpatterns: list[Any] = [
    *project_urlpatterns,
    path("bench/plain/<int:invoice_id>/pay", endpoint(POST=("billing.pay_invoice", plain_pay))),
]
