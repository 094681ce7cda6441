"""Embedded servers never outlive their owners, however the owners end.

Every test runs real embedded PostgreSQL and Valkey under its own ``tmp_path`` and then looks
in /proc for what is left: a postmaster (``postgres -D <tmp_path>/postgres``), a Valkey
(``--dir <tmp_path>/valkey``) or the watchdog (``project.watchdog <tmp_path>``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from composition.testing import free_port, http_status, wait_until
from tests.helpers import ROOT

# ./run uses the main .venv whatever interpreter runs pytest: in the matrix cell this would only
# run again on the main cell's Python and Django.
pytestmark = [pytest.mark.slow, pytest.mark.main_cell]

Spawned = list[subprocess.Popen[bytes]]

# The bound the issue sets: no server (and no watchdog) left this long after the last owner.
GONE_WITHIN_S = 10.0
# Generous: the machine is shared and initdb or ./run's start can be slow under load.
START_TIMEOUT_S = 120.0

# Stands in for mypy or `manage.py shell`: the settings start (or reuse) the servers; then it
# answers "check" by using both, "exit" by exiting normally, "os._exit" by skipping all cleanup.
OWNER_SCRIPT = """
import os, sys
import django
django.setup()
print("READY", os.getpid(), flush=True)
for line in sys.stdin:
    command = line.strip()
    if command == "check":
        import redis
        from django.db import connection
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        redis.Redis.from_url(os.environ["REDIS_URL"]).ping()
        print("OK", flush=True)
    elif command == "exit":
        break
    elif command == "os._exit":
        os._exit(0)
"""


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: str) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _pids() -> list[str]:
    return [entry for entry in os.listdir("/proc") if entry.isdigit() and entry != str(os.getpid())]


def _cwd(pid: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


def leftovers(data_dir: Path) -> dict[str, str]:
    """The live postmaster, Valkey and watchdog of ``data_dir``, by pid, with their command lines."""
    found = {}
    for pid in _pids():
        cmdline = _cmdline(pid)
        if not _alive(pid):
            continue
        # A Valkey that retitles itself ("valkey-server 127.0.0.1:port") is still known by its
        # working directory.
        valkey = f"--dir {data_dir}/valkey" in cmdline or (
            "valkey" in cmdline and _cwd(pid) == str(data_dir / "valkey"))
        if (f"-D {data_dir}/postgres" in cmdline or valkey
                or ("project.watchdog" in cmdline and str(data_dir) in cmdline)):
            found[pid] = cmdline
    return found


def _servers(data_dir: Path) -> dict[str, str]:
    return {pid: cmd for pid, cmd in leftovers(data_dir).items() if "project.watchdog" not in cmd}


def _watchdogs(data_dir: Path) -> list[int]:
    return [int(pid) for pid, cmd in leftovers(data_dir).items() if "project.watchdog" in cmd]


def _kill_everything_of(data_dir: Path) -> None:
    """Whatever runs with ``data_dir`` in its command line or environment: the servers, the
    watchdog, and ./run's web and worker children (they get the data dir in their environment)."""
    marker = f"COMPOSITION_DATA_DIR={data_dir}".encode()

    def victims() -> list[str]:
        found = []
        for pid in _pids():
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:
                environ = b""
            if _alive(pid) and (str(data_dir) in _cmdline(pid) or marker in environ.split(b"\0")):
                found.append(pid)
        return found

    def kill(pid: str, signum: signal.Signals) -> None:
        try:
            os.kill(int(pid), signum)
        except ProcessLookupError:
            pass

    deadline = time.monotonic() + 15
    while (left := victims()) and time.monotonic() < deadline:
        for pid in left:
            # SIGQUIT for a postmaster: it then ends its backends and releases shared memory.
            kill(pid, signal.SIGQUIT if "postgres" in _cmdline(pid) else signal.SIGKILL)
        time.sleep(0.5)
    for pid in victims():
        kill(pid, signal.SIGKILL)


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    _kill_everything_of(tmp_path)


@pytest.fixture
def spawn(data_dir: Path) -> Iterator[Spawned]:
    """The processes a test starts: each in its own session, all killed afterwards."""
    started: Spawned = []
    yield started
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if key not in ("DATABASE_URL", "REDIS_URL", "BROKER_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(COMPOSITION_DATA_DIR=str(data_dir), **extra)
    return env


class Owner:
    """A process that imported the settings, so it owns (a share of) the embedded servers."""

    def __init__(self, data_dir: Path, spawn: Spawned, name: str) -> None:
        self.output = data_dir / f"{name}.out"
        with self.output.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-c", OWNER_SCRIPT], cwd=ROOT, stdin=subprocess.PIPE, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
                env=_env(data_dir, DJANGO_SETTINGS_MODULE="project.settings"))
        spawn.append(self.process)
        self._expect("READY", START_TIMEOUT_S)

    def _expect(self, word: str, timeout_s: float) -> None:
        def seen() -> bool:
            assert self.process.poll() is None, self.output.read_text()
            return word in self.output.read_text()

        wait_until(seen, timeout_s, interval_s=0.1, message=f"no {word}:\n{self.output.read_text()}")

    def send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command.encode() + b"\n")
        self.process.stdin.flush()

    def check(self) -> None:
        """Both servers answer this owner."""
        before = self.output.read_text().count("OK")
        self.send("check")
        wait_until(lambda: self.output.read_text().count("OK") > before or self.process.poll() is not None,
                   30, interval_s=0.1)
        assert self.output.read_text().count("OK") > before, self.output.read_text()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


def assert_all_gone(data_dir: Path, since: float) -> None:
    """Nothing of ``data_dir`` is left within GONE_WITHIN_S of ``since`` (a monotonic time)."""
    while leftovers(data_dir):
        assert time.monotonic() - since < GONE_WITHIN_S, (
            f"still running {GONE_WITHIN_S:.0f}s after the last owner ended: {leftovers(data_dir)}")
        time.sleep(0.1)




def _start_run(data_dir: Path, spawn: Spawned) -> subprocess.Popen[bytes]:
    """``./run`` (the supervisor itself, as ./run execs it), up and serving /readyz."""
    port = free_port()
    log_path = data_dir / "run.log"
    with log_path.open("wb") as log:
        # Its own session, like a shell's foreground job.
        process = subprocess.Popen([str(ROOT / ".venv/bin/python"), "-m", "project.run"], cwd=ROOT,
                                   env=_env(data_dir, PORT=str(port), LOG_FORMAT="json"), stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    spawn.append(process)
    deadline = time.monotonic() + START_TIMEOUT_S
    while http_status(f"http://127.0.0.1:{port}/readyz") != 200:
        assert process.poll() is None, log_path.read_text()
        assert time.monotonic() < deadline, "not ready:\n" + log_path.read_text()
        time.sleep(0.25)
    # Two: the postmaster and Valkey. Once failed on a loaded gate seeing three, the rest of the
    # listing cut by pytest: a process of their start on its way out is let go for 10 s, and
    # anything that stays is listed whole.
    settled = time.monotonic() + 10
    while len(_servers(data_dir)) != 2:
        assert time.monotonic() < settled, "\n".join(f"{pid}: {cmd}" for pid, cmd in leftovers(data_dir).items())
        time.sleep(0.1)
    return process


def test_run_stopped_by_a_second_ctrl_c_leaves_no_server(data_dir: Path, spawn: Spawned) -> None:
    run = _start_run(data_dir, spawn)
    os.kill(run.pid, signal.SIGINT)
    time.sleep(0.5)  # draining has begun
    os.kill(run.pid, signal.SIGINT)  # the impatient second Ctrl-C: os._exit, no atexit
    assert run.wait(30) == 130
    assert_all_gone(data_dir, since=time.monotonic())


def test_run_killed_leaves_no_server(data_dir: Path, spawn: Spawned) -> None:
    run = _start_run(data_dir, spawn)
    run.kill()  # the supervisor only; its children end by die-with-parent
    run.wait()
    assert_all_gone(data_dir, since=time.monotonic())


@pytest.mark.parametrize("ending", ["os._exit", "SIGKILL"])
def test_process_that_imported_the_settings_leaves_no_server(data_dir: Path, spawn: Spawned, ending: str) -> None:
    owner = Owner(data_dir, spawn, "mypy")
    assert len(_servers(data_dir)) == 2, leftovers(data_dir)
    if ending == "SIGKILL":
        owner.kill()
    else:
        owner.send("os._exit")
        assert owner.process.wait(30) == 0
    assert_all_gone(data_dir, since=time.monotonic())


def test_servers_left_by_a_crash_are_stopped_after_the_next_owner(data_dir: Path, spawn: Spawned) -> None:
    crashed = Owner(data_dir, spawn, "crashed")
    for pid in _watchdogs(data_dir):
        os.kill(pid, signal.SIGKILL)
    crashed.kill()
    # The crash left servers that nobody watches (PostgreSQL at least: a Valkey may have died with
    # the process that started it).
    time.sleep(1.5)
    assert len(_servers(data_dir)) >= 1, leftovers(data_dir)

    owner = Owner(data_dir, spawn, "next")
    owner.check()
    assert len(_watchdogs(data_dir)) == 1, leftovers(data_dir)
    owner.send("exit")
    assert owner.process.wait(30) == 0, owner.output.read_text()
    assert_all_gone(data_dir, since=time.monotonic())


@pytest.mark.parametrize("ending", ["exit", "SIGKILL"])
def test_servers_stop_only_when_the_last_of_two_owners_is_gone(data_dir: Path, spawn: Spawned, ending: str) -> None:
    first = Owner(data_dir, spawn, "first")
    second = Owner(data_dir, spawn, "second")
    servers = _servers(data_dir)
    assert len(servers) == 2, leftovers(data_dir)

    if ending == "SIGKILL":
        first.kill()
    else:
        first.send("exit")
        assert first.process.wait(30) == 0, first.output.read_text()
    time.sleep(2)  # several watchdog rounds
    assert _servers(data_dir) == servers  # the very same servers, still up for the second owner
    second.check()
    assert len(_watchdogs(data_dir)) == 1, leftovers(data_dir)

    second.kill()
    assert_all_gone(data_dir, since=time.monotonic())
