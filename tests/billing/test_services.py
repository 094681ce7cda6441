"""The billing service with the library's objects passed in: real alternates (another cache alias,
a job on another queue, another email backend); under backpressure reminders are shed while
payments go on, and payments are shed while the other writes go on."""

from __future__ import annotations

import pytest
import structlog
from django.conf import settings
from django.core import mail
from django.test import Client, override_settings

from billing.models import Invoice, Payment
from billing.services import InvoiceService, invoice_cache_key
from billing.wiring import build_service, default_service, email_sender
from composition.broker.configured import configured_broker
from composition.cache import get_cache_aside, invalidate_namespace
from composition.outbox import OutboxMessage, publish
from tests.helpers import open_invoice, post_json
from tests.jobsapp.jobs import ELSEWHERE_QUEUE

LOCMEM = "django.core.mail.backends.locmem.EmailBackend"


@pytest.fixture(autouse=True)
def _fresh() -> None:
    invalidate_namespace("invoice")
    get_cache_aside("alternate").invalidate_namespace("invoice")


def _alternate() -> InvoiceService:
    return build_service(cache=get_cache_aside("alternate"), receipt_job="receipt_elsewhere",
                         mail=email_sender(backend=LOCMEM))


@pytest.mark.django_db
def test_the_default_service_is_built_once_from_settings_and_again_when_they_change() -> None:
    assert default_service() is default_service()
    with override_settings(BILLING={"FROM_EMAIL": "other@example.com"}):
        assert default_service().mail.from_email == "other@example.com"
    assert default_service().mail.from_email == "billing@example.com"
    with override_settings(BILLING={"FROM_EMAIL": "x@example.com", "FROM_EMIAL": "typo"}), \
            pytest.raises(ValueError, match=r"unknown BILLING setting.*FROM_EMIAL"):
        default_service()
    with pytest.raises(TypeError, match=r"unknown InvoiceService field.*db"):
        build_service(db=None)


# Each statement its own transaction: inside one, a read after _fresh's invalidation of the
# namespace would go to the database and cache nothing (docs/cache_and_locks.md).
@pytest.mark.django_db(transaction=True)
def test_another_cache_alias_holds_the_invoice_and_the_default_one_does_not() -> None:
    invoice = open_invoice("INV-S1", email="ada@example.com")
    service = _alternate()
    assert service.get_invoice(invoice.pk)["status"] == "open"
    key = invoice_cache_key(invoice.pk)
    assert get_cache_aside("alternate").fetch(key, lambda: "loader ran", ttl_s=60).outcome == "hit"
    assert get_cache_aside().fetch(key, lambda: "loader ran", ttl_s=60).outcome == "loaded"


@pytest.mark.django_db
def test_the_receipt_job_goes_where_the_service_was_told() -> None:
    invoice = open_invoice("INV-S1", email="ada@example.com")
    outcome = _alternate().pay_invoice(invoice.pk, payment_id="pay-elsewhere", amount_cents=500)
    row = OutboxMessage.objects.get()
    assert (row.actor_name, row.queue_name, row.payload) == ("receipt_elsewhere", ELSEWHERE_QUEUE,
                                                             {"payment_id": outcome.payment.pk})


@pytest.mark.django_db
def test_the_receipt_is_written_and_emailed_once_with_a_message_id_from_its_number() -> None:
    invoice = open_invoice("INV-S2", email="ada@example.com")
    payment = Payment.objects.create(payment_id="pay-s2", invoice=invoice, amount_cents=500)
    service = _alternate()
    receipt = service.send_receipt(payment.pk)
    again = service.send_receipt(payment.pk)  # a replay: the receipt exists, no second email
    assert again.pk == receipt.pk
    [message] = mail.outbox
    assert message.to == ["ada@example.com"] and message.subject == "Receipt R-INV-S2"
    assert message.extra_headers["Message-ID"] == "<receipt.R-INV-S2@billing.example.com>"
    assert message.message()["Message-ID"] == "<receipt.R-INV-S2@billing.example.com>"


@pytest.mark.django_db
def test_an_invoice_without_an_address_gets_its_receipt_and_no_email() -> None:
    invoice = open_invoice("INV-S3", email="")
    payment = Payment.objects.create(payment_id="pay-s3", invoice=invoice, amount_cents=500)
    assert _alternate().send_receipt(payment.pk).number == "R-INV-S3"
    assert mail.outbox == []


@pytest.mark.django_db
def test_every_line_a_reminder_job_logs_names_its_invoice() -> None:
    invoice = open_invoice("INV-S4", email="ada@example.com")
    structlog.contextvars.clear_contextvars()
    try:
        assert _alternate().send_reminder(invoice.pk, reference="job-1") is True
        assert structlog.contextvars.get_contextvars()["invoice_id"] == invoice.pk
    finally:
        structlog.contextvars.clear_contextvars()


# -- reminders under load ------------------------------------------------------------------------
@pytest.mark.django_db
def test_reminders_are_shed_with_503_while_payments_go_on(api_client: Client) -> None:
    broker = configured_broker()
    broker.flush("reminders")
    reminded = open_invoice("INV-R0", email="ada@example.com")
    payable = [open_invoice(f"INV-R{index}", email="ada@example.com") for index in range(1, 6)]
    limits = {**settings.COMPOSITION["BACKPRESSURE_QUEUES"], "reminders": 3}
    with override_settings(COMPOSITION={**settings.COMPOSITION, "BACKPRESSURE_QUEUES": limits,
                                        "BACKPRESSURE_CACHE_S": 0}):
        answers = []
        for index, invoice in enumerate(payable):
            answers += [post_json(api_client, f"/api/invoices/{reminded.pk}/remind", {}) for _ in range(4)]
            paid = post_json(api_client, f"/api/invoices/{invoice.pk}/pay",
                         {"payment_id": f"pay-r{index}", "amount_cents": 500})
            assert paid.status_code == 201, paid.content
    try:
        statuses = [answer.status_code for answer in answers]
        assert statuses[:3] == [202, 202, 202] and set(statuses[3:]) == {503}, statuses
        shed = answers[-1]
        assert int(shed["Retry-After"]) >= 1
        assert shed.json()["code"] == "overloaded"
        assert OutboxMessage.objects.filter(queue_name="reminders").count() == 3, "nothing written when shed"
        assert Payment.objects.count() == 5
    finally:
        broker.flush("reminders")


@pytest.mark.django_db
def test_with_the_billing_queue_full_only_payments_are_shed(api_client: Client) -> None:
    # BACKPRESSURE_PATHS {"/api/invoices": "billing"} shed every write under it with billing's
    # queue: creating, voiding and reminding too, though none of them publishes a receipt.
    broker = configured_broker()
    broker.flush("billing")
    payable, voidable = open_invoice("INV-B1"), open_invoice("INV-B2")
    reminded = open_invoice("INV-B3", email="ada@example.com")
    publish("send_payment_receipt", {"payment_id": 1})  # one receipt waiting: at the limit below
    limits = {**settings.COMPOSITION["BACKPRESSURE_QUEUES"], "billing": 1}
    with override_settings(COMPOSITION={**settings.COMPOSITION, "BACKPRESSURE_QUEUES": limits,
                                        "BACKPRESSURE_CACHE_S": 0}):
        shed = post_json(api_client, f"/api/invoices/{payable.pk}/pay", {"payment_id": "pay-b1", "amount_cents": 500})
        created = post_json(api_client, "/api/invoices", {"number": "INV-B4", "customer": "Ada", "amount_cents": 5})
        voided = post_json(api_client, f"/api/invoices/{voidable.pk}/void", {})
        reminder = post_json(api_client, f"/api/invoices/{reminded.pk}/remind", {})
    assert (shed.status_code, shed.json()["code"]) == (503, "overloaded"), shed.content
    assert int(shed["Retry-After"]) >= 1
    assert not Payment.objects.exists() and Invoice.objects.get(pk=payable.pk).status == "open"
    assert (created.status_code, voided.status_code, reminder.status_code) == (201, 200, 202)
    paid = post_json(api_client, f"/api/invoices/{payable.pk}/pay", {"payment_id": "pay-b1", "amount_cents": 500})
    assert paid.status_code == 201, paid.content


@pytest.mark.django_db
def test_a_reminder_of_a_paid_or_unknown_invoice_or_one_without_an_address_is_refused(api_client: Client) -> None:
    invoice = open_invoice("INV-R9", email="ada@example.com")
    Invoice.objects.filter(pk=invoice.pk).update(status="paid")
    refused = post_json(api_client, f"/api/invoices/{invoice.pk}/remind", {})
    assert (refused.status_code, refused.json()["code"]) == (409, "invoice_not_open")
    assert post_json(api_client, "/api/invoices/999999/remind", {}).status_code == 404
    # Said to the caller, who can add one, rather than queued for a job that would skip it.
    nowhere = open_invoice("INV-R10", email="")
    refused = post_json(api_client, f"/api/invoices/{nowhere.pk}/remind", {})
    assert (refused.status_code, refused.json()["code"]) == (409, "no_email")
    assert not OutboxMessage.objects.exists()
