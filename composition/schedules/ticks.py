"""When a schedule ticks: the instants (UTC, whole seconds) after a given one.

Cron expressions are cronsim's (Debian cron's rules, DST quirks included: docs/schedules.md has
the table); zones come from the ``tzdata`` package only, never the host's zone files, so every
host computes the same instant for one tick whatever its operating system ships.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import cache
from importlib import resources
from zoneinfo import ZoneInfo

import tzdata
from cronsim import CronSim

from composition.schedules.declaration import EPOCH, Schedule

__all__ = ["TZDATA_VERSION", "next_tick", "schedule_zone", "ticks_after"]

TZDATA_VERSION: str = tzdata.IANA_VERSION


@cache
def schedule_zone(name: str) -> ZoneInfo:
    """The zone ``name`` from the ``tzdata`` package (``ZoneInfoNotFoundError`` when it has none).

    ``ZoneInfo(name)`` would read the system's zone files first, which differ between hosts."""
    from zoneinfo import ZoneInfoNotFoundError

    if not name or name.startswith(("/", ".")) or ".." in name.split("/"):
        raise ZoneInfoNotFoundError(f"No time zone found with key {name}")
    try:
        with resources.files("tzdata.zoneinfo").joinpath(*name.split("/")).open("rb") as source:
            return ZoneInfo.from_file(source, key=name)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, ValueError) as exc:
        raise ZoneInfoNotFoundError(f"No time zone found with key {name}") from exc


def _whole_seconds(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(microsecond=0)


def ticks_after(declared: Schedule, after: datetime) -> Iterator[datetime]:
    """The schedule's ticks later than ``after`` (aware), in order, as aware UTC datetimes."""
    after = after.astimezone(UTC)
    if declared.every is not None:
        period = int(declared.every.total_seconds())
        anchor = _whole_seconds(declared.start) if declared.start is not None else EPOCH
        elapsed = (after - anchor) // timedelta(seconds=1)
        k = max(elapsed // period + 1, 0)
        while True:
            yield anchor + timedelta(seconds=k * period)
            k += 1
    assert declared.cron is not None
    zone = schedule_zone(declared.tz)
    # cronsim keeps wall time (without fold) for expressions at fixed hours and minutes, so in a
    # repeated hour it can answer an instant before ``after``: those are passed over.
    for tick in CronSim(declared.cron, after.astimezone(zone)):
        at = tick.astimezone(UTC)
        if at > after:
            yield at


def next_tick(declared: Schedule, after: datetime) -> datetime:
    """The first tick later than ``after``."""
    return next(ticks_after(declared, after))
