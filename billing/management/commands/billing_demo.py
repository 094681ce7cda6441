"""``manage.py billing_demo``: demo data for the example, through the billing service (so the
outbox, the workers, the receipts' emails and the metrics all see it), and, on request, one job
that fails for good, so the admin shows a dead letter."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from billing.wiring import default_service
from composition.outbox import publish

# A payment id no payment has: the receipt job for it fails for good (PermanentError).
MISSING_PAYMENT_ID = 2**62


class Command(BaseCommand):
    help = ("Create demo invoices through the billing service, pay some (their receipts are emailed by "
            "runworkers), remind one, and with --dead-letter publish a receipt job for a payment that "
            "does not exist, so a dead letter appears in the admin once a worker has run it.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--invoices", type=int, default=10, help="invoices to create (default 10)")
        parser.add_argument("--pay", type=int, default=None, help="how many of them to pay (default: half)")
        parser.add_argument("--dead-letter", action="store_true", dest="dead_letter",
                            help="also publish a receipt job that can only fail (a dead letter)")

    def handle(self, *args: Any, **options: Any) -> None:
        count = options["invoices"]
        to_pay = count // 2 if options["pay"] is None else options["pay"]
        if count < 0 or not 0 <= to_pay <= count:
            raise CommandError("--invoices must be >= 0 and --pay between 0 and --invoices")
        service = default_service()
        run = time.strftime("%Y%m%d%H%M%S")
        invoices = [service.create_invoice(number=f"DEMO-{run}-{index}", customer=f"Customer {index}",
                                           email=f"customer{index}@example.com", amount_cents=1_000 + index * 250)
                    for index in range(count)]
        for invoice in invoices[:to_pay]:
            service.pay_invoice(invoice.pk, payment_id=f"demo-{run}-{invoice.pk}", amount_cents=invoice.amount_cents)
        reminded = invoices[to_pay] if to_pay < count else None
        if reminded is not None:
            service.remind(reminded.pk)
        self.stdout.write(f"created {count} invoices (DEMO-{run}-*), paid {to_pay}"
                          + (f", reminded {reminded.number}" if reminded else "")
                          + "; receipts are emailed by runworkers (./run writes them under .data/mail).")
        if options["dead_letter"]:
            row = publish("send_payment_receipt", {"payment_id": MISSING_PAYMENT_ID})
            self.stdout.write(f"published a receipt job for payment {MISSING_PAYMENT_ID}, which does not exist "
                              f"(outbox row {row.pk}): once a worker runs it, it is a dead letter at "
                              "/admin/composition/deadletter/ and on /admin/composition/operations/.")
