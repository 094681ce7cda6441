"""What is wrong with a declared schedule, in words: ``problems(schedule)``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from cronsim import CronSim, CronSimError

from composition.errors import described
from composition.schedules.declaration import CATCH_UP, OVERLAP, Schedule
from composition.schedules.firing import MAX_TICKS_PER_ROUND
from composition.schedules.ticks import schedule_zone

__all__ = ["MIN_GRACE", "problems"]

MIN_GRACE = timedelta(seconds=1)


def _timing(declared: Schedule) -> list[str]:
    if (declared.cron is None) == (declared.every is None):
        return ["give exactly one of cron= and every="]
    if declared.every is not None:
        if not isinstance(declared.every, timedelta):
            return [f"every= must be a timedelta, got {declared.every!r}"]
        seconds = declared.every.total_seconds()
        if seconds < 1 or seconds != int(seconds):
            return [f"every= must be a whole number of seconds, at least 1, got {declared.every!r}"]
        if declared.start is not None and (not isinstance(declared.start, datetime) or declared.start.tzinfo is None):
            return [f"start= must be an aware datetime, got {declared.start!r}"]
        return []
    if not isinstance(declared.cron, str) or len(declared.cron.split()) != 5:
        return [f"cron= must be a five-field cron expression, got {declared.cron!r}"]
    try:
        zone = schedule_zone(declared.tz)
    except Exception:
        return [f"unknown time zone tz={declared.tz!r} (zones come from the tzdata package)"]
    try:
        CronSim(declared.cron, datetime.now(UTC).astimezone(zone))
    except (CronSimError, ValueError, KeyError) as exc:
        return [f"bad cron expression {declared.cron!r}: {exc}"]
    return []


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # True is an int to Python


def _policies(declared: Schedule) -> list[str]:
    found = []
    if declared.catch_up not in CATCH_UP:
        found.append(f"catch_up= must be one of {', '.join(CATCH_UP)}, got {declared.catch_up!r}")
    elif declared.catch_up == "all" and not (isinstance(declared.catch_up_window, timedelta)
                                            and declared.catch_up_window > timedelta(0)):
        found.append("catch_up='all' needs catch_up_window= (a positive timedelta)")
    if not _integer(declared.catch_up_max) or not 1 <= declared.catch_up_max <= MAX_TICKS_PER_ROUND:
        found.append(f"catch_up_max= must be an integer from 1 to {MAX_TICKS_PER_ROUND}, got {declared.catch_up_max!r}")
    if declared.overlap not in OVERLAP:
        found.append(f"overlap= must be one of {', '.join(OVERLAP)}, got {declared.overlap!r}")
    if declared.max_pending is not None and (not _integer(declared.max_pending) or declared.max_pending < 1):
        found.append(f"max_pending= must be a positive integer or None, got {declared.max_pending!r}")
    if not isinstance(declared.grace, timedelta) or declared.grace < MIN_GRACE:
        # A round reaches a tick a few milliseconds after it: with less, every tick is late.
        found.append(f"grace= must be a timedelta of at least {MIN_GRACE.total_seconds():g}s (a round runs a "
                     f"little after its tick), got {declared.grace!r}")
    if declared.tz != "UTC" and declared.every is not None:
        found.append("tz= applies to cron= only: every= ticks are counted in UTC")
    # Silently ignored, both: the author meant something the schedule would not do.
    if declared.start is not None and declared.cron is not None:
        found.append("start= applies to every= only: a cron= schedule's ticks come from its expression")
    if declared.catch_up_window is not None and declared.catch_up != "all":
        found.append(f"catch_up_window= applies to catch_up='all' only, not {declared.catch_up!r}")
    return found


def _payload(declared: Schedule) -> list[str]:
    # The same checks publish() makes, so the first tick cannot fail on them.
    from composition.outbox.publish import declared_actor, fitting_payload

    try:
        fitting_payload(declared_actor(declared.actor_name), declared.payload)
    except (ValueError, TypeError) as exc:
        return [f"the payload does not fit {declared.actor_name}: {described(exc)}"]
    return []


def problems(declared: Schedule) -> list[str]:
    """Each problem of ``declared`` as a sentence; empty when it can run."""
    name = declared.name
    if not isinstance(name, str) or not name.strip() or name != name.strip() or len(name) > 200:
        return [f"name= must be a string of at most 200 characters, not blank and without spaces around it, "
                f"got {name!r}"]
    return _timing(declared) + _policies(declared) + _payload(declared)
