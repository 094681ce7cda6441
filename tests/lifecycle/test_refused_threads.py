"""``runworkers`` on a host that refuses threads (a container at its pid limit): a start that fails
part-way rolls back what it began, the rollback itself needs no thread, and a time-limit
watchdog that could not start fails the start rather than leaving every job without its limit.
A metrics server whose thread is refused lets its port go. The refusal is the kernel's
(``tests/refusing_threads.py``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from composition.lifecycle.pids import registered_workers
from composition.testing import free_port, subprocess_env
from composition.testing.workers import WorkerProcess
from tests.helpers import ROOT
from tests.lifecycle.test_workers import _component_lines, _heartbeats


def _run_refusing(thread: str, *, later_too: bool = False) -> tuple[int, int, str]:
    """runworkers with ``thread`` refused: (exit status, pid, output)."""
    env = subprocess_env(REFUSED_THREAD=thread, REFUSE_LATER_THREADS="1" if later_too else "0")
    process = WorkerProcess(["--threads", "2"], env=env, manage_py="tests/refusing_threads.py").start()
    try:
        assert process.process is not None
        code = process.process.wait(60)
        return code, process.pid, process.output()
    finally:
        process.close()


def _left_behind(pid: int) -> list[str]:
    beats = [str(beat["worker"]) for beat in _heartbeats() if str(beat["worker"]).endswith(f":{pid}")]
    return beats + [f"registered pid {each}" for each in registered_workers() if each == pid]


@pytest.mark.django_db(transaction=True)
def test_a_heartbeat_whose_thread_is_refused_withdraws_its_beat_and_registration(worker_processes) -> None:  # type: ignore[no-untyped-def]
    # They stayed: health counted a worker that never consumed as fresh, then as dead.
    code, pid, output = _run_refusing("heartbeat")
    assert code == 1, output[-3000:]
    assert "component 'heartbeat': failed to start: RuntimeError: can't start new thread" in output, output[-3000:]
    assert "workers" not in _component_lines(output, "component started")
    assert _left_behind(pid) == []


@pytest.mark.django_db(transaction=True)
def test_a_keepalive_whose_thread_is_refused_ends_the_worker_threads_cleanly(worker_processes) -> None:  # type: ignore[no-untyped-def]
    # Its stop joined a thread that never started, and the clean-up said it had failed.
    code, pid, output = _run_refusing("broker-keepalive")
    assert code == 1, output[-3000:]
    assert "component 'workers': failed to start: RuntimeError: can't start new thread" in output, output[-3000:]
    assert "not cleaned up" not in output, output[-3000:]
    assert _component_lines(output, "component stopped")[0] == "heartbeat"
    assert _left_behind(pid) == []


@pytest.mark.django_db(transaction=True)
def test_a_rollback_on_a_host_that_gives_no_more_threads_still_stops_everything(worker_processes) -> None:  # type: ignore[no-untyped-def]
    # Each stop ran in a thread of its own: the first refused one ended the rollback in a
    # traceback, leaving the heartbeat, the scheduler and the connections as they were.
    code, pid, output = _run_refusing("broker-keepalive", later_too=True)
    assert code == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    started = _component_lines(output, "component started")
    assert started[-1] == "heartbeat"
    assert _component_lines(output, "component stopped") == list(reversed(started))
    assert _left_behind(pid) == []


@pytest.mark.django_db(transaction=True)
def test_a_time_limit_watchdog_whose_thread_is_refused_fails_the_start(worker_processes) -> None:  # type: ignore[no-untyped-def]
    # Dramatiq logged the hook's failure and the workers started: no job's timeout_s enforced.
    code, _, output = _run_refusing("composition-time-limit")
    assert code == 1, output[-3000:]
    assert "the job time-limit watchdog did not start" in output, output[-3000:]
    assert "workers" not in _component_lines(output, "component started")


def test_a_metrics_server_whose_thread_is_refused_does_not_keep_its_port() -> None:
    # Its socket stayed bound, listening with nothing serving it, for as long as the process ran.
    port = free_port()
    snippet = textwrap.dedent(f"""
        import socket
        from composition.prometheus import MetricsServerComponent
        server = MetricsServerComponent({port}, address="127.0.0.1")  # held, as the System holds it
        try:
            server.start()
        except RuntimeError as exc:
            print("refused:", exc)
        probe = socket.socket()
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", {port}))
        print("port free")
    """)
    child = subprocess.run([sys.executable, "tests/refusing_threads.py", "shell", "-c", snippet], cwd=ROOT,
                           env=subprocess_env(REFUSED_THREAD="metrics-server"), capture_output=True, text=True,
                           timeout=60)
    assert "refused: can't start new thread" in child.stdout, child.stdout + child.stderr[-2000:]
    assert "port free" in child.stdout, child.stderr[-2000:]
