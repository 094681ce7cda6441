"""``runworkers`` throughput on a no-op job against the plain ``dramatiq`` command, same threads.

Both drain the same pre-filled Redis queue (the no-op job of tests.jobsapp); the rate is taken
between the first 5 % consumed and the queue's last message acknowledged, so process start-up
(Django's is longer) is not counted. Each contender runs ROUNDS times, alternating, best kept.
Prints both rates and their ratio (goal: >= 0.9). Then what each costs idle, on the same queue:
CPU per second and Redis commands per second (Redis's own count, script commands included:
nothing else may use that Redis meanwhile), measured for IDLE_S after start-up; no goal.

Run: DATABASE_URL=... REDIS_URL=... .venv/bin/python bench/bench_workers.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
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
IDLE_S = float(os.environ.get("BENCH_IDLE_S", "10"))
IDLE_SETTLE_S = 5.0  # start-up, and the first polls' back-off, not counted
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def fill(broker) -> None:  # type: ignore[no-untyped-def]
    broker.flush(QUEUE)
    for _ in range(MESSAGES):
        broker.enqueue(jobs.noop.message())


def pending(broker) -> int:  # type: ignore[no-untyped-def]
    return int(broker.client.hlen(f"{broker.namespace}:{QUEUE}.msgs"))


@contextmanager
def running(argv: list[str], env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """``argv`` in its own process group, stopped (SIGTERM, then SIGKILL) on leaving."""
    process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        yield process
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def measure(argv: list[str], env: dict[str, str]) -> float:
    """Messages per second while ``argv`` drains the pre-filled queue."""
    broker = configured_broker()
    fill(broker)
    with running(argv, env):
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


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` so far (Linux /proc)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / _TICKS_PER_S


def idle_cost(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(CPU ms per second, Redis commands per second) of ``argv`` consuming an empty queue."""
    broker = configured_broker()
    broker.flush(QUEUE)
    with running(argv, env) as process:
        time.sleep(IDLE_SETTLE_S)
        listed = subprocess.run(["pgrep", "-g", str(process.pid)], capture_output=True, text=True).stdout
        pids = [int(pid) for pid in listed.split()]
        cpu_before, commands_before = _cpu_s(pids), int(broker.client.info("stats")["total_commands_processed"])
        began = time.monotonic()
        time.sleep(IDLE_S)
        took_s = time.monotonic() - began
        cpu, commands = _cpu_s(pids) - cpu_before, int(broker.client.info("stats")["total_commands_processed"])
        # Less the INFO call itself.
        return cpu * 1000 / took_s, (commands - commands_before - 1) / took_s


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
    for name, argv in (("dramatiq", plain), ("runworkers", composed)):
        cpu_ms, commands = idle_cost(argv, env)
        print(f"idle {name:10s}: {cpu_ms:5.1f} ms CPU/s, {commands:6.1f} Redis commands/s (over {IDLE_S:.0f} s)")
    configured_broker().flush(QUEUE)
    return 0 if ratio >= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
