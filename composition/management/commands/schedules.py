"""``manage.py schedules list | pause NAME | resume NAME | run NAME``."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from django.core.management.base import CommandError

from composition.management.pause_command import PauseCommand, moment, pause_json, paused_state
from composition.pauses import Pause, kept_reason, paused_names
from composition.schedules import TZDATA_VERSION, Schedule, declared, pause_schedule, resume_schedule
from composition.schedules.firing import run_now
from composition.schedules.problems import problems
from composition.schedules.status import ScheduleRow, schedule_rows


def _json_row(row: ScheduleRow) -> dict[str, Any]:
    data = asdict(row)
    data["paused"] = pause_json(row.paused)
    for key in ("last_fired_at", "next_fire_at", "left_until"):
        data[key] = data[key].isoformat() if data[key] else None
    data["problems"] = list(row.problems)
    return data


class Command(PauseCommand):
    help = ("List the declared schedules (last and next fire, lag, counts of missed and skipped ticks), "
            "pause or resume one for every host (durably), or run one now.")
    thing = "schedule"
    extra_actions = ("run",)
    extra_named = ("run",)
    # A schedule with a problem is what an operator runs this to see: composition.E121 would stop
    # the command before it listed it ("problem: ..." in its row).
    requires_system_checks: list[str] = []

    def _declared(self, name: str) -> Schedule:
        entry = declared().get(name)
        if entry is None:
            known = ", ".join(map(str, declared())) or "none is declared"
            raise CommandError(f"no schedule named {name!r} ({known})")
        return entry

    def pause_one(self, name: str, *, by: str, reason: str, user: Any) -> str:
        row, changed = pause_schedule(self._declared(name).name, by=by, reason=reason, user=user)
        return (f"schedule {name} paused" if changed
                else f"schedule {name} was paused already" + kept_reason(row, reason))

    def resume_one(self, name: str, *, by: str, reason: str, user: Any) -> str:
        if name not in paused_names(Pause.SCHEDULE):
            self._declared(name)  # a name no code declares may still be paused: that pause is lifted
        _, changed = resume_schedule(name, by=by, reason=reason, user=user)
        return f"schedule {name} resumed: the next tick fires" if changed else f"schedule {name} was not paused"

    def other_action(self, action: str, name: str | None, *, as_json: bool) -> None:  # run
        assert name is not None  # run is in extra_named
        entry = self._declared(name)
        found = problems(entry)
        if found:
            raise CommandError(f"schedule {name} cannot run: {'; '.join(found)}")
        tick = run_now(entry)
        paused = entry.name in paused_names(Pause.SCHEDULE)
        self.stdout.write(f"schedule {name} run now (tick {tick}); its regular ticks are unchanged"
                          + (" (paused: they stay paused)" if paused else ""))

    def list_rows(self, as_json: bool) -> None:
        rows = schedule_rows()
        if as_json:
            self.stdout.write(json.dumps({"tzdata": TZDATA_VERSION, "schedules": [_json_row(row) for row in rows]},
                                         indent=2))
            return
        self.stdout.write(f"time zones: tzdata {TZDATA_VERSION}")
        if not rows:
            self.stdout.write("no schedules declared")
            return
        lines = []
        for row in rows:
            state = paused_state(row.paused)
            if row.left_until is not None:
                handed = f"left to the hosts of its new timing ({row.left_to_timing}) until {moment(row.left_until)}"
                state = handed if row.paused is None else f"{state}; {handed}"
            if row.problems:  # and, when it is paused too, by whom and why
                state = "problem: " + "; ".join(row.problems) + ("" if row.paused is None else f"; {state}")
            lines.append((row.name, row.job, row.expression, row.tz, moment(row.last_fired_at),
                          moment(row.next_fire_at), f"{row.lag_s:.1f}", str(row.missed), str(row.skipped), state))
        self.write_table(("name", "job", "when", "tz", "last fire", "next fire", "lag s", "missed", "skipped",
                          "state"), lines)
