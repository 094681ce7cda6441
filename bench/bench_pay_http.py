"""Pay over HTTP through the library (row lock with a timeout, outbox row, cache invalidation,
backpressure, metrics) against a plain Django view doing the same insert and update without it:
the request-path cost of the guarantees.

One gunicorn (2 workers x 16 threads, the example's settings plus the baseline's URL,
``bench/_pay_settings.py``) serves both. 32 client threads pay distinct open invoices, one
request each, in alternating rounds (library, plain, plain, library, ...), so drift hits both
alike. Per side: throughput (payments per second over its rounds), each round's rate (how much
the shared machine wandered during the run), and p99 latency.
Goals (issue 30): throughput >= 0.6x the plain view, p99 <= 1.5x: the pay does more than the
plain view (a row lock with a timeout, an outbox row, an invalidation record, a send), in plain
statements.

What the library's pay sends from the request thread: BEGIN, the row lock (one string with its
timeout), the payment, the invoice's update, the outbox row, the invalidation record, COMMIT,
then one Redis DEL, the outbox row's send and mark-sent and the invalidation record's DELETE;
the plain view sends BEGIN, its lock, the payment, the invoice, COMMIT.

No worker runs: the library's receipt jobs pile up on the ``billing`` queue, which is emptied
before every round (and the settings lift its backpressure limit, see ``_pay_settings``), so
neither side is shed and every round starts from the same broker state.

The tables both sides write are vacuumed first. Every library pay leaves a dead outbox row
version (pending, then sent) and a dead pending-invalidation row; on a server without
autovacuum (the shared test machine's) they pile up run after run, and the backpressure probe's
count of pending outbox rows (twice a second per process) walks them all: after a few dozen
runs it cost ~45 ms of database time per probe, a load that grows with the runs before, not
with the code measured. Autovacuum does this in any real deployment.

Run: ``python bench/bench_pay_http.py`` (BENCH_CLIENTS, BENCH_ROUND_S, BENCH_ROUNDS); needs
DATABASE_URL and REDIS_URL (the project's services). It empties the ``billing`` queue on that
broker, before and after.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
os.environ.setdefault("LOG_LEVEL", "WARNING")
from _util import setup_django  # noqa: E402

setup_django("tests.settings")

from django.contrib.auth import get_user_model  # noqa: E402

from billing.models import Invoice, Payment  # noqa: E402
from billing.tokens import create_token  # noqa: E402
from composition.broker.configured import configured_broker  # noqa: E402
from composition.lifecycle.processes import ProcessComponent  # noqa: E402
from composition.testing import free_port, subprocess_env  # noqa: E402

CLIENTS = int(os.environ.get("BENCH_CLIENTS", "32"))
ROUND_S = float(os.environ.get("BENCH_ROUND_S", "2.5"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "10"))  # per side
THROUGHPUT_GOAL, P99_GOAL = 0.6, 1.5
AMOUNT = 700


def percentile(samples: list[float], share: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def _invoices(count: int, tag: str) -> list[int]:
    Invoice.objects.bulk_create([Invoice(number=f"P{tag}-{index}", customer="Bench", amount_cents=AMOUNT)
                                 for index in range(count)], batch_size=2000)
    return list(Invoice.objects.filter(number__startswith=f"P{tag}-").values_list("pk", flat=True))


class OutOfInvoices(Exception):
    pass


def _round(url_of: str, ids: Iterator[int], token: str, tag: str) -> tuple[int, list[float], int]:
    """Pay for ROUND_S seconds from CLIENTS threads; (payments made, latencies, failures).
    Raises OutOfInvoices when the side's invoices ran out (its rate would be capped, not measured)."""
    configured_broker().flush("billing")  # the receipt jobs of the rounds before (no worker takes them)
    lock = threading.Lock()
    latencies: list[float] = []
    counts = {"ok": 0, "failed": 0, "out": 0}
    deadline = time.monotonic() + ROUND_S

    def client() -> None:
        while time.monotonic() < deadline:
            with lock:
                invoice_id = next(ids, None)
                if invoice_id is None:
                    counts["out"] += 1
                    return
            request = urllib.request.Request(
                url_of.format(invoice_id), method="POST",
                data=json.dumps({"payment_id": f"{tag}-{invoice_id}", "amount_cents": AMOUNT}).encode(),
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
            began = time.perf_counter()
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    ok = response.status == 201
            except (urllib.error.URLError, OSError):
                ok = False
            took = time.perf_counter() - began
            with lock:
                latencies.append(took)
                counts["ok" if ok else "failed"] += 1

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if counts["out"]:
        raise OutOfInvoices(f"{url_of}: the invoices ran out; raise the number made per side")
    return counts["ok"], latencies, counts["failed"]


def _vacuum() -> None:
    """VACUUM (ANALYZE) what the two sides write, so a run does not pay for the dead rows of the
    runs before it (see the module doc), then CHECKPOINT."""
    from django.db import connection

    from composition.cache.models import PendingInvalidation
    from composition.outbox import OutboxMessage

    tables = ", ".join(connection.ops.quote_name(model._meta.db_table)
                       for model in (Invoice, Payment, OutboxMessage, PendingInvalidation))
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM (ANALYZE) {tables}")
        # And a checkpoint now rather than one falling due during some rounds: the first write
        # to each page after a checkpoint logs the whole page, slowing whichever side runs then.
        cursor.execute("CHECKPOINT")


def main() -> int:
    _vacuum()
    tag = time.strftime("%H%M%S")
    user = get_user_model().objects.create_superuser(f"bench-pay-{tag}", f"b{tag}@example.invalid", "unused")
    token = create_token(user, "bench")[1]
    # More invoices than the rounds can pay (a few hundred per second per side), warm-up included.
    per_side = int(600 * ROUND_S) * (ROUNDS + 1)
    sides = {"library": iter(_invoices(per_side, f"L{tag}")), "plain": iter(_invoices(per_side, f"B{tag}"))}
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = subprocess_env(DJANGO_SETTINGS_MODULE="_pay_settings", PYTHONPATH=f"{BENCH}:{ROOT}",
                         WEB_CONCURRENCY="2", WEB_THREADS="16", LOG_LEVEL="WARNING")
    web = ProcessComponent("web", [sys.executable, "-m", "gunicorn", "project.wsgi:application", "--config",
                                   "python:project.gunicorn_conf", "--bind", f"127.0.0.1:{port}"],
                           env=env, cwd=str(ROOT), ready_url=f"{base}/readyz")
    urls = {"library": base + "/api/invoices/{}/pay", "plain": base + "/bench/plain/{}/pay"}
    results: dict[str, dict[str, list]] = {side: {"paid": [], "latencies": [], "failed": []} for side in urls}
    web.start()
    try:
        for side in urls:  # warm up both paths
            _round(urls[side], sides[side], token, f"warm-{side}-{tag}")
        for index in range(ROUNDS * 2):
            side = ("library", "plain", "plain", "library")[index % 4]  # each side's rounds even at any ROUNDS
            paid, latencies, failed = _round(urls[side], sides[side], token, f"{side}-{tag}")
            results[side]["paid"].append(paid)
            results[side]["latencies"] += latencies
            results[side]["failed"].append(failed)
    except OutOfInvoices as exc:
        print(exc, file=sys.stderr)
        return 2
    finally:
        web.stop(20)
        configured_broker().flush("billing")
    summary = {}
    for side, result in results.items():
        rate = sum(result["paid"]) / (ROUND_S * ROUNDS)
        p50, p99 = percentile(result["latencies"], 0.5), percentile(result["latencies"], 0.99)
        summary[side] = (rate, p99)
        print(f"{side:<8} {rate:8.1f} payments/s  p50 {p50 * 1e3:6.1f} ms  p99 {p99 * 1e3:6.1f} ms  "
              f"failed {sum(result['failed'])}")
        print(f"{'':<8} rounds: {' '.join(f'{paid / ROUND_S:.0f}' for paid in result['paid'])}")
    throughput = summary["library"][0] / summary["plain"][0]
    p99 = summary["library"][1] / summary["plain"][1]
    ok = throughput >= THROUGHPUT_GOAL and p99 <= P99_GOAL and not any(sum(r["failed"]) for r in results.values())
    print(f"pay through the library vs a plain view, {CLIENTS} clients: throughput {throughput:.2f}x "
          f"(goal >= {THROUGHPUT_GOAL}x), p99 {p99:.2f}x (goal <= {P99_GOAL}x) {'ok' if ok else 'OVER GOAL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
