"""SIGTERM with slow jobs in flight: ``runworkers`` drains within its shutdown timeout, exits 0,
and every job either finished or runs again after a restart (without using an attempt)."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from composition import health
from composition.broker.configured import configured_broker
from composition.lifecycle.system import OVERRUN_S
from composition.testing import wait_until
from tests.jobsapp import jobs
from tests.jobsapp.models import Attempt, Effect

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.empty_queues(jobs.SLOW_QUEUE)]

SHUTDOWN_TIMEOUT_S = 4.0
# Process exit after the drain: the remaining components' stops and interpreter shutdown.
EXIT_MARGIN_S = 5.0  # interpreter exit and process teardown on a loaded 2-core machine


def _beat_of(pid: int) -> dict | None:
    report = health.workers()
    for beat in report.detail.get("workers", []):
        if beat["worker"] == f"{socket.gethostname()}:{pid}":
            return beat
    return None


@pytest.mark.version_smoke  # the matrix cell runs it too (Makefile)
def test_sigterm_drains_in_time_and_loses_no_job(worker_processes, tmp_path: Path) -> None:
    gate, short_gate = tmp_path / "gate", tmp_path / "short-gate"
    args = ["--threads", "4", "--queues", jobs.SLOW_QUEUE, "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)]
    worker = worker_processes.spawn(args)
    # Four jobs take the four threads: two are let go to finish during the drain, two never would.
    jobs.slow.send(key="short-1", hold_s=120, gate=str(short_gate))
    jobs.slow.send(key="short-2", hold_s=120, gate=str(short_gate))
    jobs.slow.send(key="long-1", hold_s=120, gate=str(gate))
    jobs.slow.send(key="long-2", hold_s=120, gate=str(gate))
    # These wait in the worker's prefetch behind them and must go back to the queue.
    queued = [f"queued-{index}" for index in range(4)]
    for key in queued:
        jobs.slow.send(key=key, hold_s=0.05)

    try:
        wait_until(lambda: Attempt.objects.filter(key__in=["short-1", "short-2", "long-1", "long-2"]).count() == 4,
                   timeout_s=30)
    except AssertionError:
        pytest.fail(f"jobs did not start; log:\n{worker.output()[-3000:]}")
    # The heartbeat reports the jobs in flight and since when (health workers reads it).
    wait_until(lambda: ((_beat_of(worker.pid) or {}).get("jobs_in_flight") or 0) >= 2, timeout_s=15,
               message="heartbeat never showed the jobs in flight")
    beat = _beat_of(worker.pid)
    assert beat is not None and beat["oldest_job_started_at"] <= time.time()
    assert {job["actor"] for job in beat["jobs"]} == {"slow"}
    assert beat["max_job_s"] == 300

    began = time.monotonic()
    worker.signal(signal.SIGTERM)
    # The short jobs end only once intake has stopped: ended before it (the signal's "draining"
    # line is logged before the main thread stops intake, and a loaded machine can run them in
    # between), they would free threads for the prefetched jobs, as they should.
    wait_until(lambda: "worker intake stopped" in worker.output(), timeout_s=SHUTDOWN_TIMEOUT_S,
               interval_s=0.01, message="the worker never said its intake stopped")
    short_gate.touch()
    assert worker.process is not None
    try:
        code = worker.process.wait(SHUTDOWN_TIMEOUT_S + EXIT_MARGIN_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"runworkers did not exit in time; log:\n{worker.output()[-3000:]}")
    took_s = time.monotonic() - began
    assert code == 0, worker.output()[-3000:]
    # Within the shutdown timeout, plus what the components left to stop past it may share
    # (OVERRUN_S: interrupted jobs unwinding, then the rest), plus a moment for the interpreter.
    print(f"runworkers exited {took_s:.2f}s after SIGTERM (shutdown timeout {SHUTDOWN_TIMEOUT_S}s)")
    assert took_s < SHUTDOWN_TIMEOUT_S + OVERRUN_S + 0.5, took_s

    # The short jobs finished during the drain; the long ones were interrupted, leaving no effect.
    assert set(Effect.objects.values_list("key", flat=True)) == {"short-1", "short-2"}
    assert not Attempt.objects.filter(key__in=queued).exists(), "prefetched jobs must not start while draining"
    # Said once each, as what it is: Dramatiq's "Failed to process message ... with unhandled
    # exception" and a traceback read as a failure on every busy thread of every deploy.
    output = worker.output()
    assert output.count("job interrupted by shutdown") == 2 and "Failed to process message" not in output, \
        output[-3000:]

    gate.touch()
    restarted = worker_processes.spawn(args)
    everything = ["short-1", "short-2", "long-1", "long-2", *queued]
    wait_until(lambda: Effect.objects.filter(key__in=everything).values("key").distinct().count() == len(everything),
               timeout_s=40, message=f"jobs lost after the restart; log:\n{restarted.output()[-3000:]}")
    assert sorted(Effect.objects.values_list("key", flat=True)) == sorted(everything), "each job exactly once"
    # An interrupted job ran again as attempt 1: the shutdown did not use up an attempt.
    for key in ("long-1", "long-2"):
        assert list(Attempt.objects.filter(key=key).values_list("attempt", flat=True)) == [1, 1]
    assert restarted.terminate() == 0


def test_a_job_the_interrupt_does_not_end_keeps_its_message_and_the_drain_says_so(worker_processes) -> None:
    # Its message was handed back while it still ran: a second worker started it beside it.
    worker = worker_processes.spawn(["--threads", "1", "--queues", jobs.SLOW_QUEUE, "--shutdown-timeout", "2"])
    jobs.stubborn.send(key="stubborn", hold_s=60)
    wait_until(lambda: Attempt.objects.filter(key="stubborn").exists(), timeout_s=30,
               message=f"the job did not start; log:\n{worker.output()[-3000:]}")
    worker.signal(signal.SIGTERM)
    assert worker.process is not None
    code = worker.process.wait(2 + EXIT_MARGIN_S + 3)
    broker = configured_broker()
    namespace = broker.namespace  # type: ignore[attr-defined]
    assert broker.client.llen(f"{namespace}:{jobs.SLOW_QUEUE}") == 0, "handed back while it ran"  # type: ignore[attr-defined]
    assert code == 1, "a drain that left a job running reported clean"
    assert "still running after the drain" in worker.output()
