"""The billing JSON API: parse, call a service, map its errors to statuses."""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from billing import services

ERROR_STATUS = {
    services.InvoiceNotFound: 404,
    services.AlreadyPaid: 409,
    services.AmountMismatch: 422,
    services.PaymentIdReused: 409,
    services.InvoiceBusy: 409,
    services.DuplicateInvoice: 409,
}


class BadRequest(Exception):
    pass


def _body(request: HttpRequest, fields: dict[str, type]) -> dict[str, Any]:
    try:
        data = json.loads(request.body or b"{}")
    except ValueError as exc:
        raise BadRequest(f"body is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise BadRequest("body must be a JSON object")
    for name, kind in fields.items():
        value = data.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise BadRequest(f"field {name!r} must be a {kind.__name__}")
        if isinstance(value, int) and value <= 0:
            raise BadRequest(f"field {name!r} must be positive")
        if isinstance(value, str) and not (0 < len(value) <= 64):
            raise BadRequest(f"field {name!r} must have 1 to 64 characters")
    return data


def _error(status: int, message: str, **extra: Any) -> JsonResponse:
    response = JsonResponse({"error": message, **extra}, status=status)
    if status == 409 and extra.get("retry"):
        response["Retry-After"] = "1"
    return response


@csrf_exempt
@require_POST
def create_invoice(request: HttpRequest) -> JsonResponse:
    try:
        data = _body(request, {"number": str, "customer": str, "amount_cents": int})
        currency = data.get("currency", "EUR")
        if not (isinstance(currency, str) and len(currency) == 3 and currency.isascii() and currency.isupper()):
            raise BadRequest("field 'currency' must be a three-letter code such as 'EUR'")
        invoice = services.create_invoice(number=data["number"], customer=data["customer"],
                                          amount_cents=data["amount_cents"], currency=currency)
    except BadRequest as exc:
        return _error(400, str(exc))
    except services.DuplicateInvoice as exc:
        return _error(409, str(exc))
    return JsonResponse(invoice.as_dict(), status=201)


@require_GET
def invoice_detail(request: HttpRequest, invoice_id: int) -> JsonResponse:
    invoice = services.get_invoice(invoice_id)
    if invoice is None:
        return _error(404, f"invoice {invoice_id} does not exist")
    return JsonResponse(invoice)


@csrf_exempt
@require_POST
def pay_invoice(request: HttpRequest, invoice_id: int) -> JsonResponse:
    try:
        data = _body(request, {"payment_id": str, "amount_cents": int})
        outcome = services.pay_invoice(invoice_id, payment_id=data["payment_id"],
                                       amount_cents=data["amount_cents"])
    except BadRequest as exc:
        return _error(400, str(exc))
    except services.BillingError as exc:
        return _error(ERROR_STATUS[type(exc)], str(exc), retry=isinstance(exc, services.InvoiceBusy))
    payment = outcome.payment
    body = {"payment_id": payment.payment_id, "invoice_id": payment.invoice_id,
            "amount_cents": payment.amount_cents, "created": outcome.created}
    return JsonResponse(body, status=201 if outcome.created else 200)
