"""Reminders with real processes: ``runworkers`` running the reminder job and mailing through
Django's file-based email backend (emails counted by Message-ID), and gunicorn shedding a flood
of reminders with 503 and Retry-After while the payments sent meanwhile all succeed."""

from __future__ import annotations

import io
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import Client

from billing.models import Invoice, Payment, Receipt
from billing.wiring import default_service
from composition.backpressure.depth import broker_counts
from composition.outbox import OutboxMessage
from composition.testing import wait_until
from tests.gunicorn_server import Answer, emails, emails_by_message_id, gunicorn, mail_env, post
from tests.helpers import open_invoice

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.empty_queues("billing", "reminders"),
    pytest.mark.usefixtures("no_cached_invoices"),
]


def _reminder_id(row: OutboxMessage) -> str:
    """The Message-ID of the reminder sent by the job of outbox row ``row``."""
    return f"<reminder.{row.message_id}@billing.example.com>"


def _mail_only(mail_dir: Path) -> dict[str, str]:
    return {key: value for key, value in mail_env(mail_dir).items() if key.startswith("EMAIL_")}


def _drained(queue: str) -> bool:
    counts = broker_counts(queue)
    return (counts.ready, counts.delayed, counts.in_flight) == (0, 0, 0)


def test_an_accepted_reminder_is_run_by_the_worker_and_emailed_once(  # type: ignore[no-untyped-def]
        worker_processes, api_client: Client, tmp_path: Path) -> None:
    """Three reminders accepted (202); when the worker runs them, only the invoice still open and
    with an address gets one, once, its Message-ID from the job's message id."""
    mail_dir = tmp_path / "mail"
    reminded = open_invoice("INV-M1", email="ada@example.com")
    paid_meanwhile = open_invoice("INV-M2", email="bob@example.com")
    address_removed = open_invoice("INV-M3", email="cy@example.com")
    for invoice in (reminded, paid_meanwhile, address_removed):
        answer = api_client.post(f"/api/invoices/{invoice.pk}/remind")
        assert answer.status_code == 202, answer.content
    # Paid, or its address removed, after its reminder was accepted, before the job runs: the job
    # finds it so, and sends nothing.
    default_service().pay_invoice(paid_meanwhile.pk, payment_id="pay-m2", amount_cents=500)
    Invoice.objects.filter(pk=address_removed.pk).update(email="")
    row = OutboxMessage.objects.get(queue_name="reminders", payload={"invoice_id": reminded.pk})

    worker = worker_processes.spawn(["--threads", "2", "--queues", "reminders"], **_mail_only(mail_dir))
    wait_until(lambda: _reminder_id(row) in emails_by_message_id(mail_dir) and _drained("reminders"), 30,
               message="the reminder job sent no email")
    assert worker.terminate(20) == 0
    assert emails_by_message_id(mail_dir) == {_reminder_id(row): 1}
    [message] = emails(mail_dir)
    assert (message["To"], message["Subject"]) == ("ada@example.com", "Reminder: invoice INV-M1")


REMINDERS_LIMIT = 5  # the reminders' backlog gunicorn admits (REMINDERS_QUEUE_LIMIT)
FLOODERS, PAYERS, PAYS_EACH = 8, 4, 5


def test_a_flood_of_reminders_is_shed_with_503_while_concurrent_pays_all_succeed(  # type: ignore[no-untyped-def]
        worker_processes, api_token: str, tmp_path: Path) -> None:
    """Flooders post reminders through gunicorn; once the reminders' queue is full (no worker takes
    reminders during the flood, as when workers fall behind), payers pay other invoices while the
    flood goes on. Payments publish to the billing queue, which a real worker drains meanwhile."""
    mail_dir = tmp_path / "mail"
    reminded = [open_invoice(f"INV-F{index}", email="ada@example.com") for index in range(4)]
    payable = [[open_invoice(f"INV-P{payer}-{index}", email="ada@example.com") for index in range(PAYS_EACH)]
               for payer in range(PAYERS)]
    receipts = worker_processes.spawn(["--threads", "2", "--queues", "billing"], **_mail_only(mail_dir))
    shedding, paid = threading.Event(), threading.Event()
    reminders: list[tuple[float, Answer]] = []
    pays: list[Answer] = []
    window: list[float] = []  # when the first pay began and the last one returned

    def flood(index: int, base: str) -> None:
        deadline = time.monotonic() + 60
        while not paid.is_set() and time.monotonic() < deadline:
            invoice = reminded[index % len(reminded)]
            answer = post(f"{base}/api/invoices/{invoice.pk}/remind", api_token, {})
            reminders.append((time.monotonic(), answer))
            if answer.status == 503:
                shedding.set()
            index += 1

    def pay(invoices: list[Invoice], base: str) -> None:
        assert shedding.wait(30), "no reminder was shed"
        window.append(time.monotonic())
        for invoice in invoices:
            pays.append(post(f"{base}/api/invoices/{invoice.pk}/pay", api_token,
                             {"payment_id": f"pay-{invoice.number}", "amount_cents": 500}))
        window.append(time.monotonic())

    with gunicorn(mail_env(mail_dir, REMINDERS_QUEUE_LIMIT=str(REMINDERS_LIMIT)), workers=2, threads=8) as base, \
            ThreadPoolExecutor(FLOODERS + PAYERS) as pool:
        flooders = [pool.submit(flood, index, base) for index in range(FLOODERS)]
        payers = [pool.submit(pay, invoices, base) for invoices in payable]
        try:
            for future in payers:
                future.result()  # a payer's failure fails the test here
        finally:
            paid.set()
        for future in flooders:
            future.result()

    statuses = Counter(answer.status for _, answer in reminders)
    assert set(statuses) == {202, 503}, statuses
    shed = [answer for _, answer in reminders if answer.status == 503]
    assert all(int(answer.headers["Retry-After"]) >= 1 and answer.body["code"] == "overloaded" for answer in shed)
    assert any(min(window) <= at <= max(window) for at, answer in reminders if answer.status == 503), \
        "reminders were shed while the pays were made"
    assert [answer.status for answer in pays] == [201] * PAYERS * PAYS_EACH, Counter(a.status for a in pays)
    accepted = OutboxMessage.objects.filter(queue_name="reminders")
    assert accepted.count() == statuses[202], "a shed reminder writes nothing"
    everyone = [invoice for invoices in payable for invoice in invoices]
    for invoice in everyone:
        assert Payment.objects.filter(invoice=invoice).count() == 1
        assert Invoice.objects.get(pk=invoice.pk).status == "paid"
    wait_until(lambda: Receipt.objects.filter(payment__invoice__in=everyone).count() == len(everyone), 60,
               message="a receipt was not written")
    assert all(Receipt.objects.filter(payment__invoice=invoice).count() == 1 for invoice in everyone)

    # The backlog taken after the flood: every accepted reminder mailed once, every receipt once.
    expected = {**{f"<receipt.R-{invoice.number}@billing.example.com>": 1 for invoice in everyone},
                **{_reminder_id(row): 1 for row in accepted}}
    later = worker_processes.spawn(["--threads", "4", "--queues", "reminders"], **_mail_only(mail_dir))
    wait_until(lambda: len(emails_by_message_id(mail_dir)) >= len(expected) and _drained("reminders"), 60,
               message="an email was not sent")
    assert receipts.terminate(20) == 0 and later.terminate(20) == 0
    assert emails_by_message_id(mail_dir) == expected


def test_the_scheduled_sweep_reminds_each_overdue_invoice_once_per_tick(  # type: ignore[no-untyped-def]
        worker_processes, tmp_path: Path) -> None:
    """billing/schedules.py's morning sweep, fired twice by hand (``schedules run``, two ticks):
    each tick emails every invoice open for over REMINDER_AFTER_DAYS once, and no other."""
    from django.core.management import call_command
    from django.utils import timezone

    mail_dir = tmp_path / "mail"
    overdue = open_invoice("INV-S1", email="ada@example.com")
    recent = open_invoice("INV-S2", email="bob@example.com")
    paid = open_invoice("INV-S3", email="cy@example.com")
    default_service().pay_invoice(paid.pk, payment_id="pay-s3", amount_cents=500)
    weeks_ago = timezone.now() - timedelta(days=15)
    Invoice.objects.filter(pk__in=[overdue.pk, paid.pk]).update(created_at=weeks_ago)

    worker = worker_processes.spawn(["--threads", "2", "--queues", "reminders"], **_mail_only(mail_dir))
    for _ in range(2):
        call_command("schedules", "run", "send_overdue_reminders", stdout=io.StringIO())
    wait_until(lambda: len(emails(mail_dir)) >= 2 and _drained("reminders"), 30,
               message="the scheduled sweep sent no reminders")
    assert worker.terminate(20) == 0
    sent = emails(mail_dir)
    assert [message["To"] for message in sent] == ["ada@example.com", "ada@example.com"]
    assert len(set(emails_by_message_id(mail_dir))) == 2  # one per tick, each its own Message-ID
    assert recent.pk not in {row.payload["invoice_id"] for row in OutboxMessage.objects.filter(queue_name="reminders")
                             if "invoice_id" in row.payload}
