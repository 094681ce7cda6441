"""How one dead process's samples fold into the archive, per file kind and gauge mode.

Files are read and written with prometheus_client's own ``MmapedDict`` (an internal, used only
here), so the archive stays readable by ``MultiProcessCollector`` across upgrades. Histogram
buckets are stored per bucket, not cumulative, so adding them, like counters, ``_sum`` and
``_count``, is exact.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from prometheus_client.mmap_dict import MmapedDict

__all__ = ["ARCHIVE_PID", "DROPPED", "KEPT", "MERGED", "Values", "archive_name", "fold", "read_values",
           "write_values"]

# key -> (value, timestamp)
Values = dict[str, tuple[float, float]]
# A file's header: the used length (4 bytes) and padding (4 bytes).
_HEADER_BYTES = 8

# The archive's files are named like a process's, with this for a pid: MultiProcessCollector
# reads the file's kind and gauge mode from the name as for any process, and for the gauge modes
# we merge (min, max, sum, mostrecent) it drops the pid from the labels.
ARCHIVE_PID = "archive"


def _add(old: tuple[float, float], new: tuple[float, float]) -> tuple[float, float]:
    return old[0] + new[0], max(old[1], new[1])


def _max(old: tuple[float, float], new: tuple[float, float]) -> tuple[float, float]:
    return new if new[0] > old[0] else old


def _min(old: tuple[float, float], new: tuple[float, float]) -> tuple[float, float]:
    return new if new[0] < old[0] else old


def _most_recent(old: tuple[float, float], new: tuple[float, float]) -> tuple[float, float]:
    return new if new[1] > old[1] else old


# Kinds whose dead processes still count, as prometheus_client defines them ("alive or dead"),
# and how two of their values become one.
MERGED: dict[str, Callable[[tuple[float, float], tuple[float, float]], tuple[float, float]]] = {
    "counter": _add,
    "histogram": _add,
    "summary": _add,
    "gauge_sum": _add,
    "gauge_max": _max,
    "gauge_min": _min,
    "gauge_mostrecent": _most_recent,
}
# Live gauges count only living processes: a dead one's file goes (mark_process_dead does this).
DROPPED = frozenset({"gauge_liveall", "gauge_livesum", "gauge_livemax", "gauge_livemin",
                     "gauge_livemostrecent"})
# "all" gauges are one series per process, alive or dead, labelled by its pid; one archive
# cannot hold several pids' series (the collector labels a file's samples with one pid), so a
# dead process's "all" file stays as it is. composition defines no such gauge.
KEPT = frozenset({"gauge_all"})


def archive_name(prefix: str) -> str:
    return f"{prefix}_{ARCHIVE_PID}.db"


def fold(prefix: str, into: Values, values: Values) -> None:
    """Merge ``values`` of a ``prefix`` file into ``into``, in place."""
    combine = MERGED[prefix]
    for key, value in values.items():
        old = into.get(key)
        into[key] = value if old is None else combine(old, value)


def read_values(path: Path) -> Values:
    """Every sample of one file. Reads only the used part, as the collector does. A file shorter
    than its header holds nothing: its process died between creating and sizing it."""
    if path.stat().st_size < _HEADER_BYTES:
        return {}
    return {key: (value, timestamp)
            for key, value, timestamp, _ in MmapedDict.read_all_values_from_file(str(path))}


def write_values(path: Path, values: Values) -> None:
    """Write ``values`` as a new file at ``path`` (replacing any file there)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    # MmapedDict is the writer every process uses; it appends keys in the same layout the
    # reader expects. It is not thread safe, which does not matter for a file nobody else has.
    store = MmapedDict(str(path))
    try:
        for key, (value, timestamp) in values.items():
            store.write_value(key, value, timestamp)
    finally:
        store.close()
