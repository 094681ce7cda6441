"""``manage.py jobs check-compat``: before a deploy, with the new code, which queued work it
cannot run (``composition.jobs.compatibility`` and ``broker_compatibility``); exit 1 when any,
so a pipeline can stop."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Min
from django.utils import timezone

from composition.broker.configured import configured_broker
from composition.conf import conf
from composition.errors import BROKER_FAILURES, described
from composition.jobs.broker_compatibility import broker_problems
from composition.jobs.compatibility import Problem, largest_first, queued_problems
from composition.management.database_errors import database_must_answer
from composition.pauses import Pause
from composition.retention import longest_redelivery_window
from composition.schedules import declared
from composition.schedules.problems import problems


def _schedule_problems() -> list[Problem]:
    """Each declared schedule the new code cannot fire (its job gone, a payload that no longer fits
    it): what its next tick would publish."""
    return [Problem("schedules", entry.actor_name, problem, 1, str(name))
            for name, entry in declared().items() for problem in problems(entry)]


class Command(BaseCommand):
    help = ("check-compat: bind every message that could still run (pending outbox rows, open dead letters, the "
            "broker's messages: on Redis each ready and delayed one, on RabbitMQ the outbox rows sent within the "
            "retry horizon, or since the oldest pause of a queue still paused; and each schedule's next tick) to "
            "the running code's jobs and arguments, grouped by "
            "shape; report per job and problem how many would fail, with one example id. Exit 1 when any would, "
            "0 otherwise.")

    # Its own report, not the system checks': a schedule the new code cannot fire is one of its
    # findings (composition.E121 would stop the command before it read anything).
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["check-compat"])
        parser.add_argument("--json", action="store_true", help="machine-readable output")

    def handle(self, *args: Any, **options: Any) -> None:
        started = time.monotonic()
        broker = configured_broker()
        longest = longest_redelivery_window()
        horizon_s = longest[1] if longest is not None else 0.0
        with database_must_answer():
            problems = queued_problems(broker)
            # A paused queue's messages wait on the broker for as long as the pause lasts, which
            # may be longer than any retry: on RabbitMQ the rows sent since it began stand for them.
            paused_since = Pause.objects.filter(kind=Pause.QUEUE, paused=True).aggregate(
                since=Min("paused_at"))["since"]
            sent_since = timezone.now() - timedelta(seconds=horizon_s)
            if paused_since is not None and paused_since < sent_since:
                horizon_s = (timezone.now() - paused_since).total_seconds()
                sent_since = paused_since
            try:
                report = broker_problems(broker, sent_since=sent_since)
            except BROKER_FAILURES as exc:
                # Not "nothing found": a pipeline must not deploy on a check that did not run.
                raise CommandError(f"could not read the broker ({described(exc)}); nothing was checked "
                                   "there. Run this again once it answers.") from exc
        problems = largest_first(problems + report.problems + _schedule_problems())
        took_s = time.monotonic() - started
        if options["json"]:
            self.stdout.write(json.dumps({"problems": [problem.__dict__ for problem in problems],
                                          "broker_messages_read": report.messages_read,
                                          "queue_counts": report.queue_counts, "seconds": round(took_s, 3)},
                                         indent=2))
        else:
            self._write_text(problems, report.messages_read, report.queue_counts, horizon_s, took_s)
        if problems:
            raise SystemExit(1)

    def _write_text(self, problems: list[Any], read: int, queue_counts: dict[str, int] | None, horizon_s: float,
                    took_s: float) -> None:
        if not problems:
            self.stdout.write("every queued message fits the running code")
        for problem in problems:
            self.stdout.write(f"{problem.source}: {problem.count} of {problem.actor} "
                              f"(e.g. id {problem.example_id}): {problem.reason}")
        if queue_counts is None:
            self.stdout.write(f"read {read} message{'' if read == 1 else 's'} on the broker (ready and delayed) "
                              f"in {took_s:.2f} s")
            return
        waiting = ", ".join(f"{name} {count}" for name, count in queue_counts.items()) or "none declared"
        retention_s = conf.OUTBOX_RETENTION_S
        pruned = ""
        if retention_s is not None and float(retention_s) < horizon_s:
            # The rows that would stand for the oldest messages are pruned: say so, not "checked".
            pruned = (f" (but OUTBOX_RETENTION_S prunes them after {float(retention_s):.0f} s: messages sent "
                      "before then were not seen)")
        self.stdout.write(f"RabbitMQ cannot be read without side effects: the outbox rows sent in the last "
                          f"{horizon_s:.0f} s stood for its messages{pruned}. Messages per queue: {waiting}. "
                          f"Checked in {took_s:.2f} s")
