"""``runworkers`` throughput on a no-op job against the plain ``dramatiq`` command, same threads.

Both drain the same pre-filled Redis queue (the no-op job of tests.jobsapp); the rate is taken
between the first 5 % consumed and the queue's last message acknowledged, so process start-up
(Django's is longer) is not counted. Each contender runs ROUNDS times, alternating, best kept.
Prints both rates and their ratio (goal: >= 0.9).

Run: DATABASE_URL=... REDIS_URL=... .venv/bin/python bench/bench_workers.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("LOG_LEVEL", "WARNING")

from _util import setup_django  # noqa: E402

setup_django("tests.settings")

from composition.broker.configured import configured_broker  # noqa: E402
from composition.conf import conf  # noqa: E402
from tests.jobsapp import jobs  # noqa: E402

MESSAGES = int(os.environ.get("BENCH_MESSAGES", "10000"))
THREADS = os.environ.get("BENCH_THREADS", "4")
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "2"))
QUEUE = jobs.NOOP_QUEUE
POLL_S = 0.005
START_FRACTION = 0.05
TIMEOUT_S = 120.0
GOAL = 0.9


def fill(broker) -> None:  # type: ignore[no-untyped-def]
    broker.flush(QUEUE)
    for _ in range(MESSAGES):
        broker.enqueue(jobs.noop.message())


def pending(broker) -> int:  # type: ignore[no-untyped-def]
    return int(broker.client.hlen(f"{broker.namespace}:{QUEUE}.msgs"))


def measure(argv: list[str], env: dict[str, str]) -> float:
    """Messages per second while ``argv`` drains the pre-filled queue."""
    broker = configured_broker()
    fill(broker)
    process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        start_at = int(MESSAGES * (1 - START_FRACTION))
        began = None
        while time.monotonic() < deadline:
            left = pending(broker)
            if began is None and left <= start_at:
                began, left_at_start = time.monotonic(), left
            if left == 0 and began is not None:
                return left_at_start / (time.monotonic() - began)
            time.sleep(POLL_S)
        raise RuntimeError(f"{argv[:3]} did not drain {MESSAGES} messages in {TIMEOUT_S:.0f}s")
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def main() -> int:
    env = dict(os.environ, BENCH_BROKER_URL=conf.BROKER_URL, BENCH_QUEUE=QUEUE)
    composed = [sys.executable, "manage.py", "runworkers", "--processes", "1", "--threads", THREADS,
                "--queues", QUEUE]
    plain = [str(Path(sys.executable).parent / "dramatiq"), "bench._workers_baseline", "--processes", "1",
             "--threads", THREADS, "--queues", QUEUE]
    runworkers_rates, dramatiq_rates = [], []
    for _ in range(ROUNDS):
        dramatiq_rates.append(measure(plain, env))
        runworkers_rates.append(measure(composed, env))
    best_composed, best_plain = max(runworkers_rates), max(dramatiq_rates)
    print(f"messages={MESSAGES} threads={THREADS} rounds={ROUNDS}")
    print(f"dramatiq   : {best_plain:8.0f} msg/s  (rounds: {', '.join(f'{r:.0f}' for r in dramatiq_rates)})")
    print(f"runworkers : {best_composed:8.0f} msg/s  (rounds: {', '.join(f'{r:.0f}' for r in runworkers_rates)})")
    ratio = best_composed / best_plain
    print(f"ratio runworkers/dramatiq = {ratio:.2f} (goal >= {GOAL}): {'goal met' if ratio >= GOAL else 'MISSED'}")
    configured_broker().flush(QUEUE)
    return 0 if ratio >= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
