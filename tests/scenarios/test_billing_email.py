"""Receipts by email with real processes: gunicorn serving the API, ``runworkers`` sending the
mail, Django's file-based email backend shared by every process, emails counted by Message-ID."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from io import StringIO
from pathlib import Path

import pytest

from billing.models import Invoice, Payment, Receipt
from billing.wiring import default_service
from composition import health
from composition.broker.configured import configured_broker
from composition.testing import wait_until
from tests.gunicorn_server import emails_by_message_id, gunicorn, mail_env, post
from tests.helpers import ROOT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.empty_queues("billing"),
    pytest.mark.usefixtures("no_cached_invoices"),
]



@pytest.mark.version_smoke  # the matrix cell runs it too (Makefile)
def test_100_concurrent_pays_through_gunicorn_give_one_payment_one_receipt_one_email(  # type: ignore[no-untyped-def]
        worker_processes, api_token: str, tmp_path: Path) -> None:
    mail_dir = tmp_path / "mail"
    env = mail_env(mail_dir)
    invoice = Invoice.objects.create(number="INV-G1", customer="Ada", email="ada@example.com", amount_cents=990)
    worker = worker_processes.spawn(["--threads", "2", "--queues", "billing"], **{
        key: value for key, value in env.items() if key.startswith("EMAIL_")})
    with gunicorn(env, workers=2, threads=8) as base:
        # 20 clients, 5 calls each: a third repeat one payment id, the rest bring their own.
        def client(index: int) -> list[int]:
            return [post(f"{base}/api/invoices/{invoice.pk}/pay", api_token,
                         {"payment_id": "pay-shared" if (index + call) % 3 == 0 else f"pay-{index}-{call}",
                          "amount_cents": 990}).status for call in range(5)]

        with ThreadPoolExecutor(20) as pool:
            statuses = [status for answers in pool.map(client, range(20)) for status in answers]
        # The load generator, as the README runs it, against the same server.
        load = subprocess.run([sys.executable, "bench/load.py", "--url", base, "--token", api_token,
                               "--clients", "4", "--seconds", "2"], cwd=ROOT, capture_output=True, text=True,
                              timeout=60)
        assert load.returncode == 0, load.stdout + load.stderr
        assert "failures (5xx other than 503, or no answer): 0" in load.stdout
        pay_row = next(line for line in load.stdout.splitlines() if line.startswith("pay "))
        assert int(pay_row.split()[1]) > 0, load.stdout
    assert len(statuses) == 100
    assert all(status < 500 for status in statuses), Counter(statuses)
    assert set(statuses) <= {200, 201, 409}, Counter(statuses)
    assert statuses.count(201) == 1, Counter(statuses)
    assert Payment.objects.filter(invoice=invoice).count() == 1
    assert Invoice.objects.get(pk=invoice.pk).status == "paid"
    wait_until(lambda: "<receipt.R-INV-G1@billing.example.com>" in emails_by_message_id(mail_dir), 30,
               message="no receipt email:\n" + worker.output()[-3000:])
    assert worker.terminate(20) == 0
    assert Receipt.objects.filter(payment__invoice=invoice).count() == 1
    # The load generator's invoices have no address: G1's receipt is the only email.
    assert emails_by_message_id(mail_dir) == {"<receipt.R-INV-G1@billing.example.com>": 1}


def _breakers() -> dict[str, str]:
    """The breakers every live worker reported in its last heartbeat."""
    states: dict[str, str] = {}
    for beat in health.workers().detail.get("workers", []):
        states.update(beat.get("breakers") or {})
    return states


def test_with_the_email_backend_failing_the_breaker_opens_and_every_receipt_is_sent_once_after(  # type: ignore[no-untyped-def]
        worker_processes, tmp_path: Path) -> None:
    mail_path = tmp_path / "mail"
    mail_path.write_text("a file where the backend needs a folder: every send fails\n")
    worker = worker_processes.spawn(["--threads", "4", "--queues", "billing"], **{
        key: value for key, value in mail_env(mail_path, BILLING_EMAIL_BREAKER_RESET_S="1").items()
        if key.startswith(("EMAIL_", "BILLING_"))})
    invoices = [Invoice.objects.create(number=f"INV-O{index}", customer="Ada", email=f"c{index}@example.com",
                                       amount_cents=100) for index in range(5)]
    for index, invoice in enumerate(invoices):
        default_service().pay_invoice(invoice.pk, payment_id=f"pay-o{index}", amount_cents=100)

    wait_until(lambda: _breakers().get("email") in ("open", "half_open"), 30,
               message="the email breaker never opened:\n" + worker.output()[-3000:])
    assert not Receipt.objects.exists(), "a failed send leaves no receipt: the job's transaction rolled back"
    # A retry that runs while it is open fails fast (the breaker may open before any retry is due).
    wait_until(lambda: "CircuitOpen" in worker.output(), 30,
               message="jobs do not fail fast while the breaker is open:\n" + worker.output()[-3000:])

    mail_path.unlink()  # the outage ends
    mail_path.mkdir()
    wait_until(lambda: len(emails_by_message_id(mail_path)) == 5, 90, interval_s=0.5,
               message="not every receipt was sent after recovery:\n" + worker.output()[-3000:])
    assert worker.terminate(20) == 0
    assert emails_by_message_id(mail_path) == {f"<receipt.R-INV-O{index}@billing.example.com>": 1
                                               for index in range(5)}
    assert Receipt.objects.count() == 5


def test_the_demo_command_seeds_pays_and_provokes_one_dead_letter(worker_processes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from django.core.management import call_command

    from composition.jobs.models import DeadLetter

    mail_dir = tmp_path / "mail"
    worker = worker_processes.spawn(["--threads", "2", "--queues", "billing"], **{
        key: value for key, value in mail_env(mail_dir).items() if key.startswith("EMAIL_")})
    try:
        out = StringIO()
        call_command("billing_demo", "--invoices", "4", "--pay", "2", "--dead-letter", stdout=out)
        assert "created 4 invoices" in out.getvalue() and "dead letter" in out.getvalue()
        assert Invoice.objects.count() == 4 and Payment.objects.count() == 2
        wait_until(lambda: DeadLetter.objects.filter(actor="send_payment_receipt").exists()
                   and Receipt.objects.count() == 2, 30, message="demo jobs did not run:\n" + worker.output()[-3000:])
        letter = DeadLetter.objects.get(actor="send_payment_receipt")
        assert letter.error_class.endswith("PermanentError") and "does not exist" in letter.error_message
        wait_until(lambda: len(emails_by_message_id(mail_dir)) == 2, 30)
        assert worker.terminate(20) == 0
    finally:
        configured_broker().flush("reminders")
