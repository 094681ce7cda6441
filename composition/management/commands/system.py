"""``manage.py system``: the worker component graph, its start order and the connection budget."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from composition.conf import conf
from composition.db.budget import (
    BudgetLine,
    PoolLimits,
    connection_budget,
    connections_per_process,
    pool_limits,
    server_limits,
)
from composition.db.pooling import is_transaction_pooled
from composition.lifecycle.workers import (
    BACKGROUND_DB_THREADS,
    BACKGROUND_HELD_CONNECTIONS,
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
        parser.add_argument("--pool-size", type=_count(1), default=None,
                            help="behind a transaction pooler: its server connections for the database, when its "
                                 "admin console cannot be read (PgBouncer's pool_size)")

    def handle(self, *args: Any, **options: Any) -> None:
        processes = options["worker_processes"] or int(conf.WORKER_PROCESSES)
        threads = options["worker_threads"] or int(conf.WORKER_THREADS)
        # As runworkers builds it (its metrics server included when WORKER_METRICS_PORT is set).
        system = build_worker_system(replace(WorkerOptions.from_settings(), processes=1, threads=threads))
        lines = [BudgetLine("workers", processes, connections_per_process(threads, BACKGROUND_DB_THREADS),
                            held_per_process=threads + BACKGROUND_HELD_CONNECTIONS),
                 BudgetLine("scheduler", 1, SCHEDULER_DB_THREADS, held_per_process=SCHEDULER_DB_THREADS)]
        if options["web_processes"]:
            lines.append(BudgetLine("web", options["web_processes"], connections_per_process(options["web_threads"], 0),
                                    held_per_process=options["web_threads"]))
        limits = server_limits()
        pool = None
        if is_transaction_pooled("default"):
            pool = PoolLimits(options["pool_size"]) if options["pool_size"] else pool_limits()
        budget = connection_budget(lines, limits, pool)
        report: dict[str, Any] = {"graph": system.graph(), "start_order": system.start_order,
                  "stop_order": list(reversed(system.start_order)), "connection_budget": budget}
        if options["json"]:
            self.stdout.write(json.dumps(report, indent=2))
        else:
            self._print(report, budget)
        if limits.error:
            # Most likely when it matters most (the server out of connections): not a pass.
            raise CommandError(f"the budget could not be checked: the database did not say its limits "
                               f"({limits.error})")
        if pool is not None and pool.error:
            raise CommandError(f"the budget could not be checked: the transaction pooler's pool size could not be "
                               f"read from its admin console ({pool.error}); give it with --pool-size, or add "
                               f"the database's user to PgBouncer's stats_users")

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
        pooled = budget["pooled"]
        if pooled is not None:
            self._print_pooled(budget, pooled)
        elif budget["usable_connections"] is not None:
            self.stdout.write(f"  total {budget['total']} of {budget['usable_connections']} usable "
                              f"(max_connections {budget['max_connections']} less the reserved ones)")
        else:
            self.stdout.write(f"  total {budget['total']}; the server's limit is unknown")
        if pooled is not None and pooled["pool_short"]:
            self.stderr.write(self.style.WARNING(
                f"WARNING: the pool has {pooled['pool_size']} server connections and the deployment can hold "
                f"{pooled['held_at_once']} at once: jobs, and the relay's lease renewals and sweeps behind them, "
                f"will wait in the pooler's queue. Raise pool_size, or lower threads or processes."))
        elif budget["over_budget"]:
            self.stderr.write(self.style.WARNING(
                "WARNING: the deployment can open more connections than the server allows; lower "
                "threads or processes, or put a pool in front."))

    def _print_pooled(self, budget: dict[str, Any], pooled: dict[str, Any]) -> None:
        self.stdout.write(f"  total {budget['total']} client connections to the transaction pooler"
                          + (f" (max_client_conn {pooled['max_client_conn']})" if pooled["max_client_conn"] else ""))
        held = " + ".join(f"{line['role']} {line['processes']} x {line['held_per_process']}"
                          for line in budget["lines"])
        pool = pooled["pool_size"] if pooled["pool_size"] is not None else "unknown"
        self.stdout.write(f"  server connections held at once: {held} = {pooled['held_at_once']}, against a pool "
                          f"of {pool}" + (f" (+{pooled['reserve_pool']} reserve)" if pooled["reserve_pool"] else ""))
        self.stdout.write("    (a worker process: one per thread, held for a whole idempotent job, and one for "
                          "its background threads; a web process: one per thread)")
        if budget["usable_connections"] is not None:
            self.stdout.write(f"  the server: {budget['usable_connections']} usable connections (max_connections "
                              f"{budget['max_connections']} less the reserved ones)")
