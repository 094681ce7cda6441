"""A process that writes to the multiprocess directory what a worker process writes, for tests
and benchmarks of the metrics archive:

    PROMETHEUS_MULTIPROC_DIR=... python -m composition.testing.metric_writer --jobs 10 --value 3

Every figure is a function of the arguments, so a test knows the totals to expect (``expected_jobs``).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

from prometheus_client import Gauge

from composition import metrics

__all__ = ["ACTORS", "COMPONENTS", "GAUGE_MODES", "OUTCOMES", "expected_jobs", "main", "run_writer",
           "writer_argv"]

ACTORS = ("send_payment_receipt", "relay_outbox", "reconcile", "notify")
OUTCOMES = ("success", "retry", "dead")
COMPONENTS = ("logging", "metrics", "database", "cache", "broker", "workers", "outbox-relay",
              "cache-invalidation-replay", "retention", "heartbeat")
GAUGE_MODES = ("all", "liveall", "min", "livemin", "max", "livemax", "sum", "livesum", "mostrecent",
               "livemostrecent")


def _gauge(mode: str) -> Gauge:
    """A test-only gauge in ``mode`` (composition.metrics defines none in min, sum or all mode),
    created only when used, so that a plain writer writes only what a worker writes."""
    return Gauge(f"testing_gauge_{mode}", f"A test gauge in {mode} mode.", multiprocess_mode=cast(Any, mode))


def expected_jobs(jobs: int) -> dict[tuple[str, str], float]:
    """(actor, outcome) -> the count one writer of ``--jobs jobs`` adds to composition_jobs_total."""
    counts: dict[tuple[str, str], float] = {}
    for run in range(jobs):
        key = (ACTORS[run % len(ACTORS)], OUTCOMES[run % len(OUTCOMES)])
        counts[key] = counts.get(key, 0.0) + 1.0
    return counts


def writer_argv(jobs: int, value: float = 1.0, *, stay: bool = False, announce: bool = False,
                test_gauges: bool = True) -> list[str]:
    """The command line of one writer process."""
    flags = {"--stay": stay, "--announce": announce, "--test-gauges": test_gauges}
    return [sys.executable, "-m", __name__, "--jobs", str(jobs), "--value", str(value),
            *(flag for flag, wanted in flags.items() if wanted)]


def run_writer(directory: Path | str, jobs: int, value: float = 1.0) -> int:
    """Run one writer (test gauges included) to its end in ``directory``; return its pid (a dead
    process's, now)."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    with subprocess.Popen(writer_argv(jobs, value), env=env) as process:
        code = process.wait(60)
    if code != 0:
        raise RuntimeError(f"metric writer exited with code {code}")
    return process.pid


def write(jobs: int, value: float, *, test_gauges: bool) -> None:
    for name in COMPONENTS:
        metrics.COMPONENT_START_SECONDS.labels(name).observe(0.01)
    for run in range(jobs):
        actor = ACTORS[run % len(ACTORS)]
        metrics.JOBS_TOTAL.labels(actor, OUTCOMES[run % len(OUTCOMES)]).inc()
        metrics.JOB_DURATION_SECONDS.labels(actor).observe((run % 7) * 0.05)
    for actor in ACTORS:
        metrics.JOBS_IN_PROGRESS.labels(actor).set(1)
    metrics.WORKER_HEARTBEAT_TIMESTAMP.labels("worker").set(time.time())
    if test_gauges:
        for mode in GAUGE_MODES:
            _gauge(mode).set(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--value", type=float, default=1.0)
    parser.add_argument("--stay", action="store_true", help="wait for SIGTERM after writing")
    parser.add_argument("--announce", action="store_true", help='print "ready" once written')
    parser.add_argument("--test-gauges", action="store_true", help="also one gauge per multiprocess mode")
    args = parser.parse_args(argv)
    write(args.jobs, args.value, test_gauges=args.test_gauges)
    if args.announce:
        print("ready", flush=True)
    if args.stay:
        while True:  # SIGTERM's default action ends the process, as a crash would: no clean-up
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
