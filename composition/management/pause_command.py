"""``PauseCommand``: what ``manage.py schedules`` and ``manage.py queues`` share: ``list`` (a
table, or ``--json``), ``pause NAME`` and ``resume NAME`` with ``--reason`` and ``--by`` (who:
the login name by default; a Django username puts the change in the admin's history too), and
one line instead of a traceback when the database does not answer."""

from __future__ import annotations

import getpass
from collections.abc import Sequence
from datetime import datetime
from typing import Any, ClassVar

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from composition.management.closed_pipe import reader_may_leave
from composition.management.database_errors import database_must_answer
from composition.pauses import PAUSE_PERMISSION, Pause

__all__ = ["PauseCommand", "moment", "operator_name", "operator_user", "pause_json", "paused_state"]


def operator_name(by: str | None) -> str:
    """``by`` when given, else the login name (marked as from manage.py)."""
    if by:
        return by
    try:
        return f"{getpass.getuser()} (manage.py)"
    except Exception:  # no login name (a container without a passwd entry)
        return "manage.py"


def operator_user(by: str | None) -> Any:
    """The Django user named ``by``, or None."""
    if not by:
        return None
    model = get_user_model()
    return model.objects.filter(**{model.USERNAME_FIELD: by}).first()


def moment(at: datetime | None) -> str:
    return at.strftime("%Y-%m-%d %H:%M:%SZ") if at else "-"


def paused_state(pause: Pause | None) -> str:
    """``running``, or who paused it (or that it was shed), since when and why."""
    if pause is None:
        return "running"
    who = "shed under pressure" if pause.shed else f"paused by {pause.changed_by}"
    return f"{who} since {moment(pause.changed_at)}" + (
        f" ({pause.reason})" if pause.reason else "")


def pause_json(pause: Pause | None) -> dict[str, str | bool] | None:
    """``--json``'s view of a pause: who, since when (ISO 8601), why, and whether the shedding
    controller made it; None when not paused."""
    if pause is None:
        return None
    return {"by": pause.changed_by, "since": pause.changed_at.isoformat(), "reason": pause.reason,
            "shed": pause.shed}


def _listed(names: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return " and ".join(filter(None, (", ".join(names[:-1]), names[-1])))


class PauseCommand(BaseCommand):
    """A subclass names what it pauses (``thing``), may add ``extra_actions``, and implements
    ``list_rows``, ``pause_one``, ``resume_one`` (and ``other_action`` for its extra ones)."""

    thing: ClassVar[str]
    extra_actions: ClassVar[tuple[str, ...]] = ()
    # The extra actions that take a name (the others take none), and those that print --json.
    extra_named: ClassVar[tuple[str, ...]] = ()
    extra_json: ClassVar[tuple[str, ...]] = ()
    # The actions that take --by and --reason.
    audited: ClassVar[tuple[str, ...]] = ("pause", "resume")

    def add_arguments(self, parser: CommandParser) -> None:
        actions = ["list", "pause", "resume", *self.extra_actions]
        parser.add_argument("action", choices=actions)
        named = ", ".join(["pause", "resume", *self.extra_named])
        parser.add_argument("name", nargs="?", help=f"the {self.thing} ({named})")
        parser.add_argument("--reason", default="", help="pause/resume: why, shown with the pause")
        parser.add_argument("--by", default=None,
                            help="pause/resume: who (default: the login name); a Django username puts the "
                                 "change in the admin's history of the pause too")
        parser.add_argument("--json", action="store_true",
                            help=f"{', '.join(['list', *self.extra_json])}: machine-readable output")

    def handle(self, *args: Any, **options: Any) -> None:
        with reader_may_leave(), database_must_answer():
            action, name = options["action"], options["name"]
            # An option the action does not take is refused, not ignored.
            if action not in self.audited and (options["by"] is not None or options["reason"]):
                raise CommandError(f"--by and --reason are for {_listed(self.audited)}, not {action}")
            if options["json"] and action not in ("list", *self.extra_json):
                raise CommandError(f"--json is for {_listed(('list', *self.extra_json))}, not {action}")
            if action not in ("pause", "resume", *self.extra_named):
                if name:
                    raise CommandError(f"{action} takes no name")
                if action == "list":
                    self.list_rows(options["json"])
                else:
                    self.other_action(action, None, as_json=options["json"])
                return
            if not name:
                raise CommandError(f"{action} needs a {self.thing}'s name ({self.thing}s list shows them)")
            if action not in ("pause", "resume"):
                self.other_action(action, name, as_json=options["json"])
                return
            by, user = operator_name(options["by"]), operator_user(options["by"])
            if user is not None and not user.has_perm(PAUSE_PERMISSION):
                # As the operations page refuses them, and deadletters --by a user without its permission.
                raise CommandError(f"--by {options['by']}: {PAUSE_PERMISSION} is required")
            change = self.pause_one if action == "pause" else self.resume_one
            try:
                self.stdout.write(change(name, by=by, reason=options["reason"], user=user))
            except ValueError as exc:  # a --by or --reason too long for the record
                raise CommandError(str(exc)) from None

    def write_table(self, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        """Columns padded to their widest cell; the last one, free text, left as it is."""
        table = [tuple(header), *(tuple(row) for row in rows)]
        widths = [max(len(line[column]) for line in table) for column in range(len(header) - 1)]
        for line in table:
            self.stdout.write("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=False))
                              + "  " + line[-1])

    def list_rows(self, as_json: bool) -> None:
        raise NotImplementedError

    def pause_one(self, name: str, *, by: str, reason: str, user: Any) -> str:
        """Pause ``name``; the line to print. Raise CommandError for a name it cannot pause."""
        raise NotImplementedError

    def resume_one(self, name: str, *, by: str, reason: str, user: Any) -> str:
        raise NotImplementedError

    def other_action(self, action: str, name: str | None, *, as_json: bool) -> None:
        """An extra action (``name`` None for one in ``extra_named``'s complement)."""
        raise NotImplementedError
