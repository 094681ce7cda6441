"""Billing in the admin, as an operator uses it: nothing the billing service decides can be
edited by hand (an invoice set back to open with a payment made the API answer 500), payments
and receipts are read-only (adding one was a 500), an edit the API shows clears its cached
answer, a new invoice keeps the API's rules, and voiding goes through the service."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from billing.models import Invoice, Payment
from billing.wiring import default_service

# transaction=True: the invalidations run after COMMIT
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.empty_queues("billing"),
    pytest.mark.usefixtures("no_cached_invoices"),
]


@pytest.fixture
def operator() -> Client:
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("operator", "op@example.invalid", "pw"))
    return client


def _paid_invoice() -> Invoice:
    invoice = default_service().create_invoice(number="INV-A1", customer="Ada", amount_cents=4200)
    default_service().pay_invoice(invoice.pk, payment_id="pay-a1", amount_cents=4200)
    return Invoice.objects.get(pk=invoice.pk)


def _change_form(invoice: Invoice, **fields: Any) -> dict[str, Any]:
    return {"number": invoice.number, "customer": invoice.customer, "email": invoice.email,
            "amount_cents": invoice.amount_cents, "currency": invoice.currency, "status": invoice.status, **fields}


def test_what_the_service_decides_cannot_be_edited_and_an_edit_clears_the_cached_answer(
        operator: Client, api_client: Client) -> None:
    invoice = _paid_invoice()
    assert api_client.get(f"/api/invoices/{invoice.pk}").json()["customer"] == "Ada"  # now cached
    saved = operator.post(f"/admin/billing/invoice/{invoice.pk}/change/",
                          _change_form(invoice, status="open", amount_cents=1, currency="USD", number="X",
                                       customer="Ada Lovelace"))
    assert saved.status_code == 302, saved.content[-2000:]
    invoice.refresh_from_db()
    assert (invoice.status, invoice.amount_cents, invoice.currency, invoice.number) == ("paid", 4200, "EUR", "INV-A1")
    answer = api_client.get(f"/api/invoices/{invoice.pk}").json()
    assert (answer["customer"], answer["status"]) == ("Ada Lovelace", "paid")  # not the cached "Ada"
    # And the API still refuses a second payment as a business error, not a 500.
    again = api_client.post(f"/api/invoices/{invoice.pk}/pay", {"payment_id": "pay-a2", "amount_cents": 4200},
                            content_type="application/json")
    assert (again.status_code, again.json()["code"]) == (409, "invoice_paid")
    assert operator.post(f"/admin/billing/invoice/{invoice.pk}/delete/", {"post": "yes"}).status_code == 403


def test_payments_and_receipts_are_read_only(operator: Client) -> None:
    invoice = _paid_invoice()
    payment = Payment.objects.get(invoice=invoice)
    assert operator.get("/admin/billing/payment/add/").status_code == 403
    assert operator.post("/admin/billing/payment/add/", {"payment_id": "p", "invoice": invoice.pk}).status_code == 403
    shown = operator.get(f"/admin/billing/payment/{payment.pk}/change/")
    assert shown.status_code == 200 and b'name="_save"' not in shown.content and b"deletelink" not in shown.content
    assert operator.post(f"/admin/billing/payment/{payment.pk}/change/", {"amount_cents": 1}).status_code == 403
    assert operator.get("/admin/billing/receipt/add/").status_code == 403
    payment.refresh_from_db()
    assert payment.amount_cents == 4200


def test_a_new_invoice_keeps_the_apis_rules(operator: Client) -> None:
    form = {"number": "INV-N1", "customer": "Grace", "email": "", "amount_cents": 0, "currency": "EUR"}
    refused = operator.post("/admin/billing/invoice/add/", form)
    assert refused.status_code == 200 and b"must be from 1 to" in refused.content  # a form error, not a 500
    refused = operator.post("/admin/billing/invoice/add/", {**form, "amount_cents": 100, "currency": "eur"})
    assert refused.status_code == 200 and b"three-letter code" in refused.content
    assert not Invoice.objects.exists()
    added = operator.post("/admin/billing/invoice/add/", {**form, "amount_cents": 100, "status": "paid"})
    assert added.status_code == 302
    assert Invoice.objects.get(number="INV-N1").status == "open"  # a new invoice is open, whatever is posted


def test_voiding_from_the_admin_goes_through_the_service(operator: Client, api_client: Client) -> None:
    paid = _paid_invoice()
    open_one = default_service().create_invoice(number="INV-O1", customer="Bob", amount_cents=100)
    assert api_client.get(f"/api/invoices/{open_one.pk}").json()["status"] == "open"  # cached
    done = operator.post("/admin/billing/invoice/", {"action": "void_selected",
                                                     "_selected_action": [paid.pk, open_one.pk]}, follow=True)
    text = done.content.decode()
    assert "1 invoice(s) voided." in text and "1 not voided" in text and "INV-A1 is paid" in text
    assert Invoice.objects.get(pk=open_one.pk).status == "void"
    assert Invoice.objects.get(pk=paid.pk).status == "paid"
    assert api_client.get(f"/api/invoices/{open_one.pk}").json()["status"] == "void"
