"""The archive of dead processes: their files merged into one file per kind, so totals never go
down while the directory (and so every scrape) stays as small as the living processes' files.

``archive_processes(directory, pids)`` and ``archive_dead_processes(directory)`` hold the
directory's exclusive lock (scrapes take it shared), so a scrape sees a dead process in its own
files or in the archive, never in both or neither. A merge is journaled: writing ``merge.journal``
is its commit point, and whoever takes the lock next finishes or discards it, so a merger's crash
loses nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
from collections.abc import Iterable
from pathlib import Path

import structlog

from composition.errors import described
from composition.prometheus.directory import (
    LOCK_TIMEOUT_S,
    ProcessFile,
    locked,
    multiproc_dir,
    process_files,
    running,
)
from composition.prometheus.merging import DROPPED, MERGED, Values, archive_name, fold, read_values, write_values

__all__ = ["JOURNAL_NAME", "archive_dead_processes", "archive_processes", "archive_reaped_child", "interrupted",
           "recover"]

log = structlog.get_logger("composition.metrics")

JOURNAL_NAME = "merge.journal"
_PENDING_SUFFIX = ".pending"


def interrupted(directory: Path) -> bool:
    """Whether a committed merge was left unfinished (its merger died): call ``recover`` under
    the exclusive lock before reading the directory."""
    return (directory / JOURNAL_NAME).exists()


def recover(directory: Path) -> None:
    """Finish a committed merge, discard an uncommitted one. The caller holds the exclusive lock."""
    journal_path = directory / JOURNAL_NAME
    if journal_path.exists():
        _apply(directory, json.loads(journal_path.read_text()))
    for entry in os.scandir(directory):
        if entry.name.endswith(_PENDING_SUFFIX) or entry.name.endswith(".journal.tmp"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)


def archive_processes(directory: Path | str, pids: Iterable[int], *,
                      timeout_s: float = LOCK_TIMEOUT_S) -> int:
    """Merge the files of the dead processes ``pids`` into the archive; return how many files
    went. The processes must be dead: a living one would go on writing to a removed file.

    Raises MetricsDirectoryBusy when the lock is not had within ``timeout_s``; nothing changed
    then, and a later merge (or the sweep at the next start) takes the files.
    """
    directory = Path(directory)
    wanted = set(pids)
    with locked(directory, exclusive=True, timeout_s=timeout_s):
        recover(directory)
        return len(_merge(directory, [f for f in process_files(directory) if f.pid in wanted]))


def archive_dead_processes(directory: Path | str, *, timeout_s: float = LOCK_TIMEOUT_S) -> list[int]:
    """Merge the files of every process that no longer runs (never this one's); return their
    pids. For leftovers of processes that died unseen, e.g. before this one started."""
    directory = Path(directory)
    me = os.getpid()
    with locked(directory, exclusive=True, timeout_s=timeout_s):
        recover(directory)
        dead = [f for f in process_files(directory) if f.pid != me and not running(f.pid)]
        return sorted({f.pid for f in _merge(directory, dead)})


def archive_reaped_child(pid: int) -> None:
    """A supervisor's exit hook (runworkers' children, gunicorn's ``child_exit``): archive the
    files of the child ``pid`` it has just reaped, when ``PROMETHEUS_MULTIPROC_DIR`` is set."""
    directory = multiproc_dir()
    if directory is not None and directory.is_dir():
        archive_processes(directory, [pid])


def _merge(directory: Path, files: list[ProcessFile]) -> list[ProcessFile]:
    """Fold ``files`` into the archive and remove them; return the files that went."""
    archives: dict[str, Values] = {}
    gone: list[ProcessFile] = []
    for file in files:
        if file.prefix in DROPPED:
            gone.append(file)
            continue
        if file.prefix not in MERGED:  # "all" gauges (see merging.KEPT) and unknown modes stay
            continue
        try:
            values = read_values(file.path)
        except (OSError, RuntimeError, ValueError, struct.error) as exc:  # damaged: leave it, lose nothing
            log.error("metrics file could not be read, not archived", file=str(file.path),
                      error=described(exc))
            continue
        if file.prefix not in archives:
            archive = directory / archive_name(file.prefix)
            archives[file.prefix] = read_values(archive) if archive.exists() else {}
        fold(file.prefix, archives[file.prefix], values)
        gone.append(file)
    if not gone:
        return []
    for prefix, values in archives.items():
        write_values(directory / (archive_name(prefix) + _PENDING_SUFFIX), values)
    journal = {"archives": sorted(archives), "remove": sorted(f.path.name for f in gone)}
    # The commit point: until the rename the old state stands, after it the new one must win.
    # No fsync: the directory lives no longer than its host's processes (a tmpfs in containers),
    # so only a process crash, not a power loss, has to be survived.
    temporary = directory / (JOURNAL_NAME + ".tmp")
    temporary.write_text(json.dumps(journal))
    os.replace(temporary, directory / JOURNAL_NAME)
    _apply(directory, journal)
    return gone


def _apply(directory: Path, journal: dict[str, list[str]]) -> None:
    """Every step is idempotent, so a recovery may repeat a half-applied journal."""
    for prefix in journal["archives"]:
        pending = directory / (archive_name(prefix) + _PENDING_SUFFIX)
        if pending.exists():
            os.replace(pending, directory / archive_name(prefix))
    for name in journal["remove"]:
        with contextlib.suppress(FileNotFoundError):
            (directory / name).unlink()
    (directory / JOURNAL_NAME).unlink()
