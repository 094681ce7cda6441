from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from composition.conf import conf
from composition.db.budget import BudgetLine, connection_budget, connections_per_process, server_limits
from composition.lifecycle.workers import (
    BACKGROUND_DB_THREADS,
    SCHEDULER_DB_THREADS,
    WorkerOptions,
    build_worker_system,
)


def _count(minimum: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = minimum - 1
        if number < minimum:
            raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of at least {minimum}")
        return number

    return parse


class Command(BaseCommand):
    help = "Print the worker component graph, its start order and the database connection budget."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true")
        parser.add_argument("--worker-processes", type=_count(1), default=None)
        parser.add_argument("--worker-threads", type=_count(1), default=None)
        parser.add_argument("--web-processes", type=_count(0), default=0, help="web server processes")
        parser.add_argument("--web-threads", type=_count(1), default=1, help="threads per web process")

    def handle(self, *args: Any, **options: Any) -> None:
        processes = options["worker_processes"] or int(conf.WORKER_PROCESSES)
        threads = options["worker_threads"] or int(conf.WORKER_THREADS)
        # As runworkers builds it (its metrics server included when WORKER_METRICS_PORT is set).
        system = build_worker_system(replace(WorkerOptions.from_settings(), processes=1, threads=threads))
        lines = [BudgetLine("workers", processes, connections_per_process(threads, BACKGROUND_DB_THREADS)),
                 BudgetLine("scheduler", 1, SCHEDULER_DB_THREADS)]
        if options["web_processes"]:
            lines.append(BudgetLine("web", options["web_processes"],
                                    connections_per_process(options["web_threads"], 0)))
        budget = connection_budget(lines, server_limits())
        report: dict[str, Any] = {"graph": system.graph(), "start_order": system.start_order,
                  "stop_order": list(reversed(system.start_order)), "connection_budget": budget}
        if options["json"]:
            self.stdout.write(json.dumps(report, indent=2))
        else:
            self._print(report, budget)
        if budget["unchecked"]:
            # Most likely when it matters most (the server out of connections): not a pass.
            raise CommandError(f"the budget could not be checked: the database did not say its limits "
                               f"({budget['unchecked']})")

    def _print(self, report: dict[str, Any], budget: dict[str, Any]) -> None:
        self.stdout.write("components (name <- depends on):")
        for name, deps in report["graph"].items():
            self.stdout.write(f"  {name} <- {', '.join(deps) or '-'}")
        self.stdout.write("start order: " + " -> ".join(report["start_order"]))
        self.stdout.write("stop order:  " + " -> ".join(report["stop_order"]))
        self.stdout.write("database connection budget:")
        for line in budget["lines"]:
            self.stdout.write(f"  {line['role']}: {line['processes']} processes x {line['per_process']} "
                              f"connections = {line['total']}")
        if budget["usable_connections"] is not None:
            self.stdout.write(f"  total {budget['total']} of {budget['usable_connections']} usable "
                              f"(max_connections {budget['max_connections']} less the reserved ones)")
        else:
            self.stdout.write(f"  total {budget['total']}; the server's limit is unknown")
        if budget["over_budget"]:
            self.stderr.write(self.style.WARNING(
                "WARNING: the deployment can open more connections than the server allows; lower "
                "threads or processes, or put a pool in front."))
