"""The billing JSON API: parse, call a service, answer. Authentication, CSRF, permissions and
the error format are ``billing.api``'s; input rules are ``billing.validation``'s."""

from __future__ import annotations

import base64
import binascii
import math

from django.http import HttpRequest, JsonResponse

from billing import errors
from billing.api import ApiError, endpoint
from billing.models import MAX_AMOUNT_CENTS, Invoice
from billing.validation import AMOUNT, Email, Integer, Text, parse_json_body, parse_query_int
from billing.wiring import default_service
from composition.backpressure import Backpressure, admit

# Each business error with its status and stable code.
ERRORS: dict[type[errors.BillingError], tuple[int, str]] = {
    errors.InvoiceNotFound: (404, "invoice_not_found"),
    errors.AlreadyPaid: (409, "invoice_paid"),
    errors.InvoiceVoid: (409, "invoice_void"),
    errors.InvoiceNotOpen: (409, "invoice_not_open"),
    errors.InvoiceHasNoEmail: (409, "no_email"),
    errors.AmountMismatch: (422, "amount_mismatch"),
    errors.PaymentIdReused: (409, "payment_id_reused"),
    errors.InvoiceBusy: (409, "invoice_busy"),
    errors.DuplicateInvoice: (409, "duplicate_invoice"),
}

INVOICE_FIELDS: dict[str, Text | Integer] = {
    "number": Text(32),
    "customer": Text(200),
    "amount_cents": AMOUNT,
    "currency": Text(3, min_length=3, required=False, pattern="[A-Z]{3}",
                     pattern_hint="a three-letter code such as 'EUR'"),
    # Where receipts and reminders go.
    "email": Email(254, required=False),
}
PAYMENT_FIELDS: dict[str, Text | Integer] = {"payment_id": Text(64), "amount_cents": AMOUNT}


def _business_error(exc: errors.BillingError) -> ApiError:
    status, code = ERRORS[type(exc)]
    extra = {"retry_after_s": 1} if isinstance(exc, errors.InvoiceBusy) else {}
    return ApiError(status, code, str(exc), **extra)


def _existing_id(invoice_id: int) -> int:
    # The URL takes any digits; an id beyond the column cannot exist (and must not reach SQL).
    if invoice_id > MAX_AMOUNT_CENTS:
        raise ApiError(404, "invoice_not_found", f"invoice {invoice_id} does not exist")
    return invoice_id


def _encode_cursor(before_id: int) -> str:
    return base64.urlsafe_b64encode(f"v1:{before_id}".encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> int:
    try:
        version, _, before_id = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode().partition(":")
        if version != "v1" or not before_id.isdigit() or len(before_id) > 19:
            raise ValueError(cursor)
        return int(before_id)
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        raise ApiError(400, "invalid_cursor", "the cursor is not one this API gave out") from exc


def list_invoices(request: HttpRequest) -> JsonResponse:
    status = request.GET.get("status")
    if status is not None and status not in Invoice.Status.values:
        raise ApiError(400, "invalid_parameter",
                       f"parameter 'status' must be one of {', '.join(Invoice.Status.values)}", parameter="status")
    cursor = request.GET.get("cursor")
    page = default_service().list_invoices(status=status, before_id=_decode_cursor(cursor) if cursor else None,
                                  limit=parse_query_int(request, "limit", default=50, minimum=1, maximum=200))
    next_cursor = _encode_cursor(page.next_before_id) if page.next_before_id is not None else None
    return JsonResponse({"results": page.invoices, "next_cursor": next_cursor})


def create_invoice(request: HttpRequest) -> JsonResponse:
    data = parse_json_body(request, INVOICE_FIELDS)
    try:
        invoice = default_service().create_invoice(**data)
    except errors.BillingError as exc:
        raise _business_error(exc) from exc
    return JsonResponse(invoice.as_dict(), status=201)


def invoice_detail(request: HttpRequest, invoice_id: int) -> JsonResponse:
    try:
        return JsonResponse(default_service().get_invoice(_existing_id(invoice_id)))
    except errors.BillingError as exc:
        raise _business_error(exc) from exc


def pay_invoice(request: HttpRequest, invoice_id: int) -> JsonResponse:
    data = parse_json_body(request, PAYMENT_FIELDS)
    # Of the writes, only a payment publishes to the billing queue (its receipt), so only it is
    # refused while that queue is at its backlog limit: the Backpressure rises to
    # BackpressureMiddleware, which answers 503 with Retry-After.
    admit("billing")
    try:
        outcome = default_service().pay_invoice(_existing_id(invoice_id), payment_id=data["payment_id"],
                                       amount_cents=data["amount_cents"])
    except errors.BillingError as exc:
        raise _business_error(exc) from exc
    payment = outcome.payment
    body = {"payment_id": payment.payment_id, "invoice_id": payment.invoice_id,
            "amount_cents": payment.amount_cents, "created": outcome.created}
    return JsonResponse(body, status=201 if outcome.created else 200)


def void_invoice(request: HttpRequest, invoice_id: int) -> JsonResponse:
    # The content type first: a session's CSRF check has read a form body as a stream already,
    # and request.body would then raise (a 500) instead of the form being ignored.
    if request.content_type == "application/json" and request.body:
        parse_json_body(request, {})  # no fields: a JSON body, if sent, must be an empty object
    try:
        invoice, voided = default_service().void_invoice(_existing_id(invoice_id))
    except errors.BillingError as exc:
        raise _business_error(exc) from exc
    return JsonResponse({**invoice.as_dict(), "voided": voided})


def remind_invoice(request: HttpRequest, invoice_id: int) -> JsonResponse:
    """Queue a reminder: 202, or 503 with Retry-After when the reminders' queue is full or shed
    while payments are behind (the payment endpoints keep working: they publish to another
    queue)."""
    if request.content_type == "application/json" and request.body:  # in this order: see void_invoice
        parse_json_body(request, {})
    try:
        default_service().remind(_existing_id(invoice_id))
    except errors.BillingError as exc:
        raise _business_error(exc) from exc
    except Backpressure as exc:
        why = "payments come first while they are behind" if exc.shed else "their queue is full"
        raise ApiError(503, "overloaded", f"reminders are not being taken now: {why}; retry later",
                       retry_after_s=max(1, math.ceil(exc.retry_after_s))) from exc
    return JsonResponse({"invoice_id": invoice_id, "queued": True}, status=202)


invoices = endpoint(GET=("billing.view_invoice", list_invoices), POST=("billing.add_invoice", create_invoice))
invoice = endpoint(GET=("billing.view_invoice", invoice_detail))
invoice_pay = endpoint(POST=("billing.pay_invoice", pay_invoice))
invoice_void = endpoint(POST=("billing.change_invoice", void_invoice))
invoice_remind = endpoint(POST=("billing.change_invoice", remind_invoice))
