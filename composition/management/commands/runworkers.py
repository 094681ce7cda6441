"""``manage.py runworkers``: Dramatiq workers and the outbox relay as one composed system."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections

from composition.broker.configured import configured_broker
from composition.conf import conf
from composition.db.schema import check_migrations_applied
from composition.errors import MigrationsNotApplied, SystemStartError
from composition.jobs.queue_order import QueueOrder
from composition.lifecycle.workers import WorkerOptions, build_supervisor, build_worker_system
from composition.outbox.relay import RELAY_QUEUE_NAME
from composition.prometheus.directory import multiproc_dir
from composition.sampling import declared_queues

# A drain longer than a day is a mistake, not a plan (and thread joins overflow near 1e308).
MAX_SHUTDOWN_TIMEOUT_S = 86_400.0


def _metrics_port(value: str) -> int | str:
    """``--metrics-port``: a TCP port, or ``off`` (serve nothing, whatever the settings say)."""
    if value == "off":
        return value
    try:
        port = int(value)
    except ValueError:
        port = 0
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"{value!r} is neither a TCP port (1-65535) nor 'off'")
    return port


# Far above any useful size (each thread holds a database connection), and far below what
# exhausts the host: --threads 99999999 spent 20 s creating threads until fork failed host-wide,
# then its rollback could not start the threads its stops need.
MAX_PROCESSES = 256
MAX_THREADS = 512


def _at_least_one(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of at least 1")
    return number


def _seconds(value: str) -> float:
    """``--shutdown-timeout``: a positive, finite number of seconds (``nan`` meant no drain at
    all, and ``inf`` crashed the stop)."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_SHUTDOWN_TIMEOUT_S):
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds above 0 and at most "
                                         f"{MAX_SHUTDOWN_TIMEOUT_S:g}")
    return seconds


def _queue_order(value: str) -> QueueOrder:
    """``--queues``: ``a,b,c`` (strict order) or ``a=4,b=2,c=1`` (weighted), see ``QueueOrder``."""
    try:
        return QueueOrder.parse(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _check_declared(order: QueueOrder | None) -> None:
    """A listed queue no job declares would be consumed for nothing while the worker looks
    healthy (a misspelt name): refused, as ``queues pause`` refuses it."""
    if order is None:
        return
    declared = set(declared_queues(configured_broker()))
    unknown = [name for name in order.names if name not in declared]
    if unknown:
        known = ", ".join(sorted(declared - {RELAY_QUEUE_NAME})) or "none is declared"
        raise CommandError(f"no queue named {', '.join(map(repr, unknown))} (the queues: {known}; "
                           f"the outbox relay's: {RELAY_QUEUE_NAME})", returncode=2)  # a usage error, as --queues a=0


def _check_ready_file(path: Path | None) -> None:
    """A ready file left by an earlier life (killed) is removed: this one is not up yet. One that
    could not be written would be found only once everything had started: refused now."""
    if path is None:
        return
    directory = path.parent
    if not directory.is_dir() or not os.access(directory, os.W_OK | os.X_OK):
        raise CommandError(f"--ready-file {path}: {directory} is not a directory this process can write to")
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        raise CommandError(f"--ready-file {path}: {exc.strerror or exc}") from exc


def _check_migrations() -> None:
    """Refused before any component starts while composition's migrations are not applied: the
    components' queries would fail on the missing tables and columns, each its own way (the
    scheduler's in a warning every round, forever). A database that cannot be reached is left to
    the database component, whose failed start says so as every failed start does."""
    try:
        check_migrations_applied()
    except MigrationsNotApplied as exc:
        raise CommandError(str(exc)) from exc
    except DatabaseError:
        pass
    finally:
        # The main thread only supervises: it keeps no connection the budget does not count.
        connections["default"].close()


def _option_or(options: dict[str, Any], name: str, default: Any) -> Any:
    """The command-line value of ``name``, or ``default`` when it was not given."""
    return default if options[name] is None else options[name]


class Command(BaseCommand):
    help = ("Run Dramatiq workers (and the outbox relay) as one composed system. SIGTERM/SIGINT "
            "drains gracefully (SIGHUP too); a second SIGINT exits at once.")

    def add_arguments(self, parser: CommandParser) -> None:
        # Bad values are usage errors (exit 2), as --processes abc always was.
        parser.add_argument("--processes", type=_at_least_one, default=None,
                            help="worker processes (default from settings)")
        parser.add_argument("--threads", type=_at_least_one, default=None, help="worker threads per process")
        parser.add_argument("--queues", type=_queue_order, default=None,
                            help="queues in the order threads take from them: a,b,c (strict) or a=4,b=2,c=1 "
                                 "(weighted; the first queue keeps some threads) (default: all, unordered)")
        parser.add_argument("--shutdown-timeout", type=_seconds, default=None, dest="shutdown_timeout",
                            help="seconds to drain after the first signal")
        parser.add_argument("--metrics-port", type=_metrics_port, default=None, dest="metrics_port",
                            help="serve Prometheus /metrics on this port, or 'off' "
                                 "(default: COMPOSITION['WORKER_METRICS_PORT'])")
        parser.add_argument("--no-schedules", action="store_false", dest="schedules",
                            help="do not run the scheduler here (another process of this host runs it)")
        parser.add_argument("--ready-file", type=Path, default=None, dest="ready_file",
                            help="write the pid to this file once every component has started (under "
                                 "--processes N: every child), and remove it at the first signal and at exit: "
                                 "a readiness probe (test -f) or a supervisor waits for it")

    def handle(self, *args: Any, **options: Any) -> None:
        defaults = WorkerOptions.from_settings()
        worker_options = WorkerOptions(
            processes=_option_or(options, "processes", defaults.processes),
            threads=_option_or(options, "threads", defaults.threads),
            queue_order=options["queues"] or defaults.queue_order,
            shutdown_timeout_s=_option_or(options, "shutdown_timeout", float(conf.SHUTDOWN_TIMEOUT_S)),
            metrics_port=None if options["metrics_port"] == "off" else _option_or(
                options, "metrics_port", defaults.metrics_port),
            metrics_address=defaults.metrics_address,
            schedules=options["schedules"],
            ready_file=options["ready_file"],
        )
        if not 1 <= worker_options.processes <= MAX_PROCESSES or not 1 <= worker_options.threads <= MAX_THREADS:
            raise CommandError(f"--processes must be from 1 to {MAX_PROCESSES} and --threads from 1 to {MAX_THREADS} "
                               f"(WORKER_PROCESSES, WORKER_THREADS), got {worker_options.processes} and "
                               f"{worker_options.threads}", returncode=2)
        if worker_options.shutdown_timeout_s <= 0:
            raise CommandError("--shutdown-timeout must be a positive number of seconds")
        _check_migrations()
        _check_declared(worker_options.queue_order)
        _check_ready_file(worker_options.ready_file)
        if worker_options.metrics_port is not None and worker_options.processes > 1 and multiproc_dir() is None:
            raise CommandError("serving /metrics for several processes needs PROMETHEUS_MULTIPROC_DIR: "
                               "without it the children's metrics stay in the children")
        system = (build_worker_system(worker_options) if worker_options.processes == 1
                  else build_supervisor(worker_options))
        try:
            report = system.run()  # the System writes and removes the ready file
        except SystemStartError as exc:
            raise CommandError(str(exc)) from exc
        if any(result.status != "stopped" for result in report):
            raise CommandError("some components did not stop cleanly: "
                               + ", ".join(f"{r.name}={r.status}" for r in report if r.status != "stopped"))
