"""The flow of one payment, end to end: HTTP -> lock -> payment + outbox in one transaction ->
cache invalidated after commit -> relay -> worker -> one receipt, with ids in the logs."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connections
from django.test import Client

from billing.models import Payment, Receipt
from billing.services import invoice_cache_key
from billing.wiring import default_service
from composition.broker.configured import configured_broker
from composition.cache import cache_aside_result, invalidate_namespace
from composition.outbox import OutboxMessage
from composition.testing import wait_until
from tests.helpers import open_invoice, post_json

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _forget_cached_invoices() -> None:
    # Invoice ids start again in every test database; entries of an earlier run must not answer.
    invalidate_namespace("invoice")


def _client(token: str) -> Client:
    return Client(headers={"Authorization": f"Bearer {token}"})


def test_payment_flows_to_exactly_one_receipt_with_request_id_in_the_worker_log(  # type: ignore[no-untyped-def]
        worker_processes, api_token: str) -> None:
    # Messages other tests left for the same (reused) payment ids must not run as this one's.
    configured_broker().flush("billing")
    client = _client(api_token)
    created = post_json(client, "/api/invoices", {"number": "INV-7", "customer": "Ada", "amount_cents": 4200})
    assert created.status_code == 201
    invoice_id = created.json()["id"]
    assert client.get(f"/api/invoices/{invoice_id}").json()["status"] == "open"  # now cached

    worker = worker_processes.spawn(["--threads", "2", "--shutdown-timeout", "10"])
    paid = post_json(client, f"/api/invoices/{invoice_id}/pay", {"payment_id": "pay-7", "amount_cents": 4200},
                 HTTP_X_REQUEST_ID="req-flow-7")
    assert paid.status_code == 201, paid.content
    # The cache was invalidated after commit: the next read sees the database's answer.
    assert client.get(f"/api/invoices/{invoice_id}").json()["status"] == "paid"

    wait_until(lambda: Receipt.objects.filter(payment__payment_id="pay-7").exists(), 30,
               message="no receipt:\n" + worker.output())
    again = post_json(client, f"/api/invoices/{invoice_id}/pay", {"payment_id": "pay-7", "amount_cents": 4200})
    assert again.status_code == 200 and again.json()["created"] is False
    assert worker.terminate(20) == 0
    assert Receipt.objects.count() == 1
    assert OutboxMessage.objects.filter(status="sent").count() == 1

    records = [json.loads(line) for line in worker.output().splitlines() if line.startswith("{")]
    receipt_logs = [r for r in records if r.get("event") == "payment receipt written"]
    assert len(receipt_logs) == 1
    record = receipt_logs[0]
    assert record["request_id"] == "req-flow-7"
    assert record["payment_id"] == "pay-7" and record["invoice_id"] == invoice_id
    assert record["attempt"] == 1 and record["job_id"]
    assert record["worker"].endswith(f":{worker.pid}") and record["thread"]


def _parallel(count: int, work: Any) -> list[Any]:
    barrier = threading.Barrier(count)

    def run(index: int) -> Any:
        barrier.wait()
        try:
            return work(index)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(run, range(count)))


def test_concurrent_payers_of_one_invoice_charge_once(api_token: str) -> None:
    invoice = open_invoice("INV-1", amount_cents=12_500)

    def pay(index: int) -> int:
        return int(post_json(_client(api_token), f"/api/invoices/{invoice.pk}/pay",
                         {"payment_id": f"pay-{index}", "amount_cents": 12_500}).status_code)

    statuses = _parallel(8, pay)
    assert sorted(statuses) == [201] + [409] * 7
    assert Payment.objects.count() == 1
    assert OutboxMessage.objects.count() == 1


def test_the_same_payment_id_posted_concurrently_is_one_payment(api_token: str) -> None:
    invoice = open_invoice("INV-1", amount_cents=12_500)

    def pay(index: int) -> tuple[int, bool]:
        response = post_json(_client(api_token), f"/api/invoices/{invoice.pk}/pay",
                         {"payment_id": "pay-dup", "amount_cents": 12_500})
        return int(response.status_code), bool(response.json().get("created"))

    results = _parallel(6, pay)
    assert sorted(results) == [(200, False)] * 5 + [(201, True)]
    assert Payment.objects.count() == 1


def test_bad_input_gets_a_clear_error_and_writes_nothing(api_token: str) -> None:
    client = _client(api_token)
    invoice = open_invoice("INV-1", amount_cents=12_500)
    url = f"/api/invoices/{invoice.pk}/pay"
    cases = [
        (b"not json", 400, "invalid_json", "not valid JSON"),
        (json.dumps([1, 2]).encode(), 400, "invalid_body", "JSON object"),
        (json.dumps({"payment_id": "p", "amount_cents": "12500"}).encode(), 400, "invalid_field",
         "field 'amount_cents' must be an integer"),
        (json.dumps({"payment_id": "", "amount_cents": 12_500}).encode(), 400, "invalid_field", "payment_id"),
        (json.dumps({"payment_id": "p", "amount_cents": -5}).encode(), 400, "invalid_field", "between 1 and"),
        (json.dumps({"payment_id": "p", "amount_cents": 2**63}).encode(), 400, "invalid_field", "between 1 and"),
        (json.dumps({"payment_id": "p\u0000", "amount_cents": 5}).encode(), 400, "invalid_field", "control"),
        # Half a UTF-16 pair: valid JSON, no UTF-8 (it was a 500 from the database's encoder).
        (b'{"payment_id": "p\\ud800", "amount_cents": 5}', 400, "invalid_field", "valid Unicode"),
        (json.dumps({"payment_id": "p", "amount_cents": 5, "x": 1}).encode(), 400, "unknown_field", "'x'"),
        (json.dumps({"payment_id": "p", "amount_cents": 1}).encode(), 422, "amount_mismatch", "not 1"),
    ]
    for body, status, code, words in cases:
        response = client.post(url, data=body, content_type="application/json")
        assert response.status_code == status, (body, response.content)
        assert response.json()["code"] == code and words in response.json()["error"], response.content
    for invoice_body, words in (({"number": "N-1", "customer": "c", "amount_cents": 5, "currency": "euro"}, "currency"),
                                ({"number": "N-1", "customer": "c", "amount_cents": 0}, "between 1 and"),
                                ({"number": "N" * 33, "customer": "c", "amount_cents": 5}, "1 to 32 characters"),
                                ({"number": "N-2", "customer": "c\ud800", "amount_cents": 5}, "valid Unicode"),
                                # Addresses no mail backend takes: every receipt attempt would fail.
                                ({"number": "N-3", "customer": "c", "amount_cents": 5, "email": "a,b@c.d"},
                                 "email address"),
                                ({"number": "N-3", "customer": "c", "amount_cents": 5, "email": "a@[b.c"},
                                 "email address"),
                                ({"number": invoice.number, "customer": "c", "amount_cents": 5}, "already exists")):
        response = post_json(client, "/api/invoices", invoice_body)
        assert response.status_code in (400, 409) and words in response.json()["error"], response.content
    huge = client.post(url, data=b'{"payment_id": "' + b"p" * 3_000_000 + b'"}', content_type="application/json")
    assert huge.status_code == 413 and huge.json()["code"] == "body_too_large", huge.content[:200]
    missing = post_json(client, "/api/invoices/999999/pay", {"payment_id": "p", "amount_cents": 1})
    assert missing.status_code == 404
    assert Payment.objects.count() == 0 and OutboxMessage.objects.count() == 0


def test_a_payment_id_reused_for_another_invoice_is_refused(api_token: str) -> None:
    client = _client(api_token)
    first, second = open_invoice("INV-A", amount_cents=100), open_invoice("INV-B", amount_cents=100)
    paid = post_json(client, f"/api/invoices/{first.pk}/pay", {"payment_id": "p1", "amount_cents": 100})
    assert paid.status_code == 201
    response = post_json(client, f"/api/invoices/{second.pk}/pay", {"payment_id": "p1", "amount_cents": 100})
    assert response.status_code == 409
    assert "another invoice" in response.json()["error"]


def test_a_rolled_back_payment_leaves_the_cache_and_outbox_untouched(api_token: str) -> None:
    invoice = open_invoice("INV-1", amount_cents=12_500)
    assert default_service().get_invoice(invoice.pk)["status"] == "open"  # type: ignore[index]

    def cached_outcome() -> str:
        return cache_aside_result(invoice_cache_key(invoice.pk), lambda: "loader ran", ttl_s=60).outcome

    assert cached_outcome() == "hit"
    # The amount check fails inside the transaction, after the lock: nothing is written and no
    # invalidation is sent for the rolled-back write, so the entry is still there.
    response = post_json(_client(api_token), f"/api/invoices/{invoice.pk}/pay", {"payment_id": "p", "amount_cents": 1})
    assert response.status_code == 422
    assert cached_outcome() == "hit"
    assert OutboxMessage.objects.count() == 0 and Payment.objects.count() == 0

    # A committed payment does invalidate it.
    assert post_json(_client(api_token), f"/api/invoices/{invoice.pk}/pay",
                 {"payment_id": "p", "amount_cents": 12_500}).status_code == 201
    assert cached_outcome() == "loaded"
