"""Commit -> job body start, through the outbox, against a naive ``on_commit(actor.send)``.

One real ``manage.py runworkers`` (1 process x 8 threads, Redis broker) serves both paths. The
publisher commits one job per transaction at a steady rate; each job's body notes when it
started (a Redis list), and latency is that moment minus the commit (an ``on_commit`` hook
registered first, so it runs right after COMMIT). The two paths run in alternating phases so
drift and noisy neighbours hit both alike.

- outbox: ``publish(bench_stamp, {"seq": n})`` inside the transaction;
- baseline: ``transaction.on_commit(lambda: bench_stamp.send(seq=n))``.

Goal (issue 9): p50 and p99 <= 1.2x the baseline. Run: ``python bench/bench_job_latency.py``
(env: BENCH_RATE jobs/s, default 50; BENCH_DURATION_S per path, default 20).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("LOG_LEVEL", "WARNING")
from _util import setup_django  # noqa: E402

setup_django("tests.settings")

import redis  # noqa: E402
from django.conf import settings  # noqa: E402
from django.db import transaction  # noqa: E402

from composition.broker.configured import configured_broker  # noqa: E402
from composition.outbox import OutboxMessage, publish  # noqa: E402
from composition.outbox.relay import RELAY_QUEUE_NAME  # noqa: E402
from tests.jobsapp import jobs  # noqa: E402

RATE_PER_S = float(os.environ.get("BENCH_RATE", "50"))
DURATION_S = float(os.environ.get("BENCH_DURATION_S", "20"))
PHASES = 4  # per path, alternating
RATIO_GOAL = 1.2
STRETCH_P50_MS = 5.0
STRETCH_P99_MS = 30.0


def percentile(sorted_values: list[float], fraction: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(fraction * (len(sorted_values) - 1))))
    return sorted_values[index]


def via_outbox(seq: int) -> None:
    publish(jobs.bench_stamp, {"seq": seq})


def via_on_commit(seq: int) -> None:
    transaction.on_commit(lambda: jobs.bench_stamp.send(seq=seq))


def run_phase(send: Callable[[int], None], first_seq: int, count: int, committed_at: dict[int, float]) -> None:
    began = time.perf_counter()
    for index in range(count):
        delay = began + index / RATE_PER_S - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        seq = first_seq + index
        with transaction.atomic():
            transaction.on_commit(lambda seq=seq: committed_at.__setitem__(seq, time.time()))  # type: ignore[misc]
            send(seq)


def collect(client: redis.Redis, expected: int, timeout_s: float = 60) -> dict[int, float]:
    deadline = time.monotonic() + timeout_s
    while client.llen(jobs.BENCH_STAMPS_KEY) < expected:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {client.llen(jobs.BENCH_STAMPS_KEY)} of {expected} jobs ran")
        time.sleep(0.1)
    started: dict[int, float] = {}
    for raw in client.lrange(jobs.BENCH_STAMPS_KEY, 0, -1):
        seq, at = raw.decode().split()
        started.setdefault(int(seq), float(at))
    return started


def main() -> int:
    broker = configured_broker()
    client = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    for queue in (jobs.BENCH_QUEUE, RELAY_QUEUE_NAME):
        broker.flush(queue)
    client.delete(jobs.BENCH_STAMPS_KEY)
    OutboxMessage.objects.filter(queue_name=jobs.BENCH_QUEUE).delete()

    log = tempfile.NamedTemporaryFile(prefix="bench-job-latency-", suffix=".log", delete=False)  # noqa: SIM115
    worker = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "runworkers", "--processes", "1", "--threads", "8"],
        cwd=ROOT, env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    committed_at: dict[int, float] = {}
    path_of: dict[int, str] = {}
    try:
        # Warm up both paths (connections, scripts, the worker's first polls).
        warm: dict[int, float] = {}
        run_phase(via_outbox, -1000, 20, warm)
        run_phase(via_on_commit, -2000, 20, warm)
        collect(client, 40)
        client.delete(jobs.BENCH_STAMPS_KEY)

        per_phase = int(RATE_PER_S * DURATION_S / PHASES)
        seq = 0
        for phase in range(2 * PHASES):
            name, send = ("outbox", via_outbox) if phase % 2 == 0 else ("on_commit", via_on_commit)
            run_phase(send, seq, per_phase, committed_at)
            path_of.update(dict.fromkeys(range(seq, seq + per_phase), name))
            seq += per_phase
        started = collect(client, seq)
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(60)
        log.close()
        client.delete(jobs.BENCH_STAMPS_KEY)
        OutboxMessage.objects.filter(queue_name=jobs.BENCH_QUEUE).delete()

    results: dict[str, tuple[float, float]] = {}
    for name in ("outbox", "on_commit"):
        latencies = sorted((started[n] - committed_at[n]) * 1000 for n in path_of if path_of[n] == name)
        results[name] = (percentile(latencies, 0.5), percentile(latencies, 0.99))
        print(f"{name:>9}: commit -> job start p50 {results[name][0]:6.1f} ms, p99 {results[name][1]:6.1f} ms "
              f"({len(latencies)} jobs at {RATE_PER_S:.0f}/s)")
    p50_ratio = results["outbox"][0] / results["on_commit"][0]
    p99_ratio = results["outbox"][1] / results["on_commit"][1]
    ok = p50_ratio <= RATIO_GOAL and p99_ratio <= RATIO_GOAL
    print(f"ratio outbox/on_commit: p50 {p50_ratio:.2f}x, p99 {p99_ratio:.2f}x (goal <= {RATIO_GOAL}x): "
          f"{'met' if ok else 'MISSED'}")
    p50, p99 = results["outbox"]
    stretch = p50 <= STRETCH_P50_MS and p99 <= STRETCH_P99_MS
    print(f"outbox absolute: p50 {p50:.1f} ms, p99 {p99:.1f} ms (stretch: p50 <= {STRETCH_P50_MS:.0f} ms, "
          f"p99 <= {STRETCH_P99_MS:.0f} ms): {'met' if stretch else 'missed'}")
    print(f"runworkers log: {log.name}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
