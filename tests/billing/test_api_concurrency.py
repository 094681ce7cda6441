"""The billing API under concurrency, over real HTTP (Django's live server: threaded, real
PostgreSQL and Redis): what a reader sees while payers race for one invoice."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from billing.models import Invoice, Payment
from composition.cache import invalidate_namespace

# Transactional: the live server's threads see only committed rows, and invalidations run after COMMIT.
pytestmark = pytest.mark.django_db(transaction=True)

INVOICE = {"number": "INV-1", "customer": "Ada", "amount_cents": 12_500}


@pytest.fixture(autouse=True)
def _forget_cached_invoices() -> None:
    invalidate_namespace("invoice")  # ids start again in every test database


def test_readers_never_see_the_old_status_once_a_pay_call_has_returned(live_server: Any, api_token: str) -> None:
    """20 payers race for one invoice over HTTP while readers poll it: no read that began after
    a pay call returned shows the invoice open (the cache is invalidated after COMMIT, and a
    reader that loaded the old row before cannot cache it afterwards)."""
    invoice = Invoice.objects.create(**INVOICE)
    url = f"{live_server.url}/api/invoices/{invoice.pk}"
    headers = {"Authorization": f"Bearer {api_token}", "Content-Type": "application/json"}

    def request(target: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        data = json.dumps(body).encode() if body is not None else None
        try:
            with urllib.request.urlopen(urllib.request.Request(target, data=data, headers=headers), timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    assert request(url)[1]["status"] == "open"  # cached
    paid_at: list[float] = []
    reads: list[tuple[float, str | None]] = []
    statuses: list[int] = []
    start = threading.Barrier(20 + 4)
    payers_done = threading.Event()

    def pay(index: int) -> None:
        start.wait()
        status, body = request(f"{url}/pay", {"payment_id": f"race-{index}", "amount_cents": 12_500})
        returned = time.monotonic()
        statuses.append(status)
        if status == 201 or body.get("code") == "invoice_paid":
            paid_at.append(returned)

    failures: list[Any] = []  # a failed assert in a thread would only warn: the main thread asserts

    def read() -> None:
        start.wait()
        while not payers_done.is_set():
            began = time.monotonic()
            try:
                status, body = request(url)
            except Exception as exc:
                failures.append(exc)
                return
            if status != 200:
                failures.append((status, body))
            reads.append((began, body.get("status")))

    threads = [threading.Thread(target=pay, args=(i,)) for i in range(20)]
    readers = [threading.Thread(target=read) for _ in range(4)]
    for thread in threads + readers:
        thread.start()
    for thread in threads:
        thread.join(60)
    time.sleep(0.3)  # reads after the last pay returned, too
    payers_done.set()
    for thread in readers:
        thread.join(60)
    assert not failures, failures[:5]
    assert len(statuses) == 20 and sorted(statuses).count(201) == 1 and Payment.objects.count() == 1, statuses
    first_paid = min(paid_at)
    late_reads = [state for began, state in reads if began > first_paid]
    assert late_reads and set(late_reads) == {"paid"}, (len(reads), late_reads[:5])
