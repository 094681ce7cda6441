"""A load generator for the billing API of a running server (``./run`` prints a token).

Each client loops: create an invoice, pay it, read it back; every call is timed. At the end it
prints, per operation and in all, requests per second, latency percentiles and the answers by
status (a 503 is backpressure shedding load, a 409 a lock that was busy: both are answers, not
failures; any 5xx other than 503 is a failure and makes the exit status 1).

Run: ``python bench/load.py --url http://127.0.0.1:8000 --token bil_... [--clients 16] [--seconds 20]``
(no Django needed: only the standard library).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter, defaultdict
from typing import Any


def percentile(samples: list[float], share: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else float("nan")


class Client:
    def __init__(self, base: str, token: str) -> None:
        self.base, self.token = base.rstrip("/"), token
        self.latencies: dict[str, list[float]] = defaultdict(list)
        self.statuses: dict[str, Counter[int]] = defaultdict(Counter)

    def call(self, op: str, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any] | None:
        request = urllib.request.Request(
            f"{self.base}{path}", method=method, data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        began = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, payload = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, payload = exc.code, exc.read()
        except OSError:
            status, payload = 0, b""  # no answer at all: counted as status 0
        self.latencies[op].append(time.perf_counter() - began)
        self.statuses[op][status] += 1
        return json.loads(payload) if 200 <= status < 300 and payload else None

    def run(self, deadline: float, tag: str) -> None:
        sequence = 0
        while time.monotonic() < deadline:
            sequence += 1
            created = self.call("create", "POST", "/api/invoices", {
                "number": f"L{tag}-{sequence}"[:32], "customer": "Load", "amount_cents": 1_000})
            if created is None:
                continue
            invoice_id = created["id"]
            self.call("pay", "POST", f"/api/invoices/{invoice_id}/pay",
                      {"payment_id": f"load-{tag}-{sequence}", "amount_cents": 1_000})
            self.call("get", "GET", f"/api/invoices/{invoice_id}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--token", required=True, help="a bearer token (manage.py create_api_token <user>)")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20.0)
    options = parser.parse_args()

    clients = [Client(options.url, options.token) for _ in range(options.clients)]
    run_id = uuid.uuid4().hex[:8]
    deadline = time.monotonic() + options.seconds
    began = time.perf_counter()
    threads = [threading.Thread(target=client.run, args=(deadline, f"{run_id}-{index}"))
               for index, client in enumerate(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began

    failures = 0
    print(f"{options.clients} clients, {elapsed:.1f} s against {options.url}")
    print(f"{'operation':<10}{'requests':>10}{'req/s':>10}{'p50 ms':>10}{'p90 ms':>10}{'p99 ms':>10}"
          f"{'mean ms':>10}  statuses")
    every: list[float] = []
    for op in ("create", "pay", "get"):
        samples = [value for client in clients for value in client.latencies[op]]
        statuses: Counter[int] = sum((client.statuses[op] for client in clients), Counter())
        failures += sum(count for status, count in statuses.items() if (status >= 500 and status != 503) or status == 0)
        every += samples
        if samples:
            print(f"{op:<10}{len(samples):>10}{len(samples) / elapsed:>10.1f}{percentile(samples, 0.5) * 1e3:>10.1f}"
                  f"{percentile(samples, 0.9) * 1e3:>10.1f}{percentile(samples, 0.99) * 1e3:>10.1f}"
                  f"{statistics.fmean(samples) * 1e3:>10.1f}  {dict(sorted(statuses.items()))}")
    if every:
        print(f"{'all':<10}{len(every):>10}{len(every) / elapsed:>10.1f}{percentile(every, 0.5) * 1e3:>10.1f}"
              f"{percentile(every, 0.9) * 1e3:>10.1f}{percentile(every, 0.99) * 1e3:>10.1f}"
              f"{statistics.fmean(every) * 1e3:>10.1f}")
    print(f"failures (5xx other than 503, or no answer): {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
