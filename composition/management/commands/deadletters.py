"""``manage.py deadletters``: list, show, replay, discard or prune dead letters."""

from __future__ import annotations

import json
from typing import Any

from django.apps import apps
from django.core.exceptions import PermissionDenied
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, transaction
from django.db.models import Max, QuerySet

from composition.errors import CompositionError
from composition.jobs import replay as service
from composition.jobs.models import DeadLetter
from composition.management.closed_pipe import reader_may_leave
from composition.management.database_errors import database_must_answer
from composition.management.dead_letter_listing import detail, detail_lines, listing, listing_lines
from composition.management.pause_command import operator_user
from composition.management.retention_option import SECONDS_PER_DAY, older_than_days
from composition.retention import prune_dead_letters

# The options that narrow a selection, besides --id.
FILTERS = ("actor", "task", "error", "fingerprint")
FILTERS_SHOWN = "/".join(f"--{name}" for name in FILTERS)


def _in_history(user: Any, action: str, pks: list[int]) -> None:
    """With ``--by``, the letters acted on go in that user's admin history (each letter's, and
    Recent actions), as the admin's actions do. Never fails the action, which has been done."""
    if user is None or user.pk is None or not pks or not apps.is_installed("django.contrib.admin"):
        return
    from django.contrib.admin.models import CHANGE, LogEntry  # an API-only project has no admin

    try:
        LogEntry.objects.log_actions(user_id=user.pk, queryset=DeadLetter.objects.filter(pk__in=pks),
                                     action_flag=CHANGE,
                                     change_message=f"{action.capitalize()}ed with manage.py deadletters.")
    except DatabaseError:
        pass  # the letters say who (replayed_by, discarded_by); only the history entry is missing


def _missing(ids: list[int] | None, found: Any) -> list[int]:
    """The ids asked for that ``found`` (rows, or a queryset of them) does not hold, in order."""
    present = {row.pk for row in found}
    return [pk for pk in dict.fromkeys(ids or []) if pk not in present]


def _filtered(options: dict[str, Any]) -> bool:
    """Whether a filter narrows the ids asked for."""
    return any(options[name] for name in FILTERS)


def _why_not_open(pk: int) -> str:
    status = DeadLetter.objects.filter(pk=pk).values_list("status", flat=True).first()
    if status is None:
        return "no such dead letter"
    if status == DeadLetter.Status.DEAD:  # open, but left out by the other options given
        return f"does not match {FILTERS_SHOWN}/--max-id"
    return f"already {status}"


class Command(BaseCommand):
    help = ("List, show, replay, discard or prune dead letters. Replay and discard act on one --id at once; "
            "a bulk selection (several ids, a filter or --all) only prints its count unless --yes is given. "
            "Prune deletes replayed or discarded dead letters older than --older-than days, in batches.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["list", "show", "replay", "discard", "prune"])
        parser.add_argument("--id", dest="ids", type=int, action="extend", nargs="+", default=None,
                            help="dead letter ids: --id 3 4 or --id 3 --id 4")
        parser.add_argument("--actor", help="only this actor")
        parser.add_argument("--task", help="only this django.tasks task (its module path)")
        parser.add_argument("--error", help="only this error class (full or last dotted part)")
        parser.add_argument("--fingerprint", help="only this failure group")
        parser.add_argument("--all", action="store_true",
                            help="list: every status, not only dead; replay/discard: act without a filter")
        parser.add_argument("--older-than", type=float, default=None, dest="older_than",
                            help="prune: resolved over this many days ago (default DEAD_LETTER_RETENTION_S)")
        parser.add_argument("--max-id", type=int, default=None, dest="max_id",
                            help="replay/discard: only dead letters up to this id, as the count without --yes "
                                 "printed it (so what failed since is left alone)")
        parser.add_argument("--dry-run", action="store_true", help="print what would be done, do nothing")
        parser.add_argument("--yes", action="store_true", help="carry out a bulk replay or discard")
        parser.add_argument("--json", action="store_true", help="machine-readable output")
        parser.add_argument("--by", default=None,
                            help="replay/discard: the Django user who does it, recorded on each letter (as "
                                 "the admin records its user) and whose permission is checked")

    def handle(self, *args: Any, **options: Any) -> None:
        with reader_may_leave(), database_must_answer():
            try:
                self._handle(options)
            except PermissionDenied as exc:  # the user --by names may not do it
                raise CommandError(f"--by {options['by']}: {exc}") from None

    def _handle(self, options: dict[str, Any]) -> None:
        action = options["action"]
        # An option the action does not take is refused, not ignored.
        for name, takers in (("older_than", ("prune",)), ("max_id", ("replay", "discard")),
                             ("by", ("replay", "discard")), ("yes", ("replay", "discard")),
                             ("dry_run", ("replay", "discard", "prune"))):
            if options[name] not in (None, False) and action not in takers:
                raise CommandError(f"--{name.replace('_', '-')} is for {' and '.join(takers)}, not {action}")
        for name in FILTERS:
            # A blank filter would match every dead letter (it filters on nothing): refused.
            if options[name] is not None and not options[name].strip():
                raise CommandError(f"--{name} is empty")
        filtered = bool(options["ids"]) or _filtered(options)
        options["user"] = operator_user(options["by"])
        if options["by"] is not None and options["user"] is None:
            raise CommandError(f"--by {options['by']}: no Django user has that username")
        if action == "list":
            status = None if options["all"] else DeadLetter.Status.DEAD
            self._list(self._select(options, status), options["json"])
        elif action == "prune":
            if filtered or options["all"]:
                raise CommandError("prune takes no --id, filter or --all: it deletes every replayed or "
                                   "discarded dead letter older than --older-than days")
            self._prune(options)
        elif action == "show":
            if not options["ids"]:
                raise CommandError("show needs --id")
            self._show(self._select(options, None), options)
        else:
            if not filtered and not options["all"]:
                raise CommandError(f"{action} needs --id, a filter ({FILTERS_SHOWN}) or --all")
            self._act(action, self._select(options, DeadLetter.Status.DEAD), options)

    def _select(self, options: dict[str, Any], status: str | None) -> QuerySet[DeadLetter]:
        try:
            return service.filter_dead_letters(ids=options["ids"], actor=options["actor"], task=options["task"],
                                               error=options["error"],
                                               fingerprint=options["fingerprint"], status=status,
                                               max_id=options["max_id"])
        except CompositionError as exc:  # an ambiguous fingerprint prefix
            raise CommandError(str(exc)) from exc

    def _emit(self, data: Any) -> None:
        self.stdout.write(json.dumps(data, indent=2, sort_keys=True))

    def _list(self, rows: QuerySet[DeadLetter], as_json: bool) -> None:
        found = listing(rows)
        if as_json:
            self._emit(found)
            return
        for line in listing_lines(found):
            self.stdout.write(line)

    def _show(self, rows: QuerySet[DeadLetter], options: dict[str, Any]) -> None:
        ids, as_json = options["ids"], options["json"]
        found = list(rows.select_related("replayed_by", "discarded_by"))
        missing = _missing(ids, found)
        if not found:
            raise CommandError(f"no dead letter with id {', '.join(map(str, missing))}"
                               + (" that matches the filters" if _filtered(options) else ""))
        if as_json:
            self._emit([detail(row) for row in found])
        else:
            for row in found:
                for line in detail_lines(row):
                    self.stdout.write(line)
        if missing:
            raise CommandError(f"no dead letter with id {', '.join(map(str, missing))}"
                               + (" that matches the filters" if _filtered(options) else ""))

    def _act(self, action: str, rows: QuerySet[DeadLetter], options: dict[str, Any]) -> None:
        count = rows.count()
        ids = options["ids"] or []
        # One --id alone is acted on at once; with any other option it is a selection like any.
        bulk = len(ids) != 1 or _filtered(options) or options["all"] or options["max_id"] is not None
        if options["dry_run"] or (bulk and not options["yes"]):
            upto = rows.aggregate(upto=Max("id"))["upto"]
            if options["json"] and not options["dry_run"]:
                self._emit({"action": action, "count": count, "max_id": upto, "done": False})
            if count == 0:
                # As the run itself would: a mistyped id or filter must not look like success.
                refused = "; ".join(f"{pk}: {_why_not_open(pk)}" for pk in dict.fromkeys(ids))
                raise CommandError(f"no open dead letter matches; nothing would be {action}ed"
                                   + (f" ({refused})" if refused else ""))
            if options["dry_run"]:
                self._trial(action, rows, count, upto, options)
            elif options["json"]:
                return
            else:
                keep = f" --max-id {upto}" if upto is not None and options["max_id"] is None else ""
                self.stdout.write(f"{count} dead letter(s) would be {action}ed: add --yes{keep} to carry it out"
                                  + (" (--max-id leaves alone what fails meanwhile)." if keep else "."))
            return
        if not bulk:
            self._act_one(action, ids[0], options)
            return
        # Ids asked for by number that are not open dead letters are refused by name, not dropped.
        not_open = _missing(ids, rows.filter(pk__in=ids))
        # Selected once, counted and acted on as selected: a letter another replay takes meanwhile
        # is reported refused ("already replayed"), not counted and then lost from the summary.
        selected = list(rows.values_list("pk", flat=True))
        count, rows = len(selected), DeadLetter.objects.filter(pk__in=selected).order_by("id")
        result = service.BulkResult()
        try:
            try:
                (service.replay_many if action == "replay" else service.discard_many)(rows, user=options["user"],
                                                                                      into=result)
            finally:
                _in_history(options["user"], action, list(result.done))
        except (KeyboardInterrupt, DatabaseError) as exc:
            # Each letter is done in its own transaction: what was done stays done, once, and
            # the same command does the rest (the done ones are no longer dead). Counted as they
            # went: a recount of the open ones would also count those failing again meanwhile.
            left = count - len(result.done) - len(result.refused)
            stopped = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"the database failed ({exc})"
            raise CommandError(f"{stopped}: {len(result.done)} of {count} dead letter(s) {action}ed, {left} left; "
                               "run the same command again for the rest",
                               returncode=130 if isinstance(exc, KeyboardInterrupt) else 1) from None
        for pk in not_open:
            result.refused[pk] = _why_not_open(pk)
        asked = count + len(not_open)
        if options["json"]:
            self._emit({"action": action, "count": asked, **result.as_dict()})
        else:
            self.stdout.write(f"{action}ed {len(result.done)} of {asked} dead letter(s).")
            for reason, pks in result.refused_by_reason():
                self.stderr.write(f"{len(pks)} refused: {reason}: ids {' '.join(map(str, pks))}")
        # A run that did not do everything it was asked exits non-zero, so a runbook's script
        # cannot mistake "0 of 2" or a mistyped filter for success.
        if result.refused:
            raise CommandError(f"{len(result.refused)} dead letter(s) not {action}ed (see above)")
        if not result.done:
            raise CommandError(f"no open dead letter matches; nothing was {action}ed")

    def _trial(self, action: str, rows: QuerySet[DeadLetter], count: int, upto: int | None,
               options: dict[str, Any]) -> None:
        """The dry run: the action itself, every check included (an actor a deploy removed,
        arguments that no longer fit), in a transaction rolled back at the end, so it says what
        the run would refuse. Nothing is published: sending waits for a COMMIT that never comes."""

        class RolledBack(Exception):
            pass

        result = service.BulkResult()
        try:
            with transaction.atomic():
                (service.replay_many if action == "replay" else service.discard_many)(rows, user=options["user"],
                                                                                      into=result)
                raise RolledBack
        except RolledBack:
            pass
        except KeyboardInterrupt:
            raise CommandError("interrupted: the dry run stopped; nothing was changed", returncode=130) from None
        if options["json"]:
            self._emit({"action": action, "count": count, "max_id": upto, "done": False, "dry_run": True,
                        **result.as_dict()})
        else:
            self.stdout.write(f"{len(result.done)} of {count} dead letter(s) would be {action}ed (dry run).")
            for reason, pks in result.refused_by_reason():
                self.stderr.write(f"{len(pks)} would be refused: {reason}: ids {' '.join(map(str, pks))}")
        if result.refused:
            raise CommandError(f"{len(result.refused)} dead letter(s) would not be {action}ed (see above)")

    def _prune(self, options: dict[str, Any]) -> None:
        days = older_than_days(options["older_than"], "DEAD_LETTER_RETENTION_S")
        result = prune_dead_letters(days * SECONDS_PER_DAY, dry_run=options["dry_run"])
        if options["json"]:
            self._emit({"would_delete" if result.dry_run else "deleted": result.deleted,
                        "older_than_days": days})
        elif result.dry_run:
            self.stdout.write(f"{result.deleted} replayed or discarded dead letter(s) older than "
                              f"{days:g} days would be pruned (dry run).")
        else:
            self.stdout.write(f"pruned {result.deleted} replayed or discarded dead letter(s) older than "
                              f"{days:g} days.")

    def _act_one(self, action: str, pk: int, options: dict[str, Any]) -> None:
        as_json = options["json"]
        try:
            row = (service.replay if action == "replay" else service.discard)(pk, user=options["user"])
        except DeadLetter.DoesNotExist:
            raise CommandError(f"no dead letter with id {pk}") from None
        except CompositionError as exc:
            raise CommandError(str(exc)) from exc
        _in_history(options["user"], action, [row.pk])
        if as_json:
            self._emit({"action": action, "id": row.pk, "status": row.status,
                        "replay_outbox_id": row.replay_outbox_id})
        else:
            extra = f" as outbox message {row.replay_outbox_id}" if row.replay_outbox_id else ""
            self.stdout.write(f"dead letter {row.pk} {row.status}{extra}.")
