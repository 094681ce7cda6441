"""Tick instants: cron in a zone across both 2026 DST transitions in Europe/Berlin (UTC instants
written out by hand from the transition times, not produced by the parser), and ``every``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import islice, takewhile
from zoneinfo import ZoneInfoNotFoundError

import pytest

from composition.schedules import Schedule, schedule_zone
from composition.schedules.ticks import ticks_after


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def _ticks(cron: str, start: str, end: str) -> list[str]:
    declared = Schedule(name="t", actor_name="t", cron=cron, tz="Europe/Berlin")
    # From ``start`` included (ticks_after is strictly after) to ``end`` excluded.
    ticks = takewhile(lambda at: at < _utc(end), ticks_after(declared, _utc(start) - timedelta(seconds=1)))
    return [at.strftime("%m-%d %H:%M") for at in ticks]


# Spring: 2026-03-29 at 01:00Z Berlin goes from 02:00 CET (+1) to 03:00 CEST (+2): 02:xx does not
# exist. Fall: 2026-10-25 at 01:00Z it goes from 03:00 CEST back to 02:00 CET: 02:xx happens twice
# (00:xxZ, then 01:xxZ). Each window is the Berlin day: from its midnight (23:00Z in CET, 22:00Z in
# CEST) to the next.
SPRING = ("2026-03-28 23:00", "2026-03-29 22:00")
FALL = ("2026-10-24 22:00", "2026-10-25 23:00")


def test_a_daily_run_in_the_missing_hour_runs_at_the_jump_and_in_the_repeated_hour_once() -> None:
    # Debian cron: a job at a fixed time that does not exist runs when the clock jumps (03:00
    # CEST = 01:00Z); in the repeated hour it runs once, at the first 02:30 (CEST, 00:30Z).
    assert _ticks("30 2 * * *", *SPRING) == ["03-29 01:00"]
    assert _ticks("30 2 * * *", *FALL) == ["10-25 00:30"]


def test_a_wildcard_minute_in_hour_2_skips_the_missing_hour_and_runs_twice_in_the_repeated_one() -> None:
    # A minute field starting with '*' is not a fixed time: no 02:xx, no run; 02:xx twice, eight runs.
    assert _ticks("*/15 2 * * *", *SPRING) == []
    assert _ticks("*/15 2 * * *", *FALL) == ["10-25 00:00", "10-25 00:15", "10-25 00:30", "10-25 00:45",
                                             "10-25 01:00", "10-25 01:15", "10-25 01:30", "10-25 01:45"]


def test_every_two_hours_skips_the_missing_02_00_and_runs_the_repeated_02_00_twice() -> None:
    assert _ticks("0 */2 * * *", *SPRING)[:3] == ["03-28 23:00", "03-29 02:00", "03-29 04:00"]  # 00:00, 04:00, 06:00
    assert _ticks("0 */2 * * *", *FALL)[:4] == ["10-24 22:00", "10-25 00:00", "10-25 01:00", "10-25 03:00"]


def test_hourly_has_23_runs_on_the_spring_day_and_25_on_the_fall_day() -> None:
    spring, fall = _ticks("0 * * * *", *SPRING), _ticks("0 * * * *", *FALL)
    assert len(spring) == 23 and "03-29 01:00" in spring  # 01:00Z is 03:00 CEST; 02:00 never was
    assert len(fall) == 25 and fall[1:4] == ["10-24 23:00", "10-25 00:00", "10-25 01:00"]  # 02:00 CEST, then 02:00 CET


def test_every_counts_from_the_epoch_or_start_in_utc_whole_seconds() -> None:
    every = Schedule(name="e", actor_name="e", every=timedelta(seconds=30))
    after = _utc("2026-03-29 00:59:45.5")
    assert list(islice(ticks_after(every, after), 3)) == [
        _utc("2026-03-29 01:00:00"), _utc("2026-03-29 01:00:30"), _utc("2026-03-29 01:01:00")]
    started = Schedule(name="s", actor_name="s", every=timedelta(seconds=7), start=_utc("2026-01-01 00:00:03"))
    assert list(islice(ticks_after(started, _utc("2025-12-31 00:00")), 2)) == [
        _utc("2026-01-01 00:00:03"), _utc("2026-01-01 00:00:10")]


def test_zones_come_from_the_tzdata_package_and_a_path_is_not_a_zone() -> None:
    assert schedule_zone("Europe/Berlin").key == "Europe/Berlin"
    for name in ("Mars/Olympus", "../../etc/passwd", "/etc/localtime", ""):
        with pytest.raises(ZoneInfoNotFoundError):
            schedule_zone(name)
