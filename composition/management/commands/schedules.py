"""``manage.py schedules list | pause NAME | resume NAME | run NAME``."""

from __future__ import annotations

import getpass
import json
from dataclasses import asdict
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from composition.management.database_errors import database_must_answer
from composition.pauses import Pause, pause, resume
from composition.schedules import TZDATA_VERSION, declared
from composition.schedules.firing import run_now
from composition.schedules.problems import problems
from composition.schedules.status import ScheduleRow, schedule_rows


def _when(at: datetime | None) -> str:
    return at.strftime("%Y-%m-%d %H:%M:%SZ") if at else "-"


def _json_row(row: ScheduleRow) -> dict[str, Any]:
    data = asdict(row)
    data["paused"] = None if row.paused is None else {
        "by": row.paused.changed_by, "since": row.paused.changed_at.isoformat(), "reason": row.paused.reason}
    for key in ("last_fired_at", "next_fire_at"):
        data[key] = data[key].isoformat() if data[key] else None
    data["problems"] = list(row.problems)
    return data


class Command(BaseCommand):
    help = ("List the declared schedules (last and next fire, lag, counts of missed and skipped ticks), "
            "pause or resume one for every host (durably), or run one now.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["list", "pause", "resume", "run"])
        parser.add_argument("name", nargs="?", help="the schedule (pause, resume, run)")
        parser.add_argument("--reason", default="", help="pause/resume: why, shown with the pause")
        parser.add_argument("--by", default=None,
                            help="pause/resume: who (default: the login name); a Django username puts the "
                                 "change in the admin's history of the pause too")
        parser.add_argument("--json", action="store_true", help="list: machine-readable output")

    def handle(self, *args: Any, **options: Any) -> None:
        with database_must_answer():
            self._handle(options)

    def _handle(self, options: dict[str, Any]) -> None:
        action, name = options["action"], options["name"]
        if action == "list":
            if name:
                raise CommandError("list takes no name")
            self._list(options["json"])
            return
        if not name:
            raise CommandError(f"{action} needs a schedule's name (schedules list shows them)")
        entry = declared().get(name)
        if entry is None:
            known = ", ".join(sorted(declared())) or "none is declared"
            raise CommandError(f"no schedule named {name!r} ({known})")
        by = options["by"] or _login()
        user = _user(options["by"])
        if action == "pause":
            _, changed = pause(Pause.SCHEDULE, name, by=by, reason=options["reason"], user=user)
            self.stdout.write(f"schedule {name} paused" if changed else f"schedule {name} was paused already")
        elif action == "resume":
            _, changed = resume(Pause.SCHEDULE, name, by=by, reason=options["reason"], user=user)
            self.stdout.write(f"schedule {name} resumed: the next tick fires" if changed
                              else f"schedule {name} was not paused")
        else:
            found = problems(entry)
            if found:
                raise CommandError(f"schedule {name} cannot run: {'; '.join(found)}")
            tick = run_now(entry)
            self.stdout.write(f"schedule {name} run now (tick {tick}); its regular ticks are unchanged")

    def _list(self, as_json: bool) -> None:
        rows = schedule_rows()
        if as_json:
            self.stdout.write(json.dumps({"tzdata": TZDATA_VERSION, "schedules": [_json_row(row) for row in rows]},
                                         indent=2))
            return
        self.stdout.write(f"time zones: tzdata {TZDATA_VERSION}")
        if not rows:
            self.stdout.write("no schedules declared")
            return
        header = ("name", "job", "when", "tz", "last fire", "next fire", "lag s", "missed", "skipped", "state")
        table = [header]
        for row in rows:
            state = "problem: " + "; ".join(row.problems) if row.problems else (
                f"paused by {row.paused.changed_by} since {_when(row.paused.changed_at)}"
                + (f" ({row.paused.reason})" if row.paused.reason else "") if row.paused else "running")
            table.append((row.name, row.job, row.expression, row.tz, _when(row.last_fired_at),
                          _when(row.next_fire_at), f"{row.lag_s:.1f}", str(row.missed), str(row.skipped), state))
        widths = [max(len(line[column]) for line in table) for column in range(len(header) - 1)]
        for line in table:
            self.stdout.write("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=False))
                              + "  " + line[-1])


def _user(username: str | None) -> Any:
    if not username:
        return None
    model = get_user_model()
    return model.objects.filter(**{model.USERNAME_FIELD: username}).first()


def _login() -> str:
    try:
        return f"{getpass.getuser()} (manage.py)"
    except Exception:  # no login name (a container without a passwd entry)
        return "manage.py"
