"""Commit -> enqueued latency of the outbox at 500 messages/s, through a real ``runworkers``.

The benchmark publishes one message per transaction at a steady 500/s for 10 s while a real
``manage.py runworkers`` process (relay actor fed by after-commit nudges, plus the sweeper) relays
them to the Redis broker. For each message, latency = the relay's ``sent_at`` (taken right after
the broker accepted the batch) minus the moment the publishing transaction committed (an
``on_commit`` hook registered before ``publish()``, so it runs before the nudge is sent).

Targets: p50 <= 20 ms, p99 <= 100 ms. Run: ``python bench/bench_relay_latency.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
from _util import setup_django  # noqa: E402

setup_django()

import dramatiq  # noqa: E402
from django.db import connections, transaction  # noqa: E402

from composition.broker.configured import configured_broker  # noqa: E402
from composition.outbox import OutboxMessage, publish  # noqa: E402

RATE_PER_S = float(os.environ.get("BENCH_RATE", "500"))
DURATION_S = float(os.environ.get("BENCH_DURATION_S", "10"))
WORKER_THREADS = 2
# Publishing threads (a web server's concurrent requests); one alone cannot keep up on a small box.
PUBLISHERS = 2
QUEUE = "bench_relay_latency"
P50_TARGET_MS, P99_TARGET_MS = 20.0, 100.0


def bench_noop(seq: int) -> None:
    """Never consumed: the benchmark measures getting messages onto the broker."""


def percentile(sorted_values: list[float], fraction: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(fraction * (len(sorted_values) - 1))))
    return sorted_values[index]


def wait_sent(ids: list[int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while OutboxMessage.objects.filter(id__in=ids, status="pending").exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"messages still pending after {timeout_s:.0f} s")
        time.sleep(0.1)


def main() -> int:
    broker = configured_broker()
    actor = dramatiq.actor(actor_name="bench_latency_noop", queue_name=QUEUE, broker=broker)(bench_noop)
    broker.flush(QUEUE)
    OutboxMessage.objects.filter(queue_name=QUEUE).delete()

    log = tempfile.NamedTemporaryFile(prefix="bench-runworkers-", suffix=".log", delete=False)  # noqa: SIM115
    worker = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "runworkers", "--threads", str(WORKER_THREADS)],
        env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        warm = [publish(actor, {"seq": -1}).pk]
        wait_sent(warm, 60)
        for seq in range(20):  # let the relay's connections and caches settle
            warm.append(publish(actor, {"seq": -2 - seq}).pk)
            time.sleep(0.01)
        wait_sent(warm, 30)

        total = int(RATE_PER_S * DURATION_S)
        committed_at: dict[int, float] = {}
        began = time.perf_counter() + 0.1

        def publisher(first: int) -> None:
            # Message seq is due at began + seq / rate; publishers take every PUBLISHERS-th one.
            try:
                for seq in range(first, total, PUBLISHERS):
                    delay = began + seq / RATE_PER_S - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                    stamp: list[float] = []
                    with transaction.atomic():
                        transaction.on_commit(lambda stamp=stamp: stamp.append(time.time()))  # type: ignore[misc]
                        row = publish(actor, {"seq": seq})
                    committed_at[row.pk] = stamp[0]
            finally:
                connections.close_all()

        threads = [threading.Thread(target=publisher, args=(n,)) for n in range(PUBLISHERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        publish_s = time.perf_counter() - began
        wait_sent(list(committed_at), 60)
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(60)
        log.close()

    sent = dict(OutboxMessage.objects.filter(id__in=list(committed_at)).values_list("id", "sent_at"))
    latencies_ms = sorted(max(0.0, (sent[pk].timestamp() - committed_at[pk]) * 1000)  # type: ignore[union-attr]
                          for pk in committed_at)
    p50, p90, p99 = (percentile(latencies_ms, f) for f in (0.5, 0.9, 0.99))
    broker.flush(QUEUE)
    OutboxMessage.objects.filter(queue_name=QUEUE).delete()
    print(f"published {total} messages in {publish_s:.2f} s ({total / publish_s:,.0f}/s, target "
          f"{RATE_PER_S:.0f}/s), one per transaction from {PUBLISHERS} threads; "
          f"relay: runworkers --threads {WORKER_THREADS}")
    print(f"commit -> enqueued latency: p50 {p50:.1f} ms, p90 {p90:.1f} ms, p99 {p99:.1f} ms, "
          f"max {latencies_ms[-1]:.1f} ms")
    ok = p50 <= P50_TARGET_MS and p99 <= P99_TARGET_MS
    print(f"targets p50 <= {P50_TARGET_MS:.0f} ms ({p50 / P50_TARGET_MS:.2f} of target), "
          f"p99 <= {P99_TARGET_MS:.0f} ms ({p99 / P99_TARGET_MS:.2f} of target): {'met' if ok else 'MISSED'}")
    print(f"runworkers log: {log.name}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
