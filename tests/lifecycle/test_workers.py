"""``manage.py runworkers`` as a real process: start, heartbeat, drain on SIGTERM, die with parent."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from django.conf import settings

from composition.health import heartbeats
from composition.testing import free_port, subprocess_env, wait_until
from composition.testing.workers import WorkerProcess
from tests.helpers import ROOT

pytestmark = pytest.mark.django_db(transaction=True)

SHUTDOWN_TIMEOUT_S = 10.0


def _component_lines(output: str, event: str) -> list[str]:
    names = []
    for line in output.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == event:
            names.append(record["component"])
    return names


def _heartbeats() -> list[dict[str, object]]:
    import redis

    client = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    try:
        return heartbeats.read_heartbeats(client)
    finally:
        client.close()


def test_sigterm_drains_and_exits_zero_within_the_shutdown_timeout(  # type: ignore[no-untyped-def]
        worker_processes, tmp_path: Path) -> None:
    ready = tmp_path / "worker.ready"
    process = worker_processes.spawn(["--threads", "2", "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S),
                                      "--ready-file", str(ready)])
    wait_until(ready.exists, 30, message="runworkers did not write its ready file")
    # Written once every component started, the worker threads last.
    assert "workers" in _component_lines(process.output(), "component started")
    assert ready.read_text() == f"{process.pid}\n"
    beats = _heartbeats()
    assert any(beat["worker"].endswith(f":{process.pid}") for beat in beats)

    began = time.monotonic()
    code = process.terminate(timeout_s=SHUTDOWN_TIMEOUT_S + 5)
    took = time.monotonic() - began
    output = process.output()
    assert code == 0, output
    assert took < SHUTDOWN_TIMEOUT_S, output
    started = _component_lines(output, "component started")
    stopped = _component_lines(output, "component stopped")
    assert started == ["logging", "metrics", "database", "cache", "broker", "queue-pauses", "limit-slots",
                       "task-leases", "outbox-relay", "broker-losses", "cache-invalidation-replay",
                       "retention", "shedding", "metrics-sampler", "scheduler", "heartbeat", "workers"]
    assert stopped == list(reversed(started))
    assert not ready.exists(), "the ready file outlived the worker"
    # The heartbeat is withdrawn on a clean stop, so health does not count a dead worker.
    assert not any(beat["worker"].endswith(f":{process.pid}") for beat in _heartbeats())


def test_sighup_drains_as_sigterm_does(worker_processes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # What a closed terminal or a dropped ssh session sends: its default ended the process at
    # once, abandoning the jobs under way and leaving the heartbeat behind.
    ready = tmp_path / "worker.ready"
    process = worker_processes.spawn(["--threads", "1", "--ready-file", str(ready)])
    wait_until(ready.exists, 30, message="runworkers did not start")
    process.signal(signal.SIGHUP)
    process.signal(signal.SIGHUP)  # again: the same stop
    assert process.process is not None
    assert process.process.wait(30) == 0, process.output()[-3000:]
    output = process.output()
    assert '"signal": "SIGHUP"' in output and "component stopped" in output
    assert not any(beat["worker"].endswith(f":{process.pid}") for beat in _heartbeats())


def test_a_second_signal_before_the_first_was_seen_still_removes_the_ready_file(  # type: ignore[no-untyped-def]
        worker_processes, tmp_path: Path) -> None:
    # The file went only once the main thread, polling every 0.2 s, saw the first signal: a second
    # Ctrl-C before that exited at once from the handler and left it behind holding a dead pid.
    ready = tmp_path / "worker.ready"
    process = worker_processes.spawn(["--threads", "1", "--ready-file", str(ready)])
    wait_until(ready.exists, 30, message="runworkers did not start")
    # Pending together, the two handlers run one after the other before the main thread's next
    # line, the lower number first: SIGHUP (the first signal: drain), then SIGINT (exit at once).
    process.signal(signal.SIGSTOP)
    process.signal(signal.SIGHUP)
    process.signal(signal.SIGINT)
    process.signal(signal.SIGCONT)
    assert process.process is not None
    assert process.process.wait(10) == 130, process.output()[-3000:]
    assert "second signal: exiting at once" in process.output()
    assert not ready.exists(), "the ready file outlived the worker, holding its dead pid"


def test_start_failure_rolls_back_and_exits_non_zero(worker_processes) -> None:  # type: ignore[no-untyped-def]
    from composition.testing import free_port

    closed = f"redis://127.0.0.1:{free_port()}/0"
    process = worker_processes.spawn(["--threads", "1"], BROKER_URL=closed)
    assert process.process is not None
    code = process.process.wait(30)
    output = process.output()
    assert code != 0
    assert "component 'broker': failed to start" in output
    assert _component_lines(output, "component stopped") == ["cache", "database", "metrics", "logging"]
    assert "workers" not in _component_lines(output, "component started")


def test_a_ready_file_that_cannot_be_written_is_refused_before_anything_starts(tmp_path: Path) -> None:
    # Found only once every component had started, it ended the process with jobs under way.
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="is not a directory this process can write to"):
        call_command("runworkers", "--ready-file", str(tmp_path / "missing" / "worker.ready"))


def test_the_supervisor_s_ready_directory_goes_with_it_and_a_killed_one_s_at_the_next_start() -> None:
    from composition.lifecycle.workers import ReadyFiles

    dead_pid = 2**22 + 12345  # above any pid this host hands out
    left = Path(tempfile.gettempdir()) / f"runworkers-ready-{dead_pid}-abc"
    left.mkdir()
    (left / "worker-process-0").write_text("1\n")
    files = ReadyFiles()
    files.start()
    try:
        assert not left.exists(), "a killed supervisor's directory was left"
        assert files.directory.is_dir()
    finally:
        files.stop(1.0)
    assert not files.directory.exists()


@pytest.mark.slow
def test_children_that_fail_to_start_fail_the_supervisor_s_start(  # type: ignore[no-untyped-def]
        worker_processes, tmp_path: Path) -> None:
    # They were launched and counted started: the supervisor was "up", then reported them as
    # having died while it ran.
    ready = tmp_path / "supervisor.ready"
    closed = f"redis://127.0.0.1:{free_port()}/0"
    process = worker_processes.spawn(["--processes", "2", "--threads", "1", "--no-schedules",
                                      "--ready-file", str(ready)], BROKER_URL=closed)
    assert process.process is not None
    code = process.process.wait(60)
    output = process.output()
    assert code != 0
    assert "component 'worker-processes-ready': failed to start" in output, output[-3000:]
    assert "component died" not in output
    assert not ready.exists()
    assert not list(Path(tempfile.gettempdir()).glob(f"runworkers-ready-{process.pid}-*")), "a ready directory was left"


@pytest.mark.slow
def test_several_processes_drain_together_and_children_die_with_the_parent(worker_processes) -> None:  # type: ignore[no-untyped-def]
    process = worker_processes.spawn(["--processes", "2", "--threads", "1", "--shutdown-timeout", "10"])
    def both_beating() -> bool:
        workers = {str(beat["worker"]).rsplit(":", 1)[1] for beat in _heartbeats()}
        children = _children(process.pid)
        return len(children) == 2 and all(str(pid) in workers for pid in children)

    wait_until(both_beating, 40, message="two worker processes did not start")
    children = _children(process.pid)
    assert len(children) == 2
    code = process.terminate(timeout_s=20)
    assert code == 0, process.output()
    wait_until(lambda: not any(_alive(pid) for pid in children), 5)

    # Now the crash: the supervisor dies without a chance to clean up; its children follow.
    process = worker_processes.spawn(["--processes", "2", "--threads", "1"])
    wait_until(lambda: len(_children(process.pid)) == 2, 40)
    children = _children(process.pid)
    os.kill(process.pid, signal.SIGKILL)
    wait_until(lambda: not any(_alive(pid) for pid in children), 15,
               message="worker children outlived their parent")


@pytest.mark.slow
def test_a_second_ctrl_c_ends_the_children_too(worker_processes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # The supervisor exited at once; its children, orphans now, drained on their own for the
    # shutdown timeout, writing on to the terminal.
    from tests.jobsapp import jobs
    from tests.jobsapp.models import Attempt

    ready = tmp_path / "supervisor.ready"
    process = worker_processes.spawn(["--processes", "2", "--threads", "1", "--shutdown-timeout", "30",
                                      "--queues", jobs.SLOW_QUEUE, "--ready-file", str(ready)])
    wait_until(ready.exists, 40, message="two worker processes did not start")
    children = _children(process.pid)
    assert len(children) == 2
    # Jobs still running when the signals come: one child may have fetched both (its prefetch),
    # and one busy child is enough (it drained for the shutdown timeout).
    for index in range(2):
        jobs.slow.send(key=f"second-ctrl-c-{index}", hold_s=60)
    started = Attempt.objects.filter(key__startswith="second-ctrl-c-")
    wait_until(started.exists, 20, message=f"no child took a job: {process.output()[-3000:]}")
    process.signal(signal.SIGINT)
    time.sleep(0.5)
    process.signal(signal.SIGINT)
    assert process.process is not None
    assert process.process.wait(10) == 130
    wait_until(lambda: not any(_alive(pid) for pid in children), 3,
               message="the children went on after the second Ctrl-C")
    # Its children's ready files, which the next supervisor's start on this host would remove.
    for left in Path(tempfile.gettempdir()).glob(f"runworkers-ready-{process.pid}-*"):
        shutil.rmtree(left)


def _children(pid: int) -> list[int]:
    result = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(line) for line in result.stdout.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_system_command_prints_order_and_connection_budget() -> None:
    env = subprocess_env()
    result = subprocess.run([sys.executable, "manage.py", "system", "--json", "--worker-processes", "3",
                             "--worker-threads", "4", "--web-processes", "2", "--web-threads", "4"],
                            env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["start_order"][0] == "logging"
    assert report["stop_order"] == list(reversed(report["start_order"]))
    budget = report["connection_budget"]
    # 4 worker threads + 9 background ones; the host's one scheduler; 4 web threads, nothing more.
    # Behind a transaction pooler a worker process would hold 4 + 1 server connections at once.
    assert budget["lines"][0] == {"role": "workers", "processes": 3, "per_process": 13, "total": 39,
                                  "held_per_process": 5, "held": 15}
    assert budget["lines"][1] == {"role": "scheduler", "processes": 1, "per_process": 1, "total": 1,
                                  "held_per_process": 1, "held": 1}
    assert budget["lines"][2]["total"] == 8
    assert budget["pooled"] is None  # not declared behind one
    assert budget["total"] == 48
    # Checked against what non-superusers may open, as the composition_db_connections_max gauge.
    assert 35 <= budget["usable_connections"] < budget["max_connections"]
    assert budget["over_budget"] is False and budget["unchecked"] is None

    result = subprocess.run([sys.executable, "manage.py", "system", "--worker-processes", "100",
                             "--worker-threads", "8"], env=env, capture_output=True, text=True, timeout=30)
    assert "WARNING" in result.stderr
    assert f"of {budget['usable_connections']} usable (max_connections {budget['max_connections']}" in result.stdout
    # A server that does not answer (out of connections, say) leaves the budget unchecked: not a pass.
    unreachable = subprocess_env(DATABASE_URL=f"postgresql://postgres@127.0.0.1:{free_port()}/none")
    result = subprocess.run([sys.executable, "manage.py", "system"], env=unreachable, capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 1 and "the budget could not be checked" in result.stderr, result.stderr
    assert "the server's limit is unknown" in result.stdout

    # With a metrics port configured, its server is in the graph, as runworkers starts it.
    from io import StringIO

    from django.core.management import call_command
    from django.test import override_settings

    served = StringIO()
    with override_settings(COMPOSITION={**settings.COMPOSITION, "WORKER_METRICS_PORT": 9123}):
        call_command("system", "--json", stdout=served)
    assert "metrics-server" in json.loads(served.getvalue())["start_order"]
    refused = subprocess.run([sys.executable, "manage.py", "system", "--worker-processes", "-5"], env=env,
                             capture_output=True, text=True, timeout=30)
    assert refused.returncode == 2 and "at least 1" in refused.stderr  # not a negative connection budget


@pytest.mark.slow
def test_a_child_ending_on_its_own_fails_the_group_even_started_from_another_directory(
        worker_processes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Started by its path from elsewhere, the children were started without the project on their
    # import path (ModuleNotFoundError); and one child that exited 0 stopped the group with exit
    # 0, so a supervisor's Restart=on-failure never started it again.
    ready = tmp_path / "supervisor.ready"
    process = WorkerProcess(["--processes", "2", "--threads", "1", "--ready-file", str(ready)],
                            manage_py=str(ROOT / "manage.py"), cwd=str(tmp_path)).start()
    try:
        wait_until(ready.exists, 40, message=f"two worker processes did not start; log:\n{process.output()[-3000:]}")
        os.kill(_children(process.pid)[0], signal.SIGTERM)  # drains and exits 0, on its own
        assert process.process is not None
        assert process.process.wait(30) == 1, process.output()[-3000:]
        assert "=died" in process.output()
    finally:
        process.close()
