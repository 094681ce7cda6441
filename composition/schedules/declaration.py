"""Declaring a schedule: ``schedule(job, cron=... | every=..., ...)`` in an app's ``schedules.py``.

A declaration is only recorded here; ``problems()`` says what is wrong with one (a bad
expression, an unknown zone, a payload the job refuses), for the system check and the scheduler,
so a mistake surfaces at ``manage.py check``, not at the first tick.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

__all__ = ["CATCH_UP", "DEFAULT_GRACE", "EPOCH", "OVERLAP", "SCHEDULE_HEADER", "CatchUp", "Overlap", "Schedule",
           "declared", "duplicate_names", "forget", "schedule"]

CATCH_UP = ("skip", "latest", "all")
OVERLAP = ("allow", "skip")
# For type checkers: a typo is found before `manage.py check` finds it (E121).
CatchUp = Literal["skip", "latest", "all"]
Overlap = Literal["allow", "skip"]
# How late a tick may be and still fire as on time (a scheduler restarting, a slow round).
DEFAULT_GRACE = timedelta(seconds=30)
# The message header (in options["composition"]) of a scheduled run: {"name", "tick", "fire_at",
# "catch_up", "manual"}.
SCHEDULE_HEADER = "schedule"
# Where ``every`` ticks count from when no ``start`` is given.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

_declared: dict[str, Schedule] = {}
_duplicates: list[str] = []


@dataclass(frozen=True)
class Schedule:
    """One declared schedule; see ``schedule()`` for the fields."""

    name: str
    actor_name: str
    cron: str | None = None
    every: timedelta | None = None
    tz: str = "UTC"
    catch_up: str = "latest"
    catch_up_window: timedelta | None = None
    catch_up_max: int = 100
    overlap: str = "allow"
    max_pending: int | None = None
    payload: Mapping[str, Any] = field(default_factory=dict)
    start: datetime | None = None
    grace: timedelta = DEFAULT_GRACE
    # Named after its job (no name= given): a rename of the job renames the schedule too.
    named_after_job: bool = field(default=False, compare=False)

    @property
    def when(self) -> str:
        """``"cron 30 2 * * *"`` or ``"every 30s"``, as ``schedules list`` shows it."""
        if self.cron is not None:
            # Spaces are not timing: a re-indented expression must not restart the schedule.
            return f"cron {' '.join(self.cron.split()) if isinstance(self.cron, str) else self.cron}"
        if self.every is None:
            return "-"
        if not isinstance(self.every, timedelta):  # problems() names it; shown as given meanwhile
            return f"every {self.every!r}"
        # Whole seconds (problems() requires them), not :g, which prints 1000000 as 1e+06 and
        # gives 1000000 and 1000001 the same timing.
        return f"every {int(self.every.total_seconds())}s"

    @property
    def timing(self) -> str:
        """What decides the ticks' instants (``when``, with the zone or the start): a schedule
        whose timing changed starts again from the deploy, as a new one does."""
        if self.cron is not None:
            return f"{self.when} tz={self.tz}"
        return f"{self.when} start={self.start.isoformat() if self.start else '-'}"


def schedule(job: Any, *, cron: str | None = None, every: timedelta | None = None, tz: str = "UTC",
             catch_up: CatchUp = "latest", overlap: Overlap = "allow", payload: Mapping[str, Any] | None = None,
             name: str | None = None, start: datetime | None = None, catch_up_window: timedelta | None = None,
             catch_up_max: int = 100, max_pending: int | None = None,
             grace: timedelta = DEFAULT_GRACE) -> Schedule:
    """Run ``job`` with ``payload`` (its keyword arguments) at every tick of ``cron`` (five fields,
    read as Debian's cron reads them, in the zone ``tz``) or ``every`` (a whole number of seconds;
    ticks at ``start + k * every``, ``start`` defaulting to the Unix epoch, in UTC).

    ``catch_up`` decides what fires of the ticks missed while no scheduler ran (later than
    ``grace``): ``"skip"`` none, ``"latest"`` the most recent one, ``"all"`` each one within
    ``catch_up_window`` (required), oldest first, at most ``catch_up_max``. ``overlap="skip"``
    skips a tick while the previous run is still queued or running; ``max_pending`` bounds the
    runs of this schedule waiting in the queue. ``name`` defaults to the job's actor name; it
    keys the schedule's state, so renaming one starts it afresh.

    Nothing is checked here: ``manage.py check`` reports every problem, naming the schedule.
    """
    actor_name = str(getattr(job, "actor_name", job))
    declared = Schedule(name=name or actor_name, actor_name=actor_name, cron=cron, every=every, tz=tz,
                        catch_up=catch_up, catch_up_window=catch_up_window, catch_up_max=catch_up_max,
                        overlap=overlap, max_pending=max_pending,
                        # Not a mapping (payload="x"): kept as given, for manage.py check to name.
                        payload=dict(payload) if isinstance(payload, Mapping) else {} if payload is None else payload,
                        start=start, grace=grace, named_after_job=name is None)
    if declared.name in _declared and _declared[declared.name] != declared:
        _duplicates.append(declared.name)
    _declared[declared.name] = declared
    return declared


def declared() -> dict[str, Schedule]:
    """Every declared schedule by name, in the names' order (each app's ``schedules.py`` is
    imported at start-up). A name that is not a string (``problems()`` names it) sorts by its
    text rather than failing every listing."""
    return dict(sorted(_declared.items(), key=lambda item: str(item[0])))


def duplicate_names() -> list[str]:
    """Names declared twice with different arguments (the check reports them)."""
    return list(_duplicates)


def forget(name: str) -> None:
    """Remove a declaration (tests declare schedules of their own)."""
    _declared.pop(name, None)
    while name in _duplicates:
        _duplicates.remove(name)

