"""``composition.lifecycle.pids``: whether a process runs, and the registry of this project's
worker processes on this host, with real child processes. Every test registers under its own
temporary directory, never the host's, so a ``./run`` beside the tests is not touched."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from composition.lifecycle import pids

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.fixture(autouse=True)
def own_temporary_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where ``tempfile.gettempdir()`` points for the test: registrations go under it."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(SLEEP)
    yield process
    process.kill()
    process.wait()


def _dead_pid() -> int:
    """The pid of a process that ran and was reaped."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_process_runs_until_it_is_reaped(sleeper: subprocess.Popen[bytes]) -> None:
    assert pids.pid_runs(os.getpid())
    assert pids.pid_runs(sleeper.pid)
    sleeper.kill()
    time.sleep(0.2)  # dead, not yet reaped: a zombie still counts
    assert pids.pid_runs(sleeper.pid)
    sleeper.wait()
    assert not pids.pid_runs(sleeper.pid)


def test_a_registered_worker_counts_until_it_dies_and_unregistering_withdraws_it(
        sleeper: subprocess.Popen[bytes]) -> None:
    assert pids.registered_workers() == {}, "no directory yet: nobody registered"
    pids.register_worker(sleeper.pid)
    pids.register_worker()  # this process
    assert pids.registered_workers() == {sleeper.pid: True, os.getpid(): True}
    pids.register_worker(sleeper.pid)  # a heartbeat repeats it
    assert pids.registered_workers() == {sleeper.pid: True, os.getpid(): True}

    sleeper.kill()
    sleeper.wait()
    # Killed, it could not withdraw: its registration is how it is known to be gone.
    assert pids.registered_workers() == {sleeper.pid: False, os.getpid(): True}
    pids.unregister_worker(sleeper.pid)
    pids.unregister_worker()
    assert pids.registered_workers() == {}
    pids.unregister_worker(sleeper.pid)  # withdrawn already: nothing to do, no error


def test_a_pid_now_held_by_another_process_is_not_taken_for_the_worker() -> None:
    # The registration of an earlier process that had this pid (another start time): this
    # process is not that worker. Registering it again takes the pid for this process.
    directory = pids.workers_directory()
    directory.mkdir(parents=True)
    entry = directory / str(os.getpid())
    entry.write_text("1")
    assert pids.registered_workers() == {os.getpid(): False}
    pids.register_worker()
    assert pids.registered_workers() == {os.getpid(): True}
    assert entry.read_text() not in ("", "1")
    # Where the start time could not be read when it registered, a running pid counts.
    entry.write_text("")
    assert pids.registered_workers() == {os.getpid(): True}


def test_a_registration_keeps_the_time_of_the_first(sleeper: subprocess.Popen[bytes]) -> None:
    # `health workers --local` gives a process a stale period from it to beat for the first time:
    # the heartbeat's repeated registrations must not restart that period.
    assert pids.registered_at(sleeper.pid) is None
    before = time.time()
    pids.register_worker(sleeper.pid)
    first = pids.registered_at(sleeper.pid)
    assert first is not None and before - 1 <= first <= time.time() + 1
    time.sleep(0.05)
    pids.register_worker(sleeper.pid)
    assert pids.registered_at(sleeper.pid) == first
    pids.unregister_worker(sleeper.pid)
    assert pids.registered_at(sleeper.pid) is None


def test_registering_forgets_processes_dead_for_an_hour_and_keeps_the_rest(
        sleeper: subprocess.Popen[bytes]) -> None:
    long_dead, lately_dead = _dead_pid(), _dead_pid()
    directory = pids.workers_directory()
    directory.mkdir(parents=True)
    for pid in (long_dead, lately_dead, sleeper.pid):
        (directory / str(pid)).write_text("")
    an_hour_ago = time.time() - pids.FORGET_DEAD_AFTER_S - 60
    for pid in (long_dead, sleeper.pid):  # the sleeper: registered long ago, still running
        os.utime(directory / str(pid), (an_hour_ago, an_hour_ago))
    (directory / "not-a-pid").write_text("")

    pids.register_worker()
    assert pids.registered_workers() == {lately_dead: False, sleeper.pid: True, os.getpid(): True}
    assert (directory / "not-a-pid").exists(), "not a registration: left alone"


def test_registering_where_the_directory_cannot_be_written_raises_oserror(own_temporary_directory: Path) -> None:
    not_a_directory = own_temporary_directory / "a-file"
    not_a_directory.write_text("")
    tempfile.tempdir = str(not_a_directory)
    with pytest.raises(OSError):
        pids.register_worker()


def test_each_settings_module_and_checkout_has_its_own_workers(
        sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch, own_temporary_directory: Path) -> None:
    ours = pids.project_identity()
    assert pids.project_identity() == ours, "stable: every process of the project must agree on it"
    assert pids.workers_directory() == own_temporary_directory / f"composition-{ours}" / "workers"
    pids.register_worker(sleeper.pid)

    with monkeypatch.context() as patch:
        # The same project under another settings module (the tests' settings beside the project's).
        patch.setenv("DJANGO_SETTINGS_MODULE", "tests.settings_another_checkout")
        another_module = pids.project_identity()
        # The same settings module in another checkout: a module of that name in another file.
        patch.setenv("DJANGO_SETTINGS_MODULE", "tests.settings")
        elsewhere = types.ModuleType("tests.settings")
        elsewhere.__file__ = str(own_temporary_directory / "other-checkout" / "tests" / "settings.py")
        patch.setitem(sys.modules, "tests.settings", elsewhere)
        another_checkout = pids.project_identity()
        assert pids.registered_workers() == {}, "another checkout's registry is its own"
        # A settings module not imported (yet) is told apart by its name and where it runs.
        patch.setenv("DJANGO_SETTINGS_MODULE", "not_imported.settings")
        not_imported = pids.project_identity()
        patch.setenv("DJANGO_SETTINGS_MODULE", "not_imported.other_settings")
        not_imported_other = pids.project_identity()
        patch.chdir(own_temporary_directory)
        run_elsewhere = pids.project_identity()

    assert len({ours, another_module, another_checkout, not_imported, not_imported_other, run_elsewhere}) == 6
    assert pids.project_identity() == ours
    assert pids.registered_workers() == {sleeper.pid: True}
