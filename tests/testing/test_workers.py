"""``composition.testing.WorkerProcess``: a real ``runworkers`` that ends with the process that
started it, so a test run killed mid-test leaves no worker taking its queues."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from composition.testing import subprocess_env, wait_until
from tests.helpers import ROOT

PARENT = textwrap.dedent("""
    import os, time
    import django
    django.setup()
    from composition.testing import WorkerProcess
    # jobs_idle: tests.jobsapp.jobs.IDLE_QUEUE, declared and never sent to.
    worker = WorkerProcess(["--threads", "1", "--shutdown-timeout", "5", "--queues", "jobs_idle"],
                           env=dict(os.environ)).start()
    print(worker.pid, worker.log_path, flush=True)
    time.sleep(120)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_ends_when_the_process_that_started_it_is_killed() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], cwd=ROOT, env=subprocess_env(),
                              stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    pid_text, log_text = parent.stdout.readline().split()
    worker, log = int(pid_text), Path(log_text)
    try:
        wait_until(lambda: "component started" in log.read_text(errors="replace"), 60,
                   message=f"the worker never started: {log.read_text(errors='replace')[-3000:]}")
        parent.send_signal(signal.SIGKILL)  # no teardown runs: the crash of a test run
        parent.wait(10)
        wait_until(lambda: not _alive(worker), 20, message="the worker outlived the process that started it")
        assert "stopped" in log.read_text(errors="replace")  # it drained on the parent's death, not killed
    finally:
        if _alive(worker):
            os.killpg(worker, signal.SIGKILL)
        parent.kill()
        parent.wait()
        log.unlink(missing_ok=True)


@pytest.mark.django_db
def test_a_child_that_reads_libpq_s_variables_as_the_install_guide_s_settings_do_finds_the_test_database(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The install guide's settings read PGDATABASE, PGHOST...: with only DATABASE_URL passed on,
    # a worker a user's test started ran on their development database.
    from django.db import connection

    monkeypatch.setenv("PGDATABASE", "a_developers_own_database")
    monkeypatch.setenv("PGHOST", "/nowhere")
    read = "import psycopg; print(psycopg.connect('').execute('SELECT current_database()').fetchone()[0])"
    found = subprocess.run([sys.executable, "-c", read], env=subprocess_env(), capture_output=True, text=True,
                           timeout=30)
    assert found.stdout.strip() == connection.settings_dict["NAME"], found.stderr


@pytest.mark.slow
def test_kill_group_kills_the_worker_processes_of_a_supervisor_too(worker_processes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Under --processes N they have sessions of their own: the group's SIGKILL missed them, and
    # their supervisor's death only sent them SIGTERM, so "a crash" drained them for up to 30 s.
    import psutil

    ready = tmp_path / "workers.ready"  # a killed supervisor leaves it: in the test's own directory
    host = worker_processes.spawn(["--processes", "2", "--threads", "1", "--shutdown-timeout", "30",
                                   "--ready-file", str(ready)])
    wait_until(ready.exists, 60, message=host.output()[-3000:])
    children = psutil.Process(host.pid).children()
    assert len(children) == 2, host.output()[-3000:]
    host.kill_group()

    def running(process: psutil.Process) -> bool:  # a zombie waits for a reaper, it runs nothing
        try:
            return process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    assert [child.pid for child in children if running(child)] == [], "outlived the crash of their group"
