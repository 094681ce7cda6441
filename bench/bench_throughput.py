"""End-to-end job throughput through the outbox, against a naive ``on_commit(actor.send)``.

5,000 jobs, published 100 per transaction while one real ``runworkers`` (1 process x 8 threads,
Redis broker) consumes them; the rate runs from the first commit to the last job body. On a
small machine the publisher, the worker, PostgreSQL and Redis share the CPU, so CPU per job is
printed beside the rate: the publisher's (this process, publishing only) and the worker's.

- outbox: ``publish(bench_stamp, ...)`` 100 times in one transaction;
- outbox, ``idempotent=True``: the same job under the inbox ledger;
- baseline: ``transaction.on_commit(lambda: bench_stamp.send(...))`` 100 times;
- the same pair with a database effect: ``bench_effect`` (one row in its own transaction) on the
  naive path against ``bench_effect_idempotent`` (the row and the ledger row in one commit)
  through the outbox.

Goals (issue 9): plain jobs >= 1.0x the baseline, idempotent >= 0.8x. The ledger is a database
commit per job, so a stamp job, whose only database work is then the ledger's, compares a
commit against none (printed, as "outbox idempotent"); the jobs the ledger is for write rows,
and for those the goal compares like with like ("outbox idempotent, db effect" against
"on_commit, db effect").
Exit status 1 when a goal is missed.
Run: ``python bench/bench_throughput.py`` (env BENCH_JOBS, default 5000).
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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("LOG_LEVEL", "WARNING")
from _util import setup_django  # noqa: E402

setup_django("tests.settings")

import psutil  # noqa: E402
import redis  # noqa: E402
from django.conf import settings  # noqa: E402
from django.db import transaction  # noqa: E402

from composition.broker import configured_broker  # noqa: E402
from composition.jobs.models import ProcessedMessage  # noqa: E402
from composition.outbox import OutboxMessage, publish  # noqa: E402
from composition.outbox.relay import RELAY_QUEUE_NAME  # noqa: E402
from tests.jobsapp import jobs  # noqa: E402
from tests.jobsapp.models import Effect  # noqa: E402

JOBS = int(os.environ.get("BENCH_JOBS", "5000"))
PER_TRANSACTION = 100
# name: (goal, the baseline's name)
GOALS = {"outbox": (1.0, "on_commit"), "outbox idempotent, db effect": (0.8, "on_commit, db effect")}
# Printed for the breakdown: the outbox's share of the cost (its rows) apart from the ledger's.
BASELINES = {"outbox idempotent": "on_commit", "outbox, db effect": "on_commit, db effect"}


def outbox(actor: Any) -> Callable[[int], None]:
    return lambda seq: publish(actor, {"seq": seq})


def on_commit(actor: Any) -> Callable[[int], None]:
    return lambda seq: transaction.on_commit(lambda: actor.send(seq=seq))


def run(name: str, send: Callable[[int], None], client: redis.Redis, worker: psutil.Process) -> dict[str, float]:
    client.delete(jobs.BENCH_STAMPS_KEY)
    worker_cpu = sum(worker.cpu_times()[:2])
    publisher_cpu = 0.0
    began = time.time()
    for start in range(0, JOBS, PER_TRANSACTION):
        cpu = time.process_time()
        with transaction.atomic():
            for seq in range(start, min(JOBS, start + PER_TRANSACTION)):
                send(seq)
        publisher_cpu += time.process_time() - cpu
    deadline = time.monotonic() + 300
    while client.llen(jobs.BENCH_STAMPS_KEY) < JOBS:
        if time.monotonic() > deadline:
            raise SystemExit(f"{name}: only {client.llen(jobs.BENCH_STAMPS_KEY)} of {JOBS} jobs ran")
        time.sleep(0.05)
    last = max(float(raw.split()[1]) for raw in client.lrange(jobs.BENCH_STAMPS_KEY, 0, -1))
    return {"rate": JOBS / (last - began), "publisher_ms": publisher_cpu / JOBS * 1000,
            "worker_ms": (sum(worker.cpu_times()[:2]) - worker_cpu) / JOBS * 1000}


def main() -> int:
    broker = configured_broker()
    client = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    for queue in (jobs.BENCH_QUEUE, RELAY_QUEUE_NAME):
        broker.flush(queue)
    OutboxMessage.objects.filter(queue_name=jobs.BENCH_QUEUE).delete()

    log = tempfile.NamedTemporaryFile(prefix="bench-throughput-", suffix=".log", delete=False)  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "runworkers", "--processes", "1", "--threads", "8"],
        cwd=ROOT, env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    results: dict[str, dict[str, float]] = {}
    try:
        worker = psutil.Process(process.pid)
        time.sleep(3)  # past Django's start-up
        contenders = [("on_commit", on_commit(jobs.bench_stamp)), ("outbox", outbox(jobs.bench_stamp)),
                      ("outbox idempotent", outbox(jobs.bench_stamp_idempotent)),
                      ("on_commit, db effect", on_commit(jobs.bench_effect)),
                      ("outbox, db effect", outbox(jobs.bench_effect)),
                      ("outbox idempotent, db effect", outbox(jobs.bench_effect_idempotent))]
        for name, send in contenders:
            results[name] = run(name, send, client, worker)
            OutboxMessage.objects.filter(queue_name=jobs.BENCH_QUEUE).delete()
            ProcessedMessage.objects.filter(actor__startswith="bench_").delete()
            Effect.objects.filter(key__startswith="bench-effect-").delete()
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(60)
        log.close()
        client.delete(jobs.BENCH_STAMPS_KEY)

    print(f"{JOBS} jobs, {PER_TRANSACTION} per transaction, runworkers 1 process x 8 threads, Redis broker")
    missed = []
    for name, result in results.items():
        goal, baseline = GOALS.get(name, (None, BASELINES.get(name)))
        verdict = ""
        if baseline is not None:
            ratio = result["rate"] / results[baseline]["rate"]
            verdict = f" {ratio:.2f}x {baseline}"
            if goal is not None:
                verdict += f" (goal >= {goal}x): {'met' if ratio >= goal else 'MISSED'}"
                if ratio < goal:
                    missed.append(name)
        print(f"{name:>28}: {result['rate']:7,.0f} jobs/s, publisher CPU {result['publisher_ms']:.2f} ms/job, "
              f"worker CPU {result['worker_ms']:.2f} ms/job{verdict}")
    print(f"runworkers log: {log.name}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
