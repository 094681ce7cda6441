"""prometheus_client's multiprocess directory: whose files are in it, and the lock that keeps
merging and scraping apart.

The archive's merges and the scrapes both take ``merge.lock`` (merger exclusive, scrapers shared),
so a scrape never sees half a merge. The lock file does not end in ``.db``, so
``MultiProcessCollector`` (which globs ``*.db``) never reads it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from composition.lifecycle.pids import pid_runs
from composition.prometheus.errors import MetricsDirectoryBusy

__all__ = ["LOCK_NAME", "LOCK_TIMEOUT_S", "TURNSTILE_NAME", "ProcessFile", "locked", "multiproc_dir", "process_files",
           "running"]

LOCK_NAME = "merge.lock"
# Taken by a merger while it waits for the lock, passed through by scrapes (see ``locked``).
TURNSTILE_NAME = "merge.turnstile"
# A merge or a scrape holds the lock for milliseconds; one that waits this long is stuck behind
# a frozen process, and gives up rather than hang a scrape or gunicorn's arbiter.
LOCK_TIMEOUT_S = 10.0
_LOCK_POLL_S = 0.005

# The names prometheus_client.values.MultiProcessValue gives its files with the default process
# identifier (os.getpid). Files named otherwise (a custom identifier) are never touched.
_PROCESS_FILE = re.compile(r"^(?P<prefix>counter|histogram|summary|gauge_[a-z]+)_(?P<pid>\d+)\.db$")


def multiproc_dir() -> Path | None:
    """The directory of ``PROMETHEUS_MULTIPROC_DIR``, or None when multiprocess mode is off."""
    value = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    return Path(value) if value else None


@dataclass(frozen=True)
class ProcessFile:
    """One process's file: ``prefix`` is ``counter``, ``histogram``, ``summary`` or
    ``gauge_<mode>`` (the part before the pid)."""

    path: Path
    prefix: str
    pid: int


def process_files(directory: Path) -> list[ProcessFile]:
    """Every per-process file in ``directory``, archives and foreign names left out."""
    found = []
    for entry in os.scandir(directory):
        match = _PROCESS_FILE.match(entry.name)
        if match:
            found.append(ProcessFile(Path(entry.path), match["prefix"], int(match["pid"])))
    return found


def running(pid: int) -> bool:
    """Whether a process ``pid`` exists in this pid namespace (a zombie still counts: its files
    are merged once it was reaped). Sound only when every writer to the directory shares this
    namespace, which is why each container has a directory of its own."""
    return pid_runs(pid)


# flock, not fcntl/lockf record locks: those belong to the process, so two threads of one process
# (a scrape and a child's exit hook in a supervisor) would not exclude each other.
def _flock(fd: int, mode: int, deadline: float, directory: Path, timeout_s: float) -> None:
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise MetricsDirectoryBusy(str(directory), timeout_s) from None
            time.sleep(_LOCK_POLL_S)


@contextlib.contextmanager
def locked(directory: Path, *, exclusive: bool, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the directory's lock, exclusive (merging) or shared (scraping), for the block.

    A merger waiting for the lock holds the turnstile, which new scrapes pass through first:
    scrapes that follow each other closely (several Prometheus servers, a busy dashboard) would
    otherwise always leave a shared lock in place and starve the merge. Raises
    MetricsDirectoryBusy when the lock was not had within ``timeout_s`` seconds.
    """
    deadline = time.monotonic() + timeout_s
    turnstile = os.open(directory / TURNSTILE_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    fd = -1
    try:
        _flock(turnstile, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, deadline, directory, timeout_s)
        if not exclusive:
            os.close(turnstile)  # through it: a merger that comes now waits only for this scrape
            turnstile = -1
        fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        _flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, deadline, directory, timeout_s)
        if turnstile >= 0:
            os.close(turnstile)  # the merge has the lock: scrapes queue on it, not on the turnstile
            turnstile = -1
        yield
    finally:
        # Closing the only descriptor of an open file releases its flock.
        for descriptor in (fd, turnstile):
            if descriptor >= 0:
                os.close(descriptor)
