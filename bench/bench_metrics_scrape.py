"""Scrape time of a multiprocess directory after 50 worker processes came and went, against a
fresh directory; and the totals, unchanged by their deaths.

Two directories hold the files of LIVE worker processes running now, doing the same writes:

- fresh: only those;
- churned: those, plus CHURN (50) worker processes started, run and stopped in batches by a
  supervisor built as runworkers' is (``ProcessComponent`` children whose exit hook archives the
  files of each child it reaps).

Each worker process writes what a runworkers process writes (composition.testing.metric_writer:
jobs by actor and outcome, their durations, the in-progress gauge, the heartbeat, component
start times). Before and after each batch stops, the churned directory's totals are compared:
they must not change. Then a scrape (the merged, locked collector rendered as /metrics renders
it) of each directory is timed, alternating, fastest round kept (bench/_util.py); the ratio
churned/fresh is the result (goal <= 2x). For scale, it also prints what the churned scrape would
cost had the dead processes' files been kept instead of archived.

Run: .venv/bin/python bench/bench_metrics_scrape.py   (no database or broker needed)
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)  # this process only reads the directories

from _util import compare, report
from prometheus_client import CollectorRegistry, generate_latest

from composition.lifecycle.processes import ProcessComponent
from composition.lifecycle.system import System
from composition.prometheus import LockedMultiProcessCollector
from composition.prometheus.archive import archive_processes
from composition.prometheus.directory import process_files
from composition.testing import wait_until
from composition.testing.metric_writer import expected_jobs, writer_argv

CHURN = int(os.environ.get("BENCH_CHURN", "50"))
BATCH = int(os.environ.get("BENCH_BATCH", "10"))
LIVE = int(os.environ.get("BENCH_LIVE", "2"))
JOBS = int(os.environ.get("BENCH_JOBS", "60"))  # per process: every actor and outcome
CALLS = int(os.environ.get("BENCH_CALLS", "20"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "15"))
GOAL = 2.0
START_TIMEOUT_S = 60.0

structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def registry(directory: Path) -> CollectorRegistry:
    result = CollectorRegistry()
    result.register(LockedMultiProcessCollector(directory))
    return result


def totals(directory: Path) -> dict[tuple[str, str], float]:
    """Every counter and histogram sample of a scrape of ``directory``."""
    return {(sample.name, str(sorted(sample.labels.items()))): sample.value
            for metric in registry(directory).collect() if metric.type in ("counter", "histogram")
            for sample in metric.samples}


def jobs_total(directory: Path) -> float:
    return sum(value for (name, _), value in totals(directory).items() if name == "composition_jobs_total")


def workers(directory: Path, count: int) -> tuple[System, list[ProcessComponent]]:
    """``count`` worker processes writing in ``directory``, as runworkers' supervisor runs them:
    each child's files are archived once it has been reaped."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    children = [ProcessComponent(f"worker-process-{index}", writer_argv(JOBS, stay=True, test_gauges=False),
                                 env=env, on_exit=lambda pid: archive_processes(directory, [pid]))
                for index in range(count)]
    return System(children, shutdown_timeout_s=30.0), children


def pids(children: list[ProcessComponent]) -> set[int]:
    return {child.process.pid for child in children if child.process is not None}


def start(system: System, directory: Path, expected_jobs_total: float) -> None:
    system.start()
    wait_until(lambda: jobs_total(directory) == expected_jobs_total, START_TIMEOUT_S,
               message=f"workers did not write their metrics in {directory}")


def main() -> int:
    per_process = sum(expected_jobs(JOBS).values())
    root = Path(tempfile.mkdtemp(prefix="bench-metrics-"))
    fresh, churned, kept = root / "fresh", root / "churned", root / "unarchived"
    for directory in (fresh, churned, kept):
        directory.mkdir()
    live_systems: list[System] = []
    live_pids: set[int] = set()
    ok = True
    try:
        for directory in (fresh, churned):
            live, children = workers(directory, LIVE)
            live_systems.append(live)
            start(live, directory, LIVE * per_process)
            live_pids |= pids(children)

        began = time.monotonic()
        stopped = 0
        while stopped < CHURN:
            count = min(BATCH, CHURN - stopped)
            batch, children = workers(churned, count)
            start(batch, churned, (LIVE + stopped + count) * per_process)
            before = totals(churned)
            # The same files, never archived: what the directory would be without the archive.
            batch_pids = pids(children)
            for file in process_files(churned):
                if file.pid in batch_pids:
                    shutil.copy2(file.path, kept / file.path.name)
            failed = [result for result in batch.stop() if result.status != "stopped"]
            if failed:
                print(f"batch stop problems: {failed}")
                ok = False
            after = totals(churned)
            # Counts are exact; a histogram's _sum is a float sum, now added in another order.
            changed = {key for key in before.keys() | after.keys()
                       if not math.isclose(before.get(key, math.nan), after.get(key, math.nan), rel_tol=1e-12)}
            if changed:
                print(f"TOTALS CHANGED when batch {stopped // BATCH + 1} stopped: {sorted(changed)[:5]}")
                ok = False
            stopped += count
        churn_s = time.monotonic() - began
        for file in process_files(churned):  # the living ones, as the unarchived directory has them too
            shutil.copy2(file.path, kept / file.path.name)

        dead_left = [f for f in process_files(churned) if f.pid not in live_pids]
        expected = (LIVE + CHURN) * per_process
        final = jobs_total(churned)
        print(f"churn={CHURN} (batches of {BATCH}, {churn_s:.1f}s) live={LIVE} jobs/process={per_process:.0f}")
        print(f"files: fresh={len(os.listdir(fresh)) - 1} churned={len(os.listdir(churned)) - 1} "
              f"unarchived={len(os.listdir(kept))}; dead processes' files left in churned: {len(dead_left)}")
        print(f"composition_jobs_total: churned={final:.0f} expected={expected:.0f} "
              f"(live + dead) -> {'unchanged' if final == expected and ok else 'WRONG'}")
        ok = ok and final == expected and not dead_left

        churned_s, fresh_s = compare(lambda: generate_latest(registry(churned)),
                                     lambda: generate_latest(registry(fresh)), calls=CALLS, rounds=ROUNDS)
        ok = report(f"scrape after {CHURN} workers came and went", "a fresh directory", churned_s, fresh_s, GOAL) and ok
        kept_s, fresh_again_s = compare(lambda: generate_latest(registry(kept)),
                                        lambda: generate_latest(registry(fresh)), calls=CALLS,
                                        rounds=max(3, ROUNDS // 3))
        print(f"(for scale, without the archive: {kept_s / fresh_again_s:.2f}x)")
    finally:
        for live in live_systems:
            live.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
