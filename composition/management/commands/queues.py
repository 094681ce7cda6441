"""``manage.py queues list | pause NAME | resume NAME | purge NAME | limits``."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError

from composition.broker.configured import configured_broker
from composition.broker.purging import NotPurgeable
from composition.conf import conf
from composition.errors import described
from composition.management.closed_pipe import reader_may_leave
from composition.management.database_errors import database_must_answer
from composition.management.pause_command import PauseCommand, operator_name, operator_user, pause_json, paused_state
from composition.pauses import PAUSE_PERMISSION, kept_reason
from composition.queues import (
    QueueNotPausable,
    QueueNotPaused,
    QueueRow,
    pause_queue,
    paused_queue_names,
    purge_queue,
    queue_rows,
    resume_queue,
    waiting_to_purge,
)
from composition.sampling.limits import LimitSample, sample_limits


def _json_row(row: QueueRow) -> dict[str, Any]:
    return {
        "name": row.name, "depth": row.depth, "outbox_pending": row.outbox_pending,
        "broker": None if row.broker is None else {"ready": row.broker.ready, "delayed": row.broker.delayed,
                                                   "in_flight": row.broker.in_flight},
        "broker_error": row.broker_error, "oldest_age_s": row.oldest_age_s,
        "paused": pause_json(row.pause),
    }


def _json_limit(sample: LimitSample) -> dict[str, Any]:
    limits, state = sample.limits, sample.state
    return {
        "job": sample.actor, "queue": sample.queue, "concurrency": limits.concurrency,
        "rate": None if limits.rate is None else {"starts": limits.rate.starts, "window_s": limits.rate.window_s},
        "slots_held": None if state is None else state.slots_held,
        "starts_in_window": None if state is None else state.starts_in_window,
        "delayed": None if state is None else {"concurrency": state.delayed_by_concurrency,
                                               "rate": state.delayed_by_rate},
        "mean_run_s": None if state is None else state.mean_run_s, "error": sample.error,
    }


def _limit_line(sample: LimitSample) -> tuple[str, str, str, str, str]:
    limits, state = sample.limits, sample.state
    if state is None:
        return sample.actor, sample.queue, limits.describe(), "?", f"limits' Redis unavailable: {sample.error}"
    now = []
    if limits.concurrency is not None:
        now.append(f"{state.slots_held}/{limits.concurrency} running")
    if limits.rate is not None:
        now.append(f"{state.starts_in_window}/{limits.rate.starts} started in the window")
    delayed = f"{state.delayed_by_concurrency} by concurrency, {state.delayed_by_rate} by rate"
    return sample.actor, sample.queue, limits.describe(), ", ".join(now), delayed


class Command(PauseCommand):
    help = ("List the queues (depth, oldest waiting work, paused or not, by whom, since when, why), or pause "
            "or resume one for every worker host, durably; `purge` makes what waits in a paused queue dead "
            "letters (replayable: `deadletters replay --error Purged`), and says what it would take without --yes; "
            "`limits` lists the jobs' concurrency and rate limits "
            "and how the cluster stands against them. A paused queue starts no job; running ones finish, "
            "its messages wait on the broker, and publishing into it goes on.")
    thing = "queue"
    extra_actions = ("purge", "limits")
    extra_named = ("purge",)
    extra_json = ("purge", "limits")
    audited = ("pause", "resume", "purge")

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--yes", action="store_true",
                            help="purge: purge (without it, purge only says what it would take)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] != "purge":
            if options["yes"]:
                raise CommandError(f"--yes is for purge, not {options['action']}")
            super().handle(*args, **options)
            return
        with reader_may_leave(), database_must_answer():
            if not options["name"]:
                raise CommandError("purge needs a queue's name (queues list shows them)")
            self.purge(options["name"], by=options["by"], reason=options["reason"], yes=options["yes"],
                       as_json=options["json"])

    def purge(self, name: str, *, by: str | None, reason: str, yes: bool, as_json: bool) -> None:
        user = operator_user(by)
        if user is not None and not user.has_perm(PAUSE_PERMISSION):
            raise CommandError(f"--by {by}: {PAUSE_PERMISSION} is required")
        try:
            if not yes:
                waiting = waiting_to_purge(name)
                paused = name in paused_queue_names()
                if as_json:
                    self.stdout.write(json.dumps({"queue": name, "purged": False, "paused": paused,
                                                  "outbox": waiting.outbox, "broker": waiting.broker}, indent=2))
                else:
                    then = "" if paused else f"pause it first (queues pause {name}), then "
                    self.stdout.write(f"queue {name}: {waiting.outbox} outbox rows and {waiting.broker} broker "
                                      f"messages wait; {then}purge --yes makes them dead letters")
                return
            result = purge_queue(name, by=operator_name(by), reason=reason, user=user)
        except (QueueNotPausable, QueueNotPaused, NotPurgeable, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        except DatabaseError:
            raise
        except Exception as exc:  # the broker's: one line, as list says it, not a traceback
            raise CommandError(f"the broker did not answer ({described(exc)}); what the purge took before is recorded, "
                               "the rest waits: run it again once it answers") from exc
        if as_json:
            self.stdout.write(json.dumps({"queue": name, "purged": True, "outbox": result.from_outbox,
                                          "broker": result.from_broker,
                                          "held_by_workers": result.held_by_workers}, indent=2))
            return
        self.stdout.write(f"queue {name} purged: {result.purged} dead letters ({result.from_outbox} from the outbox, "
                          f"{result.from_broker} from the broker); `deadletters list --error Purged` shows them, "
                          "`deadletters replay --error Purged` runs them again")
        if result.held_by_workers:
            self.stdout.write(f"{result.held_by_workers} messages are held by workers (running, taken before the "
                              "pause, or delayed until due) and were left; purge again for those that come back")

    def other_action(self, action: str, name: str | None, *, as_json: bool) -> None:  # limits
        samples = sample_limits(configured_broker())
        if as_json:
            self.stdout.write(json.dumps({"limits": [_json_limit(sample) for sample in samples]}, indent=2))
        elif not samples:
            self.stdout.write("no job declares a limit")
        else:
            self.write_table(("job", "queue", "limit", "now", "starts put back to wait (all time)"),
                             [_limit_line(sample) for sample in samples])
        # What could be read is printed; a script or a check still learns that part is unknown.
        if unread := [sample.actor for sample in samples if sample.state is None]:
            raise CommandError(f"the limits' Redis could not be read: how {', '.join(unread)} stand is unknown")

    def pause_one(self, name: str, *, by: str, reason: str, user: Any) -> str:
        try:
            row, changed = pause_queue(name, by=by, reason=reason, user=user)
        except QueueNotPausable as exc:
            raise CommandError(str(exc)) from exc
        # Not "from now on": each worker reads the pauses every QUEUE_PAUSE_REFRESH_S.
        return (f"queue {name} paused: within {conf.QUEUE_PAUSE_REFRESH_S:g} s no worker starts a job of it "
                "(running ones finish)") if changed \
            else f"queue {name} was paused already" + kept_reason(row, reason)

    def resume_one(self, name: str, *, by: str, reason: str, user: Any) -> str:
        try:
            _, changed = resume_queue(name, by=by, reason=reason, user=user)
        except QueueNotPausable as exc:
            raise CommandError(str(exc)) from exc
        return f"queue {name} resumed: its waiting jobs run" if changed else f"queue {name} was not paused"

    def list_rows(self, as_json: bool) -> None:
        rows = queue_rows()
        if as_json:
            self.stdout.write(json.dumps({"queues": [_json_row(row) for row in rows]}, indent=2))
        elif not rows:
            self.stdout.write("no queues declared")
        else:
            lines = []
            for row in rows:
                depth = "?" if row.depth is None else str(row.depth)
                if row.broker_error:
                    depth += f" (broker: {row.broker_error})"
                oldest = "-" if row.oldest_age_s is None else f"{row.oldest_age_s:.1f} s"
                lines.append((row.name, depth, oldest, paused_state(row.pause)))
            self.write_table(("name", "depth", "oldest waiting", "state"), lines)
        # The pauses are printed (the database answered); a script or a check still learns that
        # the depths are unknown, not zero.
        if unread := [row.name for row in rows if row.broker_error]:
            raise CommandError(f"the broker could not be read: the depth of {', '.join(unread)} is unknown")
