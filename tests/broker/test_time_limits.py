"""Job time limits: the watchdog on real threads, then ``runworkers`` processes that interrupt,
retry and dead-letter an overrunning job, and never retry one that finishes just inside."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection
from dramatiq.middleware import Shutdown
from prometheus_client import CollectorRegistry, multiprocess

from composition.broker.configured import configured_broker
from composition.broker.time_limits import (
    JobShutdownNotifications,
    JobTimeLimit,
    TimeLimitExceeded,
    disarm_time_limit,
    interrupt_job,
    shielded,
    time_limits_enforced,
)
from composition.jobs.models import DeadLetter, ProcessedMessage
from composition.testing import metric_value, wait_until
from tests.jobsapp import jobs
from tests.jobsapp.models import Attempt, Effect

pytestmark = [pytest.mark.empty_queues(jobs.TIME_LIMIT_QUEUE)]


@pytest.fixture
def watchdog() -> Iterator[JobTimeLimit]:
    middleware = JobTimeLimit(interval_s=0.02)
    middleware.manager.start()
    yield middleware
    middleware.disarm()


def _busy(seconds: float) -> None:
    # Short sleeps, as a job's own work would be: an interrupt lands between them.
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.01)


def test_an_overrunning_body_is_interrupted(watchdog: JobTimeLimit) -> None:
    watchdog.manager.add_timeout(threading.get_ident(), 100)
    began = time.monotonic()
    with pytest.raises(TimeLimitExceeded):
        _busy(5)
    assert time.monotonic() - began < 1.0


def test_once_disarmed_no_interrupt_arrives_however_long_the_after_work(watchdog: JobTimeLimit) -> None:
    # The body returns at 0.8 of its limit; what follows (retry bookkeeping, a dead-letter write
    # retried through a database blip) may run far past the deadline, and must not be cut.
    watchdog.manager.add_timeout(threading.get_ident(), 250)
    _busy(0.2)
    disarm_time_limit()
    _busy(0.5)


def test_disarm_withdraws_an_interrupt_set_but_not_yet_delivered(watchdog: JobTimeLimit) -> None:
    # The worker thread sits in one long C call, so the interrupt the watchdog sets cannot be
    # delivered until it returns; the disarm (here from outside) withdraws it.
    outcome: list[str] = []
    armed = threading.Event()

    def worker() -> None:
        watchdog.manager.add_timeout(threading.get_ident(), 50)
        armed.set()
        try:
            time.sleep(0.5)
            outcome.append("finished")
        except TimeLimitExceeded:
            outcome.append("interrupted")

    thread = threading.Thread(target=worker)
    thread.start()
    armed.wait()
    assert thread.ident is not None
    wait_until(lambda: watchdog.manager.fired(thread.ident), 2)  # type: ignore[attr-defined, arg-type]
    watchdog.manager.remove_timeout(thread.ident)
    thread.join()
    assert outcome == ["finished"]


def test_a_shielded_block_is_never_cut_and_the_interrupt_follows_it(watchdog: JobTimeLimit) -> None:
    watchdog.manager.add_timeout(threading.get_ident(), 50)
    with shielded():
        _busy(0.3)  # well past the deadline
    with pytest.raises(TimeLimitExceeded):
        _busy(2)


# -- a drain's interrupt goes through the same watchdog ---------------------------------------------

def test_a_drain_interrupts_a_running_body_with_shutdown(watchdog: JobTimeLimit) -> None:
    watchdog.manager.add_timeout(threading.get_ident(), float("inf"))  # a job with no limit
    assert time_limits_enforced()
    began = time.monotonic()
    assert interrupt_job(threading.get_ident(), Shutdown)
    with pytest.raises(Shutdown):
        _busy(5)
    assert time.monotonic() - began < 1.0


def test_a_drain_spares_a_job_whose_body_returned(watchdog: JobTimeLimit) -> None:
    # Past its body the job is only bookkeeping (its retry's enqueue, its dead letter's write):
    # a Shutdown there would requeue a run that already happened.
    watchdog.manager.add_timeout(threading.get_ident(), 60_000)
    disarm_time_limit()
    assert not interrupt_job(threading.get_ident(), Shutdown)
    _busy(0.3)


def test_a_drain_interrupt_waits_for_a_shielded_block(watchdog: JobTimeLimit) -> None:
    watchdog.manager.add_timeout(threading.get_ident(), 60_000)
    with shielded():
        assert interrupt_job(threading.get_ident(), Shutdown)
        _busy(0.3)  # many watchdog looks
    with pytest.raises(Shutdown):
        _busy(2)


def test_dramatiqs_shutdown_notifications_go_through_the_watchdog(watchdog: JobTimeLimit) -> None:
    # An actor declared notify_shutdown=True is interrupted as the drain begins: in its body, not
    # in a shielded block, and not once the body returned.
    notifications = JobShutdownNotifications(notify_shutdown=True)
    notifications.manager.add_notification()
    try:
        watchdog.manager.add_timeout(threading.get_ident(), 60_000)
        with shielded():
            notifications.before_worker_shutdown(configured_broker(), None)
            _busy(0.3)
        with pytest.raises(Shutdown):
            _busy(2)

        watchdog.manager.add_timeout(threading.get_ident(), 60_000)
        disarm_time_limit()
        notifications.before_worker_shutdown(configured_broker(), None)
        _busy(0.3)
    finally:
        notifications.manager.remove_notification()


def test_the_watchdog_starts_once_however_often_the_process_boots(watchdog: JobTimeLimit) -> None:
    watchdog.after_process_boot(configured_broker())  # already started by the fixture
    assert watchdog.manager.is_alive()


# -- real worker processes ------------------------------------------------------------------------

def _timeouts_counted(metrics_dir: Path, actor: str) -> float:
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(metrics_dir))
    return metric_value("composition_job_timeouts_total", registry, actor=actor)


@pytest.mark.slow
@pytest.mark.version_smoke  # the matrix cell runs it too (Makefile)
@pytest.mark.django_db(transaction=True)
def test_runworkers_interrupts_retries_and_dead_letters_an_overrunning_job(
        worker_processes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    worker = worker_processes.spawn(["--threads", "2", "--queues", jobs.TIME_LIMIT_QUEUE],
                                    PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    message = jobs.overruns.send(key="overrun", run_s=10)
    began = time.monotonic()

    wait_until(lambda: DeadLetter.objects.filter(actor="overruns").exists(), 30,
               message=f"no dead letter; worker log:\n{worker.output()[-3000:]}")
    # Two attempts of a 1 s limit (plus a short backoff), far from the body's 10 s.
    assert time.monotonic() - began < 8
    dead = DeadLetter.objects.get(actor="overruns")
    assert dead.error_class.endswith("TimeLimitExceeded")
    assert "1s" in dead.error_message and dead.attempts == 2
    assert [run.attempt for run in Attempt.objects.filter(key="overrun").order_by("attempt")] == [1, 2]
    assert not Effect.objects.filter(key="overrun").exists()
    assert worker.terminate() == 0
    assert _timeouts_counted(tmp_path, "overruns") == 2
    log = worker.output()
    assert log.count("job exceeded its time limit") == 2 and message.message_id in log


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_query_cut_by_the_time_limit_is_cancelled_and_its_connection_goes_on(
        worker_processes) -> None:  # type: ignore[no-untyped-def]
    # The pure-Python psycopg waits for a result in Python code, so the interrupt lands with the
    # query in flight; one thread, so every job here runs on the same thread and connections.
    worker = worker_processes.spawn(["--processes", "1", "--threads", "1", "--queues", jobs.TIME_LIMIT_QUEUE],
                                    PSYCOPG_IMPL="python")
    for actor in (jobs.overruns_in_a_query, jobs.overruns_in_a_transaction):
        actor.send(key=actor.actor_name, sleep_s=25)
        wait_until(lambda: DeadLetter.objects.filter(actor=actor.actor_name).exists(), 20,  # noqa: B023
                   message=f"no dead letter; worker log:\n{worker.output()[-3000:]}")
        assert DeadLetter.objects.get(actor=actor.actor_name).error_class.endswith("TimeLimitExceeded")
        # The server stopped the query rather than sleeping out its 25 s.
        wait_until(lambda: not _running_query("pg_sleep"), 3, message=f"{actor.actor_name}'s query still runs")
    assert not Effect.objects.filter(key="overruns_in_a_transaction").exists()  # rolled back

    jobs.records_its_attempt.send(key="after-the-cut")
    wait_until(lambda: Attempt.objects.filter(key="after-the-cut").exists(), 20,
               message=f"next job did not run; worker log:\n{worker.output()[-3000:]}")
    # Its first attempt worked: no "another command is already in progress", no retry.
    assert list(Attempt.objects.filter(key="after-the-cut").values_list("attempt", flat=True)) == [1]
    assert worker.terminate() == 0
    log = worker.output()
    assert log.count("interrupted query cancelled") == 2, log[-3000:]
    assert "closing a database connection" not in log


def _running_query(fragment: str) -> bool:
    with connection.cursor() as cursor:
        # This database's only: another suite's pg_sleep on the same server is not this worker's.
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND datname = current_database() "
                       "AND query LIKE %s AND pid <> pg_backend_pid()", [f"%{fragment}%"])
        return bool(cursor.fetchone()[0])


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_job_finishing_at_nine_tenths_of_its_limit_is_never_retried_under_load(
        worker_processes) -> None:  # type: ignore[no-untyped-def]
    # Load: one busy process per core, competing with the worker for the CPU.
    burn = "import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end: pass"
    burners = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(2)]
    try:
        worker = worker_processes.spawn(["--threads", "8", "--queues", jobs.TIME_LIMIT_QUEUE])
        keys = [f"near-{index}" for index in range(16)]
        for key in keys:
            # 0.3 s to spare: what the ledger, the connection and a starved CPU take around the
            # body. 0.2 s was too tight with the gate's other shard running beside the burners.
            jobs.nearly_overruns.send(key=key, run_s=2.7)
        wait_until(lambda: Effect.objects.filter(key__in=keys).count() == len(keys), 60,
                   message=f"jobs did not finish; worker log:\n{worker.output()[-3000:]}")
        assert worker.terminate() == 0
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert sorted(Attempt.objects.filter(key__in=keys).values_list("attempt", flat=True)) == [1] * len(keys), \
        worker.output()[-3000:]
    assert Effect.objects.filter(key__in=keys).count() == len(keys)
    assert ProcessedMessage.objects.filter(actor="nearly_overruns").count() == len(keys)
    assert not DeadLetter.objects.filter(actor="nearly_overruns").exists()
    assert "exceeded its time limit" not in worker.output()

