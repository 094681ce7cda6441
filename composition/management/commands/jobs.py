"""``manage.py jobs check-compat``: before a deploy, with the new code, which queued work it
cannot run (``composition.jobs.compatibility``); exit 1 when any, so a pipeline can stop."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from composition.broker.configured import configured_broker
from composition.jobs.compatibility import queued_problems
from composition.management.database_errors import database_must_answer


class Command(BaseCommand):
    help = ("check-compat: bind every pending outbox row and open dead letter to the running code's jobs and "
            "arguments, grouped by shape; report per job and problem how many would fail, with one example id. "
            "Exit 1 when any would, 0 otherwise.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["check-compat"])
        parser.add_argument("--json", action="store_true", help="machine-readable output")

    def handle(self, *args: Any, **options: Any) -> None:
        with database_must_answer():
            problems = queued_problems(configured_broker())
        if options["json"]:
            self.stdout.write(json.dumps({"problems": [problem.__dict__ for problem in problems]}, indent=2))
        elif not problems:
            self.stdout.write("every pending outbox row and open dead letter fits the running code")
        else:
            for problem in problems:
                self.stdout.write(f"{problem.source}: {problem.count} of {problem.actor} "
                                  f"(e.g. id {problem.example_id}): {problem.reason}")
        if problems:
            raise SystemExit(1)
